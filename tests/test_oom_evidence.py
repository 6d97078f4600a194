"""The classifier decides from evidence, not wording: the allocator's figures in every phrasing, the host's
own words for its memory, the plan, and the phase. One test per rule; each fails without its rule.

Messages are quoted from the fresh corpus reports (tests/corpus/oom, ``collected`` set) or built from
torch's own formats with other figures.
"""

from __future__ import annotations

from typing import Any

import pytest

from loadline.oom import (
    Diagnosis,
    Incident,
    OomClass,
    classify,
    parse_incident,
    parse_oom_text,
    propose_remediation,
)

ADVICE = (
    " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    " to avoid fragmentation.  See documentation for Memory Management"
)


def make(**fields: Any) -> Incident:
    data: dict[str, Any] = {"reason": "Error", "exit_code": 1}
    data.update(fields)
    return parse_incident(data)


def decided(d: Diagnosis) -> tuple[OomClass, str | None]:
    """The class and the signal (or timing row) that decided it."""
    return d.oom_class, d.decided_by[0] if d.decided_by is not None else None


def new_format(requested: str, total: str, free: str, in_use: str, allocated: str, unalloc: str) -> str:
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {requested}. GPU 0 has a total "
        f"capacity of {total} of which {free} is free. Including non-PyTorch memory, this process has "
        f"{in_use} memory in use. Of the allocated memory {allocated} is allocated by PyTorch, and {unalloc} "
        "is reserved by PyTorch but unallocated."
    )


# ---- the allocator's figures in every phrasing -------------------------------------------------------

TGI_FRACTION = (
    "thread 'main' panicked at 'Unable to warmup model: Generation(\"Allocation on device 0 would exceed "
    "allowed memory. (out of memory)\\nCurrently allocated     : 16.08 GiB\\nRequested               : "
    "4.83 GiB\\nDevice limit            : 22.20 GiB\\nFree (according to CUDA): 11.12 MiB\\nPyTorch limit "
    "(set by user-supplied memory fraction)\\n                        : 22.20 GiB\")'"
)


def test_memory_fraction_format_is_read() -> None:
    fig = parse_oom_text(TGI_FRACTION)
    assert fig is not None and fig.fmt == "fraction"
    assert (fig.requested_gib, fig.allocated_gib, fig.total_gib) == (4.83, 16.08, 22.2)
    assert fig.free_gib is not None and abs(fig.free_gib - 11.12 / 1024) < 1e-4


def test_condensed_format_is_read() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB.\nGPU has 19.53 GiB "
        "total, 329.87 MiB free.\nPyTorch allocated: 18.40 GiB\nReserved but unallocated: 402.27 MiB"
    )
    fig = parse_oom_text(text)
    assert fig is not None and fig.fmt == "short"
    assert fig.requested_gib == 0.375 and fig.reserved_unallocated_gib is not None
    assert abs(fig.reserved_unallocated_gib - 402.27 / 1024) < 1e-4


def test_the_trailing_advice_is_no_evidence() -> None:
    msg = new_format("960.00 MiB", "79.14 GiB", "712.75 MiB", "78.43 GiB", "76.06 GiB", "10.00 MiB")
    bare = classify(make(message=msg, ever_ready=True))
    advised = classify(make(message=msg + ADVICE, ever_ready=True))
    assert dict(advised.scores) == dict(bare.scores)
    assert advised.oom_class is not OomClass.FRAGMENTATION


# ---- fragmentation from the figures, start-up too ------------------------------------------------------


def test_reserved_unallocated_at_least_the_request_is_fragmentation() -> None:
    # 1.2x the request: below the old 1.5x "large" line, yet the bytes were cached, just not in one block.
    msg = new_format("1.00 GiB", "79.33 GiB", "100.00 MiB", "79.19 GiB", "77.00 GiB", "1.20 GiB")
    d = classify(make(message=msg, ever_ready=True))
    assert d.oom_class is OomClass.FRAGMENTATION
    assert "reserved_covers" in d.signals
    assert any("1.2 GiB reserved but unallocated" in e for e in d.evidence)


def test_free_plus_cached_enough_is_fragmentation() -> None:
    # compressed-tensors#587: 1.96 GiB asked, 1.08 free + 1.83 cached, neither alone enough.
    msg = new_format("1.96 GiB", "79.18 GiB", "1.08 GiB", "78.09 GiB", "75.31 GiB", "1.83 GiB")
    d = classify(make(message=msg, ever_ready=True))
    assert d.oom_class is OomClass.FRAGMENTATION
    assert "in_pieces" in d.signals


def test_memory_used_up_is_not_fragmentation() -> None:
    msg = new_format("1.96 GiB", "79.18 GiB", "1.08 GiB", "78.09 GiB", "77.00 GiB", "0.50 GiB")
    d = classify(make(message=msg, ever_ready=True))
    assert d.oom_class is not OomClass.FRAGMENTATION
    assert "in_pieces" not in d.signals


def test_cached_bytes_are_no_fragmentation_during_graph_capture() -> None:
    # A capture allocates from the graph's private pool: the default pool's cached 2 GiB could not serve
    # the 1 GiB asked, and only 100 MiB was free. The capture's budget ran out, not a fragmented cache.
    msg = new_format("1.00 GiB", "79.33 GiB", "100.00 MiB", "79.19 GiB", "76.00 GiB", "2.00 GiB")
    d = classify(make(message=msg + "\n  File x, in capture_model", ever_ready=False, phase="starting"))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert "capture_private_pool" in d.signals and "reserved_large" not in d.signals
    assert any("private memory pool" in e for e in d.evidence)


def test_vllm_v0_capture_notice_marks_the_capture() -> None:
    # vLLM 0.3's model_runner logs "Capturing the model for CUDA graphs" before capture_model runs.
    log = "INFO model_runner.py:625] Capturing the model for CUDA graphs. This may lead to unexpected consequences"
    msg = new_format("112.00 MiB", "44.35 GiB", "53.38 MiB", "44.28 GiB", "37.38 GiB", "275.68 MiB")
    d = classify(make(message=msg, log_tail=log, ever_ready=False))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION


def test_the_same_figures_while_serving_are_fragmentation() -> None:
    msg = new_format("1.00 GiB", "79.33 GiB", "100.00 MiB", "79.19 GiB", "76.00 GiB", "2.00 GiB")
    d = classify(make(message=msg, ever_ready=True))
    assert d.oom_class is OomClass.FRAGMENTATION


def test_a_setting_named_by_vllm_outweighs_fragmented_figures() -> None:
    sampler = (
        "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. "
        "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.\n"
    )
    msg = new_format("786.00 MiB", "79.19 GiB", "552.50 MiB", "78.64 GiB", "74.91 GiB", "1.78 GiB")
    d = classify(make(message=sampler + msg, ever_ready=False))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION


def test_expandable_segments_on_takes_the_pieces_reading_away() -> None:
    msg = new_format("1.96 GiB", "79.18 GiB", "1.08 GiB", "78.09 GiB", "75.31 GiB", "1.83 GiB")
    d = classify(make(message=msg, ever_ready=True, config={"expandable_segments": True}))
    assert d.oom_class is not OomClass.FRAGMENTATION


# ---- the host's own words -------------------------------------------------------------------------------


def test_sigkill_with_an_oom_word_is_host_memory() -> None:
    msg = "The Python process exited with exit code 137 (SIGKILL). This may have been cause by OOM error."
    d = classify(make(message=msg, exit_code=137))
    assert d.oom_class is OomClass.HOST_MEMORY
    assert "host_kill" in d.signals


def test_sigkill_without_an_oom_word_is_not_a_host_kill() -> None:
    d = classify(make(message="worker received SIGKILL", exit_code=1))
    assert "host_kill" not in d.signals


def test_rays_worker_death_even_cut_short_is_host_memory() -> None:
    msg = (
        "(raylet) A worker died or was killed while executing a task by an unexpected system error. Worker "
        "exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code "
        "2. End of file. There are some potential root caus"
    )
    d = classify(make(message=msg, ever_ready=True, phase="serving"))
    assert d.oom_class is OomClass.HOST_MEMORY


def test_ray_oom_in_the_reporters_words_is_host_memory() -> None:
    d = classify(make(message="when I use multi gpu, I meet the ray OOM error."))
    assert d.oom_class is OomClass.HOST_MEMORY


def test_system_memory_is_host_memory() -> None:
    for msg in (
        "**System Memory** OOM after upgrading",
        "host-OOM for large models",
        "mem会用完，内存都不够",
    ):
        assert classify(make(message=msg)).oom_class is OomClass.HOST_MEMORY, msg


def test_ram_is_the_hosts_memory_and_gpu_ram_is_not() -> None:
    """RAM unqualified is the host's word for its memory (the GPU's is VRAM, GPU memory, HBM)."""
    for msg in (
        "the server's RAM fills up over a day of requests until the node runs out of memory (OOM)",
        "OOM: 64 GB of RAM used while loading the checkpoint",
    ):
        assert classify(make(message=msg, ever_ready=True)).oom_class is OomClass.HOST_MEMORY, msg
    for msg in ("OOM: the GPU RAM is full at 8k context", "OOM on a 24 GB VRAM card"):
        assert classify(make(message=msg, ever_ready=True)).oom_class is not OomClass.HOST_MEMORY, msg


def test_long_prompts_named_while_serving_are_kv_cache_overflow() -> None:
    """A report that ties a serving OOM to long prompts or a large context names the app's requests."""
    for msg in (
        "it runs out of memory once the agent's ever-growing conversations reach 30k tokens",
        "OOM with long prompts after a few hours of chat",
        "server crashes with out of memory when the context grows past 16k",
    ):
        d = classify(make(message=msg, ever_ready=True))
        assert d.oom_class is OomClass.KV_CACHE_OVERFLOW, (msg, d.evidence)
    # Before the server was Ready, a large context is a start-up budget, not the app's requests.
    start = classify(make(message="OOM with a large context window", ever_ready=False))
    assert start.oom_class is not OomClass.KV_CACHE_OVERFLOW
    # The host's memory stays the host's.
    host = classify(make(message="OOM: RAM fills up with long prompts", ever_ready=True))
    assert host.oom_class is OomClass.HOST_MEMORY


def test_an_oom_in_a_warm_up_after_the_graphs_is_the_batch_settings() -> None:
    """vLLM's warm-ups after the CUDA graphs run max_num_seqs sequences (the sampler) and
    max_num_batched_tokens tokens (the kernels) once everything else holds its memory."""
    captured = "INFO [gpu_model_runner.py:2046] Graph capturing finished in 12 secs, took 1.10 GiB"
    for incident in (
        make(message="OOM while warming up the kernels", ever_ready=False, phase="starting"),
        make(message="torch.OutOfMemoryError: CUDA out of memory.", log_tail=captured, ever_ready=False),
    ):
        d = classify(incident)
        assert d.oom_class is OomClass.BATCH_MISCONFIGURATION, d.evidence
        assert any("warm-up" in line for line in d.evidence), d.evidence
    # Once the server served, the capture line of its start is no evidence of a warm-up.
    served = classify(make(message="torch.OutOfMemoryError: CUDA out of memory.", log_tail=captured,
                           ever_ready=True))  # fmt: skip
    assert not any("warm-up" in line for line in served.evidence)


def test_oom_killer_named_is_host_memory() -> None:
    msg = "(1) The process is killed by SIGKILL by OOM killer due to high memory usage."
    assert classify(make(message=msg)).oom_class is OomClass.HOST_MEMORY


# ---- start-up steps that name a batch setting -----------------------------------------------------------


def test_bare_oom_in_the_profile_run_is_batch_settings() -> None:
    d = classify(
        make(
            message="OOM error",
            log_tail="Loading model weights took 19.9073 GB\nStarting profile run for multi-modal models.",
            ever_ready=False,
        )
    )
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION


def test_bare_oom_with_no_gpu_step_is_not_called_gpu() -> None:
    d = classify(make(message="OOM error", ever_ready=False))
    assert d.oom_class is OomClass.UNKNOWN


def test_tgi_warmup_oom_is_batch_settings() -> None:
    d = classify(make(message=TGI_FRACTION, ever_ready=False, phase="starting"))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    assert "profiling_oom" in d.signals


# ---- the plan without any wording ----------------------------------------------------------------------


def test_weights_planned_above_the_gpu_decide_without_wording() -> None:
    d = classify(
        make(
            message="",
            ever_ready=False,
            config={"tensor_parallel_size": 1},
            plan={"weights_gib": 131.4, "gpu_memory_gib": 44.4},
        )
    )
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM
    assert any("131.4 GiB" in e and "44.4 GiB" in e for e in d.evidence)


# ---- a termination message cut off inside a known message ----------------------------------------------


def test_kv_refusal_cut_mid_word_is_kv_overflow() -> None:
    msg = "ERROR 01-02 03:04:05 [core.py:1] ValueError: The model's max seq len (65536) is larger th"
    d = classify(make(message=msg, ever_ready=False, phase="starting"))
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW
    assert "max_len_exceeds_kv_cut" in d.signals


def test_v1_kv_refusal_cut_early_is_kv_overflow() -> None:
    d = classify(make(message="(EngineCore pid=7) ValueError: To serve at least one req", ever_ready=False))
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW


def test_ray_oom_cut_inside_its_name_is_host_memory() -> None:
    d = classify(make(message="ERROR 03-21 17:27:44 [core.py:340] ray.exceptions.OutOfMemo", ever_ready=True))
    assert d.oom_class is OomClass.HOST_MEMORY


def test_mmap_failure_cut_is_host_memory() -> None:
    d = classify(make(message="ERROR [core.py:396] RuntimeError: unable to mm", phase="loading"))
    assert d.oom_class is OomClass.HOST_MEMORY


def test_a_head_followed_by_other_words_is_not_a_cut_message() -> None:
    # The head matches but the text goes on differently: not the known message, so no signal.
    d = classify(make(message="To serve at low latency we use OOM guards", ever_ready=True))
    assert "max_len_exceeds_kv_cut" not in d.signals


# ---- a crash with no message: the metrics before it ------------------------------------------------------


def test_silent_crash_after_days_with_memory_creeping_is_fragmentation() -> None:
    d = classify(
        make(
            reason="Error",
            exit_code=1,
            ever_ready=True,
            seconds_since_ready=3 * 24 * 3600,
            metrics={"gpu_memory_growth_gib_per_hour": 0.2, "kv_cache_usage": 0.4},
        )
    )
    assert d.oom_class is OomClass.FRAGMENTATION
    assert "memory_climbing" in d.signals


def test_silent_crash_without_metrics_stays_unknown() -> None:
    d = classify(make(reason="Error", exit_code=1, ever_ready=True, seconds_since_ready=3 * 24 * 3600))
    assert d.oom_class is OomClass.UNKNOWN


# ---- the same causes in other words (each rule from the message's source, not from one report) -----------


def test_rays_node_running_low_on_memory_in_any_count_is_host_memory() -> None:
    # Ray's memory monitor, newer wording: a count of workers, and the kill reason line.
    for msg in (
        "3 worker(s) were killed due to the node running low on memory.",
        "OOM kill reason: Memory usage 15032385536B exceeded threshold of 14495514624B (95.0% of limit)",
    ):
        d = classify(make(message=msg, ever_ready=True))
        assert d.oom_class is OomClass.HOST_MEMORY, msg


def test_the_kernels_oom_killer_in_any_phrasing_is_host_memory() -> None:
    for msg in ("the pod was oom-killed twice", "cgroup OOMKilled the worker", "kernel oom_kill event"):
        d = classify(make(message=msg, exit_code=137))
        assert d.oom_class is OomClass.HOST_MEMORY, msg


def test_vllms_cpu_backend_runs_out_of_host_memory() -> None:
    # The CPU backend keeps weights and the KV cache (VLLM_CPU_KVCACHE_SPACE) in host RAM.
    d = classify(make(message="vllm-cpu server restarts with OOM under load", ever_ready=True))
    assert d.oom_class is OomClass.HOST_MEMORY


def test_kv_refusal_in_other_words_is_kv_overflow() -> None:
    for msg in (
        "ValueError: the KV cache cannot hold a single request of max_model_len 131072 tokens",
        "context length 32768 does not fit in the kv cache of this GPU",
    ):
        d = classify(make(message=msg, ever_ready=False))
        assert d.oom_class is OomClass.KV_CACHE_OVERFLOW, msg
        assert "kv_refusal_words" in d.signals


def test_the_kv_refusals_advice_alone_is_no_kv_refusal() -> None:
    msg = (
        "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    )
    assert "kv_refusal_words" not in classify(make(message=msg, ever_ready=False)).signals


def test_start_up_oom_naming_a_batch_setting_is_batch_settings() -> None:
    for msg in (
        "server fails with out of memory at launch when --max-num-batched-tokens is 32768",
        "OOM during start with cuda-graph-max-bs 512",
    ):
        d = classify(make(message=msg, ever_ready=False))
        assert d.oom_class is OomClass.BATCH_MISCONFIGURATION, msg
        assert "batch_setting_oom" in d.signals


def test_the_engines_advice_naming_a_setting_is_no_evidence() -> None:
    # vLLM prints this notice at every CUDA graph capture, crash or not.
    notice = (
        "CUDA graphs can take additional 1~3 GiB memory per GPU. If you are running out of memory, consider "
        "decreasing `gpu_memory_utilization` or enforcing eager mode. You can also reduce the `max_num_seqs` "
        "as needed to decrease memory usage."
    )
    d = classify(make(message="RuntimeError: OOM", log_tail=notice, ever_ready=False))
    assert "batch_setting_oom" not in d.signals


def test_memory_climbing_in_the_reports_words_while_serving_is_fragmentation() -> None:
    msg = "After two days the GPU memory kept increasing slowly until an OOM error stopped the server."
    d = classify(make(reason="Error", message=msg, ever_ready=True))
    assert "memory_climbing_text" in d.signals
    assert d.oom_class is OomClass.FRAGMENTATION


def test_host_memory_climbing_is_not_fragmentation() -> None:
    msg = "Ray OOM: the CPU memory keeps growing during rollouts until the worker is killed."
    d = classify(make(message=msg, ever_ready=True))
    assert d.oom_class is OomClass.HOST_MEMORY
    assert "memory_climbing_text" not in d.signals


@pytest.mark.parametrize("whose", ["CPU's memory", "CPU’s memory", "CPU memory"])
def test_the_cpus_memory_in_the_possessive_is_the_hosts(whose: str) -> None:
    # vllm-project/vllm#2793: "after continuous use I get an Out of Memory error from my CPU's memory."
    d = classify(
        make(message=f"after continuous use I get an Out of Memory error from my {whose}.", ever_ready=True)
    )
    assert "host_words" in d.signals and d.oom_class is OomClass.HOST_MEMORY


# ---- blind set 3's lessons (2026-11-29): wrapped sentences and other words for running out ----------


def test_an_engine_sentence_wrapped_across_lines_is_still_read() -> None:
    # vLLM raises its refusals as one line; a report, a terminal or a log collector wraps or re-spaces it.
    wrapped = (
        "ValueError: To serve at least one request with the model's max seq len (65536),\n"
        "  (9.0 GiB KV cache is needed, which is larger than\n"
        "the available KV cache memory (6.25 GiB)."
    )
    d = classify(make(message=wrapped, ever_ready=False))
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW and "max_len_exceeds_kv" in d.signals
    assert d.kv_capacity_tokens == 45511  # 65536 x 6.25 / 9.0: the figures were read, not only the words
    sampler = "RuntimeError: CUDA out of memory occurred when\nwarming up sampler with 512 dummy requests."
    d = classify(make(message=sampler, ever_ready=False))
    assert "sampler_warmup" in d.signals and d.warmup_requests == 512


def test_not_enough_memory_in_a_start_up_step_naming_a_batch_setting_is_batch_settings() -> None:
    # Engines other than PyTorch's allocator say "not enough memory" / "insufficient memory" for the same
    # refusal; a start-up step that names a batch setting decides it as it does for "out of memory".
    for msg in (
        'Error: Warmup(Generation("Not enough memory to handle 8192 prefill tokens. You need to decrease '
        '`--max-batch-prefill-tokens`"))',
        "RuntimeError: insufficient GPU memory for the profiling batch; lower max_num_batched_tokens",
    ):
        d = classify(make(message=msg, ever_ready=False, phase="starting"))
        assert d.oom_class is OomClass.BATCH_MISCONFIGURATION, msg


def test_gpu_memory_named_as_not_enough_is_a_gpu_out_of_memory() -> None:
    # "not enough GPU memory" and the Chinese 显存 (video memory) wordings name the GPU, as 内存 names
    # the host's memory: while loading the weights that is the model too big.
    for msg in ("RuntimeError: not enough GPU memory to allocate the embedding", "加载模型时显存不足"):
        d = classify(make(message=msg, ever_ready=False, phase="loading"))
        assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM, msg
    assert (
        classify(make(message="服务器内存不足，进程被杀", ever_ready=True)).oom_class is OomClass.HOST_MEMORY
    )


def test_an_oom_in_vllms_sleep_mode_pool_is_its_utilization_on_a_shared_gpu() -> None:
    # Sleep mode (vLLM's CuMemAllocator) exists to share the GPU with another process; its pool takes
    # gpu_memory_utilization of the whole GPU whatever the other holds: the fix is a lower utilization.
    trace = (
        'File "/opt/venv/lib/python3.12/site-packages/vllm/device_allocator/cumem.py", line 211, in wake_up\n'
        "RuntimeError: CUDA Error: out of memory at /src/csrc/cumem_allocator.cpp:71"
    )
    d = classify(make(message=trace, config={"gpu_memory_utilization": 0.85}))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION and "sleep_pool_oom" in d.signals
    assert propose_remediation(d, make(message=trace, config={"gpu_memory_utilization": 0.85})).action == (
        "lower_gpu_memory_utilization"
    )
    # While the weights load, the same pool's failure is no evidence about the budget.
    loading = "Loading safetensors checkpoint shards: 40% Completed\n" + trace
    assert "sleep_pool_oom" not in classify(make(message=loading, ever_ready=False)).signals


# ---- the CUDA runtime's own words -------------------------------------------------------------------
# cudaGetErrorString(cudaErrorMemoryAllocation) is "out of memory"; engines that check CUDA calls print it
# after the call that failed (TensorRT-LLM: "CUDA runtime error in <call>: <error string>"). Which memory
# it was is said by the call: cudaMalloc* / cuMemAlloc* / cuMemCreate take device memory, cudaMallocHost /
# cudaHostAlloc / cuMemAllocHost / cuMemHostAlloc take page-locked host memory (CUDA runtime and driver
# API references).


def test_a_failed_pinned_host_allocation_is_host_memory() -> None:
    text = "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocHost(&ptr, size): out of memory"
    d = classify(make(message=text, ever_ready=False, phase="starting"))
    assert "host_alloc" in d.signals
    assert d.oom_class is OomClass.HOST_MEMORY


def test_cuda_oom_in_a_reports_words_names_the_gpu() -> None:
    # "CUDA OOM" is the usual shorthand for torch.cuda.OutOfMemoryError: CUDA names the GPU's memory.
    d = classify(
        make(
            message="engine core died: CUDA OOM in the first forward pass", ever_ready=False, phase="starting"
        )
    )
    assert "gpu_only" in d.signals
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION


#: Host memory in the words of the kernel's signal and of shared memory, with no out-of-memory word:
#: - a child its parent reports killed by SIGKILL (Python's negative return code, Go's wording, the plain
#:   one): the parent lived, so no probe or deletion killed the container, and the kernel's OOM killer
#:   picks the largest process;
#: - a shared-memory segment that cannot be made or grown: /dev/shm is a tmpfs in RAM;
#: - the kernel's OOM killer in its own words, old and new, global and a cgroup's (mm/oom_kill.c);
#: - a CPU allocator's failure: PyTorch's DefaultCPUAllocator, NumPy's array allocation.
HOST_WORDINGS = [
    ("RuntimeError: Worker VllmWorkerProcess pid 812 died, exit code -9", "host_kill"),
    ("Loading safetensors checkpoint shards: 40% Completed | 12/30\nKilled", "host_kill"),
    ("[1]+  Killed                  python -m vllm.entrypoints.openai.api_server", "host_kill"),
    ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.", "host_kill"),
    ("ProcessExitedException: process 0 terminated with signal SIGKILL", "host_kill"),
    ("torch.distributed.elastic: failed (exitcode: -9) local_rank: 0 (pid: 1234)", "host_kill"),
    ("engine container exited with code 137 after the OOM", "host_kill"),
    ("Memory cgroup out of memory: Killed process 4242 (python3) total-vm:81234100kB", "host_alloc"),
    ("Out of memory: Kill process 812 (python) score 937 or sacrifice child", "host_alloc"),
    (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:83] DefaultCPUAllocator: can't allocate memory",
        "host_alloc",
    ),
    (
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 3.20 GiB for an array with shape",
        "host_alloc",
    ),
    ("model runner process has terminated: signal: killed", "host_kill"),
    ("the engine process was killed by signal 9 while loading shards", "host_kill"),
    (
        "ncclSystemError: Last error: Error while creating shared memory segment /dev/shm/nccl-Ab12",
        "shm_full",
    ),
    ("NCCL WARN Error: failed to extend /dev/shm/nccl-Qw3 to 33030144 bytes", "shm_full"),
    ("OSError: [Errno 28] No space left on device: '/dev/shm/psm_5f2e'", "shm_full"),
    ("Error: Download process was signaled to shutdown with signal 7", "bus_error"),
    (
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
        "memory (shm).",
        "bus_error",
    ),
    ("/entrypoint.sh: line 12:    57 Bus error               (core dumped) python3 -m server", "bus_error"),
]


@pytest.mark.parametrize(("text", "signal"), HOST_WORDINGS)
def test_host_memory_in_the_words_of_the_kernel_shared_memory_and_cpu_allocators(
    text: str, signal: str
) -> None:
    d = classify(make(message=text, ever_ready=False, phase="starting"))
    assert signal in d.signals
    assert d.oom_class is OomClass.HOST_MEMORY


def test_signal_9s_number_or_a_full_disk_elsewhere_is_not_host_memory() -> None:
    exit_9 = classify(make(message="exit code 9: bad argument --max-model-len", ever_ready=False))
    said = classify(make(message="Killed by the user after the benchmark; CUDA out of memory before that"))
    assert "host_kill" not in said.signals
    code_1370 = classify(make(message="CUDA out of memory; the job exited with code 1370"))
    assert "host_kill" not in code_1370.signals
    disk = classify(make(message="OSError: [Errno 28] No space left on device: '/root/.cache/huggingface'"))
    assert "host_kill" not in exit_9.signals and "shm_full" not in disk.signals
    # SIGBUS is signal 7 exactly: not 70, not exit code 7.
    signal_70 = classify(make(message="worker exited with signal 70 after CUDA out of memory"))
    exit_7 = classify(make(message="launcher exited with exit code 7; CUDA out of memory"))
    assert "bus_error" not in signal_70.signals and "bus_error" not in exit_7.signals


def test_a_bus_error_looks_at_the_pods_shared_memory() -> None:
    d = classify(
        make(message="Error: Download process was signaled to shutdown with signal 7", ever_ready=False)
    )
    remedy = propose_remediation(d, make(message="", ever_ready=False))
    assert any("/dev/shm" in line for line in remedy.look_at), remedy.look_at


def test_cuda_runtime_error_2_as_ggml_prints_it_is_a_gpu_out_of_memory() -> None:
    # cudaErrorMemoryAllocation is error 2; llama.cpp prints "CUDA error <code> at <file>:<line>: <name>".
    text = "CUDA error 2 at /src/llama.cpp/ggml-cuda.cu:7641: out of memory\ncurrent device: 0"
    d = classify(make(message=text, ever_ready=False, phase="starting"))
    assert "gpu_only" in d.signals
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION  # after the weights, before Ready: the budget


@pytest.mark.parametrize(
    "text",
    [
        "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMalloc(&ptr, size): out of memory "
        "(/src/cpp/tensorrt_llm/runtime/bufferManager.cpp:88)",
        "NCCL WARN Cuda failure 'out of memory'",
        "include/alloc.h:48 NCCL WARN Cuda failure 2 'out of memory'",
        "cupy_backends.cuda.api.driver.CUDADriverError: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
        "HIP error: hipErrorOutOfMemory",
        "RuntimeError: [TM][ERROR] CUDA runtime error: out of memory /src/turbomind/utils/memory_utils.cu:32",
        "Runtime Error: cuda: out of memory",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8589934592 bytes.",
    ],
)
def test_the_gpu_runtimes_own_names_for_out_of_memory_are_a_gpu_out_of_memory(text: str) -> None:
    # The CUDA runtime's, NCCL's, the CUDA driver's, ROCm's and XLA's wordings of a failed device
    # allocation.
    d = classify(make(message=text, ever_ready=False, phase="starting"))
    assert "gpu_only" in d.signals
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION  # after the weights, before Ready: the budget


def test_a_memory_leak_named_while_serving_is_the_creep_a_restart_clears() -> None:
    # A leak is memory that climbs under a steady load until it runs out: the class whose fix is a
    # restart (and expandable segments), not a smaller batch. Before Ready it says nothing of the kind.
    text = "There is a GPU memory leak in the server: after two days of requests, CUDA out of memory."
    serving = classify(make(message=text, ever_ready=True, phase="serving"))
    assert "memory_climbing_text" in serving.signals
    assert serving.oom_class is OomClass.FRAGMENTATION
    starting = classify(make(message=text, ever_ready=False, phase="starting"))
    assert "memory_climbing_text" not in starting.signals


@pytest.mark.parametrize(
    "msg",
    [
        # "continued to" is a steady climb in other words; VRAM is the GPU's memory by another name.
        "Right after deployment 20G was free on each GPU. The memory usage continued to increase, and "
        "finally OOM occurred.",
        "llama-server VRAM usage gradually increasing with each run until OOM.",
    ],
)
def test_memory_climbing_in_other_words_while_serving_is_fragmentation(msg: str) -> None:
    d = classify(make(reason="Error", message=msg, ever_ready=True))
    assert "memory_climbing_text" in d.signals
    assert d.oom_class is OomClass.FRAGMENTATION


def test_a_leak_named_is_evidence_of_running_out_without_the_word_oom() -> None:
    # A server that says its memory leaks and then crashes ran out of that memory: no "OOM" is needed.
    d = classify(make(reason="Error", message="As titled, there is a GPU memory leak.", ever_ready=True))
    assert "memory_climbing_text" in d.signals
    assert d.oom_class is OomClass.FRAGMENTATION
    # Python's note at shutdown about leaked semaphores or shared_memory objects names no memory leak.
    shutdown = (
        "resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 1 leaked semaphore "
        "objects to clean up at shutdown\nresource_tracker: There appear to be 5 leaked shared_memory "
        "objects to clean up at shutdown"
    )
    quiet = classify(make(reason="Error", message=shutdown, ever_ready=True))
    assert quiet.oom_class is OomClass.UNKNOWN
    assert "memory_climbing_text" not in quiet.signals


def test_an_out_of_memory_the_loader_reports_itself_is_the_gpus() -> None:
    # Host memory running out while loading has words of its own (a kill, MemoryError, a failed mmap);
    # a loader alive to say "out of memory" in none of them failed a device allocation: the weights.
    said = "Running out of memory when loading large model in dual GPU setup."
    d = classify(make(reason="Error", message=said, ever_ready=False, phase="loading"))
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM
    host = classify(
        make(
            reason="Error",
            message="Loading weights: OSError: [Errno 12] Cannot allocate memory (out of memory)",
            ever_ready=False,
            phase="loading",
        )
    )
    assert host.oom_class is OomClass.HOST_MEMORY
    # Not loading: a bare "out of memory" names no device, and the loading rule says nothing.
    after = classify(
        make(reason="Error", message=said.replace(" when loading large model", ""), ever_ready=True)
    )
    assert after.oom_class is OomClass.UNKNOWN


@pytest.mark.parametrize("what", ["GPU", "CUDA", "device", "video"])
def test_running_out_of_the_gpus_memory_in_other_words_is_a_gpu_out_of_memory(what: str) -> None:
    # "out of CUDA memory" names the device that ran out as surely as torch's "CUDA out of memory".
    said = f"The model loads, then the server runs out of {what} memory while it starts."
    d = classify(make(reason="Error", message=said, ever_ready=False, phase="starting"))
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION
    vram = classify(
        make(reason="Error", message="Ran out of VRAM at start-up.", ever_ready=False, phase="starting")
    )
    assert vram.oom_class is OomClass.BATCH_MISCONFIGURATION


LLAMA_CPP_KV = (
    "llama_new_context_with_model: n_ctx      = 163840\n"
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 43200.00 MiB on device 0: cudaMalloc failed\n"
    "llama_kv_cache_init: failed to allocate buffer for kv cache\n"
    "llama_new_context_with_model: llama_kv_cache_init() failed for self-attention cache"
)


def test_an_engine_that_cannot_allocate_its_whole_contexts_kv_cache_at_start_up_is_kv_overflow() -> None:
    # llama.cpp allocates the KV cache for the whole configured context (n_ctx) before it serves: failing
    # to allocate it means that context's KV cache does not fit, whatever device holds it.
    d = classify(make(message=LLAMA_CPP_KV, ever_ready=False))
    assert decided(d) == (OomClass.KV_CACHE_OVERFLOW, "kv_alloc_failed")
    said = "it runs out of memory with the kv buffer size allocating about 43G for a 160K context"
    assert classify(make(message=said, ever_ready=False)).oom_class is OomClass.KV_CACHE_OVERFLOW


def test_the_kv_caches_own_failure_outranks_a_coarse_loading_phase() -> None:
    # Every engine allocates its KV cache after the weights: a failure that names the KV cache's
    # allocation came after loading, whatever the coarse phase (a log cut short reads as "loading").
    d = classify(make(message=LLAMA_CPP_KV, ever_ready=False, phase="loading"))
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW
    assert "at_load" not in d.signals
    # vLLM's own "Failed to load model - not enough GPU memory" is the load, whatever else is said.
    failed = classify(
        make(
            message="Failed to load model - not enough GPU memory. " + LLAMA_CPP_KV,
            ever_ready=False,
            phase="loading",
        )
    )
    assert failed.oom_class is not OomClass.KV_CACHE_OVERFLOW


def test_a_kv_cache_allocation_failing_while_serving_is_not_the_contexts_kv_cache() -> None:
    # Once serving, the up-front cache is in place: a later failure to allocate is something else (an
    # offload buffer, a pool), not the context's KV cache.
    d = classify(make(message=LLAMA_CPP_KV, ever_ready=True, phase="serving"))
    assert "kv_alloc_failed" not in d.signals


# ---- the model's name stands in for the plan's weights -----------------------------------------------

BARE_OOM = "torch.OutOfMemoryError: CUDA out of memory."


def named(model: str, gpu_gib: float, ever_ready: bool = False, **fields: Any) -> Diagnosis:
    """A bare GPU out-of-memory of ``model`` on a GPU of ``gpu_gib``, with no weights in its plan."""
    plan = {"gpu_memory_gib": gpu_gib, **fields.pop("plan", {})}
    return classify(make(message=BARE_OOM, ever_ready=ever_ready, model=model, plan=plan, **fields))


def test_a_named_model_too_big_for_its_gpu_is_model_too_big_without_a_plan() -> None:
    # vllm-project/vllm#23050: Qwen3-30B-A3B on one 32 GiB RTX 5090; the error text says nothing else.
    d = named("Qwen3-30B-A3B-Thinking-2507", 32)
    assert decided(d) == (OomClass.MODEL_EXCEEDS_VRAM, "named_weights_exceed_gpu")
    assert "Qwen3-30B-A3B-Thinking-2507" in d.decided_by[1]
    # Without the name the same incident does not decide.
    assert (
        classify(make(message=BARE_OOM, ever_ready=False, plan={"gpu_memory_gib": 32})).oom_class
        is OomClass.UNKNOWN
    )


def test_the_gpus_size_comes_from_the_allocators_total_capacity_when_the_plan_has_none() -> None:
    # sgl-project/sglang#5576: gemma-3-12b-it (bfloat16, 22.7 GiB) on a 16 GB card.
    message = new_format("226.00 MiB", "15.58 GiB", "71.25 MiB", "13.94 GiB", "13.64 GiB", "67.23 MiB")
    d = classify(make(message=message, ever_ready=False, model="google/gemma-3-12b-it"))
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM and "named_weights_exceed_gpu" in d.signals
    assert classify(make(message=message, ever_ready=False)).oom_class is OomClass.UNKNOWN


def test_a_named_model_that_leaves_no_room_under_the_budget_counts_for_model_too_big() -> None:
    # 14 B parameters in 16 bits (26 GiB at least) on a 28 GiB GPU: past 0.9 of it.
    d = named("Qwen2.5-14B-Instruct-custom", 28)
    assert "named_weights_no_room" in d.signals


def test_tensor_parallel_spreads_the_named_weights() -> None:
    one = named("Llama-3.3-70B-custom", 80)
    four = named("Llama-3.3-70B-custom", 80, config={"tensor_parallel_size": 4})
    assert "named_weights_exceed_gpu" in one.signals
    assert not {"named_weights_exceed_gpu", "named_weights_no_room"} & set(four.signals)


def test_a_floor_read_from_a_name_never_says_the_weights_fit() -> None:
    # A name's figure is a floor: it can show the weights too big, never comfortably small.
    floor = named("TinyModel-1B-custom", 80, ever_ready=True)
    assert "weights_fit" not in floor.signals
    # The catalog's count is exact: that one can.
    catalog = named("Qwen/Qwen3-8B", 80, ever_ready=True)
    assert "weights_fit" in catalog.signals


def test_the_host_running_out_is_not_turned_into_model_too_big_by_a_name() -> None:
    d = classify(
        make(reason="OOMKilled", exit_code=137, model="Llama-3.3-70B-custom", plan={"gpu_memory_gib": 24})
    )
    assert d.oom_class is OomClass.HOST_MEMORY
    assert not {"named_weights_exceed_gpu", "named_weights_no_room"} & set(d.signals)


def test_the_plans_own_weights_outrank_the_name() -> None:
    d = named("Llama-3.3-70B-custom", 80, plan={"weights_gib": 35.0})
    assert not {"named_weights_exceed_gpu", "named_weights_no_room", "weights_exceed_gpu"} & set(d.signals)


def test_the_weights_vllm_logged_outrank_a_floor_from_the_name() -> None:
    # club-3090#708: a 75 B NVFP4 model over several 24 GiB GPUs (the incident does not say how many);
    # vLLM's own "Model loading took 13.31 GiB" is what one GPU held, so the weights fit and the
    # profiling run's batch was what ran out.
    message = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has 23.56 GiB total, 1.08 GiB free,\n22.46 GiB "
        "in use. (Model loading took 13.31 GiB) — during torch.compile autotuning in _dummy_run"
    )
    model = "nvidia/NVIDIA-Nemotron-Labs-3-Puzzle-75B-A9B-NVFP4"
    d = classify(
        make(message=message, ever_ready=False, phase="starting", model=model, plan={"gpu_memory_gib": 24})
    )
    assert "named_weights_exceed_gpu" not in d.signals and "weights_fit" in d.signals
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION


# ---- other accelerators' allocators say how large their largest free block was ----------------------

PJRT = (
    "RESOURCE_EXHAUSTED: Error allocating device buffer: \nAttempting to allocate 1.96G. \nThat was not "
    "possible. \nThere are 3.46G free. \nThe largest contiguous region of free memory is 1.75G due to "
    "fragmentation."
)
TT_METAL = (
    "TT_FATAL: Out of Memory: Not enough space to allocate 1879048192 B DRAM buffer across 8 banks,\nwhere "
    "each bank needs to store 234881024 B, but bank size is 4272341376 B\n(allocated: 3993427840 B, free: "
    "278913536 B, largest free block: 134217728 B)"
)


@pytest.mark.parametrize("message", [PJRT, TT_METAL])
def test_free_memory_with_no_block_as_large_as_the_request_is_fragmentation(message: str) -> None:
    # Read during loading, the figures outrank the phase: device memory fragments while loading too.
    d = classify(make(message=message, ever_ready=False, phase="loading"))
    assert decided(d) == (OomClass.FRAGMENTATION, "largest_block_short")


def test_a_largest_block_as_large_as_the_request_is_not_fragmentation() -> None:
    used_up = PJRT.replace("There are 3.46G free", "There are 1.50G free")
    assert "largest_block_short" not in classify(make(message=used_up, ever_ready=False)).signals


def test_running_out_of_a_tpus_hbm_is_the_devices_memory() -> None:
    # GoogleCloudPlatform/kubernetes-engine-samples#1467: Llama 3.1 405B on TPU slices of 16 GiB HBM.
    message = (
        "RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
        "memory in memory space hbm. Used 20.44G of 15.75G hbm. Exceeded hbm capacity by 4.70G."
    )
    d = classify(make(message=message, ever_ready=False, model="LLama-3.1-405B", plan={"gpu_memory_gib": 16}))
    assert "gpu_only" in d.signals and d.oom_class is OomClass.MODEL_EXCEEDS_VRAM


# ---- "OOM" as reports write it: a verb, lower case, beside CJK text ------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        "It OOMs while loading the weights onto one A100 80G",
        "the loader OOMed halfway through the checkpoint shards",
        "it fails on oom while loading",
        "加载到单卡上，出现OOM ， A100 80G",
        # "not ... enough memory" with words between
        "Error: llama runner exited, you may not have enough available memory to run this model",
        "the card does not have enough GPU memory for this checkpoint",
        "we don't have enough free memory on the device",
    ],
)
def test_out_of_memory_as_reports_write_it_is_an_out_of_memory(message: str) -> None:
    # "OOM" as a verb, in lower case or beside CJK text, and "not ... enough memory" with words between.
    d = classify(make(message=message, ever_ready=False, phase="loading"))
    assert "at_load" in d.signals
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM


@pytest.mark.parametrize("message", ["bloom-7b loaded into the room", "zoomed in on the loader"])
def test_oom_inside_a_word_is_not_an_out_of_memory(message: str) -> None:
    d = classify(make(message=message, ever_ready=False, phase="loading"))
    assert d.oom_class is OomClass.UNKNOWN and "at_load" not in d.signals


# ---- fragmentation named outside PyTorch's advice ----------------------------------------------------

FRAGMENTATION_NAMED = (
    "The upgrade from PyTorch 2.9 to 2.10 seems to have substantially increased memory fragmentation during "
    "startup and cudagraph capture, leading to OOMs during startup for some models."
)


def test_fragmentation_named_by_the_report_is_fragmentation_even_during_capture() -> None:
    d = classify(make(message=FRAGMENTATION_NAMED, ever_ready=False))
    assert decided(d) == (OomClass.FRAGMENTATION, "fragmentation_text")


def test_pytorchs_advice_sentence_names_no_fragmentation() -> None:
    message = new_format("2.00 GiB", "23.64 GiB", "1.00 GiB", "22.5 GiB", "22.3 GiB", "50.00 MiB") + ADVICE
    assert "fragmentation_text" not in classify(make(message=message, ever_ready=True)).signals


# ---- a process that says "out of memory" and was not killed ran out of device memory ------------------


def test_a_live_process_out_of_memory_while_serving_is_the_gpus() -> None:
    d = classify(make(message="the server went out of memory on a request", ever_ready=True))
    assert "runtime_gpu_oom" in d.signals and "gpu_only" in d.signals


def test_the_same_words_from_a_killed_container_are_the_hosts() -> None:
    d = classify(
        make(message="the server went out of memory on a request", ever_ready=True, reason="OOMKilled")
    )
    assert "runtime_gpu_oom" not in d.signals
    assert d.oom_class is OomClass.HOST_MEMORY


# ---- the KV cache's own allocation is not a dummy batch -----------------------------------------------


def test_a_kv_cache_allocation_at_start_up_is_not_read_as_the_profiling_batch() -> None:
    message = (
        "CUDA error: out of memory\nllama_kv_cache_init: failed to allocate buffer for kv cache\n"
        "llama_new_context_with_model: llama_kv_cache_init() failed for self-attention cache"
    )
    d = classify(make(message=message, ever_ready=False, phase="starting"))
    assert "after_load" not in d.signals
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW


# ---- an engine's KV cache with no room for the next batch --------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        "decode: failed to find KV cache slot for ubatch of size 454\nllama_decode: failed to decode, ret = 1",
        "decode: failed to find a memory slot for batch of size 512",
        "panic: failed to decode batch: could not find a kv cache slot",
    ],
)
def test_no_kv_cache_slot_is_a_full_or_a_scattered_cache(message: str) -> None:
    # llama.cpp places a batch in contiguous cells: full and fragmented give the same message.
    d = classify(make(message=message, ever_ready=True))
    assert "kv_slot_full" in d.signals
    scores = dict(d.scores)
    assert scores[OomClass.KV_CACHE_OVERFLOW] > 0 and scores[OomClass.FRAGMENTATION] > 0
    assert d.oom_class is OomClass.UNKNOWN


def test_no_kv_cache_slot_with_prompts_at_the_limit_is_kv_overflow() -> None:
    d = classify(
        make(
            message="decode: failed to find KV cache slot for ubatch of size 454",
            ever_ready=True,
            metrics={"prompt_tokens_max": 15480},
            config={"max_model_len": 16384},
        )
    )
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW


def test_a_full_kv_cache_pool_is_kv_overflow() -> None:
    message = "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.5"
    d = classify(make(message=message, ever_ready=True))
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW and "kv_pool_full" in d.signals


# ---- vLLM's CPU swap space is host memory -------------------------------------------------------------


def test_cpu_swap_space_running_out_is_host_memory() -> None:
    message = (
        "RuntimeError: Aborted due to the lack of CPU swap space. Please increase the swap space to avoid "
        "this error."
    )
    assert classify(make(message=message, ever_ready=True)).oom_class is OomClass.HOST_MEMORY


# ---- ROCm's runtime says its device allocation failed in its own words ---------------------------------


def test_rocm_block_allocator_failure_is_the_gpus() -> None:
    message = "VRAM usage keeps growing during generation until\nHSA exception: MemoryRegion::BlockAllocator::alloc failed"
    d = classify(make(message=message, ever_ready=True))
    assert "runtime_gpu_oom" in d.signals and "gpu_only" in d.signals


# ---- a long configured context at start-up -----------------------------------------------------------

START_UP_OOM = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB."


def test_a_long_context_with_no_step_named_at_start_up_is_the_contexts() -> None:
    d = classify(make(message=START_UP_OOM, ever_ready=False, config={"max_model_len": 524288}))
    assert decided(d) == (OomClass.KV_CACHE_OVERFLOW, "long_context_startup")


@pytest.mark.parametrize(
    ("extra", "config"),
    [
        ("", {"max_model_len": 8192}),
        ("", {"max_model_len": 524288, "max_num_batched_tokens": 524288}),
        ("\nCapturing CUDA graph shapes: 40%", {"max_model_len": 524288}),
        ("\nUnable to warmup model", {"max_model_len": 524288}),
    ],
)
def test_a_short_context_a_set_batch_or_a_named_step_is_not_the_contexts(
    extra: str, config: dict[str, int]
) -> None:
    d = classify(make(message=START_UP_OOM + extra, ever_ready=False, config=config))
    assert "long_context_startup" not in d.signals


def test_a_long_context_while_serving_is_not_read_as_start_up() -> None:
    d = classify(make(message=START_UP_OOM, ever_ready=True, config={"max_model_len": 524288}))
    assert "long_context_startup" not in d.signals


# ---- vLLM's refusal when its cache cannot hold max_num_seqs sequences ----------------------------------


@pytest.mark.parametrize(
    "message",
    [
        "ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (856). Each decode sequence "
        "requires one Mamba cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to "
        "at most 856 or increase gpu_memory_utilization.",
        "exceeds available Mamba cache blocks (95)... CUDA graph capture cannot proceed",
    ],
)
def test_a_cache_that_cannot_hold_max_num_seqs_sequences_is_batch_settings(message: str) -> None:
    d = classify(make(message=message, ever_ready=False, phase="starting"))
    assert decided(d) == (OomClass.BATCH_MISCONFIGURATION, "seqs_exceed_cache")


# ---- ggml's context buffer lives in host memory -------------------------------------------------------


def test_ggml_context_buffer_that_cannot_be_allocated_is_host_memory() -> None:
    message = "GGML_ASSERT: /src/llama.cpp/ggml.c:4411: ctx->mem_buffer != NULL"
    assert (
        classify(make(message=message, ever_ready=False, phase="loading")).oom_class is OomClass.HOST_MEMORY
    )


# ---- "not ... enough memory" with words between -----------------------------------------------------


def test_enough_memory_said_without_a_negation_is_not_an_out_of_memory() -> None:
    d = classify(make(message="the node has enough memory for the model", ever_ready=False, phase="loading"))
    assert "at_load" not in d.signals


# ---- a budget that leaves almost nothing outside it -----------------------------------------------


def test_cached_pieces_under_a_near_full_budget_are_not_called_fragmentation() -> None:
    message = new_format("138.00 MiB", "23.56 GiB", "110.50 MiB", "23.1 GiB", "22.57 GiB", "529.27 MiB")
    near_full = classify(make(message=message, ever_ready=True, config={"gpu_memory_utilization": 0.98}))
    assert near_full.oom_class is not OomClass.FRAGMENTATION
    default = classify(make(message=message, ever_ready=True, config={"gpu_memory_utilization": 0.9}))
    assert default.oom_class is OomClass.FRAGMENTATION


# ---- a pinned host buffer the CUDA driver refused is host memory -------------------------------------

PINNED_TRACE = (
    '  File "/opt/app/offload/buffers.py", line 212, in __init__\n'
    "    self.cpu_blocks = torch.empty(size, dtype=torch.uint8, pin_memory=True)\n"
    "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    "RuntimeError: CUDA error: {error}\n"
    "CUDA kernel errors might be asynchronously reported at some other API call."
)


@pytest.mark.parametrize("error", ["out of memory", "invalid argument"])
def test_a_pinned_host_buffer_the_driver_refused_is_host_memory(error: str) -> None:
    d = classify(make(message=PINNED_TRACE.format(error=error), ever_ready=False, phase="starting"))
    assert decided(d) == (OomClass.HOST_MEMORY, "pinned_host")
    assert "gpu_only" not in d.signals


def test_a_device_allocation_beside_pinned_memory_is_still_the_gpus() -> None:
    # A data loader's pin_memory=True in the traceback does not make PyTorch's device allocator's own
    # message (which says what it tried to allocate on which GPU) a host failure.
    message = "loader = DataLoader(ds, pin_memory=True)\n" + new_format(
        "2.00 GiB", "79.15 GiB", "1.02 GiB", "78.1 GiB", "77.5 GiB", "100.00 MiB"
    )
    d = classify(make(message=message, ever_ready=True))
    assert "pinned_host" not in d.signals and "gpu_only" in d.signals


# ---- transformers refuses to put part of a quantized model on the CPU ----------------------------------


def test_a_quantized_model_that_would_be_dispatched_to_the_cpu_does_not_fit_the_gpu() -> None:
    message = (
        "ValueError: Some modules are dispatched on the CPU or the disk. Make sure you have enough GPU RAM\n"
        "to fit the quantized model. If you want to dispatch the model on the CPU or the disk while keeping "
        "these modules in 32-bit, you need to set `load_in_8bit_fp32_cpu_offload=True`"
    )
    d = classify(make(message=message, ever_ready=False))
    assert decided(d) == (OomClass.MODEL_EXCEEDS_VRAM, "quant_dispatch")


# ---- one request larger than the whole GPU at start-up -------------------------------------------------


def test_a_start_up_request_larger_than_the_gpu_is_a_batch_the_settings_sized() -> None:
    message = new_format("1029.51 GiB", "79.35 GiB", "19.23 GiB", "60.12 GiB", "58.52 GiB", "310.01 MiB")
    d = classify(make(message=message, ever_ready=False, config={"max_num_batched_tokens": 32768}))
    assert decided(d) == (OomClass.BATCH_MISCONFIGURATION, "request_exceeds_gpu")


def test_a_request_within_the_gpu_or_while_serving_is_not_read_as_larger_than_it() -> None:
    within = new_format("12.00 GiB", "79.35 GiB", "1.23 GiB", "78.1 GiB", "77.5 GiB", "310.01 MiB")
    assert "request_exceeds_gpu" not in classify(make(message=within, ever_ready=False)).signals
    larger = new_format("1029.51 GiB", "79.35 GiB", "19.23 GiB", "60.12 GiB", "58.52 GiB", "310.01 MiB")
    assert "request_exceeds_gpu" not in classify(make(message=larger, ever_ready=True)).signals


# ---- one prompt past a long context while serving ------------------------------------------------------

SERVING_OOM = "CUDA error: out of memory\n  current device: 0, in function alloc at ggml-cuda.cu:527"


def test_a_prompt_past_a_long_context_is_the_requests_context_whatever_the_window() -> None:
    d = classify(
        make(
            message=SERVING_OOM,
            ever_ready=True,
            metrics={"prompt_tokens_max": 127526},
            config={"max_model_len": 262144},
        )
    )
    assert decided(d) == (OomClass.KV_CACHE_OVERFLOW, "prompt_past_long_context")


@pytest.mark.parametrize(("prompt", "ever_ready"), [(8000, True), (127526, False)])
def test_a_short_prompt_or_a_start_up_crash_is_not_read_as_a_long_request(
    prompt: int, ever_ready: bool
) -> None:
    d = classify(make(message=SERVING_OOM, ever_ready=ever_ready, metrics={"prompt_tokens_max": prompt}))
    assert "prompt_past_long_context" not in d.signals


# ---- memory climbing, in more of the ways reports say it -----------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        "Memory consumption climbs steadily at a rate of ~0.1GB per inference iteration; it is not "
        "reclaimed and ultimately triggers an OOM crash.",
        "After each prefill and generate cycle, VRAM usage increases by approximately 10 MB, and this "
        "accumulation continues until the process eventually runs out of memory (OOM).",
    ],
)
def test_memory_climbing_said_verb_first_or_per_request_is_climbing(message: str) -> None:
    d = classify(make(message=message, ever_ready=True))
    assert "memory_climbing_text" in d.signals
    assert d.oom_class is OomClass.FRAGMENTATION


def test_latency_growing_after_each_request_is_not_memory_climbing() -> None:
    message = "After each request the latency increases; the server then ran out of memory on a 9k prompt."
    assert "memory_climbing_text" not in classify(make(message=message, ever_ready=True)).signals


# ---- a batch setting named while the weights load ------------------------------------------------------

TINY_BUDGETS = (
    "I can load this in transformers using device='auto' but when I try loading in tgi even with tiny "
    "max_total_tokens and max_batch_prefill_tokens I get cuda OOM."
)


def test_a_batch_setting_named_while_the_weights_load_is_not_what_asked() -> None:
    d = classify(make(message=TINY_BUDGETS, ever_ready=False, phase="loading"))
    assert "batch_setting_oom" not in d.signals
    assert d.oom_class is OomClass.MODEL_EXCEEDS_VRAM


def test_a_batch_setting_named_after_the_weights_loaded_still_counts() -> None:
    d = classify(make(message=TINY_BUDGETS, ever_ready=False, phase="starting"))
    assert "batch_setting_oom" in d.signals


# ---- torch_npu's messages and condensed figures -------------------------------------------------------

NPU_OOM = (
    "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.96 GiB total capacity; "
    "40.10 GiB already allocated; 40.10 GiB current active; 1.80 GiB free; 40.50 GiB reserved in total by "
    "PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation."
)


def test_an_npu_out_of_memory_is_the_devices_with_its_figures_read() -> None:
    fig = parse_oom_text(NPU_OOM)
    assert fig is not None and fig.fmt == "old"
    assert (fig.requested_gib, fig.total_gib, fig.allocated_gib, fig.free_gib) == (2.0, 60.96, 40.1, 1.8)
    assert fig.reserved_total_gib == 40.5
    d = classify(make(message=NPU_OOM, ever_ready=True))
    assert "runtime_gpu_oom" in d.signals and "gpu_only" in d.signals


def test_this_process_figure_condensed_by_a_report_is_still_this_process() -> None:
    # "… this process has X in use" without torch's "memory": the other process listed is not this one,
    # so the GPU is not read as crowded by another process.
    message = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 594.00 MiB.\n"
        "GPU 0 has a total capacity of 22.03 GiB of which 582.00 MiB is free.\n"
        "Process 29529 has 796.00 MiB memory in use. ... this process has 20.67 GiB in use."
    )
    fig = parse_oom_text(message)
    assert fig is not None and fig.process_in_use_gib == 20.67
    d = classify(make(message=message, ever_ready=False, phase="starting"))
    assert "external_memory" not in d.signals
    assert d.oom_class is OomClass.BATCH_MISCONFIGURATION


# ---- an allocator's pool reservation, and the host's memory in more words -----------------------------


def test_a_failed_pool_address_reservation_is_the_allocators_not_a_tensors() -> None:
    message = (
        "CUDA error: out of memory\n  current device: 0, in function alloc at ggml-cuda.cu:476\n"
        "  cuMemAddressReserve(&pool_addr, CUDA_POOL_VMM_MAX_SIZE, 0, 0, 0)"
    )
    d = classify(make(message=message, ever_ready=True))
    assert decided(d) == (OomClass.FRAGMENTATION, "pool_reserve_failed")


def test_a_failed_physical_allocation_is_not_read_as_a_pool_reservation() -> None:
    message = (
        "CUDA error: out of memory\n  current device: 0, in function alloc at ggml-cuda.cu:527\n"
        "  cuMemCreate(&handle, reserve_size, &prop, 0)"
    )
    assert "pool_reserve_failed" not in classify(make(message=message, ever_ready=True)).signals


@pytest.mark.parametrize("words", ["triggers a host-wide OOM", "ends in a system-wide OOM every day"])
def test_a_host_or_system_wide_oom_is_host_memory(words: str) -> None:
    d = classify(make(message=f"On a 16 GB appliance that 8 GiB prompt cache {words}.", ever_ready=True))
    assert d.oom_class is OomClass.HOST_MEMORY
