"""Where does a restart window chosen from history lose to hindsight? Per hidden week, on real traces.

For each service of a set (default ``tune``: this script is for diagnosis, and the held-out sets are
only scored by benchmarks/windows.py) and each hidden week (as in benchmarks/windows.py), the extra
load over each day's quietest 2-hour window, % of the mean load, of windows chosen by:

* ``naive``: the benchmark's naive profile (each time of day's median over all history days);
* ``pooled``: the lowest mean of the per-day window loads over all history days;
* ``recent``: the same over the last 7 history days only (a level or shape drift would favour it);
* ``wk/we``: the same, weekdays and weekends apart (a weekly effect would favour it);
* ``hindsight``: the hidden week's own mean shape, as in benchmarks/windows.py;
* ``cross``: each hidden day scored by the window that the *other six* days of its week choose: the
  week's own shape without the scored day's noise. Where ``cross`` is no better than ``pooled``, the
  gap to ``hindsight`` is each day's own noise, which no history can know.

``--weeks`` prints every hidden week's figures (newest first). Run:
``.venv/bin/python benchmarks/windows_diagnose.py [--set tune] [--duration 2h] [--weeks]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parent))

from windows import TRACES, Actual, hidden_weeks, load, midnight, naive_offset

from loadline.windows import parse_duration

COLUMNS = ("naive", "pooled", "recent", "wk/we", "hindsight", "cross")

#: Per local day: the mean load of the window starting at each bin of the day (None: a gap).
Loads = dict[date, list[float | None]]


def day_loads(actual: Actual, zone: ZoneInfo, first: date, last: date, span: float) -> Loads:
    out: Loads = {}
    day = first
    while day <= last:
        start = int(midnight(day, zone))
        out[day] = [actual.mean(t, t + span) for t in range(start, start + 86400, actual.slot)]
        day += timedelta(days=1)
    return out


def lowest_mean(loads: Loads, days: Sequence[date]) -> int | None:
    """The start bin whose window has the lowest mean load over ``days`` (seen on 80 % of them)."""
    best: tuple[float, int] | None = None
    for index in range(len(next(iter(loads.values())))):
        values = [v for d in days if (v := loads[d][index]) is not None]
        if not values or len(values) < 0.8 * len(days):
            continue
        mean = statistics.fmean(values)
        if best is None or mean < best[0]:
            best = (mean, index)
    return None if best is None else best[1]


def extra(
    loads: Loads, day_mean: dict[date, float | None], days: Sequence[date], pick: Mapping[date, int | None]
) -> float | None:
    """Extra load (%) of the windows ``pick`` chose (start bin by day) over each day's quietest."""
    added = total = 0.0
    for day in days:
        index = pick[day]
        known = [v for v in loads[day] if v is not None]
        mean = day_mean[day]
        if index is None or not known or mean is None or (value := loads[day][index]) is None:
            continue
        added += value - min(known)
        total += mean
    return 100 * added / total if total else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("tune", "held-out", "unseen", "all"), default="tune")
    parser.add_argument("--duration", default="2h")
    parser.add_argument("--weeks", action="store_true", help="print every hidden week")
    args = parser.parse_args()
    span = parse_duration(args.duration).total_seconds()
    print(f"{args.duration} windows: extra load over each day's quietest window, % of the mean load")
    print(f"{'service':<18}{'weeks':>6}" + "".join(f"{c:>10}" for c in COLUMNS))
    means: dict[str, list[float]] = {c: [] for c in COLUMNS}
    for stem, tz, group, _what in TRACES:
        if args.set != "all" and group != args.set:
            continue
        zone = ZoneInfo(tz)
        rows = load(stem)
        actual = Actual(rows)
        first = datetime.fromtimestamp(rows[0][0], zone).date()
        last = datetime.fromtimestamp(rows[-1][0], zone).date()
        loads = day_loads(actual, zone, first, last, span)
        day_mean = {
            d: actual.mean(midnight(d, zone), midnight(d + timedelta(days=1), zone), 0.5) for d in loads
        }
        per_week: list[dict[str, float]] = []
        for week in hidden_weeks(rows, zone, actual.slot):
            history = [
                d for d in loads if midnight(d, zone) < week.cut and any(v is not None for v in loads[d])
            ]
            offset = naive_offset([(t, v) for t, v in rows if t < week.cut], zone, span) // actual.slot
            pooled = lowest_mean(loads, history)
            recent = lowest_mean(loads, history[-7:])
            apart = {
                weekend: lowest_mean(loads, [d for d in history if (d.weekday() >= 5) == weekend])
                for weekend in (False, True)
            }
            hindsight = lowest_mean(loads, week.days)
            picks = {
                "naive": dict.fromkeys(week.days, offset),
                "pooled": dict.fromkeys(week.days, pooled),
                "recent": dict.fromkeys(week.days, recent),
                "wk/we": {d: apart[d.weekday() >= 5] for d in week.days},
                "hindsight": dict.fromkeys(week.days, hindsight),
                "cross": {d: lowest_mean(loads, [o for o in week.days if o != d]) for d in week.days},
            }
            figures = {c: extra(loads, day_mean, week.days, picks[c]) for c in COLUMNS}
            if any(v is None for v in figures.values()):
                continue
            per_week.append({k: v for k, v in figures.items() if v is not None})
            if args.weeks:
                print(
                    f"  {week.days[0]}  " + " " * 14 + "".join(f"{figures[c] or 0:>10.1f}" for c in COLUMNS)
                )
        if not per_week:
            continue
        row = {c: statistics.fmean(w[c] for w in per_week) for c in COLUMNS}
        for c in COLUMNS:
            means[c].append(row[c])
        print(f"{stem:<18}{len(per_week):>6}" + "".join(f"{row[c]:>10.1f}" for c in COLUMNS), flush=True)
    print(f"{'mean per service':<24}" + "".join(f"{statistics.fmean(v):>10.1f}" for v in means.values()))


if __name__ == "__main__":
    main()
