"""Pick the cheapest GPU type × count × node shape that serves a spec, and say why every other lost.

Candidates, per allowed GPU type, are GPU counts 1, 2, 4, 8 and whole multiples of the largest node
shape (multi-node, pipeline parallel across nodes). Tensor parallelism stays inside a node and must
divide the attention heads; what a node cannot hold goes to pipeline stages. A candidate is feasible
when the engine starts (see :mod:`loadline.sizing._budget`), its KV cache holds ``concurrency``
sequences of ``maxModelLen`` with settings tuned for it before more GPUs are tried
(:mod:`loadline.sizing._tune`), and a node shape takes its pod's host memory and CPU
(:mod:`loadline.sizing._shapes`). The cheapest feasible candidate per replica-hour (whole instances)
wins (comparing every provider, verified prices first); ties go to fewer GPUs, then fewer nodes.
When nothing is feasible, the error carries fixes that were re-planned and work (:func:`refusal_fixes`).

The planner decides on figures (:func:`_verdicts`: the budget terms of :mod:`loadline.sizing._budget`,
memoised per model, GPU size and layout) and builds the chosen candidate; the others, with their
settings, budgets and why each lost, are built when ``Plan.candidates`` is first read. Both go through
the same functions, and the saved plans of ``tests/golden/plans/fleet.json`` hold them to it.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Generic, NamedTuple, TypeVar, overload

from loadline.api import InferenceModelSpec
from loadline.errors import NoCapacityError, NoFeasiblePlanError
from loadline.sizing._budget import GIB, EngineSettings, FixedTerms, MemoryBudget, ModelTerms
from loadline.sizing._data import (
    GPU_CATALOG_ENV,
    GPUType,
    find_gpu,
    fp8_kv_min_compute_capability,
    gpu_catalog,
    quantization_methods,
)
from loadline.sizing._download import CheckpointDownload, checkpoint_download
from loadline.sizing._memo import GuardedMemo
from loadline.sizing._resolve import ResolvedModel, SpecInputs, resolve_inputs, resolve_model
from loadline.sizing._shapes import (
    ClusterShapes,
    NodeShape,
    PodRequest,
    ShapeChoice,
    allowed_shapes,
    choose_shape,
    pod_request,
    verified_prices_first,
)
from loadline.sizing._tune import (
    MAX_UTILIZATION,
    ladder_serves,
    serves_concurrencies,
    serves_lengths,
    terms_for,
    tuned,
    version_defaults,
)

_TP_SIZES = (1, 2, 4, 8)
_MAX_NODES = 8


@dataclass(frozen=True)
class Candidate:
    """One GPU layout for one replica, evaluated."""

    gpu: GPUType
    tensor_parallel_size: int
    pipeline_parallel_size: int
    nodes: int
    settings: EngineSettings | None
    budget: MemoryBudget | None
    rejection: str = ""
    shape: NodeShape | None = None  # the node shape assumed (set once the engine fits)
    instances: int = 0  # instances of ``shape`` one replica occupies
    shape_note: str = ""  # why that shape: NVLink preference, idle GPUs, cheaper shapes that did not fit
    pod: PodRequest | None = None  # what each pod asks of its node besides GPUs
    tuning: tuple[str, ...] = ()  # the engine settings chosen for this layout, and why

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def priced(self) -> bool:
        return _priced(self.shape)

    @property
    def unverified_price(self) -> bool:
        """Its node shape is priced from a figure no dated source states."""
        return self.shape is not None and self.shape.unverified_price

    @property
    def price_per_hour(self) -> float:
        """Per replica: the whole instances of its shape (0 when the shape has no price, e.g. on-prem).

        A candidate rejected before a shape was chosen keeps the catalog's per-GPU price, which only
        orders the rejections."""
        return _price(self.gpu, self.gpus, self.shape, self.instances)

    @property
    def label(self) -> str:
        layout = f"TP{self.tensor_parallel_size}"
        if self.pipeline_parallel_size > 1:
            layout += f"×PP{self.pipeline_parallel_size}"
        nodes = f", {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{self.gpu.name}x{self.gpus} ({layout}{nodes})"

    def with_rejection(self, reason: str) -> Candidate:
        # dataclasses.replace, spelled out: it costs as much as the rest of a plan's bookkeeping.
        return Candidate(
            self.gpu,
            self.tensor_parallel_size,
            self.pipeline_parallel_size,
            self.nodes,
            self.settings,
            self.budget,
            reason,
            self.shape,
            self.instances,
            self.shape_note,
            self.pod,
            self.tuning,
        )

    @property
    def feasible(self) -> bool:
        return not self.rejection


def _priced(shape: NodeShape | None) -> bool:
    return shape is None or shape.price_per_hour is not None


def _price(gpu: GPUType, gpus: int, shape: NodeShape | None, instances: int) -> float:
    if shape is not None:
        return round((shape.price_per_hour or 0.0) * instances, 6)
    return round(gpu.price_per_gpu_hour * gpus, 4)


T = TypeVar("T")


class Later(Generic[T]):
    """A value to compute when it is first read (see :class:`Deferred`)."""

    __slots__ = ("compute",)

    def __init__(self, compute: Callable[[], T]) -> None:
        self.compute = compute


class Deferred(Generic[T]):
    """A dataclass field that may be given as :class:`Later`: computed the first time it is read, then
    kept. To everything that reads it (equality, ``repr``, :func:`dataclasses.replace`, pickling once
    read) it is an ordinary field; it has no default."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Deferred[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            raise AttributeError(self.name)  # a dataclass field without a default
        value = obj.__dict__[self.name]
        if isinstance(value, Later):
            value = obj.__dict__[self.name] = value.compute()
        return value

    def __set__(self, obj: object, value: T | Later[T]) -> None:
        obj.__dict__[self.name] = value


@dataclass(frozen=True)
class Plan:
    """The chosen layout and everything that was considered.

    The planner decides on figures alone; ``candidates`` (every layout considered, with its settings,
    budget and why it lost) is built when first read. The operator keeps only the chosen plan
    (``status.plan``); ``loadline plan`` lists the others, and gets the same candidates either way."""

    model: ResolvedModel
    inputs: SpecInputs
    chosen: Candidate
    replicas: int
    candidates: Deferred[tuple[Candidate, ...]] = Deferred()
    fallback_from: str = ""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["candidates"] = self.candidates  # a Later holds a closure, which does not pickle
        return state

    @property
    def rejected(self) -> list[Candidate]:
        return [c for c in self.candidates if c is not self.chosen and c.rejection]

    @property
    def settings(self) -> EngineSettings:
        assert self.chosen.settings is not None
        return self.chosen.settings

    @property
    def budget(self) -> MemoryBudget:
        assert self.chosen.budget is not None
        return self.chosen.budget

    @property
    def download(self) -> CheckpointDownload:
        """What each pod downloads (the checkpoint's files, whatever vLLM quantizes them to)."""
        return checkpoint_download(self.model.architecture, self.model.exact_parameters)

    def summary(self) -> dict[str, Any]:
        """The plan as ``status.plan`` (camelCase, matching :class:`loadline.api.PlanSummary`)."""
        c, s, b = self.chosen, self.settings, self.budget
        return {
            "gpu": f"{c.gpu.name}x{c.gpus}",
            "gpuType": c.gpu.name,
            "gpuProduct": c.gpu.product,
            "gpusPerReplica": c.gpus,
            "tensorParallelSize": c.tensor_parallel_size,
            "pipelineParallelSize": c.pipeline_parallel_size,
            "nodesPerReplica": c.nodes,
            "maxModelLen": s.max_model_len,
            "maxNumSeqs": s.max_num_seqs,
            "maxNumBatchedTokens": s.max_num_batched_tokens,
            "gpuMemoryUtilization": s.gpu_memory_utilization,
            "kvCacheTokens": b.kv_cache_tokens,
            "maxConcurrency": round(b.max_concurrency, 2),
            "memory": {
                "totalGiB": round(b.total_gib, 2),
                "weightsGiB": round(b.weights_gib, 2),
                "activationGiB": round(b.activation_gib, 2),
                "nonTorchGiB": round(b.non_torch_gib, 2),
                "cudaGraphGiB": round(b.cuda_graph_gib, 2),
                "kvCacheGiB": round(b.kv_cache_gib, 2),
            },
            "downloadGiB": round(self.download.gib, 2),
            "pricePerHour": round(c.price_per_hour * self.replicas, 2),
            "fallbackFrom": self.fallback_from,
            "engineVersion": self.inputs.version,
            "enforceEager": s.enforce_eager,
            "tuning": list(c.tuning),
            "nodeShape": self._shape_summary(),
        }

    def _shape_summary(self) -> dict[str, Any] | None:
        c = self.chosen
        if c.shape is None or c.pod is None:
            return None
        shape = c.shape
        finite = shape.memory_gib != float("inf")
        return {
            "name": shape.name,
            "provider": shape.provider,
            "gpusPerNode": shape.gpus,
            "interconnect": shape.interconnect,
            "rdma": shape.rdma,
            "hostMemoryGiB": round(shape.memory_gib, 2) if finite else None,
            "allocatableMemoryGiB": round(shape.allocatable_memory_gib, 2) if finite else None,
            "vcpus": shape.vcpus if finite else None,
            "allocatableCPU": round(shape.allocatable_cpu, 2) if finite else None,
            "pricePerHour": shape.price_per_hour,
            "priceVerified": shape.price_verified,
            "priceSource": shape.price_source,
            "priceAsOf": shape.price_as_of,
            "instancesPerReplica": c.instances,
            "podMemoryGiB": c.pod.memory_gib,
            "podCPU": c.pod.cpu,
            "why": c.shape_note,
            "source": shape.source,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.model_id,
            "modelSource": self.model.source,
            "replicas": self.replicas,
            "plan": self.summary(),
            "settings": {
                "dtype": self.settings.dtype,
                "quantization": self.settings.quantization,
                "kvCacheDtype": self.settings.kv_cache_dtype,
                "enforceEager": self.settings.enforce_eager,
            },
            "rejected": [{"candidate": c.label, "reason": c.rejection} for c in self.rejected],
        }


def _tp_options(arch_heads: int, kv_heads: int, node_gpus: int) -> list[int]:
    options = []
    for tp in _TP_SIZES:
        if tp > node_gpus or arch_heads % tp:
            continue
        if kv_heads % tp and tp % kv_heads:
            continue
        options.append(tp)
    return options


def _node_gpus(gpu: GPUType, inputs: SpecInputs, catalog_file: str) -> tuple[int, bool]:
    """GPUs of the largest allowed shape of ``gpu``, and whether any allowed shape has an RDMA fabric
    (memoised as :func:`allowed_shapes` is; ``catalog_file``: the user catalog's path)."""
    key = (gpu.name, inputs.providers, inputs.cluster, catalog_file)
    return _NODE_GPUS.get(key, gpu, lambda: _largest_node(gpu, inputs))


def _largest_node(gpu: GPUType, inputs: SpecInputs) -> tuple[int, bool]:
    allowed = allowed_shapes(gpu, inputs.providers, inputs.cluster)
    if not allowed:
        return gpu.max_gpus_per_node, gpu.multi_node
    return max(s.gpus for s in allowed), any(s.fabric for s in allowed)


_NODE_GPUS: GuardedMemo[tuple[str, tuple[str, ...], ClusterShapes | None, str], tuple[int, bool]] = (
    GuardedMemo(4096)
)


@cache
def _layouts_for(
    node: int, heads: int, kv_heads: int, layers: int, max_gpus: int, multi_node: bool
) -> tuple[tuple[int, int, int], ...]:
    """(tp, pp, nodes) layouts in increasing GPU count, the best layout for each count, for a node size:
    a pure function of a few integers, asked once per plan and GPU type, so memoised."""
    tps = _tp_options(heads, kv_heads, node)
    counts = [n for n in (1, 2, 4, 8) if n <= node]
    if multi_node:
        counts += [node * k for k in range(2, _MAX_NODES + 1)]
    layouts = []
    for count in counts:
        if count > max_gpus:
            break
        # Prefer the widest tensor parallelism that divides the count and fits one node.
        fitting = [tp for tp in tps if count % tp == 0]
        if not fitting:
            continue
        tp = max(fitting)
        pp = count // tp
        if pp > layers:
            continue
        nodes = -(-count // node)
        if nodes > 1 and tp * pp != nodes * node:
            continue
        layouts.append((tp, pp, nodes))
    return tuple(layouts)


def _support_problem(gpu: GPUType, inputs: SpecInputs) -> str:
    """Why ``gpu`` cannot run the spec's dtype, quantization or KV-cache dtype at all (memoised per
    GPU type and those three; the quantization table is held by identity)."""
    methods = quantization_methods()
    key = (gpu.name, inputs.dtype, inputs.quantization, inputs.kv_cache_dtype, id(methods))
    found = _SUPPORT.get(key, gpu, lambda: (methods, _unsupported(gpu, inputs)))
    return found[1]


_SUPPORT: GuardedMemo[tuple[object, ...], tuple[object, str]] = GuardedMemo(4096)


def _unsupported(gpu: GPUType, inputs: SpecInputs) -> str:
    if inputs.dtype == "bfloat16" and not gpu.bf16:
        return (
            f"{gpu.name} (compute capability {gpu.compute_capability}) has no bfloat16; "
            "set dtype: float16 to use it"
        )
    method = quantization_methods()[inputs.quantization]
    if gpu.compute_capability < method.min_compute_capability:
        return (
            f"{inputs.quantization} kernels need compute capability {method.min_compute_capability}, "
            f"{gpu.name} has {gpu.compute_capability}"
        )
    if inputs.kv_cache_dtype.startswith("fp8") and gpu.compute_capability < fp8_kv_min_compute_capability():
        return f"fp8 KV cache needs compute capability {fp8_kv_min_compute_capability()}"
    return ""


#: The layouts evaluated for one spec: (GPU type name, tp, pp, nodes) → (GPU type, candidate).
Evaluated = dict[tuple[str, int, int, int], tuple[GPUType, Candidate]]
#: Cheapest first (whole instances per replica; unpriced shapes last; comparing every provider,
#: unverified prices after verified ones: :func:`verified_prices_first`), then fewer GPUs, fewer nodes.
SortKey = tuple[bool, bool, float, int, int]
Placement = tuple[PodRequest, ShapeChoice]


def _evaluate(
    inputs: SpecInputs,
    gpu: GPUType,
    tp: int,
    pp: int,
    nodes: int,
    catalog_file: str,
    evaluated: Evaluated | None = None,
    terms: ModelTerms | None = None,
    placement: Placement | None = None,
) -> Candidate:
    """:func:`_evaluate_layout`, remembered in ``evaluated`` (one plan's: its chosen candidate is then
    the very object its deferred list holds). GPUType holds a dict, so the key has its name and the
    entry keeps the object (compared by identity: a reloaded catalog evaluates again)."""
    if evaluated is None:
        evaluated = {}
    key = (gpu.name, tp, pp, nodes)
    found = evaluated.get(key)
    if found is not None and found[0] is gpu:
        return found[1]
    terms = terms or terms_for(inputs)
    candidate = _evaluate_layout(inputs, gpu, tp, pp, nodes, terms, catalog_file, placement)
    evaluated[key] = (gpu, candidate)
    return candidate


def _evaluate_layout(
    inputs: SpecInputs,
    gpu: GPUType,
    tp: int,
    pp: int,
    nodes: int,
    terms: ModelTerms,
    catalog_file: str,
    placement: Placement | None = None,
) -> Candidate:
    """Tune the engine for this layout, then find the node shape its pods fit (``placement``: that
    shape, when the caller found it already)."""
    settings, budget, notes, rejection = tuned(inputs, gpu, tp, pp, terms)
    if rejection:
        return Candidate(gpu, tp, pp, nodes, settings, budget, rejection)
    if placement is None:
        placement = _placement(inputs, gpu, tp, pp, nodes, budget.weights_gib, catalog_file)
    pod, choice = placement
    return Candidate(
        gpu,
        tp,
        pp,
        nodes,
        settings,
        budget,
        choice.rejection,
        choice.shape,
        choice.instances,
        choice.note,
        pod,
        notes,
    )


def _placement(
    inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, nodes: int, weights_gib: float, catalog_file: str
) -> tuple[PodRequest, ShapeChoice]:
    """The pod of a layout whose engine fits, and the node shape it takes (memoised: see
    :func:`_placements`)."""
    placements = _placements(inputs, catalog_file)
    return _placed(placements, inputs, gpu, tp, pp, nodes, weights_gib, catalog_file)[0]


#: Per (GPU type name, tp, pp, nodes, weights per GPU): (GPU type, (placement, whether the pod takes a
#: shape, the candidate's sort key)).
Placements = dict[tuple[str, int, int, int, float], tuple[GPUType, tuple[Placement, bool, SortKey]]]


def _placements(inputs: SpecInputs, catalog_file: str) -> Placements:
    """The placements of the pods of specs with these host-side inputs (KV offload, memory and CPU
    overrides, providers, the cluster's shapes, the user catalog): fleets of models share them, since a
    pod's request is whole GiB and CPUs. Two levels, so that a plan hashes these inputs once."""
    key = (
        inputs.kv_offload_gib,
        inputs.memory_gib_override,
        inputs.cpu_override,
        inputs.providers,
        inputs.cluster,
        catalog_file,
    )
    found = _PLACEMENTS.peek(key, None)
    return _PLACEMENTS.get(key, None, dict) if found is None else found


def _placed(
    placements: Placements,
    inputs: SpecInputs,
    gpu: GPUType,
    tp: int,
    pp: int,
    nodes: int,
    weights_gib: float,
    catalog_file: str,
) -> tuple[Placement, bool, SortKey]:
    key = (gpu.name, tp, pp, nodes, weights_gib)
    found = placements.get(key)
    if found is not None and found[0] is gpu:
        return found[1]
    placed = _place(inputs, gpu, tp, pp, nodes, weights_gib, catalog_file)
    global _PLACED
    _PLACED += 1
    if _PLACED > _MAX_PLACED:  # bounded over all host-side inputs together
        _PLACEMENTS.clear()
        _PLACED = 0
        placements.clear()
    placements[key] = (gpu, placed)
    return placed


def _place(
    inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, nodes: int, weights_gib: float, catalog_file: str
) -> tuple[Placement, bool, SortKey]:
    """The placement, whether the pod takes a shape, and the sort key of the candidate it makes."""
    pod = pod_request(
        weights_gib_per_gpu=weights_gib,
        gpus_per_pod=(tp * pp) // max(nodes, 1),
        nodes=nodes,
        kv_offload_gib=inputs.kv_offload_gib,
        memory_override_gib=inputs.memory_gib_override,
        cpu_override=inputs.cpu_override,
    )
    # The shape depends on the pod's request (whole GiB and CPUs), not on the weights behind it: many
    # models' pods ask the same, so the choice is memoised per request.
    request = (
        gpu.name,
        pod,
        tp,
        nodes,
        inputs.providers,
        inputs.cluster,
        catalog_file,
    )
    choice = _SHAPES.get(
        request, gpu, lambda: choose_shape(gpu, pod, tp, nodes, inputs.providers, inputs.cluster)
    )
    shape, gpus = choice.shape, tp * pp
    # The placements are memoised per providers and cluster, on which verified_prices_first depends.
    unverified = (
        shape is not None
        and shape.unverified_price
        and verified_prices_first(inputs.providers, inputs.cluster)
    )
    key = (not _priced(shape), unverified, _price(gpu, gpus, shape, choice.instances), gpus, nodes)
    return (pod, choice), not choice.rejection, key


_PLACEMENTS: GuardedMemo[tuple[object, ...], Placements] = GuardedMemo(1024)
_MAX_PLACED = 32768
_PLACED = 0  # placements held by the dicts of _PLACEMENTS
_SHAPES: GuardedMemo[tuple[object, ...], ShapeChoice] = GuardedMemo(8192)


#: A layout of a GPU type: tp, pp, nodes, GPUs, and its sort key when rejected before a node shape.
LayoutRow = tuple[int, int, int, int, SortKey]


class _TypePlan(NamedTuple):
    """How a plan treats one allowed GPU type: why it cannot be used, or its layouts to try in order."""

    gpu: GPUType
    problem: str
    node: int  # GPUs of its largest allowed node shape
    spans_nodes: bool
    layouts: tuple[tuple[int, int, int], ...]
    rows: tuple[LayoutRow, ...] = ()


def _type_plans(
    inputs: SpecInputs,
    gpu_names: Sequence[str],
    max_gpus: int,
    multi_node: bool,
    min_gpu_memory_gib: float,
    catalog_file: str,
) -> tuple[_TypePlan, ...]:
    """Per GPU name: the type, its support problem (or the remediation floor's, or no layout), and its
    layouts. A pure function of the key's parts and the catalogs (the GPU catalog is the guard; the
    quantization table is held by identity and kept in the entry), the same for every spec of a fleet
    that allows the same GPUs, so memoised."""
    arch = inputs.model.architecture
    methods = quantization_methods()
    key = (
        tuple(gpu_names),
        max_gpus,
        multi_node,
        min_gpu_memory_gib,
        inputs.dtype,
        inputs.quantization,
        inputs.kv_cache_dtype,
        arch.num_attention_heads,
        arch.num_kv_heads,
        arch.num_layers,
        inputs.providers,
        inputs.cluster,
        catalog_file,
        id(methods),
    )
    catalog = gpu_catalog()
    found = _TYPE_PLANS.peek(key, catalog) or _TYPE_PLANS.get(
        key,
        catalog,
        lambda: (
            methods,
            _plan_types(inputs, gpu_names, max_gpus, multi_node, min_gpu_memory_gib, catalog_file),
        ),
    )
    return found[1]


def _plan_types(
    inputs: SpecInputs,
    gpu_names: Sequence[str],
    max_gpus: int,
    multi_node: bool,
    min_gpu_memory_gib: float,
    catalog_file: str,
) -> tuple[_TypePlan, ...]:
    arch = inputs.model.architecture
    plans = []
    for name in gpu_names:
        gpu = find_gpu(name, "spec.gpu.types")
        problem = _support_problem(gpu, inputs)
        if not problem and gpu.memory_gib < min_gpu_memory_gib:
            problem = (
                f"{gpu.name} has {gpu.memory_gib:.2f} GiB; out-of-memory remediation asks for at least "
                f"{min_gpu_memory_gib:.2f} GiB per GPU"
            )
        if problem:
            plans.append(_TypePlan(gpu, problem, 0, False, ()))
            continue
        node, fabric = _node_gpus(gpu, inputs, catalog_file)
        spans_nodes = multi_node and gpu.multi_node and fabric
        layouts = _layouts_for(
            node or gpu.max_gpus_per_node,
            arch.num_attention_heads,
            arch.num_kv_heads,
            arch.num_layers,
            max_gpus,
            spans_nodes,
        )
        if not layouts:
            problem = f"no layout within {max_gpus} GPUs divides the attention heads"
        plans.append(_TypePlan(gpu, problem, node, spans_nodes, layouts, _rows(gpu, layouts)))
    return tuple(plans)


def _rows(gpu: GPUType, layouts: tuple[tuple[int, int, int], ...]) -> tuple[LayoutRow, ...]:
    return _ROWS.get(
        (gpu.name, layouts),
        gpu,
        lambda: tuple(
            (tp, pp, nodes, tp * pp, (False, False, _price(gpu, tp * pp, None, 0), tp * pp, nodes))
            for tp, pp, nodes in layouts
        ),
    )


_ROWS: GuardedMemo[tuple[str, tuple[tuple[int, int, int], ...]], tuple[LayoutRow, ...]] = GuardedMemo(4096)
_TYPE_PLANS: GuardedMemo[tuple[object, ...], tuple[object, tuple[_TypePlan, ...]]] = GuardedMemo(4096)


def _placeable(candidate: Candidate, replicas: int, free: Mapping[str, Sequence[int]] | None) -> bool:
    """Whether ``replicas`` copies of the candidate fit the free GPUs per node of its type."""
    if free is None:
        return True
    nodes = sorted(free.get(candidate.gpu.name, ()), reverse=True)
    if candidate.nodes == 1:
        return sum(n // candidate.gpus for n in nodes) >= max(replicas, 1)
    per_node = candidate.gpus // candidate.nodes
    return sum(1 for n in nodes if n >= per_node) >= candidate.nodes * max(replicas, 1)


#: One layout judged on figures (:func:`_verdicts`): GPU type, tp, pp, nodes, whether it is feasible,
#: its sort key, its node shape when the engine fits, the problem that ruled the GPU type out (then tp
#: = pp = nodes = 1), and notes appended to its rejection.
Verdict = tuple[GPUType, int, int, int, bool, SortKey, Placement | None, str, tuple[str, ...]]


def _verdicts(
    inputs: SpecInputs,
    gpu_names: Sequence[str],
    max_gpus: int,
    multi_node: bool,
    min_gpus: int,
    min_gpu_memory_gib: float,
    catalog_file: str,
    terms: ModelTerms,
) -> list[Verdict]:
    """:func:`plan_candidates` on figures alone: per layout whether it is feasible and its sort key,
    cheapest first. The same layouts in the same order, with the same verdicts: feasibility is the
    tuning ladder's (:func:`layout_serves`) and the node shape's, and the key is computed as
    the candidate :func:`_materialize` builds would compute it: ``(not c.priced, unverified_last and
    c.unverified_price, c.price_per_hour, c.gpus, c.nodes)``, ``unverified_last`` being
    :func:`verified_prices_first` of the spec's providers and cluster."""
    plans = _type_plans(inputs, gpu_names, max_gpus, multi_node, min_gpu_memory_gib, catalog_file)
    length, concurrency = inputs.max_model_len, inputs.concurrency
    pinned_seqs, pinned_tokens = inputs.max_num_seqs, inputs.max_num_batched_tokens
    pinned_util, eager = inputs.gpu_memory_utilization, inputs.enforce_eager
    placements = _placements(inputs, catalog_file)
    full_length: dict[int, int] = {}  # math.ceil(length / block size): FixedTerms._blocks_per_seq's
    out: list[Verdict] = []
    append = out.append
    version = inputs.version
    for gpu, problem, node, spans_nodes, _, rows in plans:
        if problem:
            append((gpu, 1, 1, 1, False, (False, False, _price(gpu, 1, None, 0), 1, 1), None, problem, ()))
            continue
        # defaults(inputs, gpu)
        memory = gpu.memory_gib
        tier = version_defaults(version, gpu.name, memory)
        seqs = pinned_seqs or (tier[0] if tier[0] >= concurrency else concurrency)
        tokens = pinned_tokens or (tier[1] if tier[1] >= seqs else seqs)
        base = (seqs, tokens, pinned_util or tier[2], eager)
        # hopeless(): the most any tuning could give (gpu-memory-utilization 0.95, or the spec's).
        room = memory * (MAX_UTILIZATION if pinned_util is None else base[2])
        statics, weights, terms_of = _cells(terms, gpu, rows)
        for index, (tp, pp, nodes, gpus, rejected_key) in enumerate(rows):
            if gpus < min_gpus:
                continue
            # layout_serves(), vLLM's defaults first. When the weights and non-torch memory alone
            # exceed the room, neither the defaults (which use less of the GPU, and activations
            # besides) nor any rung serves: most layouts of a large model on a small GPU end there,
            # before their budget terms are computed.
            serves = False
            if statics[index] < room:
                fixed = terms_of[index]
                if fixed is None:
                    fixed = terms_of[index] = terms.layout(memory, tp, pp)
                blocks, tokens, starts = fixed.pools.get(base) or fixed.cached_pool(base)
                if starts:  # fixed.serves(pool, length, concurrency), inlined
                    if fixed.sliding_groups:
                        blocks_per_seq = fixed._blocks_per_seq(length, tokens)
                    else:
                        bs = fixed.block_size
                        per_block = full_length.get(bs)
                        if per_block is None:
                            per_block = full_length[bs] = math.ceil(length / bs)
                        blocks_per_seq = fixed.full_groups * per_block
                    held = blocks / blocks_per_seq if blocks_per_seq else 0.0
                    serves = not held < 1.0 and held >= concurrency
                if not serves:
                    serves = ladder_serves(fixed, inputs, base, length, concurrency)
            if not serves:
                append((gpu, tp, pp, nodes, False, rejected_key, None, "", ()))
                continue
            weights_gib = weights[index]
            found = placements.get((gpu.name, tp, pp, nodes, weights_gib))
            if found is not None and found[0] is gpu:
                placement, feasible, key = found[1]
            else:
                placement, feasible, key = _placed(
                    placements, inputs, gpu, tp, pp, nodes, weights_gib, catalog_file
                )
            append((gpu, tp, pp, nodes, feasible, key, placement, "", ()))
            if feasible:
                break
        else:
            if multi_node and not spans_nodes and out and out[-1][1] * out[-1][2] == node:
                # The last candidate considered (its sort key does not change).
                g, t, p, n, _, k, where, why, notes = out[-1]
                note = f"{gpu.name} nodes have no RDMA fabric, so loadline does not span them across nodes"
                out[-1] = (g, t, p, n, False, k, where, why, (*notes, note))
    return sorted(out, key=_BY_KEY)  # stable, as plan_candidates's sort


_BY_KEY = operator.itemgetter(5)


Cells = tuple[tuple[float, ...], tuple[float, ...], list[FixedTerms | None]]


def _cells(terms: ModelTerms, gpu: GPUType, rows: tuple[LayoutRow, ...]) -> Cells:
    """Per layout of ``rows`` (a GPU type's, from :func:`_type_plans`): the weights and non-torch memory
    on the busiest GPU (GiB, what :func:`~loadline.sizing._tune.hopeless` compares), the weights alone
    (GiB, what the pod's request follows), and the layout's budget terms once a plan needs them. Keyed
    by identity (the entry keeps the terms, the type and the rows); flat, to keep few objects for the
    garbage collector to walk."""
    key = (id(terms), id(gpu), id(rows))
    found = _CELLS.peek(key, terms)
    if found is None:
        found = _CELLS.get(key, terms, lambda: (gpu, rows, _new_cells(terms, rows)))
    return found[2]


def _new_cells(terms: ModelTerms, rows: tuple[LayoutRow, ...]) -> Cells:
    layouts = [terms.static_terms(tp, pp) for tp, pp, *_ in rows]
    no_terms: list[FixedTerms | None] = [None] * len(rows)
    return tuple(s[2] for s in layouts), tuple(s[0] / GIB for s in layouts), no_terms


_CELLS: GuardedMemo[tuple[int, int, int], tuple[GPUType, object, Cells]] = GuardedMemo(16384)


def _materialize(
    verdict: Verdict, inputs: SpecInputs, catalog_file: str, evaluated: Evaluated, terms: ModelTerms
) -> Candidate:
    """The candidate a verdict stands for: :func:`_evaluate` (memoised) with the notes appended."""
    gpu, tp, pp, nodes, _, _, placement, problem, notes = verdict
    if problem:
        candidate = Candidate(gpu, 1, 1, 1, None, None, problem)
    else:
        candidate = _evaluate(inputs, gpu, tp, pp, nodes, catalog_file, evaluated, terms, placement)
    for note in notes:
        candidate = candidate.with_rejection(f"{candidate.rejection}; {note}")
    return candidate


def plan_candidates(
    inputs: SpecInputs,
    gpu_names: Sequence[str],
    max_gpus: int,
    multi_node: bool,
    *,
    min_gpus: int = 1,
    min_gpu_memory_gib: float = 0.0,
) -> list[Candidate]:
    """Every layout considered, cheapest first. Evaluation of a type stops at its first feasible count.

    ``min_gpus`` and ``min_gpu_memory_gib`` are floors that OOM remediation sets after a model did not
    fit where it was planned ("next feasible plan: more tensor parallelism or a bigger GPU").
    """
    catalog_file = os.environ.get(GPU_CATALOG_ENV, "")
    terms = terms_for(inputs)
    verdicts = _verdicts(
        inputs, gpu_names, max_gpus, multi_node, min_gpus, min_gpu_memory_gib, catalog_file, terms
    )
    evaluated: Evaluated = {}
    return [_materialize(v, inputs, catalog_file, evaluated, terms) for v in verdicts]


def plan_inference_model(
    spec: InferenceModelSpec,
    *,
    config_map_config: Mapping[str, Any] | None = None,
    hub_config: Mapping[str, Any] | None = None,
    free_gpus: Mapping[str, Sequence[int]] | None = None,
    min_gpus: int = 1,
    min_gpu_memory_gib: float = 0.0,
    cluster_shapes: ClusterShapes | None = None,
) -> Plan:
    """Plan one InferenceModel. ``free_gpus`` (GPU type → free GPUs per node) makes it capacity aware;
    ``cluster_shapes`` (the cluster's GPU nodes as shapes, :func:`loadline.sizing.cluster_shapes`)
    restricts the node shapes to those the cluster has (see :func:`allowed_shapes`).

    Raises :class:`NoFeasiblePlanError` with one line per rejected candidate when nothing fits.
    """
    model = resolve_model(spec, config_map_config, hub_config)
    inputs = resolve_inputs(spec, model)
    if cluster_shapes is not None:
        inputs = dataclasses.replace(inputs, cluster=cluster_shapes)
    names = list(spec.gpu.types) or list(gpu_catalog())
    max_gpus = spec.gpu.max_gpus_per_replica or _MAX_NODES * 8
    catalog_file = os.environ.get(GPU_CATALOG_ENV, "")
    terms = terms_for(inputs)
    verdicts = _verdicts(
        inputs,
        names,
        max_gpus,
        spec.gpu.allow_multi_node,
        min_gpus,
        min_gpu_memory_gib,
        catalog_file,
        terms,
    )
    evaluated: Evaluated = {}

    def materialize(verdict: Verdict) -> Candidate:
        return _materialize(verdict, inputs, catalog_file, evaluated, terms)

    feasible_verdicts = [v for v in verdicts if v[4]]
    if not feasible_verdicts:
        candidates = [materialize(v) for v in verdicts]
        fixes = refusal_fixes(spec, inputs, candidates)
        fix_text = "; or ".join(f["text"] for f in fixes) or (
            "none found by changing maxModelLen, concurrency or GPUs (up to 64 of any catalog type): "
            "quantize the weights (spec.quantization) or add a larger GPU type to the catalog"
        )
        raise NoFeasiblePlanError(
            f"spec: no GPU candidate can serve {model.model_id} at maxModelLen {inputs.max_model_len} × "
            f"concurrency {inputs.concurrency} (fix: {fix_text})",
            [f"{c.label}: {c.rejection}" for c in candidates],
            fixes=[f["spec"] for f in fixes],
        )
    chosen = best = materialize(feasible_verdicts[0])
    fallback_from = ""
    if free_gpus is not None:
        feasible = [best, *(materialize(v) for v in feasible_verdicts[1:])]
        placeable = [c for c in feasible if _placeable(c, spec.replicas, free_gpus)]
        if placeable and placeable[0] is not best:
            if not spec.gpu.allow_fallback:
                raise NoCapacityError(
                    f"spec.gpu.allowFallback: {best.label} is the cheapest plan but the cluster has no free "
                    f"{best.gpu.name} GPUs for it (fix: add capacity or set spec.gpu.allowFallback: true)"
                )
            chosen, fallback_from = placeable[0], best.gpu.name
        elif not placeable:
            raise NoCapacityError(
                f"spec: no free GPUs in the cluster for any feasible plan of {model.model_id} "
                f"(cheapest: {best.label}; fix: add GPU nodes or lower replicas)",
                [f"{c.label}: not enough free {c.gpu.name} GPUs" for c in feasible],
            )
    by_verification = chosen is best and verified_prices_first(inputs.providers, inputs.cluster)

    def considered() -> tuple[Candidate, ...]:
        # The chosen verdict materializes to ``chosen`` itself (memoised in ``evaluated``).
        candidates = (materialize(v) for v in verdicts)
        return tuple(
            c if c.rejection or c is chosen else _note_cost(c, chosen, by_verification) for c in candidates
        )

    return Plan(model, inputs, chosen, spec.replicas, Later(considered), fallback_from)


def _note_cost(candidate: Candidate, chosen: Candidate, by_verification: bool = False) -> Candidate:
    """Why a feasible candidate lost to ``chosen``; ``by_verification``: verified prices were compared
    first (every provider compared, no capacity fallback), so a cheaper unverified one lost for that."""
    if not candidate.priced:
        return candidate.with_rejection(
            f"fits, but its node shape has no price; {chosen.label} was preferred"
        )
    more = candidate.price_per_hour - chosen.price_per_hour
    reason = f"fits, but costs ${more:.2f}/h more per replica than {chosen.label}"
    if more <= 0 and by_verification and candidate.unverified_price and not chosen.unverified_price:
        reason = (
            f"fits at ${candidate.price_per_hour:.2f}/h per replica, but that price is unverified; "
            f"{chosen.label} has a verified one and was preferred"
        )
    elif more <= 0:
        reason = f"fits, but {chosen.label} was preferred (fewer GPUs or free capacity)"
    return candidate.with_rejection(reason)


_FIX_MAX_GPUS = 64


def _fits_node(inputs: SpecInputs, candidate: Candidate) -> bool:
    """Whether the candidate's pods take a node shape: the same at any max-model-len or concurrency
    (the pod's request follows the weights on its GPUs)."""
    c = candidate
    assert c.budget is not None
    placement = _placement(
        inputs,
        c.gpu,
        c.tensor_parallel_size,
        c.pipeline_parallel_size,
        c.nodes,
        c.budget.weights_gib,
        os.environ.get(GPU_CATALOG_ENV, ""),
    )
    return not placement[1].rejection


def _largest_int(low: int, high: int, works: Any) -> int | None:
    """The largest n in [low, high] with works(n), assuming works is monotone (true, then false)."""
    if high < low or not works(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if works(mid):
            low = mid
        else:
            high = mid - 1
    return low


def refusal_fixes(
    spec: InferenceModelSpec, inputs: SpecInputs, candidates: Sequence[Candidate]
) -> list[dict[str, Any]]:
    """Changes to the spec that make it plannable, each checked by planning the layout it names again.

    ``{"text": what to tell the user, "spec": {camelCase path: new value}}``, in this order: a shorter
    ``maxModelLen`` or a lower ``concurrency`` on the GPUs already allowed (the largest that still fits
    the closest layout per GPU type), then more or other GPUs (the cheapest feasible plan of any catalog
    type within 64 GPUs and the spec's providers)."""
    fixes: list[dict[str, Any]] = []
    tried = {}
    for c in candidates:
        if c.settings is not None and c.budget is not None and c.budget.weights_gib > 0:
            tried[c.gpu.name] = c  # candidates are cheapest first; keep the largest layout per type
    best_len, best_conc = 0, 0
    terms = terms_for(inputs)
    # Each probe is whether the layout would be feasible with one value changed: the tuning ladder's
    # verdict (serves_at: its first and last rung decide) and the node shape (the same for any value).
    for c in tried.values():
        gpu, tp, pp = c.gpu, c.tensor_parallel_size, c.pipeline_parallel_size
        if not _fits_node(inputs, c):
            continue  # no value of either serves: the pod takes no node shape
        if inputs.max_model_len > 1:
            length = _largest_int(1, inputs.max_model_len - 1, serves_lengths(inputs, gpu, tp, pp, terms))
            if length:
                rounded = length - length % 256 if length >= 512 else length
                best_len = max(best_len, rounded)
        if inputs.concurrency > 1:
            conc = _largest_int(
                1,
                inputs.concurrency - 1,
                serves_concurrencies(inputs, gpu, tp, pp, terms),
            )
            best_conc = max(best_conc, conc or 0)
    if best_len:
        fixes.append({"text": f"lower spec.maxModelLen to {best_len}", "spec": {"maxModelLen": best_len}})
    if best_conc:
        fixes.append({"text": f"lower spec.concurrency to {best_conc}", "spec": {"concurrency": best_conc}})
    best = _cheapest_feasible(inputs, list(gpu_catalog()), _FIX_MAX_GPUS)
    if best is not None:
        changes: dict[str, Any] = {}
        allowed = list(spec.gpu.types)
        if allowed and best.gpu.name not in allowed:
            changes["gpu.types"] = [*allowed, best.gpu.name]
        if spec.gpu.max_gpus_per_replica is not None and best.gpus > spec.gpu.max_gpus_per_replica:
            changes["gpu.maxGPUsPerReplica"] = best.gpus
        if best.nodes > 1 and not spec.gpu.allow_multi_node:
            changes["gpu.allowMultiNode"] = True
        if changes:
            what = ", ".join(f"spec.{k}: {v}" for k, v in changes.items())
            fixes.append(
                {"text": f"use ≥ {best.gpus}×{best.gpu.name} ({best.label}; set {what})", "spec": changes}
            )
    return fixes


def _cheapest_feasible(inputs: SpecInputs, gpu_names: Sequence[str], max_gpus: int) -> Candidate | None:
    """``[c for c in plan_candidates(inputs, gpu_names, max_gpus, True) if c.feasible][0]`` (or None),
    building only that candidate: the rejected layouts of that list are never shown."""
    catalog_file = os.environ.get(GPU_CATALOG_ENV, "")
    terms = terms_for(inputs)
    verdicts = _verdicts(inputs, gpu_names, max_gpus, True, 1, 0.0, catalog_file, terms)
    for verdict in verdicts:
        if verdict[4]:
            return _materialize(verdict, inputs, catalog_file, {}, terms)
    return None
