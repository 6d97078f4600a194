"""Cross-validation of the window finder's knobs on the ``tune`` traces only (docs/restarts.md).

The report traces of benchmarks/windows.py mostly have one week of history before their hidden week;
the tune traces have seven weeks or more. To tune for a young service too, each tune trace is cut:
for each history length (7, 14 and 28 days, and all of it) several different weeks are hidden in
turn (the last, the one before, ...), the finder sees only that much history before the hidden week,
and realized ÷ oracle load is scored as in benchmarks/windows.py. Per history length the figure is
the geometric mean over traces of each trace's geometric mean over its hidden weeks (each trace
weighs the same however long it is); "all" is the geometric mean of the four.

This script refuses to read a ``report`` trace. Run:
``.venv/bin/python benchmarks/windows_tune.py [--duration 2h] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time as clock
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from windows import TRACES, evaluate, load

from loadline.windows import Tuning, parse_duration

#: History lengths in days (None: all of it) and how many weeks are hidden in turn for each.
HISTORIES: tuple[tuple[float | None, int], ...] = ((7, 6), (14, 5), (28, 3), (None, 3))

#: The finder before this sweep: every day divided by its own level, whatever the history.
BEFORE: Mapping[str, Any] = {"normalize_max_days": math.inf}

#: The candidates compared, by name: the Tuning fields they change from today's defaults. The first
#: group varies the finder as it was before (BEFORE); the second varies today's defaults.
CANDIDATES: Mapping[str, Mapping[str, Any]] = {
    "before": BEFORE,
    "before, k=0.5": {**BEFORE, "shrink": 0.5},
    "before, k=4": {**BEFORE, "shrink": 4.0},
    "before, k=8": {**BEFORE, "shrink": 8.0},
    "before, weekday>=2d": {**BEFORE, "min_weekday_days": 2},
    "before, weekday>=3d": {**BEFORE, "min_weekday_days": 3},
    "before, q=0.4": {**BEFORE, "quantile": 0.4},
    "before, q=0.6": {**BEFORE, "quantile": 0.6},
    "before, q=0.7": {**BEFORE, "quantile": 0.7},
    "before, half-life 7d": {**BEFORE, "half_life_days": 7.0},
    "before, half-life 14d": {**BEFORE, "half_life_days": 14.0},
    "before, half-life 28d": {**BEFORE, "half_life_days": 28.0},
    "before, smooth 1": {**BEFORE, "smooth_slots": 1},
    "before, smooth 3": {**BEFORE, "smooth_slots": 3},
    "raw under 14d": {**BEFORE, "normalize_min_days": 14.0},
    "raw always": {"normalize_min_days": math.inf},
    "defaults (raw from 14d)": {},
    "defaults, smooth 1": {"smooth_slots": 1},
    "defaults, k=4": {"shrink": 4.0},
    "defaults, q=0.6": {"quantile": 0.6},
    "defaults, half-life 28d": {"half_life_days": 28.0},
}


def tune_traces() -> list[tuple[str, str]]:
    return [(stem, tz) for stem, tz, group, _ in TRACES if group == "tune"]


Case = tuple[str, str, float, float | None, int, Tuning]


def score_case(args: Case) -> tuple[str, float | None, dict[str, float]]:
    """One trace at one history length: the mean log score over its hidden weeks, per method."""
    stem, tz, span, history, weeks, tuning = args
    rows = load(stem)
    logs: dict[str, list[float]] = {}
    for back in range(weeks):
        end = rows[-1][0] - back * 7 * 86400
        available = (end - rows[0][0]) / 86400 - 7 - 1
        if history is not None and available < history:
            break
        result = evaluate(stem, tz, span, back, history_days=history, tuning=tuning, rows=rows)
        for key in ("learned", "naive", "fixed"):
            logs.setdefault(key, []).append(math.log(result[key]))
    return stem, history, {k: statistics.fmean(v) for k, v in logs.items()}


def cross_validate(tuning: Tuning, span: float, pool: ProcessPoolExecutor) -> dict[str, dict[str, float]]:
    """Geometric means per history length (key: "7d", "14d", "28d", "full", "all")."""
    jobs = [(stem, tz, span, h, w, tuning) for stem, tz in tune_traces() for h, w in HISTORIES]
    per: dict[str, dict[str, list[float]]] = {}
    for _stem, history, logs in pool.map(score_case, jobs):
        name = "full" if history is None else f"{history:g}d"
        for key, value in logs.items():
            per.setdefault(name, {}).setdefault(key, []).append(value)
    out = {name: {k: statistics.fmean(v) for k, v in by.items()} for name, by in per.items()}
    out["all"] = {k: statistics.fmean(out[name][k] for name in per) for k in ("learned", "naive", "fixed")}
    return {name: {k: math.exp(v) for k, v in by.items()} for name, by in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="2h")
    parser.add_argument("--only", nargs="*", help="candidate names (default: all)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    span = parse_duration(args.duration).total_seconds()
    names = args.only or list(CANDIDATES)
    began = clock.perf_counter()
    columns = [("7d", "7d"), ("14d", "14d"), ("28d", "28d"), ("full", "full"), ("all", "all")]
    print(f"tune traces only, {args.duration} windows: geometric mean of realized / oracle load")
    print(f"{'candidate':<26}" + "".join(f"{label:>7}" for _, label in columns))
    with ProcessPoolExecutor(args.workers) as pool:
        first = True
        for name in names:
            result = cross_validate(replace(Tuning(), **CANDIDATES[name]), span, pool)
            if first:
                for base, label in (("naive", "(naive)"), ("fixed", "(02:00)")):
                    print(f"{label:<26}" + "".join(f"{result[c][base]:>7.3f}" for c, _ in columns))
                first = False
            print(f"{name:<26}" + "".join(f"{result[c]['learned']:>7.3f}" for c, _ in columns), flush=True)
    print(f"({clock.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
