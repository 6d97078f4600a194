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
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from loadline.api import InferenceModelSpec
from loadline.errors import NoCapacityError, NoFeasiblePlanError
from loadline.sizing._budget import EngineSettings, MemoryBudget
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
    allowed_shapes,
    choose_shape,
    pod_request,
    verified_prices_first,
)
from loadline.sizing._tune import tune

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
        return self.shape is None or self.shape.price_per_hour is not None

    @property
    def unverified_price(self) -> bool:
        """Its node shape is priced from a figure no dated source states."""
        return self.shape is not None and self.shape.unverified_price

    @property
    def price_per_hour(self) -> float:
        """Per replica: the whole instances of its shape (0 when the shape has no price, e.g. on-prem).

        A candidate rejected before a shape was chosen keeps the catalog's per-GPU price, which only
        orders the rejections."""
        if self.shape is not None:
            return round((self.shape.price_per_hour or 0.0) * self.instances, 6)
        return round(self.gpu.price_per_gpu_hour * self.gpus, 4)

    @property
    def label(self) -> str:
        layout = f"TP{self.tensor_parallel_size}"
        if self.pipeline_parallel_size > 1:
            layout += f"×PP{self.pipeline_parallel_size}"
        nodes = f", {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{self.gpu.name}x{self.gpus} ({layout}{nodes})"

    def with_rejection(self, reason: str) -> Candidate:
        return dataclasses.replace(self, rejection=reason)

    @property
    def feasible(self) -> bool:
        return not self.rejection


@dataclass(frozen=True)
class Plan:
    """The chosen layout and everything that was considered."""

    model: ResolvedModel
    inputs: SpecInputs
    chosen: Candidate
    replicas: int
    candidates: tuple[Candidate, ...]
    fallback_from: str = ""

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


def _node_gpus(gpu: GPUType, inputs: SpecInputs) -> tuple[int, bool]:
    """GPUs of the largest allowed shape of ``gpu``, and whether any allowed shape has an RDMA fabric."""
    allowed = allowed_shapes(gpu, inputs.providers, inputs.cluster)
    if not allowed:
        return gpu.max_gpus_per_node, gpu.multi_node
    return max(s.gpus for s in allowed), any(s.fabric for s in allowed)


def _layouts(
    gpu: GPUType,
    heads: int,
    kv_heads: int,
    layers: int,
    max_gpus: int,
    multi_node: bool,
    node: int | None = None,
) -> list[tuple[int, int, int]]:
    """(tp, pp, nodes) layouts in increasing GPU count, the best layout for each count."""
    return list(_layouts_for(node or gpu.max_gpus_per_node, heads, kv_heads, layers, max_gpus, multi_node))


@cache
def _layouts_for(
    node: int, heads: int, kv_heads: int, layers: int, max_gpus: int, multi_node: bool
) -> tuple[tuple[int, int, int], ...]:
    """:func:`_layouts` for a node size: a pure function of a few integers, asked once per plan and GPU
    type, so memoised."""
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


def _evaluate(inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, nodes: int) -> Candidate:
    """:func:`_evaluate_layout`, memoised per (spec inputs, GPU type, layout): a pure function of them
    (and of the catalogs, read once per process; the user catalog's path is in the key), asked again
    by every re-plan of an unchanged model and by refusal fixes. GPUType holds a dict, so the key has
    its name and the entry keeps the object, as :func:`allowed_shapes` does."""
    key = (inputs, gpu.name, tp, pp, nodes, os.environ.get(GPU_CATALOG_ENV, ""))
    return _EVALUATED.get(key, gpu, lambda: _evaluate_layout(inputs, gpu, tp, pp, nodes))


_EVALUATED: GuardedMemo[tuple[SpecInputs, str, int, int, int, str], Candidate] = GuardedMemo(32768)


def _evaluate_layout(inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, nodes: int) -> Candidate:
    """Tune the engine for this layout, then find the node shape its pods fit."""
    tuned = tune(inputs, gpu, tp, pp)
    if not tuned.serves:
        return Candidate(gpu, tp, pp, nodes, tuned.settings, tuned.budget, tuned.rejection)
    pod = pod_request(
        weights_gib_per_gpu=tuned.budget.weights_gib,
        gpus_per_pod=(tp * pp) // max(nodes, 1),
        nodes=nodes,
        kv_offload_gib=inputs.kv_offload_gib,
        memory_override_gib=inputs.memory_gib_override,
        cpu_override=inputs.cpu_override,
    )
    choice = choose_shape(gpu, pod, tp, nodes, inputs.providers, inputs.cluster)
    return Candidate(
        gpu,
        tp,
        pp,
        nodes,
        tuned.settings,
        tuned.budget,
        choice.rejection,
        shape=choice.shape,
        instances=choice.instances,
        shape_note=choice.note,
        pod=pod,
        tuning=tuned.notes,
    )


def _placeable(candidate: Candidate, replicas: int, free: Mapping[str, Sequence[int]] | None) -> bool:
    """Whether ``replicas`` copies of the candidate fit the free GPUs per node of its type."""
    if free is None:
        return True
    nodes = sorted(free.get(candidate.gpu.name, ()), reverse=True)
    if candidate.nodes == 1:
        return sum(n // candidate.gpus for n in nodes) >= max(replicas, 1)
    per_node = candidate.gpus // candidate.nodes
    return sum(1 for n in nodes if n >= per_node) >= candidate.nodes * max(replicas, 1)


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
    arch = inputs.model.architecture
    out: list[Candidate] = []
    for name in gpu_names:
        gpu = find_gpu(name, "spec.gpu.types")
        problem = _support_problem(gpu, inputs)
        if not problem and gpu.memory_gib < min_gpu_memory_gib:
            problem = (
                f"{gpu.name} has {gpu.memory_gib:.2f} GiB; out-of-memory remediation asks for at least "
                f"{min_gpu_memory_gib:.2f} GiB per GPU"
            )
        if problem:
            out.append(Candidate(gpu, 1, 1, 1, None, None, problem))
            continue
        node, fabric = _node_gpus(gpu, inputs)
        spans_nodes = multi_node and gpu.multi_node and fabric
        layouts = _layouts(
            gpu, arch.num_attention_heads, arch.num_kv_heads, arch.num_layers, max_gpus, spans_nodes, node
        )
        if not layouts:
            out.append(
                Candidate(
                    gpu, 1, 1, 1, None, None, f"no layout within {max_gpus} GPUs divides the attention heads"
                )
            )
            continue
        for tp, pp, nodes in layouts:
            if tp * pp < min_gpus:
                continue
            candidate = _evaluate(inputs, gpu, tp, pp, nodes)
            out.append(candidate)
            if candidate.feasible:
                break
        else:
            if multi_node and not spans_nodes and out and out[-1].gpus == node:
                last = out[-1]
                out[-1] = last.with_rejection(
                    f"{last.rejection}; {gpu.name} nodes have no RDMA fabric, so loadline does not "
                    "span them across nodes"
                )
    # Comparing every provider, a verified price ranks before an unverified one (see choose_shape).
    unverified_last = verified_prices_first(inputs.providers, inputs.cluster)
    out.sort(
        key=lambda c: (
            not c.priced,
            unverified_last and c.unverified_price,
            c.price_per_hour,
            c.gpus,
            c.nodes,
        )
    )
    return out


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
    candidates = plan_candidates(
        inputs,
        names,
        max_gpus,
        spec.gpu.allow_multi_node,
        min_gpus=min_gpus,
        min_gpu_memory_gib=min_gpu_memory_gib,
    )
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
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
    best = feasible[0]
    chosen = best
    fallback_from = ""
    if free_gpus is not None:
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
    considered = tuple(
        c if c.rejection or c is chosen else _note_cost(c, chosen, by_verification) for c in candidates
    )
    return Plan(model, inputs, chosen, spec.replicas, considered, fallback_from)


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


def _serves_at(inputs: SpecInputs, candidate: Candidate, **changes: Any) -> bool:
    probe = dataclasses.replace(inputs, **changes)
    c = candidate
    return _evaluate(probe, c.gpu, c.tensor_parallel_size, c.pipeline_parallel_size, c.nodes).feasible


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
    for c in tried.values():
        if inputs.max_model_len > 1:
            length = _largest_int(
                1, inputs.max_model_len - 1, lambda n, c=c: _serves_at(inputs, c, max_model_len=n)
            )
            if length:
                rounded = length - length % 256 if length >= 512 else length
                best_len = max(best_len, rounded)
        if inputs.concurrency > 1:
            conc = _largest_int(
                1, inputs.concurrency - 1, lambda n, c=c: _serves_at(inputs, c, concurrency=n)
            )
            best_conc = max(best_conc, conc or 0)
    if best_len:
        fixes.append({"text": f"lower spec.maxModelLen to {best_len}", "spec": {"maxModelLen": best_len}})
    if best_conc:
        fixes.append({"text": f"lower spec.concurrency to {best_conc}", "spec": {"concurrency": best_conc}})
    wider = plan_candidates(inputs, list(gpu_catalog()), _FIX_MAX_GPUS, True)
    feasible = [c for c in wider if c.feasible]
    if feasible:
        best = feasible[0]
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
