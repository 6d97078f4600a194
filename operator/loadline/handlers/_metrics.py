"""Prometheus metrics of the operator (``/metrics`` on ``LOADLINE_METRICS_PORT``)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram, start_http_server

OOM_INCIDENTS = Counter(
    "loadline_oom_incidents_total",
    "Out-of-memory crashes seen, by class.",
    ["namespace", "inferencemodel", "oom_class"],
)
REMEDIATIONS = Counter(
    "loadline_remediations_total",
    "Remediation decisions, by action and outcome (applied, recommended, needs_person, none).",
    ["namespace", "inferencemodel", "action", "outcome"],
)
DETECTION_TO_ACTION = Histogram(
    "loadline_oom_detection_to_action_seconds",
    "From the crash's finish time to the remediation written (status and children).",
    buckets=(0.5, 1, 2, 3, 5, 10, 30, 60, 120),
)
RESTARTS = Counter(
    "loadline_restarts_total",
    "Restarts and remediation roll-outs started, by action (restart, remediation) and trigger (window, "
    "policyWindow, oomRisk, crashLoop, noWindow).",
    ["namespace", "inferencemodel", "action", "trigger"],
)
RECONCILES = Counter("loadline_reconciles_total", "Reconciles, by result.", ["result"])
ADMISSIONS = Counter(
    "loadline_admission_reviews_total",
    "Admission requests answered, by webhook and result (allowed, warned, refused, error).",
    ["webhook", "result"],
)
ADMISSION_SECONDS = Histogram(
    "loadline_admission_duration_seconds",
    "Time to answer an admission request (the API server gives up at the webhook's timeoutSeconds).",
    ["webhook"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

_started = False

#: In the admission process (``loadline run`` starts it): where its observations go, to be recorded by
#: the operator's process, which serves /metrics. None: record here.
RELAY: Any = None


def record_admission(webhook: str, result: str, seconds: float) -> None:
    """Count and time one admission answer (here, or relayed to the process serving /metrics)."""
    if RELAY is not None:
        RELAY.put((webhook, result, seconds))
        return
    ADMISSIONS.labels(webhook, result).inc()
    ADMISSION_SECONDS.labels(webhook).observe(seconds)


def forget(namespace: str, name: str) -> int:
    """Remove every series labelled with this InferenceModel; returns how many were removed.

    Without this the series of deleted models would live as long as the process."""
    removed = 0
    for metric in (OOM_INCIDENTS, REMEDIATIONS, RESTARTS):
        names = metric._labelnames  # the label order .remove() takes
        series = {
            tuple(sample.labels[label] for label in names)
            for family in metric.collect()
            for sample in family.samples  # a counter has two samples per series (_total, _created)
            if sample.labels.get("namespace") == namespace and sample.labels.get("inferencemodel") == name
        }
        for values in series:
            metric.remove(*values)
        removed += len(series)
    return removed


def serve(port: int) -> None:
    global _started
    if port and not _started:
        start_http_server(port, addr="0.0.0.0")
        _started = True
