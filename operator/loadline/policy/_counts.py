"""A FleetPolicy's own status: how many models it governs and which break it, counted from the models'
status (each model's reconcile writes which policies govern it and which it breaks)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from loadline.api import FleetPolicy, FleetPolicyStatus
from loadline.policy._select import describe_selector
from loadline.status.read import read_status

__all__ = ["policy_counts"]


def policy_counts(policy: FleetPolicy, models: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``status`` of a FleetPolicy from the models' own status: how many it governs and which break it."""
    governed, violating = 0, []
    for model in models:
        held = read_status(model)
        if policy.name in held.policies:
            governed += 1
        if policy.name in held.violated_policies:
            meta = model["metadata"]
            violating.append(f"{meta['namespace']}/{meta['name']}")
    status = FleetPolicyStatus(
        selector=describe_selector(policy.spec.selector),
        models_governed=governed,
        violations=len(violating),
        violating_models=sorted(violating)[:50],
        observed_generation=policy.metadata.get("generation"),
    )
    return status.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"conditions"})
