"""Where kopf keeps the object it last handled (its diff base): in the model's status.

kopf compares each event's object with the one it last handled to tell a change (reconcile) from
nothing to do. loadline kept that in an annotation, so every handled change cost two writes: the
annotation (a patch of the object) and the status the handler decided (a patch of the ``/status``
subresource; kopf cannot patch both in one request). Kept in ``status.lastHandledConfiguration``, it
goes in the same status patch: one write per reconcile that changes something, a seventh of what a
model's creation cost the API server (``benchmarks/fleet.py``, API requests per model).

Models handled by an earlier version carry the annotation: it is still read when the status has no
diff base, and dropped with the first diff base written to status (once per model).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kopf

__all__ = ["FIELD", "StatusDiffBase"]

#: The status field that holds the diff base (``InferenceModelStatus.last_handled_configuration``).
FIELD = "status.lastHandledConfiguration"


class StatusDiffBase(kopf.StatusDiffBaseStorage):
    """kopf's status diff-base storage, reading the annotation of earlier versions as a fallback.

    The essence leaves out every annotation under ``prefix``, as kopf's annotation storage did (its
    marker annotation made kopf skip the prefix), so a model's essence does not change with the move."""

    def __init__(self, prefix: str, legacy_key: str) -> None:
        super().__init__(field=FIELD)
        self._prefix = prefix
        self._legacy = kopf.AnnotationsDiffBaseStorage(prefix=prefix, key=legacy_key)
        self._legacy_key = legacy_key

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        annotations = essence.get("metadata", {}).get("annotations", {})
        for key in [key for key in annotations if key.startswith(f"{self._prefix}/")]:
            del annotations[key]
        self.remove_empty_stanzas(essence)
        return essence

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        stored = super().fetch(body=body)
        return stored if stored is not None else self._legacy.fetch(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        super().store(body=body, patch=patch, essence=essence)
        for key in self._legacy.make_keys(self._legacy_key, body=body):
            if key in body.metadata.annotations:
                patch.metadata.annotations[key] = None  # the earlier version's copy, once
