"""Restarts in low-traffic windows: the timer that carries out ``status.maintenance``.

The OOM handler only marks a restart or a remediation as pending (or, for a crash that recurs at every
start, as running at once); this timer, on each model with something pending, decides with the pure
:func:`loadline.maintenance.plan_maintenance` when it happens (the learned window, the policies'
windows and ``maxConcurrent`` slots, the cool-down, a predicted out-of-memory crash), writes the
decision to ``status.maintenance`` with an Event when it changes, and, once it is due, carries it out
one step per tick:

- a *restart* (fragmentation) evicts the model's pods one at a time, oldest first, through the Eviction
  API, as :func:`loadline.maintenance.plan_rollout` says (a single-replica model first surges a second
  pod when there are free GPUs for it);
- a *remediation* renders the overrides held back until now (reconcile, the one path that applies
  children) and the workload controller rolls the pods one at a time (``maxUnavailable: 1``).

Everything it needs to resume is in status, so an operator restart or a hand-over finds the same
schedule and restarts no pod twice: pods created after ``startedAt`` are the restarted ones.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import kopf

from loadline import telemetry
from loadline.api import FleetPolicy, InferenceModelStatus, PlanSummary
from loadline.handlers import _events, _kube, _oom, _policies, _reconcile, _restart_slots, _upgrade
from loadline.maintenance import (
    LoadSlot,
    MaintenanceDecision,
    MaintenanceRecord,
    finish_maintenance,
    forecast_load,
    plan_maintenance,
    plan_rollout,
    record_from_status,
    restart_locks,
    scaling_in_progress,
)
from loadline.policy import combine, enforced, policy_governs, restart_window_sets, select_policies
from loadline.render import workload_ref
from loadline.risk import OOMRiskEstimate, estimate_from_status
from loadline.settings import OperatorSettings
from loadline.sizing import free_rooms_by_type
from loadline.state import INSTANCE_LABEL
from loadline.status import build as _build
from loadline.status import read_status
from loadline.status.patch import merged
from loadline.traffic import model_load_query, query_range
from loadline.windows import PolicyWindow, PolicyWindowError, Sample, WindowPlan, plan_windows

if TYPE_CHECKING:
    from loadline.handlers._state import OperatorState

LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
#: States in which something waits or runs (the timer's ``when``).
PENDING_STATES = frozenset({"Scheduled", "WaitingForLock", "CoolingDown", "Running"})
#: Prometheus answers at most 11,000 points per series; the history's step keeps under this.
MAX_POINTS = 10_000
QUERY_TIMEOUT_SECONDS = 5.0


def pending(status: InferenceModelStatus) -> bool:
    """Whether the model has a restart waiting or running (the timer runs only then)."""
    return status.maintenance is not None and status.maintenance.state in PENDING_STATES


@dataclass(frozen=True)
class FleetView:
    """What the timer reads from the operator's in-memory indexes."""

    #: ``namespace/name`` → ``{"namespace", "labels"}`` of each model whose restart runs.
    restarting: Mapping[str, Mapping[str, Any]]
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    policies: list[FleetPolicy]
    #: Sharded: other replicas take restart slots at the same time, so a start is also claimed in the
    #: slots Lease they all decide on (:mod:`loadline.handlers._restart_slots`).
    shared_slots: bool = False
    #: The operator's memory (restart claims, the Deployments seen, reconcile's).
    state: OperatorState = field(kw_only=True)


def restarting_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The index entry of a model whose restart runs (holds its policies' slots), else None."""
    if not _build.restart_running(read_status(body)):
        return None
    meta = body["metadata"]
    return {"namespace": meta["namespace"], "labels": dict(meta.get("labels") or {})}


def _history_step(days: int) -> float:
    """Seconds between history points: whole minutes, under :data:`MAX_POINTS` per series."""
    return float(max(60, math.ceil(days * 86400 / MAX_POINTS / 60) * 60))


def learn_windows(
    settings: OperatorSettings,
    namespace: str,
    name: str,
    policy_windows: list[Any] | None,
    memo: MutableMapping[str, Any],
    now: float,
) -> tuple[WindowPlan, list[list[Sample]]]:
    """The model's coming windows from its request history (reused for ``window_refresh_seconds``)."""
    key = repr(policy_windows)
    cached: tuple[str, float, WindowPlan, list[list[Sample]]] | None = memo.get("maintenance_windows")
    # Reused while fresh and some window is still ahead (one whose windows all passed is learned again).
    if (
        cached is not None
        and cached[0] == key
        and now - cached[1] < settings.window_refresh_seconds
        and cached[2].windows
        and cached[2].windows[-1].start.timestamp() > now
    ):
        return cached[2], cached[3]
    series: list[list[Sample]] = []
    if settings.prometheus_url:
        # On the step's grid, so every refresh bins the same instants (and a minute is a minute).
        step = _history_step(settings.window_history_days)
        end = now // step * step
        answer = query_range(
            settings.prometheus_url,
            model_load_query(namespace, name),
            end - settings.window_history_days * 86400,
            end,
            step,
            timeout=QUERY_TIMEOUT_SECONDS,
        )
        series = answer or []
    plan = plan_windows(
        series,
        timedelta(minutes=settings.restart_window_minutes),
        settings.restart_timezone,
        policy_windows,
        now=now,
    )
    memo["maintenance_windows"] = (key, now, plan, series)
    return plan, series


def _running_by_policy(
    governing: Iterable[FleetPolicy], restarting: Mapping[str, Mapping[str, Any]], policies: list[FleetPolicy]
) -> dict[str, list[str]]:
    """For each governing policy, the models it governs whose restart runs (its slots' holders)."""
    out: dict[str, list[str]] = {}
    for policy in governing:
        holders = []
        for key, entry in restarting.items():
            ns = str(entry.get("namespace", key.split("/", 1)[0]))
            labels = _policies.namespace_labels(ns, policies)
            if labels is not None and policy_governs(policy, ns, labels, entry.get("labels") or {}):
                holders.append(key)
        out[policy.name] = holders
    return out


def _write(
    body: Mapping[str, Any], patch: kopf.Patch, record: MaintenanceRecord, changed: bool = True
) -> None:
    patch.status["maintenance"] = _build.maintenance_patch(read_status(body).maintenance, record)
    if changed:
        _events.maintenance_event(body, record)


def tend(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: MutableMapping[str, Any],
    settings: OperatorSettings,
    fleet: FleetView,
    logger: logging.Logger | kopf.Logger,
) -> None:
    """One look at a model's pending or running restart: decide, write, and take the next step."""
    status = read_status(body)
    record = record_from_status(status.maintenance)
    if record is None or not record.pending:
        return
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    key = f"{namespace}/{name}"
    now = datetime.now(UTC)
    if record.state == "Running" and record.started_at is not None:
        # A remediation roll-out is the workload controller's to carry out (it reads the workload, not
        # the pods): no LIST of the pods for it, at one per tick per crashed model in a burst.
        pods = [] if record.action == "remediation" else _model_pods(namespace, name)
        _carry_out(body, patch, record, pods, settings, fleet, logger, now)
        return
    if scaling_in_progress(int((body.get("spec") or {}).get("replicas", 1)), status.replicas):
        return  # the autoscaler is moving the count: decided again once it settled (docs/autoscaling.md)
    pods = _model_pods(namespace, name)
    try:
        due = _restart_inputs(body, record, pods, memo, settings, fleet, now)
        decision = _decide_restart(due, fleet, settings)
    except PolicyWindowError as exc:
        message = f"no restart possible: {exc}"
        held = MaintenanceRecord(
            action=record.action, state="Scheduled", last_restart_at=record.last_restart_at, reason=message
        )
        if held.reason != record.reason:
            _write(body, patch, held)
            logger.warning("%s", message)
        return
    if decision is None:  # other replicas kept claiming: decide again next tick, nothing written
        return
    if decision.kind != "act":
        if decision.changed:
            _write(body, patch, decision.record)
            logger.info("restart of %s: %s", key, decision.reason)
        return
    _start(body, patch, decision, pods, settings, fleet, logger, now)


@dataclass(frozen=True)
class _RestartInputs:
    """What a pending restart's decision reads, gathered once per tick; the slots' holders are read
    when deciding (:meth:`decide`), under the claims lock."""

    key: str
    now: datetime
    record: MaintenanceRecord
    governing: list[FleetPolicy]
    sets: list[tuple[str, list[PolicyWindow]]]
    windows: WindowPlan
    risk: OOMRiskEstimate | None
    forecast: tuple[LoadSlot, ...]
    cooldown: timedelta
    crash_looping: bool
    timezone: str

    def decide(
        self, fleet: FleetView, claimed_elsewhere: Mapping[str, frozenset[str]]
    ) -> MaintenanceDecision:
        """The decision with this process's own starts and ``claimed_elsewhere`` (policy → models
        claiming its slots in the shared table) counted as holders of the slots."""
        claims, now = fleet.state.claims, self.now
        with claims.slots:
            mine = {k: {"namespace": k.split("/", 1)[0]} for k in claims.live(now.timestamp())}
            running = _running_by_policy(self.governing, {**fleet.restarting, **mine}, fleet.policies)
            for policy, models in claimed_elsewhere.items():
                if policy in running:
                    running[policy] = sorted({*running[policy], *models})
            decision = plan_maintenance(
                model=self.key, now=now, action=None, windows=self.windows.windows,
                duration=self.windows.duration, persisted=self.record, policy_windows=self.sets,
                locks=restart_locks(self.governing, running), cooldown=self.cooldown,
                crash_looping=self.crash_looping, risk=self.risk, forecast=self.forecast,
                timezone=self.timezone,
            )  # fmt: skip
            if decision.kind == "act":
                claims.claim(self.key, now.timestamp())
            else:
                claims.drop(self.key)  # decided on again after a lost claim: not this one's
            return decision


def _restart_inputs(
    body: kopf.Body,
    record: MaintenanceRecord,
    pods: list[dict[str, Any]],
    memo: MutableMapping[str, Any],
    settings: OperatorSettings,
    fleet: FleetView,
    now: datetime,
) -> _RestartInputs:
    """The governing policies' windows, the model's learned windows, its predicted OOM and the load
    forecast up to it (raises :class:`PolicyWindowError` when the policies leave no window)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    labels = _policies.namespace_labels(namespace, fleet.policies)
    governing = select_policies(fleet.policies, namespace, labels, meta.get("labels") or {})
    sets = restart_window_sets(combine(enforced(governing))) if governing else []
    windows, series = learn_windows(
        settings, namespace, name, sets[0][1] if len(sets) == 1 else None, memo, now.timestamp()
    )
    risk = estimate_from_status(read_status(body).oom_risk)
    forecast = (
        forecast_load(series, settings.restart_timezone, now, risk.predicted_at)
        if risk is not None and risk.predicted_at is not None and risk.predicted_at > now
        else ()
    )
    cooldown = _oom.model_limits(body, fleet.policies, settings).cooldown
    return _RestartInputs(
        f"{namespace}/{name}", now, record, governing, sets, windows, risk, forecast, cooldown,
        _build.crash_looping(pods), settings.restart_timezone,
    )  # fmt: skip


def _decide_restart(
    due: _RestartInputs, fleet: FleetView, settings: OperatorSettings
) -> MaintenanceDecision | None:
    """The decision; a start is checked against the slots other replicas claim in the shared table
    when sharded (None: they kept claiming)."""
    decision = due.decide(fleet, {})
    limited = [p.name for p in due.governing if p.spec.restarts.max_concurrent is not None]
    if decision.kind != "act" or not fleet.shared_slots or not limited:
        return decision
    # Claims only add holders, so what is not due without the table is not due with it: the table is
    # read only for a start (not at every tick of every model waiting for its window).
    shared = _restart_slots.take(
        due.key, limited, functools.partial(due.decide, fleet), fleet.restarting.keys(), due.now, settings,
        fleet.state.leases.api(),
    )  # fmt: skip
    if shared is None:
        _release(fleet, due.key)
    return shared


def _model_pods(namespace: str, name: str) -> list[dict[str, Any]]:
    return _kube.list_objects("v1", "Pod", namespace, label_selector=f"{INSTANCE_LABEL}={name}")


def _start(
    body: kopf.Body,
    patch: kopf.Patch,
    decision: MaintenanceDecision,
    pods: list[dict[str, Any]],
    settings: OperatorSettings,
    fleet: FleetView,
    logger: logging.Logger | kopf.Logger,
    now: datetime,
) -> None:
    """The restart is due: write it as Running, then its first step."""
    record = decision.record
    meta = body["metadata"]
    telemetry.RESTARTS.labels(
        meta["namespace"], meta["name"], record.action or "restart", record.trigger or ""
    ).inc()
    logger.info("restart of %s/%s starts: %s", meta["namespace"], meta["name"], decision.reason)
    _write(body, patch, record)
    started = {**body, "status": {**(body.get("status") or {}), "maintenance": patch.status["maintenance"]}}
    _carry_out(cast(kopf.Body, started), patch, record, pods, settings, fleet, logger, now)


def _release(fleet: FleetView, key: str) -> None:
    with fleet.state.claims.slots:
        fleet.state.claims.drop(key)


def _carry_out(
    body: kopf.Body,
    patch: kopf.Patch,
    record: MaintenanceRecord,
    pods: list[dict[str, Any]],
    settings: OperatorSettings,
    fleet: FleetView,
    logger: logging.Logger | kopf.Logger,
    now: datetime,
) -> None:
    """The next step of a running restart or remediation roll-out; Done when every pod is new."""
    assert record.started_at is not None
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    status = read_status(body)
    multi_node = status.plan is not None and status.plan.nodes_per_replica > 1
    api_version, kind, workload_name = workload_ref(name, multi_node)
    if record.action == "remediation":
        if status.remediation is not None and status.remediation.held_overrides is not None:
            _roll_remediation(body, patch, settings, fleet, logger)
            return
        if _upgrade.waiting(status):  # a newer loadline's render waited for this window: reconcile applies it
            view = (fleet.nodes, fleet.pods)
            _reconcile.reconcile(fleet.state, body, patch, logger, settings, view, fleet.policies)
            return
        if _rollout_complete(fleet, api_version, kind, namespace, workload_name):
            _finish(body, patch, record, now, logger, fleet, settings)
        return
    if multi_node:  # a group restarts with its leader (the LeaderWorkerSet recreates the group)
        pods = [p for p in pods if (p["metadata"].get("labels") or {}).get(LWS_WORKER_INDEX, "0") == "0"]
    replicas = int((body.get("spec") or {}).get("replicas", 1))
    seen = fleet.state.workloads.get(namespace, workload_name) if kind == "Deployment" else None
    step = plan_rollout(
        _build.pod_states(pods),
        record.started_at,
        replicas=replicas,
        room_for_surge=not multi_node and _room_for_one_more(status.plan, fleet),
        workload_replicas=int((seen.get("spec") or {}).get("replicas") or 0) if seen else None,
    )
    if step.action == "done":
        _finish(body, patch, record, now, logger, fleet, settings)
        return
    if step.action in ("surge", "scale_back"):
        _scale(api_version, kind, namespace, workload_name, step.scale_to)
    elif step.action == "evict" and step.pod is not None:
        if not _kube.evict(namespace, step.pod):
            return  # refused by the PodDisruptionBudget (429) or gone: the next tick tries again
        if step.scale_to is not None:
            _scale(api_version, kind, namespace, workload_name, step.scale_to)
    else:
        return
    _events.event(body, warning=step.downtime, reason="Restarting", message=step.reason[:1000])
    logger.info("restart of %s/%s: %s", namespace, name, step.reason)


def _seen_rolling(state: OperatorState, kind: str, namespace: str, name: str) -> bool:
    """Whether the workload's last watch event shows it still rolling out (a Deployment's; a
    LeaderWorkerSet is not watched): taken at its word, with no request."""
    seen = state.workloads.get(namespace, name) if kind == "Deployment" else None
    return seen is not None and not _build.rollout_complete(seen)


def _rollout_complete(fleet: FleetView, api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Whether the workload rolled out its current template. A Deployment that its last watch event
    shows still rolling is taken at its word (no request each tick of a roll-out); a GET confirms
    what the event shows done, since that event may predate the remediation's new template."""
    if _seen_rolling(fleet.state, kind, namespace, name):
        return False
    return _build.rollout_complete(_kube.get(api_version, kind, namespace, name))


def remediation_rolling(state: OperatorState, body: Mapping[str, Any]) -> bool:
    """Whether this tick of the timer has nothing to do: the model's remediation rolls out as its
    workload's controller carries it, with nothing held back for the operator to render, and the
    workload's last watch event shows it still rolling. :func:`_carry_out` would find the same, after
    the fleet's view was gathered for it: in a storm of 1,000 crashes that was a copy of the GPU
    indexes, the restarting models and the policies for each of 5,000 ticks that did nothing."""
    status = read_status(body)
    record = record_from_status(status.maintenance)
    if record is None or record.state != "Running" or record.action != "remediation":
        return False
    held = status.remediation is not None and status.remediation.held_overrides is not None
    if held or _upgrade.waiting(status):
        return False
    multi_node = status.plan is not None and status.plan.nodes_per_replica > 1
    _, kind, workload_name = workload_ref(body["metadata"]["name"], multi_node)
    return _seen_rolling(state, kind, body["metadata"]["namespace"], workload_name)


def _scale(api_version: str, kind: str, namespace: str, name: str, replicas: int | None) -> None:
    if replicas is not None:
        _kube.patch_spec(api_version, kind, namespace, name, {"replicas": replicas})


def _room_for_one_more(plan: PlanSummary | None, fleet: FleetView) -> bool:
    """Whether one more pod of the plan fits on a node's free GPUs now, on a node whose shape holds
    its host memory and CPU (``status.plan.nodeShape``: podMemoryGiB, podCPU)."""
    if plan is None:
        return False
    shape = plan.node_shape
    memory, cpu = (0.0, 0.0) if shape is None else (float(shape.pod_memory_gi_b), float(shape.pod_cpu))
    free = free_rooms_by_type(fleet.nodes, fleet.pods).get(plan.gpu_type, [])
    return any(room.gpus >= plan.gpus_per_replica and room.takes(memory, cpu) for room in free)


def _roll_remediation(
    body: kopf.Body,
    patch: kopf.Patch,
    settings: OperatorSettings,
    fleet: FleetView,
    logger: logging.Logger | kopf.Logger,
) -> None:
    """Render the held-back overrides now: reconcile applies the children (the workload controller then
    rolls the pods), and only then is the hold released in status, so a failure retries the whole step."""
    # The model as reconcile must see it: this pass's writes so far, and the hold released.
    written = merged(body.get("status") or {}, dict(patch.status))
    view = {**body, "status": merged(written, {"remediation": {"heldOverrides": None}})}
    _reconcile.reconcile(
        fleet.state, cast(kopf.Body, view), patch, logger, settings, (fleet.nodes, fleet.pods), fleet.policies
    )
    # A write of the stanza moves its revision, which a crash's decision decided on the held overrides
    # tests (_build.build_decision_patch): it is refused and decided again rather than holding them again.
    remediation = read_status(body).remediation
    revision = (0 if remediation is None else remediation.revision) + 1
    patch.status["remediation"] = {
        **patch.status.get("remediation", {}),
        "heldOverrides": None,
        "revision": revision,
    }


def _finish(
    body: kopf.Body,
    patch: kopf.Patch,
    record: MaintenanceRecord,
    now: datetime,
    logger: logging.Logger | kopf.Logger,
    fleet: FleetView,
    settings: OperatorSettings,
) -> None:
    meta = body["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    done = finish_maintenance(record, now)
    _write(body, patch, done)
    _release(fleet, key)
    if fleet.shared_slots:
        _restart_slots.give_back(key, fleet.restarting.keys(), now, settings, fleet.state.leases.api())
    logger.info("restart of %s/%s done", meta["namespace"], meta["name"])
