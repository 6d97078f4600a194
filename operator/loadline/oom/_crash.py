"""One crash, decided: from the incident and the model's status to what to write and say.

Pure: the operator gathers (the model, the crashed container's log, Prometheus), calls
:func:`decide_crash`, and writes what it returns in one status patch, then posts its Events. What the
decision is made of, in order: the classifier's diagnosis and proposal, the remediation policy's
decision on the remediation state in force, the crash recorded in the model's incidents, and, when the
fix is applied, whether it rolls now or waits for the model's window (``status.maintenance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from loadline.api import InferenceModelStatus, RemediationOutcome, RemediationState
from loadline.maintenance import (
    MaintenanceRecord,
    crash_urgency,
    pending_record,
    pending_remediation,
    record_from_status,
    restart_event,
)
from loadline.oom._classify import classify
from loadline.oom._model import Diagnosis, Incident
from loadline.oom._outcome import DEFAULT_HORIZON
from loadline.oom._policy import Decision, PolicyLimits, decide, record_outcomes
from loadline.oom._remediate import propose_remediation
from loadline.status import build

#: How many crash ids ``status.remediation.handledCrashes`` keeps (the newest).
MAX_HANDLED = 50


@dataclass(frozen=True)
class Crash:
    """Which crash: its id (:func:`loadline.oom._observe.crash_id`), the crash loop it belongs to, the
    pod and container, and when the crashed instance started (a crash of an instance older than a fix
    does not judge that fix)."""

    id: str
    loop: str
    pod: str
    container: str
    started_at: datetime | None = None


@dataclass(frozen=True)
class CrashEvent:
    """A Kubernetes Event to post about the model."""

    warning: bool
    reason: str
    message: str


@dataclass(frozen=True)
class CrashDecision:
    """What one crash changes: ``changes``, the status fields to write in one patch (incidents, the
    remediation state, ``needsPerson``, and ``maintenance`` when the fix rolls now or waits for the
    window); ``events``, to post once that write holds; and the diagnosis and decision themselves (the
    metrics, and whether the operator rolls the fix out)."""

    diagnosis: Diagnosis
    decision: Decision
    changes: dict[str, Any]
    events: tuple[CrashEvent, ...]
    #: Why the fix cannot wait for a window (the crash recurs at every start), else None.
    urgent: str | None = None

    @property
    def rolls_out(self) -> bool:
        """Whether the fix changes what runs (the operator re-plans and rolls the workload)."""
        return self.decision.apply


def remediation_in_force(status: InferenceModelStatus, generation: int | None) -> RemediationState:
    """The remediation state in force: its overrides hold only for the generation they were made for,
    so a person's spec change starts from the spec again (what was learnt, the crashes handled and the
    write revision carry over). A copy: deciding on it never changes ``status``."""
    state = RemediationState() if status.remediation is None else status.remediation.model_copy(deep=True)
    if state.observed_generation != generation:
        return RemediationState(day=state.day, actions_today=state.actions_today, history=state.history,
                                handled_crashes=state.handled_crashes, revision=state.revision)  # fmt: skip
    return state


def decide_crash(
    incident: Incident,
    status: InferenceModelStatus,
    limits: PolicyLimits,
    now: datetime,
    *,
    crash: Crash,
    generation: int | None,
    mode: str | None = None,
    outcome_horizon: timedelta = DEFAULT_HORIZON,
) -> CrashDecision | None:
    """Decide one crash of the model whose status is ``status`` (spec ``generation``, its
    ``spec.remediation.mode``); None when there is nothing of ours to record: the crash was handled
    already, or it is no out-of-memory crash."""
    current = remediation_in_force(status, generation)
    if crash.id in current.handled_crashes:
        return None
    diagnosis = classify(incident)
    if incident.reason != "OOMKilled" and not diagnosis.signals:
        return None
    proposal = propose_remediation(diagnosis, incident)
    decision = decide(
        diagnosis, proposal, current, limits, now, mode=mode, outcome_horizon=outcome_horizon,
        crash_started_at=crash.started_at,
    )  # fmt: skip
    decided = decision.state
    decided.handled_crashes = [*decided.handled_crashes, crash.id][-MAX_HANDLED:]
    decided.observed_generation = generation
    decided.revision = current.revision + 1  # what the next decision's write tests
    incidents = _record_incident(status, diagnosis, decision, crash, now)
    urgent, action = None, None
    if decision.apply:
        # A fix that may wait is held back for the model's window; one whose crash recurs at every
        # start rolls now (loadline.maintenance.crash_urgency says which).
        urgent = crash_urgency(diagnosis.oom_class.value, int(incidents[-1].get("count", 1)))
        decided, action = pending_remediation(current, decided, urgent)
    changes = build.build_incident_status(incidents, decided, needs_person=decision.needs_person)
    record = None
    if action is not None:
        previous = status.maintenance
        record = pending_record(record_from_status(previous), action, urgent, now)
        changes["maintenance"] = build.maintenance_patch(previous, record)
    # A roll-out that starts now is said in the Remediated Event (one Event, not a RestartStarted beside
    # it in the same second: Events are the largest share of a crash burst's writes).
    starting = record.reason if record is not None and urgent is not None else None
    events = _events(crash, diagnosis, decision, starting)
    if record is not None and starting is None:
        events += _maintenance_events(record)
    return CrashDecision(diagnosis, decision, changes, tuple(events), urgent)


@dataclass(frozen=True)
class TrialsJudged:
    """Fixes judged on the clock alone: their horizon passed with no crash of their class."""

    outcomes: tuple[RemediationOutcome, ...]
    #: A merge patch of ``status``: the remediation stanza with the trials closed, the outcomes and the
    #: confidence per class recorded, and its revision moved (a crash's decision made meanwhile on the
    #: stanza before it is refused and made again; see ``build_decision_patch``).
    changes: build.Status
    events: tuple[CrashEvent, ...]


def judge_elapsed_trials(
    status: InferenceModelStatus,
    now: datetime,
    *,
    generation: int | None,
    horizon: timedelta = DEFAULT_HORIZON,
) -> TrialsJudged | None:
    """The model's open trials whose horizon has passed, judged ``worked`` at ``now``; None when none has.

    Without this a fix that worked would be judged only at the model's next crash, which a fix that
    worked makes rare: the outcomes, and the confidence per class built on them, would hold the fixes
    that failed and miss most of those that held. Trials of an older spec generation are void (the
    remediation in force starts from the spec again: :func:`remediation_in_force`) and judged nothing."""
    current = status.remediation
    if current is None:
        return None
    if current.observed_generation != generation or not current.trials:
        return None
    state = current.model_copy(deep=True)
    outcomes = record_outcomes(state, None, now, horizon)
    if not outcomes:
        return None
    state.revision = current.revision + 1
    changes = build.build_remediation_status(state)
    return TrialsJudged(outcomes, changes, tuple(_outcome_events(outcomes, state)))


def _record_incident(
    status: InferenceModelStatus, diagnosis: Diagnosis, decision: Decision, crash: Crash, now: datetime
) -> list[dict[str, Any]]:
    """The model's incidents with this crash counted in its loop."""
    evidence = list(diagnosis.evidence) + ([diagnosis.caller_note] if diagnosis.caller_note else [])
    return build.merge_incident(
        status.incidents,
        loop=crash.loop,
        oom_class=diagnosis.oom_class.value,
        confidence=diagnosis.confidence,
        evidence=evidence,
        caller_side=diagnosis.caller_side,
        action=decision.action,
        result=decision.result,
        pod=crash.pod,
        container=crash.container,
        now=build.iso(now),
    )


def _events(crash: Crash, diagnosis: Diagnosis, decision: Decision, starting: str | None) -> list[CrashEvent]:
    """The Events of one decided crash: the fixes it judged, the crash itself, and the decision;
    ``starting``: the restart it starts now, said in the Remediated Event."""
    events = _outcome_events(decision.outcomes, decision.state)
    first = diagnosis.evidence[0] if diagnosis.evidence else ""
    said = (
        f"{crash.pod}/{crash.container}: {diagnosis.oom_class.value} (confidence {diagnosis.confidence:.2f})."
    )
    events.append(CrashEvent(True, "OutOfMemory", f"{said} {first}"))
    if diagnosis.caller_note:
        events.append(CrashEvent(True, "CallerSidePrompts", diagnosis.caller_note))
    if decision.apply:
        said = f"{decision.result} Restart: {starting}" if starting else decision.result
        events.append(CrashEvent(False, "Remediated", said[:1000]))
    elif decision.needs_person:
        events.append(CrashEvent(True, "NeedsAPerson", decision.needs_person))
    else:
        events.append(CrashEvent(False, "RemediationRecommended", decision.result))
    return events


def _maintenance_events(record: MaintenanceRecord) -> list[CrashEvent]:
    """The Event for the state the decision put ``status.maintenance`` in (a fix that waits)."""
    said = restart_event(record)
    return [] if said is None else [CrashEvent(*said)]


def _outcome_events(outcomes: tuple[RemediationOutcome, ...], state: RemediationState) -> list[CrashEvent]:
    """A ``RemediationOutcome`` Event per judged fix (a warning when it recurred), with the share of its
    class's fixes that worked on this model."""
    events = []
    for judged in outcomes:
        share = state.outcome_confidence.get(judged.oom_class)
        said = f" ({share:.0%} of this class's fixes worked here)" if share is not None else ""
        message = (
            f"{judged.action} for {judged.oom_class}, applied {judged.applied_at:%Y-%m-%d %H:%M}Z: "
            f"{judged.result}{said}"
        )
        events.append(CrashEvent(judged.result == "recurred", "RemediationOutcome", message))
    return events
