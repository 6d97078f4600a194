"""Prometheus metrics of the operator (``/metrics`` on ``LOADLINE_METRICS_PORT``)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit

from prometheus_client import Counter, Gauge, Histogram, start_http_server

OOM_INCIDENTS = Counter(
    "loadline_oom_incidents_total",
    "Out-of-memory crashes seen, by class.",
    ["namespace", "inferencemodel", "oom_class"],
)
REMEDIATION_OUTCOMES = Counter(
    "loadline_remediation_outcomes_total",
    "Applied remediations judged: worked (the class did not come back within the horizon) or recurred.",
    ["class", "action", "result"],
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

API_REQUESTS = Counter(
    "loadline_api_requests_total",
    "Requests loadline's own client made to the API server, by verb (get, list, watch, create, apply, "
    "patch, update, delete), resource and HTTP code; kopf's watches and patches are not in it (the API "
    "server's apiserver_flowcontrol_dispatched_requests_total for the chart's FlowSchema counts both).",
    ["verb", "resource", "code"],
)
#: The OOMRisk estimate (status.oomRisk) as a series, for the LoadlineOOMRiskAhead alert: when the
#: deciding signal reaches its limit. No series while no crash is predicted.
OOM_RISK_PREDICTED = Gauge(
    "loadline_oom_risk_predicted_crash_timestamp_seconds",
    "When the model's deciding signal (label signal) is predicted to reach its limit (Unix time); no series "
    "while no out-of-memory crash is predicted (status.oomRisk).",
    ["namespace", "inferencemodel", "signal"],
)
#: What each model asks for and what runs (spec.replicas, status.replicas): the fleet dashboard's
#: replica panel, and what an autoscaler did.
MODEL_REPLICAS = Gauge(
    "loadline_model_replicas",
    "Replicas of a model: desired (spec.replicas, as whoever scales it set it) and ready (status.replicas).",
    ["namespace", "inferencemodel", "state"],
)
#: One GPU's memory as the plan budgets it and as the model's pods really hold it (status.measuredGpuMemory:
#: plannedGiB, maxUsedGiB), for the dashboard's plan-vs-measured panel.
MODEL_GPU_MEMORY = Gauge(
    "loadline_model_gpu_memory_bytes",
    "GPU memory of the model's busiest GPU: source=plan (what the plan budgets) or measured (what its pods "
    "hold, status.measuredGpuMemory).",
    ["namespace", "inferencemodel", "source"],
)

#: The values of the finite labels, so their series exist at 0 before the first event: ``increase()``
#: and ``rate()`` see a counter's first increment only if a scrape saw it before (Prometheus'
#: instrumentation practices, "avoid missing metrics"), and the alerts on these counters would
#: otherwise stay silent on the first crash loop, the first failed fix and the first admission error.
MUTATE_MODEL, VALIDATE_MODEL, VALIDATE_POLICY = (
    "mutate-inferencemodel",
    "validate-inferencemodel",
    "validate-fleetpolicy",
)
WEBHOOKS = (MUTATE_MODEL, VALIDATE_MODEL, VALIDATE_POLICY)
ADMISSION_RESULTS = ("allowed", "warned", "refused", "error")
OUTCOME_RESULTS = ("worked", "recurred")

APPLY_PATCH = "application/apply-patch+yaml"


def api_verb_and_resource(method: str, url: str, headers: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The Kubernetes verb and resource of one request, as the API server's own metrics name them.

    ``/api/v1/namespaces/ns/pods/p/eviction`` is (``create``, ``pods/eviction``); a GET without a name is
    a ``list``, or a ``watch`` with ``?watch=true``; a PATCH of server-side apply's content type is an
    ``apply``. Paths that name no resource (``/api``, ``/apis/apps/v1``, ``/version``) are
    ``discovery``: the dynamic client's, when it fills its discovery cache."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    if segments[:1] == ["api"]:
        rest = segments[2:]
    elif segments[:1] == ["apis"]:
        rest = segments[3:]
    else:
        rest = []
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return method.lower(), "discovery"
    resource = "/".join([rest[0], *rest[2:3]])
    named = len(rest) > 1
    method = method.upper()
    if method == "GET":
        if named:
            return "get", resource
        watching = parse_qs(parts.query).get("watch", [""])[0].lower() in ("true", "1")
        return ("watch" if watching else "list"), resource
    content_type = {k.lower(): v for k, v in (headers or {}).items()}.get("content-type", "")
    verb = {
        "POST": "create",
        "PUT": "update",
        "PATCH": "apply" if content_type.startswith(APPLY_PATCH) else "patch",
        "DELETE": "delete" if named else "deletecollection",
    }.get(method, method.lower())
    return verb, resource


def record_api_request(method: str, url: str, headers: Mapping[str, str] | None, code: str) -> None:
    """Count one request of loadline's own client (``code``: the HTTP status, or ``error`` when none came)."""
    verb, resource = api_verb_and_resource(method, url, headers)
    API_REQUESTS.labels(verb, resource, code).inc()


def record_admission(webhook: str, result: str, seconds: float) -> None:
    """Count and time one admission answer (in the process serving /metrics)."""
    ADMISSIONS.labels(webhook, result).inc()
    ADMISSION_SECONDS.labels(webhook).observe(seconds)


def forget(namespace: str, name: str) -> int:
    """Remove every series labelled with this InferenceModel; returns how many were removed.

    Without this the series of deleted models would live as long as the process."""
    removed = 0
    models = (OOM_INCIDENTS, REMEDIATIONS, RESTARTS, OOM_RISK_PREDICTED, MODEL_REPLICAS, MODEL_GPU_MEMORY)
    for metric in models:
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


def record_oom_risk(namespace: str, name: str, signal: str | None, predicted_at: float | None) -> None:
    """The model's predicted crash time as the one series of its gauge (none while none is predicted)."""
    for family in OOM_RISK_PREDICTED.collect():
        for sample in family.samples:
            labels = sample.labels
            if labels["namespace"] == namespace and labels["inferencemodel"] == name:
                OOM_RISK_PREDICTED.remove(namespace, name, labels["signal"])
    if predicted_at is not None:
        OOM_RISK_PREDICTED.labels(namespace, name, signal or "").set(predicted_at)


def zero_admissions() -> None:
    """Every webhook's every answer at 0 (the AdmissionFailing alert sees the first error)."""
    for webhook in WEBHOOKS:
        for result in ADMISSION_RESULTS:
            ADMISSIONS.labels(webhook, result)


def zero_model(namespace: str, name: str, classes: tuple[str, ...]) -> None:
    """The model's incident series at 0 for every class, so that its first crash loop counts every
    crash in it (the crash-loop alert's ``increase()``); once per model, with its gauges."""
    for oom_class in classes:
        OOM_INCIDENTS.labels(namespace, name, oom_class)


def zero_trial(namespace: str, name: str, oom_class: str, action: str) -> None:
    """When a fix is applied: the series that judge it (worked, recurred) and the one saying that it
    left the model to a person, at 0, so that the first recurrence and the first hand-over fire
    their alerts."""
    for result in OUTCOME_RESULTS:
        REMEDIATION_OUTCOMES.labels(oom_class, action, result)
    REMEDIATIONS.labels(namespace, name, action, "needs_person")


def serve(port: int) -> None:
    """Serve /metrics on ``port`` (0: not at all), every admission answer's series at 0 from the start.
    Once per process (``loadline run`` calls it before anything else: standbys serve it too)."""
    if port:
        zero_admissions()
        start_http_server(port, addr="0.0.0.0")
