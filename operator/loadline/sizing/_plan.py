"""Pick the cheapest GPU type × count × node shape that serves a spec, and say why every other lost.

Candidates, per allowed GPU type, are GPU counts 1, 2, 4, 8 and whole multiples of the largest node
shape (multi-node, pipeline parallel across nodes). Tensor parallelism stays inside a node and must
divide the attention heads; what a node cannot hold goes to pipeline stages. A candidate is feasible
when the engine starts (see :mod:`loadline.sizing._budget`), its KV cache holds ``concurrency``
sequences of ``maxModelLen`` with settings tuned for it before more GPUs are tried
(:mod:`loadline.sizing._tune`), and a node shape takes its pod's host memory and CPU
(:mod:`loadline.sizing._shapes`). The cheapest feasible candidate per replica-hour (its pods' shares
of their nodes, or whole nodes: :func:`loadline.sizing._shapes.node_charge`) wins (comparing every
provider, verified prices first); ties go to fewer GPUs, then fewer nodes.
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
from typing import Any, Generic, NamedTuple, NoReturn, Protocol, TypeVar, overload

from loadline.api import InferenceModelSpec, MemoryBreakdown, NodeShapeSummary, PlanSummary
from loadline.errors import NoCapacityError, NoFeasiblePlanError
from loadline.sizing._align import tp_problem
from loadline.sizing._budget import EngineSettings, MemoryBudget, ModelTerms, blocks_within
from loadline.sizing._capacity import FreeGPUs
from loadline.sizing._compat import compat_table
from loadline.sizing._data import (
    GPU_CATALOG_ENV,
    GPUType,
    find_gpu,
    fp8_kv_min_compute_capability,
    gpu_catalog,
    parse_version,
    quantization_methods,
)
from loadline.sizing._download import CheckpointDownload, checkpoint_download
from loadline.sizing._memo import GuardedMemo
from loadline.sizing._records import quick_init
from loadline.sizing._resolve import ResolvedModel, SpecInputs, resolve_inputs, resolve_model
from loadline.sizing._shapes import (
    WHOLE_NODE,
    ClusterShapes,
    NodeCharge,
    NodeShape,
    PodRequest,
    ShapeChoice,
    allowed_shapes,
    charge_text,
    choose_shape,
    pod_request,
    verified_prices_first,
)
from loadline.sizing._tune import (
    MAX_UTILIZATION,
    Config,
    concurrency_ceiling,
    ladder_serves,
    largest_int,
    last_rung_serves,
    longest_serving,
    serves_concurrencies,
    terms_for,
    tuned,
    version_defaults,
)
from loadline.units import GIB

_TP_SIZES = (1, 2, 4, 8)
_MAX_NODES = 8


@quick_init
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
    charge: NodeCharge = WHOLE_NODE  # what each pod is charged of its instance

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
        """Per replica: its pods' charges of their instances (shares or whole: ``charge``; 0 when the
        shape has no price, e.g. on-prem).

        A candidate rejected before a shape was chosen keeps the catalog's per-GPU price, which only
        orders the rejections."""
        return _price(self.gpu, self.gpus, self.shape, self.instances, self.charge.share)

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
            self.charge,
        )

    @property
    def feasible(self) -> bool:
        return not self.rejection


def _priced(shape: NodeShape | None) -> bool:
    return shape is None or shape.price_per_hour is not None


def _price(gpu: GPUType, gpus: int, shape: NodeShape | None, instances: int, share: float = 1.0) -> float:
    if shape is not None:
        return round((shape.price_per_hour or 0.0) * share * instances, 6)
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


class KvCorrections(Protocol):
    """Learned corrections of the KV budget (``loadline.observe.CorrectionStore`` is one): for a model's
    architecture family, quantization and vLLM version, per GPU type the GiB per GPU to hold back from
    the KV cache (negative: to give it, within the store's bound) and how to say so in the plan."""

    def reserves(self, family: str, quantization: str, version: str) -> Sequence[tuple[str, float, str]]: ...


@quick_init
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
    #: Why the chosen layout has less tensor parallelism than the heads allow (kernel alignment).
    layout_notes: tuple[str, ...] = ()
    #: "KV budget corrected by N observations of …" when a learned correction shaped the chosen GPU's
    #: budget (see :class:`KvCorrections`).
    correction_notes: tuple[str, ...] = ()
    #: ``spec.autoscaling.maxReplicas``: the most replicas the model may run, priced in the summary.
    max_replicas: int | None = None

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

    def summary(self) -> PlanSummary:
        """The plan as ``status.plan`` shows it (its wire form: ``model_dump(by_alias=True)``)."""
        c, s, b = self.chosen, self.settings, self.budget
        return PlanSummary(
            gpu=f"{c.gpu.name}x{c.gpus}",
            gpu_type=c.gpu.name,
            gpu_product=c.gpu.product,
            gpus_per_replica=c.gpus,
            tensor_parallel_size=c.tensor_parallel_size,
            pipeline_parallel_size=c.pipeline_parallel_size,
            nodes_per_replica=c.nodes,
            max_model_len=s.max_model_len,
            max_num_seqs=s.max_num_seqs,
            max_num_batched_tokens=s.max_num_batched_tokens,
            gpu_memory_utilization=s.gpu_memory_utilization,
            kv_cache_tokens=b.kv_cache_tokens,
            max_concurrency=round(b.max_concurrency, 2),
            memory=MemoryBreakdown(
                total_gi_b=round(b.total_gib, 2),
                weights_gi_b=round(b.weights_gib, 2),
                activation_gi_b=round(b.activation_gib, 2),
                non_torch_gi_b=round(b.non_torch_gib, 2),
                cuda_graph_gi_b=round(b.cuda_graph_gib, 2),
                kv_cache_gi_b=round(b.kv_cache_gib, 2),
            ),
            download_gi_b=round(self.download.gib, 2),
            price_per_hour=round(c.price_per_hour * self.replicas, 2),
            price_basis=self.price_basis,
            fallback_from=self.fallback_from,
            engine_version=self.inputs.version,
            enforce_eager=s.enforce_eager,
            tuning=[*c.tuning, *self.layout_notes, *self.correction_notes],
            node_shape=self._shape_summary(),
            # With spec.autoscaling: what one replica costs and what its maxReplicas would.
            price_per_replica_per_hour=None if self.max_replicas is None else round(c.price_per_hour, 2),
            max_replicas=self.max_replicas,
            max_price_per_hour=(
                None if self.max_replicas is None else round(c.price_per_hour * self.max_replicas, 2)
            ),
            model_family=self.model.architecture.model_type,
            quantization=s.quantization,
            kv_reserve_gi_b=round(dict(self.inputs.kv_reserve).get(c.gpu.name, 0.0), 4),
        )

    @property
    def price_basis(self) -> str:
        """How one replica's price was found: its pods' share of their node's price (and which share),
        or the whole node and why (:func:`loadline.sizing._shapes.charge_text`)."""
        c = self.chosen
        if c.shape is None or c.pod is None:
            return ""
        return charge_text(c.shape, c.pod, c.instances, c.charge)

    def _shape_summary(self) -> NodeShapeSummary | None:
        c = self.chosen
        if c.shape is None or c.pod is None:
            return None
        shape = c.shape
        finite = shape.memory_gib != float("inf")
        return NodeShapeSummary(
            name=shape.name,
            provider=shape.provider,
            gpus_per_node=shape.gpus,
            interconnect=shape.interconnect,
            rdma=shape.rdma,
            host_memory_gi_b=round(shape.memory_gib, 2) if finite else None,
            allocatable_memory_gi_b=round(shape.allocatable_memory_gib, 2) if finite else None,
            vcpus=shape.vcpus if finite else None,
            allocatable_cpu=round(shape.allocatable_cpu, 2) if finite else None,
            price_per_hour=shape.price_per_hour,
            price_verified=shape.price_verified,
            price_source=shape.price_source,
            price_as_of=shape.price_as_of,
            instances_per_replica=c.instances,
            charged_share=round(c.charge.share, 4),
            whole_node=c.charge.whole,
            pod_memory_gi_b=c.pod.memory_gib,
            pod_cpu=c.pod.cpu,
            why=c.shape_note,
            source=shape.source,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.model_id,
            "modelSource": self.model.source,
            "replicas": self.replicas,
            "plan": self.summary().model_dump(
                by_alias=True,
                mode="json",
                # Said only with spec.autoscaling, as status.plan says them.
                exclude={"price_per_replica_per_hour", "max_replicas", "max_price_per_hour"}
                if self.max_replicas is None
                else None,
            ),
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


@cache
def _head_splits(heads: int, kv_heads: int) -> tuple[int, ...]:
    """The tensor-parallel sizes the heads allow on a node of any size (:func:`_tp_options`'s, before the
    node's GPUs bound them)."""
    return tuple(_tp_options(heads, kv_heads, max(_TP_SIZES)))


def _node_gpus(gpu: GPUType, inputs: SpecInputs, catalog_file: str) -> NodeFacts:
    """:func:`_largest_node`, memoised as :func:`allowed_shapes` is (``catalog_file``: the user
    catalog's path)."""
    key = (gpu.name, inputs.providers, inputs.cluster, catalog_file)
    return _NODE_GPUS.get(key, gpu, lambda: _largest_node(gpu, inputs))


#: GPUs of the largest allowed shape of a GPU type, whether any allowed shape has an RDMA fabric, and
#: whether it has an allowed shape at all.
NodeFacts = tuple[int, bool, bool]


def _largest_node(gpu: GPUType, inputs: SpecInputs) -> NodeFacts:
    allowed = allowed_shapes(gpu, inputs.providers, inputs.cluster)
    if not allowed:
        return gpu.max_gpus_per_node, gpu.multi_node, False
    return max(s.gpus for s in allowed), any(s.fabric for s in allowed), True


_NODE_GPUS: GuardedMemo[tuple[str, tuple[str, ...], ClusterShapes | None, str], NodeFacts] = GuardedMemo(4096)


def _splits(inputs: SpecInputs) -> tuple[int, ...]:
    """The tensor-parallel sizes the heads allow and vLLM can build the layers for
    (:func:`~loadline.sizing._align.tp_problem`: whole shards, whole quantization blocks and groups)."""
    return _alignment(inputs)[0]


def _skipped(inputs: SpecInputs) -> tuple[tuple[int, str], ...]:
    """The tensor-parallel sizes the heads allow but vLLM cannot build the layers for, and why."""
    return _alignment(inputs)[1]


#: The tensor-parallel sizes vLLM can build a model's layers for, and those it cannot with why.
Alignment = tuple[tuple[int, ...], tuple[tuple[int, str], ...]]


def _alignment(inputs: SpecInputs) -> Alignment:
    """:func:`_splits` and :func:`_skipped`, memoised per architecture (by identity: the entry keeps
    it), quantization and version: a plan asks for them several times (its type plans' keys, its
    layouts, its notes) and every spec of a model, method and release gets the same answer, while
    :func:`tp_problem`'s own memo, per size as well, holds fewer of a fleet's combinations than it
    sees."""
    arch = inputs.model.architecture
    key = (id(arch), inputs.quantization, inputs.version)
    found = _ALIGNMENT.peek(key, arch)
    if found is None:
        found = _ALIGNMENT.get(key, arch, lambda: _new_alignment(inputs))
    return found


def _new_alignment(inputs: SpecInputs) -> Alignment:
    arch = inputs.model.architecture
    aligned, skipped = [], []
    for tp in _head_splits(arch.num_attention_heads, arch.num_kv_heads):
        problem = tp_problem(arch, inputs.quantization, inputs.version, tp)
        if problem:
            skipped.append((tp, f"TP {tp} skipped: {problem}"))
        else:
            aligned.append(tp)
    return tuple(aligned), tuple(skipped)


_ALIGNMENT: GuardedMemo[tuple[int, str, str], Alignment] = GuardedMemo(8192)


def alignment_notes(inputs: SpecInputs) -> tuple[str, ...]:
    """:func:`_skipped`'s reasons, for a plan's notes and refusals."""
    return tuple(text for _, text in _skipped(inputs))


@cache
def _layouts_for(
    node: int,
    heads: int,
    kv_heads: int,
    layers: int,
    max_gpus: int,
    multi_node: bool,
    aligned: tuple[int, ...] | None = None,
) -> tuple[tuple[int, int, int], ...]:
    """(tp, pp, nodes) layouts in increasing GPU count, the best layout for each count, for a node size:
    a pure function of a few integers, asked once per plan and GPU type, so memoised. ``aligned``: the
    tensor-parallel sizes vLLM can build the layers for (:func:`_splits`; None: any the heads allow)."""
    tps = [tp for tp in _tp_options(heads, kv_heads, node) if aligned is None or tp in aligned]
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
        choice.charge,
    )


def _placement(
    inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, nodes: int, weights_gib: float, catalog_file: str
) -> tuple[PodRequest, ShapeChoice]:
    """The pod of a layout whose engine fits, and the node shape it takes (memoised: see
    :func:`_placements`)."""
    placements = _placements(inputs, catalog_file)
    placed = _placed(placements, inputs, gpu, tp, pp, nodes, weights_gib, catalog_file)
    return placed[1], placed[2]


#: Where a layout's pods go: (GPU type, the pod's request, the node shape it takes, whether it takes
#: one, the candidate's sort key). Flat, and shared by every layout whose pods ask the same.
Placed = tuple[GPUType, PodRequest, ShapeChoice, bool, SortKey]
#: Per (GPU type name, tp, pp, nodes, weights per GPU): its :data:`Placed`.
Placements = dict[tuple[str, int, int, int, float], Placed]


def _placements(inputs: SpecInputs, catalog_file: str) -> Placements:
    """The placements of the pods of specs with these host-side inputs (KV offload, memory and CPU
    overrides, providers, the cluster's shapes, the user catalog): fleets of models share them, since a
    pod's request is whole GiB and CPUs. Two levels, so that a plan hashes these inputs once."""
    key = (
        inputs.kv_offload_gib,
        inputs.memory_gib_override,
        inputs.cpu_override,
        inputs.providers,
        inputs.dedicated_nodes,
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
) -> Placed:
    key = (gpu.name, tp, pp, nodes, weights_gib)
    found = placements.get(key)
    if found is not None and found[0] is gpu:
        return found
    placed = _place(inputs, gpu, tp, pp, nodes, weights_gib, catalog_file)
    global _PLACED
    _PLACED += 1
    if _PLACED > _MAX_PLACED:  # bounded over all host-side inputs together
        _PLACEMENTS.clear()
        _PLACED = 0
        placements.clear()
    placements[key] = placed
    return placed


def _place(
    inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, nodes: int, weights_gib: float, catalog_file: str
) -> Placed:
    """The pod, the shape it takes, whether it takes one, and the sort key of the candidate it makes."""
    pod = pod_request(
        weights_gib_per_gpu=weights_gib,
        gpus_per_pod=(tp * pp) // max(nodes, 1),
        nodes=nodes,
        kv_offload_gib=inputs.kv_offload_gib,
        memory_override_gib=inputs.memory_gib_override,
        cpu_override=inputs.cpu_override,
    )
    # The shape depends on the pod's request (whole GiB and CPUs), not on the weights behind it: many
    # models' pods ask the same, so the placement is memoised per request (its fields, which the garbage
    # collector does not track in a key) and shared.
    request = (
        gpu.name,
        pod.gpus,
        pod.memory_gib,
        pod.cpu,
        pod.shm_gib,
        tp,
        pp,
        nodes,
        inputs.providers,
        inputs.dedicated_nodes,
        inputs.cluster,
        catalog_file,
    )
    return _SHAPES.get(request, gpu, lambda: _new_placed(inputs, gpu, pod, tp, pp, nodes))


def _new_placed(inputs: SpecInputs, gpu: GPUType, pod: PodRequest, tp: int, pp: int, nodes: int) -> Placed:
    choice = choose_shape(gpu, pod, tp, nodes, inputs.providers, inputs.cluster, inputs.dedicated_nodes)
    shape, gpus = choice.shape, tp * pp
    # The placements are memoised per providers and cluster, on which verified_prices_first depends.
    unverified = (
        shape is not None
        and shape.unverified_price
        and verified_prices_first(inputs.providers, inputs.cluster)
    )
    price = _price(gpu, gpus, shape, choice.instances, choice.charge.share)
    key = (not _priced(shape), unverified, price, gpus, nodes)
    return gpu, pod, choice, not choice.rejection, key


_PLACEMENTS: GuardedMemo[tuple[object, ...], Placements] = GuardedMemo(1024)
_MAX_PLACED = 32768
_PLACED = 0  # placements held by the dicts of _PLACEMENTS
_SHAPES: GuardedMemo[tuple[object, ...], Placed] = GuardedMemo(8192)


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
    # What :func:`_cheapest` bounds its candidates with: whether any node shape is allowed (else no
    # layout is placed), and per layout of ``rows`` a bound below its sort key (:func:`_row_bounds`).
    shaped: bool = False
    bounds: tuple[Bound, ...] = ()


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
    that allows the same GPUs, so memoised. The key holds of the spec only what the result depends on:
    whether the dtype is bfloat16 and the KV cache fp8 (:func:`_unsupported`), the tensor-parallel sizes
    the heads allow and the layers up to ``max_gpus`` (no layout has more pipeline stages than GPUs:
    :func:`_layouts_for`), so that specs of many models share an entry."""
    arch = inputs.model.architecture
    methods = quantization_methods()
    key = (
        tuple(gpu_names),
        max_gpus,
        multi_node,
        min_gpu_memory_gib,
        inputs.dtype == "bfloat16",
        inputs.quantization,
        inputs.kv_cache_dtype.startswith("fp8"),
        _head_splits(arch.num_attention_heads, arch.num_kv_heads),
        _splits(inputs),
        min(arch.num_layers, max_gpus),
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
    """:func:`_type_plans` computed: the types ruled out (:func:`_type_problems`), then the layouts of
    the others (:func:`_type_layouts`). Each half is memoised on only what it depends on, so that the
    many combinations of a fleet's specs (each half varies with different fields of the spec) are put
    together from a few entries instead of judging every GPU type again."""
    catalog = gpu_catalog()
    methods = quantization_methods()
    problem_key = (
        tuple(gpu_names),
        min_gpu_memory_gib,
        inputs.dtype == "bfloat16",
        inputs.quantization,
        inputs.kv_cache_dtype.startswith("fp8"),
        id(methods),
    )
    found = _TYPE_PROBLEMS.peek(problem_key, catalog) or _TYPE_PROBLEMS.get(
        problem_key, catalog, lambda: (methods, _type_problems(inputs, gpu_names, min_gpu_memory_gib))
    )
    ruled_out = found[1]
    usable = tuple(name for name, plan in zip(gpu_names, ruled_out, strict=True) if plan is None)
    arch = inputs.model.architecture
    layout_key = (
        usable,
        max_gpus,
        multi_node,
        _head_splits(arch.num_attention_heads, arch.num_kv_heads),
        _splits(inputs),
        min(arch.num_layers, max_gpus),
        inputs.providers,
        inputs.cluster,
        catalog_file,
    )
    laid_out = _TYPE_LAYOUTS.peek(layout_key, catalog) or _TYPE_LAYOUTS.get(
        layout_key, catalog, lambda: _type_layouts(inputs, usable, max_gpus, multi_node, catalog_file)
    )
    others = iter(laid_out)
    return tuple(next(others) if plan is None else plan for plan in ruled_out)


def _type_problems(
    inputs: SpecInputs, gpu_names: Sequence[str], min_gpu_memory_gib: float
) -> tuple[_TypePlan | None, ...]:
    """Per GPU name, the plan of a type the spec cannot use (its support problem or the remediation
    floor's), or None: the same for every spec of a dtype, quantization and KV-cache dtype class."""
    plans: list[_TypePlan | None] = []
    for name in gpu_names:
        gpu = find_gpu(name, "spec.gpu.types")
        problem = _support_problem(gpu, inputs)
        if not problem and gpu.memory_gib < min_gpu_memory_gib:
            problem = (
                f"{gpu.name} has {gpu.memory_gib:.2f} GiB; out-of-memory remediation asks for at least "
                f"{min_gpu_memory_gib:.2f} GiB per GPU"
            )
        plans.append(_type_plan(gpu, problem, 0, False, ()) if problem else None)
    return tuple(plans)


def _type_layouts(
    inputs: SpecInputs, gpu_names: Sequence[str], max_gpus: int, multi_node: bool, catalog_file: str
) -> tuple[_TypePlan, ...]:
    """The plans of the GPU types the spec can use: their layouts (none within ``max_gpus`` is a
    problem too) and bounds, from the node shapes allowed; the same for every spec whose model splits
    its heads and layers alike, with the same limits and node shapes."""
    arch = inputs.model.architecture
    plans = []
    for name in gpu_names:
        gpu = find_gpu(name, "spec.gpu.types")
        node, fabric, shaped = _node_gpus(gpu, inputs, catalog_file)
        spans_nodes = multi_node and gpu.multi_node and fabric
        layouts = _layouts_for(
            node or gpu.max_gpus_per_node,
            arch.num_attention_heads,
            arch.num_kv_heads,
            arch.num_layers,
            max_gpus,
            spans_nodes,
            _splits(inputs),
        )
        problem = "" if layouts else f"no layout within {max_gpus} GPUs divides the attention heads"
        if not layouts and _splits(inputs) != _head_splits(arch.num_attention_heads, arch.num_kv_heads):
            problem += " with a tensor-parallel size vLLM can build the quantized layers for"
        bounds = _row_bounds(gpu, layouts, inputs, catalog_file)
        plans.append(_type_plan(gpu, problem, node, spans_nodes, layouts, shaped, bounds))
    return tuple(plans)


_TYPE_PROBLEMS: GuardedMemo[tuple[object, ...], tuple[object, tuple[_TypePlan | None, ...]]] = GuardedMemo(
    4096
)
_TYPE_LAYOUTS: GuardedMemo[tuple[object, ...], tuple[_TypePlan, ...]] = GuardedMemo(4096)


def _type_plan(
    gpu: GPUType,
    problem: str,
    node: int,
    spans_nodes: bool,
    layouts: tuple[tuple[int, int, int], ...],
    shaped: bool = False,
    bounds: tuple[Bound, ...] = (),
) -> _TypePlan:
    """One :class:`_TypePlan`, shared by every entry of :func:`_type_plans` that has it (specs of many
    models and settings treat a GPU type alike): fewer objects for the garbage collector to walk."""
    key = (gpu.name, problem, node, spans_nodes, layouts, shaped, bounds)
    return _TYPE_PLAN.get(
        key,
        gpu,
        lambda: _TypePlan(gpu, problem, node, spans_nodes, layouts, _rows(gpu, layouts), shaped, bounds),
    )


#: Below the sort key of a feasible candidate (keys of equal first three items sort after it, being
#: longer): whether it is unpriced, False, and a price below its own.
Bound = tuple[bool, bool, float]
#: Above every sort key: a layout no allowed node shape has the GPUs for (nor any layout after it).
_UNPLACEABLE: Bound = (True, True, math.inf)


def _row_bounds(
    gpu: GPUType, layouts: tuple[tuple[int, int, int], ...], inputs: SpecInputs, catalog_file: str
) -> tuple[Bound, ...]:
    """Per layout, a bound below the sort key it has if feasible: its pods take shapes among the
    allowed ones with at least their GPUs (and an RDMA fabric across nodes), one instance per pod
    (:func:`choose_shape`), and are charged at least their GPU share of it
    (:func:`~loadline.sizing._shapes.node_charge`), so its price is at least the least GPU share of
    those times its nodes, and it is unpriced only if all of those are; less a margin for the rounding
    of the price. A pod's host memory and CPU only narrow the shapes further. Along a type's layouts
    (more GPUs per pod, more nodes) the bound never falls. Memoised per type, layouts and allowed
    shapes."""
    key = (gpu.name, layouts, inputs.providers, inputs.cluster, catalog_file)
    return _ROW_BOUNDS.get(key, gpu, lambda: _new_row_bounds(gpu, layouts, inputs))


def _new_row_bounds(
    gpu: GPUType, layouts: tuple[tuple[int, int, int], ...], inputs: SpecInputs
) -> tuple[Bound, ...]:
    allowed = allowed_shapes(gpu, inputs.providers, inputs.cluster)
    bounds: list[Bound] = []
    for tp, pp, nodes in layouts:
        per_pod = max((tp * pp) // max(nodes, 1), 1)  # pod_request's GPUs
        takers = [s for s in allowed if s.gpus >= per_pod and (nodes <= 1 or s.fabric)]
        prices = [s.price_per_hour * per_pod / s.gpus * nodes for s in takers if s.price_per_hour is not None]
        if prices:
            bounds.append((False, False, min(prices) * (1 - 1e-9) - 1e-6))
        elif takers:
            bounds.append((True, False, -1e-6))  # priced 0.0, after every priced key
        else:
            bounds.append(_UNPLACEABLE)
    return tuple(bounds)


_ROW_BOUNDS: GuardedMemo[tuple[object, ...], tuple[Bound, ...]] = GuardedMemo(4096)


_TYPE_PLAN: GuardedMemo[tuple[object, ...], _TypePlan] = GuardedMemo(4096)


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


def _placeable(candidate: Candidate, replicas: int, free: FreeGPUs | None) -> bool:
    """Whether ``replicas`` copies of the candidate fit the free GPUs per node of its type, on nodes
    whose shape takes its pod's host memory and CPU (:class:`NodeRoom`; a plain count takes any pod)."""
    if free is None:
        return True
    pod = candidate.pod
    nodes = sorted(
        (
            n if isinstance(n, int) else n.gpus if pod is None or n.takes(pod.memory_gib, pod.cpu) else 0
            for n in free.get(candidate.gpu.name, ())
        ),
        reverse=True,
    )
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
    placements = _placements(inputs, catalog_file)
    per_block = math.ceil(inputs.max_model_len / terms.block_size)
    out: list[Verdict] = []
    append = out.append
    for gpu, problem, node, spans_nodes, _, rows, *_ in plans:
        if problem:
            append((gpu, 1, 1, 1, False, (False, False, _price(gpu, 1, None, 0), 1, 1), None, problem, ()))
            continue
        context = _context(inputs, gpu)
        first = len(out)
        for row in rows:
            if row[3] < min_gpus:
                continue
            verdict = _judge(inputs, terms, placements, catalog_file, gpu, context, row, per_block)
            append(verdict)
            if verdict[4]:
                break
        else:
            if multi_node and not spans_nodes and len(out) > first and out[-1][1] * out[-1][2] == node:
                # This GPU's last candidate considered (its sort key does not change); none considered
                # (every row below min_gpus): no note, and none on another GPU's verdict.
                g, t, p, n, _, k, where, why, notes = out[-1]
                note = f"{gpu.name} nodes have no RDMA fabric, so loadline does not span them across nodes"
                out[-1] = (g, t, p, n, False, k, where, why, (*notes, note))
    return sorted(out, key=_BY_KEY)  # stable, as plan_candidates's sort


_BY_KEY = operator.itemgetter(5)


#: What judging a GPU type's layouts for one spec needs once: vLLM's defaults on it (the tuning
#: ladder's base), the room on one GPU (the most any tuning could give: gpu-memory-utilization 0.95, or
#: the spec's) and the utilization of the ladder's last rung at most (0.95 or the defaults', or the
#: spec's).
Context = tuple[Config, float, float]


def _context(inputs: SpecInputs, gpu: GPUType) -> Context:
    """The :data:`Context` of ``gpu`` (``defaults(inputs, gpu)`` spelled out)."""
    memory = gpu.memory_gib
    tier = version_defaults(inputs.version, gpu.name, memory)
    concurrency, pinned_util = inputs.concurrency, inputs.gpu_memory_utilization
    seqs = inputs.max_num_seqs or (tier[0] if tier[0] >= concurrency else concurrency)
    tokens = inputs.max_num_batched_tokens or (tier[1] if tier[1] >= seqs else seqs)
    utilization = pinned_util or tier[2]
    base = (seqs, tokens, utilization, inputs.enforce_eager)
    if pinned_util is None:  # as ladder_serves
        return base, memory * MAX_UTILIZATION, max(utilization, MAX_UTILIZATION)
    return base, memory * utilization, utilization


def _judge(
    inputs: SpecInputs,
    terms: ModelTerms,
    placements: Placements,
    catalog_file: str,
    gpu: GPUType,
    context: Context,
    row: LayoutRow,
    per_block: int,
) -> Verdict:
    """The verdict on one layout of a GPU type: whether the tuning ladder serves the spec on it
    (:func:`layout_serves`) and, when it does, the node shape its pods take. ``per_block``: blocks of
    one full-attention group a sequence of max-model-len takes (as :meth:`FixedTerms._blocks_per_seq`)."""
    tp, pp, nodes, _, rejected_key = row
    _, room, ceiling = context
    weights, non_torch, static, block_bytes, full_groups, sliding_groups, _, _ = terms.static_terms(
        tp, pp, gpu.interconnect, gpu.name
    )
    # layout_serves(), with what rules a layout out cheapest first. When the weights and non-torch
    # memory alone exceed the room (hopeless()), neither the defaults (which use less of the GPU, and
    # activations besides) nor any rung serves: most layouts of a large model on a small GPU end there.
    if not static < room:
        return (gpu, tp, pp, nodes, False, rejected_key, None, "", ())
    if not sliding_groups:
        # FixedTerms.may_serve at the ladder's ceiling, before the layout's FixedTerms exist: when the
        # most blocks any setting up to it gives hold too few sequences, neither the defaults (fewer
        # blocks, by the same monotone steps) nor the ladder (ladder_serves asks the same) serve.
        blocks = blocks_within(gpu.memory_gib * GIB, ceiling, weights, non_torch, block_bytes)
        blocks_per_seq = full_groups * per_block
        held = blocks / blocks_per_seq if blocks_per_seq else 0.0
        if held < 1.0 or not held >= inputs.concurrency:
            return (gpu, tp, pp, nodes, False, rejected_key, None, "", ())
    return _settle(
        inputs,
        terms,
        placements,
        catalog_file,
        gpu,
        context[0],
        row,
        per_block,
        weights,
        full_groups,
        sliding_groups,
    )


def _settle(
    inputs: SpecInputs,
    terms: ModelTerms,
    placements: Placements,
    catalog_file: str,
    gpu: GPUType,
    base: Config,
    row: LayoutRow,
    per_block: int,
    weights: float,
    full_groups: int,
    sliding_groups: int,
) -> Verdict:
    """:func:`_judge` of a layout that passed its first two tests: vLLM's defaults, then the ladder's
    last rung, then the node shape (``base``: vLLM's defaults; ``weights``, ``full_groups`` and
    ``sliding_groups``: the layout's :meth:`ModelTerms.static_terms`)."""
    tp, pp, nodes, _, rejected_key = row
    concurrency = inputs.concurrency
    fixed = terms.layout(gpu.memory_gib, tp, pp, gpu.interconnect, gpu.name)
    blocks, tokens, starts = fixed.pools.get(base) or fixed.cached_pool(base)
    serves = False
    if starts:  # fixed.serves(pool, length, concurrency), inlined
        if sliding_groups:
            blocks_per_seq = fixed._blocks_per_seq(inputs.max_model_len, tokens)
        else:
            blocks_per_seq = full_groups * per_block
        held = blocks / blocks_per_seq if blocks_per_seq else 0.0
        serves = not held < 1.0 and held >= concurrency
    if not serves:
        # ladder_serves(); _judge's tests were hopeless() and, but for sliding windows, may_serve().
        length = inputs.max_model_len
        if sliding_groups:
            serves = ladder_serves(fixed, inputs, base, length, concurrency)
        else:
            serves = last_rung_serves(fixed, inputs, base, length, concurrency)
        if not serves:
            return (gpu, tp, pp, nodes, False, rejected_key, None, "", ())
    weights_gib = weights / GIB
    placed = placements.get((gpu.name, tp, pp, nodes, weights_gib))
    if placed is None or placed[0] is not gpu:
        placed = _placed(placements, inputs, gpu, tp, pp, nodes, weights_gib, catalog_file)
    return (gpu, tp, pp, nodes, placed[3], placed[4], (placed[1], placed[2]), "", ())


def _cheapest(
    inputs: SpecInputs,
    gpu_names: Sequence[str],
    max_gpus: int,
    multi_node: bool,
    min_gpu_memory_gib: float,
    catalog_file: str,
    terms: ModelTerms,
) -> Verdict | None:
    """The first feasible verdict of :func:`_verdicts` (None when there is none), judging only the
    layouts that might come before it: a plan needs the cheapest feasible layout, and the others only
    when its candidates are read.

    Branch and bound over the GPU types: each type's layouts are judged in :func:`_verdicts`'s order
    (more GPUs each), from its first that leaves room for the weights, while their bound
    (:func:`_row_bounds`: the cheapest allowed shapes with the GPUs of its pods) is not above the best
    feasible key found so far; the bounds never fall along a type's layouts, and the types are taken
    lowest first bound first, so once one's is above it, so are those left.
    A type's judging ends at its first feasible layout, as in :func:`_verdicts`, and a tie of keys goes
    to the type listed first, as the stable sort of :func:`_verdicts` gives it. As :func:`_verdicts`
    with ``min_gpus`` 1 (see :func:`plan_inference_model`)."""
    plans = _type_plans(inputs, gpu_names, max_gpus, multi_node, min_gpu_memory_gib, catalog_file)
    pinned = inputs.gpu_memory_utilization
    scans = _scans(terms, plans, MAX_UTILIZATION if pinned is None else pinned)
    placements = _placements(inputs, catalog_file)
    per_block = math.ceil(inputs.max_model_len / terms.block_size)
    concurrency = inputs.concurrency
    static_terms = terms.static_terms
    best: Verdict | None = None
    best_order = 0
    for order, first, bound in scans:
        if best is not None and best[5] < bound:
            break  # the types left are bounded higher still
        plan = plans[order]
        gpu, rows = plan.gpu, plan.rows
        base, room, ceiling = _context(inputs, gpu)
        total = gpu.memory_gib * GIB
        for index in range(first, len(rows)):
            row = rows[index]
            bound = plan.bounds[index]
            if bound is _UNPLACEABLE or (best is not None and best[5] < bound):
                break  # this layout's bound, and those after it, are above the best key
            # _judge's first two tests, inline: most layouts judged here end at them, and a rejected
            # layout's verdict is not needed; _settle does the rest.
            weights, non_torch, static, block_bytes, full_groups, sliding_groups, _, _ = static_terms(
                row[0], row[1], gpu.interconnect, gpu.name
            )
            if not static < room:
                continue
            if not sliding_groups:
                blocks_per_seq = full_groups * per_block
                blocks = blocks_within(total, ceiling, weights, non_torch, block_bytes)
                held = blocks / blocks_per_seq if blocks_per_seq else 0.0
                if held < 1.0 or not held >= concurrency:
                    continue
            verdict = _settle(
                inputs,
                terms,
                placements,
                catalog_file,
                gpu,
                base,
                row,
                per_block,
                weights,
                full_groups,
                sliding_groups,
            )
            if verdict[4]:
                if best is None or verdict[5] < best[5] or (verdict[5] == best[5] and order < best_order):
                    best, best_order = verdict, order
                break
    return best


#: A GPU type :func:`_cheapest` judges: its order in the type plans, its first layout whose weights and
#: non-torch memory leave room on a GPU (the layouts before it serve nothing), and that layout's bound
#: (:func:`_row_bounds`).
Scan = tuple[int, int, Bound]


def _scans(terms: ModelTerms, plans: tuple[_TypePlan, ...], ceiling: float) -> tuple[Scan, ...]:
    """The types of ``plans`` that may place a layout (no problem, an allowed node shape, a layout that
    leaves room at gpu-memory-utilization ``ceiling``), lowest bound first: the same for every spec of
    a model, dtype and quantization that allows the same GPUs, so memoised. Keyed by identity; the
    entry keeps the type plans (the terms are its guard). Plain numbers, which the garbage collector
    stops tracking."""
    key = (id(terms), id(plans), ceiling)
    found = _SCANS.peek(key, terms)
    if found is None:
        found = _SCANS.get(key, terms, lambda: (plans, _new_scans(terms, plans, ceiling)))
    return found[1]


def _new_scans(terms: ModelTerms, plans: tuple[_TypePlan, ...], ceiling: float) -> tuple[Scan, ...]:
    scans: list[tuple[Bound, int, int]] = []
    static_terms = terms.static_terms
    for order, plan in enumerate(plans):
        # A type with no allowed node shape places no layout (choose_shape refuses them all).
        if plan.problem or not plan.shaped:
            continue
        room = plan.gpu.memory_gib * ceiling  # as _context's
        for index, row in enumerate(plan.rows):
            if static_terms(row[0], row[1], plan.gpu.interconnect, plan.gpu.name)[2] < room:
                if plan.bounds[index] is not _UNPLACEABLE:  # else no layout from here is placed
                    scans.append((plan.bounds[index], order, index))
                break
    scans.sort(key=operator.itemgetter(0, 1))
    return tuple((order, first, bound) for bound, order, first in scans)


_SCANS: GuardedMemo[tuple[int, int, float], tuple[object, tuple[Scan, ...]]] = GuardedMemo(16384)


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
    free_gpus: FreeGPUs | None = None,
    min_gpus: int = 1,
    min_gpu_memory_gib: float = 0.0,
    cluster_shapes: ClusterShapes | None = None,
    corrections: KvCorrections | None = None,
) -> Plan:
    """Plan one InferenceModel. ``free_gpus`` (GPU type → free GPUs per node, as counts or
    :class:`loadline.sizing.NodeRoom`) makes it capacity aware;
    ``cluster_shapes`` (the cluster's GPU nodes as shapes, :func:`loadline.sizing.cluster_shapes`)
    restricts the node shapes to those the cluster has (see :func:`allowed_shapes`);
    ``corrections`` (learned from what vLLM reported, :class:`KvCorrections`) adjust the KV budget of
    the GPU types they were learned on.

    Raises :class:`NoFeasiblePlanError` with one line per rejected candidate when nothing fits.
    """
    model = resolve_model(spec, config_map_config, hub_config)
    inputs = resolve_inputs(spec, model)
    if cluster_shapes is not None:
        inputs = dataclasses.replace(inputs, cluster=cluster_shapes)
    inputs, said = _with_corrections(inputs, model, corrections)
    names = list(spec.gpu.types) or list(gpu_catalog())
    max_gpus = spec.gpu.max_gpus_per_replica or _MAX_NODES * 8
    catalog_file = os.environ.get(GPU_CATALOG_ENV, "")
    terms = terms_for(inputs)
    multi_node = spec.gpu.allow_multi_node
    evaluated: Evaluated = {}

    def materialize(verdict: Verdict) -> Candidate:
        return _materialize(verdict, inputs, catalog_file, evaluated, terms)

    def all_verdicts() -> list[Verdict]:
        return _verdicts(
            inputs, names, max_gpus, multi_node, min_gpus, min_gpu_memory_gib, catalog_file, terms
        )

    # Only the cheapest feasible layout is needed now (:func:`_cheapest`), unless the cluster's free
    # GPUs may pass it over, or a remediation floor on GPUs skips layouts (where _verdicts' note on a
    # GPU type that cannot span nodes may land on the type before it).
    first = None
    if free_gpus is None and min_gpus <= 1:
        first = _cheapest(inputs, names, max_gpus, multi_node, min_gpu_memory_gib, catalog_file, terms)
    verdicts: list[Verdict] | None = None
    if first is None:
        verdicts = all_verdicts()
        feasible_verdicts = [v for v in verdicts if v[4]]
        if not feasible_verdicts:
            _refuse(spec, inputs, model, [materialize(v) for v in verdicts])
        first = feasible_verdicts[0]
    chosen = best = materialize(first)
    if free_gpus is not None and verdicts is not None:
        feasible = [best, *(materialize(v) for v in verdicts if v[4] and v is not first)]
        chosen = _placeable_choice(spec, model, feasible, free_gpus)
    by_verification = chosen is best and verified_prices_first(inputs.providers, inputs.cluster)

    def considered() -> tuple[Candidate, ...]:
        # The chosen verdict materializes to ``chosen`` itself (memoised in ``evaluated``).
        candidates = (materialize(v) for v in (all_verdicts() if verdicts is None else verdicts))
        return tuple(
            c if c.rejection or c is chosen else _note_cost(c, chosen, by_verification) for c in candidates
        )

    return Plan(
        model,
        inputs,
        chosen,
        spec.replicas,
        Later(considered),
        best.gpu.name if chosen is not best else "",  # the cheapest type had no free GPUs for it
        _layout_notes(inputs, chosen),
        (said[chosen.gpu.name],) if chosen.gpu.name in said else (),
        spec.autoscaling.max_replicas if spec.autoscaling is not None else None,
    )


def _with_corrections(
    inputs: SpecInputs, model: ResolvedModel, corrections: KvCorrections | None
) -> tuple[SpecInputs, dict[str, str]]:
    """The inputs with the KV reserves learned for this model's kind on each GPU type, and what each
    correction says (by GPU type) for the plan's notes."""
    if corrections is None:
        return inputs, {}
    found = corrections.reserves(model.architecture.model_type, inputs.quantization, inputs.version)
    reserve = tuple(sorted((gpu, gib) for gpu, gib, _ in found))
    return dataclasses.replace(inputs, kv_reserve=reserve), {gpu: note for gpu, _, note in found}


def _refuse(
    spec: InferenceModelSpec, inputs: SpecInputs, model: ResolvedModel, candidates: list[Candidate]
) -> NoReturn:
    """No candidate can serve the spec: one line naming the nearest fixes, and each rejection."""
    fixes = refusal_fixes(spec, inputs, candidates)
    fix_text = "; or ".join(f["text"] for f in fixes) or (
        "none found by changing maxModelLen, concurrency or GPUs (up to 64 of any catalog type): "
        "quantize the weights (spec.quantization) or add a larger GPU type to the catalog"
    )
    aligned = alignment_notes(inputs)
    limits = f"; kernel alignment: {'; '.join(aligned)}" if aligned else ""
    raise NoFeasiblePlanError(
        f"spec: no GPU candidate can serve {model.model_id} at maxModelLen {inputs.max_model_len} × "
        f"concurrency {inputs.concurrency}{limits} (fix: {fix_text})",
        [f"{c.label}: {c.rejection}" for c in candidates],
        fixes=[f["spec"] for f in fixes],
    )


def _placeable_choice(
    spec: InferenceModelSpec, model: ResolvedModel, feasible: list[Candidate], free_gpus: FreeGPUs
) -> Candidate:
    """The cheapest feasible plan the cluster's free GPUs can place (``feasible[0]`` is the cheapest
    of all): another GPU type only with ``spec.gpu.allowFallback``; none placeable is refused."""
    best = feasible[0]
    placeable = [c for c in feasible if _placeable(c, spec.replicas, free_gpus)]
    if not placeable:
        raise NoCapacityError(
            f"spec: no free GPUs in the cluster for any feasible plan of {model.model_id} "
            f"(cheapest: {best.label}; fix: add GPU nodes or lower replicas)",
            [f"{c.label}: not enough free {c.gpu.name} GPUs" for c in feasible],
        )
    if placeable[0] is not best and not spec.gpu.allow_fallback:
        raise NoCapacityError(
            f"spec.gpu.allowFallback: {best.label} is the cheapest plan but the cluster has no free "
            f"{best.gpu.name} GPUs for it (fix: add capacity or set spec.gpu.allowFallback: true)"
        )
    return placeable[0]


def _layout_notes(inputs: SpecInputs, chosen: Candidate) -> tuple[str, ...]:
    """Why ``chosen`` splits its GPUs with less tensor parallelism than the heads allow: the sizes
    skipped for kernel alignment, when one of them would have been chosen (empty otherwise)."""
    arch = inputs.model.architecture
    heads = _head_splits(arch.num_attention_heads, arch.num_kv_heads)
    if heads == _splits(inputs):
        return ()
    node = chosen.shape.gpus if chosen.shape is not None else chosen.gpu.max_gpus_per_node
    widest = max((tp for tp in heads if tp <= node and chosen.gpus % tp == 0), default=1)
    if widest <= chosen.tensor_parallel_size:
        return ()
    skipped = [text for tp, text in _skipped(inputs) if tp > chosen.tensor_parallel_size]
    return (f"tensor parallelism {chosen.tensor_parallel_size} (not {widest}): " + "; ".join(skipped),)


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
    # verdict (serves_at: its first and last rung decide) and the node shape (the same for any value,
    # so asked only of a layout whose value would be the best yet). Feasibility falls as either value
    # rises (largest_int's search assumes it), so the concurrencies searched are those above the best
    # yet, up to the most the layout's KV cache could hold (concurrency_ceiling): the same largest.
    for c in tried.values():
        gpu, tp, pp = c.gpu, c.tensor_parallel_size, c.pipeline_parallel_size
        fits: bool | None = None  # whether the pod takes a node shape, when asked
        if inputs.max_model_len > 1:
            length = longest_serving(inputs, gpu, tp, pp, inputs.max_model_len - 1, terms)
            if length:
                rounded = length - length % 256 if length >= 512 else length
                if rounded > best_len:
                    fits = _fits_node(inputs, c)
                    if not fits:
                        continue  # no value of either serves: the pod takes no node shape
                    best_len = rounded
        if inputs.concurrency > 1:
            high = min(inputs.concurrency - 1, concurrency_ceiling(inputs, gpu, tp, pp, terms))
            if high > best_conc:
                works = serves_concurrencies(inputs, gpu, tp, pp, terms)
                conc = largest_int(best_conc + 1, high, works)
                if conc and (fits if fits is not None else _fits_node(inputs, c)):
                    best_conc = conc
    if best_len:
        fixes.append({"text": f"lower spec.maxModelLen to {best_len}", "spec": {"maxModelLen": best_len}})
    if best_conc:
        fixes.append({"text": f"lower spec.concurrency to {best_conc}", "spec": {"concurrency": best_conc}})
    quantized = _quantized_fix(spec, inputs)
    if quantized is not None:
        fixes.append(quantized)
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


def _quantized_fix(spec: InferenceModelSpec, inputs: SpecInputs) -> dict[str, Any] | None:
    """Quantizing the weights while loading, within the GPUs the spec allows (its types and cap): the
    first online method of the version (vllm_compat.json ``checkpoints.online``: 8-bit before 4-bit)
    whose plan is feasible on a GPU whose kernels support it. None for a checkpoint that is quantized
    already, weights the user sized (``weightsGiB``), or a spec that names a method."""
    if (
        inputs.quantization != "none"
        or inputs.model.architecture.quantization is not None
        or inputs.weights_gib_total is not None
    ):
        return None
    table = compat_table()
    version = min(max(parse_version(inputs.version), table.oldest), table.newest)
    methods = quantization_methods()
    online = [
        m for m in table.online if m in methods and m in table.methods and table.methods[m].covers(version)
    ]
    names = list(spec.gpu.types) or list(gpu_catalog())
    max_gpus = spec.gpu.max_gpus_per_replica or _MAX_NODES * 8
    catalog_file = os.environ.get(GPU_CATALOG_ENV, "")
    for method in sorted(online, key=lambda m: (-methods[m].bits, m)):
        if methods[method].scope != "linear":
            continue  # expert-only methods leave a dense model as it is
        quantized = dataclasses.replace(inputs, quantization=method)
        verdict = _cheapest(
            quantized, names, max_gpus, spec.gpu.allow_multi_node, 0.0, catalog_file, terms_for(quantized)
        )
        if verdict is not None:
            gpu, tp, pp, nodes = verdict[:4]
            label = Candidate(gpu, tp, pp, nodes, None, None).label
            return {
                "text": f"quantize the weights: {method} weights fit {tp * pp} × {gpu.name} ({label}; set "
                f"spec.quantization: {method})",
                "spec": {"quantization": method},
            }
    return None


def _cheapest_feasible(inputs: SpecInputs, gpu_names: Sequence[str], max_gpus: int) -> Candidate | None:
    """The layout of ``[c for c in plan_candidates(inputs, gpu_names, max_gpus, True) if c.feasible][0]``
    (or None): its GPU type, tensor and pipeline parallelism and nodes, which are all the fix names, as
    a candidate without settings or budget (the rejected layouts of that list are never shown, and the
    chosen one's tuning is not either)."""
    catalog_file = os.environ.get(GPU_CATALOG_ENV, "")
    verdict = _cheapest(inputs, gpu_names, max_gpus, True, 0.0, catalog_file, terms_for(inputs))
    if verdict is None:
        return None
    gpu, tp, pp, nodes = verdict[:4]
    return Candidate(gpu, tp, pp, nodes, None, None)
