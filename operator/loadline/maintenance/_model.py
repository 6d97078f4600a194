"""The planner's plain data: what is persisted, what goes in, what comes out.

:class:`MaintenanceRecord` mirrors ``status.maintenance`` (see ``_status`` for the conversion): the
decision is a function of it, so an operator that restarts or hands over to its standby reads the
record back and reaches the same decision; nothing is scheduled twice or restarted twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from loadline.api import MaintenanceAction, MaintenanceState, MaintenanceTrigger

__all__ = [
    "Action",
    "DecisionKind",
    "LoadSlot",
    "MaintenanceDecision",
    "MaintenanceRecord",
    "RestartLock",
    "State",
    "Trigger",
]

#: ``restart``: restart the pods as they are (fragmentation); ``remediation``: a changed pod template
#: rolls them. A remediation restarts every pod anyway, so it covers a pending restart.
Action = MaintenanceAction
State = MaintenanceState
Trigger = MaintenanceTrigger
#: ``act``: start (or go on with) the restart now; ``schedule``: at ``at``; ``wait_lock``: due, but
#: another governed model holds the policy's restart slot (retry soon); ``cooldown``: refused until
#: ``at``; ``idle``: nothing pending.
DecisionKind = Literal["act", "schedule", "wait_lock", "cooldown", "idle"]


@dataclass(frozen=True)
class MaintenanceRecord:
    """``status.maintenance`` as plain data. Datetimes are aware (UTC once planned)."""

    action: Action | None = None
    state: State = "Idle"
    trigger: Trigger | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    scheduled_at: datetime | None = None
    #: When the running restart began: the pods created before it are the ones to restart.
    started_at: datetime | None = None
    last_restart_at: datetime | None = None
    reason: str = ""

    @property
    def pending(self) -> bool:
        """Whether an action waits or runs (a record in these states carries its action forward)."""
        return self.state in ("Scheduled", "WaitingForLock", "CoolingDown", "Running")


@dataclass(frozen=True)
class RestartLock:
    """One FleetPolicy's restart slots: at most ``max_concurrent`` of the models it governs restart at
    once. ``holders`` are those restarting now (``namespace/name`` of each governed model whose
    ``status.maintenance.state`` is Running); a model counts itself out, so a hand-over that finds
    its own name there goes on."""

    policy: str
    max_concurrent: int
    holders: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LoadSlot:
    """Expected load (relative: 1.0 = a typical day's mean) from ``start`` to ``end``."""

    start: datetime
    end: datetime
    load: float


@dataclass(frozen=True)
class MaintenanceDecision:
    """What to do now, and the record to write to ``status.maintenance``.

    ``at`` is when to act (``act``: now; ``schedule``: the scheduled time) or to ask again
    (``wait_lock``: now, retry after a short delay; ``cooldown``: when it ends). ``changed`` says the
    record differs from the persisted one, i.e. when to post an Event (Scheduled, Restarting ...).
    """

    kind: DecisionKind
    at: datetime | None
    reason: str
    record: MaintenanceRecord
    changed: bool
