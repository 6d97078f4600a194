"""Whether, and how, to apply a proposed remediation: budgets, cool-downs and policy limits.

Pure. The classifier proposes (``propose_remediation``); this module decides against the model's
remediation state (kept in ``status.remediation``, so the decision survives an operator restart) and
the fleet's limits. Rules, in order:

- mode ``off``: record only; ``recommend``: record and say what would be done;
- below the confidence floor, or nothing automatic to do: recommend only;
- the daily budget spent: phase Degraded, "needs a person", and what to look at;
- a change that would undo one made within the cool-down (the other direction on the same setting)
  is dropped: no flapping; a proposal with nothing left is recommended only;
- host memory is raised at least 20 % and never above the policy cap;
- outcomes: every applied fix opens a trial; the same class again within the horizon judges it
  ``recurred`` (:mod:`loadline.oom._outcome`), and a fix that recurred for a class is not proposed again
  for it: the next rung is taken (:func:`loadline.oom._remediate.next_rung`), and when no rung is left
  the model is marked for a person with the history of what was tried.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from loadline.api import AppliedChange, RemediationOutcome, RemediationState, RemediationTrial
from loadline.oom._model import Change, Diagnosis, OomClass, Remediation
from loadline.oom._outcome import (
    DEFAULT_HORIZON,
    MAX_OUTCOMES,
    failed_actions,
    history_sentence,
    judge_outcome,
    outcome_confidence,
)
from loadline.oom._remediate import next_rung
from loadline.units import GIB

# INCIDENT.json field → the override it sets (and how to turn the proposed value into it).
_FIELD_TO_OVERRIDE = {
    "config.max_num_seqs": "max_num_seqs",
    "config.max_num_batched_tokens": "max_num_batched_tokens",
    "config.gpu_memory_utilization": "gpu_memory_utilization",
    "config.max_model_len": "max_model_len",
    "config.kv_offload_cpu_gib": "kv_offload_cpu_gi_b",
    "config.memory_limit_bytes": "memory_gi_b",
    "config.tensor_parallel_size": "min_gpus_per_replica",
    "plan.gpu_memory_gib": "min_gpu_memory_gi_b",
}


@dataclass(frozen=True)
class PolicyLimits:
    """The fleet's limits on automatic remediation (defaults until fleet policies set them)."""

    mode: str = "auto"
    max_actions_per_day: int = 3
    cooldown: timedelta = timedelta(minutes=30)
    min_confidence: float = 0.6
    max_memory_gib: float = 1024.0
    min_memory_raise: float = 0.2


@dataclass(frozen=True)
class Decision:
    """What to do about one incident."""

    apply: bool
    action: str
    result: str
    state: RemediationState
    changes: tuple[AppliedChange, ...] = ()
    restart: bool = False
    needs_person: str = ""
    look_at: tuple[str, ...] = field(default=())
    #: Fixes judged by this incident (or by the clock): for the Event and the outcomes metric.
    outcomes: tuple[RemediationOutcome, ...] = ()


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def _override_value(change: Change, limits: PolicyLimits) -> float | int | None:
    target = _FIELD_TO_OVERRIDE.get(change.field)
    new = _number(change.new)
    if target is None or new is None:
        return None
    if target == "memory_gi_b":
        old = _number(change.old)
        gib = new / GIB
        if old:
            gib = max(gib, old / GIB * (1 + limits.min_memory_raise))
        gib = min(math.ceil(gib), limits.max_memory_gib)
        return gib if not old or gib > old / GIB else None
    if target in {"max_num_seqs", "max_num_batched_tokens", "max_model_len", "min_gpus_per_replica"}:
        return int(new)
    return round(new, 3)


def _undoes_recent(
    target: str, new: float, state: RemediationState, now: datetime, limits: PolicyLimits
) -> bool:
    """Whether setting ``target`` to ``new`` reverses a change made to it within the cool-down."""
    for past in reversed(state.history):
        if _FIELD_TO_OVERRIDE.get(past.field) != target:
            continue
        if now - past.time > limits.cooldown:
            return False
        before, after = _number(past.old), _number(past.new)
        if before is None or after is None:
            return False
        went_up = after > before
        return (new < after) if went_up else (new > after)
    return False


def decide(
    diagnosis: Diagnosis,
    proposal: Remediation,
    state: RemediationState,
    limits: PolicyLimits,
    now: datetime,
    *,
    mode: str | None = None,
    outcome_horizon: timedelta = DEFAULT_HORIZON,
    crash_started_at: datetime | None = None,
) -> Decision:
    """Decide on one incident; the returned state is what to write to ``status.remediation``.

    ``outcome_horizon``: how long an applied fix must hold to count as having worked;
    ``crash_started_at``: when the crashed instance started (a crash of an instance older than a fix
    does not judge that fix)."""
    decision = _decide(diagnosis, proposal, state, limits, now, mode, outcome_horizon, crash_started_at)
    return decision


def _decide(
    diagnosis: Diagnosis,
    proposal: Remediation,
    state: RemediationState,
    limits: PolicyLimits,
    now: datetime,
    mode: str | None,
    horizon: timedelta,
    crash_started_at: datetime | None,
) -> Decision:
    mode = mode or limits.mode
    day = now.date().isoformat()
    state = state.model_copy(deep=True)
    if state.day != day:
        state.day, state.actions_today, state.needs_person = day, 0, ""
    cls = diagnosis.oom_class.value
    outcomes = record_outcomes(state, cls, now, horizon, crash_started_at=crash_started_at)
    if proposal.action != "none" and diagnosis.oom_class != OomClass.UNKNOWN:
        rung = next_rung(proposal, failed_actions(state.outcomes, cls))
        if rung is None:
            state.needs_person = (
                f"needs a person: every fix loadline has for {cls} was tried on this model and the crash "
                f"came back; tried: {history_sentence(state.outcomes, cls)}; look at: "
                + ("; ".join(proposal.look_at) or proposal.summary)
            )
            return Decision(False, proposal.action, "the fixes for this class did not work", state,
                            needs_person=state.needs_person, look_at=proposal.look_at,
                            outcomes=outcomes)  # fmt: skip
        proposal = rung
    decision = _apply(diagnosis, proposal, state, limits, now, mode)
    if decision.apply:
        trial = RemediationTrial.model_validate({"class": cls, "action": decision.action, "appliedAt": now})
        decision.state.trials = [*decision.state.trials, trial][-20:]
    return replace(decision, outcomes=outcomes)


def record_outcomes(
    state: RemediationState,
    incident_class: str | None,
    now: datetime,
    horizon: timedelta,
    *,
    crash_started_at: datetime | None = None,
) -> tuple[RemediationOutcome, ...]:
    """Judge ``state``'s open trials at ``now`` (:func:`judge_outcome`) and record the outcomes in it, in
    place: the trials left open, the outcomes (the newest :data:`MAX_OUTCOMES`) and the confidence per
    class. ``incident_class`` None: no incident, the clock alone (trials past their horizon worked).
    Returns the outcomes judged now."""
    judged = judge_outcome(state.trials, incident_class, now, horizon, crash_started_at=crash_started_at)
    state.trials = list(judged.open)
    if judged.outcomes:
        state.outcomes = [*state.outcomes, *judged.outcomes][-MAX_OUTCOMES:]
        state.outcome_confidence = outcome_confidence(state.outcomes)
    return judged.outcomes


def confidence_by_class(state: RemediationState) -> dict[str, float]:
    """Per class, the share of this model's judged fixes that worked (see :func:`outcome_confidence`)."""
    return outcome_confidence(state.outcomes)


def _apply(
    diagnosis: Diagnosis,
    proposal: Remediation,
    state: RemediationState,
    limits: PolicyLimits,
    now: datetime,
    mode: str,
) -> Decision:
    """The budget, cool-down and policy rules on one (rung-chosen) proposal."""
    look_at = proposal.look_at
    if mode == "off":
        return Decision(False, "none", "remediation is off for this model", state, look_at=look_at)
    if proposal.action == "none" or diagnosis.oom_class == OomClass.UNKNOWN:
        return Decision(False, "none", "no automatic fix; " + proposal.summary, state, look_at=look_at)
    if mode == "recommend":
        return Decision(False, proposal.action, f"recommended: {proposal.summary}", state, look_at=look_at)
    if diagnosis.confidence < limits.min_confidence:
        result = (
            f"recommended only (confidence {diagnosis.confidence:.2f} < {limits.min_confidence:.2f}): "
            f"{proposal.summary}"
        )
        return Decision(False, proposal.action, result, state, look_at=look_at)
    if state.actions_today >= limits.max_actions_per_day:
        what = "; ".join(look_at) or proposal.summary
        state.needs_person = (
            f"needs a person: {limits.max_actions_per_day} automatic changes today did not stop the "
            f"out-of-memory crashes ({diagnosis.oom_class.value}); look at: {what}"
        )
        return Decision(False, proposal.action, "daily remediation budget spent", state,
                        needs_person=state.needs_person, look_at=look_at)  # fmt: skip

    overrides = state.overrides.model_copy()
    applied: list[AppliedChange] = []
    skipped: list[str] = []
    for change in proposal.changes:
        target = _FIELD_TO_OVERRIDE.get(change.field)
        value = _override_value(change, limits)
        if target is None or value is None:
            skipped.append(f"{change.field} (not applied automatically)")
            continue
        if _undoes_recent(target, float(value), state, now, limits):
            skipped.append(f"{change.field} (would undo a change made within the cool-down)")
            continue
        setattr(overrides, target, value)
        old = _number(change.old)
        if old is not None and target == "memory_gi_b":
            old = round(old / GIB, 2)  # history compares old and new, so both in the override's unit
        applied.append(
            AppliedChange(
                time=now,
                oom_class=diagnosis.oom_class.value,
                field=change.field,
                old="" if old is None else f"{old:g}",
                new=f"{value:g}",
            )
        )
    restart = proposal.restart
    if not applied and not restart:
        reason = "; ".join(skipped) or "nothing to change"
        return Decision(False, proposal.action, f"recommended only: {proposal.summary} ({reason})", state,
                        look_at=look_at)  # fmt: skip
    state.overrides = overrides
    state.actions_today += 1
    state.history = [*state.history, *applied][-20:]
    if restart:
        state.restart_requested_at = now.replace(microsecond=0).isoformat().replace("+00:00", "Z")
    parts = [f"{c.field} {c.old or '?'} → {c.new}" for c in applied] + (
        ["restart the pods"] if restart else []
    )
    return Decision(True, proposal.action, "applied: " + ", ".join(parts), state, tuple(applied), restart,
                    look_at=look_at)  # fmt: skip
