"""From an InferenceModel spec to the architecture and the resolved engine settings.

This is where "auto" and "unset" become concrete values: the checkpoint's dtype, its own
quantization, vLLM's defaults for the version and GPU. Every refusal names the spec field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loadline.api import InferenceModelSpec
from loadline.errors import ModelConfigError, SpecError
from loadline.sizing._arch import (
    TEXT_CONFIG_KEYS,
    Architecture,
    parse_hf_config,
    pooling_runner,
    rope_settings,
    window_scaling,
)
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
    """A model's architecture, where it came from, and its exact parameter count if known.

    ``hf_overrides``: what of the config the plan was sized on the pod would not read from the hub (the
    rope scaling of an inline or ConfigMap config), to be handed to vLLM as ``--hf-overrides``."""

    model_id: str
    architecture: Architecture
    source: str
    exact_parameters: int | None = None
    hf_overrides: Mapping[str, Any] | None = None


HF_OVERRIDES_FLAG = "--hf-overrides"


# Flags whose JSON value vLLM lays over the model's config.json: --hf-overrides, and up to 0.11.0
# --rope-scaling and --rope-theta (vllm/config.py ModelConfig: "hf_override = {'rope_scaling': ...}").
_CONFIG_FLAGS = {HF_OVERRIDES_FLAG: "", "--rope-scaling": "rope_scaling", "--rope-theta": "rope_theta"}


def given_hf_overrides(extra_args: list[str]) -> tuple[int, dict[str, Any]] | None:
    """What ``extraArgs`` lay over the config (``--hf-overrides``, ``--rope-scaling``, ``--rope-theta``)
    as (index of the first such flag, the keys), or None when none is given. vLLM parses the values as
    JSON (vllm/engine/arg_utils.py, ``json.loads``); a value that is not is refused here."""
    found: tuple[int, dict[str, Any]] | None = None
    for index, token in enumerate(extra_args):
        name, sep, value = token.partition("=")
        flag, _, path = name.partition(".")
        key = _CONFIG_FLAGS.get(flag.replace("_", "-"))
        if key is None:
            continue
        if not sep:
            value = extra_args[index + 1] if index + 1 < len(extra_args) else ""
        try:
            parsed = json.loads(value)
        except ValueError:
            # A dotted sub-key (--hf-overrides.rope_scaling.factor 4) takes a plain string too.
            parsed = value if path else None
        for part in reversed(path.split(".") if path else []):
            parsed = {part: parsed}
        if key:
            parsed = {key: parsed} if parsed is not None else None
        if not isinstance(parsed, dict) or (key == "rope_scaling" and not isinstance(parsed[key], dict)):
            raise SpecError(
                f"spec.engine.extraArgs[{index}]",
                f"{name} takes a JSON {'number' if key == 'rope_theta' else 'object'}, not {value!r}",
                'give it as --hf-overrides={"rope_scaling": {...}}',
            )
        found = (found[0] if found else index, {**(found[1] if found else {}), **parsed})
    return found


def _overridden(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as vLLM sees it with ``--hf-overrides``: each key replaced, except that a nested
    model config (``text_config``, ``vision_config`` ...) is updated key by key (vllm/config/model.py
    applies a dict to a sub-config with ``update``)."""
    out = dict(config)
    for key, value in overrides.items():
        current = out.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping) and key.endswith("_config"):
            out[key] = {**current, **value}
        else:
            out[key] = value
    return out


_ROPE_KEYS = ("rope_scaling", "rope_parameters")


def _window_overrides(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The keys of a user-given config that extend its context window by rope scaling, nested as in
    the config: what ``--hf-overrides`` must carry so that vLLM serves the window the plan was sized on,
    since the pod reads the checkpoint's own config.json. YaRN's window is its own
    ``original_max_position_embeddings × factor``; other factors multiply ``max_position_embeddings``,
    which then goes along."""
    scopes: list[tuple[str, Mapping[str, Any]]] = [("", config)]
    scopes += [(k, config[k]) for k in TEXT_CONFIG_KEYS if isinstance(config.get(k), Mapping)]
    out: dict[str, Any] = {}
    for scope, cfg in scopes:
        if not window_scaling(cfg):
            continue
        keys = {k: cfg[k] for k in _ROPE_KEYS if cfg.get(k) is not None}
        yarn = all(str(e.get("rope_type") or e.get("type")) == "yarn" for e in rope_settings(cfg))
        if not yarn and cfg.get("max_position_embeddings") is not None:
            keys["max_position_embeddings"] = cfg["max_position_embeddings"]
        if scope:
            out[scope] = keys
        else:
            out.update(keys)
    return out or None


def resolve_model(
    spec: InferenceModelSpec,
    config_map_config: Mapping[str, Any] | None = None,
    hub_config: Mapping[str, Any] | None = None,
) -> ResolvedModel:
    """Find the model's config.json: inline, the ConfigMap's (read by the caller), the catalog, or the
    hub's (fetched by the caller when enabled), with ``--hf-overrides`` of ``extraArgs`` applied as vLLM
    applies them, and the pooling runner when ``extraArgs`` ask for it."""
    found = _resolve_config(spec, config_map_config, hub_config)
    extra = list(spec.engine.extra_args)
    given = given_hf_overrides(extra)
    if given is not None and found.hf_overrides:
        missing = sorted(k for k, v in found.hf_overrides.items() if given[1].get(k) != v)
        if missing:
            raise SpecError(
                f"spec.engine.extraArgs[{given[0]}]",
                f"{HF_OVERRIDES_FLAG} replaces the one loadline renders from the config's rope scaling, "
                f"and lacks {', '.join(missing)} (vLLM would start without the window the plan was sized on)",
                f"add {json.dumps({k: found.hf_overrides[k] for k in missing})} to it, or remove it",
            )
    model = found.model
    if given is not None:
        config = _overridden(found.raw_config, given[1])
        arch = parse_hf_config(config, field_prefix=found.field_prefix)
        model = dataclasses.replace(model, architecture=arch, hf_overrides=None)
    if model.architecture.kind == "decoder" and pooling_runner(extra):
        pooling = dataclasses.replace(model.architecture, kind="pooling")
        model = dataclasses.replace(model, architecture=pooling)
    return model


@dataclass(frozen=True)
class _Found:
    model: ResolvedModel
    raw_config: Mapping[str, Any]
    field_prefix: str

    @property
    def hf_overrides(self) -> Mapping[str, Any] | None:
        return self.model.hf_overrides


def _resolve_config(
    spec: InferenceModelSpec,
    config_map_config: Mapping[str, Any] | None,
    hub_config: Mapping[str, Any] | None,
) -> _Found:
    name = spec.model.name
    if spec.model.config:
        arch = parse_hf_config(spec.model.config, field_prefix="spec.model.config")
        overrides = _window_overrides(spec.model.config)
        return _Found(
            ResolvedModel(name, arch, "spec.model.config", None, overrides),
            spec.model.config,
            "spec.model.config",
        )
    if spec.model.config_map_ref is not None:
        if config_map_config is None:
            ref = spec.model.config_map_ref
            raise ModelConfigError(
                "spec.model.configMapRef",
                f"ConfigMap {ref.name} key {ref.key} was not read",
                "create the ConfigMap in the InferenceModel's namespace",
            )
        arch = parse_hf_config(config_map_config, field_prefix="spec.model.configMapRef")
        source = f"configmap/{spec.model.config_map_ref.name}"
        overrides = _window_overrides(config_map_config)
        return _Found(
            ResolvedModel(name, arch, source, None, overrides), config_map_config, "spec.model.configMapRef"
        )
    entry = find_catalog_model(name)
    if entry is None and hub_config is not None:
        arch = parse_hf_config(hub_config, field_prefix="hub config.json")
        source = f"hub: {name}@{spec.model.revision or 'main'}"
        return _Found(ResolvedModel(name, arch, source), hub_config, "hub config.json")
    if entry is None:
        raise ModelConfigError(
            "spec.model.name",
            f"{name} is not in loadline's model catalog",
            "give its config.json in spec.model.config or spec.model.configMapRef "
            "(`loadline plan --list-models` shows the catalog)",
        )
    found = _CATALOG_MODELS.peek(entry.id, entry)
    if found is None:
        found = _CATALOG_MODELS.get(entry.id, entry, lambda: _catalog_model(entry))
    return _Found(found, entry.config, f"catalog[{entry.id}].config")


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
        fix = f"set it to {limit} or less"
        if arch.rotary:
            # RoPE models serve longer windows with rope scaling, as their vendors document (e.g. YaRN
            # for Qwen3): vLLM takes original_max_position_embeddings × factor (see context_window).
            factor = float(math.ceil(max_model_len / limit))
            scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": limit}
            fix += (
                ", or, where the model's vendor documents it, extend the window with rope scaling: "
                f"spec.engine.extraArgs --hf-overrides='{json.dumps({'rope_scaling': scaling})}' "
                "(loadline sizes the plan on it and vLLM serves original_max_position_embeddings × factor)"
            )
        raise SpecError(
            field,
            f"{max_model_len} is beyond the model's context window of {limit} tokens (vLLM refuses to start)",
            fix,
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
    #: Learned corrections (``loadline.observe``): per GPU type, GiB per GPU that vLLM was observed not
    #: to give the KV cache beyond what the budget counts (negative: more than planned, bounded), held
    #: back as fixed memory beside non-torch memory. Sorted (GPU type, GiB) pairs.
    kv_reserve: tuple[tuple[str, float], ...] = ()


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
        # A pooling decoder's request holds KV blocks only while its prompt is encoded, and vLLM asks at
        # start-up only that one sequence of max-model-len fits: more requests queue, none fails. (An
        # encoder-only model holds none: any concurrency is served, within max-num-seqs.)
        1 if arch.kind == "pooling" else spec.concurrency,
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
