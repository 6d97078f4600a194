"""Upgrades of loadline that restart no pod at once: the gate between a model's render and its apply.

Reconcile renders a model's children and, before applying them, asks :func:`gate`. The workload it is
about to apply is compared with the one running (one GET): when the new render would roll the pods and
the running ones were rendered by another loadline version (an upgrade, or a rollback), with the spec
unchanged, :func:`loadline.upgrade.decide_roll` says whether it rolls now. When it waits, nothing of
the model is applied (a Service selecting labels the old pods lack would cut them off), the model says
what would change and why (``status.render``, the ``RenderOutdated`` condition, an Event), and:

- ``window``: ``status.maintenance`` gets a pending remediation, which the maintenance timer rolls in
  the model's restart window under FleetPolicy ``maxConcurrent`` (its roll reconciles the model with
  the restart Running, which this gate lets through: the workload controller rolls the pods one at a
  time, ``maxUnavailable: 1``);
- ``manual``: it waits for ``kubectl annotate inferencemodel NAME upgrade.loadline.dev/approve=<fp>``.

Every workload applied carries the stamp (:func:`loadline.upgrade.stamped`, on the workload's metadata:
stamping an unchanged workload rolls no pod). See docs/upgrades.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from loadline import __version__
from loadline.api import InferenceModelStatus, RenderState
from loadline.handlers import _kube
from loadline.maintenance import MaintenanceRecord, pending_record, record_from_status
from loadline.settings import OperatorSettings
from loadline.status import build as _build
from loadline.status import read_status
from loadline.status.patch import merged
from loadline.upgrade import (
    ANNOTATION_APPROVE,
    decide_roll,
    explain,
    read_stamp,
    render_fingerprint,
    stamped,
    template_differences,
)

__all__ = ["RENDER_OUTDATED", "gate", "waiting"]

RENDER_OUTDATED = "RenderOutdated"
"""Condition: True while a render of this loadline version waits to roll the model's pods."""
_WORKLOADS = frozenset({"Deployment", "LeaderWorkerSet"})


def waiting(status: InferenceModelStatus) -> bool:
    """Whether a render waits for the model's restart (its roll then reconciles the model)."""
    return status.render is not None and bool(status.render.pending_fingerprint)


def _wire(state: RenderState) -> dict[str, Any]:
    """``status.render`` as a merge patch: an unset field is null, so the patch removes what the
    stored stanza has and this one no longer does (a ``pendingFingerprint`` once the render rolled)."""
    return state.model_dump(by_alias=True, mode="json")


def _stored(previous: RenderState | None, state: Mapping[str, Any]) -> bool:
    """Whether ``state`` (with nulls) is what is stored already (without them)."""
    held = {} if previous is None else previous.model_dump(by_alias=True, mode="json", exclude_none=True)
    return held == {k: v for k, v in state.items() if v is not None}


def _with_condition(
    body: Mapping[str, Any], patch: kopf.Patch, outdated: bool, message: str
) -> list[dict[str, Any]] | None:
    """The conditions with RenderOutdated set (None: unchanged, or False and never set)."""
    previous = read_status(body).conditions
    had = next((c for c in previous if c.type == RENDER_OUTDATED), None)
    if had is None and not outdated:
        return None
    status = "True" if outdated else "False"
    if had is not None and had.status == status and had.message == message:
        return None
    reason = "Waiting" if outdated else "Current"
    update = _build.build_condition(
        RENDER_OUTDATED, outdated, reason, message, body["metadata"].get("generation")
    )
    merged = _build.merge_conditions(previous, [update], _build.now_iso())
    patch.status["conditions"] = merged
    return merged


def _event(body: Mapping[str, Any], reason: str, message: str) -> None:
    kopf.event(dict(body), type="Normal", reason=reason, message=message[:1000])  # type: ignore[arg-type]


def gate(
    body: Mapping[str, Any],
    patch: kopf.Patch,
    manifests: list[dict[str, Any]],
    settings: OperatorSettings,
) -> tuple[Mapping[str, Any], list[dict[str, Any]]] | None:
    """The body to reconcile on and the manifests to apply (the workload stamped), or None: nothing
    is applied now, the running pods stay until the roll (the model's status and an Event say why)."""
    index = next((i for i, m in enumerate(manifests) if m["kind"] in _WORKLOADS), None)
    if index is None:
        return body, manifests
    rendered = manifests[index]
    fingerprint = render_fingerprint(rendered)
    out = [*manifests[:index], stamped(rendered, __version__), *manifests[index + 1 :]]
    meta, status = body["metadata"], read_status(body)
    spec_changed = meta.get("generation") != status.observed_generation
    maintenance = record_from_status(status.maintenance)
    restarting = maintenance is not None and maintenance.state == "Running"
    # A new model, a spec change or a running restart rolls the pods whatever runs: no GET for them,
    # only for a resume or a resync (the reconciles an upgrade brings).
    live = (
        None
        if spec_changed or restarting
        else _kube.get(
            rendered["apiVersion"], rendered["kind"], meta["namespace"], rendered["metadata"]["name"]
        )
    )
    stamp = read_stamp(live)
    differences = (
        [] if live is None or stamp.fingerprint == fingerprint else template_differences(live, rendered)
    )
    explained = explain(differences, stamp.version, __version__)
    name = f"-n {meta['namespace']} {meta['name']}"
    approve = f"kubectl annotate inferencemodel {name} {ANNOTATION_APPROVE}={fingerprint}"
    decision = decide_roll(
        differs=bool(differences),
        same_version=stamp.version == __version__,
        spec_changed=spec_changed,
        restarting=restarting,
        urgent=explained.urgent,
        approved=(meta.get("annotations") or {}).get(ANNOTATION_APPROVE) == fingerprint,
        mode=settings.upgrade_roll,
        approve_hint=approve,
    )
    if decision.kind == "apply":
        changes = _applied_render(body, patch, fingerprint, decision.reason)
        return {**body, "status": merged(body.get("status") or {}, changes)}, out
    held = RenderState(
        rendered_by=stamp.version,
        fingerprint=stamp.fingerprint,
        pending_fingerprint=fingerprint,
        changes=list(explained.lines[:50]),
        urgent=explained.urgent,
        decision=decision.reason,
    )
    source = f"loadline {stamp.version}" if stamp.version else "an earlier loadline"
    message = (
        f"loadline {__version__} renders {len(differences)} change(s) to the pods {source} rendered; "
        f"{decision.reason}: {explained.summary}"
    )
    _held_render(body, patch, held, message, schedule=decision.kind == "schedule", maintenance=maintenance)
    return None


def _applied_render(
    body: Mapping[str, Any], patch: kopf.Patch, fingerprint: str, reason: str
) -> dict[str, Any]:
    """This version's render is applied: the status changes that say so (also put in ``patch``)."""
    status = read_status(body)
    state = _wire(RenderState(rendered_by=__version__, fingerprint=fingerprint))
    changes: dict[str, Any] = {}
    if not _stored(status.render, state):
        changes["render"] = state
    if waiting(status):
        _event(body, "RenderRolled", f"rolling the render of loadline {__version__}: {reason}")
    conditions = _with_condition(body, patch, False, f"the pods run what loadline {__version__} renders")
    if conditions is not None:
        changes["conditions"] = conditions
    patch.status.update(changes)
    return changes


def _held_render(
    body: Mapping[str, Any],
    patch: kopf.Patch,
    held: RenderState,
    message: str,
    *,
    schedule: bool,
    maintenance: MaintenanceRecord | None,
) -> None:
    """This version's render waits: status says what differs and why; ``schedule``, for the model's
    next window (a pending plain restart becomes a remediation: only a remediation's roll reconciles
    the model)."""
    status = read_status(body)
    state = _wire(held)
    if not _stored(status.render, state):
        patch.status["render"] = state
    if _with_condition(body, patch, True, message[:32768]) is not None:
        _event(body, RENDER_OUTDATED, message)
    if schedule and (maintenance is None or not maintenance.pending or maintenance.action != "remediation"):
        record = pending_record(maintenance, "remediation", None, datetime.now(UTC))
        patch.status["maintenance"] = _build.maintenance_patch(status.maintenance, record)
