"""Where kopf keeps its state of a model: in the model's status, so it goes with the status patch.

kopf keeps two things per object: the object it last handled (its diff base, to tell a change from
nothing to do) and each handler's progress (retries, back-off). loadline kept both in annotations, so
every handled change cost two writes: a patch of the object (the diff base, or on creation only the
annotation storage's marker, ``loadline.dev/kopf-managed``, left after the progress was purged) and a
patch of its ``/status`` subresource with what the handler decided (kopf cannot patch both in one
request). 102 of 102 creations made both in a 100-model run (kopf's debug log). Kept in status
(``status.lastHandledConfiguration``, ``status.kopf.progress``), they go in the one status patch.

Models handled by an earlier version carry the annotations: they are still read when the status has
none, and dropped with the first write of the state to status (once per model).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import kopf
from kopf._cogs.structs import dicts

from loadline.api import KIND

__all__ = ["FIELD", "StatusDiffBase", "StatusProgress"]

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

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        if _not_a_model(body):
            return cast(kopf.BodyEssence, {})
        if not extra_fields:
            # kopf deep-copies the whole object and then drops its status and metadata (but labels and
            # annotations): on every event of every model. Status and managedFields are most of a
            # model's bytes, and that copy was 8 % of the operator's time in a burst of 1,000 crashes
            # (py-spy), so only what the essence keeps is handed over.
            meta = body.get("metadata") or {}
            kept: dict[str, Any] = {k: v for k, v in body.items() if k not in ("status", "metadata")}
            kept["metadata"] = {k: meta[k] for k in ("labels", "annotations") if k in meta}
            body = kopf.Body(cast(kopf.RawBody, kept))
        essence = super().build(body=body, extra_fields=extra_fields)
        annotations = essence.get("metadata", {}).get("annotations", {})
        for key in [key for key in annotations if key.startswith(f"{self._prefix}/")]:
            del annotations[key]
        self.remove_empty_stanzas(essence)
        return essence

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        if _not_a_model(body):
            return None
        stored = super().fetch(body=body)
        return stored if stored is not None else self._legacy.fetch(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        super().store(body=body, patch=patch, essence=essence)
        for key in self._legacy.make_keys(self._legacy.key, body=body):
            if key in body.metadata.annotations:
                patch.metadata.annotations[key] = None  # the earlier version's copy, once


class StatusProgress(kopf.StatusProgressStorage):
    """kopf's status progress storage (``status.kopf.progress``; its touch field beside it), reading
    and purging the annotations of earlier versions as a fallback. A handler that succeeds at once
    leaves nothing: kopf records its start and purges the record in the same patch."""

    def __init__(self, prefix: str) -> None:
        super().__init__(name="kopf")
        self._legacy = kopf.AnnotationsProgressStorage(prefix=prefix)

    def fetch(self, *, key: Any, body: kopf.Body) -> Any:
        stored = super().fetch(key=key, body=body)
        return stored if stored is not None else self._legacy.fetch(key=key, body=body)

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        super().purge(key=key, body=body, patch=patch)
        self._legacy.purge(key=key, body=body, patch=patch)  # writes only where the annotation is

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        """The essence without kopf's progress (``status.kopf.progress``, and the annotations of
        earlier versions), changed in place. kopf's own ``clear`` deep-copies the essence first, and the
        legacy fallback did so again: four copies of each model's essence per watch event. kopf calls
        ``clear`` only on the two essences it has just fetched or built for one comparison
        (``kopf._core.reactor.processing``), objects of its own that nothing else holds."""
        dicts.remove(cast(dict[Any, Any], essence), self.field)
        annotations = essence.get("metadata", {}).get("annotations", {})
        prefix = f"{self._legacy.prefix}/"
        self._legacy.remove_annotations(essence, {key for key in annotations if key.startswith(prefix)})
        self.remove_empty_stanzas(essence)
        return essence


def _not_a_model(body: kopf.Body) -> bool:
    """Whether the object is of another kind than InferenceModel (a pod, a Deployment, a node): kopf
    builds and compares the essences of every object it watches, but only a model has handlers of
    changes (reconcile) that read them, and a pod's or a Deployment's spec was deep-copied three times
    per watch event for nothing. A body that does not say its kind is taken as a model."""
    kind = body.get("kind")
    return kind is not None and kind != KIND
