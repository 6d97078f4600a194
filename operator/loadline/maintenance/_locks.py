"""The fleet-wide restart lock: which governing FleetPolicies limit concurrent restarts, and who holds
their slots. Like kured's lock, it lives in the API: a model holds a slot of every policy governing it
while its ``status.maintenance.state`` is Running, so the lock survives operator restarts and needs
no object of its own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from loadline.api import FleetPolicy
from loadline.maintenance._model import MaintenanceRecord, RestartLock

__all__ = ["holds_restart_slot", "restart_locks"]


def holds_restart_slot(record: MaintenanceRecord | None) -> bool:
    """Whether a model with this ``status.maintenance`` holds its policies' restart slots."""
    return record is not None and record.state == "Running"


def restart_locks(
    governing: Iterable[FleetPolicy], running: Mapping[str, Iterable[str]]
) -> tuple[RestartLock, ...]:
    """A lock for each governing policy that sets ``spec.restarts.maxConcurrent``; ``running`` maps a
    policy's name to the models it governs that hold a slot (``namespace/name``)."""
    return tuple(
        RestartLock(p.name, limit, frozenset(running.get(p.name, ())))
        for p in governing
        if (limit := p.spec.restarts.max_concurrent) is not None
    )
