"""When the governing FleetPolicies allow a restart: the intersection of their windows, in real time.

Each policy's windows are a union (any of them will do); several policies must all agree (the
strictest wins, as everywhere in :mod:`loadline.policy`), so the allowed time is the intersection of
the unions. Everything is unix seconds: wall-clock arithmetic on aware datetimes that share a zoneinfo
ignores the UTC offset, which is wrong by an hour across a daylight-saving change.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from loadline.windows import PolicyWindow

__all__ = ["Interval", "PolicySet", "allowed_intervals", "first_fit", "fits"]

#: (start, end) in unix seconds.
Interval = tuple[float, float]
#: A policy's name and its restart windows, as :func:`loadline.policy.restart_window_sets` gives them.
PolicySet = tuple[str, Sequence[PolicyWindow]]


def _union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def allowed_intervals(
    sets: Sequence[PolicySet], zone: ZoneInfo, start: datetime, end: datetime
) -> list[Interval] | None:
    """The times from ``start`` to ``end`` inside a window of every set; None when no set has windows
    (any time is allowed). Windows without a time zone are read in ``zone`` (the model's)."""
    with_windows = [windows for _, windows in sets if windows]
    if not with_windows:
        return None
    first = start.astimezone(zone).date() - timedelta(days=1)
    last = end.astimezone(zone).date() + timedelta(days=1)
    result: list[Interval] | None = None
    for windows in with_windows:
        union = _union([occ for w in windows for occ in w.occurrences(first, last, zone)])
        result = union if result is None else _intersect(result, union)
    return result or []


def fits(allowed: list[Interval] | None, start: float, end: float) -> bool:
    """Whether ``start`` … ``end`` lies inside one allowed interval (always, without policy windows)."""
    if allowed is None:
        return True
    return any(a <= start and end <= b for a, b in allowed)


def first_fit(allowed: list[Interval], earliest: float, length: float) -> float | None:
    """The first start at or after ``earliest`` whose ``length`` fits an allowed interval."""
    for a, b in allowed:
        start = max(a, earliest)
        if start + length <= b:
            return start
    return None
