"""Choosing the finder's knobs on the ``tune`` services only (docs/restarts.md).

Each candidate (a set of ``loadline.windows.Tuning`` fields) is scored exactly as benchmarks/windows.py
scores the learner: rolling origin, every hidden week of every ``tune`` service, extra load over each
day's quietest window as a share of the mean load. Printed per candidate: the mean over services of
each service's mean over its hidden weeks, and the worst service's difference to the naive profile.
``--history-days N`` keeps only the last N days of history before each hidden week (a young
service). This script never reads a ``held-out`` service. Run:
``.venv/bin/python benchmarks/windows_tune.py [--duration 2h] [--history-days N] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time as clock
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from windows import TRACES, evaluate

from loadline.windows import Tuning, parse_duration

#: The candidates compared, by name: the Tuning fields they change from the defaults.
CANDIDATES: Mapping[str, Mapping[str, Any]] = {
    "defaults": {},
    "no anchor": {"anchor": False},
    "z=2": {"steadiness_z": 2.0},
    "lowest (z=0)": {"steadiness_z": 0.0},
    "median (q=0.5)": {"burst_quantile": 0.5},
    "q=0.75": {"burst_quantile": 0.75},
    "q=0.95": {"burst_quantile": 0.95},
    "mean (q=1)": {"burst_quantile": 1.0},
    "always pooled": {"weekly": False},
    "half-life 14d": {"half_life_days": 14.0},
    "half-life 28d": {"half_life_days": 28.0},
    "half-life 56d": {"half_life_days": 56.0},
}


def tune_traces() -> list[tuple[str, str]]:
    return [(stem, tz) for stem, tz, group, _ in TRACES if group == "tune"]


def score(args: tuple[str, str, float, Tuning, float | None]) -> tuple[str, float, float]:
    """(service, learner's mean extra load, naive's) over the service's hidden weeks."""
    stem, tz, span, tuning, history_days = args
    weeks = evaluate(stem, tz, span, tuning, methods=("learner", "naive"), history_days=history_days)
    return stem, statistics.fmean(w["learner"] for w in weeks), statistics.fmean(w["naive"] for w in weeks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="2h")
    parser.add_argument("--only", nargs="*", help="candidate names (default: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--history-days", type=float, help="history before each hidden week (default: all)")
    args = parser.parse_args()
    span = parse_duration(args.duration).total_seconds()
    names = args.only or list(CANDIDATES)
    began = clock.perf_counter()
    history = "all history" if args.history_days is None else f"{args.history_days:g} days of history"
    print(f"tune services only, {args.duration} windows, {history}: extra load, % of the mean load")
    print(f"{'candidate':<22}{'mean':>7}{'naive':>7}{'worst vs naive':>16}  worst service")
    with ProcessPoolExecutor(args.workers) as pool:
        for name in names:
            tuning = replace(Tuning(), **CANDIDATES[name])
            rows = list(
                pool.map(score, [(stem, tz, span, tuning, args.history_days) for stem, tz in tune_traces()])
            )
            learner = statistics.fmean(r[1] for r in rows)
            naive = statistics.fmean(r[2] for r in rows)
            stem, a, b = max(rows, key=lambda r: r[1] - r[2])
            print(f"{name:<22}{learner:>7.2f}{naive:>7.2f}{a - b:>+16.2f}  {stem}", flush=True)
    print(f"({clock.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
