"""Prometheus metrics of the operator (``/metrics`` on ``LOADLINE_METRICS_PORT``)."""

from __future__ import annotations

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
RECONCILES = Counter("loadline_reconciles_total", "Reconciles, by result.", ["result"])

_started = False


def serve(port: int) -> None:
    global _started
    if port and not _started:
        start_http_server(port, addr="0.0.0.0")
        _started = True
