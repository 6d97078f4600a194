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
from typing import Any, NamedTuple, TypedDict

from loadline.errors import ModelConfigError

# Keys under which multimodal configs nest their language model.
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")


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
    # How vLLM runs it (data/model_kinds.json): "decoder", "encoder" (encoder-only attention: no KV
    # cache, no LM head, no sampler) or "pooling" (a decoder run by the pooling runner: no LM head, no
    # sampler).
    kind: str = "decoder"
    # Per-layer embedding tables (Gemma 3n): a table of vocab_size_per_layer_input rows of
    # num_layers × hidden_size_per_layer_input, its projection, and per layer an input gate and
    # projection; AltUp's extra hidden streams and LAuReL's low-rank residual per layer.
    per_layer_vocab: int = 0
    per_layer_hidden: int = 0
    altup_inputs: int = 0
    laurel_rank: int = 0
    # The last layers that reuse an earlier layer's KV cache (Gemma 3n num_kv_shared_layers): vLLM
    # gives them no cache of their own.
    kv_shared_layers: int = 0
    # Gemma 4's KV-sharing layers have an MLP twice as wide (use_double_wide_mlp).
    double_wide_shared_mlp: bool = False
    # Rows of learned absolute position and token-type embeddings (BERT-style encoders).
    position_rows: int = 0
    # Whether positions are rotary (RoPE), so that rope scaling can extend the context window.
    rotary: bool = False
    # State-space (Mamba) mixers, kind "state_space": each sequence holds a conv state of
    # (ssm_conv_kernel - 1) × conv channels and an SSM state of ssm_state_size per channel (Mamba) or per
    # head dimension (Mamba 2: ssm_heads × ssm_head_dim, ssm_groups groups of B/C), whatever its length.
    ssm_state_size: int = 0
    ssm_conv_kernel: int = 0
    ssm_groups: int = 0
    ssm_heads: int = 0
    ssm_head_dim: int = 0
    ssm_dt_rank: int = 0

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

    @property
    def is_state_space(self) -> bool:
        return self.kind == "state_space"

    @property
    def has_kv_cache(self) -> bool:
        """Whether vLLM gives it a KV cache (encoder-only attention has none)."""
        return self.kind != "encoder"

    @property
    def samples(self) -> bool:
        """Whether it has an LM head and vLLM's sampler (pooling models have neither)."""
        return self.kind not in {"encoder", "pooling"}

    @property
    def kv_layers(self) -> int:
        """Layers with a KV cache of their own."""
        return self.num_layers - self.kv_shared_layers


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
    for key in TEXT_CONFIG_KEYS:
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


@dataclass(frozen=True)
class _Kind:
    architectures: frozenset[str]
    model_types: frozenset[str]
    suffixes: tuple[str, ...] = ()
    runner_flags: Mapping[str, frozenset[str]] = field(default_factory=dict)
    problem: str = ""
    fix: str = ""


@cache
def _kinds() -> dict[str, _Kind]:
    """``data/model_kinds.json``: how vLLM runs a model class (its sources are in the file)."""
    raw = json.loads(resources.files("loadline.sizing").joinpath("data/model_kinds.json").read_text())
    out: dict[str, _Kind] = {}
    for name, entry in raw["kinds"].items():
        out[str(name)] = _Kind(
            architectures=frozenset(entry.get("architectures", ())),
            model_types=frozenset(entry.get("model_types", ())),
            suffixes=tuple(entry.get("suffixes", ())),
            runner_flags={k: frozenset(v) for k, v in entry.get("runner_flags", {}).items()},
            problem=str(entry.get("problem", "")),
            fix=str(entry.get("fix", "")),
        )
    return out


#: Kinds loadline does not size: refused by name with the table's reason and fix.
_REFUSED_KINDS = ("encoder_decoder", "state_space", "hybrid")


def _model_kind(
    config: Mapping[str, Any], text: Mapping[str, Any], names: tuple[str, ...], field_prefix: str
) -> str:
    """The kind of :data:`Architecture.kind` vLLM runs this config as; a kind loadline cannot size is
    refused here, by the class name and the reason, before any key it would lack is asked for."""
    kinds = _kinds()
    model_types = {str(config.get("model_type", "")), str(text.get("model_type", ""))} - {""}
    layer_kinds = text.get("layer_types") or text.get("layers_block_type") or ()
    recurrent_layers = isinstance(layer_kinds, list) and any(
        "mamba" in str(k) or "linear" in str(k) for k in layer_kinds
    )
    shown = names[0] if names else f"model_type {'/'.join(sorted(model_types)) or '?'}"
    for kind in _REFUSED_KINDS:
        entry = kinds[kind]
        named = next((n for n in names if n in entry.architectures), None)
        if named is None and not (
            model_types & entry.model_types
            or (kind == "encoder_decoder" and config.get("is_encoder_decoder") is True)
            or (kind == "hybrid" and recurrent_layers)
        ):
            continue
        if kind == "state_space" and _int(text, "state_size", "ssm_state_size", "d_state") is not None:
            return kind  # sized by its own state (see _state_space)
        raise ModelConfigError(
            f"{field_prefix}.architectures", f"{named or shown} {entry.problem}", entry.fix
        )
    encoder = kinds["encoder"]
    if any(n in encoder.architectures for n in names) or model_types & encoder.model_types:
        return "encoder"
    pooling = kinds["pooling"]
    if any(n in pooling.architectures or n.endswith(pooling.suffixes) for n in names):
        return "pooling"
    # vLLM's last suffix rule: a class it does not list whose name ends in "Model" (not "ChatModel" or
    # "LMHeadModel") defaults to the pooling runner (vllm/config/model.py _SUFFIX_TO_DEFAULTS).
    if any(
        n.endswith("Model") and not n.endswith(("ChatModel", "LMHeadModel")) and n not in _listed_classes()
        for n in names
    ):
        return "pooling"
    return "decoder"


@cache
def _listed_classes() -> frozenset[str]:
    """Every class name some vLLM release's model registry lists (``data/vllm_compat.json``)."""
    raw = json.loads(resources.files("loadline.sizing").joinpath("data/vllm_compat.json").read_text())
    return frozenset(raw["architectures"])


def pooling_runner(extra_args: list[str]) -> bool:
    """Whether ``extraArgs`` ask vLLM's pooling runner (``--runner pooling``, ``--task embed`` ...)."""
    flags = _kinds()["pooling"].runner_flags
    for index, token in enumerate(extra_args):
        name, sep, value = token.partition("=")
        accepted = flags.get(name.replace("_", "-"))
        if accepted is None:
            continue
        if not sep and index + 1 < len(extra_args):
            value = extra_args[index + 1]
        if value in accepted:
            return True
    return False


# vLLM's keys for the context window, the smallest of which it takes (vllm/config/model.py
# _get_and_verify_max_len, 0.8-0.33; model_max_length, when present, wins over the others).
_WINDOW_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# Rope types whose config already states the extended window (vLLM applies no factor to them).
_PRESCALED_ROPE = frozenset({"su", "longrope", "llama3"})
# Keys that make positions rotary: rope scaling can extend such a model's window.
_ROTARY_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "rotary_dim", "rotary_emb_base")


def rope_settings(cfg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The rope scaling entries of a config: ``rope_scaling`` or transformers 5's ``rope_parameters``
    (one mapping, or one per layer type)."""
    raw = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(raw, Mapping):
        return []
    if all(isinstance(v, Mapping) for v in raw.values()) and raw:
        return [v for v in raw.values() if isinstance(v, Mapping)]
    return [raw]


def _rope_type(entry: Mapping[str, Any]) -> str:
    return str(entry.get("rope_type") or entry.get("type") or "default")


def window_scaling(cfg: Mapping[str, Any]) -> bool:
    """Whether the config's rope scaling changes vLLM's context window (YaRN, linear, dynamic ...)."""
    if "gemma3" in str(cfg.get("model_type", "")):
        return False
    for entry in rope_settings(cfg):
        factor = entry.get("factor")
        if _rope_type(entry) not in _PRESCALED_ROPE and _usable(factor) and factor != 1:
            return True
    return False


def context_window(text: Mapping[str, Any], config: Mapping[str, Any]) -> int | None:
    """The longest max-model-len vLLM accepts for this config, by vLLM's own rule
    (vllm/config/model.py ``_get_and_verify_max_len``; vllm/config.py before 0.10.2): the smallest of its
    window keys, then rope scaling: a factor multiplies it unless the rope type states the extended
    window already (su, longrope, llama3) or the model is Gemma 3, and YaRN multiplies
    ``original_max_position_embeddings`` whatever ``max_position_embeddings`` says."""
    values = [v for key in _WINDOW_KEYS if (v := _int(text, key)) is not None]
    if not values:
        values = [v for key in _WINDOW_KEYS if (v := _int(config, key)) is not None]
    window: float | None = min(values) if values else None
    if _usable(text.get("model_max_length")):
        window = int(text["model_max_length"])
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    entries = rope_settings(text) or rope_settings(config)
    if not entries or "gemma3" in model_type:
        return int(window) if window is not None else None
    factor = 1.0
    for entry in entries:
        rope_type = _rope_type(entry)
        if rope_type in _PRESCALED_ROPE or "mrope_section" in entry:
            continue
        if _usable(entry.get("factor")):
            factor = float(entry["factor"])
        original = _int(entry, "original_max_position_embeddings")
        if rope_type == "yarn" and original is not None:
            window = original
    return int(window * factor) if window is not None else None


def _per_layer_int(text: Mapping[str, Any], key: str) -> int | None:
    """A per-layer list (Gemma 3n's MatFormer ``intermediate_size``) as its largest entry."""
    value = text.get(key)
    if isinstance(value, list) and value and all(_usable(v) for v in value):
        return int(max(value))
    return None


def _state_space(
    config: Mapping[str, Any], text: Mapping[str, Any], prefix: str, architectures: tuple[str, ...]
) -> Architecture:
    """A Mamba or Mamba 2 model (transformers' MambaConfig / Mamba2Config keys), with the shapes vLLM's
    MambaStateShapeCalculator (vllm/model_executor/layers/mamba/mamba_utils.py) gives its state."""
    hidden = _need(text, prefix, "hidden_size", "d_model")
    layers = _need(text, prefix, "num_hidden_layers", "n_layer", most=10_000)
    vocab = _need(text, prefix, "vocab_size")
    state = _need(text, prefix, "state_size", "ssm_state_size", "d_state")
    expand = text.get("expand")
    factor = (
        float(expand) if isinstance(expand, int | float) and _usable(expand) else 2.0
    )  # transformers' default
    intermediate = _int(text, "intermediate_size", "d_inner") or int(factor * hidden)
    heads = _int(text, "num_heads", default=0) or 0  # Mamba 2 only
    head_dim = (_int(text, "head_dim", default=0) or intermediate // heads) if heads else 0
    dt_rank = _int(text, "time_step_rank", "dt_rank") or math.ceil(hidden / 16)  # "auto": ⌈hidden / 16⌉
    dtype = text.get("torch_dtype") or config.get("torch_dtype")
    tie = text.get("tie_word_embeddings", config.get("tie_word_embeddings"))
    return Architecture(
        kind="state_space",
        architectures=architectures,
        model_type=str(text.get("model_type") or config.get("model_type") or ""),
        num_layers=layers,
        hidden_size=hidden,
        # Tensor parallelism splits Mamba 2's heads; loadline keeps Mamba (no heads) at one GPU per
        # replica, which the models vLLM serves (up to 7B) fit.
        num_attention_heads=heads or 1,
        num_kv_heads=heads or 1,
        head_dim=0,
        intermediate_size=intermediate,
        vocab_size=vocab,
        # transformers' MambaConfig and Mamba2Config tie the LM head to the embedding by default.
        tie_word_embeddings=bool(tie) if tie is not None else True,
        max_position_embeddings=context_window(text, config),
        torch_dtype=str(dtype) if dtype else None,
        layer_types=("full",) * layers,
        quantization=_quant_config(config, text),
        ssm_state_size=state,
        ssm_conv_kernel=_int(text, "conv_kernel", "d_conv", default=4) or 4,
        ssm_groups=(_int(text, "n_groups", "ngroups", default=1) or 1) if heads else 0,
        ssm_heads=heads,
        ssm_head_dim=head_dim,
        ssm_dt_rank=dt_rank,
    )


#: Families whose MLP is two matrices (no gate): GPT-2, Phi-2, Falcon and the BERT encoders.
_TWO_MATRIX_MLP = frozenset(
    {"phi", "gpt2", "gpt_neox", "falcon", "gpt_bigcode", "bert", "roberta", "xlm-roberta"}
)


class _PerLayerInputs(TypedDict):
    per_layer_vocab: int
    per_layer_hidden: int
    altup_inputs: int
    laurel_rank: int
    kv_shared_layers: int
    double_wide_shared_mlp: bool


def _per_layer_inputs(text: Mapping[str, Any], layers: int) -> _PerLayerInputs:
    """Gemma 3n's extra parts (per-layer input embeddings, AltUp, LAuReL, KV shared between layers);
    zeros for every other family."""
    per_layer_vocab = _int(text, "vocab_size_per_layer_input", default=0) or 0
    return _PerLayerInputs(
        per_layer_vocab=per_layer_vocab,
        per_layer_hidden=(_int(text, "hidden_size_per_layer_input", default=0) or 0)
        if per_layer_vocab
        else 0,
        altup_inputs=_int(text, "altup_num_inputs", default=0) or 0,
        laurel_rank=_int(text, "laurel_rank", default=0) or 0,
        kv_shared_layers=min(_int(text, "num_kv_shared_layers", default=0) or 0, layers - 1),
        double_wide_shared_mlp=text.get("use_double_wide_mlp") is True,
    )


class _Moe(NamedTuple):
    """A mixture-of-experts model's expert layout, as its config.json names it (zeros for a dense model)."""

    experts: int
    experts_per_token: int
    intermediate: int
    shared_intermediate: int
    dense_layers: int


def _moe(text: Mapping[str, Any], layers: int, intermediate: int) -> _Moe:
    """The expert layout under each family's key names: routed and shared experts' sizes, and the
    layers that stay dense (the first k, the listed MLP-only ones, and those between sparse steps)."""
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
    return _Moe(experts, experts_per_tok, moe_inter, shared_inter, dense_layers)


def parse_hf_config(config: Mapping[str, Any], *, field_prefix: str = "spec.model.config") -> Architecture:
    """Build an :class:`Architecture` from a Hugging Face ``config.json`` mapping.

    Raises :class:`ModelConfigError` naming the missing key when a number sizing needs is absent.
    """
    if not isinstance(config, Mapping) or not config:
        raise ModelConfigError(field_prefix, "is empty", "give the model's config.json")
    text, nested_key = _text_config(config)
    prefix = f"{field_prefix}.{nested_key}" if nested_key else field_prefix
    names = config.get("architectures")
    architectures = tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()
    kind = _model_kind(config, text, architectures, field_prefix)
    if kind == "state_space":
        return _state_space(config, text, prefix, architectures)
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
        _int(text, "intermediate_size", "ffn_hidden_size", "n_inner")
        or _per_layer_int(text, "intermediate_size")
        or 4 * hidden
    )
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    hidden_act = str(text.get("hidden_act") or text.get("hidden_activation") or "")
    # Non-gated (two-matrix) MLPs: GPT-2/Phi-2/Falcon style models with a plain GELU.
    gated = model_type not in _TWO_MATRIX_MLP and hidden_act != "gelu_new"

    moe = _moe(text, layers, intermediate)
    kv_lora = _int(text, "kv_lora_rank")
    layer_types, window = _layer_types(text, layers)
    tie = text.get("tie_word_embeddings", config.get("tie_word_embeddings"))
    max_pos = context_window(text, config)
    dtype = text.get("torch_dtype") or config.get("torch_dtype") or text.get("dtype") or config.get("dtype")
    position_rows = 0
    if kind == "encoder" and model_type in {"bert", "roberta", "xlm-roberta", "ernie"}:
        # Learned absolute positions and token types (BERT-style embeddings).
        position_rows = (_int(text, "max_position_embeddings") or 0) + (_int(text, "type_vocab_size") or 0)
    return Architecture(
        kind=kind,
        **_per_layer_inputs(text, layers),
        position_rows=position_rows,
        rotary=any(key in text or key in config for key in _ROTARY_KEYS),
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
        num_experts=moe.experts,
        num_experts_per_tok=moe.experts_per_token,
        moe_intermediate_size=moe.intermediate,
        shared_expert_intermediate_size=moe.shared_intermediate,
        num_dense_layers=min(moe.dense_layers, layers) if moe.experts else 0,
        kv_lora_rank=kv_lora,
        q_lora_rank=_int(text, "q_lora_rank"),
        qk_rope_head_dim=_int(text, "qk_rope_head_dim", default=0) or 0,
        qk_nope_head_dim=_int(text, "qk_nope_head_dim", default=0) or 0,
        v_head_dim=_int(text, "v_head_dim", default=0) or 0,
        quantization=_quant_config(config, text),
        vision=_vision(config),
    )
