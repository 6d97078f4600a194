"""What a crash's decision puts in ``status.maintenance`` and ``status.remediation``: an urgent fix
rolls now, one that may wait is held back for the model's window."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from loadline.api import RemediationState
from loadline.maintenance._model import MaintenanceRecord


def pending_remediation(
    previous: RemediationState, decided: RemediationState, urgent: str | None
) -> tuple[RemediationState, str | None]:
    """The remediation state to write after a crash's decision, and the action to put in
    ``status.maintenance`` (None: none). A change of overrides that may wait is held back: the pods keep
    running the overrides they have (``heldOverrides``) until the window; an urgent one rolls now."""
    changed = decided.overrides != previous.overrides
    restart = (
        bool(decided.restart_requested_at) and decided.restart_requested_at != previous.restart_requested_at
    )
    if not changed:
        return decided, ("restart" if restart else None)
    if urgent is not None:
        return decided.model_copy(update={"held_overrides": None}), "remediation"
    held = previous.held_overrides if previous.held_overrides is not None else previous.overrides
    return decided.model_copy(update={"held_overrides": held}), "remediation"


def pending_record(
    persisted: MaintenanceRecord | None, action: str, urgent: str | None, now: datetime
) -> MaintenanceRecord:
    """``status.maintenance`` right after a crash's decision: Running from now when it is ``urgent``
    (the crash recurs at every start: the OOM handler's reconcile rolls it at once), else Scheduled
    with no time yet, for the maintenance timer to choose the window. A remediation covers a pending
    plain restart (it rolls every pod anyway)."""
    prev = persisted or MaintenanceRecord()
    carried = prev.action if prev.pending else None
    merged = "remediation" if "remediation" in (action, carried) else "restart"
    if urgent is not None:
        return MaintenanceRecord(
            action=merged,  # type: ignore[arg-type]
            state="Running",
            trigger="crashLoop",
            scheduled_at=now,
            started_at=now,
            last_restart_at=prev.last_restart_at,
            reason=f"{urgent}; starting the roll-out now.",
        )
    if prev.state == "Running":
        return replace(prev, action=merged)  # type: ignore[arg-type]
    return MaintenanceRecord(
        action=merged,  # type: ignore[arg-type]
        state="Scheduled",
        last_restart_at=prev.last_restart_at,
        reason="waiting for the model's next low-traffic window (being chosen).",
    )
