"""loadline.election: the Lease decisions, pure (no API server, no real clock)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pytest

import loadline.election as election
from loadline.election import (
    LeaseAction,
    LeaseDecision,
    LeaseRecord,
    format_micro_time,
    parse_micro_time,
    plan_lease,
    release_record,
    seconds_until_expiry,
)

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
STAMP = "2026-11-23T10:00:00.000000Z"
ME = "loadline-7c9f-abcde"
OTHER = "loadline-7c9f-fghij"


def at(seconds: float) -> str:
    """The MicroTime ``seconds`` after NOW (negative: before)."""
    return format_micro_time(NOW + timedelta(seconds=seconds))


def held_by(
    holder: str, renewed: str | None, *, duration: int | None = 15, transitions: int = 3
) -> LeaseRecord:
    return LeaseRecord(holder, at(-100), renewed, duration, transitions)


# -- timestamps --------------------------------------------------------------------------------------


def test_format_is_micro_time_with_six_digits_and_z() -> None:
    assert format_micro_time(NOW) == STAMP
    assert format_micro_time(NOW + timedelta(microseconds=5)) == "2026-11-23T10:00:00.000005Z"
    plus_two = timezone(timedelta(hours=2))
    assert format_micro_time(datetime(2026, 11, 23, 12, 0, tzinfo=plus_two)) == STAMP


def test_format_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="naive"):
        format_micro_time(datetime(2026, 11, 23, 10, 0))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (STAMP, NOW),
        ("2026-11-23T10:00:00Z", NOW),  # no fraction
        ("2026-11-23T12:00:00.000+02:00", NOW),  # offset, 3 digits
        ("2026-11-23T10:00:00.1234567Z", NOW + timedelta(microseconds=123456)),  # nanoseconds
    ],
)
def test_parse_reads_rfc3339_spellings(text: str, expected: datetime) -> None:
    parsed = parse_micro_time(text)
    assert parsed == expected
    assert parsed is not None and parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text", [None, "", "garbage", "2026-13-01T00:00:00Z", "2026-11-23T10:00:00", "2026-11-23"]
)
def test_parse_returns_none_for_absent_garbage_or_zoneless(text: str | None) -> None:
    assert parse_micro_time(text) is None


def test_format_parse_round_trip() -> None:
    moment = NOW + timedelta(seconds=1.25)
    assert parse_micro_time(format_micro_time(moment)) == moment


# -- the four actions ---------------------------------------------------------------------------------


def test_absent_lease_is_created_with_zero_transitions() -> None:
    decision = plan_lease(None, ME, NOW, 15)
    assert decision == LeaseDecision(LeaseAction.CREATE, "absent", "", LeaseRecord(ME, STAMP, STAMP, 15, 0))
    assert decision.acquires and decision.wait_seconds == 0


def test_our_lease_is_renewed_keeping_acquire_time_and_transitions() -> None:
    record = held_by(ME, at(-2), duration=30, transitions=4)
    decision = plan_lease(record, ME, NOW, 15)
    assert decision.action is LeaseAction.RENEW and decision.reason == "ours"
    assert decision.write == LeaseRecord(ME, at(-100), STAMP, 15, 4)  # our duration is written


def test_our_lease_is_renewed_even_when_expired() -> None:
    """Nobody took it in between (writes are resourceVersion-guarded): still ours, no transition."""
    decision = plan_lease(held_by(ME, at(-3600)), ME, NOW, 15)
    assert decision.action is LeaseAction.RENEW
    assert decision.write is not None and decision.write.lease_transitions == 3


@pytest.mark.parametrize("acquired", [None, "garbage"])
def test_renewal_repairs_an_unreadable_acquire_time(acquired: str | None) -> None:
    record = LeaseRecord(ME, acquired, at(-2), 15, 1)
    decision = plan_lease(record, ME, NOW, 15)
    assert decision.write == LeaseRecord(ME, STAMP, STAMP, 15, 1)


def test_lease_held_by_another_replica_means_wait_until_it_expires() -> None:
    decision = plan_lease(held_by(OTHER, at(-5)), ME, NOW, 15)
    assert decision.action is LeaseAction.WAIT and decision.reason == "held"
    assert decision.holder == OTHER and decision.write is None and not decision.acquires
    assert decision.wait_seconds == pytest.approx(10)


def test_expired_lease_is_taken_over_and_counts_a_transition() -> None:
    decision = plan_lease(held_by(OTHER, at(-16)), ME, NOW, 15)
    assert decision.action is LeaseAction.TAKE_OVER and decision.reason == "expired"
    assert decision.holder == OTHER
    assert decision.write == LeaseRecord(ME, STAMP, STAMP, 15, 4)


def test_released_lease_is_taken_at_once_however_fresh() -> None:
    record = LeaseRecord("", at(0), at(0), 15, 3)  # released this very instant
    decision = plan_lease(record, ME, NOW, 15)
    assert decision.action is LeaseAction.TAKE_OVER and decision.reason == "released"
    assert decision.write == LeaseRecord(ME, STAMP, STAMP, 15, 4)


# -- clock edges -------------------------------------------------------------------------------------


def test_renew_time_exactly_at_expiry_is_expired() -> None:
    """Valid while now < renewTime + duration (client-go's rule): at the instant itself it is taken."""
    assert plan_lease(held_by(OTHER, at(-15)), ME, NOW, 15).action is LeaseAction.TAKE_OVER


def test_one_microsecond_before_expiry_still_waits() -> None:
    record = held_by(OTHER, format_micro_time(NOW - timedelta(seconds=15) + timedelta(microseconds=1)))
    decision = plan_lease(record, ME, NOW, 15)
    assert decision.action is LeaseAction.WAIT
    assert decision.wait_seconds == pytest.approx(1e-6)


@pytest.mark.parametrize("renewed", [None, "", "garbage", "2026-11-23T10:00:00", "yesterday"])
def test_missing_or_unreadable_renew_time_counts_as_expired(renewed: str | None) -> None:
    decision = plan_lease(held_by(OTHER, renewed), ME, NOW, 15)
    assert decision.action is LeaseAction.TAKE_OVER and decision.reason == "expired"
    assert seconds_until_expiry(held_by(OTHER, renewed), NOW, 15) == 0


def test_the_records_own_duration_counts() -> None:
    record = held_by(OTHER, at(-20), duration=30)  # its holder promised to renew within 30 s
    decision = plan_lease(record, ME, NOW, 15)
    assert decision.action is LeaseAction.WAIT and decision.wait_seconds == pytest.approx(10)


@pytest.mark.parametrize("duration", [None, 0, -5])
def test_a_record_without_a_usable_duration_gets_ours(duration: int | None) -> None:
    assert plan_lease(held_by(OTHER, at(-10), duration=duration), ME, NOW, 15).action is LeaseAction.WAIT
    assert plan_lease(held_by(OTHER, at(-15), duration=duration), ME, NOW, 15).action is LeaseAction.TAKE_OVER


def test_a_renew_time_in_the_future_counts_as_now() -> None:
    """A holder whose clock runs ahead gets one lease duration of credit, not more."""
    decision = plan_lease(held_by(OTHER, at(3600)), ME, NOW, 15)
    assert decision.action is LeaseAction.WAIT and decision.wait_seconds == pytest.approx(15)


def test_a_record_unchanged_for_a_lease_duration_expires_whatever_it_says() -> None:
    future = held_by(OTHER, at(3600))
    assert plan_lease(future, ME, NOW, 15, unchanged_for=14.0).wait_seconds == pytest.approx(1)
    decision = plan_lease(future, ME, NOW, 15, unchanged_for=15.0)
    assert decision.action is LeaseAction.TAKE_OVER and decision.reason == "expired"


def test_unchanged_for_never_extends_a_lease() -> None:
    assert plan_lease(held_by(OTHER, at(-16)), ME, NOW, 15, unchanged_for=0.0).action is LeaseAction.TAKE_OVER


def test_now_in_another_zone_is_the_same_instant() -> None:
    later = (NOW + timedelta(seconds=15)).astimezone(timezone(timedelta(hours=-5)))
    assert plan_lease(held_by(OTHER, at(0)), ME, later, 15).action is LeaseAction.TAKE_OVER


# -- transitions and release --------------------------------------------------------------------------


def test_transitions_count_every_change_of_holder() -> None:
    created = plan_lease(None, "a", NOW, 15).write
    assert created is not None and created.lease_transitions == 0
    renewed = plan_lease(created, "a", NOW + timedelta(seconds=2), 15).write
    assert renewed is not None and renewed.lease_transitions == 0
    taken = plan_lease(renewed, "b", NOW + timedelta(seconds=30), 15).write  # a died
    assert taken is not None and taken.lease_transitions == 1 and taken.holder_identity == "b"
    released = release_record(taken, "b", NOW + timedelta(seconds=40))
    assert released is not None and released.lease_transitions == 1  # the next holder counts
    again = plan_lease(released, "a", NOW + timedelta(seconds=41), 15).write
    assert again is not None and again.lease_transitions == 2 and again.holder_identity == "a"
    assert again.acquire_time == format_micro_time(NOW + timedelta(seconds=41))


def test_negative_transitions_are_read_as_zero() -> None:
    decision = plan_lease(held_by(OTHER, at(-60), transitions=-7), ME, NOW, 15)
    assert decision.write is not None and decision.write.lease_transitions == 1


def test_release_writes_an_empty_holder_now() -> None:
    record = held_by(ME, at(-1), transitions=5)
    assert release_record(record, ME, NOW) == LeaseRecord("", STAMP, STAMP, 1, 5)


@pytest.mark.parametrize("record", [None, held_by(OTHER, at(-1)), LeaseRecord("", STAMP, STAMP, 1, 2)])
def test_nothing_to_release_unless_we_hold_it(record: LeaseRecord | None) -> None:
    assert release_record(record, ME, NOW) is None


# -- arguments and purity ------------------------------------------------------------------------------


def test_empty_identity_is_refused() -> None:
    """An empty holderIdentity means 'released': a replica named so could never be told apart."""
    with pytest.raises(ValueError, match="identity"):
        plan_lease(None, "", NOW, 15)


@pytest.mark.parametrize("duration", [0, -1])
def test_duration_must_be_positive(duration: int) -> None:
    with pytest.raises(ValueError, match="duration"):
        plan_lease(None, ME, NOW, duration)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        plan_lease(None, ME, datetime(2026, 11, 23, 10, 0), 15)


def test_public_api_is_exported() -> None:
    assert sorted(election.__all__) == sorted(
        name for name in vars(election) if not name.startswith("_") and name != "annotations"
    )


def test_the_package_imports_neither_kubernetes_nor_kopf() -> None:
    code = (
        "import sys, loadline.election; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'kopf', 'urllib3')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
