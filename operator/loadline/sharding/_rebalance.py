"""Giving shards back when a replica returns: which shard a replica short of its share asks for, and
which shards a replica holding more than its share hands over.

Without this, a survivor that took a dead replica's shards keeps them after the replica (or its
replacement) comes back: the newcomer finds every Lease held and stands by, and one process reconciles
every model for as long as it lives. The protocol runs on the shard Leases themselves, so it needs no
other object and no other RBAC than the Leases': a replica short of its fair share writes its identity
and the time on a Lease held by a replica over its share (:data:`WANTED_BY_ANNOTATION`,
:data:`WANTED_AT_ANNOTATION`); the holder reads it on its next renewal, stops reconciling that shard and
releases the Lease (empty holder), which the asker then claims as any free shard within its share.

A request counts for one Lease duration: a requester that died meanwhile stops counting, and a holder
hands over only while it is over its share, so shards never bounce between replicas at their share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from loadline.sharding._ranges import fair_share

WANTED_BY_ANNOTATION = "loadline.dev/shard-wanted-by"
"""On a shard Lease: the identity of a replica short of its share that asks for this shard."""

WANTED_AT_ANNOTATION = "loadline.dev/shard-wanted-at"
"""On a shard Lease: when it asked (RFC 3339 with microseconds, as the Lease's own times)."""


@dataclass(frozen=True)
class ShardRequest:
    """A request found on a held shard's Lease: who asks, and how long ago (seconds, by the reader's
    clock against the written time)."""

    requester: str
    age_seconds: float


def plan_request(
    shards: int, held: set[int] | frozenset[int], holders: Mapping[int, str], *, replicas: int
) -> int | None:
    """The shard this replica asks for, or None.

    Only when it holds fewer than its fair share and no shard is free (free ones are claimed instead);
    from the holder that holds the most, over its share (the highest index of its shards, so that
    ``holders`` read in any order give the same answer). ``holders``: every shard not held by this
    replica, with its holder's identity (``""``: free)."""
    share = fair_share(shards, replicas)
    if len(held) >= share or any(not holder for holder in holders.values()):
        return None
    counts: dict[str, int] = {}
    for holder in holders.values():
        counts[holder] = counts.get(holder, 0) + 1
    over = {holder: count for holder, count in counts.items() if count > share}
    if not over:
        return None
    richest = max(sorted(over), key=lambda holder: over[holder])
    return max(index for index, holder in holders.items() if holder == richest)


def plan_hand_over(
    shards: int,
    held: set[int] | frozenset[int],
    requests: Mapping[int, ShardRequest],
    *,
    replicas: int,
    identity: str,
    lease_duration_seconds: float,
) -> list[int]:
    """Which held shards to hand over: those asked for by another replica within a Lease duration,
    highest index first, while this replica holds more than its fair share."""
    share = fair_share(shards, replicas)
    surplus = len(held) - share
    out: list[int] = []
    for index in sorted(requests, reverse=True):
        request = requests[index]
        if surplus <= 0:
            break
        if index not in held or request.requester == identity:
            continue
        if not 0 <= request.age_seconds <= lease_duration_seconds:
            continue
        out.append(index)
        surplus -= 1
    return out
