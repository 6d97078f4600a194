"""The OOM-risk estimator (loadline.risk): when a model will run out of memory, and on what evidence.

Series are generated from a known straight line plus noise, so the expected crash time is computed
from the line (where it meets the limit), never written down by hand.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from loadline.api import InferenceModelStatus
from loadline.risk import (
    RiskInputError,
    RiskSignals,
    RiskTuning,
    estimate_oom_risk,
    fit_trend,
    oom_risk_condition,
    oom_risk_status,
)

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
HOUR = 3600.0


def history(
    value: Callable[[float], float | None], hours: float = 6.0, step: float = 30.0, end: datetime = NOW
) -> list[tuple[float, float]]:
    """Samples every ``step`` s up to ``end``; ``value`` gets hours before ``end`` (negative) and
    may return None for a gap."""
    out = []
    t = end.timestamp() - hours * HOUR
    while t <= end.timestamp():
        v = value((t - end.timestamp()) / HOUR)
        if v is not None:
            out.append((t, v))
        t += step
    return out


def crossing(level_now: float, per_hour: float, limit: float) -> datetime:
    """When a line at ``level_now`` rising ``per_hour`` meets ``limit``."""
    return NOW + timedelta(hours=(limit - level_now) / per_hour)


def test_rising_gpu_memory_predicts_the_crash_where_the_trend_meets_the_total() -> None:
    rng = random.Random(7)
    level, slope, total = 70.0, 1.5, 80.0
    samples = history(lambda h: level + slope * h + rng.gauss(0, 0.4))
    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=total), NOW)
    truth = crossing(level, slope, total)
    assert estimate.predicted_at is not None
    assert abs(estimate.predicted_at - truth) < timedelta(minutes=20)
    assert estimate.signal == "gpu_memory"
    assert estimate.status == "True" and estimate.reason == "GpuMemoryGrowing"
    deciding = estimate.deciding
    assert deciding is not None and deciding.slope_per_hour is not None and deciding.current is not None
    assert deciding.slope_per_hour == pytest.approx(slope, rel=0.1)
    assert deciding.current == pytest.approx(level, abs=0.5)
    # The evidence names the signal, its level, the limit and the slope, for the condition message.
    first = estimate.evidence[0]
    assert "GPU memory" in first and "80.00 GiB" in first and "/h" in first and "reaches the limit" in first


def test_flat_noisy_memory_predicts_nothing() -> None:
    rng = random.Random(3)
    samples = history(lambda h: 62.0 + rng.gauss(0, 1.5))
    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=80.0), NOW)
    assert estimate.predicted_at is None
    assert estimate.status == "False"
    assert estimate.projections[0].verdict in {"flat", "not_significant", "beyond_horizon"}


def test_falling_memory_predicts_nothing() -> None:
    samples = history(lambda h: 60.0 - 2.0 * h)  # h is negative: higher in the past
    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=80.0), NOW)
    assert estimate.predicted_at is None
    assert estimate.projections[0].verdict == "flat"


def test_spikes_do_not_pull_the_prediction() -> None:
    """One scrape in five catching a 12 GiB burst: a least-squares line would move; Theil–Sen does not."""
    rng = random.Random(11)
    level, slope, total = 66.0, 1.0, 80.0
    samples = history(lambda h: level + slope * h + (12.0 if rng.random() < 0.2 else rng.gauss(0, 0.3)))
    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=total), NOW)
    assert estimate.predicted_at is not None
    assert abs(estimate.predicted_at - crossing(level, slope, total)) < timedelta(minutes=45)


def test_theil_sen_resists_outliers_that_move_least_squares() -> None:
    rng = random.Random(5)
    points = [(float(i), 2.0 * i + rng.gauss(0, 0.1)) for i in range(40)]
    for i in range(30, 40):  # the last quarter breaks out upwards
        points[i] = (points[i][0], points[i][1] + 60.0)
    trend = fit_trend(points)
    assert trend is not None
    least_squares = statistics.linear_regression([t for t, _ in points], [v for _, v in points]).slope
    assert abs(trend.slope - 2.0) < 0.5 < abs(least_squares - 2.0)


def test_a_gap_in_the_history_does_not_stop_the_estimate() -> None:
    rng = random.Random(2)
    level, slope, total = 72.0, 1.2, 80.0
    samples = history(lambda h: None if -4 < h < -2 else level + slope * h + rng.gauss(0, 0.3))
    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=total), NOW)
    assert estimate.predicted_at is not None
    assert abs(estimate.predicted_at - crossing(level, slope, total)) < timedelta(minutes=30)


def test_too_few_points_predict_nothing_and_say_so() -> None:
    samples = [(NOW.timestamp() - 600, 70.0), (NOW.timestamp() - 300, 75.0), (NOW.timestamp() - 60, 79.0)]
    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=80.0), NOW)
    assert estimate.predicted_at is None
    assert estimate.status == "Unknown" and estimate.reason == "InsufficientData"
    assert estimate.projections[0].verdict == "too_few_points"
    assert "too few" in estimate.evidence[0]


def test_a_stale_series_says_nothing_about_now() -> None:
    samples = history(lambda h: 70.0 + 3.0 * h, end=NOW - timedelta(hours=1))
    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=80.0), NOW)
    assert estimate.predicted_at is None
    assert estimate.projections[0].verdict == "stale"
    assert estimate.status == "Unknown"


def test_already_at_the_limit_is_a_crash_now() -> None:
    samples = history(lambda h: min(80.0, 79.0 + 2.0 * (h + 1)))
    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=80.0), NOW)
    assert estimate.predicted_at == NOW
    assert estimate.time_to_oom == timedelta(0)


def test_a_slow_rise_beyond_the_horizon_is_reported_not_predicted() -> None:
    samples = history(lambda h: 40.0 + 0.05 * h)  # 800 hours to 80 GiB
    tuning = RiskTuning(horizon=timedelta(days=7))
    estimate = estimate_oom_risk(
        RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=80.0), NOW, tuning
    )
    assert estimate.predicted_at is None
    assert estimate.projections[0].verdict == "beyond_horizon"
    assert "horizon" in estimate.evidence[0]


def test_a_filling_kv_cache_predicts_a_crash_only_while_vllm_preempts() -> None:
    level, slope = 0.8, 0.05
    kv = history(lambda h: level + slope * h)
    quiet_counter = history(lambda h: 17.0, step=60)
    preempting = history(lambda h: 17.0 + max(0.0, 10.0 * (h + 3)), step=60)

    calm = estimate_oom_risk(RiskSignals(kv_cache_usage=kv, preemptions_total=quiet_counter), NOW)
    assert calm.predicted_at is None
    assert calm.preemptions == 0
    assert "Not counted" in calm.evidence[0]

    pressed = estimate_oom_risk(RiskSignals(kv_cache_usage=kv, preemptions_total=preempting), NOW)
    assert pressed.signal == "kv_cache_usage" and pressed.reason == "KVCacheFilling"
    assert pressed.predicted_at is not None
    assert abs(pressed.predicted_at - crossing(level, slope, 1.0)) < timedelta(minutes=10)
    assert pressed.preemptions == pytest.approx(30, abs=1)
    assert any("preempted" in line for line in pressed.evidence)


def test_preemption_counter_resets_are_not_negative_preemptions() -> None:
    # A pod restart resets the counter from 50 to 0; it then counts 5 more.
    counter = history(lambda h: 50.0 if h < -3 else 5.0 * (h + 3) / 3, step=60)
    estimate = estimate_oom_risk(RiskSignals(preemptions_total=counter), NOW)
    assert estimate.preemptions == 5


def test_prompts_growing_toward_the_kv_cache_size_predict_a_crash() -> None:
    tokens, growth, capacity = 90_000.0, 2_000.0, 100_000
    prompts = history(lambda h: tokens + growth * h, step=120)
    estimate = estimate_oom_risk(RiskSignals(prompt_tokens_max=prompts, kv_cache_tokens=capacity), NOW)
    assert estimate.signal == "prompt_tokens"
    assert estimate.predicted_at is not None
    assert abs(estimate.predicted_at - crossing(tokens, growth, capacity)) < timedelta(minutes=10)


def test_the_earliest_signal_decides_and_comes_first_in_the_evidence() -> None:
    memory = history(lambda h: 70.0 + 1.0 * h)  # 10 h to 80 GiB
    prompts = history(lambda h: 95_000.0 + 2_000.0 * h, step=120)  # 2.5 h to 100k tokens
    estimate = estimate_oom_risk(
        RiskSignals(
            gpu_memory_used_gib=memory,
            gpu_memory_total_gib=80.0,
            prompt_tokens_max=prompts,
            kv_cache_tokens=100_000,
        ),
        NOW,
    )
    assert estimate.signal == "prompt_tokens"
    assert estimate.evidence[0].startswith("the longest prompt")
    assert {p.signal for p in estimate.projections if p.predicts} == {"gpu_memory", "prompt_tokens"}


def test_no_signals_is_unknown() -> None:
    estimate = estimate_oom_risk(RiskSignals(), NOW)
    assert estimate.status == "Unknown"
    assert estimate.evidence


def test_a_naive_now_is_refused_by_type() -> None:
    with pytest.raises(RiskInputError, match="now"):
        estimate_oom_risk(RiskSignals(), datetime(2026, 11, 20, 12))


def test_condition_and_status_carry_the_estimate() -> None:
    memory = history(lambda h: 74.0 + 2.0 * h)
    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=memory, gpu_memory_total_gib=80.0), NOW)
    condition = oom_risk_condition(estimate, generation=4)
    assert (condition.type, condition.status, condition.reason) == ("OOMRisk", "True", "GpuMemoryGrowing")
    assert condition.message.startswith("GPU memory")
    wire = InferenceModelStatus(oom_risk=oom_risk_status(estimate)).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    risk = wire["oomRisk"]
    assert risk["signal"] == "gpu_memory" and risk["unit"] == "GiB" and risk["limit"] == 80.0
    assert risk["slopePerHour"] == pytest.approx(2.0, rel=0.05)
    assert datetime.fromisoformat(risk["predictedAt"]) == estimate.predicted_at
    # What was written reads back (the handler reads status on the next pass).
    assert InferenceModelStatus.model_validate(wire).oom_risk == oom_risk_status(estimate)
