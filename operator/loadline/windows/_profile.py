"""The expected load at each wall-clock slot of each weekday, learned robustly from history.

Each local day's bins are divided by that day's level (its mean load), so a busy week, a growing
service or a holiday changes the *shape* less than the raw numbers: what matters for choosing a window
is when a day is quiet relative to itself. For every (weekday, time of day) the profile takes the
median over the same weekday in earlier weeks (a burst or an outage in one week moves a median of
three weeks not at all) and the median over all days, and blends them by how many same-weekday days
there are: ``(n·same + k·all) / (n + k)``. With one week of history the all-days shape dominates,
with many weeks the weekday's own shape does, so a quiet Sunday morning is learned once there is
enough evidence for it and a single odd Tuesday is not.

Slots are wall-clock times in the plan's time zone (``zoneinfo``), so 03:00 means 03:00 on both
sides of a daylight-saving change; the hour that does not exist in spring has no samples that day
(other days fill it), and the hour that repeats in autumn is averaged.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from zoneinfo import ZoneInfo

__all__ = ["Profile", "build_profile"]


@dataclass(frozen=True)
class Profile:
    """Relative load (1.0 = a typical day's mean) by ``(weekday, slot of day)``; absent = unknown."""

    slot: int
    tz: ZoneInfo
    values: Mapping[tuple[int, int], float]
    #: Same-weekday days behind a typical slot (how many weeks the weekday's own shape rests on).
    weeks: int
    #: Local days with enough samples to set their own level.
    days: int

    def key(self, t: float) -> tuple[int, int]:
        """(weekday, wall-clock slot of day) of the instant ``t`` (unix seconds)."""
        local = datetime.fromtimestamp(t, self.tz)
        return local.weekday(), (local.hour * 3600 + local.minute * 60 + local.second) // self.slot

    def at(self, t: float) -> float | None:
        return self.values.get(self.key(t))


def _day_bins(t0: float, t1: float, slot: int) -> float:
    return max(1.0, (t1 - t0) / slot)


def _center(values: list[float], trim: float) -> float:
    """Mean of the values left after cutting ``trim`` of them off each end (0.5 = the median)."""
    if trim >= 0.5:
        return statistics.median(values)
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    return statistics.fmean(ordered[cut : len(ordered) - cut])


def _smooth(row: dict[int, float], width: int, per_day: int) -> dict[int, float]:
    if width <= 0:
        return row
    out = {}
    for tod in row:
        near = [row[(tod + k) % per_day] for k in range(-width, width + 1) if (tod + k) % per_day in row]
        out[tod] = statistics.fmean(near)
    return out


def build_profile(
    slot: int,
    bins: Mapping[int, float],
    tz: ZoneInfo,
    *,
    shrink: float,
    min_day_coverage: float,
    trim: float = 0.5,
    smooth: int = 0,
) -> Profile:
    """The profile of ``bins`` (bin index → load, bins of ``slot`` seconds), see the module docstring."""
    # Per local day: slot of day -> values (two on the repeated autumn hour).
    days: dict[date, dict[int, list[float]]] = {}
    weekday: dict[date, int] = {}
    for index, value in bins.items():
        local = datetime.fromtimestamp(index * slot, tz)
        day = local.date()
        tod = (local.hour * 3600 + local.minute * 60 + local.second) // slot
        days.setdefault(day, {}).setdefault(tod, []).append(value)
        weekday[day] = local.weekday()

    levels: dict[date, float] = {}
    overall = statistics.fmean(bins.values()) if bins else 0.0
    for day, slots in days.items():
        start = datetime.combine(day, datetime.min.time(), tz).timestamp()
        end = datetime.combine(date.fromordinal(day.toordinal() + 1), datetime.min.time(), tz).timestamp()
        count = sum(len(v) for v in slots.values())
        if count / _day_bins(start, end, slot) >= min_day_coverage:
            levels[day] = statistics.fmean(x for v in slots.values() for x in v)
    full = sorted(levels)

    def level(day: date) -> float:
        if day in levels:
            return levels[day]
        if full:  # a partial day (history starts or ends mid-day, an outage) borrows the nearest level
            nearest = min(full, key=lambda d: abs(d.toordinal() - day.toordinal()))
            return levels[nearest]
        return overall

    same: dict[tuple[int, int], list[float]] = {}
    every: dict[int, list[float]] = {}
    for day, slots in days.items():
        base = level(day)
        for tod, seen in slots.items():
            mean = statistics.fmean(seen)
            rel = mean / base if base > 0 else 0.0
            same.setdefault((weekday[day], tod), []).append(rel)
            every.setdefault(tod, []).append(rel)

    per_day = max(1, 86400 // slot)
    overall_shape = {tod: _center(v, trim) for tod, v in every.items()}
    values: dict[tuple[int, int], float] = {}
    for wd in range(7):
        row = {}
        for tod, all_days in overall_shape.items():
            own = same.get((wd, tod))
            if own:
                n = len(own)
                row[tod] = (n * _center(own, trim) + shrink * all_days) / (n + shrink)
            else:
                row[tod] = all_days
        for tod, value in _smooth(row, smooth, per_day).items():
            values[(wd, tod)] = value
    counts = sorted(len(v) for v in same.values())
    weeks = counts[len(counts) // 2] if counts else 0
    return Profile(slot=slot, tz=tz, values=values, weeks=weeks, days=len(levels))
