"""A vLLM pod's container terminated: detect an out-of-memory crash, classify it, decide.

Orchestration only; every decision is made by pure code (:mod:`loadline.oom`). The handler writes the
incident, the crash id and the decision (new overrides, a restart request) to the InferenceModel's
status in one patch, on condition that what the decision read still holds (a test of each, so that
the readiness its own crash causes meanwhile does not refuse it). When the decision changes the
children, the same patch carries the plan they are rendered from (:func:`_rollout.plan_remediation`,
planned on the crash's thread before the write) and the workload is then applied at once, on the
MODELS lane (:func:`_rollout.apply_remediation`): one plan, one status write and one apply per
crash. What that roll-out cannot do alone (a move between layouts, a failed plan, a refused apply) it
hands to reconcile, by stamping :data:`_rollout.REMEDIATION_ANNOTATION` on the model: the path that
applies every child, with kopf's retries and back-off. An operator that dies between the writes loses
nothing: reconcile runs on resume and applies the overrides from status; the crash id in status
means no crash is acted on twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from loadline import telemetry
from loadline.api import API_VERSION, KIND, FleetPolicy
from loadline.handlers import _events, _kube, _policies, _rollout
from loadline.oom import (
    Crash,
    CrashDecision,
    Incident,
    decide_crash,
    parse_incident,
    remediation_in_force,
    start_up_phase,
)
from loadline.oom._observe import build_incident, crash_id, loop_key, parse_timestamp, terminated_state
from loadline.oom._policy import PolicyLimits
from loadline.pacing import RollOutRequest, Waiting
from loadline.policy import combine, enforced, remediation_limits, select_policies
from loadline.settings import OperatorSettings
from loadline.sizing import ClusterView
from loadline.state import INSTANCE_LABEL, REMEDIATION_VIEW_SECONDS
from loadline.status import build as _build
from loadline.status import read_status, with_changes
from loadline.status.patch import merged
from loadline.traffic import incident_metrics

if TYPE_CHECKING:
    from loadline.handlers._state import OperatorState

CONFLICT_RETRIES = _kube.CONFLICT_RETRIES


def limits(settings: OperatorSettings) -> PolicyLimits:
    return PolicyLimits(
        mode=settings.remediation_mode,
        max_actions_per_day=settings.remediation_max_actions_per_day,
        cooldown=timedelta(minutes=settings.remediation_cooldown_minutes),
        min_confidence=settings.remediation_min_confidence,
        max_memory_gib=settings.remediation_max_memory_gib,
    )


def _started_at(term: Mapping[str, Any]) -> datetime | None:
    """When the crashed instance started (a crash of an instance older than a fix does not judge it)."""
    return parse_timestamp(term.get("startedAt"))


def model_limits(
    parent: Mapping[str, Any], policies: list[FleetPolicy], settings: OperatorSettings
) -> PolicyLimits:
    """The remediation limits for one model: its governing FleetPolicies' (the strictest of them), and
    the environment's for what no policy sets (the cluster-wide fallback)."""
    meta = parent["metadata"]
    governing = select_policies(
        policies,
        meta["namespace"],
        _policies.namespace_labels(meta["namespace"], policies),
        meta.get("labels") or {},
    )
    return (
        remediation_limits(combine(enforced(governing)), limits(settings)) if governing else limits(settings)
    )


def _read_previous_log(
    namespace: str, pod: str, container: str, *, tail_lines: int | None = None, limit_bytes: int | None = None
) -> str | None:
    """The crashed container's previous log, its last ``tail_lines`` or first ``limit_bytes``; None
    when it cannot be read (best effort: the crash is handled without it)."""
    try:
        text = client.CoreV1Api().read_namespaced_pod_log(
            pod, namespace, container=container, previous=True, tail_lines=tail_lines,
            limit_bytes=limit_bytes, _request_timeout=5,
        )  # fmt: skip
    except (ApiException, ValueError):
        return None
    return str(text or "")


def _previous_log(namespace: str, pod: str, container: str) -> str:
    """The crashed container's last lines, when its termination message is empty."""
    return _read_previous_log(namespace, pod, container, tail_lines=60) or ""


#: How much of the crashed instance's log is read from its start to tell its phase: vLLM's start-up
#: lines (loading, weights loaded, KV cache, graphs, "Application startup complete") fit in far less.
LOG_HEAD_BYTES = 256 * 1024


def _previous_log_head(namespace: str, pod: str, container: str) -> tuple[str, bool]:
    """The first :data:`LOG_HEAD_BYTES` of the crashed container's log and whether that is all of it
    (``("", False)`` when the log cannot be read)."""
    text = _read_previous_log(namespace, pod, container, limit_bytes=LOG_HEAD_BYTES)
    if text is None:
        return "", False
    return text, len(text.encode("utf-8", "replace")) < LOG_HEAD_BYTES


def _finished_at(term: Mapping[str, Any]) -> float | None:
    text = term.get("finishedAt")
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def has_new_crash(state: OperatorState, body: Mapping[str, Any]) -> bool:
    """Whether the pod shows a crash not handled yet (no I/O: asked on kopf's event loop, so that only
    crashes take a thread of the CRASHES lane)."""
    for status in (body.get("status") or {}).get("containerStatuses") or []:
        cid = crash_id(body, status)
        if cid is not None and cid not in state.crashes:
            return True
    return False


#: The operator's GPU node and pod indexes (kopf's), from which a crash's remediation is planned.
Indexes = tuple[Mapping[str, Any], Mapping[str, Any]]


def on_pod_event(
    state: OperatorState,
    body: kopf.Body,
    logger: logging.Logger | kopf.Logger,
    settings: OperatorSettings,
    policies: list[FleetPolicy] | None = None,
    known: Mapping[str, Any] | None = None,
    indexes: Indexes | None = None,
) -> None:
    """Handle the pod's crashes not handled yet. ``known``: its model as the operator's index last saw
    it (:func:`loadline.state.model_entry`), decided on first instead of a GET.
    ``indexes``: the GPU nodes and pods a remediation is planned on, for the crash's own roll-out
    (:func:`roll_out_soon`); without them the crash's thread asks reconcile
    (:func:`_rollout.ask_reconcile`), and the roll-out waits for it."""
    pod = dict(body)
    meta = pod.get("metadata", {})
    namespace = meta.get("namespace", "")
    name = (meta.get("labels") or {}).get(INSTANCE_LABEL)
    if not name:
        return
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        cid = crash_id(pod, status)
        if (
            cid is not None
            and cid not in state.crashes
            and _handle_crash(
                state,
                pod,
                status,
                cid,
                namespace,
                str(name),
                logger,
                settings,
                policies or [],
                known,
                indexes,
            )
        ):
            state.crashes.add(cid)


def _handle_crash(
    state: OperatorState,
    pod: Mapping[str, Any],
    status: Mapping[str, Any],
    cid: str,
    namespace: str,
    name: str,
    logger: logging.Logger | kopf.Logger,
    settings: OperatorSettings,
    policies: list[FleetPolicy],
    known: Mapping[str, Any] | None = None,
    indexes: Indexes | None = None,
) -> bool:
    """Record and decide one crash; True once it is in the model's status (or needs nothing).
    Gather (the model, the log, Prometheus), decide (:func:`loadline.oom.decide_crash`), write,
    then roll out and report. The remediation limits are the governing FleetPolicies', else the
    operator's environment.

    The first attempt decides on ``known`` (the model as the index last saw it), when it is the
    model this pod belongs to: at fleet scale a GET per crash was one request in ten of a crash's.

    A 409 means the InferenceModel changed since it was read: read it again and decide again from the
    fresh object. After :data:`CONFLICT_RETRIES` conflicts in a row the crash is *not* marked seen, so
    the next event of the pod brings it back: no crash is ever dropped.

    What the decision reads besides the model (the container's log, Prometheus) is read once, not per
    attempt (:class:`_Reads`): only the model is read again, so the window between its read and the
    write is a decision's CPU time, and a writer that keeps changing the model (a GitOps tool
    annotating it) does not win every round.
    """
    if state.pacer.waiting(f"{namespace}/{name}"):
        # The workload that crashed is the one whose fix waits for a roll-out slot: nothing to judge.
        logger.info("crash %s: the fix of %s/%s waits to roll out; not decided again", cid, namespace, name)
        return True
    reads = _Reads(pod, status, settings)
    expected = False  # whether reconcile was told to pass over versions older than this decision
    for attempt in range(CONFLICT_RETRIES):
        parent = _model_of(known if attempt == 0 else None, namespace, name)
        if parent is None:
            return True
        decided = _decide(parent, reads, cid, policies, settings)
        if decided is None:
            return True
        changes, remediation, waiting = decided.changes, None, None
        if indexes is not None and decided.rolls_out:
            view = state.views.view(*indexes, max_age=REMEDIATION_VIEW_SECONDS)
            changes, remediation, waiting = _with_remediation(
                state, parent, decided, settings, view, policies
            )
            # From before the write: reconcile passes over versions without this decision meanwhile.
            state.roll_outs.expect(namespace, name, cid)
            state.roll_outs.rolling(namespace, name)
            expected = True
        try:
            written = write_decision(parent, changes)
        except _kube.Changed:
            logger.info("crash %s: the InferenceModel changed meanwhile; deciding again", cid)
            time.sleep(min(0.05 * 2**attempt, 1.0))
            continue
        except ApiException:
            if expected:
                state.roll_outs.forget(namespace, name)
                state.pacer.cancel(f"{namespace}/{name}")
            raise
        if decided.rolls_out:
            _roll_out_written(state, settings, logger, parent, written, cid, remediation, waiting, indexes)
        _report(parent, decided, reads.term)
        return True
    if expected:
        state.roll_outs.forget(namespace, name)
        state.pacer.cancel(f"{namespace}/{name}")
    logger.warning(
        "crash %s: %d conflicts in a row; it is kept for the pod's next event", cid, CONFLICT_RETRIES
    )
    return False


def _model_of(known: Mapping[str, Any] | None, namespace: str, name: str) -> dict[str, Any] | None:
    """The model a crash is decided on: as the index last saw it when it has a resourceVersion (the
    first attempt), else read from the API server (None: gone)."""
    if known is not None and known.get("metadata", {}).get("resourceVersion"):
        return dict(known)
    return _kube.get(API_VERSION, KIND, namespace, name)


def _roll_out_written(
    state: OperatorState,
    settings: OperatorSettings,
    logger: logging.Logger | kopf.Logger,
    parent: Mapping[str, Any],
    written: dict[str, Any],
    cid: str,
    remediation: _rollout.Remediation | None,
    waiting: Waiting | None,
    indexes: Indexes | None,
) -> None:
    """A written decision's fix rolls out: at once, from the model as the write left it, and not on
    this thread (the crash lane holds a crash for its decision only), paused when it waits for a
    slot; without the fleet's indexes to plan it on, reconcile is asked to."""
    if indexes is not None:
        roll_out_soon(state, settings, logger, written, cid, remediation, paused=waiting is not None)
    else:
        _rollout.ask_reconcile(parent, cid, logger)


class _Reads:
    """What a crash's decision reads besides its model, each read at most once for all its attempts:
    the container's log (its tail when the termination message is thin, its head when the crash came
    before Ready) and the Prometheus figures around the crash."""

    def __init__(self, pod: Mapping[str, Any], status: Mapping[str, Any], settings: OperatorSettings) -> None:
        self.pod, self.status, self.settings = pod, status, settings
        self.term: Mapping[str, Any] = terminated_state(status) or {}
        self.container = str(status.get("name", ""))
        self._fetched: dict[str, Any] = {}

    def _once(self, key: str, read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if key not in self._fetched:
            self._fetched[key] = read(*args, **kwargs)
        return self._fetched[key]

    def incident(self, parent: Mapping[str, Any]) -> Incident | None:
        """The crash as an incident of ``parent``'s model; None when it is no incident."""
        pod, term, container = self.pod, self.term, self.container
        namespace, pod_name = str(pod["metadata"].get("namespace", "")), str(pod["metadata"]["name"])
        # A host OOM kill needs no log to classify; other crashes without a message get the log's tail.
        needs_log = not term.get("message") and term.get("reason") != "OOMKilled"
        tail = self._once("tail", _previous_log, namespace, pod_name, container) if needs_log else ""
        found = build_incident(pod, self.status, parent, log_tail=tail)
        if found is None:
            return None
        if not found.get("ever_ready"):
            # A crash before (or without sign of) Ready: the start of its log says how far it got,
            # which the timing table needs when the message is thin.
            head, whole = self._once("head", _previous_log_head, namespace, pod_name, container)
            phase = start_up_phase(head, whole=whole)
            if phase:
                found["phase"] = phase
        url = self.settings.prometheus_url
        if url and term.get("finishedAt"):
            plan = read_status(parent).plan
            metrics = self._once(
                "metrics", incident_metrics, url, namespace, pod_name, str(term["finishedAt"]),
                None if plan is None else plan.engine_version,
                max_model_len=None if plan is None else plan.max_model_len,
                node=pod.get("spec", {}).get("nodeName"), deadline=3.0,
            )  # fmt: skip
            if metrics:
                found["metrics"] = metrics
        return parse_incident(found)


def _decide(
    parent: Mapping[str, Any],
    reads: _Reads,
    cid: str,
    policies: list[FleetPolicy],
    settings: OperatorSettings,
) -> CrashDecision | None:
    """Gather what the decision reads about this crash of ``parent``'s model, and decide it."""
    status = read_status(parent)
    generation = parent["metadata"].get("generation")
    if cid in remediation_in_force(status, generation).handled_crashes:
        return None  # before any read of the log
    incident = reads.incident(parent)
    if incident is None:
        return None
    pod_name = str(reads.pod["metadata"]["name"])
    return decide_crash(
        incident, status, model_limits(parent, policies, settings), datetime.now(UTC),
        crash=Crash(cid, loop_key(reads.pod, reads.container), pod_name, reads.container,
                    _started_at(reads.term)),
        generation=generation,
        mode=((parent.get("spec") or {}).get("remediation") or {}).get("mode"),
        outcome_horizon=timedelta(minutes=settings.remediation_outcome_horizon_minutes),
    )  # fmt: skip


def _with_remediation(
    state: OperatorState,
    parent: Mapping[str, Any],
    decided: CrashDecision,
    settings: OperatorSettings,
    view: ClusterView,
    policies: list[FleetPolicy],
) -> tuple[dict[str, Any], _rollout.Remediation | None, Waiting | None]:
    """The decision's changes with the plan of its remediation, planned before the write from the model
    as the write will leave it, so that the write carries the plan: no reconcile has to follow the
    roll-out to write it. The phase the roll-out puts the model in is said now, and whether it waits
    for a roll-out slot (:class:`loadline.pacing._pacer.Pacer`): its steps then write nothing."""
    changes = decided.changes
    leaves = {**parent, "status": merged(parent.get("status") or {}, changes)}
    remediation = _rollout.plan_remediation(state, leaves, settings, view, policies)
    if remediation is None:
        return changes, None, None
    pauses = remediation.workload.get("kind") == "Deployment"  # a LeaderWorkerSet has no spec.paused
    waiting = state.pacer.ask(roll_out_request(parent, remediation)) if pauses else None
    changes = {**changes, **remediation.status}
    said = f"{waiting.ahead} ahead of it; {waiting.reason}" if waiting is not None else ""
    changes |= _build.build_remediating_status(
        with_changes(read_status(parent), changes),
        result=decided.decision.result,
        now=_build.now_iso(),
        waiting=said,
    )
    return changes, remediation, waiting


def roll_out_request(parent: Mapping[str, Any], remediation: _rollout.Remediation) -> RollOutRequest:
    """What the pacer orders a model's roll-out by: its GPU pool, ``spec.priority`` and what it serves."""
    meta, spec = parent["metadata"], parent.get("spec") or {}
    return RollOutRequest(
        key=f"{meta['namespace']}/{meta['name']}",
        pool=remediation.plan.chosen.gpu.name,
        priority=int(spec.get("priority") or 0),
        serves=remediation.replicas * int(spec.get("concurrency") or 1),
        since=time.time(),
    )


def write_decision(parent: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """Write a crash's decision on condition that what it read still holds
    (:func:`_build.build_decision_patch`), else by the resourceVersion; :class:`_kube.Changed` when the
    model changed in what it read (or, in the fallback, at all)."""
    sets, tested = _build.build_decision_patch(parent, changes) or (None, ())
    return _kube.patch_status_tested(parent, sets, tested, changes)


def roll_out_soon(
    state: OperatorState,
    settings: OperatorSettings,
    logger: logging.Logger | kopf.Logger,
    model: dict[str, Any],
    crash: str,
    remediation: _rollout.Remediation | None,
    *,
    paused: bool = False,
) -> Future[object]:
    """A crash's remediation rolled out on the MODELS lane (the crash's thread goes on to its Events);
    ``paused``: it waits for a roll-out slot (applied paused, released by the pacer)."""
    return state.lanes.models.submit(
        _rollout.roll_out, state, settings, model, crash, remediation, logger, paused=paused
    )


def _report(parent: Mapping[str, Any], decided: CrashDecision, term: Mapping[str, Any]) -> None:
    """The metrics and Events of one decided crash, once its decision is written."""
    meta = parent["metadata"]
    labels = (meta["namespace"], meta["name"])
    diagnosis, decision = decided.diagnosis, decided.decision
    telemetry.OOM_INCIDENTS.labels(*labels, diagnosis.oom_class.value).inc()
    outcome = "applied" if decision.apply else ("needs_person" if decision.needs_person else "recommended")
    telemetry.REMEDIATIONS.labels(*labels, decision.action, outcome).inc()
    if decision.apply:
        telemetry.zero_trial(*labels, diagnosis.oom_class.value, decision.action)
    if decision.apply and decided.urgent is not None:
        # The fix rolls now, from this decision (not from the maintenance timer, which counts the rest).
        telemetry.RESTARTS.labels(*labels, "remediation", "crashLoop").inc()
    for judged in decision.outcomes:
        telemetry.REMEDIATION_OUTCOMES.labels(judged.oom_class, judged.action, judged.result).inc()
    for said in decided.events:
        _events.event(parent, warning=said.warning, reason=said.reason, message=said.message)
    finished = _finished_at(term)
    if finished is not None:
        telemetry.DETECTION_TO_ACTION.observe(max(0.0, time.time() - finished))
