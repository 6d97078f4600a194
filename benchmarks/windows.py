"""How much load do the learned restart windows carry? Rolling-origin validation on real traffic.

For each service (one trace in benchmarks/data/traces/, see its README.md) and for each whole week
with at least ``MIN_HISTORY_DAYS`` of history before it, the week is hidden: windows are chosen from
the history before it only, and each hidden day's window is scored by the load that really arrived
in it. The figure is the **extra load**: the load in the chosen windows minus that in each day's
quietest window (known only in hindsight), as a share of the mean load (of an average window of the
same length), summed over the hidden week's days. 0 % is perfect hindsight day by day.

Four ways to choose, per service:

* ``learner``: ``loadline.windows.plan_windows`` with its defaults;
* ``naive``: the median of each time of day over all history days (one window, the same every day);
* ``02:00``: a fixed window from 02:00 local time;
* ``hindsight``: the hidden week's own mean shape (one window, the same every day): what a perfect
  profile could do without knowing each day's luck.

Each figure is the mean over the service's hidden weeks, ± their standard deviation (the spread);
the last column is the learner's difference to the naive profile, ± its standard error over the weeks.
Services are split in sets, by service: ``tune`` (the only ones benchmarks/windows_tune.py
reads), ``held-out`` (never looked at while tuning) and ``unseen`` (added later, scored before any
change was made with them in view). Run:
``.venv/bin/python benchmarks/windows.py [--duration 2h] [--set tune|held-out|unseen|all]``.
"""

from __future__ import annotations

import argparse
import gzip
import math
import statistics
import time as clock
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from loadline.windows import Tuning, combine_series, parse_duration, plan_windows

DATA = Path(__file__).resolve().parent / "data" / "traces"

#: (file stem, time zone the days are judged in, set, what it is). The split is by service and was
#: fixed before any tuning: the Twitter and taxi traces tune; the LLM, load-balancer and web-server
#: traces are held out; the ``unseen`` traces were added later and scored before any change was
#: made with them in view (docs/restarts.md).
TRACES = (
    ("nab-tweets-aapl", "America/New_York", "tune", "Twitter mentions, 5 min, 8 weeks"),
    ("nab-tweets-amzn", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-crm", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-cvs", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-fb", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-goog", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-ibm", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-ko", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-pfe", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-ups", "America/New_York", "tune", "Twitter mentions"),
    ("nab-nyc-taxi", "America/New_York", "tune", "NYC taxi passengers, 30 min, 7 months"),
    ("servegen-m-large", "Asia/Shanghai", "held-out", "LLM API requests (Alibaba), 10 min, 2 weeks"),
    ("servegen-m-mid", "Asia/Shanghai", "held-out", "LLM API requests (Alibaba), 10 min, 2 weeks"),
    ("servegen-m-small", "Asia/Shanghai", "held-out", "LLM API requests (Alibaba), 10 min, 2 weeks"),
    ("nab-elb-requests", "UTC", "held-out", "AWS load balancer requests, 5 min, 2 weeks"),
    ("nasa-http", "America/New_York", "held-out", "NASA web server requests, 5 min, 2 months (1995)"),
    ("worldcup98", "Europe/Paris", "unseen", "1998 World Cup web site requests, 5 min, 12 weeks"),
    ("twitter-stream", "UTC", "unseen", "Twitter sample stream events, 5 min, 3 weeks (2021)"),
)
METHODS = ("learner", "naive", "fixed", "hindsight")
#: A week is hidden only with at least this much history (calendar days) before it.
MIN_HISTORY_DAYS = 7
#: A window is scored only where this share of its bins has data (chosen and quietest alike).
MIN_COVERAGE = 0.9


def load(stem: str) -> list[tuple[float, float]]:
    with gzip.open(DATA / f"{stem}.csv.gz", "rt") as f:
        return [(float(t), float(v)) for t, v in (line.split(",") for line in f.read().split()[1:])]


def midnight(day: date, zone: ZoneInfo) -> float:
    return datetime.combine(day, time(0), zone).timestamp()


class Actual:
    """The load that really arrived, by bin, with prefix sums for window means."""

    def __init__(self, rows: list[tuple[float, float]]) -> None:
        self.slot, bins = combine_series([rows])
        self.first = min(bins)
        last = max(bins)
        self.sums = [0.0]
        self.counts = [0]
        for index in range(self.first, last + 1):
            value = bins.get(index)
            self.sums.append(self.sums[-1] + (value or 0.0))
            self.counts.append(self.counts[-1] + (value is not None))

    def _range(self, start: float, end: float) -> tuple[float, int, int]:
        a = min(max(0, int(start // self.slot) - self.first), len(self.counts) - 1)
        b = min(max(0, math.ceil(end / self.slot) - self.first), len(self.counts) - 1)
        return self.sums[b] - self.sums[a], self.counts[b] - self.counts[a], max(1, b - a)

    def mean(self, start: float, end: float, coverage: float = MIN_COVERAGE) -> float | None:
        """Mean load over [start, end), or None where under ``coverage`` of its bins have data."""
        total, count, width = self._range(start, end)
        width = max(width, math.ceil((end - start) / self.slot))
        if count == 0 or count < coverage * width:
            return None
        return total / count


@dataclass(frozen=True)
class Week:
    """One hidden week: its days, and the instant the history stops (its first midnight)."""

    cut: float
    days: tuple[date, ...]


def hidden_weeks(rows: list[tuple[float, float]], zone: ZoneInfo, slot: int) -> Iterator[Week]:
    """Whole local weeks counted back from the last whole day, while the history before them spans
    ``MIN_HISTORY_DAYS``."""
    start = datetime.fromtimestamp(rows[0][0], zone)
    late = start.hour * 3600 + start.minute * 60 + start.second >= slot  # the first day is partial
    first = start.date() + timedelta(days=1 if late else 0)
    last = datetime.fromtimestamp(rows[-1][0] + slot, zone).date() - timedelta(days=1)
    end = last
    while (end - first).days + 1 >= 7 + MIN_HISTORY_DAYS:
        days = tuple(end - timedelta(days=6 - i) for i in range(7))
        yield Week(midnight(days[0], zone), days)
        end -= timedelta(days=7)


def naive_offset(history: list[tuple[float, float]], zone: ZoneInfo, span: float) -> int:
    """Seconds after local midnight of the quietest window of the median-by-time-of-day profile."""
    slot, bins = combine_series([history])
    by_tod: dict[int, list[float]] = {}
    for index, value in bins.items():
        local = datetime.fromtimestamp(index * slot, zone)
        by_tod.setdefault((local.hour * 3600 + local.minute * 60) // slot, []).append(value)
    profile = {tod: statistics.median(v) for tod, v in by_tod.items()}
    per_day = 86400 // slot
    width = max(1, round(span / slot))
    best = min(
        range(per_day),
        key=lambda s: statistics.fmean(profile.get((s + k) % per_day, math.inf) for k in range(width)),
    )
    return best * slot


def score_week(
    actual: Actual,
    history: list[tuple[float, float]],
    week: Week,
    zone: ZoneInfo,
    span: float,
    tuning: Tuning,
    methods: tuple[str, ...] = METHODS,
) -> dict[str, float] | None:
    """Extra load (% of the mean load) of each method over the week's days; None without a day that
    can be scored fairly (the hidden data has gaps there)."""
    slot = actual.slot
    per_day = {
        day: [
            actual.mean(t, t + span)
            for t in range(int(midnight(day, zone)), int(midnight(day, zone)) + 86400, slot)
        ]
        for day in week.days
    }
    starts: dict[str, dict[date, float]] = {}
    if "learner" in methods:
        plan = plan_windows(history, timedelta(seconds=span), zone, now=week.cut, tuning=tuning)
        starts["learner"] = {w.start.date(): w.start.timestamp() for w in plan.windows}
    if "naive" in methods:
        offset = naive_offset(history, zone, span)
        starts["naive"] = {day: midnight(day, zone) + offset for day in week.days}
    if "fixed" in methods:
        starts["fixed"] = {day: datetime.combine(day, time(2), zone).timestamp() for day in week.days}
    if "hindsight" in methods:
        seen = [day for day in week.days if any(v is not None for v in per_day[day])]
        totals = []
        for i in range(86400 // slot):
            values = [per_day[day][i] for day in seen]
            totals.append(math.inf if any(v is None for v in values) else sum(v or 0.0 for v in values))
        best = min(range(len(totals)), key=lambda i: totals[i])
        starts["hindsight"] = {day: midnight(day, zone) + best * slot for day in week.days}
    extra = dict.fromkeys(methods, 0.0)
    mean_load = 0.0
    scored = 0
    for day in week.days:
        known = [v for v in per_day[day] if v is not None]
        day_mean = actual.mean(midnight(day, zone), midnight(day + timedelta(days=1), zone), 0.5)
        if not known or day_mean is None:
            continue
        oracle = min(known)
        realized = {}
        for method in methods:
            start = starts[method].get(day)
            realized[method] = None if start is None else actual.mean(start, start + span)
        if any(v is None for v in realized.values()):
            continue  # a gap in the hidden data: no fair score for that day
        scored += 1
        mean_load += day_mean
        for method, value in realized.items():
            extra[method] += (value or 0.0) - oracle
    if not scored or mean_load <= 0:
        return None
    return {method: 100 * value / mean_load for method, value in extra.items()}


def evaluate(
    stem: str,
    tz: str,
    span: float,
    tuning: Tuning | None = None,
    *,
    methods: tuple[str, ...] = METHODS,
    rows: list[tuple[float, float]] | None = None,
    history_days: float | None = None,
) -> list[dict[str, float]]:
    """Each hidden week's extra load per method, newest week first. ``history_days`` keeps only that
    much history before each hidden week (a young service), for benchmarks/windows_tune.py."""
    zone = ZoneInfo(tz)
    rows = load(stem) if rows is None else rows
    actual = Actual(rows)
    out = []
    for week in hidden_weeks(rows, zone, actual.slot):
        begin = -math.inf if history_days is None else week.cut - history_days * 86400
        history = [(t, v) for t, v in rows if begin <= t < week.cut]
        result = score_week(actual, history, week, zone, span, tuning or Tuning(), methods)
        if result is not None:
            out.append(result)
    return out


def summary(weeks: list[dict[str, float]], method: str) -> tuple[float, float]:
    values = [w[method] for w in weeks]
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def paired(weeks: list[dict[str, float]]) -> tuple[float, float]:
    """The learner's mean difference to the naive profile over the hidden weeks, ± its standard
    error (the weeks' spread of that difference over the square root of their number): a service
    whose difference is within about two standard errors of 0 does not tell the two apart."""
    diffs = [w["learner"] - w["naive"] for w in weeks]
    if len(diffs) < 2:
        return statistics.fmean(diffs), math.nan
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="2h", help="window length (default 2h)")
    parser.add_argument("--set", choices=("tune", "held-out", "unseen", "all"), default="all")
    args = parser.parse_args()
    span = parse_duration(args.duration).total_seconds()
    began = clock.perf_counter()
    print(
        f"restart window {args.duration}: extra load over each day's quietest window, % of the mean load "
        "(mean over hidden weeks ± spread)"
    )
    header = "".join(f"{m if m != 'fixed' else '02:00':>15}" for m in METHODS)
    print(f"{'service':<18} {'set':<8} {'weeks':>5}{header}{'learner-naive':>16}")
    per_set: dict[str, dict[str, list[float]]] = {}
    for stem, tz, group, _what in TRACES:
        if args.set != "all" and group != args.set:
            continue
        weeks = evaluate(stem, tz, span)
        cells = []
        for method in METHODS:
            mean, sd = summary(weeks, method)
            per_set.setdefault(group, {}).setdefault(method, []).append(mean)
            spread = "     " if math.isnan(sd) else f"±{sd:4.1f}"
            cells.append(f"{mean:>9.1f} {spread}")
        diff, se = paired(weeks)
        cells.append(f"{diff:>+9.1f} " + ("     " if math.isnan(se) else f"±{se:4.1f}"))
        print(f"{stem:<18} {group:<8} {len(weeks):>5}" + "".join(cells), flush=True)
    for group, by_method in per_set.items():
        means = "".join(f"{statistics.fmean(v):>9.1f}      " for v in by_method.values())
        print(f"{'mean per service':<18} {group:<8} {'':>5}{means}")
        worst = max(a - b for a, b in zip(by_method["learner"], by_method["naive"], strict=True))
        better = sum(a < b for a, b in zip(by_method["learner"], by_method["naive"], strict=True))
        print(
            f"{'':<18} {group:<8} learner - naive: worst service {worst:+.1f} points; "
            f"better on {better} of {len(by_method['naive'])}"
        )
    print(f"({clock.perf_counter() - began:.1f} s)")


if __name__ == "__main__":
    main()
