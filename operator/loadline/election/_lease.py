"""What a replica does with the leader-election Lease it just read: create, take over, renew or wait.

Pure: no API calls and no clock of its own. The caller reads the Lease, passes what it read and the
current time, writes the record this module returns (guarded by the resourceVersion it read, so that of
two replicas deciding at once only one write lands) and calls again after the retry period. Keeping the
decision here, away from the API glue, is what lets every branch and clock edge be tested in
microseconds.

The rules are those of client-go's ``leaderelection`` package (which controller-runtime uses), so a
loadline Lease reads the same to ``kubectl get lease`` and to any tool that understands those:

* an empty ``holderIdentity`` means nobody holds the Lease (a leader that shuts down gracefully writes
  it), so it is taken at once;
* otherwise the Lease is held until ``renewTime + leaseDurationSeconds``; from that instant on
  (inclusive) it is expired and anyone may take it;
* the holder renews by moving ``renewTime``; ``acquireTime`` and ``leaseTransitions`` change only when
  the holder changes, and every change of holder counts one transition.

Timestamps are RFC 3339 ``MicroTime`` strings, as the API server stores them
(``2026-11-23T10:00:00.000000Z``). A timestamp that cannot be read gives no evidence that the holder
is alive, so the Lease counts as expired rather than blocking every replica forever.

Clocks: comparing another replica's ``renewTime`` with our own clock assumes the nodes' clocks agree to
within a few seconds (NTP), as every Lease-based election does. A holder whose clock runs *ahead*
would write ``renewTime`` values in our future; those count as "now" (never as more than one lease
duration of credit), and a caller that passes ``unchanged_for`` (how long it has watched the very
same record without a renewal) sees such a Lease expire after one lease duration of its own clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
"""``metav1.MicroTime`` on the wire: UTC, always six fraction digits (the API server rejects fewer)."""

Reason = Literal["absent", "ours", "released", "expired", "held"]
"""Why a decision was taken: no Lease yet, we hold it, its holder released it, it expired, or it is
held by another replica."""


def format_micro_time(moment: datetime) -> str:
    """``moment`` as the API server writes a ``MicroTime`` (``2026-11-23T10:00:00.000000Z``).

    ``moment`` must carry a time zone: a naive datetime is ambiguous across replicas, and an election
    between replicas whose clocks mean different things would be no election at all."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment!r}: pass an aware one (datetime.now(UTC))")
    return moment.astimezone(UTC).strftime(MICRO_TIME_FORMAT)


def parse_micro_time(text: str | None) -> datetime | None:
    """The instant an RFC 3339 timestamp names (UTC), or None when it is absent or unreadable.

    Lenient about the fraction (any number of digits, or none) and about the offset spelling (``Z`` or
    ``+02:00``), because other clients write Leases too; strict about the offset being there, because a
    time without one does not name an instant."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        return None
    return parsed.astimezone(UTC)


@dataclass(frozen=True)
class LeaseRecord:
    """The election fields of a Lease's spec, as read from (or to be written to) the API server.

    ``holder_identity`` is ``""`` when nobody holds the Lease. Timestamps are kept as the strings that
    were read, so that a garbage value can be seen (and treated as expired) rather than rejected on
    the way in."""

    holder_identity: str = ""
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_duration_seconds: int | None = None
    lease_transitions: int = 0


class LeaseAction(enum.StrEnum):
    """What the caller must do with the Lease."""

    CREATE = "create"
    """No Lease exists: create it with :attr:`LeaseDecision.write` (a 409 means another replica did)."""
    TAKE_OVER = "take-over"
    """Another replica held it, but released it or let it expire: replace it with ``write``."""
    RENEW = "renew"
    """We hold it: replace it with ``write`` (a fresh ``renewTime``)."""
    WAIT = "wait"
    """Another replica holds an unexpired Lease: write nothing, read again after the retry period."""


@dataclass(frozen=True)
class LeaseDecision:
    """The outcome of :func:`plan_lease`.

    ``holder`` is the holder as read (``""``: none), for logs. ``write`` is the record to write, None
    when waiting. ``wait_seconds`` is, when waiting, how long until the Lease expires if its holder
    does not renew it (never more than one lease duration); 0 otherwise."""

    action: LeaseAction
    reason: Reason
    holder: str
    write: LeaseRecord | None = None
    wait_seconds: float = 0.0

    @property
    def acquires(self) -> bool:
        """Whether writing ``write`` makes us the holder (every action but waiting)."""
        return self.action is not LeaseAction.WAIT


def _positive(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None


def seconds_until_expiry(
    record: LeaseRecord, now: datetime, default_duration_seconds: int, *, unchanged_for: float | None = None
) -> float:
    """Seconds until ``record`` expires (``<= 0``: it has expired), as seen at ``now``.

    The duration is the record's own ``leaseDurationSeconds`` (what its holder promised to renew
    within), else ``default_duration_seconds``. A missing or unreadable ``renewTime`` has expired. A
    ``renewTime`` in the future (the holder's clock runs ahead) counts as ``now``. With
    ``unchanged_for`` (seconds the caller has watched this same record, by its own monotonic clock),
    the record also expires once it has gone unrenewed for the lease duration, whatever it says."""
    duration = float(_positive(record.lease_duration_seconds) or default_duration_seconds)
    renewed = parse_micro_time(record.renew_time)
    if renewed is None:
        return 0.0
    current = now.astimezone(UTC)
    renewed = min(renewed, current)
    remaining = (renewed + timedelta(seconds=duration) - current).total_seconds()
    if unchanged_for is not None:
        remaining = min(remaining, duration - unchanged_for)
    return remaining


def plan_lease(
    record: LeaseRecord | None,
    identity: str,
    now: datetime,
    duration_seconds: int,
    *,
    unchanged_for: float | None = None,
) -> LeaseDecision:
    """Decide what replica ``identity`` does with the Lease it read (``record``; None: no Lease).

    ``duration_seconds`` is the lease duration we write (and assume for a record that has none).
    ``unchanged_for``: see :func:`seconds_until_expiry`. The returned ``write`` always names
    ``identity`` as holder with ``renewTime = now``; ``acquireTime`` and ``leaseTransitions`` are kept
    on a renewal and moved on a change of holder, as client-go does.

    A record that names us is ours to renew even if it has expired: nobody else took it in between (the
    write is guarded by resourceVersion), and identities are unique per replica, so the record can only
    be from this replica or its previous run in the same pod."""
    if not identity:
        raise ValueError("identity must not be empty: an empty holderIdentity means 'released'")
    if duration_seconds < 1:
        raise ValueError(f"duration_seconds must be at least 1, not {duration_seconds}")
    stamp = format_micro_time(now)
    if record is None:
        fresh = LeaseRecord(identity, stamp, stamp, duration_seconds, 0)
        return LeaseDecision(LeaseAction.CREATE, "absent", "", fresh)
    holder = record.holder_identity
    transitions = max(record.lease_transitions, 0)
    if holder == identity:
        acquired = record.acquire_time if parse_micro_time(record.acquire_time) else stamp
        renewed = LeaseRecord(identity, acquired, stamp, duration_seconds, transitions)
        return LeaseDecision(LeaseAction.RENEW, "ours", holder, renewed)
    taken = LeaseRecord(identity, stamp, stamp, duration_seconds, transitions + 1)
    if not holder:
        return LeaseDecision(LeaseAction.TAKE_OVER, "released", holder, taken)
    remaining = seconds_until_expiry(record, now, duration_seconds, unchanged_for=unchanged_for)
    if remaining > 0:
        return LeaseDecision(LeaseAction.WAIT, "held", holder, None, remaining)
    return LeaseDecision(LeaseAction.TAKE_OVER, "expired", holder, taken)


def release_record(record: LeaseRecord | None, identity: str, now: datetime) -> LeaseRecord | None:
    """The record a leader writes when it stops on purpose, or None when ``identity`` does not hold it.

    An empty ``holderIdentity`` hands the Lease over at once: the standby takes it on its next read
    instead of waiting out the lease duration. As client-go does, ``leaseDurationSeconds`` drops to 1
    and both times move to ``now``, so a client that ignored the empty holder would still see it expire
    within a second; ``leaseTransitions`` is left for the next holder to count."""
    if record is None or not identity or record.holder_identity != identity:
        return None
    stamp = format_micro_time(now)
    return LeaseRecord("", stamp, stamp, 1, max(record.lease_transitions, 0))
