"""Request-rate history: Prometheus range answers in, evenly spaced bins out.

Prometheus returns one series per label set (per pod, per engine); the load of a model is their sum.
Series may have gaps (a scrape target down, Prometheus restarted), irregular steps, and NaN or
negative values (broken exporters). A gap must never look quiet, so missing bins stay missing rather
than becoming zeros; a bin is missing only when *no* series has a sample in it, because a series that
ends (a pod replaced under a new name) really contributes nothing afterwards.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from loadline.windows._errors import SeriesError

__all__ = ["Sample", "choose_slot", "combine_series", "series_from_prometheus"]

#: (unix seconds, value)
Sample = tuple[float, float]

#: Bin lengths in seconds; each divides an hour, so bins line up with wall-clock hours in every
#: time zone with a whole-hour offset, and with half hours in the others up to 30 minutes.
_SLOTS = (60, 120, 300, 600, 900, 1200, 1800, 3600)


def choose_slot(timestamps: Sequence[float]) -> int:
    """The smallest bin length (seconds) that is at least the series' typical step."""
    ordered = sorted(set(timestamps))
    steps = sorted(b - a for a, b in itertools.pairwise(ordered) if b > a)
    if not steps:
        return 300
    step = steps[len(steps) // 2]
    for slot in _SLOTS:
        if slot >= step * 0.999:
            return slot
    return _SLOTS[-1]


def combine_series(
    series: Sequence[Sequence[Sample]], slot: int | None = None
) -> tuple[int, dict[int, float]]:
    """Sum several series into bins of ``slot`` seconds: ``(slot, {bin index: value})``.

    Each series is averaged within a bin first (so a series scraped twice as often does not count
    twice), then the series present in the bin are added. Non-finite and negative values are
    dropped: they are exporter faults, not traffic.
    """
    clean = [[(t, v) for t, v in s if math.isfinite(t) and math.isfinite(v) and v >= 0] for s in series]
    if slot is None:
        slot = max((choose_slot([t for t, _ in s]) for s in clean if len(s) > 1), default=300)
    bins: dict[int, float] = {}
    for one in clean:
        sums: dict[int, list[float]] = {}
        for t, v in one:
            acc = sums.setdefault(int(t // slot), [0.0, 0.0])
            acc[0] += v
            acc[1] += 1
        for index, (total, count) in sums.items():
            bins[index] = bins.get(index, 0.0) + total / count
    return slot, bins


def _number(value: Any, where: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise SeriesError(
            "SERIES", f"{where} is not a number: {value!r}", "pass the JSON /api/v1/query_range returns"
        ) from None


def series_from_prometheus(payload: Any) -> list[list[Sample]]:
    """The series of a ``/api/v1/query_range`` answer (the whole answer or just its ``data``).

    Raises :class:`SeriesError` when it is not a matrix or holds no samples, naming what to pass
    instead.
    """
    fix = (
        'pass the JSON of /api/v1/query_range ({"status": "success", "data": {"resultType": "matrix", ...}})'
    )
    if not isinstance(payload, Mapping):
        raise SeriesError("SERIES", "not a JSON object", fix)
    if payload.get("status") == "error":
        raise SeriesError("SERIES", f"Prometheus answered with an error: {payload.get('error', '')}", fix)
    data = payload.get("data", payload)
    if not isinstance(data, Mapping) or "resultType" not in data:
        raise SeriesError("SERIES", "no resultType: not a Prometheus query answer", fix)
    if data.get("resultType") != "matrix":
        raise SeriesError(
            "SERIES",
            f"resultType is {data.get('resultType')!r}, not 'matrix' (an instant query?)",
            "use a range query (/api/v1/query_range with start, end and step)",
        )
    result = data.get("result")
    if not isinstance(result, list):
        raise SeriesError("SERIES", "data.result is not a list", fix)
    series: list[list[Sample]] = []
    for i, item in enumerate(result):
        values = item.get("values") if isinstance(item, Mapping) else None
        if not isinstance(values, list):
            raise SeriesError("SERIES", f"data.result[{i}] has no values list", fix)
        samples = []
        for j, pair in enumerate(values):
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise SeriesError("SERIES", f"data.result[{i}].values[{j}] is not [time, value]", fix)
            samples.append((_number(pair[0], "a timestamp"), _number(pair[1], "a value")))
        series.append(samples)
    if not any(any(math.isfinite(v) for _, v in s) for s in series):
        raise SeriesError(
            "SERIES",
            "the answer holds no samples",
            "widen the range query's start/end, or check the metric name and labels in the query",
        )
    return series
