"""Classifier behaviour per class on real messages, and the rules that keep it from guessing.

The messages are quoted from the corpus reports; timing, plan and metrics vary per test to check that
they, not just the text, decide between classes.
"""

from __future__ import annotations

from typing import Any

import pytest

from loadline.oom import Incident, OomClass, classify, parse_incident

SAMPLER = (
    "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please "
    "try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine."
)
# vllm-project/vllm#27466: 2.22 GiB reserved but unallocated, 960 MiB requested.
FRAGMENTED = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 960.00 MiB. GPU 0 has a total capacity "
    "of 79.14 GiB of which 712.75 MiB is free. Process 854401 has 78.43 GiB memory in use. Of the allocated "
    "memory 74.06 GiB is allocated by PyTorch, with 159.88 MiB allocated in private pools (e.g., CUDA "
    "Graphs), and 2.22 GiB is reserved by PyTorch but unallocated."
)
# vllm-project/vllm#13100: a runtime OOM with only the request size.
RUNTIME_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.15 GiB. GPU 0 has a total capac"
)
# QwenLM/Qwen3#67: 72B on one GPU.
LOAD_FULL = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB. GPU 0 has a total "
    "capacty of 79.33 GiB of which 351.81 MiB is free. Including non-PyTorch memory, this process has 78.97 "
    "GiB memory in use. Of the allocated memory 78.33 GiB is allocated by PyTorch, and 12.36 MiB is "
    "reserved by PyTorch but unallocated."
)
KV_REFUSAL = (
    "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
    "stored in KV cache (7344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"
)


def make(**fields: Any) -> Incident:
    data: dict[str, Any] = {"reason": "Error", "exit_code": 1}
    data.update(fields)
    return parse_incident(data)


def test_model_exceeds_vram_from_the_plan() -> None:
    d = classify(
        make(
            message=LOAD_FULL,
            ever_ready=False,
            config={"tensor_parallel_size": 1},
            plan={"weights_gib": 134, "gpu_memory_gib": 79.33},
        )
    )
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM
    assert d.confidence >= 0.85
    assert any("134 GiB per GPU" in e and "79.33 GiB" in e for e in d.evidence)


def test_same_load_failure_with_enough_tensor_parallelism_is_not_model_exceeds_vram() -> None:
    # The weights fit at TP 4 (33.5 GiB per GPU): the plan must overrule the load-time OOM text.
    d = classify(
        make(
            message=LOAD_FULL,
            ever_ready=False,
            config={"tensor_parallel_size": 4},
            plan={"weights_gib": 134, "gpu_memory_gib": 79.33},
        )
    )
    assert d.oom_class is not OomClass.MODEL_EXCEEDS_VRAM


def test_load_phase_oom_without_plan_points_to_model_exceeds_vram() -> None:
    d = classify(
        make(
            message=LOAD_FULL,
            log_tail='INFO Starting to load model /models/qwen1.5-72b...\n  File "x.py", line 3, in load_model',
            ever_ready=False,
        )
    )
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM
    assert "load_phase_oom" in d.signals


def test_vllm_load_message_is_enough() -> None:
    d = classify(make(message="RuntimeError: Failed to load model - not enough GPU memory", ever_ready=False))
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM


def test_a_model_that_served_cannot_exceed_vram() -> None:
    d = classify(make(message="RuntimeError: Failed to load model - not enough GPU memory", ever_ready=True))
    assert d.oom_class is not OomClass.MODEL_EXCEEDS_VRAM


def test_batch_misconfiguration_from_sampler_warmup() -> None:
    d = classify(make(message=SAMPLER, ever_ready=False, config={"gpu_memory_utilization": 0.95}))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert d.warmup_requests == 1024
    assert any("1024 dummy requests" in e for e in d.evidence)


def test_batch_misconfiguration_from_cuda_graph_capture() -> None:
    d = classify(
        make(
            message="RuntimeError: CUDA error: out of memory",
            log_tail="    self.cuda_graph.capture_end()",
            ever_ready=False,
            config={"gpu_memory_utilization": 0.98},
        )
    )
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert {"graph_capture_oom", "high_util"} <= set(d.signals)


def test_batch_misconfiguration_on_the_first_batch() -> None:
    d = classify(
        make(
            message=RUNTIME_OOM,
            ever_ready=True,
            seconds_since_ready=40,
            config={"gpu_memory_utilization": 0.97},
        )
    )
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert "first_batch" in d.signals


def test_kv_cache_overflow_from_vllm_refusal() -> None:
    d = classify(make(message=KV_REFUSAL, ever_ready=False))
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW
    assert d.kv_capacity_tokens == 7344
    assert d.logged_max_model_len == 32768


def test_kv_cache_overflow_from_v1_refusal_with_estimate() -> None:
    text = (
        "ValueError: To serve at least one request with the models's max seq len (262144), (24.0 GiB KV cache "
        "is needed, which is larger than the available KV cache memory (3.18 GiB). Based on the available "
        "memory, the estimated maximum model length is 34736."
    )
    d = classify(make(message=text))
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW
    assert d.kv_capacity_tokens == 34736


def test_kv_cache_overflow_at_runtime_from_metrics() -> None:
    d = classify(
        make(
            message=RUNTIME_OOM,
            ever_ready=True,
            seconds_since_ready=7200,
            config={"max_model_len": 32768},
            metrics={"prompt_tokens_max": 31000, "kv_cache_usage": 0.99},
        )
    )
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW
    assert d.confidence >= 0.8
    assert any("31000 tokens" in e and "95%" in e for e in d.evidence)
    assert d.caller_side is False


def test_same_runtime_oom_without_metrics_is_unknown() -> None:
    d = classify(make(message=RUNTIME_OOM, ever_ready=True, seconds_since_ready=7200))
    assert d.oom_class is OomClass.UNKNOWN
    assert d.confidence <= 0.3


def test_prompts_growing_until_the_crash_blames_the_caller() -> None:
    d = classify(
        make(
            message=RUNTIME_OOM,
            ever_ready=True,
            seconds_since_ready=5400,
            config={"max_model_len": 65536},
            metrics={"prompt_tokens_recent": [3000, 5200, 9100, 14800, 22500], "prompt_tokens_max": 22500},
        )
    )
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW
    assert d.caller_side is True
    assert d.caller_note is not None
    for word in ("caller's side", "LangGraph", "whole history", "tool outputs", "400", "65536"):
        assert word in d.caller_note
    assert any("from 3000 to 22500 tokens" in e for e in d.evidence)


@pytest.mark.parametrize(
    "recent",
    [[20000, 20500, 19800, 20100], [22500, 14800, 9100, 5200], [100, 200]],
    ids=["flat", "shrinking", "too-few-samples"],
)
def test_prompts_not_growing_do_not_blame_the_caller(recent: list[int]) -> None:
    d = classify(make(message=RUNTIME_OOM, ever_ready=True, metrics={"prompt_tokens_recent": recent}))
    assert d.caller_side is False
    assert d.caller_note is None


def test_fragmentation_after_a_long_run() -> None:
    d = classify(
        make(
            message=FRAGMENTED,
            ever_ready=True,
            uptime_seconds=200000,
            seconds_since_ready=199000,
            metrics={"gpu_memory_growth_gib_per_hour": 0.2},
        )
    )
    assert d.oom_class is OomClass.FRAGMENTATION
    assert d.confidence >= 0.8
    assert any("2.22 GiB reserved but unallocated" in e for e in d.evidence)


def test_fragmentation_figures_decide_before_ready_too() -> None:
    # CUDA graph capture and profiling fragment the cache at start-up as well: the figures decide.
    d = classify(make(message=FRAGMENTED, ever_ready=False))
    assert d.oom_class is OomClass.FRAGMENTATION
    assert "never_ready" not in d.signals


def test_expandable_segments_already_on_weakens_fragmentation() -> None:
    base = {"message": FRAGMENTED, "ever_ready": True}
    off = classify(make(**base))
    on = classify(make(**base, config={"expandable_segments": True}))
    assert off.oom_class is OomClass.FRAGMENTATION
    assert dict(on.scores)[OomClass.FRAGMENTATION] < dict(off.scores)[OomClass.FRAGMENTATION]
    assert on.oom_class is OomClass.UNKNOWN


def test_host_memory_from_oomkilled() -> None:
    d = classify(make(reason="OOMKilled", exit_code=137, ever_ready=True))
    assert d.oom_class is OomClass.HOST_MEMORY
    assert d.confidence >= 0.85


def test_host_memory_with_big_cpu_offload_says_so() -> None:
    d = classify(
        make(
            reason="OOMKilled",
            exit_code=137,
            config={"kv_offload_cpu_gib": 48, "memory_limit_bytes": 64 * 1024**3},
        )
    )
    assert d.oom_class is OomClass.HOST_MEMORY
    assert any("48 GiB" in e and "64 GiB" in e for e in d.evidence)


def test_host_memory_from_ray_oom_killer() -> None:
    d = classify(
        make(
            message="ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory."
        )
    )
    assert d.oom_class is OomClass.HOST_MEMORY
    assert d.figures is None


def test_failed_to_load_for_lack_of_ram_is_host_memory_not_gpu() -> None:
    d = classify(
        make(
            message="Failed to load model with Error: unable to mmap 4965799096 bytes from file "
            "<model-00001-of-00002.safetensors>: Cannot allocate memory (12)"
        )
    )
    assert d.oom_class is OomClass.HOST_MEMORY


def test_exit_137_alone_is_not_enough() -> None:
    d = classify(make(reason="Error", exit_code=137))
    assert d.oom_class is OomClass.UNKNOWN
    assert d.confidence <= 0.3


def test_conflicting_host_and_gpu_evidence_is_unknown() -> None:
    d = classify(make(reason="OOMKilled", exit_code=137, message=SAMPLER, ever_ready=False))
    assert d.oom_class is OomClass.UNKNOWN
    assert d.confidence <= 0.3
    assert any("split between" in e for e in d.evidence)


def test_memory_held_by_another_process_is_unknown() -> None:
    text = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total "
        "capacity; 27.91 GiB already allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch)"
    )
    d = classify(make(message=text, ever_ready=False))
    assert d.oom_class is OomClass.UNKNOWN
    assert "external_memory" in d.signals
    assert any("outside this process" in e for e in d.evidence)


def test_no_memory_signal_at_all() -> None:
    d = classify(make(reason="Error", exit_code=1, message="ImportError: libcuda.so.1 not found"))
    assert d.oom_class is OomClass.UNKNOWN
    assert d.confidence <= 0.1
    assert "may not be a memory problem" in d.evidence[0]


def test_classification_is_deterministic() -> None:
    incident = make(message=FRAGMENTED, ever_ready=True, seconds_since_ready=90000)
    assert classify(incident) == classify(incident)


def test_to_dict_shape() -> None:
    d = classify(make(message=SAMPLER)).to_dict()
    assert d["class"] == "batch_misconfiguration"
    assert isinstance(d["confidence"], float)
    assert all(isinstance(e, str) for e in d["evidence"])
    assert set(d["scores"]) == {c.value for c in OomClass} - {"unknown"}


def test_uptime_stands_in_for_time_since_ready() -> None:
    d = classify(make(message=FRAGMENTED, ever_ready=True, uptime_seconds=30 * 3600))
    assert "days_of_serving" in d.signals  # 30 h: past the 24-hour step of the timing table
    assert d.oom_class is OomClass.FRAGMENTATION


def test_preemptions_count_for_kv_pressure() -> None:
    base = {"message": RUNTIME_OOM, "ever_ready": True, "metrics": {"kv_cache_usage": 0.97}}
    without = classify(make(**base))
    with_preemptions = classify(make(**{**base, "metrics": {"kv_cache_usage": 0.97, "preemptions": 12}}))
    assert "preempting" in with_preemptions.signals
    assert (
        dict(with_preemptions.scores)[OomClass.KV_CACHE_OVERFLOW]
        > dict(without.scores)[OomClass.KV_CACHE_OVERFLOW]
    )


def test_every_signal_in_the_code_is_in_the_data_and_back() -> None:
    """A typo in a signal id would only fail on the incident that fires it; check them all at once."""
    import re
    from pathlib import Path

    import loadline.oom._classify as module
    from loadline.oom._signals import tables

    used = set(re.findall(r'\.add\(\s*"(\w+)"', Path(module.__file__).read_text(encoding="utf-8")))
    assert used == set(tables().signals)


def test_a_finished_graph_capture_is_not_blamed() -> None:
    log = (
        "Capturing CUDA graph shapes: 100%|##########| 67/67\n"
        "INFO gpu_model_runner.py:1341] Graph capturing finished in 17 secs, took 2.02 GiB\n"
        "INFO api_server.py:957] Starting vLLM API server on http://0.0.0.0:8000\n"
    )
    d = classify(make(message=RUNTIME_OOM, log_tail=log))
    assert "graph_capture_oom" not in d.signals
    # Reaching "Starting vLLM API server" means start-up was over: a runtime crash.
    assert "runtime_gpu_oom" in d.signals
    assert "served" in d.signals


def test_kv_capacity_is_read_from_the_startup_log() -> None:
    log = (
        "INFO  [kv_cache_utils.py]  GPU KV cache size: 150,745 tokens, Maximum concurrency for 124,000 tokens"
    )
    d = classify(make(message=RUNTIME_OOM, log_tail=log))
    assert d.kv_capacity_tokens == 150745
    # The plan's figure is used only when the log does not say.
    d = classify(make(message=RUNTIME_OOM, plan={"kv_cache_tokens": 90000}))
    assert d.kv_capacity_tokens == 90000


def test_every_pattern_in_the_data_is_read() -> None:
    import re
    from pathlib import Path

    import loadline.oom._classify as module
    from loadline.oom._signals import tables

    used = set(re.findall(r'p\["(\w+)"\]', Path(module.__file__).read_text(encoding="utf-8")))
    assert used == set(tables().patterns)
