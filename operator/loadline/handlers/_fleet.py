"""A FleetPolicy was created, changed or deleted: judge every InferenceModel again, then count.

Reconcile judges a model when the model changes; this covers the other direction (a policy added after
the models it governs exist). It only writes status (``PolicyCompliant``, ``policies``,
``violatedPolicies``) and never touches what runs. Policy changes are rare, so one LIST of the models
per change is the price; the counts on each FleetPolicy are refreshed too when reconcile changes what
a model keeps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from loadline.api import API_VERSION, KIND, FleetPolicy
from loadline.errors import LoadlineError
from loadline.handlers import _build, _kube, _policies, _reconcile, _shards
from loadline.handlers._settings import OperatorSettings

log = logging.getLogger("loadline.policies")


def list_models(settings: OperatorSettings) -> list[dict[str, Any]]:
    """Every InferenceModel the operator watches (one LIST, or one per watched namespace)."""
    namespaces: list[str | None] = list(settings.namespace_list) or [None]
    return [m for ns in namespaces for m in _kube.list_objects(API_VERSION, KIND, ns)]


def judge_models(policies: list[FleetPolicy], settings: OperatorSettings) -> list[dict[str, Any]]:
    """Write each model's compliance where it changed; returns the models with their new status."""
    judged = []
    for model in list_models(settings):
        model = {**model, "apiVersion": API_VERSION, "kind": KIND}
        if not _shards.owns_uid((model.get("metadata") or {}).get("uid")):
            judged.append(model)  # another replica's shard: it judges the model (counts read its status)
            continue
        previous = dict(model.get("status") or {})
        try:
            inputs = _reconcile.model_inputs(model, settings)
        except (LoadlineError, kopf.TemporaryError):
            judged.append(model)  # reconcile reports why it cannot be planned
            continue
        compliance = _policies.compliance_status(model, inputs.obj.spec, policies, inputs.plan)
        changes = _build.status_changes(previous, compliance)
        if changes:
            try:
                _kube.patch_status(model, changes)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # Changed meanwhile: its reconcile (which judges it too) is on its way.
                judged.append(model)
                continue
            _reconcile.report_compliance(model, previous, {**previous, **changes})
            model = {**model, "status": {**previous, **changes}}
        judged.append(model)
    return judged


def count(
    policies: Iterable[FleetPolicy], bodies: Mapping[str, Mapping[str, Any]], models: list[dict[str, Any]]
) -> None:
    """Write each FleetPolicy's counts where they changed (its status subresource)."""
    for policy in policies:
        body = bodies.get(policy.name)
        if body is None:
            continue
        counts = _policies.policy_counts(policy, models)
        previous = dict(body.get("status") or {})
        changes = _build.status_changes(previous, counts)
        if changes:
            try:
                _kube.patch_status({**body, "apiVersion": API_VERSION, "kind": "FleetPolicy"}, changes)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
                log.info("FleetPolicy %s changed meanwhile; its counts follow on the next pass", policy.name)


def on_policies_changed(bodies: Mapping[str, Mapping[str, Any]], settings: OperatorSettings) -> None:
    policies = _policies.parse_policies(bodies.values())
    models = judge_models(policies, settings)
    count(policies, bodies, models)


def compliance_moved(previous: Mapping[str, Any], changes: Mapping[str, Any]) -> bool:
    """Whether a status change alters which policies govern the model or which it breaks."""
    return any(
        key in changes and changes[key] != previous.get(key) for key in ("policies", "violatedPolicies")
    )


def refresh_counts(
    bodies: Mapping[str, Mapping[str, Any]],
    settings: OperatorSettings,
    updated: Mapping[str, Any] | None = None,
) -> None:
    """Count again; ``updated`` is a model whose new status is not written yet (reconcile's patch)."""
    models = list_models(settings)
    if updated is not None:
        ref = (updated["metadata"]["namespace"], updated["metadata"]["name"])
        models = [m for m in models if (m["metadata"]["namespace"], m["metadata"]["name"]) != ref]
        models.append(dict(updated))
    count(_policies.parse_policies(bodies.values()), bodies, models)
