"""Errors of the OOM-risk estimator: :class:`loadline.errors.SpecError`, naming the input and the fix."""

from __future__ import annotations

from loadline.errors import SpecError

__all__ = ["RiskInputError"]


class RiskInputError(SpecError):
    """An input of the estimator is unusable (a naive ``now``)."""
