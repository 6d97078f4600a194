"""The restart-window finder (loadline.windows) and ``loadline window``: what operators rely on.

Synthetic traffic is built in local wall-clock time so the tests state the intent directly ("quiet
from 03:00 to 05:00 Berlin time every weekday"); real traces are scored in benchmarks/windows.py.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from loadline.cli import main
from loadline.windows import (
    DurationError,
    PolicyWindowError,
    SeriesError,
    Tuning,
    next_window,
    parse_duration,
    parse_policy_windows,
    plan_windows,
    series_from_prometheus,
)

BERLIN = ZoneInfo("Europe/Berlin")
STEP = 300


def series(
    start: date, days: int, tz: ZoneInfo, load: Callable[[datetime], float | None], step: int = STEP
) -> list[tuple[float, float]]:
    """Samples every ``step`` seconds of real time; ``load`` sees local time, None = no sample (a gap)."""
    t = datetime.combine(start, datetime.min.time(), tz).timestamp()
    end = datetime.combine(start + timedelta(days=days), datetime.min.time(), tz).timestamp()
    out = []
    while t < end:
        value = load(datetime.fromtimestamp(t, tz))
        if value is not None:
            out.append((t, value))
        t += step
    return out


def quiet(hours: tuple[float, float], low: float = 5.0, high: float = 100.0) -> Callable[[datetime], float]:
    def load(at: datetime) -> float:
        h = at.hour + at.minute / 60
        return low if hours[0] <= h < hours[1] else high

    return load


def local_hours(plan_windows_: list[datetime]) -> list[float]:
    return [w.hour + w.minute / 60 for w in plan_windows_]


# --- learning --------------------------------------------------------------------------------------


def test_quiet_hours_are_found_in_local_time_each_day() -> None:
    history = series(date(2026, 5, 4), 14, BERLIN, quiet((3, 5)))
    plan = plan_windows(history, "2h", BERLIN)
    assert plan.method == "learned"
    assert len(plan.windows) == 7
    assert [w.start.date() for w in plan.windows] == [date(2026, 5, 18) + timedelta(days=i) for i in range(7)]
    assert all(w.start.hour == 3 and w.start.minute == 0 for w in plan.windows)
    assert all(w.end - w.start == timedelta(hours=2) for w in plan.windows)
    assert all(w.start.utcoffset() == timedelta(hours=2) for w in plan.windows)  # Berlin summer time


def test_weekends_get_their_own_window_once_there_are_weeks_of_history() -> None:
    def load(at: datetime) -> float:
        h = at.hour
        if at.weekday() >= 5:  # weekend: busy at night (batch jobs), quiet late morning
            return 5.0 if 10 <= h < 12 else 100.0
        return 5.0 if 3 <= h < 5 else 100.0

    plan = plan_windows(series(date(2026, 5, 4), 21, BERLIN, load), "2h", BERLIN)
    starts = {w.start.strftime("%a"): w.start.hour for w in plan.windows}
    assert starts == {"Mon": 3, "Tue": 3, "Wed": 3, "Thu": 3, "Fri": 3, "Sat": 10, "Sun": 10}
    assert "weekdays and weekends learned apart" in plan.reason


def test_one_week_is_not_enough_to_trust_a_single_weekday() -> None:
    # In one week of history the only Sunday was quiet at 15:00 (a one-off); every other day at 03:00.
    def load(at: datetime) -> float:
        if at.weekday() == 6:
            return 2.0 if 15 <= at.hour < 17 else 100.0
        return 5.0 if 3 <= at.hour < 5 else 100.0

    plan = plan_windows(series(date(2026, 5, 4), 7, BERLIN, load), "2h", BERLIN)
    assert all(w.start.hour == 3 for w in plan.windows)
    assert "weekdays not told apart yet" in plan.reason


def test_from_two_weeks_on_the_quiet_time_of_busy_days_counts_for_more() -> None:
    # A launch week (1000 requests/s, dips to 300 at 03:00 and to 400 at 14:00) and then an idle week
    # (10/s, dips to 9 at 03:00 and to 1 at 14:00). Relative to each day's own level 14:00 looks
    # quieter (a 90 % dip in the idle week), but a restart disturbs requests, not shares: averaged
    # over the two weeks 03:00 costs (300 + 9) / 2 and 14:00 (400 + 1) / 2.
    def load(at: datetime) -> float:
        busy = at.date() < date(2026, 5, 11)
        if 3 <= at.hour < 5:
            return 300.0 if busy else 9.0
        if 14 <= at.hour < 16:
            return 400.0 if busy else 1.0
        return 1000.0 if busy else 10.0

    plan = plan_windows(series(date(2026, 5, 4), 14, BERLIN, load), "2h", BERLIN)
    assert all((w.start.hour, w.start.minute) == (3, 0) for w in plan.windows)


def test_bursts_and_outliers_do_not_move_the_window() -> None:
    base = quiet((3, 5))

    def load(at: datetime) -> float:
        if at.day == 12 and at.hour == 3:  # one night a 100x burst inside the quiet hours
            return 10_000.0
        if at.day == 14 and 14 <= at.hour < 16:  # one afternoon a drop to nothing (a client outage)
            return 0.0
        return base(at)

    history = series(date(2026, 5, 4), 21, BERLIN, load)
    assert all(w.start.hour == 3 for w in plan_windows(history, "2h", BERLIN).windows)
    # Clipping alone keeps it there (one day's burst is clipped away), without the median profile.
    clipped = plan_windows(history, "2h", BERLIN, tuning=Tuning(anchor=False))
    assert all(w.start.hour == 3 for w in clipped.windows)


def noisy(seed: int, spread: float = 0.2) -> Callable[[date], float]:
    """A day-to-day level factor, 1 ± ``spread``, the same all day (a busy day is busy throughout)."""
    cache: dict[date, float] = {}

    def factor(day: date) -> float:
        if day not in cache:
            cache[day] = 1 + random.Random(seed * 100_003 + day.toordinal()).uniform(-spread, spread)
        return cache[day]

    return factor


def test_a_weekly_effect_beyond_the_noise_is_learned_and_one_weeks_luck_is_not() -> None:
    level = noisy(1)

    def lasting(at: datetime) -> float:  # every weekend quiet late morning, weekdays at night
        hours = (10, 12) if at.weekday() >= 5 else (3, 5)
        return quiet(hours)(at) * level(at.date())

    plan = plan_windows(series(date(2026, 5, 4), 21, BERLIN, lasting), "2h", BERLIN)
    assert {w.start.strftime("%a"): w.start.hour for w in plan.windows} == {
        "Mon": 3, "Tue": 3, "Wed": 3, "Thu": 3, "Fri": 3, "Sat": 10, "Sun": 10
    }  # fmt: skip

    def once(at: datetime) -> float:  # only the first weekend was quiet late morning: a one-off
        first_weekend = at.weekday() >= 5 and at.date() < date(2026, 5, 11)
        return quiet((10, 12) if first_weekend else (3, 5))(at) * level(at.date())

    # The one-off weekend is shrunk towards all days (its two quiet late mornings against two busy
    # ones are mostly noise), so every day keeps the night window, with two weeks and with three.
    for days in (14, 21):
        plan = plan_windows(series(date(2026, 5, 4), days, BERLIN, once), "2h", BERLIN)
        assert all(w.start.hour == 3 for w in plan.windows)
        assert "weekdays and weekends learned apart, shrunk towards all days" in plan.reason


def test_the_whole_windows_load_is_judged_not_its_slots() -> None:
    # 03:00-05:00 is nearly idle in every 5-minute slot's median, but each night one slot of it (a
    # different one each night: a nightly batch) carries 2400 requests: 110 per slot on average
    # over the window, every night. 14:00-16:00 carries a steady 60. A profile of per-slot medians
    # sees 10 against 60; the windows' own loads say 110 against 60.
    def load(at: datetime) -> float:
        if 3 <= at.hour < 5:
            batch = at.date().toordinal() % 24
            return 2400.0 if (at.hour - 3) * 12 + at.minute // 5 == batch else 10.0
        return 60.0 if 14 <= at.hour < 16 else 200.0

    plan = plan_windows(series(date(2026, 5, 4), 21, BERLIN, load), "2h", BERLIN)
    assert all(w.start.hour == 14 and w.start.minute == 0 for w in plan.windows)


def test_among_windows_equal_within_noise_the_steadier_one_is_taken() -> None:
    # 03:00-05:00 carries 50 every night. 14:00-16:00 carries 48 on average, but 60 or 30 by the day:
    # 2 lower than 03:00, well within the standard error of the day-by-day difference (about 3 with
    # 21 days). A third window, 20:00-22:00, is quietest in the all-days median profile (20 on three
    # days in five) but its bursts make it the busiest on average, far beyond the noise.
    def load(at: datetime) -> float:
        low = at.date().toordinal() % 5 in (0, 1)
        if 3 <= at.hour < 5:
            return 50.0
        if 14 <= at.hour < 16:
            return 30.0 if low else 60.0
        if 20 <= at.hour < 22:
            return 400.0 if low else 20.0
        return 200.0

    history = series(date(2026, 5, 4), 21, BERLIN, load)
    plan = plan_windows(history, "2h", BERLIN)
    assert all(w.start.hour == 3 and w.start.minute == 0 for w in plan.windows)
    # Without the rule the lowest estimate wins, however noisy:
    plan = plan_windows(history, "2h", BERLIN, tuning=Tuning(steadiness_z=0))
    assert all(w.start.hour == 14 for w in plan.windows)
    # And a window lower beyond the noise still beats a steadier one.
    lower = [(t, v / 2 if 14 <= datetime.fromtimestamp(t, BERLIN).hour < 16 else v) for t, v in history]
    assert all(w.start.hour == 14 for w in plan_windows(lower, "2h", BERLIN).windows)


def test_a_burst_prone_hour_is_avoided_by_its_risk_not_by_one_weeks_luck() -> None:
    # 03:00-05:00 idles at 10 but bursts to 200 on two nights in five (a recurring batch): on average
    # it carries 86. 14:00-16:00 carries a steady 40. The median night of 03:00 says 10.
    def load(at: datetime) -> float:
        if 3 <= at.hour < 5:
            return 200.0 if at.date().toordinal() % 5 in (0, 2) else 10.0
        return 40.0 if 14 <= at.hour < 16 else 100.0

    history = series(date(2026, 5, 4), 21, BERLIN, load)
    assert all(w.start.hour == 14 for w in plan_windows(history, "2h", BERLIN).windows)
    median = plan_windows(history, "2h", BERLIN, tuning=Tuning(burst_quantile=0.5))
    assert all(w.start.hour == 3 for w in median.windows)


def test_drift_is_followed_by_weighting_recent_days() -> None:
    # Quiet at 03:00 for three weeks, then at 14:00 for the last two (the users moved): by
    # count of days 03:00 still wins; weighted by recency (half-life 7 days) the new shape does.
    def load(at: datetime) -> float:
        return quiet((14, 16) if at.date() >= date(2026, 5, 25) else (3, 5))(at)

    history = series(date(2026, 5, 4), 35, BERLIN, load)
    assert all(w.start.hour == 3 for w in plan_windows(history, "2h", BERLIN).windows)
    recent = plan_windows(history, "2h", BERLIN, tuning=Tuning(half_life_days=7))
    assert all(w.start.hour == 14 for w in recent.windows)


def test_the_median_profiles_window_stays_unless_another_is_lower_beyond_the_noise() -> None:
    # 03:00-05:00 is the all-days median profile's choice (20 on three nights in five, 50 on the
    # others: 32 on average). 14:00-16:00 carries 28.8 on average (36 or 18), lower and steadier,
    # but within one standard error of the day-by-day difference: not evidence enough to move.
    def load(at: datetime) -> float:
        busy = at.date().toordinal() % 5 in (0, 1)
        if 3 <= at.hour < 5:
            return 50.0 if busy else 20.0
        if 14 <= at.hour < 16:
            return 18.0 if busy else 36.0
        return 100.0

    history = series(date(2026, 5, 4), 21, BERLIN, load)
    assert all(w.start.hour == 3 for w in plan_windows(history, "2h", BERLIN).windows)
    free = plan_windows(history, "2h", BERLIN, tuning=Tuning(anchor=False))
    assert all(w.start.hour == 14 for w in free.windows)
    # Lower beyond the noise, the other window is taken.
    lower = [(t, v / 3 if 14 <= datetime.fromtimestamp(t, BERLIN).hour < 16 else v) for t, v in history]
    assert all(w.start.hour == 14 for w in plan_windows(lower, "2h", BERLIN).windows)


def test_under_two_weeks_the_learner_cannot_be_checked_and_the_median_profile_is_kept() -> None:
    # The nightly batch of test_the_whole_windows_load_is_judged_not_its_slots, but ten days of
    # history: the learner's 14:00 cannot yet be checked on a week it did not learn from, so the
    # all-days median profile's 03:00 is kept; from two weeks on the check is made and 14:00 taken.
    def load(at: datetime) -> float:
        if 3 <= at.hour < 5:
            batch = at.date().toordinal() % 24
            return 2400.0 if (at.hour - 3) * 12 + at.minute // 5 == batch else 10.0
        return 60.0 if 14 <= at.hour < 16 else 200.0

    young = plan_windows(series(date(2026, 5, 4), 10, BERLIN, load), "2h", BERLIN)
    assert all(w.start.hour == 3 for w in young.windows)
    assert "under two weeks the learner cannot be checked" in young.reason
    unchecked = plan_windows(
        series(date(2026, 5, 4), 10, BERLIN, load), "2h", BERLIN, tuning=Tuning(anchor=False)
    )
    assert all(w.start.hour == 14 for w in unchecked.windows)
    checked = plan_windows(series(date(2026, 5, 4), 15, BERLIN, load), "2h", BERLIN)
    assert all(w.start.hour == 14 for w in checked.windows)
    assert "following them would have paid off in the newest weeks" in checked.reason


def test_gaps_are_not_quiet() -> None:
    # The exporter is down 20:00-23:00 every day; the real quiet hours are 05:00-07:00 at half load.
    def load(at: datetime) -> float | None:
        if 20 <= at.hour < 23:
            return None
        return 50.0 if 5 <= at.hour < 7 else 100.0

    plan = plan_windows(series(date(2026, 5, 4), 14, BERLIN, load), "2h", BERLIN)
    assert all(w.start.hour == 5 for w in plan.windows)
    for w in plan.windows:
        assert not (w.start.hour >= 18 and w.start.hour < 23)


def test_irregular_steps_and_several_series_are_summed() -> None:
    history = series(date(2026, 5, 4), 14, BERLIN, quiet((3, 5)), step=37)
    # Two pods, each with half the load and its own irregular scrape times.
    pod_a = [(t, v / 2) for t, v in history[::2]]
    pod_b = [(t + 11, v / 2) for t, v in history[1::2]]
    plan = plan_windows([pod_a, pod_b], "90m", BERLIN)
    assert all(w.start.hour in (3, 4) and w.start.hour + w.start.minute / 60 <= 3.5 for w in plan.windows)


# --- daylight saving ------------------------------------------------------------------------------


def test_spring_forward_keeps_wall_clock_time_and_real_length() -> None:
    # Quiet 03:00-05:00 Berlin time; the last Sunday of March 2026 (the 29th) skips 02:00-03:00.
    history = series(date(2026, 3, 1), 24, BERLIN, quiet((3, 5)))  # up to Tue Mar 24, all in CET
    plan = plan_windows(history, "2h", BERLIN, now=datetime(2026, 3, 25, tzinfo=BERLIN))
    by_day = {w.start.date(): w for w in plan.windows}
    for day in (date(2026, 3, 28), date(2026, 3, 29), date(2026, 3, 30)):
        w = by_day[day]
        assert (w.start.hour, w.start.minute) == (3, 0)  # the same wall-clock time on both sides
        assert w.end.timestamp() - w.start.timestamp() == 7200  # two hours of real time
    assert by_day[date(2026, 3, 28)].start.astimezone(UTC).hour == 2  # CET
    assert by_day[date(2026, 3, 30)].start.astimezone(UTC).hour == 1  # CEST


def test_a_window_across_the_skipped_hour_is_still_two_real_hours() -> None:
    # Quiet 01:00-04:00 wall clock: on Mar 29 that is only two real hours (02:00-03:00 does not exist).
    history = series(date(2026, 3, 1), 24, BERLIN, quiet((1, 4)))
    plan = plan_windows(history, "2h", BERLIN, now=datetime(2026, 3, 25, tzinfo=BERLIN))
    w = next(w for w in plan.windows if w.start.date() == date(2026, 3, 29))
    assert w.end.timestamp() - w.start.timestamp() == 7200
    assert w.start.hour == 1 and w.end.hour == 4  # 01:00 CET to 04:00 CEST: both ends in the quiet hours


def test_fall_back_day_and_history_across_the_change() -> None:
    # History spans the October change (Sun Oct 25 2026); quiet 03:00-05:00 wall clock throughout.
    history = series(date(2026, 10, 12), 21, BERLIN, quiet((3, 5)))
    plan = plan_windows(history, "2h", BERLIN)
    assert all((w.start.hour, w.start.minute) == (3, 0) for w in plan.windows)
    plan = plan_windows(history[: len(history) // 2], "2h", BERLIN, now=datetime(2026, 10, 23, tzinfo=BERLIN))
    sunday = next(w for w in plan.windows if w.start.date() == date(2026, 10, 25))
    assert (sunday.start.hour, sunday.end.timestamp() - sunday.start.timestamp()) == (3, 7200)


# --- short history and policy windows --------------------------------------------------------------

WEEKEND_NIGHTS = [{"days": ["Sat", "Sun"], "start": "22:00", "end": "06:00", "timezone": "Europe/Berlin"}]


def test_short_history_falls_back_to_policy_windows() -> None:
    history = series(date(2026, 5, 4), 2, BERLIN, quiet((3, 5)))
    plan = plan_windows(history, "2h", BERLIN, WEEKEND_NIGHTS)
    assert plan.method == "policy"
    assert "history too short (2.0 days" in plan.reason
    assert [w.start.strftime("%a %H:%M") for w in plan.windows][:2] == ["Sat 22:00", "Sun 22:00"]
    assert all(w.source == "policy" for w in plan.windows)


def test_without_history_a_policy_window_starts_when_the_policy_says_not_on_the_next_bin() -> None:
    """A policy written as 15:23 means 15:23: bins are for learning from history, and there is none."""
    now = datetime(2026, 11, 23, 15, 20, 30, tzinfo=ZoneInfo("UTC"))
    plan = plan_windows([], "4m", "UTC", [{"start": "15:23", "end": "15:35", "timezone": "UTC"}], now=now)
    assert plan.windows[0].start == now.replace(minute=23, second=0)
    assert plan.windows[0].end == now.replace(minute=27, second=0)


def test_short_history_without_policy_uses_the_default_time() -> None:
    plan = plan_windows(series(date(2026, 5, 4), 1, BERLIN, quiet((14, 16))), "1h", BERLIN)
    assert plan.method == "default"
    assert len(plan.windows) == 7
    assert all((w.start.hour, w.source) == (2, "default") for w in plan.windows)


def test_learned_windows_stay_inside_policy_windows() -> None:
    # Quietest at 03:00-05:00 every day, but restarts are allowed only on weekend nights until 04:00.
    policy = [{"days": ["Sat", "Sun"], "start": "22:00", "end": "04:00"}]
    history = series(date(2026, 5, 4), 21, BERLIN, quiet((3, 5)))
    plan = plan_windows(history, "2h", BERLIN, policy)
    assert plan.method == "learned"
    assert {w.start.strftime("%a") for w in plan.windows} == {"Sun", "Mon"}  # Sat and Sun nights
    for w in plan.windows:
        assert w.end.hour <= 4 or w.start.hour >= 22
    # As late as the policy allows: it ends at 04:00, overlapping the quiet hour 03:00-04:00.
    assert all((w.end.hour, w.end.minute) == (4, 0) for w in plan.windows)


def test_policy_window_in_another_time_zone() -> None:
    # 01:00-03:00 UTC is 03:00-05:00 Berlin (summer): the quiet hours exactly.
    policy = [{"start": "01:00", "end": "03:00", "timezone": "UTC"}]
    history = series(date(2026, 5, 4), 14, BERLIN, quiet((2, 6)))
    plan = plan_windows(history, "2h", BERLIN, policy)
    assert all(w.start.astimezone(UTC).hour == 1 and w.start.hour == 3 for w in plan.windows)


def test_policy_windows_shorter_than_the_restart_are_an_error() -> None:
    history = series(date(2026, 5, 4), 14, BERLIN, quiet((3, 5)))
    with pytest.raises(PolicyWindowError, match="no policy window is 3:00:00 long"):
        plan_windows(history, "3h", BERLIN, [{"start": "01:00", "end": "03:00"}])
    with pytest.raises(PolicyWindowError, match=r"windows\[0\].days: unknown day 'Funday'"):
        parse_policy_windows([{"days": ["Funday"], "start": "01:00", "end": "03:00"}])


def test_next_window_starts_after_now() -> None:
    history = series(date(2026, 5, 4), 14, BERLIN, quiet((3, 5)))
    before = datetime(2026, 5, 20, 1, 0, tzinfo=BERLIN)
    w = next_window(history, "2h", BERLIN, now=before)
    assert w is not None and w.start == datetime(2026, 5, 20, 3, 0, tzinfo=BERLIN)
    # Once today's window has begun, the next one is tomorrow's: never a busy leftover of today.
    during = datetime(2026, 5, 20, 4, 0, tzinfo=BERLIN)
    w = next_window(history, "2h", BERLIN, now=during)
    assert w is not None and w.start == datetime(2026, 5, 21, 3, 0, tzinfo=BERLIN)


# --- durations and Prometheus answers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("7200s", 7200), ("600", 600), ("24h", 86400)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["0", "0h", "25h", "2d", "2 hours", "h", "-1h", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


def matrix(*series_: list[tuple[float, float]], wrap: bool = True) -> dict[str, object]:
    data = {
        "resultType": "matrix",
        "result": [
            {"metric": {"pod": f"vllm-{i}"}, "values": [[t, str(v)] for t, v in s]}
            for i, s in enumerate(series_)
        ],
    }
    return {"status": "success", "data": data} if wrap else data


def test_prometheus_answer_is_read_with_or_without_the_envelope() -> None:
    a = [(1.0, 2.0), (61.0, 3.0)]
    assert series_from_prometheus(matrix(a)) == series_from_prometheus(matrix(a, wrap=False)) == [a]
    with pytest.raises(SeriesError, match="resultType is 'vector'"):
        series_from_prometheus({"status": "success", "data": {"resultType": "vector", "result": []}})
    with pytest.raises(SeriesError, match="no samples"):
        series_from_prometheus(matrix())
    with pytest.raises(SeriesError, match="no samples"):
        series_from_prometheus(matrix([(1.0, float("nan"))]))


# --- the command line -----------------------------------------------------------------------------


def write(tmp_path: Path, payload: object, name: str = "series.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


def test_cli_prints_seven_windows_after_the_last_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = series(date(2026, 5, 4), 14, BERLIN, quiet((3, 5)), step=60)
    half = [(t, v / 2) for t, v in history]
    path = write(tmp_path, matrix(half, half))
    assert (
        main(["window", str(path), "--duration", "2h", "--output", "json", "--timezone", "Europe/Berlin"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"windows"} and len(out["windows"]) == 7
    last = datetime.fromtimestamp(history[-1][0], UTC)
    for item in out["windows"]:
        start, end = datetime.fromisoformat(item["start"]), datetime.fromisoformat(item["end"])
        assert start > last and end - start == timedelta(hours=2)
        assert item["start"].endswith("+02:00") and start.hour == 3


def test_cli_defaults_to_utc(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, matrix(series(date(2026, 5, 4), 7, BERLIN, quiet((3, 5)))), "s.json")
    assert main(["window", str(path), "--duration", "1h", "--output", "json"]) == 0
    starts = [datetime.fromisoformat(w["start"]) for w in json.loads(capsys.readouterr().out)["windows"]]
    assert all(s.utcoffset() == timedelta(0) and s.hour in (1, 2) for s in starts)


def _bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    good = write(tmp_path, matrix(series(date(2026, 5, 4), 7, BERLIN, quiet((3, 5)))), "good.json")
    vector = write(
        tmp_path, {"status": "success", "data": {"resultType": "vector", "result": []}}, "vector.json"
    )
    empty = write(tmp_path, matrix(), "empty.json")
    binary = tmp_path / "series.json.gz"
    binary.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe\x00binary")
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": ', encoding="utf-8")
    return [
        ([str(vector), "--duration", "2h"], "not 'matrix'"),
        ([str(empty), "--duration", "2h"], "no samples"),
        ([str(good), "--duration", "0"], "not a positive duration"),
        ([str(good), "--duration", "25h"], "longer than a day"),
        ([str(good), "--duration", "two hours"], "cannot read 'two hours' as a duration"),
        ([str(binary), "--duration", "2h"], "not UTF-8 text"),
        ([str(broken), "--duration", "2h"], "not valid JSON"),
        ([str(tmp_path / "missing.json"), "--duration", "2h"], "cannot read"),
        ([str(tmp_path), "--duration", "2h"], "is a directory"),
        ([str(good), "--duration", "2h", "--timezone", "Mars/Olympus"], "unknown time zone"),
    ]


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, problem in _bad_inputs(tmp_path):
        assert main(["window", *argv, "--output", "json"]) == 2, argv
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and problem in lines[0] and "fix:" in lines[0], (argv, captured.err)


def test_cli_bad_input_has_no_traceback_in_a_real_process(tmp_path: Path) -> None:
    binary = tmp_path / "x.bin"
    binary.write_bytes(bytes(range(256)))
    done = subprocess.run(
        [sys.executable, "-m", "loadline", "window", str(binary), "--duration", "2h", "--output", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
