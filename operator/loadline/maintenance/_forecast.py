"""Expected load over the coming hours, for choosing the quietest slot before a predicted crash.

The learned windows (:func:`loadline.windows.plan_windows`) give one window per day; a predicted
out-of-memory crash needs the quietest slot *before a given time*, which may fall between them. The
forecast is the same robust profile the window finder learns (same bins, the same clipped means that
discount a one-off burst, same time-zone handling), evaluated on the coming bins; with too little
history it is empty, and the planner then acts as soon as it may.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from loadline.maintenance._allowed import Interval, fits
from loadline.maintenance._model import LoadSlot
from loadline.windows import Sample, Tuning, learned_profile, parse_timezone

__all__ = ["forecast_load", "quietest_start"]

#: The window finder's own defaults, so the forecast and the windows agree.
_TUNING = Tuning()


def forecast_load(
    samples: Sequence[Sample] | Sequence[Sequence[Sample]],
    tz: ZoneInfo | str,
    start: datetime,
    end: datetime,
    *,
    tuning: Tuning = _TUNING,
) -> tuple[LoadSlot, ...]:
    """Expected relative load per bin from ``start`` to ``end`` (aware), learned from ``samples`` (one
    request-rate series or several to sum, as for ``plan_windows``); empty with under
    ``tuning.min_history_days`` of history. Bins the profile does not know are left out."""
    slot, _bins, profile = learned_profile(samples, parse_timezone(tz), tuning)
    if profile is None:
        return ()
    out = []
    index = int(start.timestamp() // slot)
    while index * slot < end.timestamp():
        value = profile.at(index * slot)
        if value is not None:
            begin = datetime.fromtimestamp(index * slot, UTC)
            out.append(LoadSlot(begin, begin + timedelta(seconds=slot), value))
        index += 1
    return tuple(out)


def quietest_start(
    forecast: Sequence[LoadSlot],
    earliest: float,
    latest: float,
    length: float,
    allowed: list[Interval] | None,
) -> tuple[float, float | None] | None:
    """The start in ``[earliest, latest]`` (unix seconds) whose next ``length`` seconds have the least
    expected load and fit ``allowed``: ``(start, mean load or None)``. Candidates are ``earliest``,
    each forecast bin's start and each allowed interval's start; a candidate needs the forecast for
    half its length. Ties go to the earlier start (a crash is coming). Without a forecast, the first
    candidate that fits, load None; None when no candidate fits ``allowed``."""
    slots = sorted((s.start.timestamp(), s.end.timestamp(), s.load) for s in forecast)
    starts = [a for a, _, _ in slots] + [a for a, _ in allowed or []]
    candidates = sorted({earliest} | {a for a in starts if earliest <= a <= latest})
    best: tuple[float, float] | None = None
    fallback: float | None = None
    for start in candidates:
        end = start + length
        if not fits(allowed, start, end):
            continue
        if fallback is None:
            fallback = start
        covered = weighted = 0.0
        for a, b, load in slots:
            overlap = min(b, end) - max(a, start)
            if overlap > 0:
                covered += overlap
                weighted += overlap * load
        if covered >= 0.5 * length:
            mean = weighted / covered
            if best is None or mean < best[1] - 1e-12:
                best = (start, mean)
    if best is not None:
        return best
    return None if fallback is None else (fallback, None)
