"""Create, update and resume of an InferenceModel: resolve → plan → render → apply → status.

One function per event shape, all the same flow, because kopf calls create/update/resume for the same
reason: make the children match the spec. Each step's failure is classified once:

- a spec that can never work (bad field, no GPU type fits, flag the vLLM version lacks) → status Failed,
  a Warning Event, and ``kopf.PermanentError`` (no retries until the spec changes);
- the world is not ready (ConfigMap missing, no free GPUs, API errors) → status Pending, an Event, and
  ``kopf.TemporaryError(delay=…)`` so kopf retries with back-off.

Events and status are written only when something changed, so a resync of an unchanged object makes no
write at all.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from loadline.api import FleetPolicy, InferenceModelStatus, Phase, parse_inference_model
from loadline.errors import (
    LoadlineError,
    NoCapacityError,
    NoFeasiblePlanError,
    NotAllowedError,
    SpecError,
)
from loadline.handlers import _apply, _events, _kube, _plan, _policies, _upgrade
from loadline.handlers._inputs import ModelInputs
from loadline.policy import select_policies, spec_problems
from loadline.settings import OperatorSettings
from loadline.sizing import ClusterView, Plan, beyond_tables
from loadline.status import build as _build
from loadline.status import read_status, stored, with_changes

if TYPE_CHECKING:
    from loadline.handlers._state import OperatorState


def reconcile(
    state: OperatorState,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: logging.Logger | kopf.Logger,
    settings: OperatorSettings,
    view: ClusterView | None = None,
    policies: list[FleetPolicy] | None = None,
) -> None:
    """Bring an InferenceModel's children to what its spec asks for, and say whether it keeps the
    FleetPolicies that govern it (``policies``: every FleetPolicy of the cluster).

    Under the model's lock (:meth:`RollOuts.lock`), so that a crash's roll-out never lands between this
    reconcile's guard check and its apply. A version older than a remediation being rolled out is
    not reconciled: kopf tries again shortly, on the newest version it has seen by then (returning
    would count the change it brought, a spec edit, as handled)."""
    meta = body["metadata"]
    with state.roll_outs.lock(meta["namespace"], meta["name"]):
        if state.roll_outs.predates(body):
            raise kopf.TemporaryError(
                "this version predates a remediation being rolled out; reconciling the newer one", delay=1
            )
        policies = policies or []
        inputs, plan, manifests = _plan_or_fail(state, body, patch, settings, view, policies)
        _require_apis(body, patch, manifests, settings)
        gated = _upgrade.gate(body, patch, manifests, settings)
        if gated is None:
            return  # another loadline's pods run until their roll (docs/upgrades.md)
        body, manifests = cast(kopf.Body, gated[0]), gated[1]
        changed = _apply_or_fail(state, body, patch, logger, plan, manifests, settings)
        state.capacity.note_planned(f"{meta['namespace']}/{meta['name']}", plan, inputs.obj.spec.replicas)
        _write_deployed(state, body, patch, logger, inputs, plan, changed, manifests, policies)


def _refuse_unsafe(body: Mapping[str, Any], settings: OperatorSettings, policies: list[FleetPolicy]) -> None:
    """Raise the first problem the spec alone decides (the admission webhook refused it with all of
    them): a model stored without the webhooks, or before the settings or its policies changed, is
    never run with an image, environment or code-running flag the operator's safe defaults refuse."""
    meta = body["metadata"]
    namespace = str(meta["namespace"])
    labels = _policies.namespace_labels(namespace, policies)
    governing = select_policies(policies, namespace, labels, meta.get("labels") or {})
    spec = parse_inference_model(
        {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}, unknown="ignore"
    ).spec
    problems = spec_problems(spec, settings.guard(), governing)
    if problems:
        raise problems[0]


def _plan_or_fail(
    state: OperatorState,
    body: kopf.Body,
    patch: kopf.Patch,
    settings: OperatorSettings,
    view: ClusterView | None,
    policies: list[FleetPolicy],
) -> tuple[ModelInputs, Plan, list[dict[str, Any]]]:
    """The plan and its manifests; a failure is written (status, Event) and raised as kopf's error."""
    meta = body["metadata"]
    try:
        _refuse_unsafe(body, settings, policies)
        return _plan.plan_and_render(state, body, settings, view)
    except NoCapacityError as exc:
        message = _rejection_message(exc)
        refused = state.capacity.refusal(f"{meta['namespace']}/{meta['name']}")
        if refused is not None:
            message = f"{message}; the scheduler cannot place its pods on {refused[0]}: {refused[1]}"
        _fail(body, patch, reason="NoCapacity", message=message, phase="Pending")
        raise kopf.TemporaryError(str(exc), delay=settings.retry_delay_seconds) from None
    except NoFeasiblePlanError as exc:
        _fail(body, patch, reason="NoFeasiblePlan", message=_rejection_message(exc), phase="Failed")
        raise kopf.PermanentError(str(exc)) from None
    except NotAllowedError as exc:
        _fail(body, patch, reason="NotAllowed", message=str(exc), phase="Failed")
        raise kopf.PermanentError(str(exc)) from None
    except SpecError as exc:
        _fail(body, patch, reason="InvalidSpec", message=str(exc), phase="Failed")
        raise kopf.PermanentError(str(exc)) from None
    except kopf.TemporaryError as exc:
        _fail(body, patch, reason="Waiting", message=str(exc), phase="Pending", warn=False)
        raise
    except LoadlineError as exc:
        _fail(body, patch, reason="Error", message=str(exc), phase="Failed")
        raise kopf.PermanentError(str(exc)) from None


def _require_apis(
    body: kopf.Body, patch: kopf.Patch, manifests: list[dict[str, Any]], settings: OperatorSettings
) -> None:
    """Pending, and retried, while the cluster does not serve a kind the children need."""
    missing = sorted(
        {
            f"{m['kind']} ({m['apiVersion']})"
            for m in manifests
            if not _kube.has_kind(m["apiVersion"], m["kind"])
        }
    )
    if missing:
        message = (
            f"the cluster does not serve {', '.join(missing)}; install it "
            "(multi-node replicas need the LeaderWorkerSet controller, sigs.k8s.io/lws; spec.autoscaling "
            "needs KEDA, keda.sh)"
        )
        _fail(body, patch, reason="MissingAPI", message=message, phase="Pending")
        raise kopf.TemporaryError(message, delay=max(settings.retry_delay_seconds, 60))


def _apply_or_fail(
    state: OperatorState,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: logging.Logger | kopf.Logger,
    plan: Plan,
    manifests: list[dict[str, Any]],
    settings: OperatorSettings,
) -> _apply.Applied:
    """Apply the children, and remove those of another layout. Refused by the API server (an admission
    policy, a quota, a conflict) or not reachable: the plan stands; kopf calls reconcile again after the
    delay until the children land."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    # Children of another layout are left only by a re-plan across layouts: listing every child kind
    # of the model on each reconcile cost four requests per model at creation, resume and remediation.
    relaid = _build.layout_changed(read_status(body).plan, plan.chosen.nodes)
    applied = _apply.apply_children(state, body, manifests, settings.field_manager)
    removed: list[str] = []
    if applied.error is None:
        try:
            if relaid:
                removed = _apply.remove_stale_children(state, namespace, name, meta["uid"], manifests)
        except ApiException as exc:
            applied.error = exc
    if applied.error is not None:
        message = f"applying the children failed ({_kube.api_error_text(applied.error)}); retrying"
        if applied.workload is not None:
            # The new workload exists, so the old layout may go now rather than after the rest lands:
            # a child of the old layout can be what blocks the rest (an older LeaderWorkerSet's headless
            # Service holding the client Service's name until the garbage collector removes it).
            with contextlib.suppress(ApiException):
                removed = _apply.remove_stale_children(state, namespace, name, meta["uid"], manifests)
            if removed:
                _events.event(body, warning=False, reason="Removed", message="removed " + ", ".join(removed))
        previous = read_status(body)
        status = _build.build_apply_failed_status(
            previous, message=message, generation=meta.get("generation"), now=_build.now_iso()
        )
        changes = _build.status_changes(previous, status)
        if changes:
            patch.status.update(changes)
            _events.event(body, warning=True, reason="ApplyFailed", message=message)
        raise kopf.TemporaryError(message, delay=settings.retry_delay_seconds) from None
    if removed:
        message = "removed " + ", ".join(removed) + " (layout changed)"
        _events.event(body, warning=False, reason="Removed", message=message)
        logger.info("removed %s", ", ".join(removed))
    return applied


def _write_deployed(
    state: OperatorState,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: logging.Logger | kopf.Logger,
    inputs: ModelInputs,
    plan: Plan,
    applied: _apply.Applied,
    manifests: list[dict[str, Any]],
    policies: list[FleetPolicy],
) -> None:
    """The status of the applied plan (with the model's compliance) and one Event per decision."""
    meta = body["metadata"]
    workload = applied.workload or _apply.workload(manifests)
    desired = int((body.get("spec") or {}).get("replicas", 1))
    ready, ready_message = _build.readiness_from_workload(workload, desired)
    previous = read_status(body)
    message = _plan.plan_message(plan)
    status = _build.build_deployed_status(
        previous,
        plan_summary=plan.summary(),
        generation=meta.get("generation"),
        ready=ready,
        ready_message=ready_message,
        now=_build.now_iso(),
        message=message,
        needs_person=inputs.state.needs_person,
        beyond_tables=beyond_tables(plan.inputs.version),
    )
    compliance = _policies.compliance_status(
        body, with_changes(previous, status), inputs.obj.spec, policies, inputs.plan
    )
    # The scale subresource's count and selector, from the workload as the apply's answer holds it: a
    # new model's are written with its first status, not by its workload's first event (which comes
    # before that status exists, and cost a refused write, a read and a write again).
    answer = applied.workload
    scale = _build.scale_changes(meta["name"], answer, desired, previous) if answer is not None else {}
    status = {**status, **compliance, **scale}
    changes = _build.status_changes(previous, status)
    if changes:
        patch.status.update(changes)
    if scale:
        state.scale_counts.note(meta["namespace"], meta["name"], str(meta.get("uid")), scale)
    report_compliance(body, previous, with_changes(previous, changes))
    said = "applied " + ", ".join(applied.changed) if applied.changed else ""
    if applied.changed:
        logger.info("%s", said)
    # One Event per decision: a new plan names the children it changed (a remediation's re-plan was two
    # Events, Planned and Applied, a third of what a crash cost the API server in Events); "Applied"
    # alone is a re-apply under the same plan (a child repaired). A crash's remediation wrote its plan
    # with its decision, which its Remediated Event said: a reconcile taking it over says "Applied".
    if stored(previous).get("plan") != status["plan"]:
        _events.event(
            body, warning=False, reason="Planned", message=(f"{message}; {said}" if said else message)[:1000]
        )
        _events.report_fallback(body, plan)
    elif applied.changed:
        _events.event(body, warning=False, reason="Applied", message=said)


def report_compliance(
    body: Mapping[str, Any], previous: InferenceModelStatus, now: InferenceModelStatus
) -> None:
    """An Event when the set of FleetPolicies the model breaks changes (not on every resync): ``now``
    is the status once written."""
    before, after = previous.violated_policies, now.violated_policies
    if before == after:
        return
    message = next((c.message for c in now.conditions if c.type == _build.POLICY_COMPLIANT), "")
    reason = "PolicyViolation" if after else "PolicyCompliant"
    _events.event(body, warning=bool(after), reason=reason, message=message[:1000])


def _fail(
    body: Mapping[str, Any], patch: kopf.Patch, *, reason: str, message: str, phase: Phase, warn: bool = True
) -> None:
    previous = read_status(body)
    status = _build.build_failed_status(
        previous,
        reason=reason,
        message=message,
        generation=body["metadata"].get("generation"),
        now=_build.now_iso(),
        phase=phase,
    )
    changes = _build.status_changes(previous, status)
    if changes:
        patch.status.update(changes)
        _events.event(body, warning=warn, reason=reason, message=message)


def _rejection_message(exc: NoFeasiblePlanError) -> str:
    lines = "; ".join(exc.rejections[:6])
    return (f"{exc}" + (f" — {lines}" if lines else ""))[:2000]
