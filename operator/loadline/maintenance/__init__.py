"""Restarts in low-traffic windows, decided before the operator touches a pod. Pure: no clock, no API.

``plan_maintenance(...)`` decides, for one model and one pending action (a fragmentation restart or a
remediation that rolls the pods), whether to act now, at a scheduled time inside its next quiet window,
after another model's restart (the policies' ``maxConcurrent``), or not within the cool-down; a crash
loop acts at once, a predicted out-of-memory crash before the window moves the restart to the quietest
slot before it. The decision is a function of what ``status.maintenance`` holds, so an operator
restart or hand-over reaches the same answer. ``plan_rollout(...)`` then restarts the pods one at a
time through eviction, surging a new pod first for a single-replica model when there is room.

    record = record_from_status(status.get("maintenance"))
    decision = plan_maintenance(model="team-a/chat", now=now, action="restart", windows=plan.windows,
                                duration=plan.duration, persisted=record, policy_windows=sets,
                                locks=restart_locks(governing, running), cooldown=timedelta(minutes=30),
                                risk=estimate, forecast=forecast_load(series, tz, now, now + 2 * DAY))
    patch["status"]["maintenance"] = record_to_status(decision.record).model_dump(by_alias=True, ...)
    step = plan_rollout(pods, decision.record.started_at, replicas=1, room_for_surge=True)

See docs/restarts.md.
"""

from loadline.maintenance._allowed import PolicySet, allowed_intervals
from loadline.maintenance._errors import MaintenanceInputError
from loadline.maintenance._forecast import forecast_load, quietest_start
from loadline.maintenance._locks import (
    SLOT_CLAIM_GRACE,
    SlotClaim,
    claim_holders,
    format_slot_claims,
    holds_restart_slot,
    parse_slot_claims,
    restart_locks,
    standing_claims,
)
from loadline.maintenance._model import (
    Action,
    DecisionKind,
    LoadSlot,
    MaintenanceDecision,
    MaintenanceRecord,
    RestartLock,
    State,
    Trigger,
)
from loadline.maintenance._pending import pending_record, pending_remediation
from loadline.maintenance._plan import finish_maintenance, plan_maintenance
from loadline.maintenance._rollout import PodState, RolloutAction, RolloutStep, plan_rollout
from loadline.maintenance._scaling import scaling_in_progress
from loadline.maintenance._status import EVENT_REASONS, record_from_status, record_to_status, restart_event
from loadline.maintenance._urgency import crash_urgency

__all__ = [
    "EVENT_REASONS",
    "SLOT_CLAIM_GRACE",
    "Action",
    "DecisionKind",
    "LoadSlot",
    "MaintenanceDecision",
    "MaintenanceInputError",
    "MaintenanceRecord",
    "PodState",
    "PolicySet",
    "RestartLock",
    "RolloutAction",
    "RolloutStep",
    "SlotClaim",
    "State",
    "Trigger",
    "allowed_intervals",
    "claim_holders",
    "crash_urgency",
    "finish_maintenance",
    "forecast_load",
    "format_slot_claims",
    "holds_restart_slot",
    "parse_slot_claims",
    "pending_record",
    "pending_remediation",
    "plan_maintenance",
    "plan_rollout",
    "quietest_start",
    "record_from_status",
    "record_to_status",
    "restart_event",
    "restart_locks",
    "scaling_in_progress",
    "standing_claims",
]
