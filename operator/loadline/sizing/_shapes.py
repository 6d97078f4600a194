"""Node shapes: the instances a GPU type comes in, what a vLLM pod asks of one, which shape it takes, and
what the pod is charged for it.

A GPU price alone misleads: clouds rent whole instances, and an instance brings a fixed host memory and
CPU count with its GPUs. A pod whose host-memory request exceeds the instance's allocatable memory never
schedules there, whatever its GPUs cost. So a plan names the shape it assumes (``data/node_shapes.json``,
one row per instance type with its source), and the pod's requests are checked against that shape's
*allocatable* resources (capacity minus the node's own reserve, a published formula kept as data).

What a pod is charged (:func:`node_charge`): its share of the instance's price, the largest of its GPU
share (its GPUs of the instance's), host-memory share and CPU share (its requests of the instance's
allocatable), because in a fleet the rest of the node serves other pods, and a pod that takes most of
the memory of a node keeps others off it as surely as one that takes its GPUs. The whole instance is
charged when the pod leaves no room for another GPU pod (no GPU left, or less allocatable memory or CPU
left than the smallest pod loadline sizes for one GPU asks: :func:`smallest_gpu_pod`), since then
nothing else can use what is left, and when the spec asks for dedicated nodes
(``spec.gpu.dedicatedNodes``). Shares of pods that fill a node add up to the instance's price, since
they are shares of allocatable, which is all the pods get. The planner picks the shape whose charge is
lowest, so a one-GPU pod may take an eighth of an 8-GPU instance when that costs less than a one-GPU
instance, and the plan says which it charged (:func:`charge_text`).

The pod's host requests (memory, CPU) are computed here, once, and used both by the planner and by the
renderer (``loadline.render``), so the shape checked is the shape the manifests ask for:

* host memory = ``spec.resources.memoryGiB``, else max(16, ⌈weights on this pod's GPUs + CPU KV offload
  share + /dev/shm + 4 + 1 per GPU⌉). Why: safetensors are memory-mapped while loading and the page
  cache they fill is charged to the pod's cgroup (a limit below one copy of the pod's weights makes
  loading thrash); the offload buffer is pinned host memory; a memory-backed emptyDir counts against the
  limit; 4 GiB for the API server, tokenizer and engine processes and ~1 GiB of CUDA host allocations
  per GPU worker.
* CPU = ``spec.resources.cpu``, else 1 + 2 per GPU (API server, engine core busy loop and one worker
  process per GPU).
* /dev/shm = max(2, 2 × GPUs per pod): NCCL and vLLM's multiprocessing executor exchange tensors there.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import cache
from typing import Any

from kubernetes.utils.quantity import parse_quantity as _untyped_parse_quantity

from loadline.errors import SpecError
from loadline.sizing._data import GPU_CATALOG_ENV, GPUType, read_json, read_user_catalog
from loadline.sizing._memo import GuardedMemo
from loadline.units import GIB

parse_quantity: Callable[[object], Decimal] = _untyped_parse_quantity  # the client ships no types
#: Providers a shape may name; ``spec.gpu.providers`` restricts the planner to some of them. A shape
#: derived from a cluster node of an instance type the catalog does not know has provider "cluster".
PROVIDERS = ("aws", "gcp", "azure", "onprem")
#: Tensor parallelism above this all-reduces every layer across more GPUs than a PCIe switch pair serves
#: well, so shapes with NVLink are preferred for it (vLLM's custom all-reduce needs NVLink beyond 2 GPUs).
NVLINK_PREFERRED_ABOVE_TP = 2


def _gib(quantity: str, where: str) -> float:
    try:
        return float(parse_quantity(quantity)) / GIB
    except ValueError:
        raise SpecError(where, f"{quantity!r} is not a Kubernetes quantity", "write it like 16Gi") from None


def _cores(quantity: Any, where: str) -> float:
    try:
        return float(parse_quantity(quantity))
    except ValueError:
        raise SpecError(where, f"{quantity!r} is not a CPU quantity", "write it like 500m or 4") from None


@dataclass(frozen=True)
class Reserve:
    """What a node keeps for the kubelet, the system and its DaemonSets (tiers: (up to, fraction))."""

    memory_tiers: tuple[tuple[float | None, float], ...]
    eviction_gib: float
    cpu_tiers: tuple[tuple[float | None, float], ...]
    system_pods_memory_gib: float
    system_pods_cpu: float

    @staticmethod
    def _tiered(total: float, tiers: Sequence[tuple[float | None, float]]) -> float:
        reserved, floor = 0.0, 0.0
        for ceiling, fraction in tiers:
            top = total if ceiling is None else min(total, ceiling)
            if top > floor:
                reserved += (top - floor) * fraction
            if ceiling is None or total <= ceiling:
                break
            floor = ceiling
        return reserved

    def memory_gib(self, capacity_gib: float) -> float:
        return self._tiered(capacity_gib, self.memory_tiers) + self.eviction_gib + self.system_pods_memory_gib

    def cpu(self, capacity: float) -> float:
        return self._tiered(capacity, self.cpu_tiers) + self.system_pods_cpu


@dataclass(frozen=True)
class NodeShape:
    """One instance type (or on-prem server) of one GPU type, with its allocatable resources."""

    name: str
    provider: str
    gpu: str
    gpus: int
    memory_gib: float
    vcpus: float
    price_per_hour: float | None
    interconnect: str
    rdma: str
    source: str
    allocatable_memory_gib: float
    allocatable_cpu: float
    #: Whether a dated public source states the price (``price_source``/``price_as_of`` name it); a
    #: recalled figure is kept only with this false, and every plan priced from it says so.
    price_verified: bool = False
    price_source: str = ""
    price_as_of: str | None = None
    #: The Kubernetes ``node.kubernetes.io/instance-type`` value nodes of this shape carry (the name for
    #: the catalog's cloud shapes; empty for a shape derived from a node whose label is unknown).
    instance_type: str = ""

    @property
    def nvlink(self) -> bool:
        return self.interconnect == "nvlink"

    @property
    def fabric(self) -> bool:
        """Whether instances of this shape are joined by an RDMA-class fabric (pipeline parallel across)."""
        return self.rdma != "none"

    @property
    def instance_type_known(self) -> bool:
        """A catalog shape (a provider and a price basis), not one derived from a node."""
        return self.provider in PROVIDERS

    @property
    def unverified_price(self) -> bool:
        """A price is set but no dated source states it: the plan must say so."""
        return self.price_per_hour is not None and not self.price_verified

    def price_text(self) -> str:
        if self.price_per_hour is None:
            return "no price"
        return f"${self.price_per_hour:.2f}/h" + ("" if self.price_verified else " unverified")

    def describe(self) -> str:
        price = self.price_text()
        return (
            f"{self.name} ({self.provider}, {self.gpus}×{self.gpu} {self.interconnect}, "
            f"{self.memory_gib:g} GiB, {self.vcpus:g} vCPU, {price})"
        )


def _reserve(raw: dict[str, Any]) -> Reserve:
    def tiers(rows: list[list[Any]]) -> tuple[tuple[float | None, float], ...]:
        return tuple((None if up is None else float(up), float(fraction)) for up, fraction in rows)

    return Reserve(
        memory_tiers=tiers(raw["memory_tiers_gib"]),
        eviction_gib=_gib(raw["eviction"], "node_shapes.json: reserve.eviction"),
        cpu_tiers=tiers(raw["cpu_tiers_cores"]),
        system_pods_memory_gib=_gib(
            raw["system_pods_memory"], "node_shapes.json: reserve.system_pods_memory"
        ),
        system_pods_cpu=_cores(raw["system_pods_cpu"], "node_shapes.json: reserve.system_pods_cpu"),
    )


def _shape(entry: Any, reserve: Reserve, where: str) -> NodeShape:
    if not isinstance(entry, dict):
        raise SpecError(where, "is not a mapping", "write each shape as in node_shapes.json")
    try:
        memory = _gib(str(entry["memory"]), f"{where}.memory")
        vcpus = _cores(entry["vcpus"], f"{where}.vcpus")
        price = entry.get("price_per_hour")
        provider = str(entry["provider"])
        rdma = str(entry.get("rdma", "none"))
        shape = NodeShape(
            name=str(entry["name"]),
            provider=provider,
            gpu=str(entry["gpu"]),
            gpus=int(entry["gpus"]),
            memory_gib=memory,
            vcpus=vcpus,
            price_per_hour=None if price is None else float(price),
            interconnect=str(entry["interconnect"]),
            rdma=rdma,
            source=str(entry.get("source", "")),
            allocatable_memory_gib=max(memory - reserve.memory_gib(memory), 0.0),
            allocatable_cpu=max(vcpus - reserve.cpu(vcpus), 0.0),
            price_verified=bool(entry.get("price_verified", False)) and price is not None,
            price_source=str(entry.get("price_source", "")),
            price_as_of=None if entry.get("price_as_of") is None else str(entry["price_as_of"]),
            instance_type=str(entry.get("instance_type", entry["name"])),
        )
    except KeyError as exc:
        raise SpecError(f"{where}.{exc.args[0]}", "is missing", "compare with node_shapes.json") from None
    except (TypeError, ValueError) as exc:
        raise SpecError(
            where, f"has a value of the wrong type ({exc})", "compare with node_shapes.json"
        ) from None
    if shape.provider not in PROVIDERS:
        raise SpecError(
            f"{where}.provider", f"{shape.provider!r} is not a provider", f"use one of {PROVIDERS}"
        )
    if shape.interconnect not in {"nvlink", "pcie"}:
        raise SpecError(f"{where}.interconnect", f"{shape.interconnect!r} is unknown", "use nvlink or pcie")
    if shape.gpus < 1 or shape.memory_gib <= 0 or shape.vcpus <= 0:
        raise SpecError(where, "needs positive gpus, memory and vcpus", "fix the entry")
    return shape


@cache
def reserve() -> Reserve:
    return _reserve(read_json("node_shapes.json")["reserve"])


def node_shapes() -> dict[str, tuple[NodeShape, ...]]:
    """Shapes per GPU catalog name, cheapest first (unpriced last): the bundled ones, then the user
    catalog's ``shapes`` (same name: the user's row wins), as for GPU types."""
    return _node_shapes(os.environ.get(GPU_CATALOG_ENV, "").strip())


@cache
def _node_shapes(user_file: str) -> dict[str, tuple[NodeShape, ...]]:
    res = reserve()
    rows: dict[str, NodeShape] = {}
    for i, entry in enumerate(read_json("node_shapes.json")["shapes"]):
        shape = _shape(entry, res, f"node_shapes.json: shapes[{i}]")
        rows[shape.name] = shape
    if user_file:
        path, doc = user_file, read_user_catalog(user_file)
        entries = doc.get("shapes", []) if isinstance(doc, dict) else []
        if not isinstance(entries, list):
            raise SpecError(f"{path}: shapes", "is not a list", 'write {"shapes": [...]}')
        for i, entry in enumerate(entries):
            shape = _shape(entry, res, f"{path}: shapes[{i}]")
            rows[shape.name] = shape
    by_gpu: dict[str, list[NodeShape]] = {}
    for shape in rows.values():
        by_gpu.setdefault(shape.gpu, []).append(shape)
    return {
        gpu: tuple(sorted(shapes, key=lambda s: (s.price_per_hour is None, s.price_per_hour or 0.0, s.gpus)))
        for gpu, shapes in by_gpu.items()
    }


@dataclass(frozen=True)
class ClusterShapes:
    """The node shapes a cluster actually has, from its GPU nodes (see
    :func:`loadline.sizing.cluster_shapes`): per GPU type the shapes of its nodes, and the providers
    those shapes tell. Hashable, so plans memoised per input stay correct when the cluster changes."""

    by_gpu: tuple[tuple[str, tuple[NodeShape, ...]], ...] = ()
    providers: tuple[str, ...] = ()

    def shapes(self, gpu_name: str) -> tuple[NodeShape, ...] | None:
        for name, shapes in self.by_gpu:
            if name == gpu_name:
                return shapes
        return None


def allowed_shapes(
    gpu: GPUType, providers: Sequence[str] = (), cluster: ClusterShapes | None = None
) -> tuple[NodeShape, ...]:
    """The shapes a plan on ``gpu`` may assume, memoised (the planner asks per layout).

    Without ``cluster``: ``shapes_for(gpu)`` within ``providers`` (empty: all). With it (the operator
    knows the cluster's GPU nodes): a GPU type the cluster has nodes of gets only those nodes' shapes (a
    catalog shape when its instance type is known, else one derived from the node itself); a type it
    has none of gets the catalog's shapes from the providers the cluster's nodes are on, so an AWS
    cluster is never planned on a GCP machine. ``providers`` still restricts catalog shapes."""
    key = (gpu.name, tuple(providers), os.environ.get(GPU_CATALOG_ENV, ""), cluster)
    return _ALLOWED.get(key, gpu, lambda: _allowed(gpu, tuple(providers), cluster))


def _allowed(
    gpu: GPUType, providers: tuple[str, ...], cluster: ClusterShapes | None
) -> tuple[NodeShape, ...]:
    in_cluster = cluster.shapes(gpu.name) if cluster is not None else None
    if in_cluster is not None:
        return tuple(
            s for s in in_cluster if not providers or not s.instance_type_known or s.provider in providers
        )
    wanted = providers or (cluster.providers if cluster is not None else ())
    if providers and cluster is not None and cluster.providers:
        wanted = tuple(p for p in providers if p in cluster.providers) or providers
    return tuple(s for s in shapes_for(gpu) if not wanted or s.provider in wanted)


# A long-running operator sees many cluster states: bounded.
_ALLOWED: GuardedMemo[tuple[str, tuple[str, ...], str, ClusterShapes | None], tuple[NodeShape, ...]] = (
    GuardedMemo(4096)
)


def _by_price(shapes: Sequence[NodeShape]) -> tuple[NodeShape, ...]:
    return tuple(sorted(shapes, key=lambda s: (s.price_per_hour is None, s.price_per_hour or 0.0, s.gpus)))


def node_as_shape(
    gpu: GPUType, node_name: str, instance_type: str, gpus: int, memory_gib: float, cpu: float
) -> NodeShape:
    """A GPU node whose instance type the catalog does not know, taken as a shape of its own: its
    allocatable memory and CPU (the kubelet's reserve is already out of them; loadline's allowance for
    DaemonSets is taken off as for catalog shapes), its GPU count, the GPU catalog's interconnect, no
    fabric assumed, and the GPU catalog's approximate per-GPU price, marked unverified."""
    res = reserve()
    label = instance_type or f"node {node_name}"
    return NodeShape(
        name=f"{label} ({gpus}×{gpu.name}, {memory_gib:.0f} GiB, {cpu:g} CPU)",
        provider="cluster",
        gpu=gpu.name,
        gpus=gpus,
        memory_gib=memory_gib,
        vcpus=cpu,
        price_per_hour=round(gpu.price_per_gpu_hour * gpus, 4) if gpu.price_per_gpu_hour else None,
        interconnect=gpu.interconnect,
        rdma="none",
        source=f"the cluster's node {node_name}: allocatable memory and CPU, {gpus} GPUs "
        f"(instance type {instance_type or 'unlabelled'} is not in the catalog)",
        allocatable_memory_gib=max(memory_gib - res.system_pods_memory_gib, 0.0),
        allocatable_cpu=max(cpu - res.system_pods_cpu, 0.0),
        price_source=f"UNVERIFIED: the GPU catalog's approximate per-GPU price × {gpus} "
        f"(no price for {instance_type or 'an unlabelled node'})",
        instance_type=instance_type,
    )


def build_cluster_shapes(
    nodes: Sequence[tuple[GPUType, str, str, int, float | None, float | None]],
) -> ClusterShapes | None:
    """``ClusterShapes`` from (GPU type, node name, instance-type label, GPUs, allocatable memory GiB,
    allocatable CPU) per GPU node; None when there are none (nothing is known, plan from the catalog).

    A node whose label names a catalog shape of its GPU type with its GPU count is that shape; any
    other node is a shape of its own (:func:`node_as_shape`), one per distinct instance type (or, when
    unlabelled, per distinct size), keeping the smallest allocatable figures seen so every node of it
    takes the pod."""
    if not nodes:
        return None
    found: dict[str, dict[tuple[object, ...], NodeShape]] = {}
    providers: set[str] = set()
    for gpu, node_name, instance_type, gpus, memory_gib, cpu in nodes:
        shapes = found.setdefault(gpu.name, {})
        known = next(
            (
                s
                for s in shapes_for(gpu)
                if instance_type and s.instance_type == instance_type and s.gpus == gpus
            ),
            None,
        )
        if known is not None:
            shapes[("catalog", known.name)] = known
            providers.add(known.provider)
            continue
        if memory_gib is None or cpu is None or gpus < 1:
            continue  # nothing to size a pod against; the node still counts for free GPUs
        key: tuple[object, ...] = (instance_type, gpus) if instance_type else ("", gpus, memory_gib, cpu)
        previous = shapes.get(key)
        if previous is not None:
            memory_gib = min(memory_gib, previous.memory_gib)
            cpu = min(cpu, previous.vcpus)
        shapes[key] = node_as_shape(gpu, node_name, instance_type, gpus, memory_gib, cpu)
    return ClusterShapes(
        by_gpu=tuple((name, _by_price(list(found[name].values()))) for name in sorted(found) if found[name]),
        providers=tuple(sorted(providers)),
    )


def shapes_for(gpu: GPUType) -> tuple[NodeShape, ...]:
    """The shapes of ``gpu``; a GPU type without any (a user's, or ``loadline gpus --probe``'s) gets one
    generic shape per ``gpus_per_node`` entry: its catalog interconnect, its per-GPU price, and host
    memory and CPU taken as unbounded (the plan says they were not checked)."""
    known = node_shapes().get(gpu.name)
    if known:
        return known
    return tuple(
        NodeShape(
            name=f"{gpu.name} node ({count} GPUs)",
            provider="onprem",
            gpu=gpu.name,
            gpus=count,
            memory_gib=math.inf,
            vcpus=math.inf,
            price_per_hour=round(gpu.price_per_gpu_hour * count, 4) if gpu.price_per_gpu_hour else None,
            interconnect=gpu.interconnect,
            rdma="generic" if gpu.multi_node else "none",
            source="generic: the GPU catalog entry has no node shapes; host memory and CPU not checked",
            allocatable_memory_gib=math.inf,
            allocatable_cpu=math.inf,
            price_source="the GPU catalog's per-GPU price × GPUs (no instance price known)",
        )
        for count in sorted(gpu.gpus_per_node)
    )


@dataclass(frozen=True)
class PodRequest:
    """What one vLLM pod of a plan asks of its node besides GPUs."""

    gpus: int
    memory_gib: int
    cpu: int
    shm_gib: int


def pod_request(
    *,
    weights_gib_per_gpu: float,
    gpus_per_pod: int,
    nodes: int,
    kv_offload_gib: float,
    memory_override_gib: float | None,
    cpu_override: int | None,
) -> PodRequest:
    """The rules of this module's docstring for one pod (``nodes`` pods per replica)."""
    gpus = max(gpus_per_pod, 1)
    shm = max(2, 2 * gpus)
    if memory_override_gib is not None:
        memory = math.ceil(memory_override_gib)
    else:
        needed = weights_gib_per_gpu * gpus + kv_offload_gib / max(nodes, 1) + shm + 4 + gpus
        memory = max(16, math.ceil(needed))
    return PodRequest(gpus, memory, cpu_override or 1 + 2 * gpus, shm)  # gpus, memory_gib, cpu, shm_gib


@cache
def smallest_gpu_pod() -> PodRequest:
    """The least any GPU pod loadline sizes asks of a node: one GPU, and the host memory and CPU
    :func:`pod_request` gives one GPU with no weights, offload or overrides (16 GiB, 3 CPU). A node with
    no GPU left, or less allocatable memory or CPU left than this, has no room for another GPU pod."""
    return pod_request(
        weights_gib_per_gpu=0.0,
        gpus_per_pod=1,
        nodes=1,
        kv_offload_gib=0.0,
        memory_override_gib=None,
        cpu_override=None,
    )


@dataclass(frozen=True)
class NodeCharge:
    """The part of one instance's price a pod of a plan is charged (see the module's docstring)."""

    share: float  # of one instance's price; 1.0: the whole instance
    basis: str  # "GPU", "host-memory" or "CPU": the largest of the pod's shares; "" for the whole node
    why: str = ""  # for the whole node: why (no room left for another GPU pod, or dedicated nodes)

    @property
    def whole(self) -> bool:
        return not self.basis


#: What a pod is charged where no charge was worked out (no shape chosen): the whole instance.
WHOLE_NODE = NodeCharge(1.0, "", "")


def node_charge(shape: NodeShape, pod: PodRequest, dedicated: bool = False) -> NodeCharge:
    """What ``pod`` is charged of ``shape``, a shape that takes it: the whole instance when
    ``dedicated`` or when it leaves no room for another GPU pod (:func:`smallest_gpu_pod`), else the
    largest of its GPU, host-memory and CPU shares (requests against allocatable)."""
    if dedicated:
        return NodeCharge(1.0, "", "spec.gpu.dedicatedNodes: the node runs this pod alone")
    least = smallest_gpu_pod()
    free_gpus = shape.gpus - pod.gpus
    free_memory = shape.allocatable_memory_gib - pod.memory_gib
    free_cpu = shape.allocatable_cpu - pod.cpu
    if free_gpus < least.gpus:
        taken = "the node's one GPU" if shape.gpus == 1 else f"all {shape.gpus} GPUs"
        return NodeCharge(1.0, "", f"the pod takes {taken}")
    if free_memory < least.memory_gib:
        return NodeCharge(
            1.0,
            "",
            f"the pod leaves {free_memory:.1f} GiB of allocatable memory, less than the "
            f"{least.memory_gib} GiB another GPU pod asks",
        )
    if free_cpu < least.cpu:
        return NodeCharge(
            1.0,
            "",
            f"the pod leaves {free_cpu:.2f} allocatable CPU, less than the {least.cpu} another GPU pod asks",
        )
    shares = (
        (pod.gpus / shape.gpus, "GPU"),
        (pod.memory_gib / shape.allocatable_memory_gib, "host-memory"),
        (pod.cpu / shape.allocatable_cpu, "CPU"),
    )
    share, basis = max(shares, key=lambda s: s[0])  # the first of equal shares: GPU before the host's
    return NodeCharge(share, basis)


def _share_text(shape: NodeShape, pod: PodRequest, charge: NodeCharge) -> str:
    if charge.basis == "GPU":
        return str(Fraction(pod.gpus, shape.gpus))
    return f"{charge.share:.1%}"


def charge_text(shape: NodeShape, pod: PodRequest, instances: int, charge: NodeCharge) -> str:
    """What the plan charges and why, e.g. "$6.88/h: 1/8 of p5.48xlarge's $55.04/h (GPU share)" or
    "$110.08/h: whole node, 2 × p5.48xlarge's $55.04/h (the pod takes all 8 GPUs)"."""
    times = f"{instances} × " if instances > 1 else ""
    base = shape.price_text() if shape.price_per_hour is None else f"${shape.price_per_hour:.2f}/h"
    if shape.price_per_hour is None:
        total = "no price"
    else:
        total = f"${round(shape.price_per_hour * charge.share * instances, 6):.2f}/h"
    if charge.whole:
        return f"{total}: whole node, {times}{shape.name}'s {base} ({charge.why})"
    of = ""
    if charge.basis == "host-memory":
        of = f": {pod.memory_gib} of {shape.allocatable_memory_gib:.1f} GiB allocatable"
    elif charge.basis == "CPU":
        of = f": {pod.cpu} of {shape.allocatable_cpu:.2f} allocatable CPU"
    share = _share_text(shape, pod, charge)
    return f"{total}: {times}{share} of {shape.name}'s {base} ({charge.basis} share{of})"


@dataclass(frozen=True)
class ShapeChoice:
    """The shape a candidate assumes and what its pods are charged of it, or why none fits."""

    shape: NodeShape | None
    instances: int  # per replica
    note: str  # why this shape (NVLink preference, GPUs left, cheaper shapes that did not fit)
    rejection: str = ""
    charge: NodeCharge = WHOLE_NODE

    @property
    def price_per_hour(self) -> float | None:
        if self.shape is None or self.shape.price_per_hour is None:
            return None
        return round(self.shape.price_per_hour * self.charge.share * self.instances, 6)


def _misfit(shape: NodeShape, pod: PodRequest) -> str:
    if shape.gpus < pod.gpus:
        return f"{shape.name}: {shape.gpus} GPUs < {pod.gpus} the pod needs"
    if shape.allocatable_memory_gib < pod.memory_gib:
        return (
            f"{shape.name}: {shape.memory_gib:g} GiB host memory ({shape.allocatable_memory_gib:.1f} "
            f"allocatable) < {pod.memory_gib} GiB the pod needs"
        )
    if shape.allocatable_cpu < pod.cpu:
        return (
            f"{shape.name}: {shape.vcpus:g} vCPU ({shape.allocatable_cpu:.2f} allocatable) < "
            f"{pod.cpu} CPU the pod requests"
        )
    return ""


def _problem(shape: NodeShape, pod: PodRequest, nodes: int) -> str:
    """Why ``shape`` does not take the pod (of a replica of ``nodes`` pods)."""
    problem = _misfit(shape, pod)
    if not problem and nodes > 1 and not shape.fabric:
        problem = f"{shape.name}: no RDMA fabric between instances (rdma: {shape.rdma})"
    return problem


def verified_prices_first(providers: Sequence[str] = (), cluster: ClusterShapes | None = None) -> bool:
    """Whether verified prices are compared before unverified ones: when the plan compares every
    provider's catalog shapes (no ``providers`` named, no ``cluster`` known, as ``loadline plan``
    without ``--provider``), an unverified figure would otherwise decide which provider the plan
    assumes. A named provider or the cluster's own shapes already decide that, so there the cheapest
    fitting shape wins whatever its price's source."""
    return not providers and cluster is None


def choose_shape(
    gpu: GPUType,
    pod: PodRequest,
    tensor_parallel_size: int,
    nodes: int,
    providers: Sequence[str] = (),
    cluster: ClusterShapes | None = None,
    dedicated: bool = False,
) -> ShapeChoice:
    """The shape of ``gpu`` (within ``providers``; empty: all) that takes the pod and charges it least
    (:func:`node_charge`; ``dedicated``: whole instances), NVLink first when tensor parallelism exceeds
    2; with ``nodes`` > 1, one instance per pod and an RDMA fabric between them. Equal charges go to the
    cheaper instance. When every provider is compared (:func:`verified_prices_first`), fitting shapes
    with a verified price come before those with an unverified one: an unverified figure is used only
    when no verified one fits, and the note says so either way."""
    allowed = allowed_shapes(gpu, providers, cluster)
    if not allowed:
        where = ", ".join(providers or (cluster.providers if cluster is not None else ())) or "any provider"
        return ShapeChoice(None, 0, "", f"no {gpu.name} node shape from {where} in the catalog")
    want_nvlink = tensor_parallel_size > NVLINK_PREFERRED_ABOVE_TP
    # The shapes that do not take the pod; why (_problem) is written only where a note or the refusal
    # says it: the planner asks this for thousands of pods, and most shapes are too small for most.
    misfits: list[tuple[int, NodeShape]] = []
    fits: list[tuple[int, NodeShape]] = []
    for order, shape in enumerate(allowed):
        if (
            shape.gpus < pod.gpus
            or shape.allocatable_memory_gib < pod.memory_gib
            or shape.allocatable_cpu < pod.cpu
            or (nodes > 1 and not shape.fabric)
        ):
            misfits.append((order, shape))
        else:
            fits.append((order, shape))
    if not fits:
        return ShapeChoice(
            None,
            0,
            "",
            "no node shape takes the pod: " + "; ".join(_problem(s, pod, nodes) for _, s in misfits),
        )
    # Lowest charge first (unpriced last); ``allowed`` is cheapest instance first, and the sort is stable.
    charges = {id(s): node_charge(s, pod, dedicated) for _, s in fits}

    def charged(shape: NodeShape) -> float:
        return (shape.price_per_hour or 0.0) * charges[id(shape)].share

    fits.sort(key=lambda fit: (fit[1].price_per_hour is None, charged(fit[1])))
    pool = fits
    notes = []
    if want_nvlink:
        linked = [(o, s) for o, s in fits if s.nvlink]
        if linked:
            pool = linked
            notes.append(f"TP {tensor_parallel_size} > {NVLINK_PREFERRED_ABOVE_TP}: NVLink shape preferred")
        else:
            notes.append(
                f"TP {tensor_parallel_size} over PCIe: no {gpu.name} shape with NVLink takes the pod "
                "(all-reduce crosses PCIe; decode is slower than on NVLink)"
            )
    rank, best = 0, pool[0][1]
    verified_first = verified_prices_first(providers, cluster)
    if verified_first:
        rank = next((i for i, (_, s) in enumerate(pool) if s.price_verified), 0)
        best = pool[rank][1]
    charge = charges[id(best)]
    price = charged(best) if best.price_per_hour is not None else math.inf
    misfit_shapes = [s for _, s in misfits]
    notes += _choice_notes(gpu, pod, nodes, best, charge, price, misfit_shapes, pool[:rank], verified_first)
    return ShapeChoice(best, nodes, "; ".join(notes), "", charge)


def _choice_notes(
    gpu: GPUType,
    pod: PodRequest,
    nodes: int,
    best: NodeShape,
    charge: NodeCharge,
    price: float,
    misfits: Sequence[NodeShape],
    passed_over: Sequence[tuple[int, NodeShape]],
    verified_first: bool,
) -> list[str]:
    """What a plan says about the shape chosen: its GPUs left idle or to other pods, the cheaper
    shapes that do not take the pod and why, those with unverified prices passed over, and where its
    own price comes from."""
    notes = []
    left = best.gpus - pod.gpus
    if left and charge.whole:
        notes.append(f"{left} of {best.gpus} GPUs per instance stay idle ({charge.why})")
    elif left:
        notes.append(f"{left} of {best.gpus} GPUs per instance left to other pods")
    # Shapes with too few GPUs are not alternatives worth naming; those whose host was too small and
    # whose whole instance costs less than the charge (so any share of it would) are.
    cheaper = [
        _problem(s, pod, nodes)
        for s in misfits
        if s.price_per_hour is not None and s.price_per_hour < price and s.gpus >= pod.gpus
    ]
    if cheaper:
        notes.append("cheaper shapes rejected: " + "; ".join(cheaper))
    passed = [s for _, s in passed_over if s.unverified_price]
    if passed:
        notes.append(
            "cheaper shapes with unverified prices passed over (verified prices are compared first): "
            + "; ".join(f"{s.name} ({s.price_text()})" for s in passed)
        )
    if best.unverified_price:
        notes.append(f"priced from an unverified figure ({best.price_text()}): {best.price_source}")
        if verified_first:
            notes.append(f"no {gpu.name} shape with a verified price takes the pod")
    elif best.price_per_hour is None:
        notes.append(f"no price ({best.price_source or 'none in the catalog'}); ranked after priced shapes")
    return notes
