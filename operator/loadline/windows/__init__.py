"""Learning the low-traffic window: when to restart a model so that the fewest requests notice.

``plan_windows(samples, duration, tz, policy_windows, now)`` takes a request-rate history (unix
seconds and values, one series or several to be summed, gaps and all), a window length, a time zone
and optionally the fleet policy's allowed windows, and returns the quietest window of that length on
each of the next seven days, with why (history span, method, fallback). ``next_window`` gives the
first of them. Pure and offline: no clock, no Prometheus; ``series_from_prometheus`` reads a
``/api/v1/query_range`` answer. See docs/restarts.md.
"""

from loadline.windows._duration import MAX_DURATION, parse_duration
from loadline.windows._errors import DurationError, PolicyWindowError, SeriesError
from loadline.windows._plan import (
    Method,
    Tuning,
    Window,
    WindowPlan,
    learned_profile,
    next_window,
    plan_windows,
)
from loadline.windows._policy import DAY_NAMES, PolicyWindow, parse_policy_windows, parse_timezone
from loadline.windows._profile import Profile, WindowStats, build_profile, winsorized_mean
from loadline.windows._series import Sample, choose_slot, combine_series, series_from_prometheus

__all__ = [
    "DAY_NAMES",
    "MAX_DURATION",
    "DurationError",
    "Method",
    "PolicyWindow",
    "PolicyWindowError",
    "Profile",
    "Sample",
    "SeriesError",
    "Tuning",
    "Window",
    "WindowPlan",
    "WindowStats",
    "build_profile",
    "choose_slot",
    "combine_series",
    "learned_profile",
    "next_window",
    "parse_duration",
    "parse_policy_windows",
    "parse_timezone",
    "plan_windows",
    "series_from_prometheus",
    "winsorized_mean",
]
