"""The range series the OOM-risk estimator (:func:`loadline.risk.estimate_oom_risk`) reads, from
Prometheus: a model's GPU memory on its busiest GPU, KV-cache usage, preemptions and the longest prompt
of each step, over the estimator's look-back, each query bounded in time. What Prometheus cannot answer
stays empty (the estimator then says what it lacks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadline.risk import RiskSignals, RiskTuning
from loadline.traffic._promql import (
    busiest_gpu_memory_query,
    kv_cache_usage_now_query,
    longest_prompt_query,
    preemptions_counter_query,
)
from loadline.traffic._range import query_range

__all__ = ["MAX_PODS", "risk_signals"]

STEP_SECONDS = 60.0
"""Resolution of the range queries: the estimator bins to 5 minutes, a minute is plenty."""
QUERY_TIMEOUT_SECONDS = 3.0
MAX_PODS = 8
"""The trend of a model is read on its first pods by name: a replica's memory grows like another's."""

Sample = tuple[float, float]


def _max_per_time(series: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Several pods' series as one: the highest value at each timestamp (the pod that runs out first)."""
    top: dict[float, float] = {}
    for one in series:
        for moment, value in one:
            top[moment] = max(value, top.get(moment, value))
    return sorted(top.items())


def _sum_per_time(series: Sequence[Sequence[Sample]]) -> list[Sample]:
    total: dict[float, float] = {}
    for one in series:
        for moment, value in one:
            total[moment] = total.get(moment, 0.0) + value
    return sorted(total.items())


def _capped(samples: list[Sample], plan: Mapping[str, Any]) -> list[Sample]:
    """Prompt lengths at most maxModelLen: a bucket bound above it is an upper bound vLLM never takes."""
    limit = plan.get("maxModelLen")
    return [(t, min(v, float(limit))) for t, v in samples] if limit else samples


def risk_signals(
    prometheus_url: str,
    namespace: str,
    pods: Sequence[str],
    plan: Mapping[str, Any],
    now: float,
    tuning: RiskTuning | None = None,
) -> RiskSignals:
    """The range series the estimator reads, from Prometheus (what it cannot answer stays empty)."""
    start = now - (tuning or RiskTuning()).lookback.total_seconds()
    engine = str(plan.get("engineVersion") or "") or None

    def ask(build: Any) -> list[list[Sample]]:
        out: list[list[Sample]] = []
        for pod in list(pods)[:MAX_PODS]:
            answer = query_range(
                prometheus_url, build(pod), start, now, STEP_SECONDS, timeout=QUERY_TIMEOUT_SECONDS
            )
            if answer is None:  # unreachable or slow: no more questions this round
                break
            out.extend(answer)
        return out

    memory = (plan.get("memory") or {}).get("totalGiB")
    return RiskSignals(
        gpu_memory_used_gib=_max_per_time(ask(lambda pod: busiest_gpu_memory_query(namespace, pod))),
        gpu_memory_total_gib=float(memory) if memory else None,
        kv_cache_usage=_max_per_time(ask(lambda pod: kv_cache_usage_now_query(namespace, pod, engine))),
        preemptions_total=_sum_per_time(ask(lambda pod: preemptions_counter_query(namespace, pod))),
        prompt_tokens_max=_capped(_max_per_time(ask(lambda pod: longest_prompt_query(namespace, pod))), plan),
        kv_cache_tokens=int(plan["kvCacheTokens"]) if plan.get("kvCacheTokens") else None,
    )
