"""Hash ranges, the API server's selector text, ownership of a uid, and which free shards to claim."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

HASH_SPACE = 1 << 64
"""FNV-1a 64-bit: the API server hashes ``metadata.uid`` into ``[0, 2**64)``
(k8s.io/apimachinery/pkg/sharding, ``HashField``)."""

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_UID_FIELD = "object.metadata.uid"


def uid_hash(uid: str) -> int:
    """The API server's hash of a uid: FNV-1a 64 over its UTF-8 bytes."""
    value = _FNV_OFFSET
    for byte in uid.encode():
        value = ((value ^ byte) * _FNV_PRIME) % HASH_SPACE
    return value


def _check(index: int, shards: int) -> None:
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    if not 0 <= index < shards:
        raise ValueError(f"shard {index} is not one of 0..{shards - 1}")


def shard_range(index: int, shards: int) -> tuple[int, int]:
    """``[start, end)`` of shard ``index`` of ``shards`` equal ranges (the last one ends at 2**64)."""
    _check(index, shards)
    return index * HASH_SPACE // shards, (index + 1) * HASH_SPACE // shards


def _hex(value: int) -> str:
    # The API server compares these as strings of equal length: 16 lowercase digits, or the 17 of 2**64
    # (apimachinery's HexLess); an unpadded '0x0' would compare wrongly.
    return f"0x{value:016x}"


def selector(indices: Iterable[int], shards: int) -> str:
    """The ``shardSelector`` the API server filters by: the union of the shards' ranges, adjacent
    ranges merged (``shardRange(object.metadata.uid, '0x…', '0x…') || …``). Empty for no shards."""
    ranges = sorted(shard_range(i, shards) for i in set(indices))
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return " || ".join(f"shardRange({_UID_FIELD}, '{_hex(s)}', '{_hex(e)}')" for s, e in merged)


def shard_of(uid: str, shards: int) -> int:
    """The shard whose range holds the uid's hash."""
    _check(0, shards)
    return uid_hash(uid) * shards // HASH_SPACE


def owns(uid: str, indices: Iterable[int], shards: int) -> bool:
    """Whether a replica holding ``indices`` owns the object with this uid. ``shards`` 1 owns all."""
    return shards == 1 or shard_of(uid, shards) in set(indices)


SHARD_LEASE_LABEL = "loadline.dev/shards"
"""On every shard Lease: how many shards its split has (as its name does). A replica watches the
Leases of its split by this label instead of reading those it does not hold every retry period."""


def lease_selector(shards: int) -> str:
    """The label selector of one split's shard Leases."""
    return f"{SHARD_LEASE_LABEL}={shards}"


def lease_name(base: str, index: int, shards: int) -> str:
    """The Lease of one shard: ``loadline-shard-0-of-2``. The count is in the name so that replicas of
    another split (mid-upgrade) never share a Lease that means another range."""
    _check(index, shards)
    return f"{base}-shard-{index}-of-{shards}"


def fair_share(shards: int, replicas: int) -> int:
    """Shards one replica claims while others may still come: ``ceil(shards / replicas)``."""
    return math.ceil(shards / max(replicas, 1))


@dataclass(frozen=True)
class ShardClaim:
    """One free shard this replica should claim now, and why (logged)."""

    index: int
    why: str


def plan_claims(
    shards: int,
    held: Iterable[int],
    free_since: Mapping[int, float],
    now: float,
    *,
    replicas: int,
    grace_seconds: float,
) -> list[ShardClaim]:
    """Which free shards (not held, or held by a replica whose Lease expired or was released) to claim.

    Up to the fair share first, lowest index first, so that replicas starting together split the
    shards; a shard left free for ``grace_seconds`` (a Lease duration: every living replica has read it
    free by then) is claimed beyond the fair share, so a dead replica's shards are taken over even when
    the survivors already hold their share. ``free_since``: when this replica first saw each free shard
    free (monotonic seconds)."""
    held_set = set(held)
    share = fair_share(shards, replicas)
    room = share - len(held_set)
    claims: list[ShardClaim] = []
    for index in sorted(free_since):
        if index in held_set:
            continue
        if room > 0:
            claims.append(ShardClaim(index, f"free, and this replica holds fewer than {share}"))
            room -= 1
        elif now - free_since[index] >= grace_seconds:
            waited = now - free_since[index]
            claims.append(ShardClaim(index, f"free for {waited:.0f} s: no other replica took it"))
    return claims
