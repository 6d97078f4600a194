"""Time to an out-of-memory crash, from the signals the operator already reads.

Each signal with a limit is projected along its robust trend (:mod:`loadline.risk._trend`) to the
moment it reaches that limit:

* **GPU memory** used on the busiest GPU (loadline's node agent, else dcgm-exporter) against the GPU's
  total: memory that keeps growing (fragmentation, a leak, CUDA graphs) ends in a CUDA OOM when it
  reaches the total. This is the direct one.
* **The longest prompts** against the KV cache's capacity in tokens: a prompt the cache cannot hold
  fails (``kv_cache_overflow`` in :mod:`loadline.oom`), and prompts growing week by week get there.
* **KV-cache usage** against 1.0. A full KV cache alone makes vLLM queue or preempt requests, not
  crash, so it predicts a crash only when vLLM is already preempting (the counter rose in the
  look-back): that is the ``kv_cache_overflow`` pattern the classifier recognises after the fact.

No prediction is made from too few points, from a stale series (the newest sample is old), from a
trend the Mann–Kendall test cannot tell from noise, or from a flat or falling one; a crash further
off than the horizon is reported, not predicted. Every verdict is one sentence of evidence, so the
``OOMRisk`` condition says which signal, its level, slope and limit, or why nothing was predicted.
Pure: samples and ``now`` in, a frozen estimate out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from loadline.risk._errors import RiskInputError
from loadline.risk._trend import Sample, Trend, bin_medians, fit_trend

__all__ = [
    "OOMRiskEstimate",
    "Projection",
    "RiskSignals",
    "RiskTuning",
    "SignalName",
    "Verdict",
    "estimate_oom_risk",
]

SignalName = Literal["gpu_memory", "prompt_tokens", "kv_cache_usage"]
Verdict = Literal[
    "at_limit", "rising", "beyond_horizon", "not_significant", "flat", "too_few_points", "stale", "no_limit"
]
#: Verdicts that predict a time (when the signal counts at all).
PREDICTING: frozenset[Verdict] = frozenset({"at_limit", "rising"})


@dataclass(frozen=True)
class RiskSignals:
    """What Prometheus told about one model, oldest sample first or not (order does not matter).

    Samples are ``(unix seconds, value)``. Units: GPU memory in GiB (dcgm-exporter reports MiB,
    the node agent bytes: convert first), KV-cache usage as a fraction 0..1 (vLLM's ``_perc`` gauges
    already are), preemptions as vLLM's cumulative counter summed over the model's pods (resets are
    handled), prompt lengths in tokens (the per-interval maxima of
    :func:`loadline.traffic.incident_metrics`). A signal without samples is simply not judged.
    """

    gpu_memory_used_gib: Sequence[Sample] = ()
    gpu_memory_total_gib: float | None = None
    kv_cache_usage: Sequence[Sample] = ()
    preemptions_total: Sequence[Sample] = ()
    prompt_tokens_max: Sequence[Sample] = ()
    #: Tokens the KV cache holds (the plan's ``kvCacheTokens``): the longest prompt's limit.
    kv_cache_tokens: int | None = None


@dataclass(frozen=True)
class RiskTuning:
    """The estimator's knobs; defaults suit 15 s – 1 min scrapes and growth over hours."""

    #: History used for the trend: recent enough to follow today's behaviour, long enough to see it.
    lookback: timedelta = timedelta(hours=6)
    #: Samples are reduced to the median of each bin this wide.
    bin_width: timedelta = timedelta(minutes=5)
    #: Fewer bins than this (or a shorter span) is too little to call a trend.
    min_points: int = 6
    min_span: timedelta = timedelta(minutes=30)
    #: The newest sample must be at most this old, or the series says nothing about now.
    max_staleness: timedelta = timedelta(minutes=15)
    #: Mann–Kendall z a rise must reach (1.645: 95 % one-sided).
    min_z: float = 1.645
    #: A crash further off than this is reported, not predicted (trends do not last for ever).
    horizon: timedelta = timedelta(days=7)


@dataclass(frozen=True)
class Projection:
    """One signal's verdict: where it is, how fast it moves, when it meets its limit."""

    signal: SignalName
    verdict: Verdict
    #: Whether this signal can predict a crash at all (KV usage only while vLLM preempts).
    counts: bool
    evidence: str
    current: float | None = None
    limit: float | None = None
    #: Change per hour (Theil–Sen), in the signal's unit.
    slope_per_hour: float | None = None
    points: int = 0
    #: When the trend meets the limit (``now`` when already there); None when not predicted.
    eta: datetime | None = None

    @property
    def predicts(self) -> bool:
        return self.counts and self.verdict in PREDICTING and self.eta is not None


@dataclass(frozen=True)
class OOMRiskEstimate:
    """The estimate for one model: the earliest predicted crash, the signal behind it, and the evidence
    (one sentence per signal judged, the deciding one first) for the ``OOMRisk`` condition."""

    as_of: datetime
    predicted_at: datetime | None
    signal: SignalName | None
    projections: tuple[Projection, ...]
    evidence: tuple[str, ...]
    #: Preemptions counted in the look-back (None: no preemption counter was read).
    preemptions: int | None = None
    horizon: timedelta = timedelta(days=7)

    @property
    def time_to_oom(self) -> timedelta | None:
        return None if self.predicted_at is None else max(timedelta(0), self.predicted_at - self.as_of)

    @property
    def deciding(self) -> Projection | None:
        """The projection that set ``predicted_at``."""
        return next((p for p in self.projections if p.signal == self.signal and p.predicts), None)

    @property
    def status(self) -> Literal["True", "False", "Unknown"]:
        """``OOMRisk`` condition status: True = a crash is predicted within the horizon; False = the
        signals were judged and none predicts one; Unknown = no signal had enough recent data."""
        if self.predicted_at is not None:
            return "True"
        judged = any(p.verdict not in ("too_few_points", "stale", "no_limit") for p in self.projections)
        return "False" if judged else "Unknown"

    @property
    def reason(self) -> str:
        """One CamelCase word for the condition."""
        if self.predicted_at is not None:
            return {
                "gpu_memory": "GpuMemoryGrowing",
                "prompt_tokens": "PromptsGrowing",
                "kv_cache_usage": "KVCacheFilling",
            }[self.signal or "gpu_memory"]
        return "NoRisingSignal" if self.status == "False" else "InsufficientData"

    @property
    def message(self) -> str:
        """The evidence as the condition's message."""
        return " ".join(self.evidence)


_UNITS: dict[SignalName, tuple[str, float, str]] = {
    # signal: (what people call it, display factor, unit)
    "gpu_memory": ("GPU memory", 1.0, "GiB"),
    "prompt_tokens": ("the longest prompt", 1.0, "tokens"),
    "kv_cache_usage": ("KV-cache usage", 100.0, "%"),
}


def _aware(moment: datetime, name: str) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise RiskInputError(name, "is a naive datetime", "pass an aware datetime, e.g. datetime.now(UTC)")
    return moment.astimezone(UTC)


def _fmt(signal: SignalName, value: float) -> str:
    _, factor, unit = _UNITS[signal]
    shown = value * factor
    if unit == "tokens":
        return f"{shown:,.0f} {unit}"
    if unit == "%":
        return f"{shown:.1f} %"
    return f"{shown:.2f} {unit}"


def _when(moment: datetime, now: datetime) -> str:
    ahead = moment - now
    hours = ahead.total_seconds() / 3600
    span = (
        f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"
    )
    return f"at {moment:%Y-%m-%d %H:%M} UTC (in {span})"


def _project(
    signal: SignalName,
    samples: Sequence[Sample],
    limit: float | None,
    now: datetime,
    tuning: RiskTuning,
    *,
    counts: bool = True,
    why_not_counted: str = "",
) -> Projection | None:
    """Project one signal to its limit; None when the signal was not read at all."""
    if not samples:
        return None
    name = _UNITS[signal][0]
    end = now.timestamp()
    start = end - tuning.lookback.total_seconds()
    recent = [(t, v) for t, v in samples if start <= t <= end and math.isfinite(v)]
    if limit is None or not math.isfinite(limit) or limit <= 0:
        return Projection(
            signal, "no_limit", False, f"{name}: no limit known (no GPU total or KV-cache size), not judged."
        )
    if not recent or end - max(t for t, _ in recent) > tuning.max_staleness.total_seconds():
        return Projection(
            signal,
            "stale",
            counts,
            f"{name}: no sample in the last {tuning.max_staleness.total_seconds() / 60:.0f} min, not judged.",
            limit=limit,
        )
    points = bin_medians(recent, tuning.bin_width.total_seconds())
    trend = fit_trend(points)
    hours = tuning.lookback.total_seconds() / 3600
    if (
        trend is None
        or trend.points < tuning.min_points
        or trend.span_seconds < tuning.min_span.total_seconds()
    ):
        return Projection(
            signal,
            "too_few_points",
            counts,
            f"{name}: {len(points)} {tuning.bin_width.total_seconds() / 60:g}-minute bins with data in the "
            f"last {hours:g} h, too few to judge a trend (need {tuning.min_points} over "
            f"{tuning.min_span.total_seconds() / 60:.0f} min).",
            limit=limit,
            points=len(points),
        )
    return _judge_trend(
        signal, trend, points, limit, now, tuning, counts=counts, why_not_counted=why_not_counted
    )


def _judge_trend(
    signal: SignalName,
    trend: Trend,
    points: Sequence[Sample],
    limit: float,
    now: datetime,
    tuning: RiskTuning,
    *,
    counts: bool,
    why_not_counted: str,
) -> Projection:
    """The verdict on a trend fitted over enough points: at the limit, flat, noise, beyond the
    horizon, or rising to the limit at a time it names."""
    name = _UNITS[signal][0]
    end = now.timestamp()
    per_hour = trend.slope * 3600
    # The line's value now, but never above what was observed: a series pinned at its ceiling (KV
    # usage at 1.0) would otherwise be extrapolated past it.
    level = min(trend.level, max(v for _, v in points))
    now_at = f"{name} {_fmt(signal, level)} of {_fmt(signal, limit)}"
    slope_text = f"{'+' if per_hour >= 0 else '-'}{_fmt(signal, abs(per_hour))}/h"
    fit = f"Theil–Sen over {trend.points} bins, {trend.span_seconds / 3600:.1f} h"
    suffix = f" {why_not_counted}" if not counts and why_not_counted else ""

    def judged(verdict: Verdict, evidence: str, eta: datetime | None = None) -> Projection:
        return Projection(
            signal,
            verdict,
            counts,
            evidence,
            current=level,
            limit=limit,
            slope_per_hour=per_hour,
            points=trend.points,
            eta=eta,
        )

    if level >= limit:
        return judged("at_limit", f"{now_at}: already at the limit ({fit}).{suffix}", now)
    if per_hour <= 0:
        return judged("flat", f"{now_at}, flat or falling ({slope_text}, {fit}).")
    if trend.z < tuning.min_z:
        return judged(
            "not_significant",
            f"{now_at}, {slope_text} but indistinguishable from noise (Mann–Kendall z {trend.z:.2f} < "
            f"{tuning.min_z:g}, {fit}).",
        )
    eta_ts = max(trend.last_time + (limit - level) / trend.slope, end)
    eta = datetime.fromtimestamp(math.floor(eta_ts), UTC)
    if eta - now > tuning.horizon:
        return judged(
            "beyond_horizon",
            f"{now_at}, rising {slope_text} ({fit}): the limit is {(eta - now).days} days away, "
            f"beyond the {tuning.horizon.days}-day horizon.",
        )
    return judged(
        "rising", f"{now_at}, rising {slope_text} ({fit}): reaches the limit {_when(eta, now)}.{suffix}", eta
    )


def _counter_increase(samples: Sequence[Sample], start: float, end: float) -> int | None:
    """Increase of a cumulative counter in ``[start, end]``, counting a drop as a reset (as PromQL's
    ``increase`` does); None without two samples."""
    ordered = sorted((t, v) for t, v in samples if start <= t <= end and math.isfinite(v))
    if len(ordered) < 2:
        return None
    total = 0.0
    for (_, before), (_, after) in itertools.pairwise(ordered):
        total += after - before if after >= before else after
    return round(total)


def estimate_oom_risk(
    signals: RiskSignals, now: datetime, tuning: RiskTuning = RiskTuning()
) -> OOMRiskEstimate:
    """Estimate when the model will run out of memory, from ``signals`` as of ``now`` (aware).

    The earliest crash any counting signal predicts within ``tuning.horizon`` is ``predicted_at``;
    ``evidence`` has one sentence per signal read (the deciding one first) and the preemption count.
    Raises :class:`RiskInputError` for a naive ``now``.
    """
    now = _aware(now, "now")
    end = now.timestamp()
    start = end - tuning.lookback.total_seconds()
    preempted = _counter_increase(signals.preemptions_total, start, end)
    preempting = bool(preempted)
    candidates = (
        _project("gpu_memory", signals.gpu_memory_used_gib, signals.gpu_memory_total_gib, now, tuning),
        _project(
            "prompt_tokens",
            signals.prompt_tokens_max,
            float(signals.kv_cache_tokens) if signals.kv_cache_tokens else None,
            now,
            tuning,
        ),
        _project(
            "kv_cache_usage",
            signals.kv_cache_usage,
            1.0,
            now,
            tuning,
            counts=preempting,
            why_not_counted=(
                "Not counted: vLLM preempted nothing in the look-back, and a full KV cache alone makes "
                "it queue or preempt requests, not crash."
            ),
        ),
    )
    projections = tuple(p for p in candidates if p is not None)
    predicting = sorted((p for p in projections if p.predicts), key=lambda p: (p.eta or now, p.signal))
    deciding = predicting[0] if predicting else None
    ordered = ([deciding] if deciding else []) + [p for p in projections if p is not deciding]
    evidence = [p.evidence for p in ordered]
    if preempted is not None:
        hours = tuning.lookback.total_seconds() / 3600
        evidence.append(
            f"vLLM preempted {preempted} request{'s' if preempted != 1 else ''} in the last {hours:g} h"
            + (" (its KV cache ran out of room)." if preempted else ".")
        )
    if deciding is None and not projections:
        evidence.append("No memory signal was read (no Prometheus, agent or dcgm-exporter data).")
    return OOMRiskEstimate(
        as_of=now,
        predicted_at=deciding.eta if deciding else None,
        signal=deciding.signal if deciding else None,
        projections=projections,
        evidence=tuple(evidence),
        preemptions=preempted,
        horizon=tuning.horizon,
    )
