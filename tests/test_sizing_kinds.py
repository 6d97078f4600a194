"""Models sized by their own kind, the way vLLM runs them (issue 33): the context window vLLM derives
(rope scaling, YaRN), encoder-only and pooling models (no KV cache, no LM head, no sampler), kinds
loadline refuses by name (encoder-decoder, state-space, hybrid), and Gemma 3n's per-layer embeddings
and shared KV layers. The configs are the models' published config.json files (sources in
operator/loadline/sizing/data/models/SOURCES.md, "Test configs")."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from loadline.api import parse_spec
from loadline.errors import ModelConfigError, SpecError
from loadline.sizing import count_parameters, model_catalog, parse_hf_config, plan_inference_model
from loadline.sizing._budget import _state_bytes_per_layer
from tests.conftest import LLAMA_8B

# BAAI/bge-m3 (an XLM-RoBERTa encoder served as an embedding model).
BGE_M3: dict[str, Any] = {
    "architectures": ["XLMRobertaModel"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0,
    "classifier_dropout": None, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 4096, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 8194, "model_type": "xlm-roberta", "num_attention_heads": 16,
    "num_hidden_layers": 24, "output_past": True, "pad_token_id": 1, "position_embedding_type": "absolute",
    "torch_dtype": "float32", "transformers_version": "4.42.4", "type_vocab_size": 1, "use_cache": True,
    "vocab_size": 250002,
}  # fmt: skip

# Qwen/Qwen3-Embedding-0.6B (a Qwen3 decoder served through vLLM's pooling runner).
QWEN3_EMBEDDING: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151643, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 32768,
    "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "float32", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151669,
}  # fmt: skip

# google/gemma-3n-E4B-it's text_config (per-layer embeddings, AltUp, LAuReL, 15 KV-sharing layers).
GEMMA_3N_E4B: dict[str, Any] = {
    "architectures": ["Gemma3nForConditionalGeneration"],
    "model_type": "gemma3n",
    "text_config": {
        "model_type": "gemma3n_text", "vocab_size": 262400, "vocab_size_per_layer_input": 262144,
        "hidden_size": 2048, "hidden_size_per_layer_input": 256, "intermediate_size": 16384,
        "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "max_position_embeddings": 32768, "sliding_window": 512, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "attention_bias": False,
        "attention_dropout": 0.0, "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0,
        "altup_active_idx": 0, "altup_coef_clip": 120.0, "altup_correct_scale": True,
        "altup_lr_multiplier": 1.0, "altup_num_inputs": 4, "laurel_rank": 64, "num_kv_shared_layers": 15,
        "query_pre_attn_scalar": 256, "torch_dtype": "bfloat16",
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
    },
}  # fmt: skip

# state-spaces/mamba-130m-hf
MAMBA_130M: dict[str, Any] = {
    "architectures": ["MambaForCausalLM"], "model_type": "mamba", "num_hidden_layers": 24, "hidden_size": 768,
    "intermediate_size": 1536, "state_size": 16, "conv_kernel": 4, "time_step_rank": 48, "vocab_size": 50280,
}  # fmt: skip

# google-t5/t5-base-shaped T5 (encoder-decoder).
T5_BASE: dict[str, Any] = {
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64, "d_model": 768,
    "decoder_start_token_id": 0, "dense_act_fn": "relu", "dropout_rate": 0.1, "eos_token_id": 1,
    "feed_forward_proj": "relu", "initializer_factor": 1.0, "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512, "num_decoder_layers": 12,
    "num_heads": 12, "num_layers": 12, "output_past": True, "pad_token_id": 0,
    "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32, "tie_word_embeddings": False,
    "torch_dtype": "float32", "use_cache": True, "vocab_size": 32128,
}  # fmt: skip

# Qwen3-Next (RedHatAI/Qwen3-Coder-Next-NVFP4's shape, quantization_config left out): three Gated
# DeltaNet linear-attention layers for each full-attention layer.
QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "bos_token_id": 151643,
    "eos_token_id": 151645, "decoder_sparse_step": 1, "full_attention_interval": 4, "head_dim": 256,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5120,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 12, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mlp_only_layers": [],
    "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512,
    "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "vocab_size": 151936,
}  # fmt: skip

# Qwen3's documented long-context setting (Qwen/Qwen3-8B model card, "Processing Long Texts").
QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def catalog_config(model: str) -> dict[str, Any]:
    return copy.deepcopy(dict(model_catalog()[model.lower()].config))


def qwen3_8b() -> dict[str, Any]:
    return catalog_config("Qwen/Qwen3-8B")


def plan(**fields: Any) -> Any:
    return plan_inference_model(parse_spec(fields))


def refusal(**fields: Any) -> SpecError:
    with pytest.raises(SpecError) as err:
        plan(**fields)
    return err.value


# ---- the context window, as vLLM derives it ----


def test_yarn_serves_original_times_factor_whatever_max_position_embeddings() -> None:
    # Qwen3-8B states 40,960 positions; YaRN factor 4 over the original 32,768 gives 131,072.
    config = {**qwen3_8b(), "rope_scaling": QWEN3_YARN}
    assert parse_hf_config(config).max_position_embeddings == 131072
    assert parse_hf_config(qwen3_8b()).max_position_embeddings == 40960


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 131072),  # llama3: the config states the extended window
        ("microsoft/Phi-3.5-mini-instruct", 131072),  # longrope: likewise
        ("google/gemma-3-27b-it", 131072),  # Gemma 3's linear factor 8 is already in its window
        ("deepseek-ai/DeepSeek-V3", 163840),  # YaRN 40 × 4,096
    ],
)
def test_rope_types_that_state_their_window_are_not_scaled_again(model: str, window: int) -> None:
    assert parse_hf_config(catalog_config(model)).max_position_embeddings == window


def test_linear_rope_scaling_multiplies_the_window() -> None:
    config = {
        **LLAMA_8B,
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    }
    assert parse_hf_config(config).max_position_embeddings == 8192


def test_a_window_beyond_the_config_is_refused_naming_rope_scaling() -> None:
    err = refusal(model={"name": "Qwen/Qwen3-8B"}, maxModelLen=131072)
    assert err.field == "spec.maxModelLen" and "40960" in err.problem
    assert "rope scaling" in err.fix and "--hf-overrides" in err.fix and "yarn" in err.fix


def test_a_model_with_learned_positions_is_not_told_to_scale_rope() -> None:
    err = refusal(model={"name": "BAAI/bge-m3", "config": BGE_M3}, maxModelLen=16384)
    assert err.field == "spec.maxModelLen" and "rope" not in err.fix


def test_hf_overrides_in_extra_args_size_the_plan() -> None:
    overrides = json.dumps({"rope_scaling": QWEN3_YARN})
    planned = plan(
        model={"name": "Qwen/Qwen3-8B"},
        maxModelLen=131072,
        engine={"extraArgs": ["--hf-overrides", overrides]},
    )
    assert planned.settings.max_model_len == 131072
    assert planned.budget.max_concurrency >= 1


def test_hf_overrides_that_are_not_a_json_object_are_refused() -> None:
    err = refusal(model={"name": "Qwen/Qwen3-8B"}, engine={"extraArgs": ["--hf-overrides", "rope=yarn"]})
    assert err.field == "spec.engine.extraArgs[0]" and "JSON object" in err.problem


# ---- encoder-only and pooling models ----


def test_an_encoder_only_embedding_model_has_no_kv_cache_head_or_sampler() -> None:
    planned = plan(model={"name": "BAAI/bge-m3", "config": BGE_M3}, maxModelLen=8192, concurrency=64)
    budget = planned.budget
    assert budget.kv_cache_gib == 0 and budget.kv_bytes_per_token == 0
    assert budget.sampler_warmup_gib == 0
    assert planned.chosen.label == "L4x1 (TP1)"  # 0.57B parameters: one L4, not four
    counts = count_parameters(planned.model.architecture)
    assert counts.lm_head == 0
    assert counts.embedding == (250002 + 8194 + 1) * 1024  # tokens, positions and token types


def test_a_decoder_run_by_the_pooling_runner_is_sized_as_a_pooling_model() -> None:
    model = {"name": "Qwen/Qwen3-Embedding-0.6B", "config": QWEN3_EMBEDDING}
    pooled = plan(model=model, concurrency=64, engine={"extraArgs": ["--runner", "pooling"]})
    assert pooled.chosen.label == "L4x1 (TP1)"
    assert pooled.budget.sampler_warmup_gib == 0
    assert pooled.settings.max_model_len == 32768
    # The same config generating text holds 64 sequences of 32,768 tokens: far more than an L4.
    generating = plan(model=model, concurrency=64)
    assert generating.chosen.gpu.memory_gib * generating.chosen.gpus > 24


def test_older_releases_name_the_pooling_task_with_task() -> None:
    model = {"name": "Qwen/Qwen3-Embedding-0.6B", "config": QWEN3_EMBEDDING}
    planned = plan(model=model, concurrency=64, engine={"version": "0.8.5", "extraArgs": ["--task", "embed"]})
    assert planned.model.architecture.kind == "pooling"


def test_a_sequence_classification_class_is_a_pooling_model() -> None:
    config = {**QWEN3_EMBEDDING, "architectures": ["Qwen3ForSequenceClassification"]}
    arch = parse_hf_config(config)
    assert arch.kind == "pooling" and count_parameters(arch).lm_head == 0


# ---- kinds refused by name ----


@pytest.mark.parametrize(
    ("config", "name", "why"),
    [
        (T5_BASE, "T5ForConditionalGeneration", "encoder-decoder"),
        (QWEN3_NEXT, "Qwen3NextForCausalLM", "hybrid"),
    ],
)
def test_kinds_loadline_does_not_size_are_refused_by_name(
    config: dict[str, Any], name: str, why: str
) -> None:
    with pytest.raises(ModelConfigError) as err:
        plan(model={"name": "x/y", "config": config}, maxModelLen=512)
    assert err.value.field == "spec.model.config.architectures"
    assert name in err.value.problem and why in err.value.problem
    assert "num_attention_heads" not in str(err.value)
    assert err.value.fix


def test_an_unlisted_hybrid_is_recognised_by_its_layer_types() -> None:
    config = {**QWEN3_NEXT, "architectures": ["SomeHybridForCausalLM"], "model_type": "some_hybrid"}
    with pytest.raises(ModelConfigError) as err:
        parse_hf_config(config)
    assert "hybrid" in err.value.problem


# ---- Gemma 3n: per-layer embeddings, shared KV layers ----


def test_gemma_3n_per_layer_embeddings_are_counted_in_the_weights() -> None:
    counts = count_parameters(parse_hf_config(GEMMA_3N_E4B))
    per_layer_table = 262144 * 35 * 256
    assert counts.embedding == 262400 * 2048 + per_layer_table
    # The text model has ~6.9B parameters (the "E4B" is its effective size without the tables).
    assert 6.7e9 < counts.total < 7.0e9


def test_gemma_3n_kv_sharing_layers_have_no_cache_of_their_own() -> None:
    planned = plan(model={"name": "google/gemma-3n-E4B-it", "config": GEMMA_3N_E4B}, maxModelLen=32768)
    # 20 of 35 layers keep a cache: 2 (K, V) × 2 heads × 256 × 2 bytes each.
    assert planned.budget.kv_bytes_per_token == 20 * 2 * 2 * 256 * 2
    assert planned.budget.weights_gib > 12.5  # 6.9B parameters in bfloat16


def test_rope_scaling_flag_of_older_releases_sizes_the_plan_too() -> None:
    planned = plan(
        model={"name": "Qwen/Qwen3-8B"},
        maxModelLen=131072,
        engine={"version": "0.10.1", "extraArgs": [f"--rope-scaling={json.dumps(QWEN3_YARN)}"]},
    )
    assert planned.settings.max_model_len == 131072


def test_dotted_hf_overrides_keys_size_the_plan() -> None:
    planned = plan(
        model={"name": "Qwen/Qwen3-8B"},
        maxModelLen=131072,
        engine={"extraArgs": [f"--hf-overrides.rope_scaling={json.dumps(QWEN3_YARN)}"]},
    )
    assert planned.settings.max_model_len == 131072


def test_gemma_4_kv_sharing_layers_have_double_wide_mlps() -> None:
    # google/gemma-4-E2B's text_config keys that decide the weights (sources: SOURCES.md).
    text = {
        "model_type": "gemma4_text", "hidden_size": 1536, "num_hidden_layers": 35, "intermediate_size": 6144,
        "num_attention_heads": 8, "head_dim": 256, "num_key_value_heads": 1, "num_kv_shared_layers": 20,
        "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144, "vocab_size": 262144,
        "sliding_window": 512, "max_position_embeddings": 131072, "use_double_wide_mlp": True,
        "tie_word_embeddings": True,
    }  # fmt: skip
    wide = count_parameters(parse_hf_config({"model_type": "gemma4", "text_config": text}))
    narrow = count_parameters(
        parse_hf_config({"model_type": "gemma4", "text_config": {**text, "use_double_wide_mlp": False}})
    )
    assert wide.dense_mlp - narrow.dense_mlp == 20 * 3 * 1536 * 6144
    assert wide.embedding == 262144 * 1536 + 262144 * 35 * 256


def test_an_unlisted_model_class_defaults_to_the_pooling_runner_as_in_vllm() -> None:
    # "Qwen3Model" is no registered class: vLLM runs it as Qwen3ForCausalLM through the pooling adapter.
    assert parse_hf_config({**QWEN3_EMBEDDING, "architectures": ["Qwen3Model"]}).kind == "pooling"
    # "ChatGLMModel" is registered as a text-generation class.
    assert parse_hf_config({**QWEN3_EMBEDDING, "architectures": ["ChatGLMModel"]}).kind == "decoder"


# ---- state-space models: a fixed state per sequence ----


def test_a_mamba_model_is_sized_by_its_state_per_sequence_not_per_token() -> None:
    model = {"name": "state-spaces/mamba-130m-hf", "config": MAMBA_130M}
    short = plan(model=model, maxModelLen=2048, concurrency=64)
    long = plan(model=model, maxModelLen=32768, concurrency=64)
    assert short.chosen.label == "L4x1 (TP1)"
    assert long.chosen.label == "L4x1 (TP1)"
    # vLLM's Mamba state per sequence and layer: conv (4 - 1) × 1536 and SSM 1536 × 16, bfloat16.
    per_sequence = 24 * (3 * 1536 + 1536 * 16) * 2
    for planned in (short, long):
        budget = planned.budget
        assert budget.gpu_blocks == int(budget.kv_cache_gib * 1024**3 // per_sequence)
        assert budget.max_concurrency == budget.gpu_blocks  # one block holds a whole sequence
    counts = count_parameters(short.model.architecture)
    assert 128e6 < counts.total < 131e6  # "130m"
    assert counts.lm_head == 0  # tied, as transformers' MambaConfig by default


def test_mamba_2_state_follows_vllms_shapes_under_tensor_parallelism() -> None:
    # Mamba 2 at the shape vLLM's MambaStateShapeCalculator comments on (128 heads × 64 × state 128),
    # 8 groups, as Mamba-Codestral-7B.
    config = {
        "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 4096,
        "num_hidden_layers": 64, "vocab_size": 32768, "state_size": 128, "expand": 2, "conv_kernel": 4,
        "n_groups": 8, "num_heads": 128, "head_dim": 64, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    arch = parse_hf_config(config)
    inner = 8192
    assert _state_bytes_per_layer(arch, "bfloat16", 1) == (3 * (inner + 2 * 8 * 128) + 128 * 64 * 128) * 2
    assert _state_bytes_per_layer(arch, "bfloat16", 2) == (3 * (inner + 2 * 8 * 128) // 2 + 64 * 64 * 128) * 2
