"""The expected load at each wall-clock slot of each weekday, learned robustly from history.

With a short history (``normalize``), each local day's bins are divided by that day's level (its mean
load), so that with one week a single busy day does not set the shape. With two weeks or more the
bins are divided by the overall mean instead: the medians below already discard an odd day, and a
restart disturbs requests, not shares of a day, so the quiet time of the busy days should count for
more than that of a nearly idle day (cross-validated on the tuning traces, docs/restarts.md). The
optional ``half_life_days`` weighs recent days more and ``quantile`` replaces the median by another
quantile; both were tried and are off by default. For every (weekday, time of day) the profile takes the
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


def _quantile(pairs: list[tuple[float, float]], q: float) -> float:
    """Weighted ``q``-quantile of ``(value, weight)`` pairs: each value sits at the middle of its
    weight's share of the total, and ``q`` is interpolated between them (equal weights and q = 0.5:
    the ordinary median)."""
    ordered = sorted(pairs)
    total = sum(w for _, w in ordered)
    if total <= 0:
        return statistics.median(v for v, _ in ordered)
    position = 0.0
    previous: tuple[float, float] | None = None
    for value, weight in ordered:
        middle = (position + weight / 2) / total
        position += weight
        if q <= middle:
            if previous is None:
                return value
            span = middle - previous[1]
            share = (q - previous[1]) / span if span > 0 else 1.0
            return previous[0] + share * (value - previous[0])
        previous = (value, middle)
    return ordered[-1][0]


def _center(pairs: list[tuple[float, float]], trim: float, quantile: float) -> float:
    """The typical value of ``(value, weight)`` pairs across days: the ``quantile`` when ``trim`` is
    0.5, else the mean of what is left after cutting ``trim`` of the weight off each end."""
    if trim >= 0.5:
        if quantile == 0.5 and len({w for _, w in pairs}) == 1:
            return statistics.median(v for v, _ in pairs)
        return _quantile(pairs, quantile)
    ordered = sorted(pairs)
    cut = int(len(ordered) * trim)
    kept = ordered[cut : len(ordered) - cut]
    return sum(v * w for v, w in kept) / sum(w for _, w in kept)


def _smooth(row: dict[int, float], width: int, per_day: int) -> dict[int, float]:
    if width <= 0:
        return row
    out = {}
    for tod in row:
        near = [row[(tod + k) % per_day] for k in range(-width, width + 1) if (tod + k) % per_day in row]
        out[tod] = statistics.fmean(near)
    return out


@dataclass(frozen=True)
class _Days:
    """The history cut into local days, each with the level its bins are divided by."""

    #: Per local day: slot of day -> values (two on the repeated autumn hour).
    slots: dict[date, dict[int, list[float]]]
    weekday: dict[date, int]
    #: The divisor of each day's bins (its own mean, a borrowed one, or the overall mean).
    base: dict[date, float]
    #: Days with enough bins to set their own level.
    full: int


def _split_days(
    slot: int, bins: Mapping[int, float], tz: ZoneInfo, min_day_coverage: float, normalize: bool
) -> _Days:
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
        if not normalize:
            return overall
        if day in levels:
            return levels[day]
        if full:  # a partial day (history starts or ends mid-day, an outage) borrows the nearest level
            nearest = min(full, key=lambda d: abs(d.toordinal() - day.toordinal()))
            return levels[nearest]
        return overall

    return _Days(days, weekday, {day: level(day) for day in days}, len(levels))


def _recency(days: _Days, half_life_days: float | None) -> dict[date, float]:
    newest = max(days.slots, default=date.min).toordinal()
    if half_life_days is None:
        return dict.fromkeys(days.slots, 1.0)
    return {day: 0.5 ** ((newest - day.toordinal()) / half_life_days) for day in days.slots}


def _blend(
    same: Mapping[tuple[int, int], list[tuple[float, float]]],
    every: Mapping[int, list[tuple[float, float]]],
    *,
    shrink: float,
    trim: float,
    quantile: float,
    min_weekday_days: int,
) -> dict[int, dict[int, float]]:
    """Per weekday, per slot: the weekday's own centre shrunk toward the all-days centre."""
    overall_shape = {tod: _center(v, trim, quantile) for tod, v in every.items()}
    rows: dict[int, dict[int, float]] = {}
    for wd in range(7):
        row = {}
        for tod, all_days in overall_shape.items():
            own = same.get((wd, tod))
            if own and len(own) >= min_weekday_days:
                n = len(own)
                row[tod] = (n * _center(own, trim, quantile) + shrink * all_days) / (n + shrink)
            else:
                row[tod] = all_days
        rows[wd] = row
    return rows


def build_profile(
    slot: int,
    bins: Mapping[int, float],
    tz: ZoneInfo,
    *,
    shrink: float,
    min_day_coverage: float,
    trim: float = 0.5,
    smooth: int = 0,
    quantile: float = 0.5,
    half_life_days: float | None = None,
    normalize: bool = True,
    min_weekday_days: int = 1,
) -> Profile:
    """The profile of ``bins`` (bin index → load, bins of ``slot`` seconds), see the module docstring."""
    split = _split_days(slot, bins, tz, min_day_coverage, normalize)
    weights = _recency(split, half_life_days)
    same: dict[tuple[int, int], list[tuple[float, float]]] = {}
    every: dict[int, list[tuple[float, float]]] = {}
    for day, slots in split.slots.items():
        base = split.base[day]
        w = weights[day]
        for tod, seen in slots.items():
            mean = statistics.fmean(seen)
            rel = mean / base if base > 0 else 0.0
            same.setdefault((split.weekday[day], tod), []).append((rel, w))
            every.setdefault(tod, []).append((rel, w))

    per_day = max(1, 86400 // slot)
    rows = _blend(same, every, shrink=shrink, trim=trim, quantile=quantile, min_weekday_days=min_weekday_days)
    values: dict[tuple[int, int], float] = {}
    for wd, row in rows.items():
        for tod, value in _smooth(row, smooth, per_day).items():
            values[(wd, tod)] = value
    counts = sorted(len(v) for v in same.values())
    weeks = counts[len(counts) // 2] if counts else 0
    return Profile(slot=slot, tz=tz, values=values, weeks=weeks, days=split.full)
