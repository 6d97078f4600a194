"""Robust trends of short, noisy, gappy metric histories.

Prometheus series that warn of an out-of-memory crash (GPU memory used, KV-cache usage, the longest
prompt) are noisy: a scrape catches a burst, an exporter restarts, a node drops out for ten minutes.
A least-squares line through them is pulled by every spike, so the slope here is Theil–Sen's (the
median of all pairwise slopes: up to 29 % of the points can be wild without moving it), and whether
there is a trend at all is decided by the Mann–Kendall test (a rank test, so a few huge values count
no more than a few small ones). Samples are first reduced to the median of each bin, which bounds the
work (the pairwise slopes are quadratic) and makes a series scraped every 15 s weigh no more than one
scraped every minute. Missing bins stay missing: a gap is no evidence either way.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Trend", "bin_medians", "fit_trend"]

#: (unix seconds, value)
Sample = tuple[float, float]


@dataclass(frozen=True)
class Trend:
    """A robust straight line through binned samples, and whether it rises beyond doubt."""

    #: Change per second (Theil–Sen: the median pairwise slope).
    slope: float
    #: The line's value at ``last_time`` (robust: median intercept), i.e. the level now.
    level: float
    #: Time (unix seconds) of the last bin used.
    last_time: float
    first_time: float
    #: Bins the line rests on.
    points: int
    #: Mann–Kendall z statistic: above 1.645 the series rises at 95 % one-sided confidence.
    z: float

    @property
    def span_seconds(self) -> float:
        return self.last_time - self.first_time


def bin_medians(samples: Iterable[Sample], width: float) -> list[Sample]:
    """``(bin centre, median value)`` per bin of ``width`` seconds that holds a finite sample, in time
    order. Non-finite values (an exporter's NaN) are dropped; empty bins are left out, not filled."""
    bins: dict[int, list[float]] = {}
    for t, v in samples:
        if math.isfinite(t) and math.isfinite(v):
            bins.setdefault(math.floor(t / width), []).append(v)
    return [((index + 0.5) * width, statistics.median(bins[index])) for index in sorted(bins)]


def _mann_kendall_z(values: list[float]) -> float:
    """The Mann–Kendall trend statistic, normal approximation with continuity correction (ties count
    zero; the variance is not corrected for them, which only makes the test more cautious)."""
    n = len(values)
    s = sum((1 if b > a else -1 if b < a else 0) for a, b in itertools.combinations(values, 2))
    variance = n * (n - 1) * (2 * n + 5) / 18
    if variance <= 0:
        return 0.0
    if s > 0:
        return (s - 1) / math.sqrt(variance)
    if s < 0:
        return (s + 1) / math.sqrt(variance)
    return 0.0


def fit_trend(points: list[Sample]) -> Trend | None:
    """Theil–Sen line and Mann–Kendall z of ``points`` (binned, time-ordered); None with under two."""
    if len(points) < 2:
        return None
    slopes = [(v2 - v1) / (t2 - t1) for (t1, v1), (t2, v2) in itertools.combinations(points, 2) if t2 > t1]
    if not slopes:
        return None
    slope = statistics.median(slopes)
    last = points[-1][0]
    level = statistics.median(v + slope * (last - t) for t, v in points)
    return Trend(
        slope=slope,
        level=level,
        last_time=last,
        first_time=points[0][0],
        points=len(points),
        z=_mann_kendall_z([v for _, v in points]),
    )
