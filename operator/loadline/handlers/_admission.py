"""Admission webhooks: FleetPolicy defaults filled in, limits refused at ``kubectl apply`` time.

Thin glue over :func:`loadline.policy.admit` (pure), which ``loadline plan``/``render`` call offline
too. Every replica serves these (standbys included): they read only the FleetPolicies (an index of
their own) and the model's namespace, and write nothing, so a leader hand-over never interrupts them.

What is judged, and what is not:

* CREATE, and an UPDATE that changes ``spec``. An UPDATE that leaves ``spec`` as it was (labels,
  annotations, finalizers: the operator's own bookkeeping among them) is always admitted and never
  mutated, so a model that broke a policy added after it can still be deleted, and kopf can still
  record its progress on it; reconcile marks it ``PolicyCompliant=False`` instead.
* A spec loadline cannot read (a field the schema allows but the model refuses) is refused with the
  field and the fix, whether or not a policy governs the model. Only the spec itself is judged so:
* what depends on other objects or the hub is left to reconcile (a ConfigMap or token Secret not
  applied yet, a gated repository, a model that fits no GPU at all without the policies): GitOps
  applies objects in any order. When a policy governs the model, it is admitted with a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import kopf

from loadline.api import FleetPolicy, parse_fleet_policy, parse_inference_model
from loadline.errors import LoadlineError, SpecError
from loadline.handlers import _metrics, _policies, _reconcile
from loadline.handlers._settings import OperatorSettings
from loadline.policy import admit, combine, defaults_patch, enforced, select_policies

log = logging.getLogger("loadline.admission")

DENIED = 403
"""The code of a refusal: kubectl prints ``Error from server (Forbidden)`` and the message."""


def spec_unchanged(operation: str | None, body: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """An UPDATE that leaves ``spec`` as it was: admitted as is (see the module's docstring)."""
    return operation == "UPDATE" and old is not None and (old.get("spec") or {}) == (body.get("spec") or {})


@contextmanager
def _reviewed(webhook: str, warnings: list[str] | None = None) -> Iterator[None]:
    """Count the answer (``loadline_admission_reviews_total``) and time it."""
    started, warned_before = time.monotonic(), len(warnings or [])
    result = "error"
    try:
        yield
        result = "warned" if warnings is not None and len(warnings) > warned_before else "allowed"
    except kopf.AdmissionError:
        result = "refused"
        raise
    finally:
        _metrics.record_admission(webhook, result, time.monotonic() - started)


def _object(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}


def _governing(body: Mapping[str, Any], policies: list[FleetPolicy]) -> list[FleetPolicy]:
    meta = body["metadata"]
    namespace = meta.get("namespace") or "default"
    labels = _policies.namespace_labels(namespace, policies)
    return select_policies(policies, namespace, labels, meta.get("labels") or {})


def mutate_model(
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    operation: str | None,
    patch: kopf.Patch,
    policies: list[FleetPolicy],
    settings: OperatorSettings,
) -> None:
    """Fill the spec's unset fields with the enforcing policies' defaults (highest priority first)."""
    with _reviewed("mutate-inferencemodel"):
        if spec_unchanged(operation, body, old) or not policies:
            return
        try:
            inputs = _reconcile.model_inputs(body, settings)
        except (LoadlineError, kopf.TemporaryError):
            return  # validation says what is wrong with it
        governing = _governing(body, policies)
        filled = defaults_patch(inputs.obj.spec, combine(enforced(governing)))
        if filled:
            patch.setdefault("spec", {}).update(filled)
            log.info(
                "[%s/%s] defaults filled from FleetPolicies: %s",
                body["metadata"].get("namespace"), body["metadata"].get("name"), sorted(filled),
            )  # fmt: skip


def validate_model(
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    operation: str | None,
    warnings: list[str],
    policies: list[FleetPolicy],
    settings: OperatorSettings,
) -> None:
    """Refuse a spec loadline cannot read, or one a deny policy forbids; warn for warn and dryrun."""
    with _reviewed("validate-inferencemodel", warnings):
        if spec_unchanged(operation, body, old):
            return
        try:
            parse_inference_model(_object(body))
        except SpecError as exc:
            raise kopf.AdmissionError(str(exc), code=DENIED) from None
        governing = _governing(body, policies)
        if not governing:
            return
        try:
            inputs = _reconcile.model_inputs(body, settings)
        except (LoadlineError, kopf.TemporaryError) as exc:
            # Another object or the hub (a Secret not applied yet, a gated repository): the cluster's
            # state of the moment, not the spec's fault. GitOps applies in any order; reconcile judges.
            warnings.append(f"loadline: not checked against FleetPolicies now ({exc}); the operator will")
            return
        try:
            admission = admit(inputs.obj.spec, governing, inputs.plan)
        except LoadlineError as exc:  # fits no GPU even without the policies: reconcile reports it
            warnings.append(f"loadline: {exc}")
            return
        warnings.extend(admission.decision.warnings)
        if not admission.decision.allowed:
            raise kopf.AdmissionError(admission.decision.message, code=DENIED)


def validate_policy(body: Mapping[str, Any]) -> None:
    """Refuse a FleetPolicy the operator could not apply (a version range, a timezone, a window the
    schema cannot check), naming the field and the fix."""
    with _reviewed("validate-fleetpolicy"):
        try:
            parse_fleet_policy(body, source=f"FleetPolicy {body.get('metadata', {}).get('name', '?')}")
        except LoadlineError as exc:
            raise kopf.AdmissionError(str(exc), code=DENIED) from None
