"""Tune before scale: settings that serve the concurrency on fewer GPUs, and refusals whose fix works."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loadline.api import parse_inference_model
from loadline.errors import NoFeasiblePlanError
from loadline.sizing import Plan, compute_budget, plan_inference_model
from loadline.sizing._tune import MAX_UTILIZATION, SAFE_HEADROOM_GIB
from tests.conftest import inference_model

ONE_L4 = {"types": ["L4"], "maxGPUsPerReplica": 1}


def plan(**spec: Any) -> Plan:
    return plan_inference_model(parse_inference_model(inference_model(**spec)).spec)


def test_defaults_are_kept_when_they_serve() -> None:
    result = plan(maxModelLen=8192, concurrency=4, gpu=ONE_L4)
    s = result.settings
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.gpu_memory_utilization) == (256, 2048, 0.9)
    assert (
        result.summary()
        .model_dump(by_alias=True, mode="json")["tuning"][0]
        .startswith("vLLM's defaults serve concurrency 4")
    )


def test_tuning_serves_a_concurrency_the_defaults_cannot_on_the_same_gpu() -> None:
    # vLLM's defaults hold 4.16 sequences of 8K on one L4; concurrency 5 fits after tuning, not 2 GPUs.
    result = plan(maxModelLen=8192, concurrency=5, gpu={"types": ["L4"]})
    assert result.chosen.gpus == 1
    s = result.settings
    assert s.max_num_seqs >= 5 and s.max_num_batched_tokens >= s.max_num_seqs
    assert 0.9 <= s.gpu_memory_utilization <= MAX_UTILIZATION
    # Re-check the chosen settings independently: vLLM would start and hold the concurrency.
    arch = result.model.architecture
    budget = compute_budget(arch, s, result.chosen.gpu.memory_gib)
    assert budget.fits and budget.max_concurrency >= 5
    assert budget.startup_headroom_gib >= budget.sampler_warmup_gib + SAFE_HEADROOM_GIB - 0.01
    summary = result.summary().model_dump(by_alias=True, mode="json")
    assert (
        summary["maxNumSeqs"] == s.max_num_seqs
        and summary["gpuMemoryUtilization"] == s.gpu_memory_utilization
    )
    assert any(
        note.startswith("max-num-seqs") or note.startswith("gpu-memory-utilization")
        for note in summary["tuning"]
    )


def test_tuning_never_changes_what_the_spec_pins() -> None:
    pinned = {"maxNumSeqs": 256, "maxNumBatchedTokens": 2048, "gpuMemoryUtilization": 0.9}
    with pytest.raises(NoFeasiblePlanError):
        plan(maxModelLen=8192, concurrency=5, gpu=ONE_L4, engine=pinned)


def test_enforce_eager_is_the_last_rung_and_is_reported() -> None:
    # 11 sequences of 4K on one L4 fit only once the CUDA-graph pool (0.9 GiB) is freed.
    result = plan(maxModelLen=4096, concurrency=11, gpu=ONE_L4)
    s = result.settings
    assert s.enforce_eager and result.summary().model_dump(by_alias=True, mode="json")["enforceEager"] is True
    assert any(
        note.startswith("enforce-eager")
        for note in result.summary().model_dump(by_alias=True, mode="json")["tuning"]
    )
    assert result.budget.max_concurrency >= 11 and result.budget.cuda_graph_gib == 0
    # One sequence less fits with CUDA graphs: eager mode is not chosen when something cheaper works.
    assert not plan(maxModelLen=4096, concurrency=10, gpu=ONE_L4).settings.enforce_eager


def _apply(spec: dict[str, Any], fix: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    for path, value in fix.items():
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


@pytest.mark.parametrize(
    "spec",
    [
        {"maxModelLen": 131072, "concurrency": 4, "gpu": ONE_L4},
        {"maxModelLen": 8192, "concurrency": 8, "gpu": ONE_L4},
        {
            "model": {"name": "meta-llama/Llama-3.3-70B-Instruct"},
            "maxModelLen": 32768,
            "concurrency": 16,
            "gpu": {"types": ["L4", "L40S"], "maxGPUsPerReplica": 2},
        },
    ],
)
def test_every_fix_of_a_refusal_is_replanned_and_works(spec: dict[str, Any]) -> None:
    with pytest.raises(NoFeasiblePlanError) as caught:
        plan(**spec)
    fixes = caught.value.fixes
    assert fixes, str(caught.value)
    for fix in fixes:
        fixed = plan(**_apply(spec, fix))
        assert fixed.budget.max_concurrency >= fixed.inputs.concurrency, fix
    for fix in fixes:  # and the message says the same numbers
        for value in fix.values():
            shown = value[-1] if isinstance(value, list) else value
            assert str(shown) in str(caught.value)


def test_a_fix_on_max_model_len_is_the_largest_that_fits() -> None:
    spec = {"maxModelLen": 131072, "concurrency": 4, "gpu": ONE_L4}
    with pytest.raises(NoFeasiblePlanError) as caught:
        plan(**spec)
    length = next(f["maxModelLen"] for f in caught.value.fixes if "maxModelLen" in f)
    plan(**{**spec, "maxModelLen": length})
    with pytest.raises(NoFeasiblePlanError):
        plan(**{**spec, "maxModelLen": length + 256})


def test_cuda_graphs_at_a_lower_utilization_before_enforce_eager() -> None:
    # gpt-oss-20b on one L4: vLLM's default 0.9 leaves 2.2 GiB above the line, less than its CUDA graphs,
    # the MXFP4 kernels' start-up memory and the sampler warm-up need; a lower utilization keeps the
    # graphs and still holds the sequences (the ladder used to go eager instead).
    result = plan(model={"name": "openai/gpt-oss-20b"}, maxModelLen=8192, concurrency=4, gpu=ONE_L4)
    s, b = result.settings, result.budget
    assert not s.enforce_eager and b.cuda_graph_gib > 0
    assert s.gpu_memory_utilization < 0.9
    assert b.fits and b.max_concurrency >= 4
    assert b.startup_headroom_gib >= b.sampler_warmup_gib + SAFE_HEADROOM_GIB - 0.01
    tuning = result.summary().model_dump(by_alias=True, mode="json")["tuning"]
    assert any(note.startswith("gpu-memory-utilization 0.8") and "(default 0.9)" in note for note in tuning)
    assert any(note.startswith("CUDA graphs kept") and "slower decode" in note for note in tuning)


def test_enforce_eager_says_what_keeping_the_graphs_would_have_held() -> None:
    result = plan(maxModelLen=4096, concurrency=11, gpu=ONE_L4)
    [note] = [
        n
        for n in result.summary().model_dump(by_alias=True, mode="json")["tuning"]
        if n.startswith("enforce-eager")
    ]
    assert "with CUDA graphs" in note and "short of concurrency 11" in note and "decode is slower" in note
    held = float(note.split("holds at most ")[1].split()[0])
    assert 10 <= held < 11  # one sequence less fits with graphs (as the test above it shows)
