"""Generate the CustomResourceDefinition from the pydantic models.

pydantic emits JSON Schema 2020-12; the API server wants a *structural* OpenAPI v3.0 schema. The
differences handled here: ``$ref``/``$defs`` are inlined, ``Optional[X]`` (``anyOf`` with null) becomes
plain ``X`` (an absent field is how Kubernetes spells "unset", and CEL's ``has()`` relies on it),
numeric ``exclusiveMinimum`` becomes the boolean form, free-form objects get
``x-kubernetes-preserve-unknown-fields``, and pydantic's titles are dropped.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from loadline._yaml import dump_yaml
from loadline.api._policy import (
    POLICY_CATEGORIES,
    POLICY_KIND,
    POLICY_PLURAL,
    POLICY_SHORT_NAMES,
    POLICY_SINGULAR,
    FleetPolicySpec,
    FleetPolicyStatus,
)
from loadline.api._v1alpha1 import (
    CATEGORIES,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    InferenceModelSpec,
    InferenceModelStatus,
)

JSONSchema = dict[str, Any]

_DROP_KEYS = {"title", "additionalProperties", "uniqueItems"}


def _resolve(node: Any, defs: dict[str, JSONSchema]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = copy.deepcopy(defs[name])
        # A field's own description wins over its class docstring.
        extra = {k: v for k, v in node.items() if k != "$ref"}
        merged.update(extra)
        return _resolve(merged, defs)
    any_of = node.get("anyOf")
    if isinstance(any_of, list):
        non_null = [option for option in any_of if option.get("type") != "null"]
        if len(non_null) == 1 and len(non_null) != len(any_of):
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            merged = {**copy.deepcopy(non_null[0]), **rest}
            return _resolve(merged, defs)
    return {key: _resolve(value, defs) for key, value in node.items()}


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: JSONSchema = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "default" and (value is None or isinstance(value, dict | list)):
            continue  # object defaults are applied by the operator, not the API server
        if key == "properties":
            out[key] = {name: _structural(sub) for name, sub in value.items()}
        else:
            out[key] = _structural(value)
    if "exclusiveMinimum" in out and not isinstance(out["exclusiveMinimum"], bool):
        out["minimum"] = out.pop("exclusiveMinimum")
        out["exclusiveMinimum"] = True
    if "exclusiveMaximum" in out and not isinstance(out["exclusiveMaximum"], bool):
        out["maximum"] = out.pop("exclusiveMaximum")
        out["exclusiveMaximum"] = True
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if out.get("type") == "object" and "properties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "format" in out and out["format"] == "date-time":
        out["type"] = "string"
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "required" in out:
        out["required"] = sorted(out["required"])
    return out


def openapi_schema(model: type[Any]) -> JSONSchema:
    """Structural OpenAPI v3 schema of a pydantic model, as a CRD's ``openAPIV3Schema`` wants it."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    resolved = _resolve(raw, defs)
    result: JSONSchema = _structural(resolved)
    return result


def _column(name: str, type_: str, path: str, *, wide: bool = False) -> dict[str, Any]:
    """A printer column; ``wide`` ones show with ``-o wide`` only (priority 1)."""
    column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if wide:
        column["priority"] = 1
    return column


_AGE = _column("Age", "date", ".metadata.creationTimestamp")


def _crd(
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: tuple[str, ...],
    categories: tuple[str, ...],
    scope: str,
    columns: list[dict[str, Any]],
    description: str,
    spec: JSONSchema,
    status: JSONSchema,
    spec_required: bool,
    subresources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One CRD of loadline's group: one served and stored version with a status subresource (and
    ``subresources``' others)."""
    root: dict[str, Any] = {"description": description, "type": "object"}
    if spec_required:
        root["required"] = ["spec"]
    root["properties"] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": spec,
        "status": status,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "loadline"}},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(categories),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, **(subresources or {})},
                    "additionalPrinterColumns": [*columns, _AGE],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def build_inferencemodel_crd() -> dict[str, Any]:
    """The InferenceModel CRD as a plain dict."""
    return _crd(
        kind=KIND,
        plural=PLURAL,
        singular=SINGULAR,
        short_names=SHORT_NAMES,
        categories=CATEGORIES,
        scope="Namespaced",
        columns=[
            _column("Model", "string", ".spec.model.name"),
            _column("GPU", "string", ".status.plan.gpu"),
            _column("Replicas", "integer", ".spec.replicas"),
            _column("Phase", "string", ".status.phase"),
            _column("Max-Concurrency", "number", ".status.plan.maxConcurrency", wide=True),
            _column("GPU-Used-GiB", "number", ".status.measuredGpuMemory.maxUsedGiB", wide=True),
            _column("Next-Restart", "string", ".status.maintenance.scheduledAt"),
            _column("OOM-Predicted", "string", ".status.oomRisk.predictedAt", wide=True),
        ],
        description=(
            "A model served by vLLM on GPUs, sized and kept out of out-of-memory trouble by loadline."
        ),
        spec=openapi_schema(InferenceModelSpec),
        status=openapi_schema(InferenceModelStatus),
        spec_required=True,
        # kubectl scale, an HPA and KEDA scale a model through it (docs/autoscaling.md).
        subresources={
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            }
        },
    )


def build_fleetpolicy_crd() -> dict[str, Any]:
    """The FleetPolicy CRD as a plain dict: cluster-scoped, the platform team's, not a namespace's."""
    return _crd(
        kind=POLICY_KIND,
        plural=POLICY_PLURAL,
        singular=POLICY_SINGULAR,
        short_names=POLICY_SHORT_NAMES,
        categories=POLICY_CATEGORIES,
        scope="Cluster",
        columns=[
            _column("Selector", "string", ".status.selector"),
            _column("Enforcement", "string", ".spec.enforcement"),
            _column("Models", "integer", ".status.modelsGoverned"),
            _column("Violations", "integer", ".status.violations"),
            _column("Priority", "integer", ".spec.priority", wide=True),
        ],
        description="Defaults and limits a platform team sets for every InferenceModel it governs.",
        spec=openapi_schema(FleetPolicySpec),
        status=openapi_schema(FleetPolicyStatus),
        spec_required=False,
    )


def all_crds() -> list[dict[str, Any]]:
    """Every CRD loadline installs, in a stable order."""
    return [build_inferencemodel_crd(), build_fleetpolicy_crd()]


_HEADER = "# Generated by `loadline crds` from operator/loadline/api. Do not edit by hand.\n"


def render_crds_yaml() -> str:
    """All CRDs as one YAML stream (what ``loadline crds`` prints)."""
    return "".join(_HEADER + "---\n" + dump_yaml(crd) for crd in all_crds())


def crd_file_name(crd: dict[str, Any]) -> str:
    group = crd["spec"]["group"]
    plural = crd["spec"]["names"]["plural"]
    return f"{group}_{plural}.yaml"


def write_crds(directory: str | Path) -> list[Path]:
    """Write one file per CRD into ``directory`` (what ``crds/`` holds); returns the paths."""
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for crd in all_crds():
        path = out_dir / crd_file_name(crd)
        path.write_text(_HEADER + "---\n" + dump_yaml(crd))
        written.append(path)
    return written
