"""Read a Hugging Face ``config.json`` into the handful of numbers that decide GPU memory.

Model families spell the same thing differently (``n_routed_experts`` vs ``num_local_experts``,
``text_config`` nesting for multimodal models, ``layer_types`` vs ``sliding_window_pattern``). This
module is where those spellings meet; everything downstream sees one :class:`Architecture`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from loadline.errors import ModelConfigError

# Keys under which multimodal configs nest their language model.
_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")


@dataclass(frozen=True)
class QuantConfig:
    """A checkpoint's own ``quantization_config``, reduced to what changes the weight footprint."""

    method: str
    bits: float | None = None
    group_size: int | None = None
    # Block quantization's [block_n, block_k] (fp8 ``weight_block_size``, compressed-tensors
    # ``block_structure``): each tensor-parallel shard must be whole blocks (:mod:`loadline.sizing._align`).
    block: tuple[int, int] | None = None
    # Module name fragments left in full precision (e.g. "lm_head", "self_attn" for gpt-oss).
    not_converted: tuple[str, ...] = ()


@dataclass(frozen=True)
class VisionTower:
    """A multimodal model's encoder, sized roughly from its own config (layers × width)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int

    @property
    def parameters(self) -> int:
        per_layer = 4 * self.hidden_size * self.hidden_size + 2 * self.hidden_size * self.intermediate_size
        return self.num_layers * per_layer


@dataclass(frozen=True)
class Architecture:
    """The memory-relevant shape of a transformer decoder."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    torch_dtype: str | None = None
    gated_mlp: bool = True
    # One entry per decoder layer: "full" or "sliding" attention.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    # Mixture of experts (0 experts: dense).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    # Multi-head latent attention (DeepSeek V2/V3): the KV cache holds one latent per token and layer.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    quantization: QuantConfig | None = None
    vision: VisionTower | None = None
    exact_parameters: int | None = None
    notes: tuple[str, ...] = field(default=())
    # config.json's "architectures": the class names vLLM's model registry loads the model by.
    architectures: tuple[str, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def has_sliding_layers(self) -> bool:
        return "sliding" in self.layer_types

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0


# No real config has a dimension or count this large; above it a value is garbage (1e308, a typo) and
# would only make the sizer allocate or overflow instead of answering.
_LARGEST = 2**31 - 1


def _usable(value: Any) -> bool:
    """A positive, finite, bounded number (not a bool: JSON ``true`` is not a size)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and 0 < value <= _LARGEST


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if _usable(value):
            return int(value)  # type: ignore[arg-type]  # _usable: int or float
    return default


def _need(cfg: Mapping[str, Any], field_prefix: str, *keys: str, most: int = _LARGEST) -> int:
    value = _int(cfg, *keys)
    if value is None or value > most:
        present = next((key for key in keys if key in cfg), None)
        fix = "give the model's full config.json (spec.model.config or spec.model.configMapRef)"
        if present is None:
            raise ModelConfigError(f"{field_prefix}.{keys[0]}", "is missing from the config.json", fix)
        raise ModelConfigError(
            f"{field_prefix}.{present}",
            f"is {cfg[present]!r}, not a positive integer of at most {most}",
            "give the value of the model's own config.json",
        )
    return value


@cache
def _family_defaults() -> dict[str, dict[str, Any]]:
    raw = json.loads(resources.files("loadline.sizing").joinpath("data/config_defaults.json").read_text())
    return {str(k): dict(v) for k, v in raw["defaults"].items()}


def with_defaults(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config with transformers' defaults for its model_type under the keys it leaves out."""
    defaults = _family_defaults().get(str(cfg.get("model_type", "")))
    return {**defaults, **cfg} if defaults else cfg


def _text_config(cfg: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    for key in _TEXT_CONFIG_KEYS:
        nested = cfg.get(key)
        if isinstance(nested, Mapping) and ("hidden_size" in nested or "num_hidden_layers" in nested):
            return with_defaults(nested), key
    return with_defaults(cfg), ""


def _layer_types(text: Mapping[str, Any], num_layers: int) -> tuple[tuple[str, ...], int | None]:
    window = _int(text, "sliding_window")
    explicit = text.get("layer_types")
    if isinstance(explicit, list) and len(explicit) == num_layers:
        kinds = tuple("sliding" if "sliding" in str(kind) else "full" for kind in explicit)
        return kinds, window if "sliding" in kinds else None
    if window is None:
        return ("full",) * num_layers, None
    if text.get("use_sliding_window") is False:
        return ("full",) * num_layers, None
    pattern = _int(text, "sliding_window_pattern")
    model_type = str(text.get("model_type", ""))
    if pattern is None and model_type.startswith("gemma2"):
        pattern = 2  # Gemma 2 alternates sliding and global layers.
    if pattern is None and model_type.startswith("gemma3"):
        pattern = 6  # Gemma 3: five sliding layers then one global.
    if pattern is None:
        max_window_layers = _int(text, "max_window_layers")
        if max_window_layers is not None and model_type.startswith("qwen"):
            # Qwen2 with use_sliding_window: layers from max_window_layers on use the window.
            kinds = tuple("sliding" if i >= max_window_layers else "full" for i in range(num_layers))
            return kinds, window if "sliding" in kinds else None
        if max_window_layers is None and window >= (_int(text, "max_position_embeddings") or 0):
            return ("full",) * num_layers, None
        # A single window for every layer (Mistral 7B v0.1 style).
        return ("sliding",) * num_layers, window
    kinds = tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))
    return kinds, window


def _quant_config(cfg: Mapping[str, Any], text: Mapping[str, Any]) -> QuantConfig | None:
    raw = cfg.get("quantization_config") or text.get("quantization_config")
    if not isinstance(raw, Mapping):
        return None
    method = str(raw.get("quant_method") or raw.get("quant_algo") or "").lower()
    if not method:
        return None
    bits: float | None = None
    group: int | None = None
    for key in ("bits", "w_bit", "num_bits", "weight_bits"):
        if isinstance(raw.get(key), int | float):
            bits = float(raw[key])
            break
    for key in ("group_size", "q_group_size"):
        if isinstance(raw.get(key), int):
            group = int(raw[key])
            break
    groups = raw.get("config_groups")
    if isinstance(groups, Mapping) and bits is None:
        for grp in groups.values():
            weights = grp.get("weights") if isinstance(grp, Mapping) else None
            if isinstance(weights, Mapping) and isinstance(weights.get("num_bits"), int):
                bits = float(weights["num_bits"])
                if isinstance(weights.get("group_size"), int):
                    group = int(weights["group_size"])
                break
    if method == "fp8" and bits is None:
        bits = 8.0
    if method == "mxfp4":
        bits = 4.0
    skipped: list[str] = []
    block = _block_shape(raw.get("weight_block_size"))
    if block is None and isinstance(groups, Mapping):
        for grp in groups.values():
            weights = grp.get("weights") if isinstance(grp, Mapping) else None
            if isinstance(weights, Mapping) and block is None:
                block = _block_shape(weights.get("block_structure"))
    for key in ("modules_to_not_convert", "ignore", "ignored_layers", "modules_not_to_convert"):
        value = raw.get(key)
        if isinstance(value, list):
            skipped.extend(str(item) for item in value)
    return QuantConfig(method=method, bits=bits, group_size=group, block=block, not_converted=tuple(skipped))


def _block_shape(value: Any) -> tuple[int, int] | None:
    """``[block_n, block_k]`` of positive integers, else None."""
    if isinstance(value, list) and len(value) == 2 and all(_usable(v) and isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    return None


def _vision(cfg: Mapping[str, Any]) -> VisionTower | None:
    vision = cfg.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    vision = with_defaults(vision)
    layers = _int(vision, "num_hidden_layers", "depth", "num_layers")
    hidden = _int(vision, "hidden_size", "embed_dim", "width")
    inter = _int(vision, "intermediate_size", "mlp_dim")
    if layers is None or hidden is None:
        return None
    return VisionTower(num_layers=layers, hidden_size=hidden, intermediate_size=inter or 4 * hidden)


def parse_hf_config(config: Mapping[str, Any], *, field_prefix: str = "spec.model.config") -> Architecture:
    """Build an :class:`Architecture` from a Hugging Face ``config.json`` mapping.

    Raises :class:`ModelConfigError` naming the missing key when a number sizing needs is absent.
    """
    if not isinstance(config, Mapping) or not config:
        raise ModelConfigError(field_prefix, "is empty", "give the model's config.json")
    text, nested_key = _text_config(config)
    prefix = f"{field_prefix}.{nested_key}" if nested_key else field_prefix
    hidden = _need(text, prefix, "hidden_size", "n_embd", "d_model")
    layers = _need(text, prefix, "num_hidden_layers", "n_layer", "num_layers", most=10_000)
    heads = _need(text, prefix, "num_attention_heads", "n_head")
    vocab = _int(text, "vocab_size") or _int(config, "vocab_size")
    if vocab is None:
        raise ModelConfigError(
            f"{prefix}.vocab_size", "is missing from the model's config.json", "give the full config.json"
        )
    kv_heads = (
        _int(text, "num_key_value_heads", "num_kv_heads", "multi_query_group_num", default=heads) or heads
    )
    head_dim = _int(text, "head_dim", "kv_channels", default=hidden // heads) or hidden // heads
    intermediate = (
        _int(text, "intermediate_size", "ffn_hidden_size", "n_inner", default=4 * hidden) or 4 * hidden
    )
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    hidden_act = str(text.get("hidden_act") or text.get("hidden_activation") or "")
    # Non-gated (two-matrix) MLPs: GPT-2/Phi-2/Falcon style models with a plain GELU.
    gated = not (
        model_type in {"phi", "gpt2", "gpt_neox", "falcon", "gpt_bigcode"} or hidden_act == "gelu_new"
    )

    experts = (
        _int(text, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts", default=0) or 0
    )
    experts_per_tok = _int(text, "num_experts_per_tok", "moe_topk", "top_k", default=0) or 0
    moe_inter = _int(text, "moe_intermediate_size", "expert_intermediate_size", default=0) or 0
    if experts and not moe_inter:
        moe_inter = intermediate  # Mixtral/gpt-oss: experts use intermediate_size.
    shared_inter = _int(text, "shared_expert_intermediate_size", default=0) or 0
    n_shared = _int(text, "n_shared_experts", "num_shared_experts", default=0) or 0
    if n_shared and not shared_inter:
        shared_inter = n_shared * moe_inter
    dense_layers = _int(text, "first_k_dense_replace", default=0) or 0
    mlp_only = text.get("mlp_only_layers")
    if experts and isinstance(mlp_only, list):
        dense_layers += len(mlp_only)
    step = _int(text, "decoder_sparse_step", "interleave_moe_layer_step", default=1) or 1
    if experts and step > 1:
        dense_layers += layers - layers // step

    kv_lora = _int(text, "kv_lora_rank")
    layer_types, window = _layer_types(text, layers)
    tie = text.get("tie_word_embeddings", config.get("tie_word_embeddings"))
    max_pos = _int(text, "max_position_embeddings", "n_positions", "seq_length") or _int(
        config, "max_position_embeddings"
    )
    rope_scaling = text.get("rope_scaling")
    if isinstance(rope_scaling, Mapping) and max_pos:
        original = _int(rope_scaling, "original_max_position_embeddings")
        factor = rope_scaling.get("factor")
        rope_type = str(rope_scaling.get("rope_type") or rope_scaling.get("type") or "")
        # YaRN-extended configs state the original window; vLLM serves original × factor.
        if rope_type == "yarn" and original and isinstance(factor, int | float) and original == max_pos:
            max_pos = int(original * factor)
    dtype = text.get("torch_dtype") or config.get("torch_dtype") or text.get("dtype") or config.get("dtype")
    names = config.get("architectures")
    architectures = tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()
    return Architecture(
        architectures=architectures,
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        # transformers' defaults when the key is absent: Gemma ties, the other families do not.
        tie_word_embeddings=bool(tie) if tie is not None else model_type.startswith("gemma"),
        max_position_embeddings=max_pos,
        torch_dtype=str(dtype) if dtype else None,
        gated_mlp=gated,
        layer_types=layer_types,
        sliding_window=window,
        num_experts=experts,
        num_experts_per_tok=experts_per_tok,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared_inter,
        num_dense_layers=min(dense_layers, layers) if experts else 0,
        kv_lora_rank=kv_lora,
        q_lora_rank=_int(text, "q_lora_rank"),
        qk_rope_head_dim=_int(text, "qk_rope_head_dim", default=0) or 0,
        qk_nope_head_dim=_int(text, "qk_nope_head_dim", default=0) or 0,
        v_head_dim=_int(text, "v_head_dim", default=0) or 0,
        quantization=_quant_config(config, text),
        vision=_vision(config),
    )
