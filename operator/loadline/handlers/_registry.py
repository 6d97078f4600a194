"""Every kopf registration of loadline, in one place. Each handler is a thin call into the core."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from loadline.api import GROUP, PLURAL, VERSION
from loadline.handlers import _index, _measure, _metrics, _oom, _reconcile
from loadline.handlers._settings import OperatorSettings

SETTINGS = OperatorSettings()
MANAGED = {"app.kubernetes.io/managed-by": "loadline"}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    prefix = SETTINGS.prefix
    settings.persistence.finalizer = f"{prefix}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=prefix, key="last-handled-configuration"
    )
    settings.watching.server_timeout = SETTINGS.watch_server_timeout
    settings.watching.client_timeout = SETTINGS.watch_client_timeout
    # No kopf peering: one replica runs kopf at a time, elected on a Lease (loadline.handlers._election).
    settings.peering.standalone = True
    settings.peering.mandatory = False
    # Only our explicit Events reach `kubectl describe`; kopf's own INFO chatter would be a write per
    # handler run, which an idle resync must not make.
    settings.posting.level = logging.WARNING
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    # Handlers are synchronous (the Kubernetes client is); enough threads that 100 models crashing at
    # once are handled in parallel rather than queued behind each other.
    settings.execution.max_workers = SETTINGS.max_workers
    _metrics.serve(SETTINGS.metrics_port)


@kopf.index("", "v1", "nodes")
def gpu_nodes(body: kopf.Body, name: str, **_: Any) -> dict[str, Any] | None:
    """GPU nodes, trimmed to what capacity planning reads (kept in memory, no LIST per reconcile)."""
    return _index.node_entry(body, name)


@kopf.index("", "v1", "pods")
def gpu_pods(body: kopf.Body, **_: Any) -> dict[str, Any] | None:
    """Bound pods that hold GPUs, trimmed likewise."""
    return _index.pod_entry(body)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **kwargs: Any) -> None:
    # kopf passes every index by name: gpu_nodes and gpu_pods below.
    _reconcile.reconcile(body, patch, logger, SETTINGS, _index.view(kwargs["gpu_nodes"], kwargs["gpu_pods"]))


def _deploying(status: kopf.Status, **_: Any) -> bool:
    return bool(status.get("phase") == "Deploying")


@kopf.timer(GROUP, VERSION, PLURAL, interval=5, initial_delay=2, when=_deploying)
def readiness(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    # Fires every 5 s but reads the cluster on a back-off (5, 10, 20, 40 s, then each minute).
    _reconcile.check_readiness(body, patch, memo)


def _measurable(status: kopf.Status, **_: Any) -> bool:
    return _measure.measuring(SETTINGS, status)


@kopf.timer(
    GROUP, VERSION, PLURAL, interval=max(SETTINGS.measure_interval_seconds, 1),
    initial_delay=min(max(SETTINGS.measure_interval_seconds, 1), 10), when=_measurable,
)  # fmt: skip
def measured_gpu_memory(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
    # Off without LOADLINE_PROMETHEUS_URL or with LOADLINE_MEASURE_INTERVAL_SECONDS=0 (then `when` never
    # holds and kopf starts no timer); bounded by one Prometheus deadline, never blocks long.
    _measure.measure(body, patch, SETTINGS, logger)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
def workload_event(body: kopf.Body, logger: kopf.Logger, type: str | None, **_: Any) -> None:
    if type == "DELETED":
        return
    _reconcile.on_workload_event(body, logger)


@kopf.on.event("", "v1", "pods", labels={_reconcile.INSTANCE_LABEL: kopf.PRESENT})
def pod_event(body: kopf.Body, logger: kopf.Logger, **kwargs: Any) -> None:
    if kwargs.get("type") == "DELETED":
        return
    _oom.on_pod_event(body, logger, SETTINGS)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget(namespace: str | None, name: str, **_: Any) -> None:
    """A deleted model's metric series go with it (optional: no finalizer holds the deletion)."""
    _metrics.forget(namespace or "", name)
