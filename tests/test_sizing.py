"""Architecture parsing and the per-GPU memory budget (no catalog needed: configs are inline)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loadline.errors import ModelConfigError, SpecError
from loadline.sizing import EngineSettings, compute_budget, count_parameters, engine_version, parse_hf_config
from loadline.sizing._budget import kv_bytes_per_layer_token

GEMMA2_2B: dict[str, Any] = {
    "model_type": "gemma2",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "num_hidden_layers": 26,
    "vocab_size": 256000,
    "sliding_window": 4096,
    "max_position_embeddings": 8192,
    "torch_dtype": "float32",
}

DEEPSEEK_V2_LITE: dict[str, Any] = {
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 27,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "vocab_size": 102400,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
}


def settings(**overrides: Any) -> EngineSettings:
    base: dict[str, Any] = {
        "dtype": "bfloat16",
        "quantization": "none",
        "kv_cache_dtype": "auto",
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.95,
        "max_model_len": 8192,
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 8192,
        "enforce_eager": False,
        "cuda_graph_in_kv_budget": False,
        "block_size": 16,
    }
    base.update(overrides)
    return EngineSettings(**base)


def test_dense_gqa_counts_exactly_the_published_parameters(llama_8b_config: dict[str, Any]) -> None:
    arch = parse_hf_config(llama_8b_config)
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (32, 8, 128)
    # meta-llama/Llama-3.1-8B-Instruct has 8,030,261,248 parameters (safetensors metadata).
    assert count_parameters(arch).total == 8_030_261_248


def test_kv_bytes_per_token_follow_layers_heads_and_dtype(llama_8b_config: dict[str, Any]) -> None:
    arch = parse_hf_config(llama_8b_config)
    assert kv_bytes_per_layer_token(arch, settings()) == 2 * 8 * 128 * 2
    assert kv_bytes_per_layer_token(arch, settings(kv_cache_dtype="fp8")) == 2 * 8 * 128
    assert kv_bytes_per_layer_token(arch, settings(tensor_parallel_size=2)) == 2 * 4 * 128 * 2
    # More ranks than KV heads: each rank keeps one replicated head.
    assert kv_bytes_per_layer_token(arch, settings(tensor_parallel_size=16)) == 2 * 1 * 128 * 2


def test_kv_pool_is_what_utilization_leaves_and_does_not_depend_on_max_model_len(
    llama_8b_config: dict[str, Any],
) -> None:
    arch = parse_hf_config(llama_8b_config)
    short = compute_budget(arch, settings(max_model_len=2048), 79.19)
    long = compute_budget(arch, settings(max_model_len=32768), 79.19)
    assert short.kv_cache_gib == long.kv_cache_gib
    assert long.max_concurrency == pytest.approx(short.max_concurrency / 16, rel=0.01)
    expected = 79.19 * 0.95 - short.weights_gib - short.activation_gib - short.non_torch_gib
    assert short.kv_cache_gib == pytest.approx(expected, abs=1e-6)
    fp8 = compute_budget(arch, settings(kv_cache_dtype="fp8"), 79.19)
    assert fp8.kv_cache_tokens == pytest.approx(2 * short.kv_cache_tokens, rel=0.001)


def test_cuda_graphs_cost_nothing_with_enforce_eager_and_count_in_budget_when_the_version_does(
    llama_8b_config: dict[str, Any],
) -> None:
    arch = parse_hf_config(llama_8b_config)
    eager = compute_budget(arch, settings(enforce_eager=True), 79.19)
    graphs = compute_budget(arch, settings(), 79.19)
    counted = compute_budget(arch, settings(cuda_graph_in_kv_budget=True), 79.19)
    assert eager.cuda_graph_gib == 0
    assert graphs.cuda_graph_gib > 0.3
    assert counted.kv_cache_gib == pytest.approx(graphs.kv_cache_gib - graphs.cuda_graph_gib)


def test_tensor_parallel_splits_weights_but_adds_non_torch_memory(llama_8b_config: dict[str, Any]) -> None:
    arch = parse_hf_config(llama_8b_config)
    tp1 = compute_budget(arch, settings(), 79.19)
    tp2 = compute_budget(arch, settings(tensor_parallel_size=2), 79.19)
    assert tp2.weights_gib == pytest.approx(tp1.weights_gib / 2)
    assert tp2.non_torch_gib > tp1.non_torch_gib + 1.5  # NCCL buffers, as the calibration logs show


def test_quantized_checkpoint_config_sets_the_bit_width(llama_8b_config: dict[str, Any]) -> None:
    cfg = copy.deepcopy(llama_8b_config)
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 128}}},
        "ignore": ["lm_head"],
    }
    arch = parse_hf_config(cfg)
    assert (
        arch.quantization is not None and arch.quantization.bits == 4 and arch.quantization.group_size == 128
    )
    w4 = compute_budget(arch, settings(dtype="float16", quantization="compressed-tensors"), 79.19)
    bf16 = compute_budget(parse_hf_config(llama_8b_config), settings(), 79.19)
    # Linear layers shrink 4x (plus scales); embeddings and LM head stay 16-bit.
    assert 5.0 < w4.weights_gib < 5.6 < bf16.weights_gib / 2


def test_sliding_window_layers_are_grouped_like_vllms_hybrid_allocator() -> None:
    arch = parse_hf_config(GEMMA2_2B)
    assert arch.layer_types.count("sliding") == 13 and arch.layer_types.count("full") == 13
    budget = compute_budget(arch, settings(), 79.19)
    # vLLM reports tokens as if all 26 layers held every token (calibration P29: 670,160 tokens).
    assert budget.kv_cache_tokens == pytest.approx(670_160, rel=0.01)
    # At 64K tokens per sequence the sliding layers keep only window + one step of tokens, so more
    # sequences fit than the all-layers token count suggests (but fewer than if every layer slid).
    long = compute_budget(arch, settings(max_model_len=65536), 79.19)
    assert long.kv_cache_tokens / 65536 < long.max_concurrency < 2 * long.kv_cache_tokens / 65536


def test_mla_caches_one_latent_per_token_replicated_across_ranks() -> None:
    arch = parse_hf_config(DEEPSEEK_V2_LITE)
    assert arch.is_mla and arch.is_moe and arch.num_dense_layers == 1
    assert kv_bytes_per_layer_token(arch, settings()) == (512 + 64) * 2
    assert kv_bytes_per_layer_token(arch, settings(tensor_parallel_size=4)) == (512 + 64) * 2
    counts = count_parameters(arch)
    # DeepSeek-V2-Lite: 15.7B parameters in total, most of them routed experts.
    assert 15.2e9 < counts.total < 16.2e9
    assert counts.experts > 0.8 * counts.total


def test_multimodal_text_config_is_read_and_vision_tower_counted() -> None:
    text = {k: v for k, v in GEMMA2_2B.items() if k != "model_type"} | {"model_type": "gemma3_text"}
    cfg = {
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": {"num_hidden_layers": 27, "hidden_size": 1152, "intermediate_size": 4304},
    }
    arch = parse_hf_config(cfg)
    assert arch.num_layers == 26 and arch.vision is not None
    assert arch.layer_types.count("full") == 4  # Gemma 3: every sixth layer is global
    assert 0.35e9 < count_parameters(arch).vision < 0.45e9


def test_tied_embeddings_have_no_separate_lm_head(llama_8b_config: dict[str, Any]) -> None:
    llama_8b_config["tie_word_embeddings"] = True
    counts = count_parameters(parse_hf_config(llama_8b_config))
    assert counts.lm_head == 0


def test_missing_key_is_named(llama_8b_config: dict[str, Any]) -> None:
    del llama_8b_config["num_attention_heads"]
    with pytest.raises(ModelConfigError) as caught:
        parse_hf_config(llama_8b_config)
    assert caught.value.field == "spec.model.config.num_attention_heads"


def test_too_little_memory_reports_the_shortfall(llama_8b_config: dict[str, Any]) -> None:
    arch = parse_hf_config(llama_8b_config)
    budget = compute_budget(arch, settings(gpu_memory_utilization=0.9, max_num_seqs=256), 14.75)
    assert not budget.fits
    assert "short" in budget.problems[0] and "GiB" in budget.problems[0]


def test_engine_versions_are_data_with_vllm_defaults() -> None:
    table = engine_version("0.19.0")
    assert table.gpu_memory_utilization == 0.9
    assert table.batch_default("H100-80GB", 79.19).max_num_seqs == 1024
    assert table.batch_default("H100-80GB", 79.19).max_num_batched_tokens == 8192
    # A100s keep the small defaults (vLLM PR #17885), as do 24 GiB cards.
    assert table.batch_default("A100-80GB", 79.15).max_num_batched_tokens == 2048
    assert table.batch_default("L4", 22.05).max_num_seqs == 256
    with pytest.raises(SpecError, match="predates the V1 engine"):
        engine_version("0.6.3")
