"""Turn user input into API models, and pydantic's errors into loadline's.

pydantic stays at this boundary: callers get either a valid model or a :class:`SpecError` whose
``field`` is the dotted path a user would look for in their YAML (``spec.engine.maxNumSeqs``).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

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
    "validate_known",
]

ModelT = TypeVar("ModelT", bound=BaseModel)

Unknown = Literal["refuse", "ignore"]
"""What parsing does with a field the API models do not know. ``refuse``: files and offline use, where
an unknown field is a typo to name. ``ignore``: objects read from the cluster. There the CRD's schema
has already pruned every field it does not know, so a field the models lack was written under a newer
loadline's CRD (kept after a ``helm rollback``): this operator works on, and never writes it away."""

_KNOWN_FIELD_PASSES = 8
"""How many times :func:`validate_known` drops unknown fields and validates again: pydantic reports
every unknown field of a pass, so a second pass only comes from an unknown field inside a union."""


def _drop(data: Any, loc: Sequence[int | str]) -> bool:
    """Remove the field at ``loc`` from nested dicts and lists; False when it is not there."""
    *path, last = loc
    node = data
    for key in path:
        found = (isinstance(node, dict) and key in node) or (
            isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)
        )
        if not found:
            return False
        node = node[key]
    if isinstance(node, dict) and last in node:
        del node[last]
        return True
    return False


def validate_known(model: type[ModelT], data: Mapping[str, Any]) -> ModelT:
    """``model`` from ``data`` as read from the cluster, ignoring the fields ``model`` does not know
    (see :data:`Unknown`); every other error is raised as pydantic raises it. ``data`` is not changed:
    a caller that writes a stored object back merges its own fields over the stored ones. Copied only
    when it does hold such a field (the common case, a model this version wrote, costs no copy)."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        if not any(e["type"] == "extra_forbidden" for e in exc.errors(include_url=False)):
            raise
    payload: dict[str, Any] = copy.deepcopy(dict(data))
    for _ in range(_KNOWN_FIELD_PASSES):
        try:
            return model.model_validate(payload)
        except ValidationError as exc:
            unknown = [e["loc"] for e in exc.errors(include_url=False) if e["type"] == "extra_forbidden"]
            if not any([_drop(payload, loc) for loc in unknown]):
                raise
    return model.model_validate(payload)


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
    return _TYPE_HINTS.get(kind, "correct the value (see `kubectl explain inferencemodel.spec`)")


# Strict types (as the CRD's structural schema): what to write instead.
_TYPE_HINTS = {
    "int_type": "write a whole number without quotes (not true/false, not 8192.0)",
    "float_type": "write a number without quotes (not true/false)",
    "bool_type": "write true or false without quotes",
    "string_type": 'quote it, e.g. "0.19.0"',
    "finite_number": "write a finite number (not .nan or .inf)",
    "list_type": "write a list",
    "dict_type": "write a mapping",
    "model_type": "write a mapping",
    "model_attributes_type": "write a mapping",
    "too_long": "shorten the list or string",
    "string_too_short": "give a value",
    "string_too_long": "shorten it",
}


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


def _object_name(data: Mapping[str, Any], kind: str) -> str:
    """``InferenceModel team-a/chat``: how errors name the object inside a file."""
    meta = data.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    where = f"{namespace}/" if isinstance(namespace, str) and namespace else ""
    return f"{kind} {where}{name}" if isinstance(name, str) and name else f"{kind} (unnamed)"


def parse_inference_model(
    data: Mapping[str, Any], source: str = "", *, unknown: Unknown = "refuse"
) -> InferenceModel:
    """Validate one InferenceModel object (a dict as read from YAML or the API).

    Errors start with ``source`` (the file) and the object's kind, namespace and name, so one line tells a
    user of a multi-document file which object is wrong. ``unknown``: see :data:`Unknown`."""
    if not isinstance(data, Mapping):
        raise SpecError(source or "document", "is not a mapping", "write an InferenceModel object")
    where = ": ".join(filter(None, (source, _object_name(data, KIND))))
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        raise SpecError(
            f"{source + ': ' if source else ''}apiVersion/kind",
            f"expected {API_VERSION} {KIND}, got {data.get('apiVersion')} {data.get('kind')}",
            f"set apiVersion: {API_VERSION} and kind: {KIND}",
        )
    try:
        if unknown == "ignore":
            return validate_known(InferenceModel, data)
        return InferenceModel.model_validate(dict(data))
    except ValidationError as exc:
        raise spec_error_from_validation(exc).at(where if source else "") from None


def load_inference_models(path: str | Path) -> list[InferenceModel]:
    """Every InferenceModel in a YAML file (a stream of documents; other kinds are an error)."""
    name = str(path) if str(path) == "-" else str(Path(path))
    docs = _read_docs(name)
    if not docs:
        raise SpecError(name, "holds no object", "add an InferenceModel")
    return [parse_inference_model(doc, source=name) for doc in docs]


def parse_fleet_policy(
    data: Mapping[str, Any], source: str = "", *, unknown: Unknown = "refuse"
) -> FleetPolicy:
    """Validate one FleetPolicy object; it must be named, since every refusal quotes its name.
    ``unknown``: see :data:`Unknown`."""
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
        ignoring = unknown == "ignore"
        policy = validate_known(FleetPolicy, data) if ignoring else FleetPolicy.model_validate(dict(data))
    except ValidationError as exc:
        located = f"{source}: {_object_name(data, POLICY_KIND)}" if source else ""
        raise spec_error_from_validation(exc).at(located) from None
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


def _read_bytes(path: str) -> bytes:
    if path == "-":  # bytes, so that a non-UTF-8 stream is named like a non-UTF-8 file
        buffer = getattr(sys.stdin, "buffer", None)
        return buffer.read() if buffer is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
    try:
        return Path(path).read_bytes()
    except IsADirectoryError:
        raise SpecError(path, "is a directory", "pass the YAML files in it, e.g. DIR/*.yaml") from None
    except OSError as exc:
        raise SpecError(path, f"cannot be read: {exc.strerror}", "pass an existing YAML file") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: the problem and where it is."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem or exc.context} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; kubectl and the API server refuse the object, so
    offline use refuses it too instead of planning something other than what the user will apply."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key; SafeLoader names it below
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_docs(path: str) -> list[Any]:
    """The YAML documents of a file (``-``: standard input); every way it can be unreadable is a
    :class:`SpecError` naming the file, never a traceback."""
    name = "-" if path == "-" else str(Path(path))
    raw = _read_bytes(name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(name, "is not UTF-8 text (a binary or compressed file?)", "pass YAML") from None
    if "\x00" in text:
        raise SpecError(name, "holds NUL bytes (a binary file?)", "pass a YAML file")
    try:
        return [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc is not None]
    except yaml.YAMLError as exc:
        raise SpecError(name, f"is not valid YAML: {_yaml_problem(exc)}", "fix the YAML syntax") from None
    except RecursionError:
        raise SpecError(name, "nests too deeply to be a Kubernetes object", "fix the YAML") from None


def _identity(kind: str, doc: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, namespace, name) as the API server keys objects; InferenceModels are namespaced (no
    namespace: ``default``), FleetPolicies and Namespaces are not."""
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(name, str) or not name:
        return None
    namespace = str(meta.get("namespace") or "default") if kind == KIND else ""
    return kind, namespace, name


def load_manifests(paths: Sequence[str | Path]) -> Manifests:
    """InferenceModels, FleetPolicies and Namespaces of several YAML files (``-``: standard input).

    Any other kind is an error, as in :func:`load_inference_models`; a file may hold policies only. Two
    objects of one kind, namespace and name are refused, as the API server would keep only one of them.
    """
    out = Manifests()
    seen: dict[tuple[str, str, str], str] = {}
    if [str(path) for path in paths].count("-") > 1:
        raise SpecError("-", "is named more than once (standard input can be read once)", "name - once")
    for path in paths:
        name = str(path)
        docs = _read_docs(name)
        if not docs:
            raise SpecError(name, "holds no object", "add an InferenceModel or a FleetPolicy")
        for doc in docs:
            kind = doc.get("kind") if isinstance(doc, Mapping) else None
            known = isinstance(doc, Mapping) and kind in {KIND, POLICY_KIND, "Namespace"}
            identity = _identity(str(kind), doc) if known else None
            if identity is not None:
                if identity in seen:
                    what = f"{identity[0]} {identity[1] + '/' if identity[1] else ''}{identity[2]}"
                    raise SpecError(
                        f"{name}: {what}",
                        f"is defined twice (also in {seen[identity]})",
                        "keep one object per kind, namespace and name, or rename one",
                    )
                seen[identity] = name
            if kind == POLICY_KIND:
                out.policies.append(parse_fleet_policy(doc, source=name))
            elif kind == "Namespace" and doc.get("apiVersion") == "v1":
                meta = doc.get("metadata")
                labels = meta.get("labels") if isinstance(meta, Mapping) else None
                if not isinstance(meta, Mapping) or not isinstance(labels, Mapping | None):
                    raise SpecError(f"{name}: Namespace", "metadata.labels is not a mapping", "fix it")
                out.namespaces[str(meta.get("name", ""))] = {
                    str(k): str(v) for k, v in (labels or {}).items()
                }
            else:
                out.models.append((name, parse_inference_model(doc, source=name)))
    return out
