"""FleetPolicies in the cluster: which govern each InferenceModel, whether it keeps them, and the
counts each policy shows (:func:`loadline.status.build.build_policy_counts`). Thin glue over
:mod:`loadline.policy` (pure).

In reconcile a policy only reports: a model that breaks one gets ``PolicyCompliant=False`` naming the
policy, the field and the fix, and keeps running as it is. Refusing at ``kubectl apply`` time and
filling in defaults are the admission webhooks' part; reconcile never applies a policy's defaults to a
model that is already running (that would roll every governed model when a policy changes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from loadline.api import FleetPolicy, InferenceModelSpec, InferenceModelStatus, parse_fleet_policy
from loadline.errors import LoadlineError
from loadline.handlers import _kube
from loadline.policy import (
    PlanFn,
    combine,
    evaluate,
    needs_namespace_labels,
    select_policies,
)
from loadline.status import build as _build

log = logging.getLogger("loadline.policies")


def parse_policies(bodies: Iterable[Mapping[str, Any]]) -> list[FleetPolicy]:
    """The policies of the index, each validated; one the API server stored but we cannot read (an
    older operator's schema) is skipped with a log line rather than failing every model."""
    policies = []
    for body in bodies:
        try:
            policies.append(
                parse_fleet_policy(body, source=f"FleetPolicy {body['metadata']['name']}", unknown="ignore")
            )
        except LoadlineError as exc:
            log.warning("ignoring %s", exc)
    return policies


def namespace_labels(namespace: str, policies: Iterable[FleetPolicy]) -> Mapping[str, str] | None:
    """The namespace's labels when a policy selects by them (None: unknown, such a policy then does
    not govern; the API is read only when needed)."""
    if not any(needs_namespace_labels(p) for p in policies):
        return {}
    try:
        ns = _kube.get("v1", "Namespace", None, namespace)
    except ApiException as exc:
        log.warning("cannot read namespace %s for its labels: %s", namespace, _kube.api_error_text(exc))
        return None
    return dict(((ns or {}).get("metadata") or {}).get("labels") or {}) if ns is not None else None


def compliance_status(
    body: Mapping[str, Any],
    status: InferenceModelStatus,
    spec: InferenceModelSpec,
    policies: list[FleetPolicy],
    plan_fn: PlanFn,
) -> _build.Status:
    """The status fields that say which policies govern the model (``body``, whose status is read as
    ``status``) and what it breaks."""
    meta = body["metadata"]
    namespace = meta["namespace"]
    governing = select_policies(
        policies, namespace, namespace_labels(namespace, policies), meta.get("labels") or {}
    )
    violations = []
    if governing:
        try:
            violations = evaluate(spec, combine(governing), plan_fn)
        except LoadlineError:
            violations = []  # the spec itself cannot be planned: reconcile reports that, not the policy
    return _build.build_policy_status(
        status,
        governing=[p.name for p in governing],
        violations=[v.line() for v in violations],
        violated=[v.policy for v in violations],
        generation=meta.get("generation"),
        now=_build.now_iso(),
    )
