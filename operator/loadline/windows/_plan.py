"""Choose the quietest restart window of a given length on each coming day.

The plan is computed in real time (unix seconds) and judged in local time: candidate windows start on
the bin grid, last exactly ``duration`` of real time (two hours across a daylight-saving change are
still two hours), and each is judged by what history says about windows of the same length starting
at the same *wall-clock* time (``_profile``): their expected load, and, among windows equal within
the day-to-day noise, their steadiness. A candidate that history never saw observed for most of its
length is not a candidate: missing data is not quiet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo

from loadline.windows._duration import parse_duration
from loadline.windows._errors import PolicyWindowError, SeriesError
from loadline.windows._policy import PolicyWindow, parse_policy_windows, parse_timezone
from loadline.windows._profile import Profile, build_profile, choose, median_choice
from loadline.windows._series import Sample, combine_series

__all__ = ["Method", "Tuning", "Window", "WindowPlan", "learned_profile", "next_window", "plan_windows"]

Method = Literal["learned", "policy", "default"]


@dataclass(frozen=True)
class Tuning:
    """The finder's knobs. ``burst_quantile``, ``steadiness_z``, ``anchor`` and ``half_life_days``
    were chosen on the tuning traces only (benchmarks/windows_tune.py, docs/restarts.md); the others
    follow from what they guard."""

    #: Less observed history than this (days, gaps excluded) is not learned from.
    min_history_days: float = 3.0
    #: Each window's per-day loads are clipped at both ends by at least ``1 - burst_quantile`` of the
    #: days' weight (one day at the least) before averaging: 1.0 is the plain mean, 0.5 the median.
    burst_quantile: float = 0.9
    #: Recency: a day's weight halves every this many days of age (None = all days alike).
    half_life_days: float | None = None
    #: Windows whose expected load is within this many standard errors of the best (day-by-day
    #: differences) are equal within noise; the steadiest of them is taken. 0 = always the lowest.
    steadiness_z: float = 1.0
    #: Keep the median profile's window unless another carries less load beyond the noise.
    anchor: bool = True
    #: From two weeks of history on, learn weekdays and weekends apart, each shrunk towards all
    #: days by how far its windows differ beyond the day-to-day noise (False: always pool).
    weekly: bool = True
    #: Share of a window's bins that must be observed on a day for that day to count for it.
    min_window_coverage: float = 0.9
    #: A window seen on fewer days than this share of the best-seen window's is not a candidate.
    min_window_days: float = 0.5
    #: With short history and no policy windows: restart at this local time.
    default_start: time = time(2, 0)
    #: How many days ahead to look for ``days`` windows (policy windows may skip days).
    search_days: int = 35


@dataclass(frozen=True)
class Window:
    """One chosen window: ``start`` … ``end`` (aware, in the plan's time zone)."""

    start: datetime
    end: datetime
    #: Expected mean load relative to a typical day's mean (1.0); None when not learned.
    expected_load: float | None
    source: Method

    def as_dict(self) -> dict[str, str]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat()}


@dataclass(frozen=True)
class WindowPlan:
    """The windows and why they were chosen."""

    windows: tuple[Window, ...]
    method: Method
    reason: str
    timezone: str
    duration: timedelta
    #: Observed history, gaps excluded, in days.
    history_days: float
    history_start: datetime | None = None
    history_end: datetime | None = None
    slot_seconds: int = 0
    #: Weeks of history behind the profile.
    weeks: int = 0
    notes: tuple[str, ...] = field(default=())


def _aware(moment: datetime | float | None, default: float) -> float:
    if moment is None:
        return default
    if isinstance(moment, datetime):
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    return float(moment)


def _midnight(day: date, tz: ZoneInfo) -> float:
    return datetime.combine(day, time(0), tz).timestamp()


def learned_profile(
    samples: Sequence[Sample] | Sequence[Sequence[Sample]],
    zone: ZoneInfo,
    tuning: Tuning,
    span: timedelta | None = None,
) -> tuple[int, dict[int, float], Profile | None]:
    """The samples (one series, or several to sum) in bins of ``slot`` seconds, and the profile of
    windows of ``span`` (default: one bin, the per-slot forecast) learned from them when they cover
    ``tuning.min_history_days`` (else None). The window finder and the maintenance forecast learn
    with the same rules, so a forecast slot and a window agree."""
    one_series = not samples or isinstance(samples[0][0], int | float)
    many = cast(Sequence[Sequence[Sample]], [samples] if one_series else samples)
    slot, bins = combine_series(many)
    if len(bins) * slot / 86400 < tuning.min_history_days:
        return slot, dict(bins), None
    width = 1 if span is None else max(1, math.ceil(span.total_seconds() / slot - 1e-9))
    profile = build_profile(
        slot,
        bins,
        zone,
        span=width,
        burst_quantile=tuning.burst_quantile,
        half_life_days=tuning.half_life_days,
        min_window_coverage=tuning.min_window_coverage,
        weekly=tuning.weekly,
        steadiness_z=tuning.steadiness_z,
        min_window_days=tuning.min_window_days,
        validate=tuning.anchor and span is not None,
    )
    return slot, dict(bins), profile


def _choose(profile: Profile, candidates: Sequence[float], tuning: Tuning) -> tuple[float, float] | None:
    """(start, expected load) of the window to take among ``candidates`` (unix seconds); None when
    history knows none of them.

    With ``tuning.anchor`` the all-days median profile's window is kept unless the learner's own
    choices beat it on left-out weeks (``Profile.validated``), and even then whenever it is equal to
    the lowest expected load within ``tuning.steadiness_z`` standard errors of the day-by-day
    difference: the learner leaves the choice that needs no evidence only where history shows a lower
    load beyond the noise. Otherwise the steadiest of the windows equal within noise is taken."""
    known = [(t, w) for t in candidates if (w := profile.window(t, tuning.min_window_days)) is not None]
    if not known:
        return None
    if tuning.anchor and not profile.validated:
        median = median_choice(known)
        if median is not None:
            return median[0], median[1].expected
    t, w = choose(known, tuning.steadiness_z, tuning.burst_quantile, tuning.anchor)
    return t, w.expected


def plan_windows(
    samples: Sequence[Sample] | Sequence[Sequence[Sample]],
    duration: timedelta | str | float,
    tz: ZoneInfo | str = "UTC",
    policy_windows: Sequence[Mapping[str, Any] | PolicyWindow] | None = None,
    now: datetime | float | None = None,
    *,
    days: int = 7,
    tuning: Tuning = Tuning(),
) -> WindowPlan:
    """The quietest window of ``duration`` on each of the next ``days`` days with a possible window.

    ``samples`` are ``(unix seconds, value)`` pairs of a request rate (or running requests), or a
    list of such series to be summed. ``now`` defaults to the end of the last sample's bin. Each local
    day's window is chosen over the whole day; a day whose window starts before ``now`` is skipped, so
    the first day is today only if today's quiet time is still ahead. With
    ``policy_windows`` every window lies inside one of them; with history shorter than
    ``tuning.min_history_days`` the policy windows (or else ``tuning.default_start``) are used as they
    are. A window lies inside one occurrence of a policy window and is listed under the day that
    occurrence starts (a Saturday-night window may begin at 02:00 on Sunday). The result says which
    method was used, and why. Pure: no clock, no I/O.
    """
    zone = parse_timezone(tz)
    length = parse_duration(duration)
    policies = parse_policy_windows(policy_windows)
    slot, bins, profile = learned_profile(samples, zone, tuning, length)
    observed_days = len(bins) * slot / 86400
    learned = profile is not None
    first_bin = min(bins) if bins else 0
    last_bin = max(bins) if bins else 0
    if not bins and now is None:
        raise SeriesError("SERIES", "no samples and no 'now' to plan from", "pass samples or now=")
    start_at = _aware(now, (last_bin + 1) * slot)
    span = length.total_seconds()

    first_day = datetime.fromtimestamp(start_at, zone).date()
    last_day = first_day + timedelta(days=tuning.search_days)
    allowed = _allowed(policies, first_day, last_day, zone, length) if policies else None
    chosen: list[Window] = []
    notes: list[str] = []
    day = first_day
    while len(chosen) < days and day < last_day:
        window = _day_window(day, zone, span, slot, allowed, profile, tuning, notes)
        if window is not None and window.start.timestamp() >= start_at:
            chosen.append(window)  # a day whose window has begun or passed is skipped, not re-planned
        day += timedelta(days=1)

    method: Method = "learned" if learned else ("policy" if policies else "default")
    history_start = datetime.fromtimestamp(first_bin * slot, zone) if bins else None
    history_end = datetime.fromtimestamp((last_bin + 1) * slot, zone) if bins else None
    reason = _reason(method, observed_days, tuning, profile, zone, slot, bool(policies))
    return WindowPlan(
        windows=tuple(chosen),
        method=method,
        reason=reason,
        timezone=str(zone.key),
        duration=length,
        history_days=round(observed_days, 3),
        history_start=history_start,
        history_end=history_end,
        slot_seconds=slot,
        weeks=profile.weeks if profile else 0,
        notes=tuple(notes),
    )


def _allowed(
    policies: Sequence[PolicyWindow], first_day: date, last_day: date, zone: ZoneInfo, length: timedelta
) -> list[tuple[float, float]]:
    """The policies' occurrences from the day before ``first_day`` to ``last_day`` that can hold a
    window of ``length``; :class:`PolicyWindowError` when none can."""
    span = length.total_seconds()
    allowed = sorted(
        occ
        for p in policies
        for occ in p.occurrences(first_day - timedelta(days=1), last_day, zone)
        if occ[1] - occ[0] >= span
    )
    if not allowed:
        raise PolicyWindowError(
            "windows", f"no policy window is {length} long", "widen a window or shorten the restart"
        )
    return allowed


def _day_window(
    day: date,
    zone: ZoneInfo,
    span: float,
    slot: int,
    allowed: list[tuple[float, float]] | None,
    profile: Profile | None,
    tuning: Tuning,
    notes: list[str],
) -> Window | None:
    """``day``'s window: the learned quietest start among the day's candidates (inside the policy
    occurrences that start that day, when there are policies), else the policy's own start or the
    default start; None when the day has no candidate. A note says when history does not cover the
    policy windows."""
    begin = _midnight(day, zone)
    stop = _midnight(day + timedelta(days=1), zone)
    # Without policies any start on this day (the window may run past midnight); with them the
    # occurrences that start on this day, however far past midnight they run.
    spans = [(begin, stop + span)] if allowed is None else [(a, b) for a, b in allowed if begin <= a < stop]
    candidates = sorted(
        {
            float(t)
            for a, b in spans
            for t in range(math.ceil(a / slot) * slot, math.floor(b - span) + 1, slot)
            if allowed is not None or t < stop
        }
    )
    if not candidates:
        return None
    if profile is not None:
        best = _choose(profile, candidates, tuning)
        if best is not None:
            relative = best[1] / profile.level if profile.level > 0 else 0.0
            return _window(best[0], span, zone, relative, "learned")
        if allowed is None:
            return None
        notes.append(f"{day}: no history covers the policy windows; the first one is used")
    if allowed is not None:  # the policy as written: its own start, not the next bin's
        return _window(min(a for a, _b in spans), span, zone, None, "policy")
    wanted = datetime.combine(day, tuning.default_start, zone).timestamp()
    return _window(wanted, span, zone, None, "default")


def _window(start: float, span: float, zone: ZoneInfo, load: float | None, source: Method) -> Window:
    return Window(
        start=datetime.fromtimestamp(start, zone),
        end=datetime.fromtimestamp(start + span, zone),
        expected_load=None if load is None else round(load, 4),
        source=source,
    )


def _reason(
    method: Method,
    observed: float,
    tuning: Tuning,
    profile: Profile | None,
    zone: ZoneInfo,
    slot: int,
    policies: bool,
) -> str:
    if method == "learned" and profile is not None:
        if profile.weekly:
            weekly = (
                "weekdays and weekends learned apart, shrunk towards all days: "
                f"{profile.weekly_share:.0%} of their own difference kept (the weekly effect against "
                f"the day-to-day noise over {profile.weeks} weeks)"
            )
        elif profile.weeks >= 2:
            weekly = (
                f"all days pooled (no weekly effect beyond the day-to-day noise over {profile.weeks} weeks)"
            )
        else:
            weekly = "all days pooled (under two weeks: weekdays not told apart yet)"
        inside = "; inside the policy windows" if policies else ""
        if not tuning.anchor:
            checked = ""
        elif profile.validated:
            checked = "; the learned windows (following them would have paid off in the newest weeks)"
        elif profile.weeks < 2:
            checked = (
                "; the all-days median profile's windows (under two weeks the learner cannot be checked)"
            )
        else:
            checked = (
                "; the all-days median profile's windows (following the learner would not have paid off "
                "in the newest weeks)"
            )
        return (
            f"learned from {observed:.1f} days of history ({slot // 60}-minute bins, {zone.key}): "
            f"{weekly}{checked}{inside}"
        )
    short = f"history too short ({observed:.1f} days < {tuning.min_history_days:g})"
    if method == "policy":
        return f"{short}: the policy windows as they are"
    return f"{short} and no policy windows: {tuning.default_start:%H:%M} {zone.key} each day"


def next_window(
    samples: Sequence[Sample] | Sequence[Sequence[Sample]],
    duration: timedelta | str | float,
    tz: ZoneInfo | str = "UTC",
    policy_windows: Sequence[Mapping[str, Any] | PolicyWindow] | None = None,
    now: datetime | float | None = None,
    *,
    tuning: Tuning = Tuning(),
) -> Window | None:
    """The earliest planned window that starts at or after ``now`` (None if none can be found)."""
    plan = plan_windows(samples, duration, tz, policy_windows, now, days=1, tuning=tuning)
    return plan.windows[0] if plan.windows else None
