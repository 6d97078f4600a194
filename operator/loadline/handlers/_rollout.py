"""A crash's remediation rolled out by the crash's own handler, and its hand-over to reconcile.

The decision's status patch carries the plan (:func:`plan_remediation`); the workload alone is then
applied (:func:`apply_remediation`); what that path cannot do is handed to reconcile by an annotation
(:func:`ask_reconcile`). Reconcile and the roll-out coordinate through
:class:`loadline.state.RollOuts`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes.client.exceptions import ApiException

from loadline import __version__
from loadline.api import FleetPolicy
from loadline.errors import LoadlineError
from loadline.handlers import _events, _kube, _plan, _policies
from loadline.handlers._apply import WORKLOAD_KINDS, fingerprint
from loadline.settings import OperatorSettings
from loadline.sizing import ClusterView, Plan
from loadline.status import build as _build
from loadline.status import read_status, with_changes
from loadline.upgrade import stamped

if TYPE_CHECKING:
    from loadline.handlers._state import OperatorState

#: Set on the model when a crash's remediation is left to reconcile (the crash's id): kopf's update
#: handler sees the change and reconciles. Outside the "loadline.dev/" prefix on purpose: kopf leaves
#: annotations of its own storage prefix out of the diff it triggers update handlers on.
REMEDIATION_ANNOTATION = "remediation.loadline.dev/crash"
#: Attempts at the annotation that asks reconcile to take a remediation over, and the pause before the next.
ASK_ATTEMPTS = 3
ASK_PAUSE_SECONDS = 1.0


def ask_reconcile(body: Mapping[str, Any], crash: str, logger: logging.Logger | kopf.Logger) -> bool:
    """Stamp ``crash`` as :data:`REMEDIATION_ANNOTATION` on the model, so that kopf runs reconcile on
    it: the plan, every child and the status, with kopf's retries. The path of a remediation the crash's
    own roll-out cannot make (:func:`plan_remediation` said no, or its apply was refused).

    A refused write is tried :data:`ASK_ATTEMPTS` times (a crash already decided is not decided
    again, so nothing else would write it). True when it was written."""
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    for attempt in range(ASK_ATTEMPTS):
        try:
            _kube.annotate(body, {REMEDIATION_ANNOTATION: crash})
        except ApiException as exc:
            if exc.status == 404 or attempt == ASK_ATTEMPTS - 1:
                logger.error(
                    "%s/%s: the remediation of %s was not handed to reconcile (%s)",
                    namespace, name, crash, _kube.api_error_text(exc),
                )  # fmt: skip
                return False
            time.sleep(ASK_PAUSE_SECONDS * 2**attempt)
            continue
        return True
    return False


@dataclass(frozen=True)
class Remediation:
    """A crash's remediation planned before its decision is written. Its ``status`` (the plan, what
    reconcile would write for it) goes in the decision's one status patch and its ``workload`` is then
    applied by the crash's roll-out: one plan, one status write and one apply per crash, where the
    roll-out used to be followed by an annotation asking reconcile to plan and render again and
    write the plan (two more writes of the model and a second plan per crash, a third of the
    operator's time in a burst of 1,000)."""

    plan: Plan
    replicas: int
    workload: dict[str, Any]
    status: _build.Status


def plan_remediation(
    state: OperatorState,
    body: Mapping[str, Any],
    settings: OperatorSettings,
    view: ClusterView | None = None,
    policies: list[FleetPolicy] | None = None,
) -> Remediation | None:
    """The remediation of ``body`` (the model with the decision's status merged in) when its roll-out
    is the workload alone: None, leaving it to reconcile, when the plan fails, the model moves between
    layouts (reconcile removes the old one's children), another child would change or this process has
    not applied the others for this generation (a restart, a shard handed over: reconcile applies them
    all), or what the model keeps of its FleetPolicies would change (reconcile writes it and the
    policies' counts)."""
    meta = body["metadata"]
    try:
        inputs, plan, manifests = _plan.plan_and_render(state, body, settings, view)
    except (LoadlineError, kopf.TemporaryError):
        return None
    previous = read_status(body)
    if _build.layout_changed(previous.plan, plan.chosen.nodes):
        return None
    owner = _build.build_owner_reference(body)
    workload = None
    for manifest in manifests:
        child = _build.with_owner(manifest, owner, meta["namespace"])
        if child["kind"] in WORKLOAD_KINDS:
            # Stamped as reconcile stamps it (docs/upgrades.md): an apply without the stamp would take
            # it off (server-side apply drops what the manager no longer sends).
            workload = stamped(child, __version__)
        elif not state.applied.already(meta, child, fingerprint(child)):
            return None
    if workload is None:
        return None
    status = _build.build_replanned_status(
        previous, plan_summary=plan.summary(), generation=meta.get("generation"), now=_build.now_iso(),
        message=_plan.plan_message(plan),
    )  # fmt: skip
    judged = with_changes(previous, status)
    compliance = _policies.compliance_status(body, judged, inputs.obj.spec, policies or [], inputs.plan)
    if _build.status_changes(judged, compliance):
        return None
    return Remediation(plan, inputs.obj.spec.replicas, workload, _build.status_changes(previous, status))


def paused(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The Deployment with ``spec.paused``: its template carries the fix, its controller rolls nothing
    until an apply without it (server-side apply drops a field its manager no longer sends)."""
    return {**workload, "spec": {**(workload.get("spec") or {}), "paused": True}}


def apply_remediation(
    state: OperatorState,
    body: Mapping[str, Any],
    remediation: Remediation,
    logger: logging.Logger | kopf.Logger,
    settings: OperatorSettings,
    *,
    hold: bool = False,
) -> bool:
    """Apply a remediation's workload (``body``: the model as the decision's write answered), paused
    when it is to ``hold`` for a roll-out slot. False when the API server refused it: reconcile then
    takes it over, with kopf's retries."""
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    child = paused(remediation.workload) if hold else remediation.workload
    with state.roll_outs.lock(namespace, name):
        try:
            result, changed = _kube.apply(child, settings.field_manager, state.versions)
        except ApiException as exc:
            error = _kube.api_error_text(exc)
            logger.info("%s/%s: remediation left to reconcile (%s)", namespace, name, error)
            state.roll_outs.settled(namespace, name)  # reconcile's apply decides readiness now
            return False
    state.roll_outs.applied(namespace, name, (result.get("metadata") or {}).get("generation"))
    state.applied.note(meta, child, fingerprint(child))
    state.capacity.note_planned(f"{namespace}/{name}", remediation.plan, remediation.replicas)
    if changed:
        verb = "applied paused, waiting for a roll-out slot:" if hold else "rolled out"
        logger.info("%s %s/%s", verb, child["kind"], child["metadata"]["name"])
    if not hold:
        _events.report_fallback(body, remediation.plan)
    return True


def roll_out(
    state: OperatorState,
    settings: OperatorSettings,
    model: dict[str, Any],
    crash: str,
    remediation: Remediation | None,
    logger: logging.Logger | kopf.Logger,
    *,
    paused: bool = False,
) -> None:
    """Apply the remediation's workload (``paused``: it waits for a roll-out slot, and the pacer
    releases it); what it cannot do alone (no remediation planned, the apply refused) is handed to
    reconcile at once, and takes no slot."""
    meta = model["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    if remediation is None or not apply_remediation(state, model, remediation, logger, settings, hold=paused):
        state.pacer.cancel(key)
        state.roll_outs.settled(str(meta["namespace"]), str(meta["name"]))  # reconcile's apply decides
        ask_reconcile(model, crash, logger)
        return
    if paused:
        fix, lane = remediation, state.lanes.models
        state.pacer.hold(key, lambda: lane.submit(release, state, settings, model, crash, fix, logger))


def release(
    state: OperatorState,
    settings: OperatorSettings,
    model: dict[str, Any],
    crash: str,
    remediation: Remediation,
    logger: logging.Logger | kopf.Logger,
) -> None:
    """A paused remediation's turn: its workload applied again, unpaused (refused: reconcile)."""
    meta = model["metadata"]
    logger.info("%s/%s: its roll-out slot came; rolling out the remediation", meta["namespace"], meta["name"])
    if not apply_remediation(state, model, remediation, logger, settings):
        state.pacer.finished(f"{meta['namespace']}/{meta['name']}")
        ask_reconcile(model, crash, logger)
