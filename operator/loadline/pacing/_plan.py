"""The pacing decision (see the package's docstring)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["PacingLimits", "PacingPlan", "RollOutRequest", "Waiting", "plan_pacing"]


@dataclass(frozen=True)
class PacingLimits:
    """How many roll-outs may run at once: ``at_once`` fleet-wide, ``per_pool`` in one GPU pool
    (0: no limit)."""

    at_once: int = 0
    per_pool: int = 0

    def __post_init__(self) -> None:
        if self.at_once < 0 or self.per_pool < 0:
            raise ValueError("pacing limits are counts of roll-outs: 0 (no limit) or more")

    @property
    def paced(self) -> bool:
        return bool(self.at_once or self.per_pool)


@dataclass(frozen=True)
class RollOutRequest:
    """A model whose fix is to roll out."""

    #: ``namespace/name``.
    key: str
    #: The GPU pool its pods go to (the plan's GPU type): a pool's nodes, scheduler and drivers are
    #: shared by its models, so one pool's storm is not let to take every slot.
    pool: str
    #: ``spec.priority``: higher first.
    priority: int = 0
    #: What it serves (replicas × concurrency): among equal priorities, the larger first.
    serves: int = 1
    #: When it asked (any clock, the same for all): among equals, the earlier first.
    since: float = 0.0


@dataclass(frozen=True)
class Waiting:
    """A roll-out left waiting: how many go before it and why."""

    key: str
    ahead: int
    reason: str


@dataclass(frozen=True)
class PacingPlan:
    """Which waiting roll-outs start now, and why each other one waits."""

    start: tuple[RollOutRequest, ...]
    waiting: tuple[Waiting, ...]


def _count(running: int) -> str:
    return f"{running} roll-out{'s' if running != 1 else ''} run{'s' if running == 1 else ''}"


def _order(request: RollOutRequest) -> tuple[int, int, float, str]:
    return (-request.priority, -request.serves, request.since, request.key)


def plan_pacing(
    running: Mapping[str, str], queued: Sequence[RollOutRequest], limits: PacingLimits
) -> PacingPlan:
    """The roll-outs of ``queued`` that start now beside ``running`` (key → pool), in order
    (priority, what they serve, when they asked), as long as the fleet-wide and the pool's limits
    allow; the rest wait, each told the roll-outs ahead of it (running ones included) and its limit.
    A request that cannot start does not hold back a later one of another pool that can: slots of a
    pool with room are not left idle behind a full pool."""
    fleet = len(running)
    pools = Counter(running.values())
    start: list[RollOutRequest] = []
    waiting: list[Waiting] = []
    waiting_in_pool: Counter[str] = Counter()
    for request in sorted({r.key: r for r in queued if r.key not in running}.values(), key=_order):
        full_fleet = bool(limits.at_once) and fleet >= limits.at_once
        full_pool = bool(limits.per_pool) and pools[request.pool] >= limits.per_pool
        if not (full_fleet or full_pool):
            start.append(request)
            fleet += 1
            pools[request.pool] += 1
            continue
        if full_pool:
            ahead = pools[request.pool] + waiting_in_pool[request.pool]
            reason = (
                f"{_count(pools[request.pool])} on {request.pool} GPUs "
                f"(at most {limits.per_pool} at once per GPU pool)"
            )
        else:
            ahead = fleet + len(waiting)
            reason = f"{_count(fleet)} fleet-wide (at most {limits.at_once} at once)"
        waiting.append(Waiting(request.key, ahead, reason))
        waiting_in_pool[request.pool] += 1
    return PacingPlan(tuple(start), tuple(waiting))
