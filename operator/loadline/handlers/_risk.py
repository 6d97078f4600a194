"""OOM risk before the crash: the measuring timer's second, slower job.

Every ``LOADLINE_RISK_INTERVAL_SECONDS`` (and only for models the measuring timer already reads) it
reads the last hours of the model's GPU memory on its busiest GPU, KV-cache usage, preemptions and the
longest prompt of each 5 minutes from Prometheus (:func:`loadline.traffic.risk_signals`), hands them
to the pure estimator :func:`loadline.risk.estimate_oom_risk`, and writes ``status.oomRisk`` and the
``OOMRisk`` condition (:func:`loadline.status.build.build_risk_status`); an Event when a crash becomes
predicted (or no longer is). Nothing is written while the verdict and the predicted time hold, so a
model at rest costs no writes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from loadline import telemetry
from loadline.risk import OOMRiskEstimate, estimate_oom_risk
from loadline.settings import OperatorSettings
from loadline.status import build as _build
from loadline.status import read_status, stored, with_changes
from loadline.traffic import risk_signals

log = logging.getLogger("loadline.risk")


def risk_due(memo: MutableMapping[str, Any], settings: OperatorSettings, now: float) -> bool:
    """Whether this timer tick should estimate again (once per interval per model; memo per model)."""
    if settings.risk_interval_seconds <= 0:
        return False
    last = float(memo.get("risk_at", 0.0))
    if now - last < settings.risk_interval_seconds:
        return False
    memo["risk_at"] = now
    return True


def assess(
    body: kopf.Body,
    patch: kopf.Patch,
    settings: OperatorSettings,
    pods: Sequence[str],
    logger: logging.Logger | kopf.Logger,
) -> OOMRiskEstimate | None:
    """Estimate the model's time to an OOM crash and write it where it changed; returns the estimate."""
    status = with_changes(read_status(body), patch.status)
    plan = {} if status.plan is None else stored(status.plan)
    meta = body["metadata"]
    now = time.time()
    signals = risk_signals(settings.prometheus_url, meta["namespace"], pods, plan, now)
    estimate = estimate_oom_risk(signals, datetime.fromtimestamp(now, UTC))
    changes = _build.build_risk_status(status, estimate, meta.get("generation"), _build.now_iso())
    predicted = estimate.predicted_at.timestamp() if estimate.predicted_at is not None else None
    telemetry.record_oom_risk(meta["namespace"], meta["name"], estimate.signal, predicted)
    if changes:
        patch.status.update(changes)
        before = next((c for c in status.conditions if c.type == "OOMRisk"), None)
        if estimate.status == "True" or (before is not None and before.status == "True"):
            kind = "Warning" if estimate.status == "True" else "Normal"
            kopf.event(cast(Any, body), type=kind, reason="OOMRisk", message=estimate.message[:1000])
        logger.info("OOM risk: %s", estimate.message[:300])
    return estimate
