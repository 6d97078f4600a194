"""Admission webhooks: FleetPolicy defaults filled in, limits refused at ``kubectl apply`` time.

Thin glue over :func:`loadline.policy.admit` (pure), which ``loadline plan``/``render`` call offline
too. Every replica serves these (standbys included): they read only the FleetPolicies (an index of
their own) and the model's namespace, and write nothing, so a leader hand-over never interrupts them.

What is judged, and what is not:

* CREATE, and an UPDATE that changes ``spec``. An UPDATE that leaves ``spec`` as it was (labels,
  annotations, finalizers: the operator's own bookkeeping among them) is always admitted and never
  mutated, so a model that broke a policy added after it can still be deleted, and kopf can still
  record its progress on it; reconcile marks it ``PolicyCompliant=False`` instead.
* Whether or not a policy governs the model, everything the spec alone decides is refused with the
  field and the fix, one line per problem: a spec loadline cannot read, a GPU type the catalog lacks,
  ``extraArgs`` the version refuses or loadline sets itself, what planning and rendering refuse of
  the spec (:func:`loadline.policy.refused_now` decides by the error's type), and what the
  operator's safe defaults refuse (images, environment names, code-running flags;
  :func:`loadline.policy.spec_problems` with the chart's settings and the governing policies'
  allowances). Only the spec itself is judged so:
* what depends on other objects, the hub or the cluster is a warning, and reconcile reports it in
  status (a ConfigMap or token Secret not applied yet, a gated repository, a model that fits no GPU
  at all): GitOps applies objects in any order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import kopf

from loadline import telemetry
from loadline.api import FleetPolicy, parse_fleet_policy, parse_inference_model
from loadline.errors import LoadlineError, SpecError
from loadline.handlers import _inputs, _policies
from loadline.hub import ConfigCache
from loadline.policy import (
    admit,
    combine,
    defaults_patch,
    enforced,
    refused_now,
    select_policies,
    spec_problems,
)
from loadline.render import render_manifests
from loadline.settings import OperatorSettings

log = logging.getLogger("loadline.admission")

DENIED = 403
"""The code of a refusal: kubectl prints ``Error from server (Forbidden)`` and the message."""


def spec_unchanged(operation: str | None, body: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """An UPDATE that leaves ``spec`` as it was: admitted as is (see the module's docstring)."""
    return operation == "UPDATE" and old is not None and (old.get("spec") or {}) == (body.get("spec") or {})


#: Where an answer's result and time go: :func:`loadline.telemetry.record_admission` in the
#: process serving /metrics, a relay to it in the admission process (its kopf memo's ``record_admission``).
Recorder = Callable[[str, str, float], None]


@contextmanager
def _reviewed(
    webhook: str, warnings: list[str] | None = None, record: Recorder = telemetry.record_admission
) -> Iterator[None]:
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
        record(webhook, result, time.monotonic() - started)


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
    hub: ConfigCache,
    record: Recorder = telemetry.record_admission,
) -> None:
    """Fill the spec's unset fields with the enforcing policies' defaults (highest priority first)."""
    with _reviewed(telemetry.MUTATE_MODEL, record=record):
        if spec_unchanged(operation, body, old) or not policies:
            return
        try:
            inputs = _inputs.model_inputs(body, settings, hub)
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


def _planned_problems(inputs: _inputs.ModelInputs, warnings: list[str]) -> list[LoadlineError]:
    """Plan and render the model as reconcile would (without the cluster's free GPUs): what the spec
    alone decides is returned to refuse, the rest (no GPU fits, the config.json) becomes a warning.

    Only when the model's config.json comes from the spec (inline or loadline's catalog): with a
    ConfigMap's or the hub's, a refusal would depend on another object, which GitOps may fix later."""
    try:
        plan = inputs.plan()
        render_manifests(inputs.obj, plan)
    except LoadlineError as exc:
        from_spec = inputs.config is None and inputs.hub is None
        if from_spec and refused_now(exc):
            return [exc]
        warnings.append(f"loadline: {exc}; the operator will report it in status")
    return []


def validate_model(
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    operation: str | None,
    warnings: list[str],
    policies: list[FleetPolicy],
    settings: OperatorSettings,
    hub: ConfigCache,
    record: Recorder = telemetry.record_admission,
) -> None:
    """Refuse a spec loadline cannot read or never run, one the operator's safe defaults refuse, or one
    a deny policy forbids, one line per problem; warn for what depends on other objects, warn and
    dryrun policies."""
    with _reviewed(telemetry.VALIDATE_MODEL, warnings, record):
        if spec_unchanged(operation, body, old):
            return
        try:
            obj = parse_inference_model(_object(body), unknown="ignore")
        except SpecError as exc:
            raise kopf.AdmissionError(str(exc), code=DENIED) from None
        governing = _governing(body, policies)
        problems: list[LoadlineError] = list(spec_problems(obj.spec, settings.guard(), governing))
        inputs = None
        try:
            inputs = _inputs.model_inputs(body, settings, hub)
        except (LoadlineError, kopf.TemporaryError) as exc:
            if isinstance(exc, LoadlineError) and refused_now(exc):
                problems.append(exc)
            else:
                # Another object or the hub (a ConfigMap or Secret not applied yet, a gated repository):
                # the cluster's state of the moment, not the spec's fault. GitOps applies in any order.
                warnings.append(f"loadline: not fully checked now ({exc}); the operator will")
        if inputs is not None and not problems:
            problems.extend(_planned_problems(inputs, warnings))
        if problems:
            raise kopf.AdmissionError("\n".join(str(p) for p in problems), code=DENIED)
        if not governing or inputs is None:
            return
        try:
            admission = admit(inputs.obj.spec, governing, inputs.plan)
        except LoadlineError:  # fits no GPU even without the policies: warned above, reconcile reports it
            return
        warnings.extend(admission.decision.warnings)
        if not admission.decision.allowed:
            raise kopf.AdmissionError(admission.decision.message, code=DENIED)


def validate_policy(body: Mapping[str, Any], record: Recorder = telemetry.record_admission) -> None:
    """Refuse a FleetPolicy the operator could not apply (a version range, a timezone, a window the
    schema cannot check), naming the field and the fix."""
    with _reviewed(telemetry.VALIDATE_POLICY, record=record):
        try:
            parse_fleet_policy(
                body, source=f"FleetPolicy {body.get('metadata', {}).get('name', '?')}", unknown="ignore"
            )
        except LoadlineError as exc:
            raise kopf.AdmissionError(str(exc), code=DENIED) from None
