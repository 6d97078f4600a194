"""Observed memory: what a running model's vLLM reported at start-up, read from its pod's log through
the API server, written to ``status.observed`` beside the plan, kept in the fleet's observation store,
and acted on when it holds less than the spec asks.

A slow timer on Ready and Degraded models whose plan has not been observed yet (a new plan, another
layout or release, is observed again), looking at once and then on a back-off (:func:`look_due`).
One bounded read of the first pod's log (its start: vLLM's start-up lines come first, with GiB and
tokens); where Prometheus is configured and the log does not say, vLLM's ``vllm:cache_config_info``
(blocks, so tokens only). Nothing is written until one says.
The decisions are the pure :mod:`loadline.observe`'s; this module reads and writes.

When vLLM reports room for fewer sequences than ``spec.concurrency``, the condition ``KVCapacity``
says so and reconcile is asked to plan the model again: the store now holds the observation, so the
plan holds the shortfall back on that GPU type (more GPUs or another type, within the FleetPolicies'
limits and the spec's ``gpu`` bounds, as every plan), before any crash.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from loadline.api import InferenceModelStatus
from loadline.api._observed import OBSERVATIONS_CONFIGMAP, OBSERVATIONS_KEY, ObservationRecord
from loadline.errors import LoadlineError
from loadline.handlers import _kube
from loadline.observe import (
    CorrectionStore,
    Observation,
    ObserveError,
    load_store,
    mismatches,
    observation_from_cache_config,
    parse_startup_log,
    plan_fingerprint,
    record_of,
    uncorrected_kv_gib,
)
from loadline.settings import OperatorSettings
from loadline.state import INSTANCE_LABEL, AppliedVersions
from loadline.status import build as _build
from loadline.status import read_status, stored
from loadline.traffic import CACHE_CONFIG_INFO, PrometheusClient, cache_config_query, samples

if TYPE_CHECKING:
    from loadline.state import ReadyPods

#: Phases in which the model's engine runs and has logged its start-up figures.
OBSERVED_PHASES = frozenset({"Ready", "Degraded"})
#: How much of the pod's log is read: vLLM's start-up lines come first and fit in far less.
LOG_HEAD_BYTES = 256 * 1024
#: How often a model not observed yet is looked at (its engine may still be starting).
INTERVAL_SECONDS = 10.0
#: Annotation that asks reconcile to plan again after an observation below the spec (its value: when).
REPLAN_ANNOTATION = "observed.loadline.dev/replan"


def observing(status: InferenceModelStatus) -> bool:
    """Whether the model's running plan is still to be observed (no I/O: asked on kopf's loop)."""
    if status.phase not in OBSERVED_PHASES or status.plan is None:
        return False
    seen = None if status.observed is None else status.observed.plan_fingerprint
    return seen != plan_fingerprint(stored(status.plan))


def look_due(body: Mapping[str, Any], memo: MutableMapping[str, Any]) -> bool:
    """Whether the pod's log is to be read now (then the look is noted in ``memo``, the model's own).
    An episode is one plan being Ready (a new plan, or Ready again after a restart, starts another):
    looked at soon, then on a back-off (:func:`_build.observe_look_due`), so that a log that never
    holds the figures costs a read every ten minutes, not two every ten seconds. No I/O."""
    status = read_status(body)
    now = datetime.now(UTC)
    plan = None if status.plan is None else stored(status.plan)
    episode = (plan_fingerprint(plan), _build.ready_since(status))
    if memo.get("observe_episode") != episode:
        memo.update(observe_episode=episode, observe_since=episode[1] or now, observe_looked_at=None)
    elapsed = (now - memo["observe_since"]).total_seconds()
    if not _build.observe_look_due(elapsed, memo.get("observe_looked_at")):
        return False
    memo["observe_looked_at"] = elapsed
    return True


class Observations:
    """The fleet's observation store as this process last read or wrote it, for the planner (no read
    per reconcile): loaded at start-up, updated by each observation this process writes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._store = CorrectionStore()
        self._versions = AppliedVersions(max_entries=4)  # the store's ConfigMap only

    def current(self) -> CorrectionStore:
        with self._lock:
            return self._store

    def load(self, settings: OperatorSettings, logger: logging.Logger | kopf.Logger) -> None:
        """Read the store's ConfigMap (absent: an empty store). A store that cannot be read or parsed
        is logged and left empty: plans are then uncorrected, as before any observation."""
        try:
            found = _kube.get("v1", "ConfigMap", settings.resolved_lease_namespace(), OBSERVATIONS_CONFIGMAP)
            text = ((found or {}).get("data") or {}).get(OBSERVATIONS_KEY, "")
            store = load_store(text, f"ConfigMap {OBSERVATIONS_CONFIGMAP}")
        except (ApiException, LoadlineError, OSError, HTTPError) as exc:
            logger.warning("observation store not read, plans stay uncorrected: %s", exc)
            return
        with self._lock:
            self._store = store

    def add(self, record: ObservationRecord, settings: OperatorSettings) -> CorrectionStore:
        """Add ``record`` to the store in the cluster (read, add, apply with the resourceVersion read as
        a precondition, so a concurrent writer's records are not lost: a conflict reads again) and
        here."""
        namespace = settings.resolved_lease_namespace()
        for _ in range(3):
            found = _kube.get("v1", "ConfigMap", namespace, OBSERVATIONS_CONFIGMAP)
            text = ((found or {}).get("data") or {}).get(OBSERVATIONS_KEY, "")
            store = load_store(text, f"ConfigMap {OBSERVATIONS_CONFIGMAP}").add(record)
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": OBSERVATIONS_CONFIGMAP, "namespace": namespace},
                "data": {OBSERVATIONS_KEY: store.to_json()},
            }
            if found is not None:
                body["metadata"]["resourceVersion"] = found["metadata"]["resourceVersion"]
            try:
                _kube.apply(body, settings.field_manager, self._versions)
            except ApiException as exc:
                if exc.status == 409:
                    continue
                raise
            with self._lock:
                self._store = store
            return store
        raise ApiException(status=409, reason="the observation store kept changing")


def _plan_settings(plan: Mapping[str, Any]) -> dict[str, Any]:
    """``status.plan``'s settings under the names vLLM logs them by (:func:`loadline.observe.mismatches`)."""
    names = {
        "tensor_parallel_size": "tensorParallelSize",
        "pipeline_parallel_size": "pipelineParallelSize",
        "max_model_len": "maxModelLen",
        "gpu_memory_utilization": "gpuMemoryUtilization",
        "version": "engineVersion",
    }
    return {ours: plan[theirs] for ours, theirs in names.items() if plan.get(theirs) is not None}


def _read_log(namespace: str, pod: str, container: str) -> str | None:
    try:
        text = client.CoreV1Api().read_namespaced_pod_log(
            pod, namespace, container=container, limit_bytes=LOG_HEAD_BYTES, _request_timeout=5
        )
    except (ApiException, ValueError):
        return None
    return str(text or "")


def _from_log(namespace: str, pod: str, container: str) -> tuple[Observation, str] | None:
    """The start-up figures in the pod's log (GiB and tokens), when it holds them."""
    text = _read_log(namespace, pod, container)
    if not text:
        return None
    source = f"pod {namespace}/{pod} log"
    try:
        return parse_startup_log(text, source=source), source
    except ObserveError:
        return None


def _from_prometheus(settings: OperatorSettings, namespace: str, pod: str) -> tuple[Observation, str] | None:
    """The KV cache's blocks from vLLM's ``vllm:cache_config_info`` through Prometheus, where it is
    configured: for a pod whose log no longer holds its start (rotated) or cannot be read. Tokens only
    (the metric has no GiB), so it sets the condition but teaches the store nothing."""
    if not settings.prometheus_url:
        return None
    with PrometheusClient(settings.prometheus_url, timeout=2.0, deadline=3.0) as client:
        answer = client.query(cache_config_query(namespace, pod), time.time())
    obs = observation_from_cache_config([labels for labels, _ in samples(answer)])
    return (obs, f"prometheus {CACHE_CONFIG_INFO} of pod {namespace}/{pod}") if obs is not None else None


def _running_pod(namespace: str, name: str) -> dict[str, Any] | None:
    pods = _kube.list_objects("v1", "Pod", namespace, label_selector=f"{INSTANCE_LABEL}={name}")
    running = [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return min(running, key=lambda p: str(p["metadata"]["name"])) if running else None


def observe(
    body: Mapping[str, Any],
    patch: kopf.Patch,
    settings: OperatorSettings,
    store: Observations,
    logger: logging.Logger | kopf.Logger,
    ready: ReadyPods | None = None,
) -> None:
    """Read the model's running engine's start-up figures into ``patch.status`` (nothing until its log
    holds them), keep them in the store, and ask for a new plan when they hold less than the spec.
    ``ready``: the pod watch's Ready pods, which name the pod to read without a LIST (in a storm every
    model Ready again is looked at, and that LIST was one request per crash)."""
    status = read_status(body)
    if not observing(status) or status.plan is None:
        return
    plan = stored(status.plan)
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    serving = ready.serving(namespace, name) if ready is not None else None
    if serving is None:  # not in the pod watch's view (a LeaderWorkerSet's pods): listed
        pod = _running_pod(namespace, name)
        if pod is None:
            return
        serving = str(pod["metadata"]["name"]), str(pod["spec"]["containers"][0]["name"])
    pod_name, container = serving
    found = _from_log(namespace, pod_name, container) or _from_prometheus(settings, namespace, pod_name)
    if found is None:
        return  # not yet: the engine has not said its figures (looked at again on the next tick)
    obs, source = found
    now = _build.now_iso()
    changes, below = _build.build_observed_status(body, status, obs, pod=pod_name, source=source, now=now)
    observed = changes["observed"]
    written: Mapping[str, Any] = body
    if below:
        # Written here, before the re-plan is asked below: reconcile then starts from a model that holds
        # the observation and the condition (kopf writes a handler's metadata and status in two
        # requests, and reconcile's status write, from the first, would drop the condition).
        try:
            written = _kube.patch_status(body, changes)
        except ApiException as exc:
            if exc.status == 409:
                return  # the model changed meanwhile: observed again on the next tick
            raise
    else:
        patch.status.update(changes)
    planned = uncorrected_kv_gib(plan)
    differ = mismatches(obs, _plan_settings(plan))
    if differ:  # not the engine the plan describes (a pod of an older plan): shown, not learned from
        logger.warning("%s/%s: not learned from %s: it ran %s", namespace, name, source, ", ".join(differ))
    elif obs.kv_cache_gib is not None and planned and plan.get("modelFamily"):
        record = record_of(
            obs,
            family=str(plan["modelFamily"]),
            gpu_type=str(plan.get("gpuType") or ""),
            quantization=str(plan.get("quantization") or "none"),
            version=str(plan.get("engineVersion") or ""),
            planned_kv_gib=planned,
            model=str(((body.get("spec") or {}).get("model") or {}).get("name") or ""),
            source=source,
            time=datetime.now(UTC),
        )
        try:
            store.add(record, settings)
        except ApiException as exc:
            logger.warning("%s/%s: observation not stored: %s", namespace, name, _kube.api_error_text(exc))
    logger.info(
        "%s/%s: vLLM reported KV cache %s GiB per GPU (plan %s), room for %s sequences (spec %s)",
        namespace, name, obs.kv_cache_gib, observed.get("plannedKvCacheGiB"),
        observed.get("maxConcurrency"), (body.get("spec") or {}).get("concurrency"),
    )  # fmt: skip
    if below:
        # Reconcile plans again, with the store that now holds this observation.
        try:
            _kube.annotate(written, {REPLAN_ANNOTATION: json.dumps(time.time())})
        except ApiException as exc:
            logger.warning("%s/%s: re-plan not asked: %s", namespace, name, _kube.api_error_text(exc))
