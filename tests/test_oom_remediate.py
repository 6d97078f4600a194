"""Remediation proposals: one step, exact new values computed from the config, old values kept."""

from __future__ import annotations

from typing import Any

from loadline.oom import (
    Change,
    Diagnosis,
    Incident,
    OomClass,
    Remediation,
    classify,
    parse_incident,
    propose_remediation,
)

GIB = 1024**3
SAMPLER = "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests."
RUNTIME_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.15 GiB."


def make(**fields: Any) -> Incident:
    data: dict[str, Any] = {"reason": "Error", "exit_code": 1}
    data.update(fields)
    return parse_incident(data)


def propose(incident: Incident) -> tuple[Diagnosis, Remediation]:
    diagnosis = classify(incident)
    return diagnosis, propose_remediation(diagnosis, incident)


def forced(cls: OomClass, incident: Incident, **extra: Any) -> Remediation:
    """A proposal for a given class, to test the proposer apart from the classifier."""
    return propose_remediation(
        Diagnosis(oom_class=cls, confidence=0.9, evidence=("test",), **extra), incident
    )


def test_sampler_warmup_halves_max_num_seqs_one_step() -> None:
    incident = make(
        message=SAMPLER,
        config={"max_num_seqs": 1024, "gpu_memory_utilization": 0.95, "max_num_batched_tokens": 8192},
    )
    d, r = propose(incident)
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert r.action == "lower_max_num_seqs"
    assert r.changes == (Change("config.max_num_seqs", 1024, 512),)
    # The other knobs are offered, each one step, never applied together.
    alternatives = {o.action: o.changes for o in r.alternatives}
    assert alternatives["lower_gpu_memory_utilization"] == (
        Change("config.gpu_memory_utilization", 0.95, 0.9),
    )
    assert alternatives["lower_max_num_batched_tokens"] == (
        Change("config.max_num_batched_tokens", 8192, 4096),
    )


def test_sampler_warmup_without_config_uses_the_message_count() -> None:
    _, r = propose(make(message=SAMPLER))
    assert r.changes == (Change("config.max_num_seqs", 1024, 512),)


def test_graph_capture_lowers_gpu_memory_utilization() -> None:
    incident = make(
        message="RuntimeError: CUDA error: out of memory",
        log_tail="self.cuda_graph.capture_end()",
        config={"gpu_memory_utilization": 0.98, "max_num_seqs": 1},
    )
    _, r = propose(incident)
    assert r.action == "lower_gpu_memory_utilization"
    assert r.changes == (Change("config.gpu_memory_utilization", 0.98, 0.93),)
    # max_num_seqs is already 1: not offered.
    assert all(o.action != "lower_max_num_seqs" for o in r.alternatives)


def test_profiling_oom_lowers_batched_tokens_first() -> None:
    incident = make(
        message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB.",
        log_tail='Loading model weights took 15.2 GB\n  File "worker.py", line 9, in determine_num_available_blocks\n'
        '  File "model_runner.py", line 3, in profile_run',
        config={"max_num_batched_tokens": 16384, "gpu_memory_utilization": 0.9},
        plan={"weights_gib": 15.2, "gpu_memory_gib": 44.4},
    )
    d, r = propose(incident)
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert r.changes == (Change("config.max_num_batched_tokens", 16384, 8192),)


NO_KV_ROOM = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"


def test_no_room_for_kv_blocks_shrinks_the_profiling_batch_and_never_the_budget() -> None:
    config = {"max_num_batched_tokens": 16384, "max_num_seqs": 1024, "gpu_memory_utilization": 0.85}
    d, r = propose(make(message=NO_KV_ROOM, config=config))
    assert (d.oom_class, r.changes) == (
        OomClass.BATCH_MISCONFIGURATION,
        (Change("config.max_num_batched_tokens", 16384, 8192),),
    )
    assert [(o.action, o.changes) for o in r.alternatives] == [
        ("lower_max_num_seqs", (Change("config.max_num_seqs", 1024, 512),)),
        ("raise_gpu_memory_utilization", (Change("config.gpu_memory_utilization", 0.85, 0.9),)),
    ]


def test_no_room_for_kv_blocks_with_no_batch_known_raises_the_budget_to_its_ceiling() -> None:
    _, r = propose(make(message=NO_KV_ROOM))
    assert r.changes == (Change("config.gpu_memory_utilization", None, 0.95),)
    _, at_ceiling = propose(make(message=NO_KV_ROOM, config={"gpu_memory_utilization": 0.95}))
    assert at_ceiling.action == "none"


def test_batch_utilization_unknown_steps_from_vllm_default() -> None:
    r = forced(OomClass.BATCH_MISCONFIGURATION, make(message=RUNTIME_OOM))
    assert r.changes == (Change("config.gpu_memory_utilization", None, 0.85),)


def test_batch_knobs_at_their_floor_ask_a_person() -> None:
    incident = make(
        config={"gpu_memory_utilization": 0.5, "max_num_seqs": 1, "max_num_batched_tokens": 2048},
    )
    r = forced(OomClass.BATCH_MISCONFIGURATION, incident)
    assert r.action == "none"
    assert r.changes == ()


def test_kv_refusal_lowers_max_model_len_to_what_fits() -> None:
    incident = make(
        message="ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that "
        "can be stored in KV cache (7344)."
    )
    _, r = propose(incident)
    assert r.action == "lower_max_model_len"
    assert r.changes == (Change("config.max_model_len", 32768, 7168),)
    assert "400" in r.summary


def test_kv_v1_refusal_without_estimate_scales_by_memory() -> None:
    incident = make(
        message="ValueError: To serve at least one request with the models's max seq len (32768), (0.95 GiB KV "
        "cache is needed, which is larger than the available KV cache memory (0.93 GiB).",
        config={"max_model_len": 32768},
    )
    _, r = propose(incident)
    # floor(32768 * 0.93 / 0.95) = 32078 tokens -> 32000 (a multiple of 256).
    assert r.changes == (Change("config.max_model_len", 32768, 32000),)


def test_kv_runtime_crash_uses_the_prompt_length() -> None:
    incident = make(
        message=RUNTIME_OOM,
        ever_ready=True,
        config={"max_model_len": 32768},
        metrics={"prompt_tokens_max": 31000, "kv_cache_usage": 0.99},
    )
    _, r = propose(incident)
    # 31000 x 0.9 = 27900 -> 27648.
    assert r.changes == (Change("config.max_model_len", 32768, 27648),)
    assert [o.action for o in r.alternatives] == ["enable_kv_offload", "move_up_tier"]


def test_kv_planned_capacity_and_offload_size() -> None:
    incident = make(
        config={"max_model_len": 131072, "gpu_memory_utilization": 0.9, "tensor_parallel_size": 1},
        plan={"weights_gib": 15, "gpu_memory_gib": 79.19, "kv_cache_tokens": 90000},
    )
    r = forced(OomClass.KV_CACHE_OVERFLOW, incident, kv_capacity_tokens=90000)
    assert r.changes == (Change("config.max_model_len", 131072, 89856),)
    offload = next(o for o in r.alternatives if o.action == "enable_kv_offload")
    # The GPU KV pool: 79.19 x 0.9 - 15 = 56.271 -> 56.3 GiB.
    assert offload.changes == (Change("config.kv_offload_cpu_gib", None, 56.3),)


def test_kv_without_any_length_falls_back_to_offload() -> None:
    r = forced(OomClass.KV_CACHE_OVERFLOW, make())
    assert r.action == "enable_kv_offload"


def test_fragmentation_turns_on_expandable_segments_and_restarts() -> None:
    r = forced(OomClass.FRAGMENTATION, make())
    assert r.action == "restart_with_expandable_segments"
    assert r.changes == (Change("env.PYTORCH_CUDA_ALLOC_CONF", None, "expandable_segments:True"),)
    assert r.restart is True


def test_fragmentation_with_expandable_segments_on_only_restarts() -> None:
    r = forced(OomClass.FRAGMENTATION, make(config={"expandable_segments": True}))
    assert r.action == "restart"
    assert r.changes == ()
    assert r.restart is True


def test_fragmentation_next_rung_is_one_step_less_gpu_memory_utilization() -> None:
    # The allocator's own fixes first; a lower budget is what is left when they did not hold.
    fresh = forced(OomClass.FRAGMENTATION, make(config={"gpu_memory_utilization": 0.92}))
    on = forced(OomClass.FRAGMENTATION, make(config={"expandable_segments": True}))
    assert [o.action for o in fresh.alternatives] == ["lower_gpu_memory_utilization"]
    assert fresh.alternatives[0].changes == (Change("config.gpu_memory_utilization", 0.92, 0.87),)
    # vLLM's default (0.9) when the config does not say; old stays None.
    assert on.alternatives[0].changes == (Change("config.gpu_memory_utilization", None, 0.85),)


def test_fragmentation_at_the_utilization_floor_has_no_next_rung() -> None:
    r = forced(OomClass.FRAGMENTATION, make(config={"gpu_memory_utilization": 0.52}))
    assert r.action == "restart_with_expandable_segments"
    assert r.alternatives == ()


def test_host_memory_raises_the_limit_by_at_least_20_percent() -> None:
    incident = make(reason="OOMKilled", exit_code=137, config={"memory_limit_bytes": 16 * GIB})
    _, r = propose(incident)
    assert r.action == "raise_memory_limit"
    # 16 GiB x 1.2 = 19.2 GiB -> 20 GiB.
    assert r.changes == (Change("config.memory_limit_bytes", 16 * GIB, 20 * GIB),)
    assert r.changes[0].new is not None and int(r.changes[0].new) >= 1.2 * 16 * GIB


def test_host_memory_with_offload_dominating_the_limit_shrinks_offload_first() -> None:
    incident = make(
        reason="OOMKilled", exit_code=137, config={"memory_limit_bytes": 64 * GIB, "kv_offload_cpu_gib": 48}
    )
    _, r = propose(incident)
    assert r.action == "shrink_kv_offload"
    assert r.changes == (Change("config.kv_offload_cpu_gib", 48.0, 24.0),)
    assert r.alternatives[0].changes == (Change("config.memory_limit_bytes", 64 * GIB, 77 * GIB),)


def test_host_memory_without_a_known_limit_asks_a_person() -> None:
    _, r = propose(make(reason="OOMKilled", exit_code=137))
    assert r.action == "raise_memory_limit"
    assert r.changes == ()
    assert any("limits.memory" in item for item in r.look_at)


def test_model_exceeds_vram_replans_tensor_parallel() -> None:
    incident = make(
        config={"tensor_parallel_size": 1},
        plan={"weights_gib": 134, "gpu_memory_gib": 79.33, "quantization_allowed": True},
    )
    r = forced(OomClass.MODEL_EXCEEDS_VRAM, incident)
    assert r.action == "replan"
    # 134/2 = 67 GiB > 0.7 x 79.33 = 55.5; 134/4 = 33.5 fits.
    assert r.changes == (Change("config.tensor_parallel_size", 1, 4),)
    bigger = next(o for o in r.alternatives if o.action == "bigger_gpu")
    assert bigger.changes == (Change("plan.gpu_memory_gib", 79.33, 191.5),)
    assert any(o.action == "quantize" for o in r.alternatives)


def test_model_exceeds_vram_replans_from_the_models_name_when_the_plan_has_no_weights() -> None:
    # An incident written from a report: the model's name and the allocator's total, no plan.
    message = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 226.00 MiB. GPU 0 has a total "
        "capacity of 15.58 GiB of which 71.25 MiB is free. Including non-PyTorch memory, this process has "
        "13.94 GiB memory in use. Of the allocated memory 13.64 GiB is allocated by PyTorch, and 67.23 MiB "
        "is reserved by PyTorch but unallocated."
    )
    d, r = propose(make(message=message, ever_ready=False, model="google/gemma-3-12b-it"))
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM and r.action == "replan"
    # 22.7 GiB of bfloat16 weights: 11.3 GiB a GPU at TP 2 is past 0.7 x 15.58; TP 4 (5.7) fits.
    assert r.changes == (Change("config.tensor_parallel_size", None, 4),)
    assert "gemma-3-12b-it" in r.summary and not r.look_at
    bigger = next(o for o in r.alternatives if o.action == "bigger_gpu")
    assert bigger.changes == (Change("plan.gpu_memory_gib", 15.58, 32.5),)


def test_model_exceeds_vram_offers_quantization_only_when_allowed() -> None:
    incident = make(plan={"weights_gib": 134, "gpu_memory_gib": 79.33})
    r = forced(OomClass.MODEL_EXCEEDS_VRAM, incident)
    assert all(o.action != "quantize" for o in r.alternatives)


def test_unknown_proposes_nothing_and_says_what_to_look_at() -> None:
    text = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total "
        "capacity; 27.91 GiB already allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch)"
    )
    d, r = propose(make(message=text))
    assert d.oom_class is OomClass.UNKNOWN
    assert r.action == "none"
    assert r.changes == ()
    assert any("nvidia-smi" in item for item in r.look_at)
    assert any("kubectl logs --previous" in item for item in r.look_at)


def test_to_dict_carries_field_old_and_new() -> None:
    _, r = propose(make(message=SAMPLER, config={"max_num_seqs": 256}))
    data = r.to_dict()
    assert data["action"] == "lower_max_num_seqs"
    assert data["changes"] == [{"field": "config.max_num_seqs", "old": 256, "new": 128}]
    assert set(data) == {"action", "summary", "changes", "restart", "alternatives", "look_at"}


def test_kv_full_of_short_requests_does_not_cut_max_model_len() -> None:
    incident = make(
        message=RUNTIME_OOM,
        ever_ready=True,
        config={"max_model_len": 32768},
        metrics={"prompt_tokens_max": 2000, "kv_cache_usage": 0.99, "preemptions": 40},
    )
    d, r = propose(incident)
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW
    assert r.action == "enable_kv_offload"
    assert all(c.field != "config.max_model_len" for c in r.changes)


def test_kv_caller_side_growth_lowers_under_the_crash_length() -> None:
    incident = make(
        message=RUNTIME_OOM,
        ever_ready=True,
        config={"max_model_len": 131072},
        metrics={"prompt_tokens_recent": [4000, 9000, 16000, 24000]},
    )
    d, r = propose(incident)
    assert d.caller_side is True
    # The longest recent prompt (24000) stands in for prompt_tokens_max: 24000 x 0.9 = 21600 -> 21504.
    assert r.changes == (Change("config.max_model_len", 131072, 21504),)
    assert "400" in r.summary


def test_a_full_dev_shm_asks_a_person_to_look_at_its_size_beside_the_memory_limit() -> None:
    text = "Error while creating shared memory segment /dev/shm/nccl-eQz2sT (size 5767520)"
    d, r = propose(make(message=text, config={"memory_limit_bytes": 32 * GIB}))
    assert d.oom_class is OomClass.HOST_MEMORY
    assert r.action == "raise_memory_limit"
    assert any("/dev/shm" in item for item in r.look_at)
