"""Errors of the restart planner: :class:`loadline.errors.SpecError`, naming the input and the fix."""

from __future__ import annotations

from loadline.errors import SpecError

__all__ = ["MaintenanceInputError"]


class MaintenanceInputError(SpecError):
    """An input of the planner is unusable: a naive datetime, a non-positive duration, a negative
    cool-down. Programming errors of the glue, named so they are found at once."""
