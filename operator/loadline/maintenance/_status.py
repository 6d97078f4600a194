"""``status.maintenance`` in and out: the pydantic model at the boundary, the plain record inside."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from loadline.api import Maintenance, validate_known
from loadline.maintenance._model import MaintenanceRecord

__all__ = ["record_from_status", "record_to_status"]


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)


def record_from_status(maintenance: Maintenance | Mapping[str, Any] | None) -> MaintenanceRecord | None:
    """The record from ``status.maintenance`` as read from the API (camelCase dict) or the model;
    None when the model has none yet. Validated by the API model, so a hand-edited status that breaks
    the schema fails here with pydantic's error, not later."""
    if maintenance is None:
        return None
    model = maintenance if isinstance(maintenance, Maintenance) else validate_known(Maintenance, maintenance)
    return MaintenanceRecord(
        action=model.action,
        state=model.state,
        trigger=model.trigger,
        window_start=_utc(model.next_window_start),
        window_end=_utc(model.next_window_end),
        scheduled_at=_utc(model.scheduled_at),
        started_at=_utc(model.started_at),
        last_restart_at=_utc(model.last_restart_at),
        reason=model.reason,
    )


def record_to_status(record: MaintenanceRecord) -> Maintenance:
    """``status.maintenance`` for ``record`` (dump with ``by_alias=True, mode="json"``)."""
    return Maintenance(
        action=record.action,
        state=record.state,
        trigger=record.trigger,
        next_window_start=record.window_start,
        next_window_end=record.window_end,
        scheduled_at=record.scheduled_at,
        started_at=record.started_at,
        last_restart_at=record.last_restart_at,
        reason=record.reason,
    )


#: The Event reason for each state a restart decision moves the model to.
EVENT_REASONS = {
    "Scheduled": "RestartScheduled",
    "WaitingForLock": "RestartWaiting",
    "CoolingDown": "RestartCoolingDown",
    "Running": "RestartStarted",
    "Done": "RestartDone",
}


def restart_event(record: MaintenanceRecord) -> tuple[bool, str, str] | None:
    """The Event for the state a restart decision moved the model to: (warning, reason, message), or
    None for a state that is said otherwise."""
    reason = EVENT_REASONS.get(record.state)
    if reason is None:
        return None
    return record.state in ("WaitingForLock", "CoolingDown"), reason, record.reason[:1000]
