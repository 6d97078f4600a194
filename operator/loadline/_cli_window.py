"""``loadline window SERIES.json --duration 2h``: the restart-window finder, offline.

Reads what ``/api/v1/query_range`` returned for a model's request rate (several series are summed)
and prints the quietest window on each of the next seven days after the last sample, exactly as the
operator would choose them. Bad input is one line on standard error and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from loadline._cli_input import read_json
from loadline.windows import SeriesError

__all__ = ["register"]

_FIX = "pass the JSON file that Prometheus' /api/v1/query_range returned"


def _cmd_window(args: argparse.Namespace) -> int:
    from loadline.windows import parse_duration, parse_timezone, plan_windows, series_from_prometheus

    duration = parse_duration(args.duration)  # flags first: a typo fails before the file is read
    zone = parse_timezone(args.timezone)
    plan = plan_windows(
        series_from_prometheus(read_json(args.series, "SERIES", _FIX, SeriesError)),
        duration,
        zone,
        days=args.days,
    )
    if args.output == "json":
        sys.stdout.write(json.dumps({"windows": [w.as_dict() for w in plan.windows]}, indent=2) + "\n")
        return 0
    lines = [f"method: {plan.method}", f"why:    {plan.reason}"]
    for w in plan.windows:
        load = "" if w.expected_load is None else f"  expected load {w.expected_load:.2f} x daily mean"
        lines.append(f"  {w.start:%a %Y-%m-%d %H:%M} - {w.end:%H:%M %Z}{load}")
    lines += [f"note:   {n}" for n in plan.notes]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``window`` to the ``loadline`` command line."""
    p = sub.add_parser(
        "window",
        help="learn the low-traffic restart window from a Prometheus range query (offline)",
        description="Choose the quietest window of --duration on each of the next 7 days after the last "
        "sample of SERIES.json (the JSON /api/v1/query_range returns; several series are summed).",
    )
    p.add_argument("series", metavar="SERIES.json", help="the range-query answer, or - for standard input")
    p.add_argument("--duration", "-d", required=True, help="window length, e.g. 2h, 90m, 1h30m (at most 24h)")
    p.add_argument("--timezone", "--tz", default="UTC", help="IANA time zone the days are counted in (UTC)")
    p.add_argument("--days", type=int, default=7, help=argparse.SUPPRESS)
    p.add_argument("--output", "-o", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(func=_cmd_window)
