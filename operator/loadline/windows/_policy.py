"""Policy windows: the times a fleet policy allows restarts in (FleetPolicy ``spec.restarts.windows``).

A window is a weekly wall-clock interval, ``{days: [Mon, Tue], start: "22:00", end: "04:00",
timezone: "Europe/Berlin"}``; an ``end`` at or before ``start`` runs past midnight into the next day,
and ``days`` name the day it starts on. Wall-clock times are resolved in the window's own time zone
(or the plan's), so "22:00" stays 22:00 across daylight-saving changes while the real length of that
night's window may be an hour more or less.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from loadline.windows._errors import PolicyWindowError

__all__ = ["DAY_NAMES", "PolicyWindow", "parse_policy_windows", "parse_timezone"]

DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_DAY_INDEX = {name.lower(): i for i, name in enumerate(DAY_NAMES)} | {
    full: i
    for i, full in enumerate(("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"))
}


def parse_timezone(name: str | ZoneInfo, field: str = "--timezone") -> ZoneInfo:
    """A :class:`ZoneInfo` from an IANA name such as ``Europe/Berlin``; one-line error otherwise."""
    if isinstance(name, ZoneInfo):
        return name
    try:
        return ZoneInfo(str(name).strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise PolicyWindowError(
            field, f"unknown time zone {name!r}", "use an IANA name such as UTC or Europe/Berlin"
        ) from None


@dataclass(frozen=True)
class PolicyWindow:
    """Restarts are allowed from ``start`` to ``end`` (wall clock) on each of ``days`` (0 = Monday)."""

    days: frozenset[int]
    start: time
    end: time
    timezone: ZoneInfo | None = None

    def occurrences(self, first: date, last: date, default_tz: ZoneInfo) -> list[tuple[float, float]]:
        """Real-time intervals (unix seconds) of the occurrences starting on ``first`` … ``last``."""
        zone = self.timezone or default_tz
        out = []
        day = first
        while day <= last:
            if day.weekday() in self.days:
                begin = datetime.combine(day, self.start, zone)
                end_day = day if self.end > self.start else day + timedelta(days=1)
                end = datetime.combine(end_day, self.end, zone)
                out.append((begin.timestamp(), end.timestamp()))
            day += timedelta(days=1)
        return out


def _clock(value: Any, field: str) -> time:
    text = str(value).strip()
    if text == "24:00":
        return time(0)
    try:
        hours, minutes = text.split(":")
        return time(int(hours), int(minutes))
    except ValueError:
        raise PolicyWindowError(field, f"cannot read {value!r} as a time of day", 'write "HH:MM"') from None


def _days(value: Any, field: str) -> frozenset[int]:
    if value is None:
        return frozenset(range(7))
    if isinstance(value, str) or not isinstance(value, Iterable):
        value = [value]
    days = set()
    for item in value:
        index = _DAY_INDEX.get(str(item).strip().lower())
        if index is None:
            raise PolicyWindowError(field, f"unknown day {item!r}", "use Mon, Tue, Wed, Thu, Fri, Sat or Sun")
        days.add(index)
    if not days:
        raise PolicyWindowError(field, "no days given", "list at least one day, e.g. [Sat, Sun]")
    return frozenset(days)


def parse_policy_windows(
    items: Sequence[Mapping[str, Any] | PolicyWindow] | None, field: str = "windows"
) -> list[PolicyWindow]:
    """Policy windows from their YAML/JSON form (``days`` default to every day)."""
    out = []
    for i, item in enumerate(items or ()):
        where = f"{field}[{i}]"
        if isinstance(item, PolicyWindow):
            out.append(item)
            continue
        if not isinstance(item, Mapping):
            raise PolicyWindowError(where, "not a mapping", "write {days: [...], start: HH:MM, end: HH:MM}")
        start = _clock(item.get("start", "00:00"), f"{where}.start")
        end = _clock(item.get("end", "24:00"), f"{where}.end")
        if start == end and str(item.get("end", "24:00")).strip() != "24:00":
            raise PolicyWindowError(f"{where}.end", "equals start (an empty window)", "give a later end")
        zone = item.get("timezone")
        out.append(
            PolicyWindow(
                days=_days(item.get("days"), f"{where}.days"),
                start=start,
                end=end,
                timezone=parse_timezone(zone, f"{where}.timezone") if zone else None,
            )
        )
    return out
