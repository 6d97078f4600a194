"""The order in which a model's pods restart: one at a time, through eviction, never all at once.

The workload's PodDisruptionBudget (``maxUnavailable: 1``) is honoured by the Eviction API, and this
plan never asks for a second eviction before the previous pod's replacement is Ready. A model with one
replica would be down for a whole start-up (minutes of weight loading), so when the cluster has room
for one more pod it first surges a new pod, waits until it is Ready, then evicts the old one and
scales back; without room it says so and restarts the pod in place. Stateless: the step is a function
of the pods as they are and the restart's start time (pods created after it are the restarted ones),
so a handler can call it on every pass, and after a hand-over, without counting anything itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from loadline.maintenance._errors import MaintenanceInputError

__all__ = ["PodState", "RolloutAction", "RolloutStep", "plan_rollout"]

#: ``surge``: scale the workload to ``scale_to`` (one more pod) before anything goes; ``evict``: evict
#: ``pod`` (then scale to ``scale_to`` when set); ``wait``: ask again shortly; ``scale_back``: scale
#: to ``scale_to``, the surge pod is no longer needed; ``done``: every pod is newer than the restart.
RolloutAction = Literal["surge", "evict", "wait", "scale_back", "done"]


@dataclass(frozen=True)
class PodState:
    """A pod of the model as the restart needs it."""

    name: str
    created: datetime
    ready: bool
    #: Being deleted (``metadata.deletionTimestamp`` set): gone for the plan, but still shutting down.
    terminating: bool = False


@dataclass(frozen=True)
class RolloutStep:
    """The next step of the restart and why."""

    action: RolloutAction
    reason: str
    #: The pod to evict (``evict``), else None.
    pod: str | None = None
    #: Replicas to scale the workload to (``surge``, ``scale_back``, the last ``evict`` of a surge).
    scale_to: int | None = None
    #: Pods still to restart, in order (oldest first).
    order: tuple[str, ...] = ()
    #: The model serves nothing while this step's pod restarts (one replica, no room to surge).
    downtime: bool = False

    @property
    def remaining(self) -> int:
        return len(self.order)


def _utc(moment: datetime, name: str) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise MaintenanceInputError(
            name, "is a naive datetime", "pass aware datetimes (creationTimestamp is UTC)"
        )
    return moment.astimezone(UTC)


def plan_rollout(
    pods: Sequence[PodState],
    started_at: datetime,
    *,
    replicas: int,
    room_for_surge: bool,
    workload_replicas: int | None = None,
) -> RolloutStep:
    """The next step of restarting the pods created before ``started_at`` (``status.maintenance
    .startedAt``), oldest first, one at a time.

    ``replicas``: the model's desired replicas. ``room_for_surge``: whether the cluster has free GPUs
    for one more pod of the plan (asked only while no surge pod exists: once the surge pod runs, it
    holds that room itself). With room, every model surges one pod first; a restart that surged goes
    on surging (more pods alive than ``replicas``, or ``workload_replicas``, the workload's own count,
    above it while an evicted pod's replacement is being created) whatever the room says later.
    """
    # creationTimestamp has whole seconds: a pod created in the restart's own second is a new one (the
    # surge pod is created within milliseconds of the start), so the start is compared at that precision.
    start = _utc(started_at, "started_at").replace(microsecond=0)
    alive = [p for p in pods if not p.terminating]
    old = sorted(
        (p for p in alive if _utc(p.created, f"{p.name}.created") < start), key=lambda p: (p.created, p.name)
    )
    new = [p for p in alive if p.created.astimezone(UTC) >= start]
    order = tuple(p.name for p in old)
    leaving = sorted(p.name for p in pods if p.terminating)

    if not old:
        if replicas >= 1 and len(alive) > replicas and all(p.ready for p in alive):
            return RolloutStep(
                "scale_back",
                f"every pod is restarted; back to {replicas} replica{'s' if replicas != 1 else ''}",
                scale_to=replicas,
            )
        return RolloutStep("done", f"all {len(alive)} pods are newer than the restart")
    if leaving:
        return RolloutStep(
            "wait", f"{', '.join(leaving)} still shutting down; one pod at a time", order=order
        )

    victim = old[0]
    surging = max(len(alive), workload_replicas or 0) > replicas >= 1
    if surging or (room_for_surge and replicas >= 1 and not new):
        return _surge_step(victim, old, alive, replicas, order, surged=(workload_replicas or 0) > replicas)
    if replicas == 1:
        return RolloutStep(
            "evict",
            f"one replica and no free GPU capacity for a surge pod: evicting {victim.name}; the model "
            "serves nothing until its replacement is Ready",
            pod=victim.name,
            order=order,
            downtime=True,
        )

    unready = sorted(p.name for p in alive if p is not victim and not p.ready)
    if unready:
        return RolloutStep("wait", f"{', '.join(unready)} not Ready yet; one pod at a time", order=order)
    return RolloutStep(
        "evict",
        f"evicting {victim.name}, the oldest of {len(old)} pod{'s' if len(old) != 1 else ''} to restart",
        pod=victim.name,
        order=order,
    )


def _surge_step(
    victim: PodState,
    old: Sequence[PodState],
    alive: Sequence[PodState],
    replicas: int,
    order: tuple[str, ...],
    *,
    surged: bool,
) -> RolloutStep:
    """The restart with one pod more than the model's replicas: the model serves with all its replicas
    throughout. First the extra pod; then, each time every other pod is Ready, the oldest old pod goes
    (the workload replaces it, keeping the extra one); the last old pod goes with the workload back at
    ``replicas``. ``surged``: the workload already asks for the extra pod."""
    plural = "s" if replicas != 1 else ""
    if len(alive) <= replicas and surged:
        return RolloutStep("wait", "the workload is creating the evicted pod's replacement", order=order)
    if len(alive) <= replicas:
        return RolloutStep(
            "surge",
            f"{replicas} replica{plural} and free GPUs for one more: starting pod {replicas + 1} before "
            f"{victim.name} goes, so the model keeps serving with all {replicas}",
            scale_to=replicas + 1,
            order=order,
        )
    starting = sorted(p.name for p in alive if p is not victim and not p.ready)
    if starting:
        return RolloutStep("wait", f"{', '.join(starting)} not Ready yet; one pod at a time", order=order)
    last = len(old) == 1
    return RolloutStep(
        "evict",
        f"every other pod is Ready: evicting {victim.name}"
        + (f" and returning to {replicas} replica{plural}" if last else f", {len(old) - 1} more to go"),
        pod=victim.name,
        scale_to=replicas if last else None,
        order=order,
    )
