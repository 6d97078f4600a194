"""The planner: cheapest feasible GPU layout, explained rejections, capacity-aware fallback."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loadline.api import parse_inference_model
from loadline.errors import NoFeasiblePlanError, SpecError
from loadline.sizing import plan_inference_model
from tests.conftest import LLAMA_8B, inference_model

LLAMA_70B = LLAMA_8B | {
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
}
LLAMA_405B = LLAMA_8B | {
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "num_attention_heads": 128,
    "num_hidden_layers": 126,
}


def plan(free_gpus: dict[str, list[int]] | None = None, config: dict[str, Any] | None = None, **spec: Any):  # type: ignore[no-untyped-def]
    doc = inference_model(**spec)
    if config is not None:
        doc["spec"]["model"]["config"] = copy.deepcopy(config)
    return plan_inference_model(parse_inference_model(doc).spec, free_gpus=free_gpus)


def test_small_model_gets_the_cheapest_single_gpu() -> None:
    result = plan(maxModelLen=8192, concurrency=4, gpu={"types": ["L4", "L40S", "A100-80GB", "H100-80GB"]})
    assert result.chosen.gpu.name == "L4" and result.chosen.gpus == 1
    assert result.budget.max_concurrency >= 4
    summary = result.summary().model_dump(by_alias=True, mode="json")
    assert summary["gpu"] == "L4x1" and summary["gpuProduct"] == "NVIDIA-L4"
    assert summary["maxNumSeqs"] == 256 and summary["maxNumBatchedTokens"] == 2048  # vLLM's L4 defaults


def test_concurrency_decides_between_tiers() -> None:
    small = plan(maxModelLen=32768, concurrency=1)
    big = plan(maxModelLen=32768, concurrency=64)
    assert small.chosen.price_per_hour < big.chosen.price_per_hour
    assert big.budget.max_concurrency >= 64


def test_every_rejection_says_why_with_the_shortfall_in_gib() -> None:
    result = plan(
        config=LLAMA_70B, maxModelLen=8192, concurrency=8, gpu={"types": ["L4", "L40S", "H100-80GB"]}
    )
    assert result.chosen.gpus >= 2
    assert result.rejected
    for candidate in result.rejected:
        reason = candidate.rejection
        assert "GiB" in reason or "costs $" in reason, reason
    memory_rejections = [c for c in result.rejected if "short" in c.rejection]
    assert any(c.gpu.name == "L4" and c.gpus == 1 for c in memory_rejections)


def test_tensor_parallel_divides_the_attention_heads() -> None:
    heads_28 = LLAMA_8B | {"num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584}
    result = plan(config=heads_28, maxModelLen=32768, concurrency=300, gpu={"types": ["L4", "A100-80GB"]})
    assert result.chosen.gpus > 1
    for candidate in result.candidates:
        assert 28 % candidate.tensor_parallel_size == 0


def test_model_too_big_for_one_node_goes_multi_node_with_pipeline_parallel() -> None:
    result = plan(config=LLAMA_405B, maxModelLen=8192, concurrency=4, gpu={"types": ["H100-80GB"]})
    assert result.chosen.nodes == 2
    assert result.chosen.tensor_parallel_size == 8 and result.chosen.pipeline_parallel_size == 2
    assert any("x8" in c.label and "short" in c.rejection for c in result.rejected)


def test_multi_node_disallowed_means_no_plan_with_reasons() -> None:
    with pytest.raises(NoFeasiblePlanError) as caught:
        plan(config=LLAMA_405B, maxModelLen=8192, gpu={"types": ["H100-80GB"], "allowMultiNode": False})
    assert caught.value.rejections
    assert all("short" in line and "GiB" in line for line in caught.value.rejections)


def test_gpu_without_bf16_is_rejected_for_bf16() -> None:
    result = plan(dtype="bfloat16", maxModelLen=4096, gpu={"types": ["T4", "L4"]})
    t4 = [c for c in result.candidates if c.gpu.name == "T4"]
    assert t4 and "bfloat16" in t4[0].rejection
    assert result.chosen.gpu.name == "L4"


def test_max_model_len_beyond_the_model_is_a_spec_error() -> None:
    with pytest.raises(SpecError) as caught:
        plan(maxModelLen=262144)
    assert caught.value.field == "spec.maxModelLen"
    assert "131072" in str(caught.value)


def test_unknown_gpu_type_is_named() -> None:
    with pytest.raises(SpecError) as caught:
        plan(gpu={"types": ["RTX-9090"]})
    assert caught.value.field == "spec.gpu.types"
    assert "H100-80GB" in str(caught.value)


def test_absent_capacity_falls_back_to_the_next_feasible_type_and_says_so() -> None:
    # Cheapest: one L40S (g6e.xlarge); two L4 need a 2-GPU instance (g2-standard-24), which costs more.
    free = {"L4": [4], "L40S": [], "H100-80GB": [8]}
    result = plan(free_gpus=free, maxModelLen=8192, concurrency=8, gpu={"types": ["L4", "L40S", "H100-80GB"]})
    assert result.chosen.gpu.name == "L4" and result.chosen.gpus == 2
    assert result.fallback_from == "L40S"
    assert result.summary().model_dump(by_alias=True, mode="json")["fallbackFrom"] == "L40S"


def test_fallback_refused_when_the_spec_forbids_it() -> None:
    with pytest.raises(NoFeasiblePlanError, match="allowFallback"):
        plan(
            free_gpus={"L4": [0], "L40S": [4]},
            maxModelLen=8192,
            gpu={"types": ["L4", "L40S"], "allowFallback": False},
        )


def test_pinned_max_num_seqs_that_breaks_sampler_warmup_is_not_planned_as_fitting() -> None:
    # 1024 dummy requests × a 256K vocabulary need ~2 GiB of float32 logits above the utilization line.
    big_vocab = LLAMA_8B | {"vocab_size": 262144}
    with pytest.raises(NoFeasiblePlanError) as caught:
        plan(
            config=big_vocab,
            maxModelLen=8192,
            engine={"gpuMemoryUtilization": 0.98, "maxNumSeqs": 1024},
            gpu={"types": ["H100-80GB"], "maxGPUsPerReplica": 1},
        )
    assert "sampler warm-up" in caught.value.rejections[0]


def test_planner_lowers_its_own_max_num_seqs_to_pass_sampler_warmup() -> None:
    big_vocab = LLAMA_8B | {"vocab_size": 262144}
    result = plan(
        config=big_vocab,
        maxModelLen=8192,
        engine={"gpuMemoryUtilization": 0.98},
        gpu={"types": ["H100-80GB"], "maxGPUsPerReplica": 1},
    )
    assert result.settings.max_num_seqs < 1024
    assert result.budget.fits


def test_an_rdma_note_stays_on_its_own_gpus_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU type without RDMA whose layouts are all below ``min_gpus`` is considered for nothing, so
    its "no RDMA fabric" note must not land on the verdict before it, another GPU's."""
    from types import SimpleNamespace

    from loadline.sizing import _plan

    spans, local = SimpleNamespace(name="SPANS"), SimpleNamespace(name="LOCAL")
    key = (False, False, 1.0, 16, 2)
    plans = [
        (spans, "", 8, True, None, [(8, 1, 2, 16)]),  # one layout of 16 GPUs, 8 per node: infeasible
        (local, "", 8, False, None, [(4, 1, 1, 4), (8, 1, 1, 8)]),  # none reaches min_gpus=16
    ]
    monkeypatch.setattr(_plan, "_type_plans", lambda *args: plans)
    monkeypatch.setattr(_plan, "_placements", lambda *args: None)
    monkeypatch.setattr(_plan, "_context", lambda inputs, gpu: None)
    monkeypatch.setattr(
        _plan,
        "_judge",
        lambda inputs, terms, placements, catalog, gpu, context, row, per_block: (
            gpu, row[0], row[1], row[2], False, key, None, "does not fit", (),
        ),
    )  # fmt: skip
    inputs = SimpleNamespace(max_model_len=4096)
    terms = SimpleNamespace(block_size=16)
    verdicts = _plan._verdicts(inputs, ["SPANS", "LOCAL"], 16, True, 16, 0.0, "", terms)  # type: ignore[arg-type]
    assert [(v[0].name, v[8]) for v in verdicts] == [("SPANS", ())]


# ---- kernel alignment bounds tensor parallelism (sizing/data/quantization.json tp_alignment) ----

#: Qwen3-Coder-480B-A35B-Instruct-FP8's shapes: block-fp8 experts of 2560, which TP 8 cuts into 320 per
#: rank, not a whole number of 128-wide blocks (vLLM: "The output_size of gate's and up's weight = 320
#: is not divisible by weight quantization block_n = 128").
QWEN3_CODER_FP8 = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 6144,
    "intermediate_size": 8192,
    "moe_intermediate_size": 2560,
    "num_experts": 160,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 62,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}


def test_block_fp8_moe_skips_a_tensor_parallel_size_that_cuts_through_a_block() -> None:
    result = plan(config=QWEN3_CODER_FP8, maxModelLen=32768, concurrency=8, gpu={"types": ["H100-80GB"]})
    chosen = result.chosen
    assert chosen.gpus == 8
    assert (chosen.tensor_parallel_size, chosen.pipeline_parallel_size) == (4, 2)
    [note] = result.layout_notes
    assert "TP 8 skipped" in note and "320" in note and "weight_block_size [128, 128]" in note
    assert note in result.summary().model_dump(by_alias=True, mode="json")["tuning"]


def test_the_same_moe_without_blocks_keeps_tensor_parallel_8() -> None:
    config = QWEN3_CODER_FP8 | {
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}
    }
    result = plan(config=config, maxModelLen=32768, concurrency=8, gpu={"types": ["H100-80GB"]})
    assert (result.chosen.tensor_parallel_size, result.chosen.pipeline_parallel_size) == (8, 1)
    assert result.layout_notes == ()


def test_a_refusal_names_the_alignment_that_ruled_tensor_parallelism_out() -> None:
    # One node of 8 and no pipeline stages across nodes: TP 8 is the only way to 8 GPUs, and it is skipped.
    with pytest.raises(NoFeasiblePlanError) as caught:
        plan(
            config=QWEN3_CODER_FP8 | {"num_hidden_layers": 1},
            maxModelLen=262144,
            concurrency=512,
            gpu={"types": ["H100-80GB"], "maxGPUsPerReplica": 8},
        )
    assert "kernel alignment: TP 8 skipped" in str(caught.value)
    assert "not a multiple of the checkpoint's weight_block_size [128, 128]" in str(caught.value)


# ---- a refusal under a GPU cap names the quantization that would fit ----


def test_a_refusal_under_a_gpu_cap_names_the_online_quantization_that_fits() -> None:
    # bf16 Llama-3.1-8B on one L4 (the cap): 15 GiB of weights leave ~3 GiB of KV, short of two 32K
    # sequences (8 GiB); fp8 weights (8 GiB) leave room for them.
    with pytest.raises(NoFeasiblePlanError) as caught:
        plan(maxModelLen=32768, concurrency=2, gpu={"types": ["L4"], "maxGPUsPerReplica": 1})
    error = caught.value
    assert "fp8 weights fit 1 × L4 (L4x1 (TP1); set spec.quantization: fp8)" in str(error)
    assert {"quantization": "fp8"} in error.fixes
    quantized = plan(
        maxModelLen=32768, concurrency=2, quantization="fp8", gpu={"types": ["L4"], "maxGPUsPerReplica": 1}
    )
    assert quantized.chosen.label == "L4x1 (TP1)"


def test_no_quantization_is_suggested_where_the_gpu_has_no_kernels_for_it() -> None:
    # T4 (compute capability 7.5) has no fp8 kernels in vLLM; bitsandbytes 4-bit is the online method left.
    with pytest.raises(NoFeasiblePlanError) as caught:
        plan(dtype="float16", maxModelLen=32768, concurrency=2, gpu={"types": ["T4"], "maxGPUsPerReplica": 1})
    assert "fp8 weights" not in str(caught.value)
    assert "bitsandbytes weights fit 1 × T4" in str(caught.value)


def test_tensor_parallel_plans_charge_non_torch_memory_by_the_gpus_interconnect() -> None:
    pcie = plan(config=LLAMA_70B, maxModelLen=8192, concurrency=8, gpu={"types": ["L40S"]})
    nvlink = plan(config=LLAMA_70B, maxModelLen=8192, concurrency=8, gpu={"types": ["H100-80GB"]})
    assert pcie.chosen.tensor_parallel_size >= 2 and nvlink.chosen.tensor_parallel_size >= 2
    assert pcie.budget.non_torch_gib < 0.2 < 2.0 < nvlink.budget.non_torch_gib
    assert pcie.summary().model_dump(by_alias=True, mode="json")["memory"]["nonTorchGiB"] == round(
        pcie.budget.non_torch_gib, 2
    )
