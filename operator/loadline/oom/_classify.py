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
from dataclasses import dataclass, field

from loadline.oom._model import CAUSES, AllocatorFigures, Diagnosis, Incident, OomClass
from loadline.oom._parse import parse_oom_text
from loadline.oom._signals import Tables, tables

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
    no_cache_blocks: bool = False
    max_len: int | None = None
    kv_capacity: int | None = None
    load_failed: bool = False
    load_phase: bool = False
    weights_loaded: bool = False
    serving: bool = False
    ray_oom: bool = False
    host_alloc: str | None = None
    offload_flags: bool = False


@dataclass
class _Score:
    t: Tables
    scores: dict[OomClass, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    evidence: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)

    def add(self, sid: str, **values: object) -> None:
        signal = self.t.signals[sid]
        for cls, weight in signal.weights.items():
            self.scores[cls] += weight
        self.fired.append(sid)
        if signal.evidence:
            self.evidence.append(signal.evidence.format(**values))


def _num(value: float) -> str:
    """A figure for a sentence: no trailing zeros, at most two decimals."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _pct(value: float) -> str:
    return f"{value:.0%}"


def _read_text(text: str, t: Tables) -> _Facts:
    p = t.patterns
    f = _Facts()
    f.gpu_oom = bool(p["gpu_oom"].search(text))
    m = p["sampler_warmup"].search(text)
    if m:
        f.sampler_warmup = True
        f.warmup = int(m.group(1)) if m.group(1) else None
    # A finished capture in the log means a later out-of-memory happened after it, not during it.
    f.graph_capture = bool(p["graph_capture"].search(text)) and not p["graph_capture_done"].search(text)
    f.profiling = bool(p["profiling"].search(text))
    f.no_cache_blocks = bool(p["no_cache_blocks"].search(text))
    m = p["max_len_kv_v0"].search(text)
    if m:
        f.max_len, f.kv_capacity = int(m.group(1)), int(m.group(2))
    m = p["max_len_kv_v1"].search(text)
    if m:
        f.max_len = int(m.group(1))
        needed, available = float(m.group(2)), float(m.group(3))
        estimate = p["max_len_estimate"].search(text)
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
    f.load_failed = bool(p["load_failed"].search(text))
    f.load_phase = bool(p["load_phase"].search(text))
    f.weights_loaded = bool(p["weights_loaded"].search(text))
    f.serving = bool(p["serving"].search(text))
    f.ray_oom = bool(p["ray_oom"].search(text))
    m = p["host_alloc"].search(text)
    if m:
        f.host_alloc = m.group(0)
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
    s: _Score, f: _Facts, incident: Incident, runtime: bool, before_load_done: bool, gpu: bool
) -> None:
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
    if host and f.offload_flags:
        s.add("offload_flags")

    if gpu and not host:
        s.add("gpu_only")
    if f.sampler_warmup:
        s.add("sampler_warmup", warmup=f.warmup if f.warmup is not None else "its")
    elif f.gpu_oom and f.graph_capture and not runtime:
        s.add("graph_capture_oom")
    elif f.gpu_oom and f.profiling and not runtime and not before_load_done:
        s.add("profiling_oom")
    if f.max_len is not None:
        capacity = f"{f.kv_capacity} tokens" if f.kv_capacity is not None else "less"
        s.add("max_len_exceeds_kv", max_len=f.max_len, capacity=capacity)
    if f.load_failed:
        s.add("load_failed")
    elif f.gpu_oom and before_load_done and not f.sampler_warmup:
        s.add("load_phase_oom")
    if f.no_cache_blocks:
        s.add("no_cache_blocks")
    if f.gpu_oom and runtime:
        s.add("runtime_gpu_oom")


def _score_plan(s: _Score, incident: Incident, gpu_signal: bool) -> None:
    plan, config, t = incident.plan, incident.config, s.t
    if plan.weights_gib is None or plan.gpu_memory_gib is None or not gpu_signal:
        return
    tp = config.tensor_parallel_size or 1
    per_gpu = plan.weights_gib / tp
    ratio = per_gpu / plan.gpu_memory_gib
    util = config.gpu_memory_utilization or _DEFAULT_GPU_UTIL
    values = {"per_gpu": _num(per_gpu), "weights": _num(plan.weights_gib), "tp": tp}
    if ratio >= 1.0:
        s.add("weights_exceed_gpu", gpu=_num(plan.gpu_memory_gib), **values)
    elif ratio >= util - t.threshold("weights_no_room_margin"):
        s.add("weights_no_room", gpu=_num(plan.gpu_memory_gib), ratio=_pct(ratio), util=util, **values)
    elif ratio < t.threshold("weights_fit_ratio"):
        s.add("weights_fit", gpu=_num(plan.gpu_memory_gib), **values)


def _score_timing(s: _Score, incident: Incident, runtime: bool, gpu_signal: bool) -> None:
    t = s.t
    if gpu_signal and (incident.ever_ready or runtime):
        s.add("served")
    elif gpu_signal and incident.ever_ready is False:
        s.add("never_ready")
    util = incident.config.gpu_memory_utilization
    if gpu_signal and util is not None and util >= t.threshold("high_util"):
        s.add("high_util", util=util)
    # Time since Ready is what matters; a pod that never restarted its engine has uptime close to it.
    since = incident.seconds_since_ready
    if since is None and incident.ever_ready:
        since = incident.uptime_seconds
    if runtime and since is not None:
        hours = since / 3600
        if hours >= t.threshold("very_long_uptime_hours"):
            s.add("very_long_uptime", hours=_num(hours))
        elif hours >= t.threshold("long_uptime_hours"):
            s.add("long_uptime", hours=_num(hours))
        elif since < t.threshold("first_batch_seconds") and gpu_signal:
            m = incident.metrics
            if m.prompt_tokens_max is None and m.kv_cache_usage is None:
                s.add("first_batch", since=_num(since))


def _score_metrics(s: _Score, incident: Incident, runtime: bool, growing: tuple[bool, str]) -> None:
    t, m, config = s.t, incident.metrics, incident.config
    if not runtime:
        return
    if m.prompt_tokens_max is not None and config.max_model_len:
        ratio = m.prompt_tokens_max / config.max_model_len
        values = {"prompt": m.prompt_tokens_max, "ratio": _pct(ratio), "max_len": config.max_model_len}
        if ratio >= t.threshold("prompts_near_limit"):
            s.add("prompts_near_limit", **values)
        elif ratio >= t.threshold("prompts_long"):
            s.add("prompts_long", **values)
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


def _score_allocator(s: _Score, fig: AllocatorFigures | None, incident: Incident, runtime: bool) -> None:
    t = s.t
    if fig is None:
        return
    if runtime and fig.reserved_unallocated_gib is not None and fig.requested_gib:
        ratio = fig.reserved_unallocated_gib / fig.requested_gib
        values = {
            "unalloc": _num(fig.reserved_unallocated_gib),
            "ratio": f"{ratio:.1f}×",
            "requested": _num(fig.requested_gib),
        }
        if ratio >= t.threshold("reserved_large_ratio"):
            s.add("reserved_large", **values)
        elif ratio >= t.threshold("reserved_covers_ratio"):
            s.add("reserved_covers", **values)
    outside = fig.outside_gib
    if outside is not None and fig.total_gib:
        big = max(t.threshold("external_memory_gib"), t.threshold("external_memory_fraction") * fig.total_gib)
        if outside >= big:
            s.add("external_memory", outside=_num(outside), total=_num(fig.total_gib))


def _score_config(s: _Score, incident: Incident, host: bool) -> None:
    config, t = incident.config, s.t
    if config.expandable_segments and "reserved_large" in s.fired:
        s.add("expandable_on")
    if host and config.kv_offload_cpu_gib and config.memory_limit_bytes:
        limit_gib = config.memory_limit_bytes / 1024**3
        ratio = config.kv_offload_cpu_gib / limit_gib
        if ratio >= t.threshold("offload_fraction"):
            s.add(
                "offload_large",
                offload=_num(config.kv_offload_cpu_gib),
                ratio=_pct(ratio),
                limit=_num(limit_gib),
            )


def _decide(s: _Score) -> tuple[OomClass, float, list[str]]:
    t = s.t
    ranked = sorted(CAUSES, key=lambda c: -min(1.0, s.scores[c]))
    top, second = ranked[0], ranked[1]
    s1 = min(1.0, s.scores[top])
    s2 = max(0.0, min(1.0, s.scores[second]))
    confidence = max(0.0, min(t.threshold("max_confidence"), s1 - 0.5 * s2))
    notes: list[str] = []
    # Two strong, close candidates: the incident holds contradicting evidence, so do not pick one.
    split = s2 >= t.threshold("decide_min_score") and s1 - s2 < t.threshold("split_margin")
    if split or s1 < t.threshold("decide_min_score") or confidence < t.threshold("decide_min_confidence"):
        low = round(min(t.threshold("unknown_max_confidence"), max(0.0, confidence)), 2)
        if s1 <= 0:
            notes.append("None of the evidence points to a cause.")
        elif s2 > 0 and s1 - s2 < t.threshold("split_margin"):
            notes.append(f"The evidence is split between {top.value} and {second.value}; it does not decide.")
        else:
            notes.append(f"The evidence is too thin to decide (best guess: {top.value}).")
        return OomClass.UNKNOWN, low, notes
    return top, round(confidence, 2), notes


def classify(incident: Incident) -> Diagnosis:
    """Classify one out-of-memory incident. Pure: same incident, same diagnosis."""
    t = tables()
    text = incident.text
    facts = _read_text(text, t)
    figures = parse_oom_text(text)
    s = _Score(t)

    runtime = bool(incident.ever_ready) or facts.serving
    before_load_done = (facts.load_phase and not facts.weights_loaded) or facts.load_failed
    gpu_signal = (
        facts.gpu_oom
        or facts.sampler_warmup
        or facts.no_cache_blocks
        or facts.max_len is not None
        or facts.load_failed
    )
    reason = incident.reason.strip().lower()
    host_signal = (
        reason == "oomkilled" or incident.exit_code == 137 or facts.ray_oom or facts.host_alloc is not None
    )
    growing = _prompt_growth(incident, t)

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

    _score_text(s, facts, incident, runtime, before_load_done, gpu_signal)
    _score_plan(s, incident, gpu_signal)
    _score_timing(s, incident, runtime, gpu_signal)
    _score_metrics(s, incident, runtime, growing)
    _score_allocator(s, figures, incident, runtime)
    _score_config(s, incident, host_signal)

    oom_class, confidence, notes = _decide(s)
    evidence = [e for e in s.evidence if e] + notes

    caller_side = growing[0] and runtime and gpu_signal
    caller_note = None
    if caller_side:
        mml = incident.config.max_model_len
        limit = (
            f"vLLM answers any request longer than max_model_len ({mml} tokens now) with a clear 400 error "
            "instead of crashing the server, so a max_model_len that fits the KV cache keeps the server "
            "up while the caller is fixed."
            if mml
            else "A max_model_len that fits the KV cache makes vLLM answer longer requests with a clear "
            "400 error instead of crashing the server."
        )
        caller_note = _AGENT_NOTE.format(limit=limit)

    kv_capacity = facts.kv_capacity if facts.kv_capacity is not None else incident.plan.kv_cache_tokens
    scores = tuple((c, round(min(1.0, s.scores[c]), 2)) for c in CAUSES)
    return Diagnosis(
        oom_class=oom_class,
        confidence=confidence,
        evidence=tuple(evidence),
        caller_side=caller_side,
        caller_note=caller_note,
        scores=scores,
        figures=figures,
        kv_capacity_tokens=kv_capacity,
        logged_max_model_len=facts.max_len,
        warmup_requests=facts.warmup,
        signals=tuple(s.fired),
    )
