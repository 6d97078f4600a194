"""Pure builders of what the operator writes: status patches, conditions, owner references.

Nothing here imports kopf or a Kubernetes client. A model's status comes in as the API model
(:func:`loadline.status.read.read_status`), and what to write goes out as a merge patch of ``status``
(camelCase, validated by :class:`loadline.api.InferenceModelStatus`), so every decision is unit-tested.
Kubernetes' own objects (Deployments, pods) come in as the API server's dicts. A builder never changes
``lastTransitionTime`` of a condition whose status did not change: that is what keeps a resync of an
unchanged object from writing anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel

from loadline.api import (
    Condition,
    Incident,
    InferenceModelStatus,
    Maintenance,
    MeasuredGpuMemory,
    OOMRisk,
    Phase,
    PlanSummary,
    RemediationState,
)
from loadline.maintenance import MaintenanceRecord, PodState, record_to_status
from loadline.observe import CAPACITY_CONDITION, Observation, capacity_condition, observed_status
from loadline.render import pod_selector
from loadline.risk import OOMRiskEstimate, oom_risk_condition, oom_risk_status
from loadline.status.patch import merged
from loadline.status.read import stored

Status = dict[str, Any]

PLANNED, DEPLOYED, READY = "Planned", "Deployed", "Ready"

ENGINE_TABLES = "EngineVersionKnown"
"""False while ``spec.engine.version`` is newer than every table loadline plans with (the message names
the newest used); written only once that happens, and True again after."""

REMEDIATING = "Remediating"
"""The Ready condition's reason while a crash's remediation rolls out: said by the decision's own write
(:func:`build_remediating_status`) and kept until the workload is available or cannot be scheduled."""


def iso(moment: datetime) -> str:
    """A time as the API server writes it: whole seconds, UTC, ``Z``."""
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def now_iso() -> str:
    return iso(datetime.now(UTC))


def _wire(model: BaseModel) -> dict[str, Any]:
    """A model as the API server stores it: camelCase, JSON types, and no null for what is unset."""
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def _status_patch(**fields: Any) -> Status:
    """A partial ``status`` with just ``fields`` (by their Python names), validated by
    :class:`loadline.api.InferenceModelStatus`: a misspelt field or a phase the CRD does not allow
    fails here, in a unit test, instead of being pruned by the API server without a word."""
    # Nested models go in as their full wire form: "unset" must mean only "a field not given here",
    # never a nested default (a merge patch would then keep a stale stored value).
    wire = {key: _wire(value) if isinstance(value, BaseModel) else value for key, value in fields.items()}
    status = InferenceModelStatus.model_validate(wire)
    return status.model_dump(by_alias=True, mode="json", exclude_unset=True, exclude_none=True)


def build_condition(
    kind: str, ok: bool | None, reason: str, message: str, generation: int | None
) -> Condition:
    status: Literal["True", "False", "Unknown"] = "Unknown" if ok is None else ("True" if ok else "False")
    return Condition(type=kind, status=status, reason=reason, message=message, observed_generation=generation)


def merge_conditions(
    previous: Iterable[Condition], updates: Iterable[Condition], now: str
) -> list[dict[str, Any]]:
    """Conditions after ``updates``, as written; a condition keeps its transition time while its
    status holds."""
    merged: dict[str, dict[str, Any]] = {c.type: _wire(c) for c in previous}
    for update in updates:
        old = merged.get(update.type)
        kept = old is not None and old.get("status") == update.status and old.get("lastTransitionTime")
        transition = str(old["lastTransitionTime"]) if kept and old is not None else now
        merged[update.type] = _wire(
            Condition.model_validate({**_wire(update), "lastTransitionTime": transition})
        )
    order = {PLANNED: 0, DEPLOYED: 1, READY: 2, "PolicyCompliant": 3}
    return sorted(merged.values(), key=lambda c: (order.get(str(c.get("type")), 9), str(c.get("type"))))


def build_owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """An owner reference that lets the garbage collector delete children with their InferenceModel."""
    meta = body["metadata"]
    return {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def with_owner(manifest: Mapping[str, Any], owner: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    child = dict(manifest)
    meta = dict(child.get("metadata", {}))
    meta["ownerReferences"] = [dict(owner)]
    meta["namespace"] = namespace
    child["metadata"] = meta
    return child


def build_scale_status(
    model: str, workload: Mapping[str, Any], desired: int | None = None, previous: object = None
) -> Status:
    """``status.replicas`` and ``status.selector`` of model ``model``: what ``kubectl scale``, an HPA and
    KEDA read through its scale subresource. The replicas are the workload's own count (a Deployment's
    pods, a LeaderWorkerSet's groups), at most the model's ``desired`` replicas: the extra pod of a
    restart's surge is the operator's, and an HPA that counted it would scale the model up by one for
    good. While the workload rolls a new template out (:func:`rolling_out`), the ``previous`` count
    (the model's ``status.replicas`` as it is; nothing when it has none) stands: a roll-out replaces
    pods one for one, and the dip between an old pod's end and its successor's start (a single-replica
    model at 0 for a moment) is no change of scale, only two writes per roll-out that every reader of
    the model would be sent. The selector is the pods' labels as a selector string."""
    replicas = int((workload.get("status") or {}).get("replicas", 0) or 0)
    if desired is not None:
        replicas = min(replicas, desired)
    if isinstance(previous, int) and rolling_out(workload):
        replicas = previous
    selector = ",".join(f"{key}={value}" for key, value in sorted(pod_selector(model).items()))
    return _status_patch(replicas=replicas, selector=selector)


def scale_changes(
    model: str, workload: Mapping[str, Any], desired: int, previous: InferenceModelStatus
) -> Status:
    """What of :func:`build_scale_status` the model's stored status (``previous``) does not hold yet:
    empty when its scale subresource already shows the workload's count."""
    return status_changes(previous, build_scale_status(model, workload, desired, previous.replicas))


def _updated_of_wanted(workload: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(replicas of the current template, replicas wanted) as the workload's controller last counted
    them, None when its status is not about the current spec (or says nothing). A Deployment leaves
    ``updatedReplicas`` out at 0."""
    status = (workload or {}).get("status") or {}
    if not workload or status.get("observedGeneration") is None or not workload_observed(workload):
        return None
    wanted = int((workload.get("spec") or {}).get("replicas", 1) or 0)
    return int(status.get("updatedReplicas", 0) or 0), wanted


def rolling_out(workload: Mapping[str, Any]) -> bool:
    """Whether the workload's controller is replacing its pods with a new template's: fewer of its
    replicas than it wants are of that template yet."""
    counts = _updated_of_wanted(workload)
    return counts is not None and counts[0] < counts[1]


def workload_observed(workload: Mapping[str, Any] | None) -> bool:
    """Whether the workload's status is about its current spec: its controller observed its
    generation. A status older than a spec change (a restart's surge sets the replicas, a roll-out the
    template) says nothing about it yet; its controller's next status does."""
    if not workload:
        return True
    generation = (workload.get("metadata") or {}).get("generation")
    observed = (workload.get("status") or {}).get("observedGeneration")
    return generation is None or observed is None or observed >= generation


#: The Deployment controller's revision of a Deployment's current template, and of each ReplicaSet.
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"


def current_revision(workload: Mapping[str, Any] | None) -> str | None:
    """The revision of a Deployment's current template: its ``deployment.kubernetes.io/revision``,
    which its controller sets to the ReplicaSet of the current template's revision in the same sync
    that observes a new generation, and before it writes that generation as observed. So it is the
    current template's only once ``status.observedGeneration`` reached the generation; None before,
    and for a paused Deployment (its template is not rolled out)."""
    if not workload or not workload_observed(workload):
        return None
    meta, spec = workload.get("metadata") or {}, workload.get("spec") or {}
    if spec.get("paused") or (workload.get("status") or {}).get("observedGeneration") is None:
        return None
    revision = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
    return str(revision) if revision else None


def readiness_from_workload(
    workload: Mapping[str, Any] | None, desired: int | None = None, current_ready: int | None = None
) -> tuple[bool, str]:
    """(ready, message) from a Deployment's or LeaderWorkerSet's status. ``desired``: the model's own
    replicas; a workload asking for more is a restart's surge, and the model is Ready while its own
    replicas are available (the extra pod is starting so that none of them goes before it).

    ``current_ready``: the Ready pods of the current template's ReplicaSet (:func:`current_revision`),
    as the pods' own watch events show them. Its controller writes the Deployment's ready count last,
    after its queue gives it another sync: with a fleet's roll-outs queued, tens of seconds after the
    pods are serving. A Deployment whose controller observed its spec is Ready once that many pods of
    its current template are."""
    if not workload:
        return False, "workload not created yet"
    spec = workload.get("spec", {}) or {}
    status = workload.get("status", {}) or {}
    wanted = int(spec.get("replicas", 1) or 0)
    if desired is not None:
        wanted = min(wanted, desired)
    generation = workload.get("metadata", {}).get("generation")
    observed = status.get("observedGeneration")
    ready = int(status.get("readyReplicas", 0) or 0)
    updated = int(status.get("updatedReplicas", 0) or 0)
    available = int(status.get("availableReplicas", ready) or 0)
    if generation is not None and observed is not None and observed < generation:
        return False, f"rolling out generation {generation}"
    if wanted == 0:
        return True, "scaled to 0 replicas"
    if available >= wanted and updated >= wanted:
        return True, f"{available}/{wanted} replicas available"
    if current_ready is not None and current_ready >= wanted:
        return True, f"{current_ready}/{wanted} replicas available"
    return False, f"{available}/{wanted} replicas available, {updated} updated"


def build_deployed_status(
    previous: InferenceModelStatus,
    *,
    plan_summary: PlanSummary,
    generation: int | None,
    ready: bool,
    ready_message: str,
    now: str,
    message: str,
    needs_person: str = "",
    beyond_tables: str = "",
) -> Status:
    """Status after a successful plan and apply; ``Degraded`` with what a person should look at
    when the remediation budget is spent (``needs_person``); ``beyond_tables``: why the version is
    newer than every table (:func:`loadline.sizing._compat.beyond_tables`), for :data:`ENGINE_TABLES`."""
    updates = [
        build_condition(PLANNED, True, "Planned", message, generation),
        build_condition(DEPLOYED, True, "Applied", "children applied with server-side apply", generation),
        build_condition(READY, ready, "Available" if ready else "Progressing", ready_message, generation),
    ]
    had = any(c.type == ENGINE_TABLES for c in previous.conditions)
    if beyond_tables or had:
        known = "the tables know spec.engine.version"
        reason = "NewerThanTables" if beyond_tables else "InTables"
        updates.append(
            build_condition(ENGINE_TABLES, not beyond_tables, reason, beyond_tables or known, generation)
        )
    conditions = merge_conditions(previous.conditions, updates, now)
    return _status_patch(
        phase="Degraded" if needs_person else ("Ready" if ready else "Deploying"),
        # The readiness detail lives in the Ready condition only, so that the readiness timer and a
        # later resync agree on the message and a resync writes nothing.
        message=needs_person or message,
        observed_generation=generation,
        plan=plan_summary,
        conditions=conditions,
    )


def build_replanned_status(
    previous: InferenceModelStatus, *, plan_summary: PlanSummary, generation: int | None, now: str,
    message: str,
) -> Status:  # fmt: skip
    """What :func:`build_deployed_status` writes for a re-plan whose workload is about to be applied
    (a crash's remediation, written with its decision), less what only the apply can say: the
    Deployed condition stays as it was (an apply refused turns it False), and the phase and the Ready
    condition are the workload's to say, from its watch events, once the roll-out has begun."""
    conditions = merge_conditions(
        previous.conditions,
        [build_condition(PLANNED, True, "Planned", message, generation)],
        now,
    )
    return _status_patch(
        message=message,
        observed_generation=generation,
        plan=plan_summary,
        conditions=conditions,
    )


def plan_status(plan_summary: PlanSummary) -> Any:
    """``status.plan`` as :func:`build_deployed_status` writes it (to compare with the stored one)."""
    return _status_patch(plan=plan_summary)["plan"]


def build_failed_status(
    previous: InferenceModelStatus,
    *,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
    phase: Phase = "Failed",
) -> Status:
    """Status when the spec cannot be planned (Failed) or waits on the cluster (Pending)."""
    conditions = merge_conditions(
        previous.conditions,
        [build_condition(PLANNED, False, reason, message, generation)],
        now,
    )
    return _status_patch(phase=phase, message=message, observed_generation=generation, conditions=conditions)


def build_apply_failed_status(
    previous: InferenceModelStatus, *, message: str, generation: int | None, now: str
) -> Status:
    """Status when the plan stands but the API server refused (or did not take) the children."""
    conditions = merge_conditions(
        previous.conditions,
        [build_condition(DEPLOYED, False, "ApplyFailed", message, generation)],
        now,
    )
    return _status_patch(
        phase="Pending", message=message, observed_generation=generation, conditions=conditions
    )


def build_readiness_status(
    previous: InferenceModelStatus, *, ready: bool, message: str, now: str, stuck: bool = False
) -> Status | None:
    """Status change when a child workload's availability changes; None when nothing changes.

    While a crash's remediation rolls out (the Ready condition's reason :data:`REMEDIATING`), the
    workload's progress does not replace what the decision said: only its availability does, or a
    roll-out that is ``stuck`` (the scheduler's reason in ``message``). The roll-out's steps would
    otherwise each be a write of the model, and at fleet scale a crash's phase going Deploying and its
    progress were half of the model's writes (:func:`build_remediating_status`)."""
    phase = previous.phase
    if phase not in {"Deploying", "Ready"}:
        return None  # Failed/Pending/Degraded are decided elsewhere
    if not ready and not stuck and phase == "Deploying" and ready_reason(previous) == REMEDIATING:
        return None
    new_phase = "Ready" if ready else "Deploying"
    generation = previous.observed_generation
    conditions = merge_conditions(
        previous.conditions,
        [build_condition(READY, ready, "Available" if ready else "Progressing", message, generation)],
        now,
    )
    if new_phase == phase and conditions == [_wire(c) for c in previous.conditions]:
        return None
    return _status_patch(phase=new_phase, conditions=conditions)


def ready_reason(status: InferenceModelStatus) -> str | None:
    """The Ready condition's reason, if the status has one."""
    return next((c.reason for c in status.conditions if c.type == READY), None)


def build_remediating_status(
    previous: InferenceModelStatus, *, result: str, now: str, waiting: str = ""
) -> Status:
    """The phase and Ready condition of a model whose crash's remediation rolls out now, written with
    the decision (``previous``: the status as the decision leaves it): ``Deploying``, the Ready
    condition False with reason :data:`REMEDIATING` and what the remediation changes. Said by the
    decision's own write, so that the workload's roll-out need not write the model until it is
    available (:func:`build_readiness_status`). Nothing for a model in another phase (Failed, Pending,
    Degraded are decided elsewhere). ``waiting``: why the roll-out waits for a slot (a storm's roll-outs
    are paced, :mod:`loadline.pacing`), said in the message until the model is Ready again."""
    if previous.phase not in {"Deploying", "Ready"}:
        return {}
    message = f"rolling out the remediation: {result}"
    if waiting:
        message = f"the remediation waits to roll out: {waiting}; then {result}"
    generation = previous.observed_generation
    conditions = merge_conditions(
        previous.conditions,
        [build_condition(READY, False, REMEDIATING, message, generation)],
        now,
    )
    return _status_patch(phase="Deploying", conditions=conditions)


#: What identifies the Ready condition a readiness decision read (all plain scalars: see
#: :func:`loadline.status.patch.testable`; its message is free text and not compared).
_READY_IDENTITY = ("type", "status", "reason", "lastTransitionTime", "observedGeneration")


def build_readiness_patch(
    previous: InferenceModelStatus, changes: Mapping[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A readiness change (:func:`build_readiness_status`) as JSON-patch sets into ``status`` and the
    paths to test first: what the decision read, the phase, the observed generation and the Ready
    condition it replaces, in its place, so that a write of another field or condition meanwhile does
    not refuse it and is not undone (whether loadline's own restart rolls the pods, which its Event
    depends on, is read from the write's answer instead: :func:`readiness_event_reason`). Without a
    Ready condition to replace (or when other conditions would change) the whole list is set and
    tested, which makes the write fall back to the resourceVersion guard."""
    before = [_wire(c) for c in previous.conditions]
    after = list(changes.get("conditions") or [])
    tested = ["/status/phase", "/status/observedGeneration"]
    sets: dict[str, Any] = {"/status/phase": changes.get("phase", previous.phase)}
    index = next((i for i, c in enumerate(before) if c.get("type") == READY), None)
    others_kept = [c for c in before if c.get("type") != READY] == [
        c for c in after if c.get("type") != READY
    ]
    if index is None or not others_kept:
        sets["/status/conditions"] = after
        tested.append("/status/conditions")  # a list: not testable, so guarded by resourceVersion
        return sets, tuple(tested)
    sets[f"/status/conditions/{index}"] = next(c for c in after if c.get("type") == READY)
    tested += [f"/status/conditions/{index}/{key}" for key in _READY_IDENTITY]
    return sets, tuple(tested)


#: Of the plan a crash's decision read, what identifies it as plain scalars (its floats and texts with
#: ``<`` in them cannot be tested: :func:`loadline.status.patch.testable`).
_PLAN_IDENTITY = ("gpu", "gpusPerReplica", "nodesPerReplica", "maxModelLen", "maxNumSeqs", "engineVersion")


def build_decision_patch(
    model: Mapping[str, Any], changes: Mapping[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """A crash's decision (``changes``, a merge patch of ``status``) as JSON-patch sets into ``status``
    and the paths to test first: what the decision read, as scalars that change whenever it does (the
    spec's generation, the remediation stanza's revision, the maintenance record's state, the plan's
    identity, the observed generation), so that the readiness its own crash causes (the phase, the Ready
    condition, written meanwhile by the workload's events) no longer refuses it: at 1,000 crashes the
    resourceVersion guard refused 0.8 decisions per crash, each a refused PATCH, a GET and the
    decision and its plan made again. Conditions are set in place, and every other member as the
    merge patch would leave it (:func:`merged`). None when the model has no status to test against,
    a member is removed, or its conditions change in number or order: the resourceVersion guard then."""
    status = model.get("status") or {}
    if not status or any(value is None for value in changes.values()):
        return None  # (a member removed: the merge patch says it as null, which "add" would write)
    tested = ["/metadata/generation", "/status/observedGeneration"]
    # Every write of the remediation stanza moves its revision (absent on a model no decision wrote yet,
    # which tests as null): the crashes handled are a list, which grows where a test cannot reach.
    tested.append("/status/remediation/revision" if status.get("remediation") else "/status/remediation")
    tested.append("/status/maintenance/state" if status.get("maintenance") else "/status/maintenance")
    if status.get("plan"):
        tested += [f"/status/plan/{key}" for key in _PLAN_IDENTITY]
    else:
        tested.append("/status/plan")
    sets = {
        f"/status/{key}": merged(status.get(key), value)
        for key, value in changes.items()
        if key != "conditions"
    }
    if "conditions" in changes:
        before, after = list(status.get("conditions") or []), list(changes["conditions"] or [])
        if [c.get("type") for c in before] != [c.get("type") for c in after]:
            return None
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            if old != new:
                sets[f"/status/conditions/{index}"] = new
                tested.append(f"/status/conditions/{index}/type")
    return sets, tuple(tested)


def restart_running(status: InferenceModelStatus) -> bool:
    """Whether loadline's own restart of the model is rolling its pods (``status.maintenance.state``)."""
    return status.maintenance is not None and status.maintenance.state == "Running"


def readiness_event_reason(
    previous: InferenceModelStatus, changes: Mapping[str, Any], written: InferenceModelStatus | None = None
) -> str | None:
    """The Event a readiness change is worth: ``Ready`` or ``Progressing`` when the phase moves, none
    while loadline's own restart rolls the pods (``status.maintenance.state`` Running in ``written``,
    the status the write answered with, else in ``previous``): its RestartStarted and RestartDone
    Events say it already, and a crash's roll-out posted both extra (two of the seven Events a crash
    cost at 100 crashes, benchmarks/oom_latency.py)."""
    phase = changes.get("phase")
    if phase is None or phase == previous.phase:
        return None
    if restart_running(previous if written is None else written):
        return None
    return "Ready" if phase == "Ready" else "Progressing"


POLICY_COMPLIANT = "PolicyCompliant"


def build_policy_status(
    previous: InferenceModelStatus,
    *,
    governing: Sequence[str],
    violations: Sequence[str],
    violated: Sequence[str],
    generation: int | None,
    now: str,
) -> Status:
    """Which FleetPolicies govern the model and whether it keeps them. A model that breaks a policy
    keeps running as it is (a policy never tears down what runs); the ``PolicyCompliant`` condition
    names each policy, field and fix. Unchanged compliance writes nothing (see :func:`status_changes`)."""
    if not governing:
        ok, reason, message = True, "NoPolicy", "no FleetPolicy governs this model"
    elif violations:
        ok, reason, message = False, "Violation", "; ".join(violations)[:2000]
    else:
        ok, reason, message = True, "Compliant", "keeps " + ", ".join(governing)
    conditions = merge_conditions(
        previous.conditions,
        [build_condition(POLICY_COMPLIANT, ok, reason, message, generation)],
        now,
    )
    return _status_patch(
        policies=list(governing), violated_policies=sorted(set(violated)), conditions=conditions
    )


def build_incident_status(
    incidents: list[dict[str, Any]], remediation: RemediationState, *, needs_person: str = ""
) -> Status:
    """Status after an out-of-memory crash was recorded: the incidents, the remediation state with
    its decision, and ``Degraded`` when the budget is spent and a person must look."""
    fields: dict[str, Any] = {"incidents": incidents, "remediation": remediation}
    if needs_person:
        fields |= {"phase": "Degraded", "message": needs_person}
    return _status_patch(**fields)


def build_remediation_status(remediation: RemediationState) -> Status:
    """Status with the remediation stanza alone (outcomes judged on the clock, with no incident)."""
    return _status_patch(remediation=remediation)


#: Measured GPU memory is written only when it moved by at least this many GiB (or the GPU count, the
#: plan's budget or the source changed): an idle model's readings stay within it and cause no writes.
MEASURE_STEP_GIB = 0.5
#: ...and at least this often while it is measured, so ``time`` tells a steady figure from a stale one.
MEASURE_REFRESH_SECONDS = 3600.0


def planned_gpu_gib(plan: PlanSummary | None) -> float | None:
    """What the plan expects one GPU to hold (``status.plan.memory``: weights, activation peak,
    non-torch, CUDA graphs, KV cache), or None when status has no plan to compare with."""
    if plan is None:
        return None
    memory = plan.memory
    parts = (
        memory.weights_gi_b, memory.activation_gi_b, memory.non_torch_gi_b, memory.cuda_graph_gi_b,
        memory.kv_cache_gi_b,
    )  # fmt: skip
    return round(sum(parts), 2)


def build_measured_status(
    previous: InferenceModelStatus,
    measured: Mapping[str, Any] | None,
    *,
    now: str,
    step: float = MEASURE_STEP_GIB,
    refresh: float = MEASURE_REFRESH_SECONDS,
) -> Status:
    """``status.measuredGpuMemory`` from a reading (:func:`loadline.traffic.measured_gpu_memory`'s
    dict), or ``{}`` when there is nothing to write.

    Nothing is written when nothing was measured (no agent, no dcgm-exporter, Prometheus down: the last
    figure stays, its ``time`` says how old it is), nor when the reading is within ``step`` GiB of the
    stored one with the same GPU count, budget and source, unless the stored one is ``refresh``
    seconds old. So an idle model makes no writes between hourly refreshes.
    """
    if not measured:
        return {}
    reading = MeasuredGpuMemory.model_validate({**measured, "time": now})
    old = previous.measured_gpu_memory
    if old is not None:
        same = (
            old.gpus == reading.gpus
            and old.source == reading.source
            and abs(old.planned_gi_b - reading.planned_gi_b) < 0.01
            and abs(old.max_used_gi_b - reading.max_used_gi_b) < step
        )
        age = (reading.time - old.time).total_seconds()
        if same and age < refresh:
            return {}
    return _status_patch(measured_gpu_memory=reading)


READINESS_BACKOFF = (0.0, 5.0, 10.0, 20.0, 40.0)  # seconds into Deploying; then every READINESS_PERIOD
READINESS_PERIOD = 60.0

#: When a Ready model whose plan vLLM has not reported on yet has its pod's log read (seconds into the
#: episode), then every OBSERVE_PERIOD: vLLM logs its figures before it serves, so the first look
#: nearly always finds them; an engine whose log never says (another image, a rotated log) must not
#: cost two reads every ten seconds for as long as it runs.
OBSERVE_BACKOFF = (0.0, 10.0, 30.0, 70.0, 150.0, 310.0)
OBSERVE_PERIOD = 600.0


def backoff_due(elapsed: float, last_checked: float | None, points: tuple[float, ...], period: float) -> bool:
    """Whether a look is due ``elapsed`` seconds into an episode, the last look having been at
    ``last_checked`` (None: not in this process, so at once): at each of ``points``, then every
    ``period`` after the last of them. A look that is late (a busy loop) still counts for its slot:
    a slot is taken once however many ticks fall in it."""
    if last_checked is None:
        return True
    if elapsed < points[-1] + period:
        due = max((point for point in points if point <= elapsed), default=0.0)
    else:
        due = elapsed - (elapsed - points[-1]) % period
    return last_checked < due


def readiness_check_due(elapsed: float, last_checked: float | None) -> bool:
    """Whether the readiness timer should read the cluster now, ``elapsed`` seconds after the model
    entered ``Deploying``, having last read it at ``last_checked`` (None: not in this process).

    Child events report availability at once; the timer only closes the race where the child became
    available before the parent's status was written, and covers LeaderWorkerSets (not watched). So it
    checks soon and then backs off: a model stuck for hours (no GPU of its type free) costs one read a
    minute, not one every few seconds."""
    return backoff_due(elapsed, last_checked, READINESS_BACKOFF, READINESS_PERIOD)


def observe_look_due(elapsed: float, last_looked: float | None) -> bool:
    """Whether the observation timer should read the model's pod log now, ``elapsed`` seconds after
    the episode began (a new plan, or Ready again), having last looked at ``last_looked``
    (:data:`OBSERVE_BACKOFF`)."""
    return backoff_due(elapsed, last_looked, OBSERVE_BACKOFF, OBSERVE_PERIOD)


def ready_since(status: InferenceModelStatus) -> datetime | None:
    """When the model last became Ready (the Ready condition's transition), if it says."""
    return next(
        (c.last_transition_time for c in status.conditions if c.type == READY and c.status == "True"), None
    )


def deploying_since(status: InferenceModelStatus) -> datetime | None:
    """When the model last became not Ready (the Ready condition's transition), if it says."""
    return next(
        (c.last_transition_time for c in status.conditions if c.type == READY and c.status != "True"), None
    )


def status_changes(previous: InferenceModelStatus, desired: Mapping[str, Any]) -> Status:
    """Only the top-level members of ``desired`` (a patch of ``status``) that differ from what the API
    server holds: the one diff of a desired status against the stored one. Empty: nothing to write."""
    held = stored(previous)
    return {key: value for key, value in desired.items() if held.get(key) != value}


MAX_INCIDENTS = 20


def merge_incident(
    previous: Iterable[Incident],
    *,
    loop: str,
    oom_class: str,
    confidence: float,
    evidence: Iterable[str],
    caller_side: bool,
    action: str,
    result: str,
    pod: str,
    container: str,
    now: str,
) -> list[dict[str, Any]]:
    """``status.incidents`` after one more crash: a crash of the same loop and class counts up the last
    incident instead of adding one; the history keeps the newest ``MAX_INCIDENTS``."""
    incidents = [_wire(i) for i in previous]
    last = incidents[-1] if incidents else None
    if last is not None and last.get("loop") == loop and last.get("class") == oom_class:
        counted = {
            **last, "count": int(last.get("count", 1)) + 1, "lastSeen": now, "pod": pod, "action": action,
            "result": result, "confidence": round(confidence, 2), "evidence": list(evidence),
        }  # fmt: skip
        incidents[-1] = _wire(Incident.model_validate(counted))
    else:
        incident = Incident.model_validate(
            {
                "time": now, "lastSeen": now, "pod": pod, "container": container, "class": oom_class,
                "confidence": round(confidence, 2), "evidence": list(evidence), "count": 1,
                "action": action, "result": result, "loop": loop, "callerSide": caller_side,
            }
        )  # fmt: skip
        incidents.append(_wire(incident))
    return incidents[-MAX_INCIDENTS:]


def unschedulable_reason(pods: Iterable[Mapping[str, Any]]) -> str:
    """The scheduler's own words for the first pod it cannot place (e.g. not enough host memory on any
    node of the planned GPU type), or "" when every pod is placed."""
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                name = pod.get("metadata", {}).get("name", "")
                return (
                    f"pod {name} cannot be scheduled: {cond.get('message') or cond.get('reason', '')}".strip()
                )
    return ""


def _created(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def pod_states(pods: Iterable[Mapping[str, Any]]) -> list[PodState]:
    """The model's pods as :func:`loadline.maintenance.plan_rollout` reads them (pods without a
    creation time, which the API server always sets, are left out)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        created = _parse_time(_created(pod))
        if created is None:
            continue
        out.append(
            PodState(str(meta.get("name", "")), created, _pod_ready(pod), bool(meta.get("deletionTimestamp")))
        )
    return out


def crash_looping(pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a container of the model's pods waits in CrashLoopBackOff: the model is not serving from
    that pod, so a restart spares no one by waiting for a window."""
    return any(
        ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        for pod in pods
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
    )


def new_pods_created(workload: Mapping[str, Any] | None) -> bool:
    """Whether a Deployment's controller has done its part of a roll-out: it saw the latest generation,
    is not paused, and every replica's pod is of the current template (created, maybe still starting:
    loading the weights is the node's work, not the control plane's). An unobserved status says no."""
    counts = _updated_of_wanted(workload)
    paused = bool(((workload or {}).get("spec") or {}).get("paused"))
    return counts is not None and not paused and counts[0] >= counts[1]


def rollout_complete(workload: Mapping[str, Any] | None) -> bool:
    """Whether a Deployment or LeaderWorkerSet has rolled out its current template everywhere: the
    controller saw the latest generation, and every replica is updated and available (no old pod left)."""
    if not workload or not workload_observed(workload):
        return False
    spec, status = workload.get("spec") or {}, workload.get("status") or {}
    wanted = int(spec.get("replicas", 1) or 0)
    available = status.get("availableReplicas", status.get("readyReplicas", 0)) or 0
    return (
        int(status.get("updatedReplicas", 0) or 0) == wanted
        and int(available) >= wanted
        and int(status.get("replicas", 0) or 0) == wanted
    )


def maintenance_patch(previous: Maintenance | None, record: MaintenanceRecord) -> dict[str, Any]:
    """``status.maintenance`` as a merge patch: the record's fields, and an explicit null for each field
    the previous one had and this one clears (a merge patch keeps what it does not mention)."""
    wire = _wire(record_to_status(record))
    held = {} if previous is None else _wire(previous)
    cleared = {key: None for key in held if key not in wire}
    return {**wire, **cleared}


def layout_changed(previous_plan: PlanSummary | None, nodes_per_replica: int) -> bool:
    """Whether a re-plan moves the model between layouts: one node per replica is a Deployment, several
    a LeaderWorkerSet (with a name of its own). Only such a move can leave children of the old layout
    behind, so only then are the model's children listed to find them (four LISTs, one per child kind:
    most re-plans, such as a remediation's raised memory, keep the layout)."""
    if previous_plan is None:
        return False  # a new model has no children of another layout
    return (previous_plan.nodes_per_replica > 1) != (nodes_per_replica > 1)


def stale_children(
    existing: Iterable[Mapping[str, Any]], wanted: Iterable[tuple[str, str]], owner_uid: str
) -> list[tuple[str, str, str]]:
    """Children this InferenceModel owns that its current manifests no longer include, as
    ``(apiVersion, kind, name)``: e.g. the Deployment left behind when a re-plan moved the model to a
    LeaderWorkerSet. Only objects whose controller owner reference is this model are ever returned, so
    an object a person made with the same label is left alone."""
    keep = set(wanted)
    stale = []
    for obj in existing:
        meta = obj.get("metadata") or {}
        owned = any(
            o.get("uid") == owner_uid and o.get("controller") for o in meta.get("ownerReferences") or []
        )
        if owned and (obj.get("kind"), meta.get("name")) not in keep:
            stale.append((str(obj.get("apiVersion")), str(obj.get("kind")), str(meta.get("name"))))
    return sorted(stale)


def build_observed_status(
    body: Mapping[str, Any],
    status: InferenceModelStatus,
    obs: Observation,
    *,
    pod: str,
    source: str,
    now: str,
) -> tuple[Status, bool]:
    """What a model's start-up figures ``obs`` (read from ``pod`` by ``source``) write in its status:
    ``status.observed`` and, when vLLM said how many sequences fit, the ``KVCapacity`` condition. With
    whether they hold fewer sequences than ``spec.concurrency`` (the model is then planned again)."""
    if status.plan is None:
        return {}, False  # nothing to set the figures beside (the timer looks only under a plan)
    observed = observed_status(obs, _wire(status.plan), pod=pod, source=source, now=now)
    changes: Status = {"observed": observed}
    concurrency = int((body.get("spec") or {}).get("concurrency") or 1)
    verdict = capacity_condition(observed, concurrency)
    if verdict is None:
        return changes, False
    ok, reason, message = verdict
    generation = (body.get("metadata") or {}).get("generation")
    condition = build_condition(CAPACITY_CONDITION, ok, reason, message, generation)
    changes["conditions"] = merge_conditions(status.conditions, [condition], now)
    return changes, not ok


#: A predicted OOM time moving by less than this is the same prediction: not rewritten each interval.
PREDICTION_MOVE_SECONDS = 900.0


def _same_prediction(previous: OOMRisk | None, estimate: OOMRiskEstimate) -> bool:
    before = None if previous is None else previous.predicted_at
    after = estimate.predicted_at
    if before is None or after is None:
        return before is None and after is None
    return abs(before.timestamp() - after.timestamp()) < PREDICTION_MOVE_SECONDS


def build_risk_status(
    status: InferenceModelStatus, estimate: OOMRiskEstimate, generation: int | None, now: str
) -> dict[str, Any]:
    """The status fields to write for ``estimate``, or ``{}`` while the verdict holds (same condition
    status and reason, predicted time within :data:`PREDICTION_MOVE_SECONDS`)."""
    condition = oom_risk_condition(estimate, generation)
    old = next((c for c in status.conditions if c.type == condition.type), None)
    if (
        old is not None
        and old.status == condition.status
        and old.reason == condition.reason
        and _same_prediction(status.oom_risk, estimate)
    ):
        return {}
    risk = oom_risk_status(estimate).model_dump(by_alias=True, mode="json", exclude_none=True)
    conditions = merge_conditions(status.conditions, [condition], now)
    return {"oomRisk": risk, "conditions": conditions}
