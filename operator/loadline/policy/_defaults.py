"""Fill what an InferenceModel's spec leaves out with the governing policies' defaults.

"Left out" means the field was not written: pydantic's ``model_fields_set`` (absent from the YAML or
the API object), or ``null``. A value the user wrote is never replaced, even when it equals the
built-in default (``engine.version: 0.19.0`` stays 0.19.0) or is empty (``gpu.types: []`` means "any
type", and stays so). Applying twice changes nothing, so the mutating webhook, reconcile and the CLI
can all call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from loadline.api import InferenceModelSpec
from loadline.policy._combine import DEFAULT_FIELDS, EffectivePolicy

__all__ = ["Fill", "apply_defaults", "defaults_patch", "fills"]


@dataclass(frozen=True)
class Fill:
    """One default to fill: where (``spec.engine.version``), what, and which policy it comes from."""

    section: str  # python name of the spec's section, e.g. "engine"
    name: str  # python name of the field, e.g. "version"
    path: str  # as a user reads it, e.g. "spec.engine.version"
    value: Any
    policy: str


def _unset(model: BaseModel, name: str) -> bool:
    return name not in model.model_fields_set or getattr(model, name) is None


def fills(spec: InferenceModelSpec, effective: EffectivePolicy) -> list[Fill]:
    """The defaults ``apply_defaults`` would fill into ``spec``, in a stable order."""
    out = []
    for section, name in DEFAULT_FIELDS:
        value = getattr(getattr(effective.defaults, section), name)
        if value is None:
            continue
        current: BaseModel = getattr(spec, section)
        if section in spec.model_fields_set and not _unset(current, name):
            continue
        alias = type(current).model_fields[name].alias or name
        path = f"spec.{section}.{alias}"
        out.append(Fill(section, name, path, value, effective.default_sources.get(path, "")))
    return out


def apply_defaults(spec: InferenceModelSpec, effective: EffectivePolicy) -> InferenceModelSpec:
    """A copy of ``spec`` with the policies' defaults where it says nothing (``spec`` is not changed)."""
    updates: dict[str, dict[str, Any]] = {}
    for fill in fills(spec, effective):
        value = list(fill.value) if isinstance(fill.value, list) else fill.value
        updates.setdefault(fill.section, {})[fill.name] = value
    if not updates:
        return spec
    sections = {
        section: getattr(spec, section).model_copy(update=values) for section, values in updates.items()
    }
    return spec.model_copy(update=sections)


def defaults_patch(spec: InferenceModelSpec, effective: EffectivePolicy) -> dict[str, Any]:
    """The filled defaults as a JSON merge patch of ``spec`` in API spelling, e.g.
    ``{"engine": {"version": "0.19.0"}}`` — what a mutating admission webhook adds to the object."""
    patch: dict[str, Any] = {}
    for fill in fills(spec, effective):
        _, section_alias, field_alias = fill.path.split(".")
        value = list(fill.value) if isinstance(fill.value, list) else fill.value
        patch.setdefault(section_alias, {})[field_alias] = value
    return patch
