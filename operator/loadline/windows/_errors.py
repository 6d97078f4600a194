"""Errors of the window finder: all are :class:`loadline.errors.SpecError`, so the CLI prints them as
one line naming the input at fault and the fix, and the operator can put them in status unchanged."""

from __future__ import annotations

from loadline.errors import SpecError

__all__ = ["DurationError", "PolicyWindowError", "SeriesError"]


class SeriesError(SpecError):
    """The request-rate history is unusable: not a Prometheus matrix, no samples, unreadable file."""


class DurationError(SpecError):
    """The restart window's length is unparsable, zero, or longer than a day."""


class PolicyWindowError(SpecError):
    """A policy window (FleetPolicy ``spec.restarts.windows``) is malformed."""
