"""In-memory views of GPU nodes and GPU pods for capacity planning, fed by kopf indexes.

Entries are trimmed to the API shape :func:`loadline.sizing.free_gpus_by_type` reads, so the same pure
function serves the index and a plain LIST. An object that stops qualifying (a pod that finished, a node
that lost its GPU label) maps to ``{}``, never None: kopf keeps an object's previous entries when its
indexing function returns None, and drops them only for an empty mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadline.sizing._capacity import GPU_RESOURCE, INSTANCE_TYPE_LABEL, PRODUCT_LABEL

INSTANCE_LABEL = "loadline.dev/inferencemodel"


def node_entry(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    labels = body.get("metadata", {}).get("labels") or {}
    if PRODUCT_LABEL not in labels:
        return {}
    status = body.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    allocatable = status.get("allocatable") or {}
    kept = {PRODUCT_LABEL: labels[PRODUCT_LABEL]}
    if labels.get(INSTANCE_TYPE_LABEL):
        kept[INSTANCE_TYPE_LABEL] = labels[INSTANCE_TYPE_LABEL]
    # allocatable cpu/memory: a node of an instance type the catalog lacks is planned as its own shape.
    resources = {GPU_RESOURCE: allocatable.get(GPU_RESOURCE, "0")}
    resources.update({k: allocatable[k] for k in ("cpu", "memory") if k in allocatable})
    return {
        name: {
            "metadata": {"name": name, "labels": kept},
            "spec": {"unschedulable": bool((body.get("spec") or {}).get("unschedulable"))},
            "status": {"allocatable": resources, "conditions": [dict(c) for c in ready]},
        }
    }


def pod_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    node = spec.get("nodeName")
    phase = (body.get("status") or {}).get("phase")
    if not node or phase in {"Succeeded", "Failed"}:
        return {}
    limits = []
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        gpus = (resources.get("requests") or {}).get(GPU_RESOURCE) or (resources.get("limits") or {}).get(
            GPU_RESOURCE
        )
        if gpus:
            limits.append({"resources": {"limits": {GPU_RESOURCE: gpus}}})
    if not limits:
        return {}
    meta = body.get("metadata") or {}
    label = (meta.get("labels") or {}).get(INSTANCE_LABEL)
    return {
        node: {
            "metadata": {
                "namespace": meta.get("namespace"),
                "labels": {INSTANCE_LABEL: label} if label else {},
            },
            "spec": {"nodeName": node, "containers": limits},
            "status": {"phase": phase},
        }
    }


def view(
    nodes: Mapping[str, Any], pods: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(nodes, pods) as lists from two kopf indexes (key → collection of entries)."""
    return [dict(v) for store in nodes.values() for v in store], [
        dict(v) for store in pods.values() for v in store
    ]
