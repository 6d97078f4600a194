"""In-memory views of GPU nodes and GPU pods for capacity planning, fed by kopf indexes.

Entries are trimmed to the API shape :func:`loadline.sizing.free_gpus_by_type` reads, so the same pure
function serves the index and a plain LIST. An object that stops qualifying (a pod that finished, a node
that lost its GPU label) maps to ``{}``, never None: kopf keeps an object's previous entries when its
indexing function returns None, and drops them only for an empty mapping.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from loadline.render import LABEL_MANAGED_BY, LABEL_MODEL, MANAGED_BY
from loadline.sizing._capacity import GPU_RESOURCE, INSTANCE_TYPE_LABEL, PRODUCT_LABEL

INSTANCE_LABEL = LABEL_MODEL

#: What the API server sends the operator, per (group, version, plural): a label selector and a field
#: selector, applied server-side to every watch and list of that resource (kopf's
#: ``settings.watching``). Each admits every object an index or handler keeps, and leaves out what
#: none reads:
#: - nodes: only GPU nodes (the GPU product label ``node_entry`` requires);
#: - pods: only pods bound to a node and not Succeeded. ``pod_entry`` keeps bound, unfinished GPU pods;
#:   the OOM handler reads loadline's own pods once they ran (bound). ``Failed`` stays in: an evicted
#:   pod is Failed. A field selector cannot say "requests GPUs" or "on a GPU node", so the pods of the
#:   other nodes still arrive and are dropped by ``pod_entry`` (docs/operator.md, "What is watched");
#: - Deployments: only those loadline manages.
WATCH_SELECTORS: dict[tuple[str, str, str], tuple[str | None, str | None]] = {
    ("", "v1", "nodes"): (PRODUCT_LABEL, None),
    ("", "v1", "pods"): (None, "spec.nodeName!=,status.phase!=Succeeded"),
    ("apps", "v1", "deployments"): (f"{LABEL_MANAGED_BY}={MANAGED_BY}", None),
}


_K = TypeVar("_K")
_V = TypeVar("_V")


#: How many times :func:`pairs` copies an index that kept changing under it before it gives up (each copy
#: takes well under a thread switch interval: one more almost always finds it still).
COPY_ATTEMPTS = 100


def pairs(index: Mapping[_K, Iterable[_V]]) -> list[tuple[_K, _V]]:
    """Every (key, entry) of a kopf index as it is now, safe to read from a handler's thread.

    kopf changes its indexes on its event loop while sync handlers run in threads. Stepping through an
    index (its keys, then each key's store) lets another thread change it between two steps, which
    raised ``RuntimeError: dictionary changed size during iteration`` (the maintenance timer, in a storm
    of 1,000 crashes) or ``KeyError``. No step of Python is atomic against that, and the index has no
    lock to take, so the copy is made again when it was broken: what a reader gets is the index as it
    was at some moment, never a failure."""

    def copy() -> list[tuple[_K, _V]]:
        return [(key, entry) for key in list(index) for entry in list(index.get(key) or ())]

    for _ in range(COPY_ATTEMPTS - 1):
        with contextlib.suppress(RuntimeError, KeyError):
            return copy()
    return copy()


def entries(index: Mapping[Any, Iterable[_V]]) -> list[_V]:
    """Every entry of a kopf index as it is now, safe to read from a handler's thread (:func:`pairs`)."""
    return [entry for _, entry in pairs(index)]


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
    kept: dict[str, Any] = {
        "namespace": meta.get("namespace"),
        "labels": {INSTANCE_LABEL: label} if label else {},
    }
    if meta.get("deletionTimestamp"):  # still holds its GPUs, but fills no reservation (capacity)
        kept["deletionTimestamp"] = meta["deletionTimestamp"]
    return {
        node: {
            "metadata": kept,
            "spec": {"nodeName": node, "containers": limits},
            "status": {"phase": phase},
        }
    }


def model_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """An InferenceModel as the handlers of its children's events read it without asking the API
    server: its identity and resourceVersion (a write guarded by it gets 409 when the entry is stale,
    and the handler reads the model then), labels and generation, spec and status."""
    meta = body.get("metadata") or {}
    kept = {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion", "generation")}
    kept["labels"] = dict(meta.get("labels") or {})
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": kept,
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }


#: How long one snapshot of the GPU node and pod indexes serves every plan made meanwhile.
VIEW_SECONDS = 0.5
#: How old a snapshot a crash's remediation plans on: up to this, the last one built serves. A snapshot
#: only ever shows less room than there is (:meth:`loadline.sizing.CapacityBook.capacity`), and a
#: remediation that finds none in it is left to reconcile, which plans on a fresh one; in a burst of
#: 1,000 crashes, working out the capacity of a new snapshot twice a second was 14 % of the operator's
#: time (py-spy).
REMEDIATION_VIEW_SECONDS = 10.0


ViewEntry = tuple[Mapping[str, Any], Mapping[str, Any], float, tuple[list[Any], list[Any]]]


class Views:
    """Snapshots of the GPU node and pod indexes, one per ``max_age`` asked for: a remediation keeps
    planning on its own while reconcile and the maintenance timer take a new one every half second (one
    slot for all of them made the remediations' capacity be worked out again for each of those). One
    per operator process (:class:`loadline.handlers._state.OperatorState`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: dict[float, ViewEntry] = {}

    def view(
        self, nodes: Mapping[str, Any], pods: Mapping[str, Any], max_age: float = VIEW_SECONDS
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(nodes, pods) as lists from two kopf indexes (key → collection of entries). The entries
        themselves, not copies: every reader only reads them, and a plan reads every GPU node and pod.

        One snapshot serves for ``max_age`` (:data:`VIEW_SECONDS`): a burst of creations plans several
        models a second, and each plan went over every one of 2,000 nodes and 1,000 pods (the lists, the
        free GPUs, the node shapes: a third of the operator's CPU while 1,000 models were created,
        py-spy). The same snapshot object also lets the capacity derived from it be computed once
        (:class:`loadline.sizing.CapacityBook`). Half a second adds little to what the indexes already
        trail the API server by (their watch events come seconds late under that load), and GPUs planned
        meanwhile are reserved from this process's own record of its plans, which the snapshot does not
        hold."""
        now = time.monotonic()
        with self._lock:
            own = self._views.get(max_age)
            if own is not None and own[0] is nodes and own[1] is pods and now - own[2] < max_age:
                return own[3]
            # Else the newest snapshot young enough for this caller (another's), kept as this one's own.
            young = [
                v for v in self._views.values() if v[0] is nodes and v[1] is pods and now - v[2] < max_age
            ]
            if young:
                self._views[max_age] = newest = max(young, key=lambda v: v[2])
                return newest[3]
        built = (entries(nodes), entries(pods))
        with self._lock:
            self._views[max_age] = (nodes, pods, now, built)
        return built
