"""Turn user input into API models, and pydantic's errors into loadline's.

pydantic stays at this boundary: callers get either a valid model or a :class:`SpecError` whose
``field`` is the dotted path a user would look for in their YAML (``spec.engine.maxNumSeqs``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from loadline.api._policy import POLICY_KIND, FleetPolicy
from loadline.api._v1alpha1 import API_VERSION, KIND, InferenceModel, InferenceModelSpec
from loadline.errors import SpecError

__all__ = [
    "Manifests",
    "load_inference_models",
    "load_manifests",
    "parse_fleet_policy",
    "parse_inference_model",
    "parse_spec",
    "spec_error_from_validation",
]


def _dotted(prefix: str, loc: tuple[int | str, ...]) -> str:
    parts = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            parts[-1 if parts else 0 :] = [f"{parts[-1] if parts else ''}[{item}]"]
        else:
            parts.append(str(item))
    return ".".join(parts)


def _fix_hint(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    if kind == "literal_error":
        return f"use one of {ctx.get('expected', 'the allowed values')}"
    if kind == "extra_forbidden":
        return "remove it or check its spelling (see `kubectl explain inferencemodel.spec`)"
    if kind == "missing":
        return "add it"
    if kind in {"greater_than_equal", "greater_than", "less_than_equal", "less_than"}:
        return "use a value within the allowed range"
    if kind == "string_pattern_mismatch":
        return f"match the pattern {ctx.get('pattern', '')}"
    return ""


def spec_error_from_validation(exc: ValidationError, prefix: str = "") -> SpecError:
    """One SpecError naming every failing field (the first field is ``.field``)."""
    problems = []
    first_field = prefix or "spec"
    for index, error in enumerate(exc.errors(include_url=False)):
        loc = tuple(error.get("loc", ()))
        field = _dotted(prefix, loc) if loc else prefix or "spec"
        message = str(error.get("msg", "invalid"))
        message = message.removeprefix("Value error, ")
        hint = _fix_hint(error)
        problems.append(f"{field}: {message}" + (f" (fix: {hint})" if hint else ""))
        if index == 0:
            first_field = field
    err = SpecError(first_field, "; ".join(problems))
    # The message already names every field; keep str(err) free of a repeated prefix.
    err.args = ("; ".join(problems),)
    return err


def parse_spec(data: Mapping[str, Any], prefix: str = "spec") -> InferenceModelSpec:
    try:
        return InferenceModelSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, prefix) from None


def parse_inference_model(data: Mapping[str, Any], source: str = "") -> InferenceModel:
    """Validate one InferenceModel object (a dict as read from YAML or the API)."""
    where = f"{source}: " if source else ""
    if not isinstance(data, Mapping):
        raise SpecError(source or "document", "is not a mapping", "write an InferenceModel object")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        raise SpecError(
            f"{where}apiVersion/kind",
            f"expected {API_VERSION} {KIND}, got {data.get('apiVersion')} {data.get('kind')}",
            f"set apiVersion: {API_VERSION} and kind: {KIND}",
        )
    try:
        return InferenceModel.model_validate(dict(data))
    except ValidationError as exc:
        err = spec_error_from_validation(exc)
        if where:
            err.args = (where + str(err),)
        raise err from None


def load_inference_models(path: str | Path) -> list[InferenceModel]:
    """Every InferenceModel in a YAML file (a stream of documents; other kinds are an error)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise SpecError(str(file), f"cannot be read: {exc.strerror}", "pass an existing YAML file") from None
    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise SpecError(str(file), f"is not valid YAML: {exc}", "fix the YAML syntax") from None
    if not docs:
        raise SpecError(str(file), "holds no object", "add an InferenceModel")
    return [parse_inference_model(doc, source=str(file)) for doc in docs]


def parse_fleet_policy(data: Mapping[str, Any], source: str = "") -> FleetPolicy:
    """Validate one FleetPolicy object; it must be named, since every refusal quotes its name."""
    where = f"{source}: " if source else ""
    if not isinstance(data, Mapping):
        raise SpecError(source or "document", "is not a mapping", "write a FleetPolicy object")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != POLICY_KIND:
        raise SpecError(
            f"{where}apiVersion/kind",
            f"expected {API_VERSION} {POLICY_KIND}, got {data.get('apiVersion')} {data.get('kind')}",
            f"set apiVersion: {API_VERSION} and kind: {POLICY_KIND}",
        )
    try:
        policy = FleetPolicy.model_validate(dict(data))
    except ValidationError as exc:
        err = spec_error_from_validation(exc)
        if where:
            err.args = (where + str(err),)
        raise err from None
    if not policy.metadata.get("name"):
        raise SpecError(f"{where}metadata.name", "is missing", "name the FleetPolicy")
    return policy


@dataclass
class Manifests:
    """What a set of files holds for offline planning, as the cluster would see it.

    ``namespaces`` are the labels of Namespace objects found among the files: the only way offline use
    can know them (a policy's ``namespaceSelector`` needs them).
    """

    models: list[tuple[str, InferenceModel]] = field(default_factory=list)  # (source, model)
    policies: list[FleetPolicy] = field(default_factory=list)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)


def _read_docs(path: str) -> list[Any]:
    name = "-" if path == "-" else str(Path(path))
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise SpecError(name, f"cannot be read: {exc.strerror}", "pass an existing YAML file") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise SpecError(name, f"is not valid YAML: {exc}", "fix the YAML syntax") from None


def load_manifests(paths: Sequence[str | Path]) -> Manifests:
    """InferenceModels, FleetPolicies and Namespaces of several YAML files (``-``: standard input).

    Any other kind is an error, as in :func:`load_inference_models`; a file may hold policies only.
    """
    out = Manifests()
    for path in paths:
        name = str(path)
        docs = _read_docs(name)
        if not docs:
            raise SpecError(name, "holds no object", "add an InferenceModel or a FleetPolicy")
        for doc in docs:
            kind = doc.get("kind") if isinstance(doc, Mapping) else None
            if kind == POLICY_KIND:
                out.policies.append(parse_fleet_policy(doc, source=name))
            elif kind == "Namespace" and doc.get("apiVersion") == "v1":
                meta = doc.get("metadata") or {}
                labels = meta.get("labels") or {}
                out.namespaces[str(meta.get("name", ""))] = {str(k): str(v) for k, v in labels.items()}
            else:
                out.models.append((name, parse_inference_model(doc, source=name)))
    return out
