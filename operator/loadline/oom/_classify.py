"""Deciding why a vLLM pod ran out of memory.

Every piece of evidence is a *signal* (see ``data/signals.json``): a fact read from the termination text,
the timing, the plan, the config or the metrics, with a weight for each class it speaks for (or
against) and a sentence saying it. A class's score is the sum of its signals' weights, capped at 1.
The top class wins only if it is clearly ahead: a weak or contested lead gives ``unknown`` with a low
confidence, because a confident wrong answer would make the operator apply the wrong fix.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

from loadline.observe import logged_weights_gib
from loadline.oom._model import CAUSES, AllocatorFigures, Diagnosis, Incident, OomClass
from loadline.oom._parse import parse_oom_text
from loadline.oom._signals import Tables, TimingRow, tables
from loadline.sizing import NamedWeights, weights_from_name
from loadline.units import GIB

__all__ = ["classify"]

# vLLM's default when the config does not say (it has been 0.9 in every release).
_DEFAULT_GPU_UTIL = 0.9

_AGENT_NOTE = (
    "Prompts grew over time until the crash, so the likely cause is on the caller's side: an agent "
    "(LangGraph, LangChain, AutoGen, CrewAI or similar) passing its whole history or large tool outputs "
    "back each turn. {limit} The real fix is for the caller to trim or summarise what it sends."
)


@dataclass
class _Facts:
    """What the text says, found once."""

    gpu_oom: bool = False
    warmup: int | None = None
    sampler_warmup: bool = False
    graph_capture: bool = False
    profiling: bool = False
    warmup_step: str | None = None
    #: vLLM's sleep-mode allocator (its CuMemAllocator pool, wake_up) named in the text.
    sleep_pool: str | None = None
    no_cache_blocks: bool = False
    #: vLLM's refusal when its (Mamba) cache holds fewer blocks than max_num_seqs sequences need.
    seqs_exceed_cache: str | None = None
    max_len: int | None = None
    kv_capacity: int | None = None
    load_failed: bool = False
    load_phase: bool = False
    weights_loaded: bool = False
    serving: bool = False
    ray_oom: bool = False
    host_alloc: str | None = None
    #: A page-locked host buffer (``pin_memory``, ``cudaHostAlloc``) the CUDA driver refused: host RAM in
    #: an error that names CUDA.
    pinned_host: str | None = None
    #: transformers' refusal to put part of a quantized model on the CPU or disk: it does not fit the GPU.
    quant_dispatch: str | None = None
    #: A shared-memory segment (/dev/shm, a tmpfs in RAM) that could not be created or grown.
    shm_full: str | None = None
    #: SIGBUS (signal 7, "Bus error"): a touched page of a shared mapping that tmpfs could not back.
    bus_error: str | None = None
    offload_flags: bool = False
    #: Killed from outside for memory: the OOM killer named, or SIGKILL / exit 137 with an OOM word.
    host_kill: str | None = None
    ray_worker_died: str | None = None
    #: The report's own words for host memory ("system memory", "host RAM", "内存").
    host_words: str | None = None
    #: The text ends inside vLLM's KV refusal (cut off before its figures).
    kv_cut: str | None = None
    #: The KV refusal in other words: one max_model_len sequence does not fit the KV cache.
    kv_words: str | None = None
    #: An engine that allocates the whole context's KV cache up front failed to allocate it.
    kv_alloc: str | None = None
    #: llama.cpp's KV cache had no contiguous run of cells for the next batch ("failed to find KV cache
    #: slot", ollama's "could not find a kv cache slot"): full, or its freed cells scattered.
    kv_slot_full: str | None = None
    #: SGLang's KV cache pool was full: the requests' tokens filled it.
    kv_pool_full: str | None = None
    #: A batch-sizing setting named outside the engine's standard advice sentences.
    batch_setting: str | None = None
    #: The report's own words for memory climbing until the out-of-memory.
    climbing_words: str | None = None
    prompt_words: str | None = None
    #: "OOM" or "out of memory" anywhere in the text.
    oom: bool = False
    #: A memory leak named: memory that ran out over time, said so, whether or not "OOM" is said too.
    leak: str | None = None
    #: Fragmentation named outside PyTorch's advice sentence (which every out-of-memory message ends with).
    frag_words: str | None = None
    #: The allocator's reservation of virtual address space for its pool (cuMemAddressReserve) failed.
    pool_reserve: str | None = None

    @property
    def host_text(self) -> bool:
        """Whether the text itself speaks of the host's memory (not counting the reason or exit code)."""
        return bool(
            self.ray_oom
            or self.host_alloc
            or self.pinned_host
            or self.shm_full
            or self.bus_error
            or self.host_kill
            or self.ray_worker_died
            or self.host_words
        )


@dataclass
class _Score:
    t: Tables
    scores: dict[OomClass, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    evidence: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    #: Each fired signal's sentence, by id (for naming the one that decided).
    sentences: dict[str, str] = field(default_factory=dict)

    def add(self, sid: str, **values: object) -> None:
        signal = self.t.signals[sid]
        for cls, weight in signal.weights.items():
            self.scores[cls] += weight
        self.fired.append(sid)
        if signal.evidence:
            sentence = signal.evidence.format(**values)
            self.evidence.append(sentence)
            self.sentences.setdefault(sid, sentence)

    def strongest_for(self, cls: OomClass) -> tuple[str, str] | None:
        """The fired signal that weighs most for ``cls``, with its sentence: the figure that decided."""
        best = max(self.fired, key=lambda sid: self.t.signals[sid].weights.get(cls, 0.0), default=None)
        if best is None or self.t.signals[best].weights.get(cls, 0.0) <= 0:
            return None
        return best, self.sentences.get(best, "")


def _num(value: float) -> str:
    """A figure for a sentence: no trailing zeros, at most two decimals."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _pct(value: float) -> str:
    return f"{value:.0%}"


def _found(pattern: re.Pattern[str], text: str) -> str | None:
    m = pattern.search(text)
    return m.group(0) if m else None


def _without_sentences(text: str, pattern: re.Pattern[str]) -> str:
    """``text`` without each sentence (up to a full stop or a line's end) in which ``pattern`` occurs.

    Found from the pattern outwards, so a long line costs one pass: a pattern that matched the sentence
    itself (``[^.\n]*…[^.\n]*``) would be tried from every position of a line with no full stop.
    """
    kept: list[str] = []
    done = 0
    for m in pattern.finditer(text):
        if m.start() < done:
            continue
        start = max(text.rfind(".", done, m.start()), text.rfind("\n", done, m.start())) + 1
        ends = [i for i in (text.find(".", m.end()), text.find("\n", m.end())) if i >= 0]
        end = min(ends) + 1 if ends else len(text)
        kept.append(text[done:start])
        done = end
    kept.append(text[done:])
    return " ".join(kept)


def _cut_inside(text: str, t: Tables, fact: str) -> str | None:
    """The piece of a known message the text ends inside, if it is cut off in one (else None).

    A termination message is cut to its limit wherever that falls; the opening of vLLM's or Ray's own
    message still says which message it was, as long as what follows the head is how that message goes on.
    """
    tail_text = text.rstrip("\n")
    for head, rest in t.openings.get(fact, ()):
        for m in head.finditer(tail_text):
            if rest.startswith(tail_text[m.end() :]):
                return tail_text[m.start() :]
    return None


def _read_text(text: str, t: Tables) -> _Facts:
    p = t.patterns
    f = _Facts()
    # The engines' own sentences (a refusal, a warm-up's failure) are one line where they are raised,
    # and reach a report, a log collector or a terminal wrapped or re-spaced: they are looked for in the
    # text with every run of whitespace made one space.
    flat = " ".join(text.split())
    m = p["sampler_warmup"].search(flat)
    if m:
        f.sampler_warmup = True
        f.warmup = int(m.group(1)) if m.group(1) else None
    # A finished capture in the log means a later out-of-memory happened after it, not during it.
    f.graph_capture = bool(p["graph_capture"].search(text)) and not p["graph_capture_done"].search(text)
    f.profiling = bool(p["profiling"].search(text))
    f.warmup_step = _found(p["warmup_step"], text)
    f.sleep_pool = _found(p["sleep_pool"], text)
    oom_word = p["oom_word"].search(text)
    f.oom = bool(oom_word)
    # The engines' standard advice (vLLM's CUDA graph notice names max_num_seqs at every capture, SGLang's
    # "Possible solutions" list, vLLM's KV refusal names max_model_len) is in the text whatever happened:
    # a setting it names is no evidence, a setting named anywhere else is.
    f.batch_setting = _found(p["batch_setting_named"], p["engine_advice"].sub(" ", text))
    f.host_kill = _found(p["oom_killer"], text)
    f.host_words = _found(p["host_words"], text)
    f.ray_worker_died = _found(p["ray_worker_died"], text)
    m = p["sigkill"].search(text)
    if f.host_kill is None and m and oom_word:
        f.host_kill = m.group(0)
    # A process that reports its child killed by SIGKILL lived on, so the kill was not the container's
    # (a probe or a deletion kills them all): the kernel's OOM killer picks the largest process of the
    # cgroup, and a GPU out-of-memory is an exception raised inside the process, never a signal.
    if f.host_kill is None:
        f.host_kill = _found(p["child_killed"], text)
    # "OOM" without the GPU's own words is a GPU out-of-memory only when it came in a GPU-only step
    # (the profiling batch, CUDA graph capture, the sampler warm-up) and nothing speaks of the host.
    gpu_step = (
        f.profiling
        or f.graph_capture
        or f.sampler_warmup
        or f.batch_setting is not None
        or bool(f.warmup_step)
    )
    # A pinned host buffer is allocated through the CUDA driver (cudaHostAlloc), whose refusal reads
    # "CUDA error: out of memory" although the memory is the host's: that error is not the GPU's.
    f.pinned_host = _found(p["pinned_host"], text)
    device_text = p["pinned_host"].sub(" ", text) if f.pinned_host else text
    f.gpu_oom = bool(p["gpu_oom"].search(device_text)) or bool(
        oom_word and gpu_step and not (f.host_kill or f.host_words or f.ray_worker_died)
    )
    f.no_cache_blocks = bool(p["no_cache_blocks"].search(flat))
    f.seqs_exceed_cache = _found(p["seqs_exceed_cache"], flat)
    m = p["max_len_kv_v0"].search(flat)
    if m:
        f.max_len, f.kv_capacity = int(m.group(1)), int(m.group(2))
    m = p["max_len_kv_v1"].search(flat)
    if m:
        f.max_len = int(m.group(1))
        needed, available = float(m.group(2)), float(m.group(3))
        estimate = p["max_len_estimate"].search(flat)
        if estimate:
            f.kv_capacity = int(estimate.group(1))
        elif needed > 0:
            # KV memory grows linearly with length, so what fits is the same share of max_model_len.
            f.kv_capacity = math.floor(f.max_len * available / needed)
    if f.kv_capacity is None:
        # vLLM V1 logs the KV capacity at start-up ("GPU KV cache size: 150,745 tokens").
        m = p["kv_cache_size"].search(text)
        if m:
            f.kv_capacity = int(m.group(1).replace(",", ""))
    f.load_failed = bool(p["load_failed"].search(flat))
    f.quant_dispatch = _found(p["quant_dispatch"], flat)
    f.load_phase = bool(p["load_phase"].search(text))
    f.weights_loaded = bool(p["weights_loaded"].search(text))
    f.serving = bool(p["serving"].search(text))
    f.ray_oom = bool(p["ray_oom"].search(text)) or _cut_inside(text, t, "ray_oom") is not None
    m = p["host_alloc"].search(text)
    if m:
        f.host_alloc = m.group(0)
    else:
        f.host_alloc = _cut_inside(text, t, "host_alloc")
    f.shm_full = _found(p["shm_full"], text)
    f.bus_error = None if f.shm_full else _found(p["bus_error"], text)
    f.kv_alloc = _found(p["kv_alloc_failed"], flat)
    f.kv_slot_full = _found(p["kv_slot_full"], flat)
    f.kv_pool_full = _found(p["kv_pool_full"], flat)
    if f.max_len is None:
        f.kv_cut = _cut_inside(text, t, "kv_refusal")
        if f.kv_cut is None:
            f.kv_words = _found(p["kv_fit_words"], text)
    # A leak named is memory climbing by definition: its words are climbing words too.
    f.leak = _found(p["memory_leak_words"], text)
    # PyTorch ends every out-of-memory message with advice "... to avoid fragmentation": that sentence is
    # in the text whatever happened, so only fragmentation named anywhere else is evidence.
    f.frag_words = _found(p["fragmentation_words"], _without_sentences(text, p["allocator_advice"]))
    f.pool_reserve = _found(p["pool_reserve"], text) if f.gpu_oom else None
    f.climbing_words = _found(p["memory_climbing_words"], text) or f.leak
    f.prompt_words = _found(p["long_prompt_words"], text)
    f.offload_flags = bool(p["offload_flags"].search(text))
    return f


def _prompt_growth(incident: Incident, t: Tables) -> tuple[bool, str]:
    """Whether prompts grew until the crash, and how to say it."""
    metrics = incident.metrics
    recent = metrics.prompt_tokens_recent
    if len(recent) >= 3:
        first, last = recent[0], recent[-1]
        rises = sum(b >= a for a, b in itertools.pairwise(recent))
        mostly_rising = rises >= 0.75 * (len(recent) - 1)
        if first > 0 and last >= t.threshold("prompts_growth_factor") * first and mostly_rising:
            return True, f"from {first} to {last} tokens over the last {len(recent)} samples"
        if metrics.prompt_tokens_growing is None:
            return False, ""
    if metrics.prompt_tokens_growing:
        peak = metrics.prompt_tokens_max
        return True, f"turn after turn (to {peak} tokens)" if peak else "turn after turn"
    return False, ""


def _score_text(
    s: _Score,
    f: _Facts,
    incident: Incident,
    runtime: bool,
    before_load_done: bool,
    gpu: bool,
    pieces: bool = False,
) -> None:
    """``pieces``: the allocator's figures show the memory was there in pieces; then a start-up step
    (graph capture, profiling) is only where it happened, not evidence that the budget was too small."""
    reason = incident.reason.strip().lower()
    host = False
    if reason == "oomkilled":
        s.add("reason_oomkilled")
        host = True
    elif incident.exit_code == 137:
        s.add("exit_137")
        host = True
    if f.ray_oom:
        s.add("ray_oom")
        host = True
    if f.host_alloc:
        s.add("host_alloc", what=f.host_alloc)
        host = True
    if f.pinned_host:
        s.add("pinned_host", what=" ".join(f.pinned_host.split())[-160:])
        host = True
    if f.shm_full:
        s.add("shm_full", what=f.shm_full)
        host = True
    if f.bus_error:
        s.add("bus_error", what=f.bus_error)
        host = True
    if f.host_kill:
        s.add("host_kill", what=f.host_kill)
        host = True
    if f.ray_worker_died and not f.ray_oom:
        s.add("ray_worker_died", what=f.ray_worker_died)
        host = True
    if f.host_words and not (
        f.ray_oom or f.host_alloc or f.pinned_host or f.shm_full or f.bus_error or f.host_kill
    ):
        s.add("host_words", what=f.host_words)
        host = True
    if host and f.offload_flags:
        s.add("offload_flags")

    if gpu and not host:
        s.add("gpu_only")
    # While the weights load no batch exists yet: every engine sizes its batches (the profiling run, the
    # warm-ups) from what the weights leave, so a batch setting named then was not what asked.
    no_batch_yet = before_load_done or _loading(incident, f)
    if f.sampler_warmup:
        s.add("sampler_warmup", warmup=f.warmup if f.warmup is not None else "its")
    elif f.gpu_oom and f.graph_capture and not runtime and not pieces:
        s.add("graph_capture_oom")
    elif f.gpu_oom and f.profiling and not runtime and not before_load_done and not pieces:
        s.add("profiling_oom")
    elif f.gpu_oom and f.batch_setting and not runtime and not no_batch_yet and not pieces:
        s.add("batch_setting_oom", what=f.batch_setting)
    elif f.gpu_oom and f.warmup_step and not runtime and not before_load_done and not pieces:
        s.add("warmup_oom", what=f.warmup_step)
    if f.max_len is not None:
        capacity = f"{f.kv_capacity} tokens" if f.kv_capacity is not None else "less"
        s.add("max_len_exceeds_kv", max_len=f.max_len, capacity=capacity)
    elif f.kv_cut:
        s.add("max_len_exceeds_kv_cut", what=f.kv_cut)
    elif f.kv_words:
        s.add("kv_refusal_words", what=f.kv_words)
    elif f.kv_alloc and not runtime:
        s.add("kv_alloc_failed", what=f.kv_alloc)
    elif f.kv_pool_full:
        s.add("kv_pool_full", what=f.kv_pool_full)
    elif f.kv_slot_full:
        s.add("kv_slot_full", what=f.kv_slot_full)
    if f.gpu_oom and f.sleep_pool and not before_load_done:
        s.add("sleep_pool_oom", what=f.sleep_pool)
    if f.quant_dispatch:
        s.add("quant_dispatch", what=f.quant_dispatch)
    if f.load_failed:
        s.add("load_failed")
    elif f.gpu_oom and before_load_done and not f.sampler_warmup:
        s.add("load_phase_oom")
    if f.no_cache_blocks:
        s.add("no_cache_blocks")
    if f.seqs_exceed_cache:
        s.add("seqs_exceed_cache", what=f.seqs_exceed_cache)
    if f.gpu_oom and runtime:
        s.add("runtime_gpu_oom")
    if runtime and f.climbing_words and (f.oom or f.leak) and not host:
        s.add("memory_climbing_text", what=f.climbing_words)
    if runtime and f.prompt_words and f.oom and not host:
        s.add("long_prompt_text", what=f.prompt_words)
    if f.frag_words and not host:
        s.add("fragmentation_text", what=f.frag_words)
    if f.pool_reserve and not host:
        s.add("pool_reserve_failed", what=f.pool_reserve)


def _score_plan(s: _Score, incident: Incident, gpu_signal: bool, fig: AllocatorFigures | None) -> None:
    """The weights per GPU against the GPU: the plan's figures, else vLLM's own log, else the model's name.

    The GPU's size is the plan's, else the allocator's own "total capacity". Without the plan's weights,
    vLLM's "Model loading took X GiB" is what one GPU held; without that either, the model's name gives
    them (the catalog's count, else a floor the name states). Both count only where the GPU's memory ran
    out, and a floor can say the weights did not fit, never that they fit comfortably."""
    plan, config, t = incident.plan, incident.config, s.t
    gpu = plan.gpu_memory_gib or (fig.total_gib if fig is not None else None)
    if gpu is None:
        return
    tp = config.tensor_parallel_size or 1
    named: NamedWeights | None = None
    if plan.weights_gib is not None:
        if not gpu_signal and not _plan_exceeds(incident):
            return
        per_gpu = plan.weights_gib / tp
    elif not gpu_signal:
        return
    else:
        logged = logged_weights_gib(incident.text)
        if logged is not None:
            per_gpu = logged
        elif incident.model:
            named = weights_from_name(incident.model, config.dtype, config.quantization)
            if named is None:
                return
            per_gpu = named.gib / tp
        else:
            return
    ratio = per_gpu / gpu
    util = config.gpu_memory_utilization or _DEFAULT_GPU_UTIL
    values = {"per_gpu": _num(per_gpu), "weights": _num(per_gpu * tp), "tp": tp, "gpu": _num(gpu)}
    no_room = ratio >= util - t.threshold("weights_no_room_margin")
    fits = ratio < t.threshold("weights_fit_ratio")
    if named is not None:
        values["basis"] = named.basis
        if ratio >= 1.0:
            s.add("named_weights_exceed_gpu", **values)
        elif no_room:
            s.add("named_weights_no_room", ratio=_pct(ratio), util=util, **values)
        elif fits and named.exact:
            s.add("weights_fit", **values)
    elif ratio >= 1.0:
        s.add("weights_exceed_gpu", **values)
    elif no_room:
        s.add("weights_no_room", ratio=_pct(ratio), util=util, **values)
    elif fits:
        s.add("weights_fit", **values)


def _score_long_context(s: _Score, incident: Incident, f: _Facts, runtime: bool, gpu: bool) -> None:
    """A start-up out-of-memory with a long configured context and nothing else named: the context's.

    vLLM without chunked prefill (V0's default below its long-context switch) profiles one batch of
    ``max(max_model_len, 2048)`` tokens when max_num_batched_tokens is not set, so its start-up
    activations grow with max_model_len: at 32k tokens one layer's MLP input alone is about 1.3 GiB for
    Llama-2-7B (2 × 11,008 × 2 bytes a token). llama.cpp allocates the whole context's KV cache at
    start-up. A max_num_batched_tokens the operator set is a batch setting of its own (the batch, not
    the context, may be what asked), and a named step (CUDA graph capture, a warm-up, the sampler's) or
    vLLM's own KV refusal already says which setting asked for the memory."""
    max_len = incident.config.max_model_len
    if not gpu or runtime or max_len is None or max_len < s.t.threshold("long_context_tokens"):
        return
    if incident.config.max_num_batched_tokens is not None:
        return
    named = f.graph_capture or f.sampler_warmup or f.warmup_step or f.batch_setting or f.no_cache_blocks
    kv_said = f.max_len is not None or f.kv_cut or f.kv_words or f.kv_alloc
    if named or kv_said or f.load_failed or incident.phase == "loading":
        return
    s.add("long_context_startup", max_len=max_len, limit=int(s.t.threshold("long_context_tokens")))


def _score_held_past_budget(
    s: _Score, fig: AllocatorFigures | None, incident: Incident, f: _Facts, runtime: bool, pieces: bool
) -> None:
    """PyTorch's own allocations past vLLM's whole budget before Ready: the weights (no plan figure).

    vLLM keeps what it allocates after loading within ``gpu_memory_utilization`` × the GPU: the KV
    cache is sized to what the profiling run's peak leaves of that budget, and CUDA graphs draw from
    private pools. The weights come before any budget (vLLM's loader allocates each layer's tensors as
    they stream in), so PyTorch holding more than the budget, used up rather than in pieces, before the
    engine loaded or served and with a request the budget's headroom could have held (one layer's
    tensor, not a batch's activation), was filled by them. The plan's own weights figure, when the
    incident has one, is the better witness (:func:`_score_plan`), so this reads only without it."""
    if fig is None or fig.total_gib is None or not fig.requested_gib or runtime or pieces:
        return
    if incident.ever_ready is not False or incident.plan.weights_gib is not None:
        return
    if incident.phase in {"starting", "serving"} or f.weights_loaded or f.profiling or f.graph_capture:
        return
    if f.sampler_warmup or (fig.private_pools_gib or 0.0) > 0.0:
        return
    held = fig.allocated_gib if fig.allocated_gib is not None else fig.reserved_total_gib
    util = incident.config.gpu_memory_utilization or _DEFAULT_GPU_UTIL
    budget = util * fig.total_gib
    if held is None or held < budget or fig.requested_gib > fig.total_gib - budget:
        return
    s.add("held_past_budget", held=_num(held), total=_num(fig.total_gib), util=util, budget=_num(budget))


def _creeping(incident: Incident, t: Tables, prompts_growing: bool) -> bool:
    """GPU memory climbing before the crash while the prompts did not grow (a steady load)."""
    rate = incident.metrics.gpu_memory_growth_gib_per_hour
    climbing = rate is not None and rate >= t.threshold("memory_climbing_gib_per_hour")
    return climbing and not prompts_growing


def _plan_exceeds(incident: Incident) -> bool:
    """Whether the plan's own figures put more weights on one GPU than it has: no text is needed then."""
    plan = incident.plan
    if plan.weights_gib is None or plan.gpu_memory_gib is None:
        return False
    return plan.weights_gib / (incident.config.tensor_parallel_size or 1) >= plan.gpu_memory_gib


def _score_timing(
    s: _Score, incident: Incident, runtime: bool, gpu_signal: bool, pieces: bool = False
) -> None:
    """Facts about *when* that rule classes out (the moments that point to a class are the timing table).

    ``pieces``: the allocator's figures show the memory was there in pieces. Then the phase does not rule
    fragmentation out: CUDA graph capture and profiling fragment the cache at start-up too.
    """
    t = s.t
    if gpu_signal and (incident.ever_ready or runtime):
        s.add("served")
    elif gpu_signal and incident.ever_ready is False and not pieces:
        s.add("never_ready")
    util = incident.config.gpu_memory_utilization
    if gpu_signal and util is not None and util >= t.threshold("high_util"):
        s.add("high_util", util=util)


@dataclass(frozen=True)
class _Verdict:
    """What the timing table says: the row that matched, refined, and the sentence that says so."""

    row: TimingRow
    confidence: float
    sentence: str


def _since_ready(incident: Incident) -> float | None:
    # Time since Ready is what matters; a pod that never restarted its engine has uptime close to it.
    if incident.seconds_since_ready is not None:
        return incident.seconds_since_ready
    return incident.uptime_seconds if incident.ever_ready else None


def _timing_verdict(
    t: Tables,
    incident: Incident,
    f: _Facts,
    runtime: bool,
    host: bool,
    gpu: bool,
    growing: bool,
    pieces: bool = False,
) -> _Verdict | None:
    """The field guide's timing table, read from the incident: which moment the crash came at, if known.

    Only moments the incident actually shows count: a crash before Ready with no sign of the phase
    (loading or after it) matches no row, because both "model too big" and "batch settings" fit it.
    """
    row_id: str | None = None
    detail = ""
    since = _since_ready(incident)
    m, config = incident.metrics, incident.config
    if host and not gpu:
        row_id = "host_kill"
    elif gpu and not runtime:
        after_load = f.weights_loaded or f.profiling or f.graph_capture or f.sampler_warmup
        # The step the failure itself names (the KV cache's allocation, the profiling batch, a capture)
        # comes after the weights in every engine's start-up, so it outranks a coarse phase "loading".
        named_after_load = after_load or f.kv_alloc is not None
        loading = _loading(incident, f)
        # The allocator's figures showing the memory in pieces outrank the phase here too: a loader's
        # buffers fragment device memory as any other allocations do.
        if f.load_failed or (loading and not named_after_load and not pieces):
            row_id = "at_load"
        elif (incident.phase == "starting" or after_load) and f.gpu_oom and not pieces and not f.kv_alloc:
            # A refusal (no cache blocks, max_len vs KV) is not an out-of-memory during a batch, nor is
            # the KV cache's own allocation for the whole configured context.
            row_id = "after_load"
    elif gpu and runtime:
        long_prompt = (
            m.prompt_tokens_max is not None
            and bool(config.max_model_len)
            and m.prompt_tokens_max >= t.threshold("prompts_long") * (config.max_model_len or 1)
        )
        kv_full = m.kv_cache_usage is not None and m.kv_cache_usage >= t.threshold("kv_high")
        climbing = (
            m.gpu_memory_growth_gib_per_hour is not None
            and m.gpu_memory_growth_gib_per_hour >= t.threshold("memory_climbing_gib_per_hour")
        )
        if long_prompt or growing or kv_full:
            row_id = "long_requests"
        elif since is not None and since < t.timing_threshold("first_batch_seconds"):
            row_id, detail = "first_batch", f" ({_num(since)} s after Ready)"
        elif since is not None and since / 3600 >= t.timing_threshold("long_uptime_hours"):
            hours = _num(since / 3600)
            row_id = "hours_memory_climbing" if climbing else "long_uptime"
            if not climbing and since / 3600 >= t.timing_threshold("days_of_serving_hours"):
                row_id = "days_of_serving"
            detail = f" ({hours} h after Ready)"
    if row_id is None:
        return None
    row = t.timing[row_id]
    when = row.when
    for name in ("first_batch_seconds", "long_uptime_hours", "days_of_serving_hours"):
        unit = " s" if name.endswith("seconds") else " h"
        when = when.replace(name, _num(t.timing_threshold(name)) + unit)
    sentence = (
        f"Timing{detail}: {when} The field guide's timing table points to {row.oom_class.value} "
        f"(confidence {row.confidence:.2f} on timing alone)."
    )
    return _Verdict(row=row, confidence=row.confidence, sentence=sentence)


def _score_metrics(s: _Score, incident: Incident, runtime: bool, growing: tuple[bool, str]) -> None:
    t, m, config = s.t, incident.metrics, incident.config
    if not runtime:
        return
    near = False
    if m.prompt_tokens_max is not None and config.max_model_len:
        ratio = m.prompt_tokens_max / config.max_model_len
        values = {"prompt": m.prompt_tokens_max, "ratio": _pct(ratio), "max_len": config.max_model_len}
        if ratio >= t.threshold("prompts_near_limit"):
            s.add("prompts_near_limit", **values)
            near = True
        elif ratio >= t.threshold("prompts_long"):
            s.add("prompts_long", **values)
            near = True
    # A long prompt is long whatever max_model_len allows: a window of 262,144 tokens does not make a
    # 127,000-token prompt small for the GPU that has to hold it.
    long_context = t.threshold("long_context_tokens")
    if not near and m.prompt_tokens_max is not None and m.prompt_tokens_max >= long_context:
        s.add("prompt_past_long_context", prompt=m.prompt_tokens_max, limit=int(long_context))
    if m.kv_cache_usage is not None:
        if m.kv_cache_usage >= t.threshold("kv_full"):
            s.add("kv_full", kv=_pct(m.kv_cache_usage))
        elif m.kv_cache_usage >= t.threshold("kv_high"):
            s.add("kv_high", kv=_pct(m.kv_cache_usage))
    if m.preemptions:
        s.add("preempting", count=m.preemptions)
    if growing[0]:
        s.add("prompts_growing", growth=growing[1])
    rate = m.gpu_memory_growth_gib_per_hour
    if rate is not None and rate >= t.threshold("memory_climbing_gib_per_hour"):
        s.add("memory_climbing", rate=_num(rate))


def _score_allocator(
    s: _Score,
    fig: AllocatorFigures | None,
    incident: Incident,
    runtime: bool,
    named_setting: bool = False,
    in_capture: bool = False,
) -> None:
    """``named_setting``: vLLM's own message names the setting that sized the failed request (the sampler
    warm-up's max_num_seqs dummy requests); lowering it removes the request, so fragmentation figures beside
    it do not make it a fragmentation case.

    ``in_capture``: the request came during CUDA graph capture. PyTorch serves a capture's allocations from
    the graph's private memory pool (torch.cuda.graph, "Graph memory management" in PyTorch's CUDA notes),
    and while a capture is underway the allocator's out-of-memory path does not return the cached blocks
    to the driver (CUDACachingAllocator.cpp: ``captures_underway.empty() && release_cached_blocks``). So
    reserved but unallocated then counts whole cached blocks of pools the capture cannot draw from: those
    figures say nothing of fragmentation for this request; free memory against the request does."""
    t = s.t
    if fig is None:
        return
    # The figures decide, whatever the phase: the caching allocator serves a request from one block, so
    # reserved-but-unallocated memory at least the size of the request means the bytes were there but
    # not in one piece (fragmentation by definition); free plus cached enough, most of it cached, is the
    # same in two places. Less than that and the memory was used up.
    if _pieces(fig, t) == "largest_block_short" and not named_setting and fig.requested_gib:
        s.add(
            "largest_block_short",
            requested=_num(fig.requested_gib),
            free=_num(fig.free_gib or 0.0),
            largest=_num(fig.largest_free_gib or 0.0),
        )
    if fig.reserved_unallocated_gib is not None and fig.requested_gib and not named_setting:
        verdict = _pieces(fig, t)
        ratio = fig.reserved_unallocated_gib / fig.requested_gib
        values = {
            "unalloc": _num(fig.reserved_unallocated_gib),
            "ratio": f"{ratio:.1f}×",
            "requested": _num(fig.requested_gib),
        }
        if verdict is not None and in_capture:
            s.add("capture_private_pool", free=_num(fig.free_gib or 0.0), **values)
        elif verdict == "reserved_large":
            s.add("reserved_large", **values)
        elif verdict == "reserved_covers":
            s.add("reserved_covers", **values)
        elif verdict == "in_pieces":
            s.add("in_pieces", free=_num(fig.free_gib or 0.0), **values)
        elif fig.free_gib is not None and fig.requested_gib > fig.free_gib:
            s.add("allocator_exhausted", free=_num(fig.free_gib), **values)
    # One request larger than the whole GPU before serving: an engine loads weights a tensor (a layer's
    # shard) at a time, far below a GPU, so only an activation sized from the settings (the profiling
    # batch of max_num_batched_tokens, a multimodal prompt's items) asks for that much.
    if fig.requested_gib and fig.total_gib and fig.requested_gib > fig.total_gib and not runtime:
        s.add("request_exceeds_gpu", requested=_num(fig.requested_gib), total=_num(fig.total_gib))
    outside = fig.outside_gib
    if outside is not None and fig.total_gib:
        big = max(t.threshold("external_memory_gib"), t.threshold("external_memory_fraction") * fig.total_gib)
        if outside >= big:
            s.add("external_memory", outside=_num(outside), total=_num(fig.total_gib))


def _pieces(fig: AllocatorFigures | None, t: Tables) -> str | None:
    """Which fragmentation signal the allocator's figures support, if any (see ``_score_allocator``)."""
    if fig is None or not fig.requested_gib:
        return None
    largest, free = fig.largest_free_gib, fig.free_gib
    if largest is not None and free is not None and free >= fig.requested_gib > largest:
        # The allocator says so itself: enough free in all, no free block as large as the request.
        return "largest_block_short"
    if fig.reserved_unallocated_gib is None:
        return None
    unalloc, requested = fig.reserved_unallocated_gib, fig.requested_gib
    if unalloc >= t.threshold("reserved_large_ratio") * requested:
        return "reserved_large"
    if unalloc >= t.threshold("reserved_covers_ratio") * requested:
        return "reserved_covers"
    free = fig.free_gib
    if free is not None and free + unalloc >= requested and unalloc >= free:
        return "in_pieces"
    return None


def _score_config(s: _Score, incident: Incident, host: bool) -> None:
    config, t = incident.config, s.t
    pieces = {"reserved_large", "reserved_covers", "in_pieces", "largest_block_short"}
    if config.expandable_segments and pieces & set(s.fired):
        s.add("expandable_on")
    if host and config.kv_offload_cpu_gib and config.memory_limit_bytes:
        limit_gib = config.memory_limit_bytes / GIB
        ratio = config.kv_offload_cpu_gib / limit_gib
        if ratio >= t.threshold("offload_fraction"):
            s.add(
                "offload_large",
                offload=_num(config.kv_offload_cpu_gib),
                ratio=_pct(ratio),
                limit=_num(limit_gib),
            )


@dataclass(frozen=True)
class _Decision:
    oom_class: OomClass
    confidence: float
    notes: list[str]
    #: The timing row decided (the text alone was too thin).
    by_timing: bool = False


def _unknown(s: _Score, confidence: float, note: str) -> _Decision:
    low = round(min(s.t.threshold("unknown_max_confidence"), max(0.0, confidence)), 2)
    return _Decision(OomClass.UNKNOWN, low, [note])


def _decide(s: _Score, timing: _Verdict | None) -> _Decision:
    """Rule order: strong text evidence; else the timing table; ``unknown`` when they disagree.

    The text's evidence (with plan, config, metrics and allocator figures) decides when it is strong and
    clearly ahead. When it is thin, the timing row decides at its stated confidence, raised by whatever
    the evidence adds for the same class and lowered by what it adds for others. ``unknown`` only when
    text and timing point to different classes with comparable strength, when the evidence rules the
    timing's class out, or when neither says anything.
    """
    t = s.t
    ranked = sorted(CAUSES, key=lambda c: -min(1.0, s.scores[c]))
    top, second = ranked[0], ranked[1]
    s1 = min(1.0, s.scores[top])
    s2 = max(0.0, min(1.0, s.scores[second]))
    cap = t.threshold("max_confidence")
    text_conf = max(0.0, min(cap, s1 - 0.5 * s2))
    margin = t.timing_threshold("comparable_margin")
    # Two strong, close candidates: the text holds contradicting evidence, so do not pick one.
    if s2 >= t.threshold("decide_min_score") and s1 - s2 < t.threshold("split_margin"):
        note = f"The evidence is split between {top.value} and {second.value}; it does not decide."
        return _unknown(s, text_conf, note)
    text_decides = s1 >= t.threshold("decide_min_score") and text_conf >= t.threshold("decide_min_confidence")
    if timing is None:
        if text_decides:
            return _Decision(top, round(text_conf, 2), [])
        if s1 <= 0:
            return _unknown(
                s, text_conf, "None of the evidence points to a cause, and the timing does not say."
            )
        return _unknown(
            s,
            text_conf,
            f"The evidence is too thin to decide (best guess: {top.value}) and the timing does not say.",
        )
    cls = timing.row.oom_class
    if text_decides:
        if cls is top:
            return _Decision(top, round(min(cap, max(text_conf, timing.confidence)), 2), [])
        if timing.confidence >= text_conf - margin:
            note = (
                f"The text points to {top.value} ({text_conf:.2f}) but the timing to {cls.value} "
                f"({timing.confidence:.2f}): they disagree with comparable strength."
            )
            return _unknown(s, min(text_conf, timing.confidence), note)
        return _Decision(
            top, round(text_conf, 2), [f"The text outweighs the timing, which points to {cls.value}."]
        )
    own = min(1.0, s.scores[cls])
    against = max(0.0, max(min(1.0, s.scores[c]) for c in CAUSES if c is not cls))
    if own <= t.timing_threshold("ruled_out_score"):
        note = f"The timing points to {cls.value} but the evidence rules it out ({own:.2f})."
        return _unknown(s, timing.confidence + own, note)
    if own < 0:
        note = f"The timing points to {cls.value} but the evidence weighs against it ({own:.2f})."
        return _unknown(s, timing.confidence + own, note)
    if against > 0 and against >= timing.confidence - margin:
        leaning = max((c for c in CAUSES if c is not cls), key=lambda c: s.scores[c])
        note = (
            f"The timing points to {cls.value} ({timing.confidence:.2f}) but the text leans to "
            f"{leaning.value} ({against:.2f}): they disagree with comparable strength."
        )
        return _unknown(s, min(timing.confidence, against), note)
    share = t.timing_threshold("text_support_share")
    confidence = timing.confidence + share * max(0.0, own) - share * against
    if confidence < t.threshold("decide_min_confidence"):
        return _unknown(s, confidence, f"The timing points to {cls.value}, too weakly to decide.")
    return _Decision(
        cls,
        round(min(cap, confidence), 2),
        ["The message alone does not decide; the timing does."],
        by_timing=True,
    )


def start_up_phase(log_head: str, *, whole: bool, ever_ready: bool | None = None) -> str | None:
    """Where the crashed instance was, from the beginning of its log: ``loading`` (weights loading
    started, not finished), ``starting`` (weights loaded, not yet serving: profiling, KV cache, CUDA
    graphs) or ``serving``; None when the log does not say.

    The classifier's timing table decides by this phase when the crash message is thin or cut, and the
    last lines of a log (what the termination message or a tail holds) rarely show the start-up lines.
    ``whole`` says the text is the entire log: only then does a missing serving line mean the instance
    never served (a head cut short may end before it). An instance known to have been Ready served.
    """
    if ever_ready:
        return "serving"
    # Only the four start-up facts, not every signal's pattern: a head is up to 256 KiB, and reading all
    # of them over it costs the crash lane a CPU-second on a slow node.
    p = tables().patterns
    if p["serving"].search(log_head):
        return "serving"
    if not whole:
        return None
    if p["weights_loaded"].search(log_head):
        return "starting"
    if p["load_phase"].search(log_head) or p["load_failed"].search(" ".join(log_head.split())):
        return "loading"
    return None


def _loading(incident: Incident, facts: _Facts) -> bool:
    """Whether the crash came while the weights loaded: the phase says so, or the log shows loading
    started and not finished."""
    return incident.phase == "loading" or (facts.load_phase and not facts.weights_loaded)


def _has_gpu_signal(
    incident: Incident, facts: _Facts, t: Tables, runtime: bool, host_signal: bool, growing: bool
) -> bool:
    """Whether anything speaks of the GPU's memory: the text, else (with no host signal either) the
    plan, the metrics or the report's own words while serving."""
    if (
        facts.gpu_oom
        or facts.sampler_warmup
        or facts.no_cache_blocks
        or facts.seqs_exceed_cache is not None
        or facts.max_len is not None
        or facts.kv_cut is not None
        or facts.kv_words is not None
        or (facts.kv_alloc is not None and not runtime)
        or facts.kv_slot_full is not None
        or facts.kv_pool_full is not None
        or facts.load_failed
        or facts.quant_dispatch is not None
    ):
        return True
    if host_signal:
        return False
    # Fragmentation named: a device allocator's failure (a host allocator under Linux's overcommit does
    # not fail for want of a contiguous block; the kernel kills instead).
    if facts.frag_words is not None:
        return True
    # The plan alone says the weights do not fit: a crash with no wording is still evidence then.
    return _plan_exceeds(incident) or (
        runtime
        and (
            # A crash with no message after serving: GPU memory creeping up under a load that did not
            # grow is the evidence (the allocator's cache, not the requests, grew).
            _creeping(incident, t, growing)
            # The same, or prompts growing (an app's long context), said in the report's own words
            # rather than measured.
            or (facts.oom and bool(facts.climbing_words or facts.prompt_words))
            # A leak named is memory running out by itself: the crash of a server that says its memory
            # leaks is that memory's end, with or without the word "OOM".
            or facts.leak is not None
        )
    )


def _decided_by(s: _Score, decision: _Decision, timing: _Verdict | None) -> tuple[str, str] | None:
    """The evidence that decided: the timing row when it did, else the signal weighing most for the
    class (or the timing row when no signal weighs for it)."""
    if decision.by_timing and timing is not None:
        return timing.row.id, timing.sentence
    if decision.oom_class is OomClass.UNKNOWN:
        return None
    decided_by = s.strongest_for(decision.oom_class)
    if decided_by is None and timing is not None and timing.row.oom_class is decision.oom_class:
        return timing.row.id, timing.sentence
    return decided_by


def _caller_note(incident: Incident) -> str:
    """What the app team is told when its callers' prompts grew until the crash."""
    mml = incident.config.max_model_len
    limit = (
        f"vLLM answers any request longer than max_model_len ({mml} tokens now) with a clear 400 error "
        "instead of crashing the server, so a max_model_len that fits the KV cache keeps the server "
        "up while the caller is fixed."
        if mml
        else "A max_model_len that fits the KV cache makes vLLM answer longer requests with a clear "
        "400 error instead of crashing the server."
    )
    return _AGENT_NOTE.format(limit=limit)


def classify(incident: Incident) -> Diagnosis:
    """Classify one out-of-memory incident. Pure: same incident, same diagnosis."""
    t = tables()
    text = incident.text
    facts = _read_text(text, t)
    runtime = bool(incident.ever_ready) or facts.serving or incident.phase == "serving"
    reason = incident.reason.strip().lower()
    host_signal = reason == "oomkilled" or incident.exit_code == 137 or bool(facts.host_text)
    # "Out of memory" said by the process itself, not killed and in no words of the host's, is the
    # device's, in any phase. Linux overcommits host memory: an allocation of RAM rarely fails, the
    # kernel's OOM killer (or the container's cgroup) kills the process instead, and a killed process
    # reports nothing (OOMKilled, exit code 137). Host memory that does fail an allocation has words of
    # its own (``MemoryError``, "Cannot allocate memory", a failed mmap, Ray's monitor: the host facts).
    # While loading it is the loading step's; while serving, a request's. Between the two, a bare word
    # names no start-up step: it says the GPU ran out but not which setting (the batch's or the
    # context's) asked, so only the GPU's own words or a named step give the start-up timing row.
    own_oom = facts.oom and not host_signal
    facts.gpu_oom = facts.gpu_oom or (own_oom and (runtime or _loading(incident, facts)))
    figures = parse_oom_text(text)
    s = _Score(t)

    before_load_done = (facts.load_phase and not facts.weights_loaded) or facts.load_failed
    growing = _prompt_growth(incident, t)
    gpu_signal = own_oom or _has_gpu_signal(incident, facts, t, runtime, host_signal, growing[0])
    if not gpu_signal and not host_signal:
        return Diagnosis(
            oom_class=OomClass.UNKNOWN,
            confidence=0.05,
            evidence=(
                f"No out-of-memory signal in the reason ({incident.reason}), exit code, message or logs: "
                "this may not be a memory problem at all.",
            ),
            figures=figures,
        )

    # During CUDA graph capture the figures cannot show pieces (see _score_allocator): the phase decides.
    in_capture = facts.gpu_oom and facts.graph_capture and not runtime
    # The report naming fragmentation is the same finding in words, and no capture hides it.
    pieces = not facts.sampler_warmup and (
        (_pieces(figures, t) is not None and not in_capture)
        or facts.frag_words is not None
        or facts.pool_reserve is not None
    )
    _score_text(s, facts, incident, runtime, before_load_done, gpu_signal, pieces=pieces)
    _score_plan(s, incident, gpu_signal, figures)
    _score_timing(s, incident, runtime, gpu_signal, pieces=pieces)
    _score_metrics(s, incident, runtime, growing)
    _score_allocator(s, figures, incident, runtime, named_setting=facts.sampler_warmup, in_capture=in_capture)
    _score_held_past_budget(s, figures, incident, facts, runtime, pieces)
    _score_long_context(s, incident, facts, runtime, gpu_signal)
    _score_config(s, incident, host_signal)

    host_only = reason == "oomkilled" or facts.host_text
    timing = _timing_verdict(t, incident, facts, runtime, host_only, gpu_signal, growing[0], pieces)
    decision = _decide(s, timing)
    evidence = [e for e in s.evidence if e]
    fired = list(s.fired)
    if timing is not None:
        evidence.append(timing.sentence)
        fired.append(timing.row.id)
    evidence += decision.notes

    caller_side = growing[0] and runtime and gpu_signal
    kv_capacity = facts.kv_capacity if facts.kv_capacity is not None else incident.plan.kv_cache_tokens
    return Diagnosis(
        oom_class=decision.oom_class,
        confidence=decision.confidence,
        evidence=tuple(evidence),
        caller_side=caller_side,
        caller_note=_caller_note(incident) if caller_side else None,
        scores=tuple((c, round(min(1.0, s.scores[c]), 2)) for c in CAUSES),
        figures=figures,
        kv_capacity_tokens=kv_capacity,
        logged_max_model_len=facts.max_len,
        warmup_requests=facts.warmup,
        signals=tuple(fired),
        decided_by=_decided_by(s, decision, timing),
    )
