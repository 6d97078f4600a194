"""The estimate at the API boundary: the ``OOMRisk`` condition and ``status.oomRisk``.

Kept apart from the estimator so that it stays plain data; these two functions are all a handler needs
to write the estimate (``merge_conditions`` keeps the transition time while the status holds).
"""

from __future__ import annotations

from datetime import UTC, datetime

from loadline.api import Condition, OOMRisk
from loadline.risk._estimate import OOMRiskEstimate

__all__ = ["OOM_RISK", "estimate_from_status", "oom_risk_condition", "oom_risk_status"]

#: The condition type.
OOM_RISK = "OOMRisk"

_UNITS = {"gpu_memory": "GiB", "prompt_tokens": "tokens", "kv_cache_usage": "fraction"}


def oom_risk_condition(estimate: OOMRiskEstimate, generation: int | None = None) -> Condition:
    """``OOMRisk``: True (a crash is predicted within the horizon), False (judged, none predicted) or
    Unknown (too little recent data); the message is the evidence, deciding signal first."""
    return Condition(
        type=OOM_RISK,
        status=estimate.status,
        reason=estimate.reason,
        message=estimate.message,
        observed_generation=generation,
    )


def oom_risk_status(estimate: OOMRiskEstimate) -> OOMRisk:
    """``status.oomRisk``: the deciding signal's figures (none when nothing is predicted) and evidence."""
    deciding = estimate.deciding
    return OOMRisk(
        predicted_at=estimate.predicted_at,
        signal=deciding.signal if deciding else "",
        current=None if deciding is None or deciding.current is None else round(deciding.current, 4),
        limit=None if deciding is None else deciding.limit,
        slope_per_hour=(
            None if deciding is None or deciding.slope_per_hour is None else round(deciding.slope_per_hour, 4)
        ),
        unit=_UNITS[deciding.signal] if deciding else "",
        evidence=list(estimate.evidence[:10]),
        time=estimate.as_of,
    )


def estimate_from_status(risk: OOMRisk | None) -> OOMRiskEstimate | None:
    """The estimate a model's ``status.oomRisk`` holds (what the measuring timer last wrote), when it
    predicts a crash: what a restart's timing weighs."""
    if risk is None or risk.predicted_at is None:
        return None
    as_of = risk.time or datetime.now(UTC)
    return OOMRiskEstimate(
        as_of=as_of,
        predicted_at=risk.predicted_at,
        signal=None,
        projections=(),
        evidence=tuple(risk.evidence),
    )
