"""OOM risk before the crash: the measuring timer's second, slower job.

Every ``LOADLINE_RISK_INTERVAL_SECONDS`` (and only for models the measuring timer already reads) it
asks Prometheus for the last hours of the model's GPU memory on its busiest GPU, KV-cache usage,
preemptions and the longest prompt of each 5 minutes (range queries through prometheus-api-client,
each bounded in time), hands them to the pure estimator :func:`loadline.risk.estimate_oom_risk`, and
writes ``status.oomRisk`` and the ``OOMRisk`` condition; an Event when a crash becomes predicted (or
no longer is). Nothing is written while the verdict and the predicted time hold, so a model at rest
costs no writes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, MutableMapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from loadline import telemetry
from loadline.risk import (
    OOMRiskEstimate,
    RiskSignals,
    RiskTuning,
    estimate_oom_risk,
    oom_risk_condition,
    oom_risk_status,
)
from loadline.settings import OperatorSettings
from loadline.status import build as _build
from loadline.traffic import (
    busiest_gpu_memory_query,
    kv_cache_usage_now_query,
    longest_prompt_query,
    preemptions_counter_query,
    query_range,
)

log = logging.getLogger("loadline.risk")

STEP_SECONDS = 60.0
"""Resolution of the range queries: the estimator bins to 5 minutes, a minute is plenty."""
QUERY_TIMEOUT_SECONDS = 3.0
MAX_PODS = 8
"""The trend of a model is read on its first pods by name: a replica's memory grows like another's."""
PREDICTION_MOVE_SECONDS = 900.0
"""A predicted time moving by less than this is the same prediction: not rewritten each interval."""

Sample = tuple[float, float]
TUNING = RiskTuning()


def risk_due(memo: MutableMapping[str, Any], settings: OperatorSettings, now: float) -> bool:
    """Whether this timer tick should estimate again (once per interval per model; memo per model)."""
    if settings.risk_interval_seconds <= 0:
        return False
    last = float(memo.get("risk_at", 0.0))
    if now - last < settings.risk_interval_seconds:
        return False
    memo["risk_at"] = now
    return True


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


def read_signals(
    settings: OperatorSettings,
    namespace: str,
    pods: Sequence[str],
    plan: Mapping[str, Any],
    now: float,
    tuning: RiskTuning = TUNING,
) -> RiskSignals:
    """The range series the estimator reads, from Prometheus (what it cannot answer stays empty)."""
    start = now - tuning.lookback.total_seconds()
    engine = str(plan.get("engineVersion") or "") or None

    def ask(build: Any) -> list[list[Sample]]:
        out: list[list[Sample]] = []
        for pod in list(pods)[:MAX_PODS]:
            answer = query_range(
                settings.prometheus_url, build(pod), start, now, STEP_SECONDS, timeout=QUERY_TIMEOUT_SECONDS
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


def _same_prediction(previous: Mapping[str, Any] | None, estimate: OOMRiskEstimate) -> bool:
    before = (previous or {}).get("predictedAt")
    after = estimate.predicted_at
    if not before or after is None:
        return not before and after is None
    try:
        moved = abs(
            datetime.fromisoformat(str(before).replace("Z", "+00:00")).timestamp() - after.timestamp()
        )
    except ValueError:
        return False
    return moved < PREDICTION_MOVE_SECONDS


def build_risk_status(
    status: Mapping[str, Any], estimate: OOMRiskEstimate, generation: int | None, now: str
) -> dict[str, Any]:
    """The status fields to write for ``estimate``, or ``{}`` while the verdict holds (same condition
    status and reason, predicted time within :data:`PREDICTION_MOVE_SECONDS`)."""
    condition = oom_risk_condition(estimate, generation)
    old = next((c for c in status.get("conditions") or [] if c.get("type") == condition.type), None)
    if (
        old is not None
        and old.get("status") == condition.status
        and old.get("reason") == condition.reason
        and _same_prediction(status.get("oomRisk"), estimate)
    ):
        return {}
    risk = oom_risk_status(estimate).model_dump(by_alias=True, mode="json", exclude_none=True)
    conditions = _build.merge_conditions(status.get("conditions") or [], [condition], now)
    return {"oomRisk": risk, "conditions": conditions}


def assess(
    body: kopf.Body,
    patch: kopf.Patch,
    settings: OperatorSettings,
    pods: Sequence[str],
    logger: logging.Logger | kopf.Logger,
) -> OOMRiskEstimate | None:
    """Estimate the model's time to an OOM crash and write it where it changed; returns the estimate."""
    status = {**(body.get("status") or {}), **patch.status}
    plan = status.get("plan") or {}
    meta = body["metadata"]
    now = time.time()
    signals = read_signals(settings, meta["namespace"], pods, plan, now)
    estimate = estimate_oom_risk(signals, datetime.fromtimestamp(now, UTC))
    changes = build_risk_status(status, estimate, meta.get("generation"), _build.now_iso())
    predicted = estimate.predicted_at.timestamp() if estimate.predicted_at is not None else None
    telemetry.record_oom_risk(meta["namespace"], meta["name"], estimate.signal, predicted)
    if changes:
        patch.status.update(changes)
        conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
        before = next((c for c in conditions if c.get("type") == "OOMRisk"), {})
        if estimate.status == "True" or before.get("status") == "True":
            kind = "Warning" if estimate.status == "True" else "Normal"
            kopf.event(cast(Any, body), type=kind, reason="OOMRisk", message=estimate.message[:1000])
        logger.info("OOM risk: %s", estimate.message[:300])
    return estimate
