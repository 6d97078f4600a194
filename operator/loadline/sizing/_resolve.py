"""From an InferenceModel spec to the architecture and the resolved engine settings.

This is where "auto" and "unset" become concrete values: the checkpoint's dtype, its own
quantization, vLLM's defaults for the version and GPU. Every refusal names the spec field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loadline.api import InferenceModelSpec
from loadline.errors import ModelConfigError, SpecError
from loadline.sizing._arch import Architecture, parse_hf_config
from loadline.sizing._budget import EngineSettings, resolve_dtype
from loadline.sizing._compat import check_compatibility, compat_table
from loadline.sizing._data import (
    CatalogModel,
    GPUType,
    engine_version,
    find_catalog_model,
    quantization_methods,
)
from loadline.sizing._memo import GuardedMemo
from loadline.sizing._records import quick_init
from loadline.sizing._shapes import ClusterShapes

# Names a checkpoint's quantization_config uses, mapped to the vLLM method that loads it on NVIDIA GPUs.
_CHECKPOINT_METHODS = {
    "awq": "awq_marlin",
    "gptq": "gptq_marlin",
    "fp8": "fp8",
    "compressed-tensors": "compressed-tensors",
    "compressed_tensors": "compressed-tensors",
    "bitsandbytes": "bitsandbytes",
    "mxfp4": "mxfp4",
    "modelopt": "modelopt",
    "fbgemm_fp8": "fbgemm_fp8",
    "gguf": "gguf",
    "experts_int8": "experts_int8",
    "moe_wna16": "moe_wna16",
    "auto-round": "auto-round",
    "auto_round": "auto-round",
    "hqq": "hqq",
    "quark": "quark",
    "torchao": "torchao",
    "nvfp4": "modelopt_fp4",
    "modelopt_fp4": "modelopt_fp4",
}


@dataclass(frozen=True)
class ResolvedModel:
    """A model's architecture, where it came from, and its exact parameter count if known."""

    model_id: str
    architecture: Architecture
    source: str
    exact_parameters: int | None = None


def resolve_model(
    spec: InferenceModelSpec,
    config_map_config: Mapping[str, Any] | None = None,
    hub_config: Mapping[str, Any] | None = None,
) -> ResolvedModel:
    """Find the model's config.json: inline, the ConfigMap's (read by the caller), the catalog, or the
    hub's (fetched by the caller when enabled)."""
    name = spec.model.name
    if spec.model.config:
        arch = parse_hf_config(spec.model.config, field_prefix="spec.model.config")
        return ResolvedModel(name, arch, "spec.model.config")
    if spec.model.config_map_ref is not None:
        if config_map_config is None:
            ref = spec.model.config_map_ref
            raise ModelConfigError(
                "spec.model.configMapRef",
                f"ConfigMap {ref.name} key {ref.key} was not read",
                "create the ConfigMap in the InferenceModel's namespace",
            )
        arch = parse_hf_config(config_map_config, field_prefix="spec.model.configMapRef")
        return ResolvedModel(name, arch, f"configmap/{spec.model.config_map_ref.name}")
    entry = find_catalog_model(name)
    if entry is None and hub_config is not None:
        arch = parse_hf_config(hub_config, field_prefix="hub config.json")
        return ResolvedModel(name, arch, f"hub: {name}@{spec.model.revision or 'main'}")
    if entry is None:
        raise ModelConfigError(
            "spec.model.name",
            f"{name} is not in loadline's model catalog",
            "give its config.json in spec.model.config or spec.model.configMapRef "
            "(`loadline plan --list-models` shows the catalog)",
        )
    found = _CATALOG_MODELS.peek(entry.id, entry)
    return found if found is not None else _CATALOG_MODELS.get(entry.id, entry, lambda: _catalog_model(entry))


def _catalog_model(entry: CatalogModel) -> ResolvedModel:
    arch = parse_hf_config(entry.config, field_prefix=f"catalog[{entry.id}].config")
    return ResolvedModel(entry.id, arch, f"catalog: {entry.source}", entry.parameters)


# A catalog model's config.json is parsed once per catalog load (the entry is the guard), and every plan
# of it shares one Architecture, which the planner's memos then recognise by identity.
_CATALOG_MODELS: GuardedMemo[str, ResolvedModel] = GuardedMemo(1024)


def resolve_quantization(spec_quantization: str, arch: Architecture, field: str = "spec.quantization") -> str:
    """The vLLM method that will load the weights: the spec's, else the checkpoint's own, else none."""
    if spec_quantization != "none":
        if spec_quantization not in quantization_methods():
            known = ", ".join(sorted(quantization_methods()))
            raise SpecError(field, f"unknown quantization {spec_quantization!r}", f"use one of {known}")
        return spec_quantization
    if arch.quantization is None:
        return "none"
    method = _CHECKPOINT_METHODS.get(arch.quantization.method)
    if method is None:
        raise SpecError(
            "spec.model.config.quantization_config.quant_method",
            f"checkpoint quantization {arch.quantization.method!r} is not one loadline can size",
            "set spec.model.weightsGiB to the weights' size on the GPUs",
        )
    return method


def check_max_model_len(
    arch: Architecture, max_model_len: int | None, field: str = "spec.maxModelLen"
) -> int:
    """The served max-model-len: the spec's, bounded by the model's own context window."""
    limit = arch.max_position_embeddings
    if max_model_len is None:
        if limit is None:
            raise SpecError(
                field, "is required for this model (its config states no context length)", "set it"
            )
        return limit
    if limit is not None and max_model_len > limit:
        raise SpecError(
            field,
            f"{max_model_len} is beyond the model's context window of {limit} tokens (vLLM refuses to start)",
            f"set it to {limit} or less",
        )
    return max_model_len


@quick_init
@dataclass(frozen=True)
class SpecInputs:
    """Everything about a spec that does not depend on the GPU candidate."""

    model: ResolvedModel
    dtype: str
    quantization: str
    kv_cache_dtype: str
    max_model_len: int
    concurrency: int
    version: str
    weight_bits: float | None
    weights_gib_total: float | None
    gpu_memory_utilization: float | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enforce_eager: bool
    cuda_graphs_counted: bool
    # The pod's host side, which decides the node shape (see loadline.sizing._shapes).
    providers: tuple[str, ...] = ()
    memory_gib_override: float | None = None
    cpu_override: int | None = None
    kv_offload_gib: float = 0.0
    #: ``spec.gpu.dedicatedNodes``: pods are charged whole instances (see loadline.sizing._shapes).
    dedicated_nodes: bool = False
    #: The node shapes the cluster has (the operator's view of its GPU nodes); None: not known.
    cluster: ClusterShapes | None = None


def _env_flag(spec: InferenceModelSpec, name: str) -> bool | None:
    for var in spec.engine.env:
        if var.name == name:
            return var.value.strip().lower() in {"1", "true", "yes"}
    return None


def resolve_inputs(spec: InferenceModelSpec, model: ResolvedModel) -> SpecInputs:
    arch = model.architecture
    table = engine_version(spec.engine.version)
    # Before sizing: a model the release cannot load as asked is refused, not planned.
    _check_compatibility(arch, spec.quantization, spec.engine.version, spec.engine.extra_args, model.model_id)
    counted = _env_flag(spec, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")
    engine, resources = spec.engine, spec.resources
    return SpecInputs(  # positionally: keywords cost twice as much (every plan resolves its spec)
        model,
        resolve_dtype(arch, spec.dtype),
        resolve_quantization(spec.quantization, arch),
        spec.kv_cache_dtype,
        check_max_model_len(arch, spec.max_model_len),
        spec.concurrency,
        engine.version,
        float(spec.weight_bits) if spec.weight_bits else None,  # weight_bits
        spec.model.weights_gi_b,  # weights_gib_total
        engine.gpu_memory_utilization,
        engine.max_num_seqs,
        engine.max_num_batched_tokens,
        engine.enforce_eager,
        table.cuda_graph_in_kv_budget if counted is None else counted,  # cuda_graphs_counted
        tuple(spec.gpu.providers),
        resources.memory_gi_b,  # memory_gib_override
        resources.cpu,  # cpu_override
        spec.kv_offload.cpu_gi_b if spec.kv_offload is not None else 0.0,  # kv_offload_gib
        spec.gpu.dedicated_nodes,
    )


def _check_compatibility(
    arch: Architecture, quantization: str, version: str, extra_args: list[str], model_id: str
) -> None:
    """:func:`check_compatibility`, remembered when it passes (a refusal is raised every time). The key
    holds the architecture by identity; the entry keeps it, so no other object can take its id."""
    key = (id(arch), id(compat_table()), quantization, version, tuple(extra_args), model_id)
    if _COMPATIBLE.peek(key, arch):
        return

    def check() -> bool:
        check_compatibility(arch, quantization, version, extra_args, model_id)
        return True

    _COMPATIBLE.get(key, arch, check)


_COMPATIBLE: GuardedMemo[tuple[object, ...], bool] = GuardedMemo(4096)


def engine_settings(
    inputs: SpecInputs,
    gpu: GPUType,
    tp: int,
    pp: int,
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    gpu_memory_utilization: float | None = None,
    enforce_eager: bool | None = None,
) -> EngineSettings:
    """Settings vLLM would run with for this spec on ``tp × pp`` GPUs of ``gpu``; the keywords are the
    planner's tuning (see :mod:`loadline.sizing._tune`), which never overrides what the spec pins."""
    table = engine_version(inputs.version)
    tier = table.batch_default(gpu.name, gpu.memory_gib)
    seqs = max_num_seqs or inputs.max_num_seqs or max(tier.max_num_seqs, inputs.concurrency)
    tokens = max_num_batched_tokens or inputs.max_num_batched_tokens or max(tier.max_num_batched_tokens, seqs)
    return EngineSettings(
        dtype=inputs.dtype,
        quantization=inputs.quantization,
        kv_cache_dtype=inputs.kv_cache_dtype,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=(
            gpu_memory_utilization or inputs.gpu_memory_utilization or table.gpu_memory_utilization
        ),
        max_model_len=inputs.max_model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        enforce_eager=inputs.enforce_eager if enforce_eager is None else enforce_eager,
        cuda_graph_in_kv_budget=inputs.cuda_graphs_counted,
        block_size=table.block_size,
        weight_bits=inputs.weight_bits,
        weights_gib_total=inputs.weights_gib_total,
        interconnect=gpu.interconnect,
    )
