"""The fleet-wide restart lock: which governing FleetPolicies limit concurrent restarts, and who holds
their slots. Like kured's lock, it lives in the API: a model holds a slot of every policy governing it
while its ``status.maintenance.state`` is Running, so the lock survives operator restarts.

That alone is enough for one deciding process (the elected leader takes slots under a lock of its
own). Sharded replicas decide at the same time, each from a view of the other shards' models that is
seconds old, so two of them could take the last slot together. Between shards a start is therefore
also *claimed* in one shared table (:class:`SlotClaim` per model, kept in a Lease's annotation and
written guarded by its resourceVersion, so of two replicas deciding at once exactly one write lands):
a claim holds its policies' slots from the moment it is written until the model's Running status is
in every replica's view; after :data:`SLOT_CLAIM_GRACE` the status alone counts again, so a claim whose
model finished, was deleted or never got to Running frees its slots without anyone cleaning up.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from loadline.api import FleetPolicy
from loadline.election import format_micro_time, parse_micro_time
from loadline.maintenance._model import MaintenanceRecord, RestartLock

__all__ = [
    "SLOT_CLAIM_GRACE",
    "SlotClaim",
    "claim_holders",
    "format_slot_claims",
    "holds_restart_slot",
    "parse_slot_claims",
    "restart_locks",
    "standing_claims",
]

#: How long a claim holds its slots by itself: far longer than a replica takes to write the model's
#: Running status after claiming and for the other replicas' view of it (a LIST reused for seconds) to
#: show it; short enough that an abandoned claim does not keep a slot through a restart window.
SLOT_CLAIM_GRACE = timedelta(seconds=60)


@dataclass(frozen=True)
class SlotClaim:
    """A model's claim on the restart slots of ``policies`` (FleetPolicy names), made ``at``."""

    policies: tuple[str, ...]
    at: datetime


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


def parse_slot_claims(text: str | None) -> dict[str, SlotClaim]:
    """The claims in a table as :func:`format_slot_claims` wrote it (``namespace/name`` → claim).

    An entry that cannot be read is left out: it can only be garbage (nothing else writes the table),
    and a claim left out frees its slots at worst one grace period early."""
    try:
        raw = json.loads(text or "{}")
    except ValueError:
        return {}
    claims: dict[str, SlotClaim] = {}
    for model, entry in raw.items() if isinstance(raw, dict) else ():
        if not isinstance(entry, dict):
            continue
        at = parse_micro_time(entry.get("at") if isinstance(entry.get("at"), str) else None)
        policies = entry.get("policies")
        if at is not None and isinstance(policies, list) and all(isinstance(p, str) for p in policies):
            claims[str(model)] = SlotClaim(tuple(policies), at)
    return claims


def format_slot_claims(claims: Mapping[str, SlotClaim]) -> str:
    """The table as written to the Lease: compact JSON, in a stable order."""
    return json.dumps(
        {
            model: {"policies": list(claim.policies), "at": format_micro_time(claim.at)}
            for model, claim in sorted(claims.items())
        },
        separators=(",", ":"),
    )


def standing_claims(
    claims: Mapping[str, SlotClaim],
    restarting: Collection[str],
    now: datetime,
    grace: timedelta = SLOT_CLAIM_GRACE,
) -> dict[str, SlotClaim]:
    """The claims that still hold their slots: made within ``grace`` of ``now``, or whose model
    restarts now (``restarting``: ``namespace/name`` of the models whose status says Running, over
    every shard). A claim dated in the future (a replica whose clock runs ahead) counts as fresh."""
    return {model: claim for model, claim in claims.items() if model in restarting or now - claim.at < grace}


def claim_holders(claims: Mapping[str, SlotClaim]) -> dict[str, frozenset[str]]:
    """For each policy, the models whose claims hold its slots."""
    holders: dict[str, set[str]] = {}
    for model, claim in claims.items():
        for policy in claim.policies:
            holders.setdefault(policy, set()).add(model)
    return {policy: frozenset(models) for policy, models in holders.items()}
