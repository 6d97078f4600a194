"""Measured GPU memory beside the plan's budget: a slow timer on Ready and Degraded models.

Reads, for each of the model's pods, what its processes hold on each GPU (loadline's node agent, else
dcgm-exporter) from Prometheus, and writes ``status.measuredGpuMemory`` through the pure builder
:func:`loadline.status.build.build_measured_status`, which writes nothing while the figure holds.
Never blocks long: one Prometheus conversation with a deadline of :data:`DEADLINE_SECONDS`, the first
transport failure ends it, and what was not measured is simply not written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from typing import Any

import kopf

from loadline.api import InferenceModelStatus
from loadline.handlers import _kube, _risk
from loadline.settings import OperatorSettings
from loadline.state import INSTANCE_LABEL
from loadline.status import build as _build
from loadline.status import read_status
from loadline.traffic import PrometheusClient, gpu_memory_used_query, measured_gpu_memory

#: Phases in which the model's pods run and their GPU memory means something.
MEASURED_PHASES = frozenset({"Ready", "Degraded"})
#: Bound on one measurement: each query, and the whole conversation with Prometheus.
QUERY_TIMEOUT_SECONDS = 2.0
DEADLINE_SECONDS = 5.0
#: A model with more pods than this is measured on the first ones by name (one query per pod).
MAX_PODS = 64


def measuring(settings: OperatorSettings, status: InferenceModelStatus) -> bool:
    """Whether the timer should run for a model with this status (and these settings)."""
    return bool(
        settings.prometheus_url and settings.measure_interval_seconds > 0 and status.phase in MEASURED_PHASES
    )


def running_pods(pods: list[dict[str, Any]]) -> list[str]:
    """Names of the pods that may hold GPU memory now (running, not being deleted), sorted."""
    names = [
        str(pod["metadata"]["name"])
        for pod in pods
        if (pod.get("status") or {}).get("phase") == "Running"
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
    ]
    return sorted(names)[:MAX_PODS]


def measure(
    body: kopf.Body,
    patch: kopf.Patch,
    settings: OperatorSettings,
    logger: logging.Logger | kopf.Logger,
    memo: MutableMapping[str, Any] | None = None,
) -> None:
    """One reading of the model's GPU memory into ``patch.status`` (nothing when nothing changed), and
    every ``risk_interval_seconds`` the OOM-risk estimate (:mod:`loadline.handlers._risk`)."""
    status = read_status(body)
    planned = _build.planned_gpu_gib(status.plan)
    if planned is None or not measuring(settings, status):
        return
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    pods = running_pods(_kube.list_objects("v1", "Pod", namespace, label_selector=f"{INSTANCE_LABEL}={name}"))
    if not pods:
        return
    at = time.time()
    with PrometheusClient(
        settings.prometheus_url, timeout=QUERY_TIMEOUT_SECONDS, deadline=DEADLINE_SECONDS
    ) as client:
        answers = {pod: client.query(gpu_memory_used_query(namespace, pod), at) for pod in pods}
    measured = measured_gpu_memory(answers, planned)
    changes = _build.build_measured_status(status, measured, now=_build.now_iso())
    if changes:
        patch.status.update(changes)
        reading = changes["measuredGpuMemory"]
        logger.debug(
            "measured %s GiB on the busiest of %s GPUs (plan %s GiB)",
            reading["maxUsedGiB"],
            reading["gpus"],
            reading["plannedGiB"],
        )
    if memo is not None and _risk.risk_due(memo, settings, time.time()):
        _risk.assess(body, patch, settings, pods, logger)
