"""An InferenceModel's status read once into the API model (:class:`loadline.api.InferenceModelStatus`).

Handlers read a model's status through :func:`read_status` and decide on its typed fields; the
builders of :mod:`loadline.status.build` take the typed status and return the patch to write.
:func:`stored` gives back the status as the API server holds it (only what was written, camelCase),
which is what a change is compared with, so that an unchanged status writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from loadline.api import InferenceModelStatus, validate_known
from loadline.status.patch import merged

__all__ = ["read_status", "stored", "with_changes"]

logger = logging.getLogger(__name__)


def read_status(body: Mapping[str, Any] | None) -> InferenceModelStatus:
    """``body``'s ``status`` as the API model. Never raises: a field this version does not know (written
    by a newer loadline, kept after a rollback) is ignored, and a member whose stored value the model
    refuses (a hand edit with ``kubectl edit --subresource=status``) is read as unset and logged, so the
    next write of that member replaces it; the operator never stops on its own status."""
    raw = (body or {}).get("status") or {}
    if not isinstance(raw, Mapping):
        return InferenceModelStatus()
    try:
        return validate_known(InferenceModelStatus, raw)
    except ValidationError as exc:
        refused = {str(error["loc"][0]) for error in exc.errors(include_url=False) if error["loc"]}
    logger.warning("status members %s do not validate; read as unset", ", ".join(sorted(refused)))
    kept = {key: value for key, value in raw.items() if key not in refused}
    try:
        return validate_known(InferenceModelStatus, kept)
    except ValidationError:  # an alias and its field name both given, say: nothing to trust
        return InferenceModelStatus()


def stored(status: BaseModel) -> dict[str, Any]:
    """``status`` (or a member of it, ``status.plan``) as the API server stores it: the fields that were
    read or set (no defaults filled in), camelCase, JSON types. A change is compared with this, not with
    the defaults a typed read shows (an absent ``policies`` is not an empty list the API server holds)."""
    return status.model_dump(by_alias=True, mode="json", exclude_unset=True, exclude_none=True)


def with_changes(status: InferenceModelStatus, changes: Mapping[str, Any]) -> InferenceModelStatus:
    """``status`` once the merge patch ``changes`` (a builder's) is applied, as the API server applies
    it: what a second decision made in the same handler reads (the policies judged on the status a new
    plan leaves, say)."""
    return read_status({"status": merged(stored(status), changes)})
