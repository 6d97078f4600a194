"""Whether a model's workload is available: mirrored from its Deployment's watch events and from its
current template's pods turning Ready, and looked at on a back-off while Deploying (with the scheduler's
reason when its pods cannot be placed)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes.client.exceptions import ApiException

from loadline.api import API_VERSION, KIND, InferenceModelStatus
from loadline.handlers import _events, _kube
from loadline.handlers._plan import REPLAN_ANNOTATION
from loadline.render import workload_ref
from loadline.state import INSTANCE_LABEL
from loadline.status import build as _build
from loadline.status import read_status

if TYPE_CHECKING:
    from loadline.handlers._state import OperatorState


def says_nothing_yet(
    state: OperatorState, namespace: str, model: str, workload: Mapping[str, Any] | None
) -> bool:
    """Whether the workload's status is no news about the model: its controller has not observed its
    current spec (a restart's surge, a roll-out), or it is the crashed workload before this process's
    remediation of it is applied. The mirrors then wait for the next status."""
    generation = ((workload or {}).get("metadata") or {}).get("generation")
    return not _build.workload_observed(workload) or state.roll_outs.older_than_remediation(
        namespace, model, generation
    )


def new_pods_created(state: OperatorState, workload: Mapping[str, Any], model: str) -> bool:
    """Whether the workload's controller created its current template's pods, and the workload is news
    about the model (not the crashed workload before this process's remediation of it is applied)."""
    namespace = str((workload.get("metadata") or {}).get("namespace"))
    return _build.new_pods_created(workload) and not says_nothing_yet(state, namespace, model, workload)


def replica_set_revision(state: OperatorState, namespace: str, uid: str, name: str) -> str | None:
    """A ReplicaSet's revision, read once a minute at most (:class:`loadline.state.ReadyPods`); None
    when it is gone, renamed, or the operator may not read it (a chart from before its RBAC rule)."""
    revision = state.ready_pods.revisions.get(uid)
    if revision is None:
        try:
            replica_set = _kube.get("apps/v1", "ReplicaSet", namespace, name)
        except ApiException as exc:
            logging.getLogger(__name__).debug("ReplicaSet %s/%s not read: %s", namespace, name, exc.status)
            return None
        meta = (replica_set or {}).get("metadata") or {}
        if meta.get("uid") != uid:
            return None
        revision = str((meta.get("annotations") or {}).get(_build.REVISION_ANNOTATION) or "")
        state.ready_pods.revisions[uid] = revision
    return revision or None


def current_ready_pods(state: OperatorState, workload: Mapping[str, Any] | None, model: str) -> int | None:
    """How many of the model's pods of its Deployment's current template are Ready, from the pod watch
    (:class:`loadline.state.ReadyPods`): those of the ReplicaSet whose revision is the Deployment's
    current one (:func:`_build.current_revision`). None when the Deployment's controller has not
    observed its spec yet, or no ReplicaSet of the model has a Ready pod."""
    revision = _build.current_revision(workload)
    if revision is None or workload is None:
        return None
    namespace = str((workload.get("metadata") or {}).get("namespace"))
    for (uid, name), ready in state.ready_pods.of_model(namespace, model).items():
        if replica_set_revision(state, namespace, uid, name) == revision:
            return ready
    return None


def readiness(
    state: OperatorState, workload: Mapping[str, Any] | None, desired: int, model: str
) -> tuple[bool, str]:
    """(ready, message): the workload's own status, else its current template's Ready pods (only read
    when the status does not say Ready, which is the steady state of a serving model)."""
    ready, message = _build.readiness_from_workload(workload, desired)
    if ready:
        return ready, message
    return _build.readiness_from_workload(workload, desired, current_ready_pods(state, workload, model))


def on_pod_ready(
    state: OperatorState,
    pod: Mapping[str, Any],
    logger: logging.Logger | kopf.Logger,
    known: Mapping[str, Any] | None = None,
) -> None:
    """A model's pod turned Ready while the model is not: mirror the model's Deployment as its watch
    last showed it, with its current template's Ready pods counted (:func:`readiness`)."""
    meta = pod.get("metadata") or {}
    model = str((meta.get("labels") or {}).get(INSTANCE_LABEL))
    _, _, workload_name = workload_ref(model, False)
    workload = state.workloads.get(str(meta.get("namespace")), workload_name)
    if workload is not None:
        on_workload_event(state, workload, logger, known)  # its scale count rides along when it moved


def needs_readiness(known: Mapping[str, Any] | None) -> bool:
    """Whether a pod turning Ready can change the model's phase: it is Deploying, or not indexed yet."""
    return known is None or read_status(known).phase == "Deploying"


def on_workload_event(
    state: OperatorState,
    body: Mapping[str, Any],
    logger: logging.Logger | kopf.Logger,
    known: Mapping[str, Any] | None = None,
) -> Mapping[str, Any] | None:
    """A child Deployment/LeaderWorkerSet changed: mirror its availability into the parent's status.

    ``known``: the parent as the operator's index last saw it (:func:`_index.model_entry`). Decided on
    that first, so most events cost no request (nothing changed) or one (the status patch); the patch
    is refused only when what the decision read (:func:`_build.build_readiness_patch`) changed
    meanwhile, and the parent is read again then. A readiness write carries the scale subresource's
    count along when it moved too (one write where there were two, each of which the other's refused).

    Returns the parent as this call last saw it (the write's answer, the copy read, else ``known``),
    for the scale subresource's sync to decide on; None when the parent is gone."""
    meta = body.get("metadata", {})
    owners = [o for o in meta.get("ownerReferences", []) or [] if o.get("kind") == KIND]
    if not owners:
        return known
    if says_nothing_yet(state, str(meta.get("namespace")), owners[0]["name"], body):
        return known
    if known is not None and state.roll_outs.predates(known):
        # The index has not seen this process's own decision yet (it said Deploying, Remediating):
        # judged on that older entry, the roll-out's end would look like no change, and the model
        # would stay Deploying until the readiness timer's next look, up to a minute later.
        known = None
    for attempt in range(_kube.CONFLICT_RETRIES):
        parent = (
            dict(known)
            if attempt == 0 and known is not None
            else _kube.get(API_VERSION, KIND, meta.get("namespace"), owners[0]["name"])
        )
        if parent is None or parent["metadata"].get("uid") != owners[0].get("uid"):
            return None
        desired = int((parent.get("spec") or {}).get("replicas", 1))
        ready, message = readiness(state, body, desired, owners[0]["name"])
        previous = read_status(parent)
        changes = _build.build_readiness_status(previous, ready=ready, message=message, now=_build.now_iso())
        if changes is None:
            return parent
        try:
            sets, tested = _build.build_readiness_patch(previous, changes)
            namespace, name, uid = str(meta.get("namespace")), owners[0]["name"], str(owners[0].get("uid"))
            # The count as this process last wrote it, which the index may not show yet.
            counted = state.scale_counts.over(previous, namespace, name, uid)
            scale = _build.scale_changes(name, body, desired, counted)
            sets.update({f"/status/{key}": value for key, value in scale.items()})
            written = _kube.patch_status_tested(parent, sets, tested, {**changes, **scale})
            if scale:
                state.scale_counts.note(namespace, name, uid, scale)
            break
        except _kube.Changed:
            # What readiness is decided on changed between our read and write (reconcile wrote a
            # phase): read it again and decide again, rather than dropping the workload's news.
            logger.info(
                "%s/%s changed meanwhile; deciding its readiness again",
                meta.get("namespace"),
                owners[0]["name"],
            )
    else:
        raise kopf.TemporaryError("the InferenceModel kept changing; retrying its readiness", delay=1)
    if changes.get("phase") != previous.phase:
        logger.info("%s/%s is %s: %s", meta.get("namespace"), owners[0]["name"], changes["phase"], message)
    # Whether loadline's own restart rolls the pods, as the model was when written (a crash's roll-out
    # starts before the index shows the decision that started it).
    reason = _build.readiness_event_reason(previous, changes, read_status(written))
    if reason:
        _events.event(parent, warning=False, reason=reason, message=message)
    return written


def check_readiness(
    state: OperatorState, body: kopf.Body, patch: kopf.Patch, memo: MutableMapping[str, Any]
) -> None:
    """Level-triggered check while Deploying: catches availability that no child event reported.

    The child's events can arrive before the parent's first status is written (KWOK and small models
    become available within a second); this timer closes that race without a write when idle. It backs
    off (:func:`_build.readiness_check_due`); a Deployment is read as its watch events last showed it
    (:class:`loadline.state.SeenWorkloads`; a LeaderWorkerSet, not watched, with a GET); the
    unbound pods are looked at for an unschedulable reason once the model has been Deploying for
    :data:`UNSCHEDULABLE_AFTER_SECONDS`, until the reason for this version of the workload is found
    (:func:`unbound_pods`, one LIST per namespace shared by the looks of a few seconds): a stuck model
    costs one shared read a minute at most and no writes.
    """
    if readiness_due(state.status_reads.read(body), memo):
        read_readiness(state, body, patch, memo)


def readiness_due(status: InferenceModelStatus, memo: MutableMapping[str, Any]) -> bool:
    """Whether the back-off says to look now (then the look is noted in ``memo``), from the model's
    status (:class:`loadline.state.StatusReads`: read once per version, as this is asked every tick).
    No I/O: the timer asks this on kopf's event loop and takes a thread only when a look is due."""
    now = datetime.now(UTC)
    # Without a Ready condition to date it, the episode starts when this process first saw it.
    since = _build.deploying_since(status) or memo.setdefault("readiness_first_seen", now)
    elapsed = (now - since).total_seconds()
    if memo.get("readiness_since") != since:  # a new Deploying episode: its back-off starts over
        memo.update(
            readiness_since=since,
            readiness_checked_at=None,
            readiness_workload_version=None,
            readiness_reason_version=None,
        )
    if not _build.readiness_check_due(elapsed, memo.get("readiness_checked_at")):
        return False
    memo["readiness_checked_at"] = elapsed
    return True


UNSCHEDULABLE_AFTER_SECONDS = 20.0
"""How long a model is Deploying before its pods are looked at for the scheduler's reason: pods of a
burst wait a few seconds for the scheduler anyway, and the reason matters for a model that stays stuck."""


def unbound_pods(state: OperatorState, namespace: str, name: str) -> list[dict[str, Any]]:
    """The model's pods that no node holds yet, the only ones the scheduler can have a reason for.

    Unbound pods are not in the operator's pod watch (it takes bound pods only, for capacity), so they
    are listed: one LIST per namespace (loadline's pods, ``spec.nodeName=``) serves every model that
    looks within the age of ``state.unbound_pods``, instead of a LIST per model (at fleet scale a
    burst's models all pass 20 s Deploying together: a LIST per model was a tenth of the operator's
    requests)."""

    def read() -> dict[str, list[dict[str, Any]]]:
        by_model: dict[str, list[dict[str, Any]]] = {}
        pods = _kube.list_objects(
            "v1", "Pod", namespace, label_selector=INSTANCE_LABEL, field_selector="spec.nodeName="
        )
        for pod in pods:
            meta = pod.get("metadata") or {}
            conditions = (pod.get("status") or {}).get("conditions") or []
            by_model.setdefault(str((meta.get("labels") or {}).get(INSTANCE_LABEL)), []).append(
                {  # trimmed to what _build.unschedulable_reason reads: kept until the next LIST
                    "metadata": {"name": meta.get("name")},
                    "status": {"conditions": [c for c in conditions if c.get("type") == "PodScheduled"]},
                }
            )
        return by_model

    return state.unbound_pods.get(namespace, read).get(name, [])


def read_readiness(
    state: OperatorState,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: MutableMapping[str, Any],
    replan: bool = False,
) -> None:
    """The look itself: the workload (and, when it is not ready, its unbound pods' scheduling).

    ``replan`` (capacity-aware planning): a pod the scheduler cannot place has the model re-planned
    with its GPU type counted full (:meth:`loadline.sizing.CapacityBook.scheduler_refusal`): another
    type, or Pending with the scheduler's reason and the fix, rather than Deploying for as long as no
    room is made."""
    status = read_status(body)
    multi_node = status.plan is not None and status.plan.nodes_per_replica > 1
    meta = body["metadata"]
    api_version, kind, workload_name = workload_ref(meta["name"], multi_node)
    workload = None if multi_node else state.workloads.get(meta["namespace"], workload_name)
    if workload is None:
        workload = _kube.get(api_version, kind, meta["namespace"], workload_name)
    if says_nothing_yet(state, meta["namespace"], meta["name"], workload):
        return
    ready, message = readiness(
        state, workload, int((body.get("spec") or {}).get("replicas", 1)), meta["name"]
    )
    version = ((workload or {}).get("metadata") or {}).get("resourceVersion")
    unchanged = version is not None and memo.get("readiness_workload_version") == version
    memo["readiness_workload_version"] = version
    unschedulable = ""
    elapsed = memo.get("readiness_checked_at") or 0.0
    # The pods are looked at until the scheduler's reason is found for this version of the workload
    # (a pod still waiting for the scheduler has none yet); then not again until the workload moves.
    look_at_pods = (
        not ready
        and elapsed >= UNSCHEDULABLE_AFTER_SECONDS
        and memo.get("readiness_reason_version") != version
    )
    if not ready and unchanged and not look_at_pods:
        return  # nothing moved since the last look (the message in status already says why)
    if look_at_pods:
        unschedulable = _build.unschedulable_reason(unbound_pods(state, meta["namespace"], meta["name"]))
        if unschedulable:
            memo["readiness_reason_version"] = version
            message = f"{message}; {unschedulable}"
            gpu_type = "" if status.plan is None else status.plan.gpu_type
            if replan and gpu_type:
                state.capacity.note_unschedulable(
                    f"{meta['namespace']}/{meta['name']}", gpu_type, unschedulable
                )
                with contextlib.suppress(ApiException):  # the next look, or reconcile's retry, re-plans
                    _kube.annotate(body, {REPLAN_ANNOTATION: str(version)})
    changes = _build.build_readiness_status(
        status, ready=ready, message=message, now=_build.now_iso(), stuck=bool(unschedulable)
    )
    if workload is not None:
        # A LeaderWorkerSet is not watched: its group count reaches the scale subresource at each look.
        # A Deployment's comes from its watch events (loadline.handlers._scale), and from here when it
        # moved before the model had a status to write it in.
        desired = int((body.get("spec") or {}).get("replicas", 1))
        uid = str(meta.get("uid"))
        counted = state.scale_counts.over(status, meta["namespace"], meta["name"], uid)
        moved = _build.scale_changes(meta["name"], workload, desired, counted)
        if moved:
            patch.status.update(moved)
            state.scale_counts.note(meta["namespace"], meta["name"], uid, moved)
    if changes:
        patch.status.update(changes)
        if changes.get("phase") == "Ready":
            _events.event(body, warning=False, reason="Ready", message=message)
        elif unschedulable:
            _events.event(body, warning=True, reason="Unschedulable", message=unschedulable)
