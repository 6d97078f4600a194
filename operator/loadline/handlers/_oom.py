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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes.client.exceptions import ApiException

from loadline.api import API_VERSION, KIND, FleetPolicy
from loadline.handlers import _events, _inputs, _kube, _metrics, _policies, _rollout
from loadline.handlers._index import INSTANCE_LABEL
from loadline.handlers._settings import OperatorSettings
from loadline.maintenance import crash_urgency, pending_record, pending_remediation, record_from_status
from loadline.oom import classify, parse_incident, propose_remediation, start_up_phase
from loadline.oom._observe import build_incident, crash_id, loop_key, parse_timestamp, terminated_state
from loadline.oom._policy import PolicyLimits, decide
from loadline.policy import combine, enforced, remediation_limits, select_policies
from loadline.status import build as _build
from loadline.traffic import incident_metrics

if TYPE_CHECKING:
    from loadline.handlers._state import OperatorState

MAX_HANDLED = 50
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
    from kubernetes import client

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


@dataclass(frozen=True)
class RollOut:
    """How the operator rolls a crash's remediation out itself. ``plan``: the remediation of the model
    as the decision will leave it (:func:`_rollout.plan_remediation`; None leaves it to reconcile),
    asked before the decision is written so that the write carries its plan. ``start``: given the model
    as the write answered, the crash's id and that remediation, applies the workload or asks reconcile
    (the operator does it on the MODELS lane), not waited for."""

    plan: Callable[[dict[str, Any]], _rollout.Remediation | None]
    start: Callable[[dict[str, Any], str, _rollout.Remediation | None], object]


def on_pod_event(
    state: OperatorState,
    body: kopf.Body,
    logger: logging.Logger | kopf.Logger,
    settings: OperatorSettings,
    policies: list[FleetPolicy] | None = None,
    known: Mapping[str, Any] | None = None,
    roll_out: RollOut | None = None,
) -> None:
    """Handle the pod's crashes not handled yet. ``known``: its model as the operator's index last saw
    it (:func:`loadline.handlers._index.model_entry`), decided on first instead of a GET.
    ``roll_out``: how a remediation is rolled out (:class:`RollOut`); without it the crash's thread
    asks reconcile (:func:`_rollout.ask_reconcile`), and the roll-out waits for it."""
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
                roll_out,
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
    roll_out: RollOut | None = None,
) -> bool:
    """Record and decide one crash; True once it is in the model's status (or needs nothing).
    The remediation limits are the governing FleetPolicies', else the operator's environment.

    The first attempt decides on ``known`` (the model as the index last saw it), when it is the
    model this pod belongs to: at fleet scale a GET per crash was one request in ten of a crash's.

    A 409 means the InferenceModel changed since it was read: read it again and decide again from the
    fresh object. After :data:`CONFLICT_RETRIES` conflicts in a row the crash is *not* marked seen, so
    the next event of the pod brings it back: no crash is ever dropped.

    What the decision reads besides the model (the container's log, Prometheus)
    is read once, not per attempt: only the model is read again, so the window between its read and
    the write is a decision's CPU time, and a writer that keeps changing the model (a GitOps tool
    annotating it) does not win every round.
    """
    fetched: dict[str, Any] = {}

    def once(key: str, read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if key not in fetched:
            fetched[key] = read(*args, **kwargs)
        return fetched[key]

    pod_name = str(pod["metadata"]["name"])
    term = terminated_state(status) or {}
    container = str(status.get("name", ""))
    # A host OOM kill needs no log to classify; other crashes without a message get the log's tail.
    needs_log = not term.get("message") and term.get("reason") != "OOMKilled"
    expected = False  # whether reconcile was told to pass over versions older than this decision
    for attempt in range(CONFLICT_RETRIES):
        parent = (
            dict(known)
            if attempt == 0 and known is not None and known.get("metadata", {}).get("resourceVersion")
            else _kube.get(API_VERSION, KIND, namespace, name)
        )
        if parent is None:
            return True
        owner_uids = {o.get("uid") for o in pod.get("metadata", {}).get("ownerReferences") or []}
        current = _inputs.remediation_state(parent)
        if cid in current.handled_crashes:
            return True
        log_tail = once("tail", _previous_log, namespace, pod_name, container) if needs_log else ""
        incident_dict = build_incident(pod, status, parent, log_tail=log_tail)
        if incident_dict is None:
            return True
        if not incident_dict.get("ever_ready"):
            # A crash before (or without sign of) Ready: the start of its log says how far it got,
            # which the timing table needs when the message is thin.
            head, whole = once("head", _previous_log_head, namespace, pod_name, container)
            phase = start_up_phase(head, whole=whole)
            if phase:
                incident_dict["phase"] = phase
        if settings.prometheus_url and term.get("finishedAt"):
            plan = (parent.get("status") or {}).get("plan") or {}
            metrics = once(
                "metrics", incident_metrics, settings.prometheus_url, namespace, pod_name,
                str(term["finishedAt"]), plan.get("engineVersion"), max_model_len=plan.get("maxModelLen"),
                node=pod.get("spec", {}).get("nodeName"), deadline=3.0,
            )  # fmt: skip
            if metrics:
                incident_dict["metrics"] = metrics
        incident = parse_incident(incident_dict)
        diagnosis = classify(incident)
        if incident.reason != "OOMKilled" and not diagnosis.signals:
            return True  # not an out-of-memory crash: nothing of ours to record
        proposal = propose_remediation(diagnosis, incident)
        mode = ((parent.get("spec") or {}).get("remediation") or {}).get("mode")
        now = datetime.now(UTC)
        decision = decide(
            diagnosis, proposal, current, model_limits(parent, policies, settings), now, mode=mode,
            outcome_horizon=timedelta(minutes=settings.remediation_outcome_horizon_minutes),
            crash_started_at=_started_at(term),
        )  # fmt: skip
        new_state = decision.state
        new_state.handled_crashes = [*new_state.handled_crashes, cid][-MAX_HANDLED:]
        new_state.observed_generation = parent["metadata"].get("generation")
        new_state.revision = current.revision + 1  # what the next decision's write tests
        evidence = list(diagnosis.evidence) + ([diagnosis.caller_note] if diagnosis.caller_note else [])
        incidents = _build.merge_incident(
            (parent.get("status") or {}).get("incidents") or [],
            loop=loop_key(pod, container),
            oom_class=diagnosis.oom_class.value,
            confidence=diagnosis.confidence,
            evidence=evidence,
            caller_side=diagnosis.caller_side,
            action=decision.action,
            result=decision.result,
            pod=str(pod["metadata"]["name"]),
            container=container,
            now=_build.now_iso(),
        )
        action = None
        urgent = None
        if decision.apply:
            # A fix that may wait is held back for the model's window; one whose crash recurs at every
            # start rolls now (loadline.maintenance.crash_urgency says which).
            urgent = crash_urgency(diagnosis.oom_class.value, int(incidents[-1].get("count", 1)))
            new_state, action = pending_remediation(current, new_state, urgent)
        changes = _build.build_incident_status(incidents, new_state, needs_person=decision.needs_person)
        if action is not None:
            previous = (parent.get("status") or {}).get("maintenance")
            record = pending_record(record_from_status(previous), action, urgent, now)
            changes["maintenance"] = _build.maintenance_patch(previous, record)
        remediation = None
        if roll_out is not None and decision.apply:
            # Planned before the write, from the model as the write will leave it, so that the write
            # carries the plan: no reconcile has to follow the roll-out to write it.
            remediation = roll_out.plan({**parent, "status": {**(parent.get("status") or {}), **changes}})
            if remediation is not None:
                changes = {**changes, **remediation.status}
                # The phase the roll-out puts the model in, said now: its steps then write nothing.
                leaves = {**(parent.get("status") or {}), **changes}
                changes |= _build.build_remediating_status(
                    leaves, result=decision.result, now=_build.now_iso()
                )
            # From before the write: reconcile passes over versions without this decision meanwhile.
            state.roll_outs.expect(namespace, name, cid)
            expected = True
        try:
            written = _write_decision(parent, changes)
        except _kube.Changed:
            logger.info("crash %s: the InferenceModel changed meanwhile; deciding again", cid)
            time.sleep(min(0.05 * 2**attempt, 1.0))
            continue
        except ApiException:
            if expected:
                state.roll_outs.forget(namespace, name)
            raise
        if roll_out is not None and decision.apply:
            # At once, from the model as this write left it, and not on this thread: the crash lane
            # holds a crash for its decision only.
            roll_out.start(written, cid, remediation)
        elif decision.apply:
            _rollout.ask_reconcile(parent, cid, logger)
        # A roll-out that starts now is said in the Remediated Event (one Event, not a RestartStarted
        # beside it in the same second: Events are the largest share of a crash burst's writes).
        starting = record.reason if action is not None and urgent is not None else None
        _report(parent, pod, container, diagnosis, decision, owner_uids, starting=starting)
        if action is not None and starting is None:
            _events.report_pending(parent, changes["maintenance"])
        finished = _finished_at(term)
        if finished is not None:
            _metrics.DETECTION_TO_ACTION.observe(max(0.0, time.time() - finished))
        return True
    if expected:
        state.roll_outs.forget(namespace, name)
    logger.warning(
        "crash %s: %d conflicts in a row; it is kept for the pod's next event", cid, CONFLICT_RETRIES
    )
    return False


def _write_decision(parent: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """Write a crash's decision on condition that what it read still holds
    (:func:`_build.build_decision_patch`), else by the resourceVersion; :class:`_kube.Changed` when the
    model changed in what it read (or, in the fallback, at all)."""
    sets, tested = _build.build_decision_patch(parent, changes) or (None, ())
    return _kube.patch_status_tested(parent, sets, tested, changes)


def _report(parent: Mapping[str, Any], pod: Mapping[str, Any], container: str, diagnosis: Any, decision: Any,
            owner_uids: set[Any], *, starting: str | None = None) -> None:  # fmt: skip
    """The metrics and Events of one decided crash; ``starting``: the restart it starts now, said in
    the Remediated Event."""
    meta = parent["metadata"]
    labels = (meta["namespace"], meta["name"])
    _metrics.OOM_INCIDENTS.labels(*labels, diagnosis.oom_class.value).inc()
    outcome = "applied" if decision.apply else ("needs_person" if decision.needs_person else "recommended")
    _metrics.REMEDIATIONS.labels(*labels, decision.action, outcome).inc()
    for judged in decision.outcomes:
        _metrics.REMEDIATION_OUTCOMES.labels(judged.oom_class, judged.action, judged.result).inc()
        share = decision.state.outcome_confidence.get(judged.oom_class)
        said = f" ({share:.0%} of this class's fixes worked here)" if share is not None else ""
        message = (
            f"{judged.action} for {judged.oom_class}, applied {judged.applied_at:%Y-%m-%d %H:%M}Z: "
            f"{judged.result}{said}"
        )
        _events.event(
            parent, warning=judged.result == "recurred", reason="RemediationOutcome", message=message
        )
    first = diagnosis.evidence[0] if diagnosis.evidence else ""
    _events.event(parent, warning=True, reason="OutOfMemory",
                      message=f"{pod['metadata']['name']}/{container}: {diagnosis.oom_class.value} "
                      f"(confidence {diagnosis.confidence:.2f}). {first}")  # fmt: skip
    if diagnosis.caller_note:
        _events.event(parent, warning=True, reason="CallerSidePrompts", message=diagnosis.caller_note)
    if decision.apply:
        said = f"{decision.result} Restart: {starting}" if starting else decision.result
        _events.event(parent, warning=False, reason="Remediated", message=said[:1000])
    elif decision.needs_person:
        _events.event(parent, warning=True, reason="NeedsAPerson", message=decision.needs_person)
    else:
        _events.event(parent, warning=False, reason="RemediationRecommended", message=decision.result)
