"""The field guide's timing table decides when the message is thin, and only disagreement gives ``unknown``.

The thin messages are real ones cut short, as a truncated termination message is; the timing is what the
operator knows (phase, time since Ready, metrics). Each rule users rely on is checked, and each has a
case where it must *not* decide, so none of these can pass by always answering the same class.
"""

from __future__ import annotations

from typing import Any

from loadline.oom import Incident, OomClass, classify, parse_incident, start_up_phase
from loadline.oom._signals import tables

THIN = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocat"
SAMPLER = (
    "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please "
    "try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine."
)


def make(**fields: Any) -> Incident:
    data: dict[str, Any] = {"reason": "Error", "exit_code": 1, "message": THIN}
    data.update(fields)
    return parse_incident(data)


def test_thin_message_at_load_is_model_too_big() -> None:
    d = classify(make(ever_ready=False, phase="loading"))
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM
    assert "at_load" in d.signals
    assert d.confidence == tables().timing["at_load"].confidence
    assert any("timing does" in e for e in d.evidence)


def test_thin_message_before_ready_without_a_phase_decides_nothing() -> None:
    d = classify(make(ever_ready=False))
    assert d.oom_class is OomClass.UNKNOWN


def test_thin_message_after_load_is_batch_settings() -> None:
    d = classify(make(ever_ready=False, phase="starting"))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert "after_load" in d.signals


NO_KV_ROOM = (
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
    "initializing the engine."
)


def test_vllms_refusal_of_kv_blocks_names_its_budget_so_is_batch_settings() -> None:
    # vLLM's budget held the weights and the profiling batch and left nothing for KV blocks: the budget
    # and the profiling batch are settings (the message names one), whatever the timing.
    d = classify(make(message=NO_KV_ROOM, ever_ready=False, phase="starting"))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert d.decided_by is not None and d.decided_by[0] == "no_cache_blocks"
    # The weights comfortably inside the GPU only confirm it.
    fits = classify(make(message=NO_KV_ROOM, plan={"weights_gib": 15.0, "gpu_memory_gib": 80.0}))
    assert fits.oom_class is OomClass.BATCH_MISCONFIGURATION


def test_vllms_refusal_of_kv_blocks_with_weights_filling_the_budget_is_the_model() -> None:
    # 70 of 80 GiB under a 0.9 budget (72 GiB): no batch setting makes room for the KV cache.
    d = classify(make(message=NO_KV_ROOM, plan={"weights_gib": 70.0, "gpu_memory_gib": 80.0}))
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM
    assert "weights_no_room" in d.signals


def test_first_batch_after_ready_is_batch_settings_but_not_later() -> None:
    first = classify(make(ever_ready=True, seconds_since_ready=60))
    later = classify(make(ever_ready=True, seconds_since_ready=2 * 3600))
    assert first.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert later.oom_class is OomClass.UNKNOWN


def test_long_requests_only_is_kv_cache() -> None:
    d = classify(
        make(
            ever_ready=True,
            seconds_since_ready=3 * 3600,
            config={"max_model_len": 32768},
            metrics={"prompt_tokens_max": 26000},
        )
    )
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW
    assert "long_requests" in d.signals


def test_hours_with_memory_climbing_is_fragmentation() -> None:
    climbing = classify(
        make(ever_ready=True, seconds_since_ready=30 * 3600, metrics={"gpu_memory_growth_gib_per_hour": 0.3})
    )
    flat = classify(
        make(ever_ready=True, seconds_since_ready=30 * 3600, metrics={"gpu_memory_growth_gib_per_hour": 0.0})
    )
    assert climbing.oom_class is OomClass.FRAGMENTATION
    assert "hours_memory_climbing" in climbing.signals
    assert climbing.confidence > flat.confidence


def test_host_kill_is_host_memory() -> None:
    d = classify(make(reason="OOMKilled", exit_code=137, message="", ever_ready=True, seconds_since_ready=60))
    assert d.oom_class is OomClass.HOST_MEMORY
    assert "host_kill" in d.signals


def test_strong_text_wins_over_weaker_timing() -> None:
    # The sampler warm-up message is strong; the phase agrees, and the text's confidence stands.
    d = classify(make(message=SAMPLER, ever_ready=False, phase="starting"))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert d.confidence >= 0.85


def test_text_and_timing_of_comparable_strength_disagreeing_is_unknown() -> None:
    # Allocator figures say fragmentation (memory there but in pieces); the first minute after Ready says
    # batch settings. Comparable strength, different classes: do not pick one.
    fragmented = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 960.00 MiB. GPU 0 has a total capacity "
        "of 79.14 GiB of which 712.75 MiB is free. Process 854401 has 78.43 GiB memory in use. Of the allocated "
        "memory 74.06 GiB is allocated by PyTorch, with 159.88 MiB allocated in private pools (e.g., CUDA "
        "Graphs), and 2.22 GiB is reserved by PyTorch but unallocated."
    )
    alone = classify(make(message=fragmented, ever_ready=True))
    early = classify(make(message=fragmented, ever_ready=True, seconds_since_ready=60))
    assert alone.oom_class is OomClass.FRAGMENTATION
    assert early.oom_class is OomClass.UNKNOWN
    assert early.confidence <= 0.3
    assert any("disagree" in e for e in early.evidence)


def test_timing_ruled_out_by_the_plan_is_unknown() -> None:
    # At load, but the weights take 30 % of the GPU: the plan rules out "model too big".
    d = classify(make(ever_ready=False, phase="loading", plan={"weights_gib": 24, "gpu_memory_gib": 80}))
    assert d.oom_class is OomClass.UNKNOWN
    assert any("rules it out" in e for e in d.evidence)


def test_allocator_with_memory_used_up_weighs_against_fragmentation() -> None:
    exhausted = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.14 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process has 78.80 GiB memory "
        "in use. Of the allocated memory 78.00 GiB is allocated by PyTorch, and 100.00 MiB is reserved by "
        "PyTorch but unallocated."
    )
    # 30 h without a memory trend points weakly to fragmentation; figures showing the memory used up
    # (not in pieces) take that away.
    plain = classify(make(ever_ready=True, seconds_since_ready=30 * 3600))
    d = classify(make(message=exhausted, ever_ready=True, seconds_since_ready=30 * 3600))
    assert plain.oom_class is OomClass.FRAGMENTATION
    assert "allocator_exhausted" in d.signals
    assert d.oom_class is OomClass.UNKNOWN


def test_every_timing_row_names_a_cause_and_is_reachable() -> None:
    import re
    from pathlib import Path

    import loadline.oom._classify as module

    source = Path(module.__file__).read_text(encoding="utf-8")
    assigned = set(re.findall(r'row_id(?:, detail)? = "(\w+)"', source))
    assigned |= set(re.findall(r'"(hours_memory_climbing)" if climbing else "(long_uptime)"', source)[0])
    assert assigned == set(tables().timing)
    assert all(row.oom_class is not OomClass.UNKNOWN for row in tables().timing.values())


FRAGMENTED = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "22.05 GiB of which 0.41 GiB is free. Including non-PyTorch memory, this process has 21.63 GiB memory in use. "
    "Of the allocated memory 14.20 GiB is allocated by PyTorch, and 6.90 GiB is reserved by PyTorch but "
    "unallocated."
)


def test_days_of_serving_with_memory_in_pieces_is_fragmentation_above_the_auto_threshold() -> None:
    """loadline always renders expandable segments, which counts against fragmentation: the restart of a
    pod that served for days and had the memory in pieces must still clear the default minimum
    confidence for automatic remediation (0.6), while the same crash after 8 h of serving does not."""
    config = {"expandable_segments": True, "max_model_len": 8192}
    days = classify(make(message=FRAGMENTED, ever_ready=True, seconds_since_ready=72 * 3600, config=config))
    assert days.oom_class is OomClass.FRAGMENTATION and days.confidence >= 0.6
    assert "days_of_serving" in days.signals and "24 h" in " ".join(days.evidence)
    hours = classify(make(message=FRAGMENTED, ever_ready=True, seconds_since_ready=8 * 3600, config=config))
    assert hours.oom_class is OomClass.FRAGMENTATION and hours.confidence < days.confidence


# The start of a crashed vLLM 0.19 instance's log, as the operator reads it (limitBytes from the top):
# the phase it reached decides a thin message.
LOADING = (
    "INFO 11-23 10:12:01 [api_server.py:1896] vLLM API server version 0.19.0\n"
    "INFO 11-23 10:12:09 [core.py:84] Initializing a V1 LLM engine (v0.19.0) with config: ...\n"
    "INFO 11-23 10:12:14 [gpu_model_runner.py:2338] Starting to load model meta-llama/Llama-3.1-70B...\n"
    "Loading safetensors checkpoint shards:  13% Completed | 4/30 [00:09<01:01,  2.35s/it]\n"
)
LOADED = LOADING + (
    "INFO 11-23 10:13:20 [default_loader.py:267] Loading weights took 65.02 seconds\n"
    "INFO 11-23 10:13:21 [gpu_model_runner.py:2392] Model loading took 65.7234 GiB and 66.1 seconds\n"
    "INFO 11-23 10:13:40 [backends.py:539] Dynamo bytecode transform time: 15.22 s\n"
)
SERVING = LOADED + (
    "INFO 11-23 10:14:02 [kv_cache_utils.py:864] GPU KV cache size: 51,040 tokens\n"
    "INFO 11-23 10:14:30 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000\n"
    "INFO:     Application startup complete.\n"
)


def test_the_start_of_the_log_gives_the_phase_reached() -> None:
    assert start_up_phase(LOADING, whole=True) == "loading"
    assert start_up_phase(LOADED, whole=True) == "starting"
    assert start_up_phase(SERVING, whole=True) == "serving"
    assert start_up_phase("", whole=True) is None
    # Known Ready: it served, whatever the log's start shows.
    assert start_up_phase(LOADING, whole=True, ever_ready=True) == "serving"


def test_a_log_head_cut_short_only_tells_serving() -> None:
    # The head of a long log may end before the serving lines: "loaded, not serving" is not known then.
    assert start_up_phase(LOADED, whole=False) is None
    assert start_up_phase(LOADING, whole=False) is None
    assert start_up_phase(SERVING, whole=False) == "serving"


def test_the_phase_from_the_log_decides_a_thin_message() -> None:
    at_load = classify(make(ever_ready=None, phase=start_up_phase(LOADING, whole=True)))
    after_load = classify(make(ever_ready=None, phase=start_up_phase(LOADED, whole=True)))
    assert at_load.oom_class is OomClass.MODEL_EXCEEDS_VRAM
    assert after_load.oom_class is OomClass.BATCH_MISCONFIGURATION


def _held(allocated: float, requested: float = 0.44, total: float = 79.19, pools: float = 0.0) -> str:
    free = total - allocated - 1.0
    pooled = f", with {pools:.2f} GiB allocated in private pools (e.g., CUDA Graphs)," if pools else ""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {requested:.2f} GiB. GPU 0 has a total "
        f"capacity of {total:.2f} GiB of which {free:.2f} GiB is free. Including non-PyTorch memory, this "
        f"process has {allocated + 1.0:.2f} GiB memory in use. Of the allocated memory {allocated:.2f} GiB is "
        f"allocated by PyTorch{pooled} and 0.05 GiB is reserved by PyTorch but unallocated."
    )


def test_pytorch_holding_past_vllms_budget_before_ready_is_the_weights() -> None:
    # No phase, no plan figure: only the allocator's figures. 76 of 79 GiB held by PyTorch is past the
    # default budget (0.9 × 79 = 71 GiB) that vLLM keeps everything after loading within.
    d = classify(make(message=_held(76.0), ever_ready=False))
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM
    assert d.decided_by is not None and d.decided_by[0] == "held_past_budget"
    assert any("past vLLM's whole budget" in e for e in d.evidence)
    # A lowered budget moves the line: 0.5 × 79 GiB, and 60 GiB held is past it.
    assert classify(make(message=_held(60.0), ever_ready=False)).oom_class is OomClass.UNKNOWN
    lowered = classify(make(message=_held(60.0), ever_ready=False, config={"gpu_memory_utilization": 0.5}))
    assert lowered.oom_class is OomClass.MODEL_EXCEEDS_VRAM


def test_pytorch_past_the_budget_says_nothing_once_the_weights_loaded_or_the_plan_knows_them() -> None:
    past = _held(76.0)
    # After loading (profiling, graph capture, the first batch) the budget is vLLM's to keep: not this rule.
    for fields in (
        {"phase": "starting"},
        {"ever_ready": True},
        {"message": past + " (CUDA graph capture)", "log_tail": "Capturing CUDA graphs"},
    ):
        d = classify(make(**{"message": past, "ever_ready": False, **fields}))
        assert "held_past_budget" not in d.signals, fields
    # A capture's private pools in the figures, or a request bigger than the budget's headroom (a batch's
    # activation, not one layer's tensor): not this rule.
    assert "held_past_budget" not in classify(make(message=_held(76.0, pools=0.5), ever_ready=False)).signals
    assert (
        "held_past_budget" not in classify(make(message=_held(76.0, requested=9.0), ever_ready=False)).signals
    )
    # The plan's weights figure is the better witness: weights that fit leave the timing to decide.
    fits = classify(make(message=past, ever_ready=False, plan={"weights_gib": 30.0, "gpu_memory_gib": 79.19}))
    assert "held_past_budget" not in fits.signals and fits.oom_class is not OomClass.MODEL_EXCEEDS_VRAM
