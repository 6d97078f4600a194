"""The scale subresource's status and the per-model gauges, kept off every other handler's path.

``status.replicas`` and ``status.selector`` are what ``kubectl scale``, an HPA and KEDA read through
the InferenceModel's scale subresource: the pods the workload has and the labels that find them. They
are mirrored from the workload's own watch events (a Deployment's ``status.replicas``), written only
when they moved, and held while a new template rolls out (no 1 → 0 → 1 for a one-pod roll-out). The
operator never writes ``spec.replicas``: whoever scales owns it, and reconcile renders the workload
with it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes.client.exceptions import ApiException

from loadline import telemetry
from loadline.api import API_VERSION, KIND, InferenceModel, InferenceModelStatus
from loadline.handlers import _admission, _kube
from loadline.hub import ConfigCache
from loadline.oom import OomClass
from loadline.render import SCALEDOBJECT, render_scaled_object
from loadline.settings import OperatorSettings
from loadline.status import read_status
from loadline.status.build import planned_gpu_gib, scale_changes
from loadline.units import GIB

if TYPE_CHECKING:
    from loadline.handlers._state import OperatorState

__all__ = ["autoscaling_children", "model_gauges", "sync_scale_status", "validate_scale"]


def sync_scale_status(
    state: OperatorState,
    workload: Mapping[str, Any],
    known: Mapping[str, Any] | None,
    logger: logging.Logger | kopf.Logger,
) -> None:
    """Write the owner's ``status.replicas``/``status.selector`` when the workload's count moved.

    ``known``: the owner as the operator last saw it (the readiness mirror's write of the same event,
    which carries the count along, or the index's copy), with what this process wrote of the count
    lately over it (:class:`~loadline.state.ScaleCounts`: the index shows a write later than
    the workload's next event comes). An unchanged count costs no request, and so does a model with no
    status yet: reconcile's first status write carries the count.

    The count is the workload's, decided on its event, and a Deployment's events come one at a time: it
    is written as it is, on condition only that the owner is still the model of that uid (no read
    first: :func:`_kube.set_status_members`). A model with no status yet, or a model of that name that
    is not the owner, refuses that write, and the count is then decided again on the model as the API
    server holds it, as every read-decide-write of the handlers is. A vanished owner is left."""
    meta = workload.get("metadata") or {}
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == KIND), None)
    if owner is None or known is None:
        return
    if "phase" not in read_status(known).model_fields_set:
        # Reconcile has not written the model's first status yet, which carries the count as the apply
        # answered it; one that moved since is written by the readiness look or the next event.
        return
    namespace, name, uid = str(meta.get("namespace")), str(owner["name"]), str(owner.get("uid"))
    counted = state.scale_counts.over(read_status(known), namespace, name, uid)
    changes = _scale_changes(workload, owner, known, counted)
    if changes is None:
        return  # what the operator last saw already holds it: no request
    for attempt in range(1 + _kube.CONFLICT_RETRIES):
        try:
            if attempt == 0:
                _kube.set_status_members(API_VERSION, KIND, namespace, name, uid, changes)
            else:
                parent = _kube.get(API_VERSION, KIND, namespace, name)
                if parent is None or parent["metadata"].get("uid") != uid:
                    return
                fresh = _scale_changes(workload, owner, parent, read_status(parent))
                if fresh is None:
                    return
                changes = fresh
                _kube.patch_status(parent, changes)
            state.scale_counts.note(namespace, name, uid, changes)
            return
        except ApiException as exc:
            if exc.status == 404:
                return
            # The uid-tested write's refusal is 422; a write guarded by the version read, 409.
            if exc.status != (422 if attempt == 0 else 409):
                raise
    logger.warning("status.replicas of %s/%s not written (%d conflicts); the workload's next event writes it",
                   namespace, name, _kube.CONFLICT_RETRIES)  # fmt: skip


def _scale_changes(
    workload: Mapping[str, Any],
    owner: Mapping[str, Any],
    model: Mapping[str, Any],
    status: InferenceModelStatus,
) -> dict[str, Any] | None:
    """The scale status ``model`` needs for ``workload``'s count, when its ``status`` (with this
    process's own writes laid over it) does not hold it yet; None when it does."""
    desired = int((model.get("spec") or {}).get("replicas", 1))
    return scale_changes(str(owner["name"]), workload, desired, status) or None


OOM_CLASSES = tuple(c.value for c in OomClass)


def model_gauges(body: Mapping[str, Any]) -> None:
    """The model's replica and GPU-memory gauges from its spec and status (no I/O)."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    spec, status = body.get("spec") or {}, read_status(body)
    telemetry.MODEL_REPLICAS.labels(namespace, name, "desired").set(int(spec.get("replicas", 1) or 0))
    telemetry.MODEL_REPLICAS.labels(namespace, name, "ready").set(status.replicas or 0)
    telemetry.zero_model(namespace, name, OOM_CLASSES)
    measured = status.measured_gpu_memory
    # The plan's per-GPU budget as measure writes it (plannedGiB), or added up from status.plan.memory
    # before the first reading.
    planned = planned_gpu_gib(status.plan) if measured is None else measured.planned_gi_b
    used = None if measured is None else measured.max_used_gi_b
    for source, value in (("plan", planned), ("measured", used)):
        if value is not None:
            telemetry.MODEL_GPU_MEMORY.labels(namespace, name, source).set(value * GIB)


def _had_autoscaling(body: Mapping[str, Any]) -> bool:
    """Whether the spec last acted on (kopf's diff base, status.lastHandledConfiguration) had it."""
    last = read_status(body).last_handled_configuration
    try:
        handled = json.loads(last) if isinstance(last, str) else {}
    except ValueError:
        return False
    return isinstance(handled, dict) and bool((handled.get("spec") or {}).get("autoscaling"))


def autoscaling_children(
    body: Mapping[str, Any], obj: InferenceModel, settings: OperatorSettings
) -> list[dict[str, Any]]:
    """The model's KEDA ScaledObject (applied with its other children), none without spec.autoscaling;
    the one an autoscaling since removed left is deleted here (replicas stay where it left them)."""
    namespace = str(body["metadata"]["namespace"])
    scaled = render_scaled_object(obj, namespace, settings.prometheus_url)
    if scaled is not None:
        return [scaled]
    if _had_autoscaling(body) and _kube.has_kind(*SCALEDOBJECT):
        _kube.delete(*SCALEDOBJECT, namespace, str(body["metadata"]["name"]))
    return []


def validate_scale(
    scale: Mapping[str, Any],
    warnings: list[str],
    policies: list[Any],
    settings: OperatorSettings,
    hub: ConfigCache,
    record: _admission.Recorder = telemetry.record_admission,
) -> None:
    """Admission of a write to the scale subresource (``kubectl scale``, an HPA, KEDA): the model with
    the new ``spec.replicas`` is judged as an update of its spec would be (a FleetPolicy's maxReplicas,
    its price limit), so a scale beyond them is refused with the field and the fix, never half-applied."""
    meta = scale.get("metadata") or {}
    replicas = (scale.get("spec") or {}).get("replicas")
    name = meta.get("name")
    model = _kube.get(API_VERSION, KIND, meta.get("namespace"), name) if isinstance(name, str) else None
    if model is None or not isinstance(replicas, int):
        return  # the API server answers 404 / refuses the Scale's own schema
    scaled = {**model, "spec": {**(model.get("spec") or {}), "replicas": replicas}}
    _admission.validate_model(scaled, model, "UPDATE", warnings, policies, settings, hub, record)
