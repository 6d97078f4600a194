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


def build_inferencemodel_crd() -> dict[str, Any]:
    """The InferenceModel CRD as a plain dict."""
    spec_schema = openapi_schema(InferenceModelSpec)
    status_schema = openapi_schema(InferenceModelStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "loadline"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
                        {"name": "GPU", "type": "string", "jsonPath": ".status.plan.gpu"},
                        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {
                            "name": "Max-Concurrency",
                            "type": "number",
                            "jsonPath": ".status.plan.maxConcurrency",
                            "priority": 1,
                        },
                        {
                            "name": "GPU-Used-GiB",
                            "type": "number",
                            "jsonPath": ".status.measuredGpuMemory.maxUsedGiB",
                            "priority": 1,
                        },
                        {
                            "name": "Next-Restart",
                            "type": "string",
                            "jsonPath": ".status.maintenance.scheduledAt",
                        },
                        {
                            "name": "OOM-Predicted",
                            "type": "string",
                            "jsonPath": ".status.oomRisk.predictedAt",
                            "priority": 1,
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "description": (
                                "A model served by vLLM on GPUs, sized and kept out of out-of-memory "
                                "trouble by loadline."
                            ),
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def build_fleetpolicy_crd() -> dict[str, Any]:
    """The FleetPolicy CRD as a plain dict: cluster-scoped, the platform team's, not a namespace's."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{POLICY_PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "loadline"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": POLICY_KIND,
                "listKind": f"{POLICY_KIND}List",
                "plural": POLICY_PLURAL,
                "singular": POLICY_SINGULAR,
                "shortNames": list(POLICY_SHORT_NAMES),
                "categories": list(POLICY_CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Selector", "type": "string", "jsonPath": ".status.selector"},
                        {"name": "Enforcement", "type": "string", "jsonPath": ".spec.enforcement"},
                        {"name": "Models", "type": "integer", "jsonPath": ".status.modelsGoverned"},
                        {"name": "Violations", "type": "integer", "jsonPath": ".status.violations"},
                        {
                            "name": "Priority",
                            "type": "integer",
                            "jsonPath": ".spec.priority",
                            "priority": 1,
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "description": (
                                "Defaults and limits a platform team sets for every InferenceModel it "
                                "governs."
                            ),
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": openapi_schema(FleetPolicySpec),
                                "status": openapi_schema(FleetPolicyStatus),
                            },
                        }
                    },
                }
            ],
        },
    }


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
