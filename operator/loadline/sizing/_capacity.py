"""Free GPUs in a cluster, from Node and Pod objects as plain dicts.

The planner takes ``{gpu type: [free GPUs on each node]}``; this module derives it from what the API
server returns, so the operator's capacity awareness is a pure function that tests feed with fixtures.
A node counts when it carries ``nvidia.com/gpu.product`` with a value the GPU catalog knows, is Ready
and schedulable; its free GPUs are allocatable ``nvidia.com/gpu`` minus the requests of the pods bound
to it that still hold resources. Pods of the InferenceModel being planned can be left out, since its
own GPUs become free when it is re-planned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from loadline.sizing._data import find_gpu, gpu_catalog
from loadline.sizing._shapes import GIB, ClusterShapes, build_cluster_shapes, parse_quantity

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
#: Kubernetes' well-known label for the cloud instance type (set by the cloud's node controller).
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


@lru_cache(maxsize=1024)
def _catalog_name(product: str) -> str | None:
    """The catalog's name for a GPU product label (memoized: a fleet has a handful of products and every
    plan reads every node's label; the catalog itself is read once per process)."""
    wanted = product.lower()
    for gpu in gpu_catalog().values():
        if gpu.product.lower() == wanted or gpu.name.lower() == wanted:
            return gpu.name
    return None


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _node_ready(node: Mapping[str, Any]) -> bool:
    if node.get("spec", {}).get("unschedulable"):
        return False
    for cond in node.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _pod_gpu_request(pod: Mapping[str, Any]) -> int:
    total = 0
    for container in pod.get("spec", {}).get("containers", []) or []:
        resources = container.get("resources", {}) or {}
        requested = (resources.get("requests") or {}).get(GPU_RESOURCE)
        limited = (resources.get("limits") or {}).get(GPU_RESOURCE)
        total += _quantity(requested if requested is not None else limited or 0)
    return total


def _holds_resources(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") not in {"Succeeded", "Failed"}


def _owned_by(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    pod_labels = pod.get("metadata", {}).get("labels", {}) or {}
    return bool(labels) and all(pod_labels.get(k) == v for k, v in labels.items())


def free_gpus_by_type(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    ignore_pods_labelled: Mapping[str, str] | None = None,
) -> dict[str, list[int]]:
    """``{catalog GPU name: [free GPUs per node, largest first]}`` for the Ready GPU nodes."""
    used: dict[str, int] = {}
    for pod in pods:
        node_name = pod.get("spec", {}).get("nodeName")
        if not node_name or not _holds_resources(pod):
            continue
        if ignore_pods_labelled and _owned_by(pod, ignore_pods_labelled):
            continue
        used[node_name] = used.get(node_name, 0) + _pod_gpu_request(pod)
    free: dict[str, list[int]] = {}
    for node in nodes:
        meta = node.get("metadata", {})
        product = (meta.get("labels") or {}).get(PRODUCT_LABEL)
        name = _catalog_name(product) if product else None
        if name is None or not _node_ready(node):
            continue
        allocatable = _quantity((node.get("status", {}).get("allocatable") or {}).get(GPU_RESOURCE, 0))
        free.setdefault(name, []).append(max(allocatable - used.get(meta.get("name", ""), 0), 0))
    return {name: sorted(counts, reverse=True) for name, counts in free.items()}


def _amount(value: Any, scale: float) -> float | None:
    if value is None:
        return None
    try:
        return float(parse_quantity(value)) / scale
    except ValueError:
        return None


def cluster_shapes(nodes: Iterable[Mapping[str, Any]]) -> ClusterShapes | None:
    """The node shapes the cluster has, from its GPU nodes (Ready or not: a node being replaced still
    tells which instance types the cluster runs). A node's ``node.kubernetes.io/instance-type`` names a
    catalog shape when the catalog knows it; otherwise the node's allocatable memory, CPU and GPU count
    make a shape of their own. None when no GPU node of a catalog type is seen: nothing is known."""
    seen = []
    for node in nodes:
        meta = node.get("metadata", {})
        labels = meta.get("labels") or {}
        product = labels.get(PRODUCT_LABEL)
        name = _catalog_name(product) if product else None
        if name is None:
            continue
        allocatable = node.get("status", {}).get("allocatable") or {}
        gpus, memory, cpu = _node_figures(
            allocatable.get(GPU_RESOURCE, 0), allocatable.get("memory"), allocatable.get("cpu")
        )
        seen.append(
            (name, str(meta.get("name", "")), str(labels.get(INSTANCE_TYPE_LABEL) or ""), gpus, memory, cpu)
        )
    return _shapes_of(tuple(seen))


@lru_cache(maxsize=4096)
def _node_figures(gpus: Any, memory: Any, cpu: Any) -> tuple[int, float | None, float | None]:
    """A node's allocatable GPUs, memory (GiB) and CPUs from its quantities (memoized: the nodes of a
    fleet share a few shapes, and parsing every node's quantities on every plan was a fifth of the
    operator's CPU while 1,000 models were created on 2,000 nodes, py-spy)."""
    return _quantity(gpus), _amount(memory, GIB), _amount(cpu, 1.0)


@lru_cache(maxsize=8)
def _shapes_of(
    seen: tuple[tuple[str, str, str, int, float | None, float | None], ...],
) -> ClusterShapes | None:
    """:func:`build_cluster_shapes` of the nodes' figures, memoized on them: the nodes change far less
    often than models are planned, and the figures decide the shapes (same figures, same shapes)."""
    return build_cluster_shapes(
        [
            (find_gpu(name), node, instance, gpus, memory, cpu)
            for name, node, instance, gpus, memory, cpu in seen
        ]
    )


def _required_products(pod_spec: Mapping[str, Any]) -> list[str]:
    """The GPU products a pod template's required node affinity admits (``nvidia.com/gpu.product In``)."""
    affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    products: list[str] = []
    for term in affinity.get("nodeSelectorTerms") or []:
        for rule in term.get("matchExpressions") or []:
            if rule.get("key") == PRODUCT_LABEL and rule.get("operator") == "In":
                products.extend(str(v) for v in rule.get("values") or [])
    selector = (pod_spec.get("nodeSelector") or {}).get(PRODUCT_LABEL)
    return [str(selector)] if selector else products


def workload_demand(workload: Mapping[str, Any]) -> tuple[str, int, int] | None:
    """What a Deployment asks the scheduler for, as a :func:`reserve` entry: ``(GPU type, GPUs per pod,
    pods)``, from its pod template's GPU request and the one GPU product its node affinity admits.
    None when it asks for no GPU, or for several products (where its pods land is the scheduler's pick).

    Why from the Deployment: it is what every operator replica sees (the API server's view, not one
    process's memory), so a model planned by another replica, or by this one before a restart, holds
    its GPUs in the next plan from the moment its Deployment exists, not only once its pods are bound."""
    spec = workload.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    per_pod = _pod_gpu_request({"spec": pod_spec})
    products = {name for name in map(_catalog_name, _required_products(pod_spec)) if name}
    if per_pod < 1 or len(products) != 1:
        return None
    replicas = spec.get("replicas")
    return products.pop(), per_pod, 1 if replicas is None else _quantity(replicas)


def reserve(
    free: Mapping[str, Sequence[int]], reservations: Iterable[tuple[str, int, int]]
) -> dict[str, list[int]]:
    """``free`` less GPUs promised to pods not bound yet: each reservation is ``(GPU type, GPUs per
    pod, pods)``, placed as the default scheduler spreads pods (the node with the most free GPUs that
    holds the pod). A pod no node holds takes nothing (it stays Pending; the next plan sees the type
    full either way, since its GPUs are not free).

    Why: the indexes only count bound pods. When many models are planned at once (created back to
    back), each would otherwise see the GPUs the ones before it were just given, and the whole burst
    would land on the cheapest type, its overflow Pending for good."""
    out = {name: sorted(counts, reverse=True) for name, counts in free.items()}
    for name, per_pod, pods in reservations:
        nodes = out.get(name)
        if not nodes or per_pod < 1:
            continue
        for _pod in range(pods):
            index = next((i for i, n in enumerate(nodes) if n >= per_pod), None)  # sorted: most free first
            if index is None:
                break
            nodes[index] -= per_pod
            nodes.sort(reverse=True)
    return out
