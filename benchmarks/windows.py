"""How quiet are the learned restart windows on real traffic? Prints realized ÷ oracle load per trace.

For each trace in benchmarks/data/traces/ (real production request counts, see its README.md) the
last seven whole local days are hidden. Windows are chosen from the history before them, and each
hidden day's chosen window is scored by the load that really arrived in it, divided by the load of
that day's quietest window known only in hindsight (the oracle): 1.00 is perfect. Each trace's score
is the sum over its hidden days of realized load over the sum of oracle load. Beside the learned
windows (``loadline.windows.plan_windows``) two baselines: a fixed window starting 02:00 local time,
and a naive profile (median of each time of day over all history days, the same window every day).

The traces are split: the ``tune`` traces were the only ones looked at while choosing the finder's
parameters; the ``report`` traces were scored once the parameters were fixed. Run:
``.venv/bin/python benchmarks/windows.py [--duration 2h]``.
"""

from __future__ import annotations

import argparse
import gzip
import math
import statistics
import time as clock
from datetime import date, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from loadline.windows import Tuning, combine_series, parse_duration, plan_windows

DATA = Path(__file__).resolve().parent / "data" / "traces"

#: (file stem, time zone the days are judged in, set, what it is)
TRACES = (
    ("nab-tweets-aapl", "America/New_York", "tune", "Twitter mentions, 5 min, 8 weeks"),
    ("nab-tweets-fb", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-goog", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-ibm", "America/New_York", "tune", "Twitter mentions"),
    ("nab-tweets-ko", "America/New_York", "tune", "Twitter mentions"),
    ("nab-nyc-taxi", "America/New_York", "tune", "NYC taxi passengers, 30 min, 7 months"),
    ("servegen-m-large", "Asia/Shanghai", "report", "LLM API requests (Alibaba), 10 min, 2 weeks"),
    ("servegen-m-mid", "Asia/Shanghai", "report", "LLM API requests (Alibaba), 10 min, 2 weeks"),
    ("servegen-m-small", "Asia/Shanghai", "report", "LLM API requests (Alibaba), 10 min, 2 weeks"),
    ("nab-elb-requests", "UTC", "report", "AWS load balancer requests, 5 min, 2 weeks"),
    ("nab-tweets-amzn", "America/New_York", "report", "Twitter mentions"),
    ("nab-tweets-crm", "America/New_York", "report", "Twitter mentions"),
    ("nab-tweets-cvs", "America/New_York", "report", "Twitter mentions"),
    ("nab-tweets-pfe", "America/New_York", "report", "Twitter mentions"),
    ("nab-tweets-ups", "America/New_York", "report", "Twitter mentions"),
    ("nasa-http", "America/New_York", "report", "NASA web server requests, 5 min, 2 months (1995)"),
)
HIDDEN_DAYS = 7
#: A window is scored only where this share of its bins has data (both chosen and oracle).
MIN_COVERAGE = 0.9


def load(stem: str) -> list[tuple[float, float]]:
    with gzip.open(DATA / f"{stem}.csv.gz", "rt") as f:
        return [(float(t), float(v)) for t, v in (line.split(",") for line in f.read().split()[1:])]


def midnight(day: date, zone: ZoneInfo) -> float:
    return datetime.combine(day, time(0), zone).timestamp()


class Actual:
    """The load that really arrived, by bin."""

    def __init__(self, rows: list[tuple[float, float]]) -> None:
        self.slot, self.bins = combine_series([rows])

    def mean(self, start: float, end: float) -> float | None:
        first, last = int(start // self.slot), math.ceil(end / self.slot)
        values = [self.bins[i] for i in range(first, last) if i in self.bins]
        if len(values) < MIN_COVERAGE * (last - first):
            return None
        return statistics.fmean(values)

    def oracle(self, day: date, zone: ZoneInfo, span: float) -> float | None:
        best = None
        for t in range(int(midnight(day, zone)), int(midnight(day + timedelta(days=1), zone)), self.slot):
            value = self.mean(t, t + span)
            if value is not None and (best is None or value < best):
                best = value
        return best


def naive_start(history: list[tuple[float, float]], zone: ZoneInfo, span: float) -> int:
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


def evaluate(
    stem: str,
    tz: str,
    span: float,
    weeks_back: int = 0,
    *,
    history_days: float | None = None,
    tuning: Tuning | None = None,
    rows: list[tuple[float, float]] | None = None,
) -> dict[str, float]:
    """Scores of one trace. For tuning sweeps (benchmarks/windows_tune.py): ``weeks_back`` hides an
    earlier week instead, ``history_days`` keeps only that much history before the hidden week (as a
    young service would have), ``tuning`` replaces the finder's defaults."""
    zone = ZoneInfo(tz)
    rows = load(stem) if rows is None else rows
    if weeks_back:
        end = rows[-1][0] - weeks_back * 7 * 86400
        rows = [(t, v) for t, v in rows if t <= end]
    actual = Actual(rows)
    last = datetime.fromtimestamp(rows[-1][0] + actual.slot, zone)
    last_full = last.date() - timedelta(days=1)  # the last day is partial, or ends at its midnight
    days = [last_full - timedelta(days=HIDDEN_DAYS - 1 - i) for i in range(HIDDEN_DAYS)]
    cut = midnight(days[0], zone)
    first = -math.inf if history_days is None else cut - history_days * 86400
    history = [(t, v) for t, v in rows if first <= t < cut]
    plan = plan_windows(history, timedelta(seconds=span), zone, now=cut, tuning=tuning or Tuning())
    learned = {w.start.date(): w.start.timestamp() for w in plan.windows}
    naive = naive_start(history, zone, span)
    sums = {"learned": 0.0, "naive": 0.0, "fixed": 0.0, "oracle": 0.0}
    for day in days:
        oracle = actual.oracle(day, zone, span)
        starts = {
            "learned": learned.get(day),
            "naive": midnight(day, zone) + naive,
            "fixed": datetime.combine(day, time(2), zone).timestamp(),
        }
        realized = {k: (actual.mean(s, s + span) if s is not None else None) for k, s in starts.items()}
        if oracle is None or any(v is None for v in realized.values()):
            continue  # the hidden data has a gap there: no fair score for that day
        sums["oracle"] += oracle
        for key, value in realized.items():
            sums[key] += value or 0.0
    eps = 1e-9 + 0.001 * statistics.fmean(v for _, v in rows)  # an all-zero oracle stays finite
    return {
        "history_days": (cut - history[0][0]) / 86400,
        **{k: (sums[k] + eps) / (sums["oracle"] + eps) for k in ("learned", "naive", "fixed")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="2h", help="window length (default 2h)")
    args = parser.parse_args()
    span = parse_duration(args.duration).total_seconds()
    began = clock.perf_counter()
    print(
        f"restart window {args.duration}: realized load / oracle load over the hidden last week "
        "(1.00 = perfect)"
    )
    print(f"{'trace':<18} {'set':<6} {'history':>8} {'learned':>8} {'naive':>8} {'02:00':>8}  what")
    scores: dict[str, dict[str, list[float]]] = {}
    for stem, tz, group, what in TRACES:
        result = evaluate(stem, tz, span)
        for key in ("learned", "naive", "fixed"):
            scores.setdefault(group, {}).setdefault(key, []).append(result[key])
        print(
            f"{stem:<18} {group:<6} {result['history_days']:>7.1f}d {result['learned']:>8.2f} "
            f"{result['naive']:>8.2f} {result['fixed']:>8.2f}  {what} ({tz})"
        )
    for group, by_method in scores.items():
        geo = {k: math.exp(statistics.fmean(math.log(x) for x in v)) for k, v in by_method.items()}
        print(
            f"{'geometric mean':<18} {group:<6} {'':>8} {geo['learned']:>8.2f} {geo['naive']:>8.2f} "
            f"{geo['fixed']:>8.2f}"
        )
    print(f"({clock.perf_counter() - began:.1f} s)")


if __name__ == "__main__":
    main()
