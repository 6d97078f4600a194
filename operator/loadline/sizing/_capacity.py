"""Free GPUs in a cluster, from Node and Pod objects as plain dicts.

The planner takes ``{gpu type: [free GPUs on each node]}``; this module derives it from what the API
server returns, so the operator's capacity awareness is a pure function that tests feed with fixtures.
A node counts when it carries ``nvidia.com/gpu.product`` with a value the GPU catalog knows, is Ready
and schedulable; its free GPUs are allocatable ``nvidia.com/gpu`` minus the requests of the pods bound
to it that still hold resources. Pods of the InferenceModel being planned can be left out, since its
own GPUs become free when it is re-planned.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from loadline.sizing._data import find_gpu, gpu_catalog
from loadline.sizing._shapes import ClusterShapes, build_cluster_shapes, parse_quantity
from loadline.units import GIB

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


class NodeRoom(NamedTuple):
    """One Ready GPU node as the planner places pods on it: its free GPUs, and the host memory (GiB)
    and CPU a pod may ask of it, those of its node shape (:func:`cluster_shapes`: the catalog's
    allocatable figures for a known instance type, else the node's own less the system pods' share).

    Why the shape's figures and not only GPUs: a GPU type's nodes come in several shapes (one L4 on
    16 GiB beside four on 192 GiB), and a free GPU on a node whose memory cannot hold the pod is no
    capacity for it: a plan counting it stayed Pending ("Insufficient memory") while another GPU type
    had room. The host memory other pods hold is the scheduler's to count (its reason reaches the
    model's Ready condition)."""

    gpus: int
    memory_gib: float = math.inf
    cpu: float = math.inf

    def takes(self, memory_gib: float, cpu: float) -> bool:
        """Whether a pod asking this much host memory and CPU fits the node's shape."""
        return memory_gib <= self.memory_gib and cpu <= self.cpu


#: GPU type → free GPUs per node: plain counts (any pod fits) or :class:`NodeRoom`.
FreeGPUs = Mapping[str, Sequence[int | NodeRoom]]


def gpus_used(
    pods: Iterable[Mapping[str, Any]], ignore_pods_labelled: Mapping[str, str] | None = None
) -> dict[str, int]:
    """GPUs requested per node name by the pods bound to it that still hold resources (those carrying
    all of ``ignore_pods_labelled`` left out)."""
    used: dict[str, int] = {}
    for pod in pods:
        held = pod_gpus(pod)
        if held is None or (ignore_pods_labelled and _owned_by(pod, ignore_pods_labelled)):
            continue
        used[held[0]] = used.get(held[0], 0) + held[1]
    return used


def pod_gpus(pod: Mapping[str, Any]) -> tuple[str, int] | None:
    """The node a pod is bound to and the GPUs it holds there; None when it holds none."""
    node_name = pod.get("spec", {}).get("nodeName")
    if not node_name or not _holds_resources(pod):
        return None
    return str(node_name), _pod_gpu_request(pod)


class GPUNode(NamedTuple):
    """A Ready GPU node as capacity counts it: its name, catalog GPU type, and its room when empty
    (allocatable GPUs, and the host memory and CPU of its shape)."""

    name: str
    gpu: str
    room: NodeRoom


def gpu_node(node: Mapping[str, Any]) -> GPUNode | None:
    """The node as :func:`free_rooms` counts it; None when it is no Ready, schedulable node of a
    catalog GPU type. A function of the node object alone, so a caller may keep it per node version."""
    meta = node.get("metadata", {})
    labels = meta.get("labels") or {}
    product = labels.get(PRODUCT_LABEL)
    name = _catalog_name(product) if product else None
    if name is None or not _node_ready(node):
        return None
    allocatable = node.get("status", {}).get("allocatable") or {}
    gpus, memory, cpu = _node_figures(
        allocatable.get(GPU_RESOURCE, 0), allocatable.get("memory"), allocatable.get("cpu")
    )
    room_memory, room_cpu = _room(name, str(labels.get(INSTANCE_TYPE_LABEL) or ""), gpus, memory, cpu)
    return GPUNode(str(meta.get("name", "")), name, NodeRoom(gpus, room_memory, room_cpu))


def free_rooms(gpu_nodes: Iterable[GPUNode], used: Mapping[str, int]) -> dict[str, list[NodeRoom]]:
    """``{catalog GPU name: [NodeRoom per node, most free GPUs first]}``: each node's room less the
    GPUs ``used`` on it (:func:`gpus_used`)."""
    free: dict[str, list[NodeRoom]] = {}
    for node in gpu_nodes:
        room = node.room  # a new NodeRoom by its constructor: _replace costs five times as much
        left = max(room.gpus - used.get(node.name, 0), 0)
        free.setdefault(node.gpu, []).append(NodeRoom(left, room.memory_gib, room.cpu))
    return {name: sorted(rooms, key=lambda r: -r.gpus) for name, rooms in free.items()}


def free_rooms_by_type(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    ignore_pods_labelled: Mapping[str, str] | None = None,
) -> dict[str, list[NodeRoom]]:
    """``{catalog GPU name: [NodeRoom per node, most free GPUs first]}`` for the Ready GPU nodes."""
    return free_rooms(
        (found for node in nodes if (found := gpu_node(node)) is not None),
        gpus_used(pods, ignore_pods_labelled),
    )


@lru_cache(maxsize=1024)
def _room(
    name: str, instance_type: str, gpus: int, memory: float | None, cpu: float | None
) -> tuple[float, float]:
    """The host memory and CPU a pod may ask of a node: the allocatable figures of the shape
    :func:`build_cluster_shapes` makes of it (unbounded when nothing is known to size against)."""
    built = build_cluster_shapes([(find_gpu(name), "", instance_type, gpus, memory, cpu)])
    shapes = built.shapes(name) if built is not None else None
    if not shapes:
        return math.inf, math.inf
    return shapes[0].allocatable_memory_gib, shapes[0].allocatable_cpu


def free_gpus_by_type(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    ignore_pods_labelled: Mapping[str, str] | None = None,
) -> dict[str, list[int]]:
    """``{catalog GPU name: [free GPUs per node, largest first]}`` for the Ready GPU nodes."""
    rooms = free_rooms_by_type(nodes, pods, ignore_pods_labelled=ignore_pods_labelled)
    return {name: sorted((r.gpus for r in found), reverse=True) for name, found in rooms.items()}


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
    return shapes_of(found for node in nodes if (found := shape_figures(node)) is not None)


#: What :func:`cluster_shapes` reads of a GPU node: catalog GPU name, node name, instance type,
#: allocatable GPUs, memory (GiB) and CPUs.
ShapeFigures = tuple[str, str, str, int, float | None, float | None]


def shape_figures(node: Mapping[str, Any]) -> ShapeFigures | None:
    """What :func:`cluster_shapes` reads of one node; None for a node of no catalog GPU type. A
    function of the node object alone, so a caller may keep it per node version."""
    meta = node.get("metadata", {})
    labels = meta.get("labels") or {}
    product = labels.get(PRODUCT_LABEL)
    name = _catalog_name(product) if product else None
    if name is None:
        return None
    allocatable = node.get("status", {}).get("allocatable") or {}
    gpus, memory, cpu = _node_figures(
        allocatable.get(GPU_RESOURCE, 0), allocatable.get("memory"), allocatable.get("cpu")
    )
    return name, str(meta.get("name", "")), str(labels.get(INSTANCE_TYPE_LABEL) or ""), gpus, memory, cpu


def shapes_of(figures: Iterable[ShapeFigures]) -> ClusterShapes | None:
    """:func:`cluster_shapes` from the nodes' :func:`shape_figures`."""
    return _shapes_of(tuple(figures))


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


def workload_demand(workload: Mapping[str, Any]) -> Reservation | None:
    """What a Deployment asks the scheduler for, as a :class:`Reservation`: GPU type, GPUs per pod,
    pods and each pod's host requests, from its pod template and the one GPU product its node affinity
    admits.
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
    memory, cpu = _pod_host_request(pod_spec)
    return Reservation(products.pop(), per_pod, 1 if replicas is None else _quantity(replicas), memory, cpu)


def _pod_host_request(pod_spec: Mapping[str, Any]) -> tuple[float, float]:
    """The host memory (GiB) and CPU a pod template's containers request (0 where they do not)."""
    memory = cpu = 0.0
    for container in pod_spec.get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        memory += _amount(requests.get("memory"), GIB) or 0.0
        cpu += _amount(requests.get("cpu"), 1.0) or 0.0
    return memory, cpu


class Reservation(NamedTuple):
    """GPUs promised to pods not bound yet: ``pods`` pods of ``per_pod`` GPUs of type ``gpu``, each
    asking ``memory_gib`` of host memory and ``cpu`` (0: not known, any node's shape takes it)."""

    gpu: str
    per_pod: int
    pods: int
    memory_gib: float = 0.0
    cpu: float = 0.0


def reserve(free: FreeGPUs, reservations: Iterable[Reservation]) -> dict[str, list[NodeRoom]]:
    """``free`` less GPUs promised to pods not bound yet: each :class:`Reservation` is placed as the
    default scheduler spreads pods (the node with the most free GPUs that holds the pod, its GPUs and
    its shape's host memory and CPU). A pod no node holds takes nothing (it stays Pending; the next
    plan sees the type full either way, since its GPUs are not free). Plain counts in ``free`` come
    back as rooms any pod fits.

    Why: the indexes only count bound pods. When many models are planned at once (created back to
    back), each would otherwise see the GPUs the ones before it were just given, and the whole burst
    would land on the cheapest type, its overflow Pending for good."""
    rooms = {
        name: sorted((n if isinstance(n, NodeRoom) else NodeRoom(n) for n in found), key=_most_free)
        for name, found in free.items()
    }
    return reserve_sorted(rooms, reservations)


def _most_free(room: NodeRoom) -> int:
    return -room.gpus


def reserve_sorted(
    free: Mapping[str, list[NodeRoom]], reservations: Iterable[Reservation]
) -> dict[str, list[NodeRoom]]:
    """:func:`reserve` of rooms already sorted most free first (what :func:`free_rooms` returns, a
    capacity snapshot's), which are not changed: only a type with a reservation is copied, and a room
    that gives GPUs moves to its place by bisection, not a sort of every node per pod (at 2,000 nodes
    and a burst of plans, re-sorting was an eighth of the operator's CPU)."""
    out = dict(free)
    copied: set[str] = set()
    for r in reservations:
        nodes = out.get(r.gpu)
        if not nodes or r.per_pod < 1:
            continue
        if r.gpu not in copied:
            nodes = out[r.gpu] = list(nodes)
            copied.add(r.gpu)
        for _pod in range(r.pods):
            index = next(  # sorted: most free first
                (i for i, n in enumerate(nodes) if n.gpus >= r.per_pod and n.takes(r.memory_gib, r.cpu)), None
            )
            if index is None:
                break
            room = nodes.pop(index)
            room = NodeRoom(room.gpus - r.per_pod, room.memory_gib, room.cpu)
            # Where a stable sort would put it: before the rooms now as free as it (it came first).
            nodes.insert(bisect.bisect_left(nodes, -room.gpus, lo=index, key=_most_free), room)
    return out
