"""Window lengths as people and Prometheus write them: ``2h``, ``90m``, ``1h30m``, ``7200s``, ``7200``."""

from __future__ import annotations

import re
from datetime import timedelta

from loadline.windows._errors import DurationError

__all__ = ["MAX_DURATION", "parse_duration"]

#: A window is chosen per day, so it cannot be longer than one.
MAX_DURATION = timedelta(days=1)

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def parse_duration(text: str | float | timedelta, field: str = "--duration") -> timedelta:
    """A positive length of at most a day; plain numbers are seconds.

    Raises :class:`DurationError` naming ``field`` for anything else, so a typo never becomes a
    zero-length (always "quiet") window.
    """
    if isinstance(text, timedelta):
        value = text
    elif isinstance(text, int | float):
        value = timedelta(seconds=float(text))
    else:
        raw = text.strip().lower()
        if re.fullmatch(r"\d+(?:\.\d+)?", raw):
            value = timedelta(seconds=float(raw))
        elif raw and _PART.sub("", raw) == "" and re.fullmatch(r"(?:\d+(?:\.\d+)?[dhms])+", raw):
            seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(raw))
            value = timedelta(seconds=seconds)
        else:
            raise DurationError(
                field, f"cannot read {text!r} as a duration", "write it like 2h, 90m, 1h30m or 7200s"
            )
    if value <= timedelta(0):
        raise DurationError(field, f"{text!r} is not a positive duration", "give a length such as 2h")
    if value > MAX_DURATION:
        raise DurationError(
            field, f"{text!r} is longer than a day", "choose a window of at most 24h (one per day)"
        )
    return value
