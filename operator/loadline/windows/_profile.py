"""The expected load of every window of a given length, by time of day, learned from day-to-day noise.

A restart disturbs the requests that arrive during the whole window, so each history day's load is
integrated over the window itself (the mean of its bins, running past midnight into the next day's
real bins), one value per local day and wall-clock start; a window is then judged by those per-day
values, never by a point or by a profile of per-slot medians. Five rules, each from the noise between
days rather than a fitted constant:

* **Weekdays and weekends, as far as the noise allows.** From two weeks of history on, weekdays
  (Mon–Fri) and weekends (Sat–Sun) are learned apart, and each group's expected window loads are
  shrunk towards all days' by empirical Bayes (``_shrunk``): a slot keeps ``τ² / (τ² + se²)`` of its
  difference from the pooled estimate, where ``se²`` is that difference's sampling variance (the
  group's day-to-day spread over its days) and ``τ²`` the variance of the real weekly effect across
  slots (mean squared difference minus mean ``se²``). A weekly rhythm far above the noise is kept
  whole, one weekend's luck is shrunk away, and no threshold decides. Under two weeks days are pooled.
* **Bursts by their risk.** A window's expected load is its days' mean after clipping the highest
  (and lowest) days: at least ``1 - burst_quantile`` of the weight on each side is clipped to the
  next day's value. The mean, not the median, is what a restart meets, so a burst hour that recurs
  on more days than that raises its window's expected load by what it really adds; a single day's
  burst (one week's luck) is clipped away.
* **Drift.** With ``half_life_days`` each day's weight halves every that many days of age, so a level
  or shape that moved is followed; the half-life is chosen on the tuning traces (docs/restarts.md).
* **Steadiness among equals.** Kept per window: the per-day values, so the planner compares two
  windows day by day (paired: a busy day raises both) and, among windows within ``steadiness_z``
  standard errors of the best, takes the one whose load varies least across days, unless the
  all-days median profile's window (``typical``, the choice that needs no evidence) is among them.
* **Checked on past weeks.** ``Profile.validated`` says whether following these rules would have
  carried no more load than the median profile in the newest weeks, each judged from the history
  before it alone (rolling origin); with under two weeks nothing can be checked, and the planner
  keeps the median profile's window.

Loads are kept in the history's own units (a busy day's quiet time counts for more than an idle
day's: a restart disturbs requests, not shares of a day); ``level`` converts them to multiples of the
mean load. Slots are wall-clock times in the plan's time zone (``zoneinfo``): 03:00 means 03:00 on
both sides of a daylight-saving change, while a window always lasts its real length.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

__all__ = ["Profile", "WindowStats", "build_profile", "paired_standard_error", "winsorized_mean"]

#: Weekday index (Monday = 0) -> group from two weeks of history on: Mon–Fri and Sat–Sun.
_WEEK_GROUPS = (0, 0, 0, 0, 0, 1, 1)
_POOLED = (0, 0, 0, 0, 0, 0, 0)


_K = TypeVar("_K", int, float)


@dataclass(frozen=True)
class WindowStats:
    """What history says about windows starting at one wall-clock slot (of one group of days)."""

    #: Expected load (history's units): the clipped mean over days.
    expected: float
    #: Spread of the per-day loads (weighted standard deviation): the steadiness.
    spread: float
    #: Per day: (day ordinal, load, weight).
    days: tuple[tuple[int, float, float], ...]
    #: The window's load in the median profile (each wall-clock slot's median over the same days,
    #: averaged over the window): the choice that needs no evidence; None where slots are unknown.
    typical: float | None = None


@dataclass(frozen=True)
class Profile:
    """Expected load of windows of ``span`` bins by (weekday, wall-clock slot of their start)."""

    slot: int
    tz: ZoneInfo
    #: WindowStats length in bins (1: the per-slot forecast).
    span: int
    #: Mean load of the history (weighted as the days are), the unit of relative loads.
    level: float
    #: (group, slot of day) -> the windows starting there.
    windows: Mapping[tuple[int, int], WindowStats]
    #: Weekday -> group: all 0 when days are pooled.
    group_of: tuple[int, ...]
    #: Weekdays and weekends are learned apart and keep part of their own difference from all days.
    weekly: bool
    #: The share of the groups' own difference from all days that is kept, on average over their
    #: slots (empirical-Bayes shrinkage, ``_shrunk``): 0 pools, 1 keeps each group's own estimate.
    weekly_share: float
    #: Distinct weeks of history behind the profile.
    weeks: int
    #: Local days with at least one known window.
    days: int
    #: The learner's own choices beat the median profile's on weeks left out of the learning (see
    #: ``_validated``); when False the planner keeps the median profile's window.
    validated: bool
    #: How many of the newest weeks the learner was checked on (0: too little history before them).
    checked_weeks: int
    #: The learner's mean extra load over the median profile's in those weeks, in the history's
    #: units (negative: it carried less); None when nothing could be checked.
    gain: float | None
    #: Group -> the most days behind any of its windows (a window known on far fewer days is not
    #: compared with it).
    most_days: Mapping[int, int]

    def key(self, t: float) -> tuple[int, int]:
        """(weekday, wall-clock slot of day) of the instant ``t`` (unix seconds)."""
        local = datetime.fromtimestamp(t, self.tz)
        return local.weekday(), (local.hour * 3600 + local.minute * 60 + local.second) // self.slot

    def window(self, t: float, min_share: float = 0.0) -> WindowStats | None:
        """What history says about the window starting at ``t``, or None when it was never seen (or
        seen on fewer than ``min_share`` of the days of the best-seen window of its group)."""
        weekday, tod = self.key(t)
        group = self.group_of[weekday]
        stats = self.windows.get((group, tod))
        if stats is None or len(stats.days) < min_share * self.most_days.get(group, 0):
            return None
        return stats

    def at(self, t: float) -> float | None:
        """Expected load of the window starting at ``t`` relative to the mean load (1.0)."""
        w = self.window(t)
        if w is None:
            return None
        return w.expected / self.level if self.level > 0 else 0.0


def _weighted_median(pairs: Sequence[tuple[float, float]]) -> float:
    ordered = sorted(pairs)
    total = sum(w for _, w in ordered)
    acc = 0.0
    for value, weight in ordered:
        acc += weight
        if acc >= total / 2:
            return value
    return ordered[-1][0]


def _clip_value(ordered: Sequence[tuple[float, float]], share: float, total: float) -> float:
    """The value that the days beyond it (at least ``share`` of the weight, one day or more) are
    clipped to, counting from the start of ``ordered``."""
    beyond = 0.0
    for value, weight in ordered:
        if beyond >= share * total - 1e-12 and beyond > 0:
            return value
        beyond += weight
    return ordered[-1][0]


def winsorized(pairs: Sequence[tuple[float, float]], quantile: float) -> list[tuple[float, float]]:
    """``(value, weight)`` pairs with at least ``1 - quantile`` of the weight (one value at the least)
    at each end clipped to the next value inward; all of them at the weighted median for ``quantile``
    0.5 or less, none for 1 or with under three values."""
    total = sum(w for _, w in pairs)
    if quantile >= 1.0 or len(pairs) < 3 or total <= 0:
        return list(pairs)
    if quantile <= 0.5:
        median = _weighted_median(pairs)
        return [(median, w) for _, w in pairs]
    ordered = sorted(pairs)
    low = _clip_value(ordered, 1.0 - quantile, total)
    high = _clip_value(ordered[::-1], 1.0 - quantile, total)
    if low > high:  # so few values that the two clips cross: the median is what is left
        median = _weighted_median(pairs)
        return [(median, w) for _, w in pairs]
    return [(min(high, max(low, v)), w) for v, w in pairs]


def winsorized_mean(pairs: Sequence[tuple[float, float]], quantile: float) -> float:
    """Mean of ``(value, weight)`` pairs after clipping their ends (:func:`winsorized`): ``quantile``
    1 is the plain mean and 0.5 or less the weighted median. A burst on one day of seven moves it not
    at all; a burst on more days than the clipped share raises it by what those days really add."""
    if not pairs:
        raise ValueError("no values")
    total = sum(w for _, w in pairs)
    if total <= 0:
        return statistics.fmean(v for v, _ in pairs)
    return sum(v * w for v, w in winsorized(pairs, quantile)) / total


def _spread(pairs: Sequence[tuple[float, float]]) -> float:
    total = sum(w for _, w in pairs)
    if total <= 0 or len(pairs) < 2:
        return 0.0
    mean = sum(v * w for v, w in pairs) / total
    return math.sqrt(sum(w * (v - mean) ** 2 for v, w in pairs) / total)


@dataclass(frozen=True)
class _History:
    """Per local day (ordinal): weekday, weight, and the load of each window by slot of day."""

    weekday: dict[int, int]
    weight: dict[int, float]
    #: slot of day -> day ordinal -> the window's mean load.
    loads: dict[int, dict[int, float]]
    level: float


def _day_loads(
    slot: int, bins: Mapping[int, float], tz: ZoneInfo, span: int, min_coverage: float
) -> tuple[dict[int, int], dict[int, dict[int, float]]]:
    """WindowStats loads per (slot of day, day): the mean of the window's bins where at least
    ``min_coverage`` of them were observed (a gap is never quiet)."""
    first, last = min(bins), max(bins)
    sums = [0.0]
    counts = [0]
    for index in range(first, last + 1):
        value = bins.get(index)
        sums.append(sums[-1] + (value or 0.0))
        counts.append(counts[-1] + (value is not None))
    weekday: dict[int, int] = {}
    loads: dict[int, dict[int, float]] = {}
    day = datetime.fromtimestamp(first * slot, tz).date()
    end_day = datetime.fromtimestamp(last * slot, tz).date()
    need = max(1, math.ceil(min_coverage * span - 1e-9))
    while day <= end_day:
        begin = datetime.combine(day, time(0), tz).timestamp()
        stop = datetime.combine(day + timedelta(days=1), time(0), tz).timestamp()
        ordinal = day.toordinal()
        for index in range(max(first, math.ceil(begin / slot)), min(last + 1, math.ceil(stop / slot))):
            a = index - first
            b = min(a + span, last + 1 - first)
            n = counts[b] - counts[a]
            if n < need:
                continue
            local = datetime.fromtimestamp(index * slot, tz)
            tod = (local.hour * 3600 + local.minute * 60 + local.second) // slot
            loads.setdefault(tod, {}).setdefault(ordinal, (sums[b] - sums[a]) / n)  # repeated hour: first
            weekday[ordinal] = day.weekday()
        day += timedelta(days=1)
    return weekday, loads


def _history(
    slot: int,
    bins: Mapping[int, float],
    tz: ZoneInfo,
    span: int,
    min_coverage: float,
    half_life_days: float | None,
) -> _History:
    weekday, loads = _day_loads(slot, bins, tz, span, min_coverage)
    newest = max(weekday, default=0)
    weight = {d: 1.0 if half_life_days is None else 0.5 ** ((newest - d) / half_life_days) for d in weekday}
    total = sum(weight[d] for by_day in loads.values() for d in by_day)
    level = (
        sum(v * weight[d] for by_day in loads.values() for d, v in by_day.items()) / total if total else 0.0
    )
    return _History(weekday, weight, loads, level)


def _expected(
    history: _History, days: Iterable[int] | None, quantile: float
) -> dict[int, tuple[float, list[tuple[float, float]]]]:
    """Per slot of day: (expected window load, [(load, weight)]) over ``days`` (None: all)."""
    keep = None if days is None else set(days)
    out = {}
    for tod, by_day in history.loads.items():
        pairs = [(v, history.weight[d]) for d, v in by_day.items() if keep is None or d in keep]
        if pairs:
            out[tod] = (winsorized_mean(pairs, quantile), pairs)
    return out


def _shrunk(
    pooled: Mapping[int, tuple[float, list[tuple[float, float]]]],
    own: Mapping[int, tuple[float, list[tuple[float, float]]]],
    quantile: float,
) -> tuple[dict[int, float], float]:
    """A group's expected window loads shrunk towards all days' (empirical Bayes), and the share of
    the group's own difference kept on average.

    At each slot the group's estimate differs from the pooled one by its real weekly effect plus
    sampling noise, whose variance is the group's day-to-day spread over its effective number of
    days (``se²``). Across slots, the mean of ``difference² - se²`` estimates the variance of the real
    effect (``τ²``, floored at 0), and each slot keeps ``τ² / (τ² + se²)`` of its difference: all of a
    weekly rhythm that stands far above the noise, none of one that the noise explains (one weekend's
    luck), and in between what the evidence supports. No threshold, no tuned constant."""
    rows: dict[int, tuple[float, float, float]] = {}
    for tod, (expected, pairs) in own.items():
        if tod not in pooled:
            continue
        total = sum(w for _, w in pairs)
        if len(pairs) < 2 or total <= 0:
            se2 = math.inf
        else:
            n_eff = total**2 / sum(w * w for _, w in pairs)
            se2 = _spread(winsorized(pairs, quantile)) ** 2 / max(1.0, n_eff - 1.0)
        rows[tod] = (pooled[tod][0], expected - pooled[tod][0], se2)
    finite = [(d, se2) for _, d, se2 in rows.values() if math.isfinite(se2)]
    tau2 = max(0.0, statistics.fmean(d * d - se2 for d, se2 in finite)) if finite else 0.0
    out: dict[int, float] = {}
    kept: list[float] = []
    for tod, (base, diff, se2) in rows.items():
        share = tau2 / (tau2 + se2) if tau2 > 0 and math.isfinite(se2) else 0.0  # one day: no evidence
        out[tod] = base + share * diff
        kept.append(share)
    return out, statistics.fmean(kept) if kept else 0.0


def build_profile(
    slot: int,
    bins: Mapping[int, float],
    tz: ZoneInfo,
    *,
    span: int = 1,
    burst_quantile: float = 0.9,
    half_life_days: float | None = None,
    min_window_coverage: float = 0.9,
    weekly: bool = True,
    steadiness_z: float = 1.0,
    min_window_days: float = 0.5,
    validate: bool = True,
) -> Profile:
    """The profile of windows of ``span`` bins from ``bins`` (bin index → load, bins of ``slot``
    seconds); see the module docstring for the rules. ``validate``: check the learner's choices
    against the median profile's on left-out weeks (``Profile.validated``). ``weekly``: from two
    weeks of history on, weekdays and weekends are learned apart, each shrunk towards all days."""
    settings = {
        "span": span,
        "burst_quantile": burst_quantile,
        "half_life_days": half_life_days,
        "min_window_coverage": min_window_coverage,
        "weekly": weekly,
        "steadiness_z": steadiness_z,
        "min_window_days": min_window_days,
    }
    history = _history(slot, bins, tz, span, min_window_coverage, half_life_days)
    single = _day_loads(slot, bins, tz, 1, 1.0)[1] if span > 1 else history.loads
    per_day = max(1, 86400 // slot)
    weeks = len(history.weekday) // 7
    group_of = _WEEK_GROUPS if weekly and weeks >= 2 else _POOLED
    pooled = _expected(history, None, burst_quantile)
    kept_share = 0.0
    windows: dict[tuple[int, int], WindowStats] = {}
    # The anchor is the all-days median profile whatever the grouping: the choice that needs no
    # evidence, and the one the learner is checked against (weekly groups must beat it too).
    medians = {tod: statistics.median(by_day.values()) for tod, by_day in single.items() if by_day}
    for group in sorted(set(group_of)):
        members = [d for d, wd in history.weekday.items() if group_of[wd] == group]
        own = _expected(history, members, burst_quantile)
        shrunk, share = _shrunk(pooled, own, burst_quantile) if group_of != _POOLED else ({}, 0.0)
        kept_share = max(kept_share, share)
        for tod, (expected, pairs) in own.items():
            by_day = history.loads[tod]
            known = [m for k in range(span) if (m := medians.get((tod + k) % per_day)) is not None]
            windows[(group, tod)] = WindowStats(
                expected=shrunk.get(tod, expected),
                spread=_spread(winsorized(pairs, burst_quantile)),
                days=tuple((d, by_day[d], history.weight[d]) for d in members if d in by_day),
                typical=statistics.fmean(known) if len(known) >= min_window_coverage * span else None,
            )
    most: dict[int, int] = {}
    for (group, _tod), stats in windows.items():
        most[group] = max(most.get(group, 0), len(stats.days))
    gain, checked = _validated(slot, bins, tz, history, settings) if validate else (None, 0)
    return Profile(
        slot=slot,
        tz=tz,
        span=span,
        level=history.level,
        windows=windows,
        group_of=group_of,
        weekly=kept_share > 0,
        weekly_share=kept_share,
        weeks=weeks,
        days=len(history.weekday),
        validated=gain is not None and gain <= 0,
        checked_weeks=checked,
        gain=gain,
        most_days=most,
    )


def choose(
    known: Sequence[tuple[_K, WindowStats]], z: float, quantile: float, anchor: bool
) -> tuple[_K, WindowStats]:
    """The window to take among ``known`` (key, stats), keys ordered by time; ``known`` not empty.

    The windows whose expected load is within ``z`` standard errors of the lowest (day-by-day
    differences) are equal within noise. With ``anchor`` the median profile's window is kept when it
    is among them (it needs no evidence); otherwise the steadiest of them is taken. ``z`` = 0: the
    lowest expected load, nothing else."""
    best_key, best = min(known, key=lambda kw: (kw[1].expected, kw[0]))
    if z <= 0:
        return best_key, best
    equal = [
        (k, w)
        for k, w in known
        if w.expected - best.expected <= z * paired_standard_error(w, best, quantile) + 1e-12
    ]
    typical = [(k, w) for k, w in known if w.typical is not None]
    if anchor and typical:
        anchor_key, stats = min(typical, key=lambda kw: (kw[1].typical or 0.0, kw[0]))
        if any(k == anchor_key for k, _ in equal):
            return anchor_key, stats
    return min(equal, key=lambda kw: (kw[1].spread, kw[1].expected, kw[0]))


def median_choice(known: Sequence[tuple[_K, WindowStats]]) -> tuple[_K, WindowStats] | None:
    """The all-days median profile's window among ``known``: the choice that needs no evidence."""
    typical = [(k, w) for k, w in known if w.typical is not None]
    return min(typical, key=lambda kw: (kw[1].typical or 0.0, kw[0])) if typical else None


#: The learner is checked on this many of the newest weeks of history, each left out in turn.
_VALIDATION_WEEKS = 4


def _validated(
    slot: int, bins: Mapping[int, float], tz: ZoneInfo, history: _History, settings: Mapping[str, Any]
) -> tuple[float | None, int]:
    """Whether following the learner would have carried no more load than the median profile in the
    newest ``_VALIDATION_WEEKS`` weeks, each judged from the history before it only (rolling origin,
    as time runs: a drift is learned before it is checked). Both choose with every rule above from
    the weeks before, and the week's own days say which window carried less (recency-weighted like
    the days). A week is checked only with a week of history before it, so with under two weeks the
    learner cannot be checked and the median profile is kept."""
    newest = max(history.weekday, default=0)
    week_of = {d: (newest - d) // 7 for d in history.weekday}
    weeks = sorted(set(week_of.values()))
    if len(weeks) < 2:
        return None, 0
    day_of = {i: datetime.fromtimestamp(i * slot, tz).date().toordinal() for i in bins}
    z, q = settings["steadiness_z"], settings["burst_quantile"]
    gains: list[tuple[float, float]] = []
    for week in weeks[:_VALIDATION_WEEKS]:
        held = [d for d, w in week_of.items() if w == week]
        kept = {i: v for i, v in bins.items() if week_of.get(day_of[i], -1) > week}
        if len({day_of[i] for i in kept}) < 7:
            continue
        sub = build_profile(slot, kept, tz, **settings, validate=False)
        diffs: list[tuple[float, float]] = []
        for day in held:
            group = sub.group_of[history.weekday[day]]
            floor = settings["min_window_days"] * sub.most_days.get(group, 0)
            known = [(tod, w) for (g, tod), w in sub.windows.items() if g == group and len(w.days) >= floor]
            median = median_choice(known)
            if not known or median is None:
                continue
            learned = choose(known, z, q, anchor=True)[0]
            if learned == median[0]:
                diffs.append((0.0, history.weight[day]))
            elif day in history.loads.get(learned, {}) and day in history.loads.get(median[0], {}):
                diffs.append(
                    (history.loads[learned][day] - history.loads[median[0]][day], history.weight[day])
                )
        if diffs:
            total = sum(w for _, w in diffs)
            gains.append((sum(v * w for v, w in diffs) / total, total / len(diffs)))
    if not gains:
        return None, 0
    return sum(g * w for g, w in gains) / sum(w for _, w in gains), len(gains)


def paired_standard_error(a: WindowStats, b: WindowStats, quantile: float) -> float:
    """Standard error of the mean day-by-day difference of two windows' loads (days both know,
    clipped as the expected loads are, so that one day's burst is no more noise than it is signal;
    weighted, with the weights' effective number of days). Infinite with fewer than two such days."""
    other = {d: v for d, v, _ in b.days}
    diffs = winsorized([(v - other[d], w) for d, v, w in a.days if d in other], quantile)
    total = sum(w for _, w in diffs)
    if len(diffs) < 2 or total <= 0:
        return math.inf
    n_eff = total**2 / sum(w * w for _, w in diffs)
    return _spread(diffs) / math.sqrt(max(1.0, n_eff - 1.0))
