"""Count parameters by kind, because quantization treats the kinds differently.

Embeddings and the LM head stay in the model dtype under every method vLLM ships; attention and
dense MLP projections are "linear"; expert weights are what MoE-only methods (mxfp4, experts_int8)
compress. Counting them apart is what lets one formula size bf16, fp8, w4a16 and mxfp4 alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadline.sizing._arch import Architecture


@dataclass(frozen=True)
class ParameterCounts:
    embedding: int  # input embedding
    lm_head: int  # output projection (0 when tied to the embedding)
    attention: int  # q/k/v/o (or MLA) projections, all layers
    dense_mlp: int  # MLPs of dense layers, and shared experts
    experts: int  # routed expert weights, all layers
    router: int  # expert gates
    norms: int  # layer norms (always full precision)
    vision: int  # multimodal encoder and projector

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.dense_mlp
            + self.experts
            + self.router
            + self.norms
            + self.vision
        )

    @property
    def linear(self) -> int:
        """Weights in Linear layers of the decoder: what weight-quantization methods compress."""
        return self.attention + self.dense_mlp + self.experts


def _attention_per_layer(arch: Architecture) -> int:
    hidden = arch.hidden_size
    heads = arch.num_attention_heads
    if arch.is_mla:
        qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        kv_lora = arch.kv_lora_rank or 0
        if arch.q_lora_rank:
            q = hidden * arch.q_lora_rank + arch.q_lora_rank + arch.q_lora_rank * heads * qk_head
        else:
            q = hidden * heads * qk_head
        kv_a = hidden * (kv_lora + arch.qk_rope_head_dim) + kv_lora
        kv_b = kv_lora * heads * (arch.qk_nope_head_dim + arch.v_head_dim)
        out = heads * arch.v_head_dim * hidden
        return q + kv_a + kv_b + out
    q = hidden * heads * arch.head_dim
    kv = 2 * hidden * arch.num_kv_heads * arch.head_dim
    out = heads * arch.head_dim * hidden
    return q + kv + out


def _mlp(hidden: int, intermediate: int, gated: bool) -> int:
    return (3 if gated else 2) * hidden * intermediate


def _per_layer_inputs(arch: Architecture) -> tuple[int, int]:
    """(embedding, linear) weights of Gemma 3n's per-layer inputs and its AltUp/LAuReL blocks, as vLLM's
    Gemma3n model builds them (vllm/model_executor/models/gemma3n.py, 0.9.2 on): a second embedding
    table of ``vocab_size_per_layer_input`` rows of ``num_layers × hidden_size_per_layer_input`` (kept
    in the model dtype, as every embedding), its projection from the hidden state, and per layer an
    input gate and a projection back; AltUp's ``altup_num_inputs - 1`` extra streams project in and out
    of the hidden size, and LAuReL adds a rank-``laurel_rank`` residual per layer."""
    hidden, layers = arch.hidden_size, arch.num_layers
    per_layer = arch.per_layer_hidden
    embedding = arch.per_layer_vocab * layers * per_layer
    linear = hidden * layers * per_layer + layers * 2 * hidden * per_layer
    if arch.altup_inputs > 1:
        linear += 2 * (arch.altup_inputs - 1) * hidden * hidden
    linear += layers * 2 * hidden * arch.laurel_rank
    return embedding, linear


def _mamba_mixer(arch: Architecture) -> int:
    """One Mamba (or Mamba 2) mixer's weights, as vLLM's mamba_mixer.py / mamba_mixer2.py build them."""
    hidden, inner, state = arch.hidden_size, arch.intermediate_size, arch.ssm_state_size
    kernel = arch.ssm_conv_kernel
    if arch.ssm_heads:
        heads, groups = arch.ssm_heads, arch.ssm_groups
        conv_dim = inner + 2 * groups * state
        in_proj = hidden * (2 * inner + 2 * groups * state + heads)
        return in_proj + conv_dim * (kernel + 1) + 3 * heads + inner + inner * hidden
    rank = arch.ssm_dt_rank
    in_proj = hidden * 2 * inner
    conv = inner * (kernel + 1)
    x_proj = inner * (rank + 2 * state)
    dt_proj = rank * inner + inner
    return in_proj + conv + x_proj + dt_proj + inner * state + inner + inner * hidden


def count_parameters(arch: Architecture) -> ParameterCounts:
    hidden = arch.hidden_size
    layers = arch.num_layers
    if arch.is_state_space:
        return ParameterCounts(
            embedding=arch.vocab_size * hidden,
            lm_head=0 if arch.tie_word_embeddings else arch.vocab_size * hidden,
            attention=0,
            dense_mlp=layers * _mamba_mixer(arch),
            experts=0,
            router=0,
            norms=(layers + 1) * hidden,
            vision=0,
        )
    per_layer_embedding, per_layer_linear = _per_layer_inputs(arch)
    # Position and token-type tables of BERT-style encoders are embeddings too.
    embedding = (arch.vocab_size + arch.position_rows) * hidden + per_layer_embedding
    # Pooling models load no LM head: vLLM replaces it with a pooler (a hidden-wide head at most).
    lm_head = 0 if arch.tie_word_embeddings or not arch.samples else arch.vocab_size * hidden
    attention = layers * _attention_per_layer(arch)
    if arch.is_moe:
        dense_layers = arch.num_dense_layers
        moe_layers = arch.num_moe_layers
        dense_mlp = dense_layers * _mlp(hidden, arch.intermediate_size, arch.gated_mlp)
        dense_mlp += moe_layers * _mlp(hidden, arch.shared_expert_intermediate_size, True)
        experts = moe_layers * arch.num_experts * _mlp(hidden, arch.moe_intermediate_size, True)
        router = moe_layers * hidden * arch.num_experts
    else:
        dense_mlp = layers * _mlp(hidden, arch.intermediate_size, arch.gated_mlp)
        experts = 0
        router = 0
    if arch.double_wide_shared_mlp and not arch.is_moe:
        # Gemma 4: each KV-sharing layer's MLP is twice as wide, so it holds one more MLP's weights.
        dense_mlp += arch.kv_shared_layers * _mlp(hidden, arch.intermediate_size, arch.gated_mlp)
    dense_mlp += per_layer_linear
    norms = (2 * layers + 1) * hidden
    vision = 0
    if arch.vision is not None:
        vision = arch.vision.parameters + arch.vision.hidden_size * hidden
    return ParameterCounts(
        embedding=embedding,
        lm_head=lm_head,
        attention=attention,
        dense_mlp=dense_mlp,
        experts=experts,
        router=router,
        norms=norms,
        vision=vision,
    )
