"""Kubernetes Events about a model: what ``kubectl describe`` shows of loadline's decisions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from loadline.maintenance import MaintenanceRecord, restart_event
from loadline.sizing import Plan


def event(obj: Mapping[str, Any], *, warning: bool, reason: str, message: str) -> None:
    """Post a Kubernetes Event about ``obj``."""
    kopf.event(cast(Any, obj), type="Warning" if warning else "Normal", reason=reason, message=message)


def report_fallback(body: Mapping[str, Any], plan: Plan) -> None:
    """A Warning when a new plan took a dearer GPU type because the cheaper one was absent or full."""
    if plan.fallback_from:
        fallback = f"{plan.fallback_from} absent or full; using {plan.chosen.gpu.name}"
        event(body, warning=True, reason="GPUFallback", message=fallback)


def maintenance_event(body: Mapping[str, Any], record: MaintenanceRecord) -> None:
    """The Event for the state a restart decision moved the model to."""
    said = restart_event(record)
    if said is not None:
        warning, reason, message = said
        event(body, warning=warning, reason=reason, message=message)
