"""The restart planner (loadline.maintenance): when a model's pods restart, and in which order.

Windows come from the real window finder on synthetic traffic written in local wall-clock time ("quiet
from 03:00 to 05:00 Berlin time"), so the expected times follow from the traffic, not from constants
copied out of the code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from loadline.api import FleetPolicy, InferenceModelStatus
from loadline.maintenance import (
    LoadSlot,
    MaintenanceInputError,
    MaintenanceRecord,
    PodState,
    RestartLock,
    finish_maintenance,
    forecast_load,
    plan_maintenance,
    plan_rollout,
    record_from_status,
    record_to_status,
    restart_locks,
)
from loadline.policy import combine, restart_window_sets
from loadline.risk import RiskSignals, estimate_oom_risk
from loadline.windows import Window, parse_policy_windows, plan_windows

BERLIN = ZoneInfo("Europe/Berlin")
MODEL = "team-a/chat"
TWO_HOURS = timedelta(hours=2)


def traffic(
    start: date, days: int, load: Callable[[datetime], float], tz: ZoneInfo = BERLIN, step: int = 300
) -> list[tuple[float, float]]:
    t = datetime.combine(start, datetime.min.time(), tz).timestamp()
    end = datetime.combine(start + timedelta(days=days), datetime.min.time(), tz).timestamp()
    out = []
    while t < end:
        out.append((t, load(datetime.fromtimestamp(t, tz))))
        t += step
    return out


def quiet_between(
    *spans: tuple[float, float], low: float = 5.0, high: float = 100.0
) -> Callable[[datetime], float]:
    def load(at: datetime) -> float:
        h = at.hour + at.minute / 60
        return low if any(a <= h < b for a, b in spans) else high

    return load


def windows_before(now: datetime, load: Callable[[datetime], float], weeks: int = 3) -> tuple[Window, ...]:
    """The learned 2-hour windows from ``weeks`` of history ending at ``now``'s local midnight."""
    local = now.astimezone(BERLIN)
    samples = traffic(local.date() - timedelta(days=7 * weeks), 7 * weeks, load)
    return plan_windows(samples, TWO_HOURS, BERLIN, None, now=now).windows


def window(start: datetime, length: timedelta = TWO_HOURS, source: str = "learned") -> Window:
    return Window(start=start, end=start + length, expected_load=0.1, source=source)  # type: ignore[arg-type]


def test_a_restart_waits_for_the_next_learned_window() -> None:
    now = datetime(2026, 11, 17, 14, 0, tzinfo=BERLIN)  # Tuesday afternoon
    windows = windows_before(now, quiet_between((3, 5)))
    decision = plan_maintenance(
        model=MODEL, now=now, action="restart", windows=windows, duration=TWO_HOURS, timezone=BERLIN
    )
    assert decision.kind == "schedule"
    assert decision.at == windows[0].start
    local = decision.at.astimezone(BERLIN) if decision.at else None
    assert local is not None and (local.date(), local.hour) == (date(2026, 11, 18), 3)
    record = decision.record
    assert (record.state, record.action, record.trigger) == ("Scheduled", "restart", "window")
    assert record.window_start == windows[0].start and record.window_end == windows[0].end
    assert "learned low-traffic window" in decision.reason and "Wed 2026-11-18 03:00 CET" in decision.reason


def test_weekly_pattern_puts_the_restart_in_the_weekend_window() -> None:
    def load(at: datetime) -> float:
        quiet = (6, 8) if at.weekday() >= 5 else (3, 5)
        return quiet_between(quiet)(at)

    now = datetime(2026, 11, 20, 12, 0, tzinfo=BERLIN)  # Friday noon: Friday's 03:00 is gone
    windows = windows_before(now, load, weeks=4)
    decision = plan_maintenance(
        model=MODEL, now=now, action="restart", windows=windows, duration=TWO_HOURS, timezone=BERLIN
    )
    assert decision.at is not None
    local = decision.at.astimezone(BERLIN)
    assert (local.weekday(), local.hour) == (5, 6)


@pytest.mark.parametrize(
    ("now", "offset_after"),
    [
        (datetime(2026, 10, 24, 12, 0, tzinfo=BERLIN), timedelta(hours=1)),  # autumn: CEST -> CET
        (datetime(2027, 3, 27, 12, 0, tzinfo=BERLIN), timedelta(hours=2)),  # spring: CET -> CEST
    ],
)
def test_dst_change_keeps_the_wall_clock_window(now: datetime, offset_after: timedelta) -> None:
    windows = windows_before(now, quiet_between((3, 5)))
    decision = plan_maintenance(
        model=MODEL, now=now, action="restart", windows=windows, duration=TWO_HOURS, timezone=BERLIN
    )
    assert decision.at is not None
    local = decision.at.astimezone(BERLIN)
    assert local.date() == now.date() + timedelta(days=1) and local.hour == 3
    assert local.utcoffset() == offset_after
    # Stored in UTC, the hour moves with the offset; read back it is the same instant.
    assert decision.record.scheduled_at == datetime(local.year, local.month, local.day, 3, tzinfo=BERLIN)
    assert decision.record.scheduled_at is not None and decision.record.scheduled_at.tzinfo is UTC


def test_cool_down_across_the_autumn_change_counts_real_hours() -> None:
    # Last restart 01:30 CEST on the change night; two real hours later it is 02:30 CET (the second
    # 02:30), not 03:30 as wall-clock arithmetic on Berlin times would say.
    last = datetime(2026, 10, 25, 1, 30, tzinfo=BERLIN)
    end = last.astimezone(UTC) + timedelta(hours=2)
    for now, cooling in ((end - timedelta(minutes=15), True), (end + timedelta(minutes=15), False)):
        assert now.astimezone(BERLIN).hour == 2
        decision = plan_maintenance(
            model=MODEL,
            now=now.astimezone(BERLIN),
            action="restart",
            windows=(),
            duration=TWO_HOURS,
            last_restart=last,
            cooldown=timedelta(hours=2),
            crash_looping=True,
            timezone=BERLIN,
        )
        assert (decision.kind == "cooldown") is cooling
        assert decision.at == (end if cooling else now)


def test_policy_windows_hold_back_a_learned_window_outside_them() -> None:
    now = datetime(2026, 11, 17, 14, 0, tzinfo=BERLIN)  # Tuesday
    learned = windows_before(now, quiet_between((3, 5)))
    weekend = parse_policy_windows([{"days": ["Sat", "Sun"], "start": "01:00", "end": "06:00"}])
    decision = plan_maintenance(
        model=MODEL,
        now=now,
        action="restart",
        windows=learned,
        duration=TWO_HOURS,
        policy_windows=[("weekends", weekend)],
        timezone=BERLIN,
    )
    assert decision.at is not None
    local = decision.at.astimezone(BERLIN)
    assert local.weekday() == 5 and local.hour == 3  # the learned 03:00, on the first allowed day


def test_two_policies_must_both_allow_the_restart() -> None:
    now = datetime(2026, 11, 17, 14, 0, tzinfo=BERLIN)
    learned = windows_before(now, quiet_between((3, 5)))  # 03:00-05:00 every day
    sets = [
        ("weekends", parse_policy_windows([{"days": ["Sat", "Sun"], "start": "01:00", "end": "06:00"}])),
        ("mornings", parse_policy_windows([{"start": "04:00", "end": "08:00"}])),
    ]
    decision = plan_maintenance(
        model=MODEL,
        now=now,
        action="restart",
        windows=learned,
        duration=TWO_HOURS,
        policy_windows=sets,
        timezone=BERLIN,
    )
    assert decision.at is not None
    local = decision.at.astimezone(BERLIN)
    # Only Saturday 04:00-06:00 is in both; the learned 03:00 is not, so the first allowed time is used.
    assert (local.weekday(), local.hour, local.minute) == (5, 4, 0)
    assert decision.record.trigger == "policyWindow"


def test_policy_sets_come_from_the_fleet_policies() -> None:
    policy = FleetPolicy.model_validate(
        {
            "metadata": {"name": "night"},
            "spec": {"restarts": {"windows": [{"start": "01:00", "end": "03:00"}], "maxConcurrent": 1}},
        }
    )
    now = datetime(2026, 11, 17, 14, 0, tzinfo=BERLIN)
    decision = plan_maintenance(
        model=MODEL,
        now=now,
        action="restart",
        windows=windows_before(now, quiet_between((3, 5))),
        duration=TWO_HOURS,
        policy_windows=restart_window_sets(combine([policy])),
        locks=restart_locks([policy], {"night": ["team-b/other"]}),
        timezone=BERLIN,
    )
    assert decision.at is not None
    assert decision.at.astimezone(BERLIN).hour == 1  # 03:00 is outside 01:00-03:00 for two hours
    assert restart_locks([policy], {"night": ["team-b/other"]}) == (
        RestartLock("night", 1, frozenset({"team-b/other"})),
    )


def due_record(at: datetime) -> MaintenanceRecord:
    return MaintenanceRecord(
        action="restart",
        state="Scheduled",
        trigger="window",
        window_start=at,
        window_end=at + TWO_HOURS,
        scheduled_at=at,
    )


def test_max_concurrent_makes_a_due_restart_wait_for_a_slot() -> None:
    at = datetime(2026, 11, 18, 2, 0, tzinfo=UTC)
    now = at + timedelta(minutes=1)
    record = due_record(at)
    full = [RestartLock("night", 1, frozenset({"team-b/other"}))]
    waiting = plan_maintenance(
        model=MODEL, now=now, action="restart", windows=(), duration=TWO_HOURS, persisted=record, locks=full
    )
    assert waiting.kind == "wait_lock"
    assert waiting.record.state == "WaitingForLock" and waiting.record.scheduled_at == at
    assert "night" in waiting.reason and "team-b/other" in waiting.reason
    # A slot frees: it goes; two slots would have let it go at once.
    freed = plan_maintenance(
        model=MODEL,
        now=now + timedelta(minutes=5),
        action="restart",
        windows=(),
        duration=TWO_HOURS,
        persisted=waiting.record,
        locks=[RestartLock("night", 1, frozenset())],
    )
    assert freed.kind == "act" and freed.record.state == "Running"
    roomy = plan_maintenance(
        model=MODEL,
        now=now,
        action="restart",
        windows=(),
        duration=TWO_HOURS,
        persisted=record,
        locks=[RestartLock("night", 2, frozenset({"team-b/other"}))],
    )
    assert roomy.kind == "act"


def test_waiting_past_the_window_moves_to_the_next_window() -> None:
    at = datetime(2026, 11, 18, 2, 0, tzinfo=UTC)
    after = at + TWO_HOURS + timedelta(minutes=1)
    tomorrow = window(at + timedelta(days=1))
    decision = plan_maintenance(
        model=MODEL,
        now=after,
        action="restart",
        windows=[tomorrow],
        duration=TWO_HOURS,
        persisted=due_record(at),
        locks=[RestartLock("night", 1, frozenset({"team-b/other"}))],
    )
    assert decision.kind == "schedule" and decision.at == tomorrow.start
    assert "rescheduled" in decision.reason and "window ended" in decision.reason


def test_cool_down_refuses_an_early_restart_and_skips_windows_inside_it() -> None:
    now = datetime(2026, 11, 18, 1, 0, tzinfo=UTC)
    last = now - timedelta(minutes=10)
    refused = plan_maintenance(
        model=MODEL,
        now=now,
        action="remediation",
        windows=(),
        duration=TWO_HOURS,
        last_restart=last,
        cooldown=timedelta(minutes=30),
        crash_looping=True,
    )
    assert refused.kind == "cooldown" and refused.at == last + timedelta(minutes=30)
    assert refused.record.state == "CoolingDown" and "cool-down" in refused.reason
    soon, later = window(now + timedelta(minutes=5)), window(now + timedelta(hours=1))
    scheduled = plan_maintenance(
        model=MODEL,
        now=now,
        action="restart",
        windows=[soon, later],
        duration=TWO_HOURS,
        last_restart=last,
        cooldown=timedelta(minutes=30),
    )
    assert scheduled.kind == "schedule" and scheduled.at == later.start


def test_a_crash_loop_acts_now_outside_windows_and_slots() -> None:
    now = datetime(2026, 11, 17, 14, 0, tzinfo=BERLIN)
    decision = plan_maintenance(
        model=MODEL,
        now=now,
        action="remediation",
        windows=[window(now + timedelta(hours=13))],
        duration=TWO_HOURS,
        policy_windows=[
            ("weekends", parse_policy_windows([{"days": ["Sat"], "start": "01:00", "end": "06:00"}]))
        ],
        locks=[RestartLock("night", 1, frozenset({"team-b/other"}))],
        crash_looping=True,
        timezone=BERLIN,
    )
    assert decision.kind == "act" and decision.at == now
    assert decision.record.trigger == "crashLoop" and decision.record.started_at == now
    assert "crash-looping" in decision.reason


def rising_memory(now: datetime, hours_to_crash: float) -> RiskSignals:
    total, slope = 80.0, 1.0
    level = total - slope * hours_to_crash
    t0 = now.timestamp() - 6 * 3600
    samples = [(t0 + i * 60, level + slope * (i * 60 - 6 * 3600) / 3600) for i in range(361)]
    return RiskSignals(gpu_memory_used_gib=samples, gpu_memory_total_gib=total)


def test_a_predicted_crash_moves_the_restart_to_the_quietest_slot_before_it() -> None:
    now = datetime(2026, 11, 17, 11, 0, tzinfo=BERLIN)
    load = quiet_between((3, 5), (14, 16), low=10.0)  # a lunch-time lull besides the night
    history = traffic(date(2026, 10, 27), 21, load)
    windows = plan_windows(history, TWO_HOURS, BERLIN, None, now=now).windows
    risk = estimate_oom_risk(rising_memory(now, hours_to_crash=7.0), now)
    assert risk.predicted_at is not None and risk.predicted_at < windows[0].start
    forecast = forecast_load(history, BERLIN, now, risk.predicted_at)
    decision = plan_maintenance(
        model=MODEL,
        now=now,
        action="restart",
        windows=windows,
        duration=TWO_HOURS,
        risk=risk,
        forecast=forecast,
        timezone=BERLIN,
    )
    assert decision.kind == "schedule" and decision.at is not None
    assert decision.at + TWO_HOURS <= risk.predicted_at < windows[0].start
    assert decision.at.astimezone(BERLIN).hour == 14  # the lull, not the next night
    assert decision.record.trigger == "oomRisk"
    assert "out-of-memory crash is predicted" in decision.reason and "GPU memory" in decision.reason


def test_without_history_a_predicted_crash_restarts_as_soon_as_allowed() -> None:
    now = datetime(2026, 11, 17, 11, 0, tzinfo=UTC)
    risk = estimate_oom_risk(rising_memory(now, hours_to_crash=5.0), now)
    decision = plan_maintenance(
        model=MODEL,
        now=now,
        action="restart",
        windows=[window(now + timedelta(hours=15))],
        duration=TWO_HOURS,
        risk=risk,
    )
    assert decision.kind == "act" and decision.record.trigger == "oomRisk"


def test_a_crash_sooner_than_a_restart_takes_acts_now() -> None:
    now = datetime(2026, 11, 17, 11, 0, tzinfo=UTC)
    risk = estimate_oom_risk(rising_memory(now, hours_to_crash=1.0), now)
    decision = plan_maintenance(
        model=MODEL,
        now=now,
        action="restart",
        windows=[window(now + timedelta(hours=15))],
        duration=TWO_HOURS,
        risk=risk,
    )
    assert decision.kind == "act" and "sooner than a restart takes" in decision.reason


def test_a_predicted_crash_moves_a_persisted_schedule_earlier() -> None:
    now = datetime(2026, 11, 17, 11, 0, tzinfo=UTC)
    planned = due_record(now + timedelta(hours=15))
    risk = estimate_oom_risk(rising_memory(now, hours_to_crash=6.0), now)
    decision = plan_maintenance(
        model=MODEL, now=now, action="restart", windows=(), duration=TWO_HOURS, persisted=planned, risk=risk
    )
    assert decision.at is not None and risk.predicted_at is not None
    assert decision.at + TWO_HOURS <= risk.predicted_at
    assert "rescheduled" in decision.reason and decision.changed


def test_policy_windows_hold_even_against_a_predicted_crash() -> None:
    now = datetime(2026, 11, 17, 11, 0, tzinfo=BERLIN)  # Tuesday
    risk = estimate_oom_risk(rising_memory(now, hours_to_crash=6.0), now)
    saturday = parse_policy_windows([{"days": ["Sat"], "start": "01:00", "end": "06:00"}])
    decision = plan_maintenance(
        model=MODEL,
        now=now,
        action="restart",
        windows=(),
        duration=TWO_HOURS,
        policy_windows=[("sat", saturday)],
        risk=risk,
        timezone=BERLIN,
    )
    assert decision.at is not None and decision.at.astimezone(BERLIN).weekday() == 5
    assert "policy windows allow no restart before it" in decision.reason


def roundtrip(record: MaintenanceRecord) -> MaintenanceRecord:
    """Through status as the API server stores it (JSON), as a new operator would read it."""
    wire = InferenceModelStatus(maintenance=record_to_status(record)).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    read = record_from_status(json.loads(json.dumps(wire))["maintenance"])
    assert read is not None
    return read


def test_a_hand_over_finds_the_same_schedule_and_never_restarts_twice() -> None:
    now = datetime(2026, 11, 17, 14, 0, tzinfo=BERLIN)
    windows = windows_before(now, quiet_between((3, 5)))
    first = plan_maintenance(
        model=MODEL, now=now, action="restart", windows=windows, duration=TWO_HOURS, timezone=BERLIN
    )
    stored = roundtrip(first.record)
    assert stored == first.record
    # The standby takes over an hour later; it re-learns slightly different windows (new history).
    shifted = tuple(window(w.start + timedelta(minutes=20)) for w in windows)
    again = plan_maintenance(
        model=MODEL,
        now=now + timedelta(hours=1),
        action="restart",
        windows=shifted,
        duration=TWO_HOURS,
        persisted=stored,
        timezone=BERLIN,
    )
    assert (again.kind, again.at, again.changed) == ("schedule", first.at, False)
    # The time comes: it starts once; a second hand-over mid-restart goes on with the same start time.
    assert first.at is not None
    start = plan_maintenance(
        model=MODEL,
        now=first.at + timedelta(minutes=1),
        action="restart",
        windows=shifted,
        duration=TWO_HOURS,
        persisted=roundtrip(again.record),
    )
    assert start.kind == "act" and start.changed
    resumed = plan_maintenance(
        model=MODEL,
        now=first.at + timedelta(minutes=20),
        action="restart",
        windows=shifted,
        duration=TWO_HOURS,
        persisted=roundtrip(start.record),
        locks=[RestartLock("night", 1, frozenset({MODEL}))],  # its own slot, from before the hand-over
    )
    assert resumed.kind == "act" and not resumed.changed
    assert resumed.record.started_at == start.record.started_at == first.at + timedelta(minutes=1)
    # Done: the same action asked again within the cool-down waits for a window after it.
    done = finish_maintenance(resumed.record, first.at + timedelta(minutes=40))
    after = plan_maintenance(
        model=MODEL,
        now=first.at + timedelta(minutes=41),
        action="restart",
        windows=[window(first.at + timedelta(minutes=50)), window(first.at + timedelta(days=1))],
        duration=TWO_HOURS,
        persisted=roundtrip(done),
        cooldown=timedelta(hours=1),
    )
    assert after.at == first.at + timedelta(days=1)


def test_a_remediation_joins_a_scheduled_restart_without_moving_it() -> None:
    at = datetime(2026, 11, 18, 2, 0, tzinfo=UTC)
    decision = plan_maintenance(
        model=MODEL,
        now=at - timedelta(hours=5),
        action="remediation",
        windows=[window(at + timedelta(hours=1))],
        duration=TWO_HOURS,
        persisted=due_record(at),
    )
    assert decision.at == at and decision.record.action == "remediation" and decision.changed


def test_nothing_pending_is_idle_and_shows_the_next_window() -> None:
    now = datetime(2026, 11, 17, 14, 0, tzinfo=UTC)
    nxt = window(now + timedelta(hours=12))
    decision = plan_maintenance(model=MODEL, now=now, action=None, windows=[nxt], duration=TWO_HOURS)
    assert decision.kind == "idle" and decision.record.state == "Idle"
    assert decision.record.window_start == nxt.start


def test_naive_datetimes_are_refused_by_type() -> None:
    with pytest.raises(MaintenanceInputError, match="now"):
        plan_maintenance(
            model=MODEL, now=datetime(2026, 11, 17), action="restart", windows=(), duration=TWO_HOURS
        )


def test_forecast_is_empty_without_enough_history() -> None:
    now = datetime(2026, 11, 17, 11, 0, tzinfo=UTC)
    short = traffic(date(2026, 11, 16), 1, quiet_between((3, 5)))
    assert forecast_load(short, BERLIN, now, now + timedelta(hours=6)) == ()
    long = traffic(date(2026, 10, 27), 21, quiet_between((3, 5)))
    slots = forecast_load(long, BERLIN, now, now + timedelta(hours=24))
    assert all(isinstance(s, LoadSlot) for s in slots)
    quiet = [s for s in slots if s.load < 0.5]
    assert quiet and all(3 <= s.start.astimezone(BERLIN).hour < 5 for s in quiet)


T0 = datetime(2026, 11, 18, 2, 0, tzinfo=UTC)


def pod(name: str, minutes: int, ready: bool = True, terminating: bool = False) -> PodState:
    return PodState(name, T0 + timedelta(minutes=minutes), ready, terminating)


def test_three_replicas_without_room_restart_oldest_first_one_at_a_time() -> None:
    # Names deliberately out of age order: the oldest pod goes first, whatever it is called.
    pods = [pod("a", -30), pod("c", -90), pod("b", -60)]
    step = plan_rollout(pods, T0, replicas=3, room_for_surge=False)
    assert (step.action, step.pod, step.order) == ("evict", "c", ("c", "b", "a"))
    # c is going and its replacement is not Ready: nothing else is touched.
    pods = [pod("c", -90, terminating=True), pod("b", -60), pod("a", -30), pod("d", 1, ready=False)]
    assert plan_rollout(pods, T0, replicas=3, room_for_surge=False).action == "wait"
    pods = [pod("b", -60), pod("a", -30), pod("d", 1, ready=False)]
    assert plan_rollout(pods, T0, replicas=3, room_for_surge=False).action == "wait"
    pods = [pod("b", -60), pod("a", -30), pod("d", 1)]
    step = plan_rollout(pods, T0, replicas=3, room_for_surge=False)
    assert (step.action, step.pod, step.remaining) == ("evict", "b", 2)
    assert (
        plan_rollout([pod("d", 1), pod("e", 5), pod("f", 9)], T0, replicas=3, room_for_surge=False).action
        == "done"
    )


def test_three_replicas_with_room_serve_with_all_three_throughout() -> None:
    """An autoscaler sized three replicas for the load: with free GPUs for one more, the restart
    surges a fourth pod first and never has fewer than three Ready pods."""
    step = plan_rollout([pod("a", -30), pod("c", -90), pod("b", -60)], T0, replicas=3, room_for_surge=True)
    assert (step.action, step.scale_to, step.order) == ("surge", 4, ("c", "b", "a"))
    # The fourth pod took the room; it starts: nothing goes yet.
    pods = [pod("a", -30), pod("c", -90), pod("b", -60), pod("d", 1, ready=False)]
    assert plan_rollout(pods, T0, replicas=3, room_for_surge=False).action == "wait"
    pods[-1] = pod("d", 1)
    step = plan_rollout(pods, T0, replicas=3, room_for_surge=False)
    assert (step.action, step.pod, step.scale_to) == ("evict", "c", None)  # the workload stays at 4
    # c is evicted and its replacement not created yet: the workload's own count says the restart
    # surges, so b does not go while only three pods serve.
    pods = [pod("a", -30), pod("b", -60), pod("d", 1)]
    step = plan_rollout(pods, T0, replicas=3, room_for_surge=True, workload_replicas=4)
    assert step.action == "wait" and "replacement" in step.reason
    pods.append(pod("e", 2, ready=False))
    assert plan_rollout(pods, T0, replicas=3, room_for_surge=False, workload_replicas=4).action == "wait"
    pods[-1] = pod("e", 2)
    step = plan_rollout(pods, T0, replicas=3, room_for_surge=False, workload_replicas=4)
    assert (step.action, step.pod, step.scale_to) == ("evict", "b", None)
    # The last old pod goes with the workload back at three.
    pods = [pod("a", -30), pod("d", 1), pod("e", 2), pod("f", 3)]
    step = plan_rollout(pods, T0, replicas=3, room_for_surge=False, workload_replicas=4)
    assert (step.action, step.pod, step.scale_to) == ("evict", "a", 3)
    assert "returning to 3 replicas" in step.reason


def test_one_replica_surges_first_when_there_is_room() -> None:
    step = plan_rollout([pod("old", -90)], T0, replicas=1, room_for_surge=True)
    assert (step.action, step.scale_to, step.downtime) == ("surge", 2, False)
    # The surge pod took the room: the flag is now False, but the surge goes on.
    step = plan_rollout([pod("old", -90), pod("new", 1, ready=False)], T0, replicas=1, room_for_surge=False)
    assert step.action == "wait"
    step = plan_rollout([pod("old", -90), pod("new", 1)], T0, replicas=1, room_for_surge=False)
    assert (step.action, step.pod, step.scale_to) == ("evict", "old", 1)
    # The workload replaced the evicted pod before the scale-back landed: scale back, then done.
    step = plan_rollout([pod("new", 1), pod("extra", 3)], T0, replicas=1, room_for_surge=False)
    assert (step.action, step.scale_to) == ("scale_back", 1)
    assert plan_rollout([pod("new", 1)], T0, replicas=1, room_for_surge=False).action == "done"


def test_a_surge_pod_created_in_the_restarts_own_second_is_new() -> None:
    """creationTimestamp has whole seconds; the restart's start has microseconds. A surge pod created
    milliseconds after the start reads as created *before* it: it must still count as the new pod, or
    the restart surges forever (seen on the real control plane)."""
    started = T0 + timedelta(microseconds=500_591)
    surge = PodState("surge", T0, True)  # created in the same second, stamped to the second
    step = plan_rollout([pod("old", -90), surge], started, replicas=1, room_for_surge=True)
    assert (step.action, step.pod, step.scale_to) == ("evict", "old", 1)


def test_one_replica_without_room_says_it_will_be_down() -> None:
    step = plan_rollout([pod("old", -90)], T0, replicas=1, room_for_surge=False)
    assert (step.action, step.pod, step.downtime) == ("evict", "old", True)
    assert "no free GPU capacity" in step.reason
