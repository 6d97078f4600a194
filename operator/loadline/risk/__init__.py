"""OOM risk before the crash: when will this model run out of memory, and on what evidence?

``estimate_oom_risk(signals, now)`` projects the signals the operator reads from Prometheus (GPU memory
used against the GPU's total, the longest prompts against the KV cache's size, KV-cache usage against
full while vLLM preempts) along robust trends (Theil–Sen slope, Mann–Kendall test, binned medians) and
returns the earliest predicted crash with one sentence of evidence per signal, for the ``OOMRisk``
condition and for :func:`loadline.maintenance.plan_maintenance`, which restarts earlier when the crash
would come before the next quiet window. Pure: no clock, no Prometheus. See docs/restarts.md.

    estimate = estimate_oom_risk(RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=80), now)
    estimate.predicted_at, estimate.signal, estimate.evidence
    oom_risk_condition(estimate)     # {"type": "OOMRisk", "status", "reason", "message"}
"""

from loadline.risk._errors import RiskInputError
from loadline.risk._estimate import (
    OOMRiskEstimate,
    Projection,
    RiskSignals,
    RiskTuning,
    SignalName,
    Verdict,
    estimate_oom_risk,
)
from loadline.risk._status import OOM_RISK, estimate_from_status, oom_risk_condition, oom_risk_status
from loadline.risk._trend import Trend, bin_medians, fit_trend

__all__ = [
    "OOM_RISK",
    "OOMRiskEstimate",
    "Projection",
    "RiskInputError",
    "RiskSignals",
    "RiskTuning",
    "SignalName",
    "Trend",
    "Verdict",
    "bin_medians",
    "estimate_from_status",
    "estimate_oom_risk",
    "fit_trend",
    "oom_risk_condition",
    "oom_risk_status",
]
