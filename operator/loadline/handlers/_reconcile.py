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

import base64
import contextlib
import hashlib
import json
import logging
import operator
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from loadline.api import (
    API_VERSION,
    KIND,
    FleetPolicy,
    InferenceModel,
    InferenceModelSpec,
    Phase,
    RemediationState,
    apply_overrides,
    parse_inference_model,
)
from loadline.errors import (
    LoadlineError,
    NoCapacityError,
    NoFeasiblePlanError,
    NotAllowedError,
    ReferencedObjectError,
    SpecError,
)
from loadline.handlers import _build, _kube, _policies, _upgrade
from loadline.handlers._index import INSTANCE_LABEL
from loadline.handlers._settings import OperatorSettings
from loadline.hub import ConfigCache, HubUnavailable, fetch_config
from loadline.policy import select_policies, spec_problems
from loadline.render import child_kinds, render_manifests, workload_ref
from loadline.sizing import (
    ClusterShapes,
    GPUNode,
    NodeRoom,
    Plan,
    Reservation,
    ShapeFigures,
    beyond_tables,
    find_catalog_model,
    free_rooms,
    gpu_node,
    plan_inference_model,
    pod_gpus,
    reserve_sorted,
    shape_figures,
    shapes_of,
    workload_demand,
)


def _config_map_config(obj: InferenceModel, namespace: str) -> dict[str, Any] | None:
    ref = obj.spec.model.config_map_ref
    if ref is None:
        return None
    cm = _kube.get("v1", "ConfigMap", namespace, ref.name)
    if cm is None:
        raise kopf.TemporaryError(f"ConfigMap {ref.name} not found", delay=30)
    text = (cm.get("data") or {}).get(ref.key)
    if text is None:
        raise ReferencedObjectError(
            "spec.model.configMapRef.key",
            f"ConfigMap {ref.name} has no key {ref.key!r}",
            f"add the model's config.json under {ref.key!r} or point key at the right one",
        )
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReferencedObjectError(
            "spec.model.configMapRef",
            f"ConfigMap {ref.name} key {ref.key} is not JSON: {exc}",
            "fix its JSON",
        ) from None
    if not isinstance(parsed, dict):
        raise ReferencedObjectError(
            "spec.model.configMapRef", "config.json is not a JSON object", "fix its JSON"
        )
    return parsed


# config.json files fetched from the hub, keyed with the credential that fetched them and expiring
# (loadline.hub.ConfigCache says why).
HUB_CACHE = ConfigCache(ttl=3600, max_entries=512)


def _secret_value(namespace: str, name: str, key: str, field: str) -> str:
    secret = _kube.get("v1", "Secret", namespace, name)
    if secret is None:
        raise kopf.TemporaryError(f"Secret {name} ({field}) not found", delay=30)
    data = (secret.get("data") or {}).get(key)
    if data is None:
        raise ReferencedObjectError(
            field, f"Secret {name} has no key {key!r}", f"add the token under {key!r}"
        )
    return base64.b64decode(data).decode().strip()


def _hub_config(obj: InferenceModel, namespace: str, settings: OperatorSettings) -> dict[str, Any] | None:
    """config.json from the hub, for a model that is neither inline, in a ConfigMap nor in the catalog."""
    model = obj.spec.model
    if not settings.hf_fetch or model.config or model.config_map_ref or find_catalog_model(model.name):
        return None
    token = None
    if model.token_secret_ref is not None:
        ref = model.token_secret_ref
        token = _secret_value(namespace, ref.name, ref.key, "spec.model.tokenSecretRef")
    key = ConfigCache.key(settings.hf_endpoint, model.name, model.revision, token)
    cached = HUB_CACHE.get(key)
    if cached is not None:
        return cached
    try:
        config = fetch_config(model.name, model.revision, token, endpoint=settings.hf_endpoint)
    except HubUnavailable as exc:
        raise kopf.TemporaryError(str(exc), delay=settings.retry_delay_seconds) from None
    HUB_CACHE.put(key, config)
    return config


ClusterView = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def _cluster_view(view: ClusterView | None, *, pods: bool) -> ClusterView:
    """(GPU nodes, GPU pods) from the operator's in-memory indexes; without them (e.g. called outside
    kopf) the API is listed (pods only when ``pods``: capacity awareness needs them, shapes do not)."""
    if view is None:
        return _kube.list_objects("v1", "Node"), _kube.list_objects("v1", "Pod") if pods else []
    return view


#: What each model's plan asks the scheduler for: ``namespace/name`` → its :class:`Reservation`.
#: The pods not bound yet are reserved in every other model's capacity view (sizing.reserve).
_PLANNED: dict[str, Reservation] = {}
_PLANNED_LOCK = threading.Lock()


def note_planned(namespace: str, name: str, plan: Plan, replicas: int) -> None:
    """Record the pods a model's children ask for (after they were applied)."""
    reservation = _reservation(plan, replicas)
    with _PLANNED_LOCK:
        _PLANNED[f"{namespace}/{name}"] = reservation


def forget_planned(namespace: str, name: str) -> None:
    """A deleted model's reservations go, its Deployment's too (in case its DELETED was not seen)."""
    with _PLANNED_LOCK:
        _PLANNED.pop(f"{namespace}/{name}", None)
        _DEMANDS.pop(f"{namespace}/{name}", None)
        _HELD.pop(f"{namespace}/{name}", None)
        _REFUSED.pop(f"{namespace}/{name}", None)


#: How long a plan holds its GPUs in the other models' capacity views before anything else shows them:
#: its apply (a few requests) and the Deployment's watch event normally come within seconds; a plan
#: that is never applied (refused by the API server, or a remediation left to reconcile) lets them go
#: after this.
HOLD_SECONDS = 30.0
#: Plans made in this process, newest per model: ``namespace/model`` → (its :class:`Reservation`,
#: until when on the monotonic clock). Taken over the applied plans and the Deployments seen: it is
#: the newest word on what the model's pods will ask for.
_HELD: dict[str, tuple[Reservation, float]] = {}
#: Held from a plan's read of the free GPUs to its hold (:func:`_plan_and_render`): two plans of this
#: process never count the same free GPU. Planning is CPU-bound Python (the GIL runs one at a time
#: anyway), so the lock costs the burst nothing; before it, the GPUs a plan took were recorded only
#: after its children were applied, and every plan made meanwhile saw them free.
_PLANNING_LOCK = threading.Lock()


def _reservation(plan: Plan, replicas: int) -> Reservation:
    """What a plan's pods ask the scheduler for."""
    chosen = plan.chosen
    nodes = max(chosen.nodes, 1)
    pod = chosen.pod
    memory, cpu = (float(pod.memory_gib), float(pod.cpu)) if pod is not None else (0.0, 0.0)
    return Reservation(chosen.gpu.name, chosen.gpus // nodes, nodes * max(replicas, 1), memory, cpu)


def _hold(namespace: str, name: str, plan: Plan, replicas: int) -> None:
    """Hold a plan's GPUs from the moment it is made (see :data:`_HELD`)."""
    with _PLANNED_LOCK:
        _HELD[f"{namespace}/{name}"] = (_reservation(plan, replicas), time.monotonic() + HOLD_SECONDS)


#: The GPU type the scheduler could not place a model's pods on, and its words: ``namespace/model`` →
#: (GPU type, the scheduler's reason), from the readiness look that found the reason. The model's
#: re-plan counts that type as full (:func:`_scheduler_refusal`), so it falls back to another type or
#: goes Pending naming the reason, instead of staying Deploying on a GPU the planner thought free.
_REFUSED: dict[str, tuple[str, str]] = {}
#: Set on a model whose pods the scheduler cannot place, to the workload version it refused: kopf's
#: update handler sees the change and reconciles (re-plans). Outside the "loadline.dev/" prefix for
#: the reason :data:`REMEDIATION_ANNOTATION` is.
REPLAN_ANNOTATION = "replan.loadline.dev/unschedulable"


def note_unschedulable(namespace: str, name: str, gpu_type: str, reason: str) -> None:
    """Remember that the scheduler cannot place the model's pods on ``gpu_type``."""
    with _PLANNED_LOCK:
        _REFUSED[f"{namespace}/{name}"] = (gpu_type, reason)


def _scheduler_refusal(key: str, bound: Counter[tuple[str, str]]) -> tuple[str, str] | None:
    """The scheduler's refusal of a GPU type for model ``key``, while it still holds: while the model's
    pods ask for that type (its Deployment, or this process's plan) and some of them are not bound.
    The scheduler's word stands until the scheduler changes its mind: once it binds the pods (room was
    made), or the model asks for another type, the refusal lapses and the type is planned as usual."""
    with _PLANNED_LOCK:
        refused = _REFUSED.get(key)
        demand = _DEMANDS.get(key) or _PLANNED.get(key)
        if refused is None:
            return None
        if demand is None or demand.gpu != refused[0] or demand.pods <= bound[key, refused[0]]:
            del _REFUSED[key]
            return None
    return refused


#: What each loadline Deployment of the cluster asks the scheduler for, from its watch events
#: (sizing.workload_demand), keyed ``namespace/model``: every replica watches every loadline Deployment,
#: so the models of the other shards hold their GPUs here. Taken over :data:`_PLANNED` where both
#: know a model: the Deployment is the API server's word, while this process's note of a model whose
#: shard moved to another replica is never updated again.
_DEMANDS: dict[str, Reservation] = {}


def note_demand(body: Mapping[str, Any], deleted: bool = False) -> None:
    """Keep (or, when ``deleted``, forget) what a loadline Deployment asks for, whoever planned it."""
    meta = body.get("metadata") or {}
    model = (meta.get("labels") or {}).get(INSTANCE_LABEL)
    if not model:
        return
    key = f"{meta.get('namespace')}/{model}"
    demand = None if deleted else workload_demand(body)
    with _PLANNED_LOCK:
        if demand is None:
            _DEMANDS.pop(key, None)
        else:
            _DEMANDS[key] = demand


@dataclass(frozen=True)
class _Capacity:
    """What every plan reads of one snapshot of the cluster (:func:`_index.view`), worked out once for
    it: the node shapes, the Ready GPU nodes by name, the GPUs held per node by every bound pod, the
    free GPUs (rooms) per type that leaves, the pods that fill each model's reservation per
    ``(namespace/model, GPU type)`` (:func:`_fills_reservation`), and per model with pods in it
    (``(namespace, model)``) the GPUs its pods hold per node."""

    shapes: ClusterShapes | None
    nodes: dict[str, GPUNode]
    used: dict[str, int]
    free: dict[str, list[NodeRoom]]
    bound: Counter[tuple[str, str]]
    own: dict[tuple[str, str], dict[str, int]]


#: The capacity of the snapshots used last (each kept with its snapshot: an identity is never reused
#: while its object is held): reconcile's half-second ones and a remediation's longer-lived one are in
#: use at once (``_index.view``).
_CAPACITY: list[tuple[ClusterView, _Capacity]] = []
_CAPACITIES_KEPT = 4
_CAPACITY_LOCK = threading.Lock()
#: Node name → (the index entry last seen, what capacity and the node shapes make of it). An index
#: entry is a new object whenever its node changes, so an entry that is the one seen before needs no
#: second look: a snapshot of 2,000 nodes costs 2,000 lookups instead of 2,000 nodes' labels,
#: conditions and quantities read again (py-spy: with the re-plans below, a third of the operator's
#: CPU while 1,000 crashes rolled out). Holding the entry keeps its identity from being reused.
_NODES_READ: dict[str, tuple[Mapping[str, Any], GPUNode | None, ShapeFigures | None]] = {}


def _read_nodes(nodes: list[dict[str, Any]]) -> tuple[dict[str, GPUNode], ClusterShapes | None]:
    """The Ready GPU nodes of a snapshot by name, and its node shapes; each node read only when its
    entry is new."""
    global _NODES_READ
    with _CAPACITY_LOCK:
        known = _NODES_READ
    seen: dict[str, tuple[Mapping[str, Any], GPUNode | None, ShapeFigures | None]] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        last = known.get(name)
        seen[name] = (
            last if last is not None and last[0] is node else (node, gpu_node(node), shape_figures(node))
        )
    with _CAPACITY_LOCK:
        _NODES_READ = seen  # nodes gone from the snapshot are forgotten
    ready = {name: found for name, (_, found, _) in seen.items() if found is not None}
    return ready, shapes_of(figures for _, _, figures in seen.values() if figures is not None)


def _capacity(view: ClusterView) -> _Capacity:
    """The capacity of ``view``, computed once per snapshot object (the operator's plans share one for
    :data:`_index.VIEW_SECONDS`; a view listed from the API, outside kopf, is its own).

    Why a snapshot a moment old stays safe: a pod bound since is missing from ``bound`` too, so its
    model's reservation (the plans and Deployments below are live) still holds its GPUs; a pod gone
    since is still counted as using them. Either way the plan sees less room, never more."""
    with _CAPACITY_LOCK:
        known = next((entry for entry in _CAPACITY if entry[0] is view), None)
        if known is not None:  # the most recently used first
            _CAPACITY.remove(known)
            _CAPACITY.insert(0, known)
            return known[1]
    nodes, pods = view
    ready, shapes = _read_nodes(nodes)
    bound: Counter[tuple[str, str]] = Counter()
    used: dict[str, int] = {}
    own: dict[tuple[str, str], dict[str, int]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        model = (meta.get("labels") or {}).get(INSTANCE_LABEL)
        held = pod_gpus(pod)
        if held is None:
            continue
        node, gpus = held
        used[node] = used.get(node, 0) + gpus
        if model:
            mine = own.setdefault((str(meta.get("namespace")), str(model)), {})
            mine[node] = mine.get(node, 0) + gpus
        filled = _fills_reservation(meta, ready.get(node))
        if filled is not None:
            bound[(f"{meta.get('namespace')}/{model}", filled)] += 1
    capacity = _Capacity(shapes, ready, used, free_rooms(ready.values(), used), bound, own)
    with _CAPACITY_LOCK:
        _CAPACITY[:] = [(view, capacity), *_CAPACITY[: _CAPACITIES_KEPT - 1]]
    return capacity


def forget_capacity() -> None:
    """Drop the memos (tests: a fresh process starts without them)."""
    global _NODES_READ
    with _CAPACITY_LOCK:
        _CAPACITY.clear()
        _NODES_READ = {}


def _fills_reservation(meta: Mapping[str, Any], node: GPUNode | None) -> str | None:
    """The GPU type whose reservation a bound pod fills, or None when it fills none.

    A terminating pod fills none: its GPUs stay in ``used`` until it is gone (the scheduler counts them
    until then too), and the pod that replaces it is not bound yet, so its model's reservation must still
    hold a GPU for that pod (counted as filled, the replacement's GPU looked free to every other plan:
    with ``maxSurge: 0`` every roll-out of a crash's remediation has such a pod). A pod on a node that is
    not a Ready GPU node of a catalog type fills none either: it is no place the plan can count on."""
    if meta.get("deletionTimestamp") or node is None:
        return None
    return node.gpu


def _unbound(bound: Counter[tuple[str, str]], leave_out: str) -> list[Reservation]:
    """The reservations of the other models' pods that the scheduler has not bound yet (``bound``: the
    pods that fill each model's reservation, per GPU type: a model re-planned onto another type still
    has pods bound on the old one, and those fill nothing of the new plan): those of the loadline
    Deployments seen (every shard's) and of the plans this process applied (a LeaderWorkerSet's, and a
    Deployment's until its first watch event comes)."""
    now = time.monotonic()
    with _PLANNED_LOCK:
        for key in [key for key, (_, until) in _HELD.items() if until <= now]:
            del _HELD[key]
        planned = list({**_PLANNED, **_DEMANDS, **{key: held for key, (held, _) in _HELD.items()}}.items())
    return [held._replace(pods=held.pods - bound[key, held.gpu]) for key, held in planned
            if key != leave_out and held.pods > bound[key, held.gpu]]  # fmt: skip


def _free_gpus(name: str, namespace: str, view: ClusterView) -> dict[str, list[NodeRoom]]:
    """Free GPUs per type, leaving this InferenceModel's own pods out, and the other models' pods
    that are planned but not bound yet reserved."""
    capacity = _capacity(view)
    free = capacity.free
    mine = capacity.own.get((namespace, name))
    if mine:
        free = _given_back(capacity, mine)
    return reserve_sorted(free, _unbound(capacity.bound, f"{namespace}/{name}"))


def _given_back(capacity: _Capacity, mine: Mapping[str, int]) -> dict[str, list[NodeRoom]]:
    """The snapshot's free GPUs with a model's own pods left out (``mine``: the GPUs they hold per
    node), for its own re-plan (a crash's roll-out, a spec change). Only the rooms of the nodes its
    pods are on change; rooms are values, so any room equal to a node's is that node's."""
    free = dict(capacity.free)
    changed: set[str] = set()
    for node_name, gpus in mine.items():
        node = capacity.nodes.get(node_name)
        if node is None or not gpus:
            continue
        room, used = node.room, capacity.used.get(node_name, 0)
        rooms = free[node.gpu] if node.gpu in changed else list(free[node.gpu])
        taken = NodeRoom(max(room.gpus - used, 0), room.memory_gib, room.cpu)
        rooms[rooms.index(taken)] = NodeRoom(max(room.gpus - used + gpus, 0), room.memory_gib, room.cpu)
        free[node.gpu] = rooms
        changed.add(node.gpu)
    for gpu in changed:
        free[gpu] = sorted(free[gpu], key=_FREE_GPUS, reverse=True)  # stable, as free_rooms sorts
    return free


_FREE_GPUS = operator.attrgetter("gpus")


def remediation_state(body: Mapping[str, Any]) -> RemediationState:
    """The remediation state in force: its overrides hold only for the generation they were made for,
    so a person's spec change starts from the spec again."""
    raw = (body.get("status") or {}).get("remediation")
    state = RemediationState.model_validate(raw) if raw else RemediationState()
    if state.observed_generation != body["metadata"].get("generation"):
        return RemediationState(day=state.day, actions_today=state.actions_today, history=state.history,
                                handled_crashes=state.handled_crashes, revision=state.revision)  # fmt: skip
    return state


def _workload(manifests: list[dict[str, Any]]) -> dict[str, Any] | None:
    for manifest in manifests:
        if manifest.get("kind") in {"Deployment", "LeaderWorkerSet"}:
            return manifest
    return None


def _plan_message(plan: Plan) -> str:
    s = plan.summary()
    text = (
        f"{s['gpu']} per replica (TP {s['tensorParallelSize']}, PP {s['pipelineParallelSize']}), "
        f"KV cache {s['kvCacheTokens']} tokens = {s['maxConcurrency']} sequences of {s['maxModelLen']}"
    )
    if plan.fallback_from:
        text += f"; {plan.fallback_from} had no free capacity"
    return text


def _event(obj: Mapping[str, Any], *, warning: bool, reason: str, message: str) -> None:
    """Post a Kubernetes Event about ``obj`` (what `kubectl describe` shows)."""
    kopf.event(cast(Any, obj), type="Warning" if warning else "Normal", reason=reason, message=message)


def _fail(
    body: Mapping[str, Any], patch: kopf.Patch, *, reason: str, message: str, phase: Phase, warn: bool = True
) -> None:
    previous = dict(body.get("status") or {})
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
        _event(body, warning=warn, reason=reason, message=message)


def _rejection_message(exc: NoFeasiblePlanError) -> str:
    lines = "; ".join(exc.rejections[:6])
    return (f"{exc}" + (f" — {lines}" if lines else ""))[:2000]


@dataclass(frozen=True)
class ModelInputs:
    """What planning a model needs, read once: the model with remediation's overrides applied (they
    hold for the spec generation they were made for), its remediation state, and its config.json from
    a ConfigMap or the hub when it is not inline or in the catalog."""

    obj: InferenceModel
    state: RemediationState
    config: dict[str, Any] | None
    hub: dict[str, Any] | None

    def plan(self, spec: InferenceModelSpec | None = None, **options: Any) -> Plan:
        """Plan ``spec`` (default: the model's) with the model's config.json (a :data:`PlanFn`)."""
        return plan_inference_model(
            spec or self.obj.spec, config_map_config=self.config, hub_config=self.hub, **options
        )


def model_inputs(body: Mapping[str, Any], settings: OperatorSettings) -> ModelInputs:
    """Reconcile and the FleetPolicy judge read a model the same way (raises on a bad spec)."""
    raw = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    state = remediation_state(body)
    obj = parse_inference_model({**raw, "metadata": dict(body["metadata"])})
    # Overrides waiting for the restart window are not rendered yet: the pods keep the held ones.
    running = state.held_overrides if state.held_overrides is not None else state.overrides
    obj = obj.model_copy(update={"spec": apply_overrides(obj.spec, running)})
    namespace = body["metadata"]["namespace"]
    config = _config_map_config(obj, namespace)
    return ModelInputs(obj, state, config, _hub_config(obj, namespace, settings))


#: What this process last applied of each model's children, for the model's uid and generation:
#: ``(namespace, name)`` → (uid, generation, {``kind/name``: fingerprint of the manifest}).
_APPLIED: dict[tuple[str, str], tuple[str, int | None, dict[str, str]]] = {}
_APPLIED_LOCK = threading.Lock()


def _fingerprint(child: Mapping[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(child, sort_keys=True).encode(), digest_size=16).hexdigest()


def _applied_already(meta: Mapping[str, Any], child: Mapping[str, Any], fingerprint: str) -> bool:
    """Whether this process applied ``child`` exactly so for this generation of the model already.

    A re-plan within one generation (an out-of-memory remediation; kopf re-running a reconcile)
    changes the workload, not its Service or PodDisruptionBudget: applying those again was two of a
    crash's requests at 1,000 crashes. A new generation (someone changed the spec) or a new process
    (a restart, a shard handed over) applies every child again, which also puts back one deleted or
    edited by hand. Reconcile applies the workload every time (its answer is the model's readiness); a
    crash's roll-out applies it alone, and only when every other child was applied so already
    (:func:`plan_remediation`)."""
    key = (str(meta.get("namespace")), str(meta.get("name")))
    with _APPLIED_LOCK:
        known = _APPLIED.get(key)
    if known is None or known[0] != meta.get("uid") or known[1] != meta.get("generation"):
        return False
    return known[2].get(f"{child['kind']}/{child['metadata']['name']}") == fingerprint


def _note_applied(meta: Mapping[str, Any], child: Mapping[str, Any], fingerprint: str) -> None:
    key = (str(meta.get("namespace")), str(meta.get("name")))
    uid, generation = str(meta.get("uid")), meta.get("generation")
    with _APPLIED_LOCK:
        known = _APPLIED.get(key)
        children = known[2] if known is not None and known[:2] == (uid, generation) else {}
        children[f"{child['kind']}/{child['metadata']['name']}"] = fingerprint
        _APPLIED[key] = (uid, generation, children)


def forget_applied(namespace: str, name: str) -> None:
    with _APPLIED_LOCK:
        _APPLIED.pop((namespace, name), None)


def _plan_and_render(
    body: Mapping[str, Any], settings: OperatorSettings, view: ClusterView | None
) -> tuple[ModelInputs, Plan, list[dict[str, Any]]]:
    """The model's plan on the cluster as ``view`` shows it, and its children's manifests."""
    meta = body["metadata"]
    inputs = model_inputs(body, settings)
    state = inputs.state
    cluster = _cluster_view(view, pods=settings.capacity_aware)
    options: dict[str, Any] = {
        "cluster_shapes": _capacity(cluster).shapes,
        "min_gpus": state.overrides.min_gpus_per_replica or 1,
        "min_gpu_memory_gib": state.overrides.min_gpu_memory_gi_b or 0.0,
    }
    if not settings.capacity_aware:
        plan = inputs.plan(free_gpus=None, **options)
    else:
        with _PLANNING_LOCK:  # the free GPUs read and the ones this plan takes held, in one step
            free = _free_gpus(meta["name"], meta["namespace"], cluster)
            refused = _scheduler_refusal(f"{meta['namespace']}/{meta['name']}", _capacity(cluster).bound)
            if refused is not None:  # the scheduler's word over the snapshot's: no room of that type
                free = {**free, refused[0]: []}
            plan = inputs.plan(free_gpus=free, **options)
            _hold(meta["namespace"], meta["name"], plan, inputs.obj.spec.replicas)
    return inputs, plan, render_manifests(inputs.obj, plan)


#: Set on the model when a crash's remediation is left to reconcile (the crash's id): kopf's update
#: handler sees the change and reconciles. Outside the "loadline.dev/" prefix on purpose: kopf leaves
#: annotations of its own storage prefix out of the diff it triggers update handlers on.
REMEDIATION_ANNOTATION = "remediation.loadline.dev/crash"

#: How long a remediation being rolled out makes reconcile pass over versions of the model written
#: before its decision (the decision's own version normally reaches the operator within seconds; one
#: that never comes, because the write failed, must not hold reconcile off for longer than this).
ROLL_OUT_GUARD_SECONDS = 60.0
_ROLLED_OUT: dict[tuple[str, str], tuple[str, float]] = {}
_ROLLED_OUT_LOCK = threading.Lock()
#: One lock per model, held by reconcile from its guard check through its last apply and by a crash's
#: roll-out around its apply: a reconcile of an older version of the model that is already past its
#: guard applies its workload before the roll-out does, never after (which would put the memory back).
_MODEL_LOCKS: dict[tuple[str, str], threading.Lock] = {}
#: Attempts at the annotation that asks reconcile to take a remediation over, and the pause before the next.
ASK_ATTEMPTS = 3
ASK_PAUSE_SECONDS = 1.0


def model_lock(namespace: str, name: str) -> threading.Lock:
    with _ROLLED_OUT_LOCK:
        return _MODEL_LOCKS.setdefault((namespace, name), threading.Lock())


def expect_roll_out(namespace: str, name: str, crash: str) -> None:
    """Note, before its decision is written, that this process rolls out the remediation of ``crash``
    itself: reconcile passes over versions of the model that do not carry that decision yet."""
    with _ROLLED_OUT_LOCK:
        _ROLLED_OUT[(namespace, name)] = (crash, time.monotonic())


def forget_roll_out(namespace: str, name: str) -> None:
    with _ROLLED_OUT_LOCK:
        _ROLLED_OUT.pop((namespace, name), None)


def forget_model(namespace: str, name: str) -> None:
    """A deleted model's guard and lock go with it."""
    with _ROLLED_OUT_LOCK:
        _ROLLED_OUT.pop((namespace, name), None)
        _MODEL_LOCKS.pop((namespace, name), None)


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


def predates_roll_out(body: Mapping[str, Any]) -> bool:
    """Whether ``body`` is a version of the model older than the decision of a remediation this process
    is rolling out: one whose ``status.remediation.handledCrashes`` lacks that crash, for
    :data:`ROLL_OUT_GUARD_SECONDS` at most. Reconciling it would put the memory back as it was, and roll
    the pods twice. A version carrying the decision ends the guard."""
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    with _ROLLED_OUT_LOCK:
        found = _ROLLED_OUT.get(key)
        if found is None:
            return False
        crash, since = found
        handled = ((body.get("status") or {}).get("remediation") or {}).get("handledCrashes") or []
        if crash in handled or time.monotonic() - since > ROLL_OUT_GUARD_SECONDS:
            del _ROLLED_OUT[key]
            return False
        return True


WORKLOAD_KINDS = frozenset({"Deployment", "LeaderWorkerSet"})


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
        inputs, plan, manifests = _plan_and_render(body, settings, view)
    except (LoadlineError, kopf.TemporaryError):
        return None
    previous = dict(body.get("status") or {})
    if _build.layout_changed(previous.get("plan"), plan.chosen.nodes):
        return None
    owner = _build.build_owner_reference(body)
    workload = None
    for manifest in manifests:
        child = _build.with_owner(manifest, owner, meta["namespace"])
        if child["kind"] in WORKLOAD_KINDS:
            workload = child
        elif not _applied_already(meta, child, _fingerprint(child)):
            return None
    if workload is None:
        return None
    status = _build.build_replanned_status(
        previous, plan_summary=plan.summary(), generation=meta.get("generation"), now=_build.now_iso(),
        message=_plan_message(plan),
    )  # fmt: skip
    judged = {**body, "status": {**previous, **status}}
    compliance = _policies.compliance_status(judged, inputs.obj.spec, policies or [], inputs.plan)
    if _build.status_changes(judged["status"], compliance):
        return None
    return Remediation(plan, inputs.obj.spec.replicas, workload, _build.status_changes(previous, status))


def apply_remediation(
    body: Mapping[str, Any],
    remediation: Remediation,
    logger: logging.Logger | kopf.Logger,
    settings: OperatorSettings,
) -> bool:
    """Apply a remediation's workload (``body``: the model as the decision's write answered). False
    when the API server refused it: reconcile then takes it over, with kopf's retries."""
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    child = remediation.workload
    with model_lock(namespace, name):
        try:
            _, changed = _kube.apply(child, settings.field_manager)
        except ApiException as exc:
            error = _kube.api_error_text(exc)
            logger.info("%s/%s: remediation left to reconcile (%s)", namespace, name, error)
            return False
    _note_applied(meta, child, _fingerprint(child))
    note_planned(namespace, name, remediation.plan, remediation.replicas)
    if changed:
        logger.info("rolled out %s/%s", child["kind"], child["metadata"]["name"])
    _report_fallback(body, remediation.plan)
    return True


def _report_fallback(body: Mapping[str, Any], plan: Plan) -> None:
    """A Warning when a new plan took a dearer GPU type because the cheaper one was absent or full."""
    if plan.fallback_from:
        fallback = f"{plan.fallback_from} absent or full; using {plan.chosen.gpu.name}"
        _event(body, warning=True, reason="GPUFallback", message=fallback)


def reconcile(
    body: kopf.Body,
    patch: kopf.Patch,
    logger: logging.Logger | kopf.Logger,
    settings: OperatorSettings,
    view: ClusterView | None = None,
    policies: list[FleetPolicy] | None = None,
) -> None:
    """Bring an InferenceModel's children to what its spec asks for, and say whether it keeps the
    FleetPolicies that govern it (``policies``: every FleetPolicy of the cluster).

    Under the model's lock (:func:`model_lock`), so that a crash's roll-out never lands between this
    reconcile's guard check and its apply. A version older than a remediation being rolled out is
    not reconciled: kopf tries again shortly, on the newest version it has seen by then (returning
    would count the change it brought, a spec edit, as handled)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    with model_lock(namespace, name):
        if predates_roll_out(body):
            raise kopf.TemporaryError(
                "this version predates a remediation being rolled out; reconciling the newer one", delay=1
            )
        _reconcile_unguarded(body, patch, logger, settings, view, policies)


def _refuse_unsafe(body: Mapping[str, Any], settings: OperatorSettings, policies: list[FleetPolicy]) -> None:
    """Raise the first problem the spec alone decides (the admission webhook refused it with all of
    them): a model stored without the webhooks, or before the settings or its policies changed, is
    never run with an image, environment or code-running flag the operator's safe defaults refuse."""
    meta = body["metadata"]
    namespace = str(meta["namespace"])
    labels = _policies.namespace_labels(namespace, policies)
    governing = select_policies(policies, namespace, labels, meta.get("labels") or {})
    spec = parse_inference_model(
        {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    ).spec
    problems = spec_problems(spec, settings.guard(), governing)
    if problems:
        raise problems[0]


def _reconcile_unguarded(
    body: kopf.Body,
    patch: kopf.Patch,
    logger: logging.Logger | kopf.Logger,
    settings: OperatorSettings,
    view: ClusterView | None,
    policies: list[FleetPolicy] | None,
) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        _refuse_unsafe(body, settings, policies or [])
        inputs, plan, manifests = _plan_and_render(body, settings, view)
        obj, state = inputs.obj, inputs.state
    except NoCapacityError as exc:
        message = _rejection_message(exc)
        with _PLANNED_LOCK:
            refused = _REFUSED.get(f"{namespace}/{name}")
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
            "(multi-node replicas need the LeaderWorkerSet controller, sigs.k8s.io/lws)"
        )
        _fail(body, patch, reason="MissingAPI", message=message, phase="Pending")
        raise kopf.TemporaryError(message, delay=max(settings.retry_delay_seconds, 60))

    gated = _upgrade.gate(body, patch, manifests, settings)
    if gated is None:
        return  # another loadline's pods run until their roll (docs/upgrades.md)
    body, manifests = cast(kopf.Body, gated[0]), gated[1]
    # Children of another layout are left only by a re-plan across layouts: listing every child kind
    # of the model on each reconcile cost four requests per model at creation, resume and remediation.
    relaid = _build.layout_changed((body.get("status") or {}).get("plan"), plan.chosen.nodes)
    owner = _build.build_owner_reference(body)
    changed_children = []
    applied_workload: dict[str, Any] | None = None
    removed: list[str] = []
    try:
        for manifest in manifests:
            child = _build.with_owner(manifest, owner, namespace)
            workload = child["kind"] in WORKLOAD_KINDS
            fingerprint = _fingerprint(child)
            if not workload and _applied_already(meta, child, fingerprint):
                continue
            result, changed = _kube.apply(child, settings.field_manager)
            _note_applied(meta, child, fingerprint)
            if changed:
                changed_children.append(f"{child['kind']}/{child['metadata']['name']}")
            if workload:
                applied_workload = result
        if relaid:
            removed = _remove_stale_children(namespace, name, meta["uid"], manifests)
    except ApiException as exc:
        # Refused by the API server (an admission policy, a quota, a conflict) or not reachable: the
        # plan stands; kopf calls reconcile again after the delay until the children land.
        message = f"applying the children failed ({_kube.api_error_text(exc)}); retrying"
        if applied_workload is not None:
            # The new workload exists, so the old layout may go now rather than after the rest lands:
            # a child of the old layout can be what blocks the rest (an older LeaderWorkerSet's headless
            # Service holding the client Service's name until the garbage collector removes it).
            with contextlib.suppress(ApiException):
                removed = _remove_stale_children(namespace, name, meta["uid"], manifests)
            if removed:
                _event(body, warning=False, reason="Removed", message="removed " + ", ".join(removed))
        previous = dict(body.get("status") or {})
        status = _build.build_apply_failed_status(
            previous, message=message, generation=meta.get("generation"), now=_build.now_iso()
        )
        changes = _build.status_changes(previous, status)
        if changes:
            patch.status.update(changes)
            _event(body, warning=True, reason="ApplyFailed", message=message)
        raise kopf.TemporaryError(message, delay=settings.retry_delay_seconds) from None
    if removed:
        _event(
            body,
            warning=False,
            reason="Removed",
            message="removed " + ", ".join(removed) + " (layout changed)",
        )
        logger.info("removed %s", ", ".join(removed))
    note_planned(namespace, name, plan, obj.spec.replicas)
    ready, ready_message = _build.readiness_from_workload(applied_workload or _workload(manifests))
    previous = dict(body.get("status") or {})
    message = _plan_message(plan)
    status = _build.build_deployed_status(
        previous,
        plan_summary=plan.summary(),
        generation=meta.get("generation"),
        ready=ready,
        ready_message=ready_message,
        now=_build.now_iso(),
        message=message,
        needs_person=state.needs_person,
        beyond_tables=beyond_tables(plan.inputs.version),
    )

    judged = {**body, "status": {**previous, **status}}
    compliance = _policies.compliance_status(judged, obj.spec, policies or [], inputs.plan)
    status = {**status, **compliance}
    changes = _build.status_changes(previous, status)
    if changes:
        patch.status.update(changes)
    report_compliance(body, previous, status)
    applied = "applied " + ", ".join(changed_children) if changed_children else ""
    if changed_children:
        logger.info("%s", applied)
    # One Event per decision: a new plan names the children it changed (a remediation's re-plan was two
    # Events, Planned and Applied, a third of what a crash cost the API server in Events); "Applied"
    # alone is a re-apply under the same plan (a child repaired). A crash's remediation wrote its plan
    # with its decision, which its Remediated Event said: a reconcile taking it over says "Applied".
    if previous.get("plan") != status["plan"]:
        said = f"{message}; {applied}" if applied else message
        _event(body, warning=False, reason="Planned", message=said[:1000])
        _report_fallback(body, plan)
    elif changed_children:
        _event(body, warning=False, reason="Applied", message=applied)


def report_compliance(
    body: Mapping[str, Any], previous: Mapping[str, Any], status: Mapping[str, Any]
) -> None:
    """An Event when the set of FleetPolicies the model breaks changes (not on every resync)."""
    before, after = previous.get("violatedPolicies") or [], status.get("violatedPolicies") or []
    if before == after:
        return
    conditions = status.get("conditions") or []
    message = next(
        (str(c.get("message", "")) for c in conditions if c.get("type") == _build.POLICY_COMPLIANT), ""
    )
    reason = "PolicyViolation" if after else "PolicyCompliant"
    _event(body, warning=bool(after), reason=reason, message=message[:1000])


def _remove_stale_children(namespace: str, name: str, uid: str, manifests: list[dict[str, Any]]) -> list[str]:
    """Delete the children of a layout no longer planned (found by label, kept only when this model is
    their controller), so a Deployment ↔ LeaderWorkerSet move never leaves pods holding GPUs."""
    wanted = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    existing = []
    for api_version, kind in child_kinds():
        if kind == "LeaderWorkerSet" and not _kube.has_kind(api_version, kind):
            continue
        for item in _kube.list_objects(
            api_version, kind, namespace, label_selector=f"{INSTANCE_LABEL}={name}"
        ):
            existing.append({**item, "apiVersion": api_version, "kind": kind})
    removed = []
    for api_version, kind, child in _build.stale_children(existing, wanted, uid):
        if _kube.delete(api_version, kind, namespace, child):
            removed.append(f"{kind}/{child}")
    return removed


#: The last version of each Deployment that its watch events showed, trimmed to what readiness reads,
#: keyed (namespace, name): the readiness timer reads it here instead of asking the API server (at
#: fleet scale a GET per look was half the operator's requests while a burst was Deploying). An LRU, as
#: Deployments deleted with their model by the garbage collector may never show this process a DELETED.
_SEEN_WORKLOADS_MAX = 50_000
_seen_workloads: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
_seen_workloads_lock = threading.Lock()


def note_workload(body: Mapping[str, Any], deleted: bool = False) -> None:
    """Keep (or, when ``deleted``, forget) a Deployment as its watch event showed it."""
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    with _seen_workloads_lock:
        if deleted:
            _seen_workloads.pop(key, None)
            return
        _seen_workloads[key] = {
            "metadata": {k: meta.get(k) for k in ("name", "namespace", "generation", "resourceVersion")},
            "spec": {"replicas": (body.get("spec") or {}).get("replicas")},
            "status": dict(body.get("status") or {}),
        }
        _seen_workloads.move_to_end(key)
        while len(_seen_workloads) > _SEEN_WORKLOADS_MAX:
            _seen_workloads.popitem(last=False)


def seen_workload(namespace: str, name: str) -> dict[str, Any] | None:
    with _seen_workloads_lock:
        return _seen_workloads.get((namespace, name))


def on_workload_event(
    body: kopf.Body, logger: logging.Logger | kopf.Logger, known: Mapping[str, Any] | None = None
) -> None:
    """A child Deployment/LeaderWorkerSet changed: mirror its availability into the parent's status.

    ``known``: the parent as the operator's index last saw it (:func:`_index.model_entry`). Decided on
    that first, so most events cost no request (nothing changed) or one (the status patch); the patch
    is refused only when what the decision read (:func:`_build.build_readiness_patch`) changed
    meanwhile, and the parent is read again then."""
    meta = body.get("metadata", {})
    owners = [o for o in meta.get("ownerReferences", []) or [] if o.get("kind") == KIND]
    if not owners:
        return
    ready, message = _build.readiness_from_workload(dict(body))
    if known is not None and predates_roll_out(known):
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
            return
        changes = _build.build_readiness_status(
            parent.get("status") or {}, ready=ready, message=message, now=_build.now_iso()
        )
        if changes is None:
            return
        try:
            sets, tested = _build.build_readiness_patch(parent.get("status") or {}, changes)
            written = _kube.patch_status_tested(parent, sets, tested, changes)
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
    if changes.get("phase") != (parent.get("status") or {}).get("phase"):
        logger.info("%s/%s is %s: %s", meta.get("namespace"), owners[0]["name"], changes["phase"], message)
    # Whether loadline's own restart rolls the pods, as the model was when written (a crash's roll-out
    # starts before the index shows the decision that started it).
    written_status = written.get("status") or {}
    reason = _build.readiness_event_reason(parent.get("status") or {}, changes, written_status)
    if reason:
        _event(parent, warning=False, reason=reason, message=message)


def check_readiness(body: kopf.Body, patch: kopf.Patch, memo: MutableMapping[str, Any]) -> None:
    """Level-triggered check while Deploying: catches availability that no child event reported.

    The child's events can arrive before the parent's first status is written (KWOK and small models
    become available within a second); this timer closes that race without a write when idle. It backs
    off (:func:`_build.readiness_check_due`); a Deployment is read as its watch events last showed it
    (:func:`note_workload`; a LeaderWorkerSet, not watched, with a GET); the unbound pods are looked at
    for an unschedulable reason once the model has been Deploying for
    :data:`UNSCHEDULABLE_AFTER_SECONDS`, until the reason for this version of the workload is found
    (:func:`unbound_pods`, one LIST per namespace shared by the looks of a few seconds): a stuck model
    costs one shared read a minute at most and no writes.
    """
    if readiness_due(body, memo):
        read_readiness(body, patch, memo)


def readiness_due(body: kopf.Body, memo: MutableMapping[str, Any]) -> bool:
    """Whether the back-off says to look now (then the look is noted in ``memo``). No I/O: the timer
    asks this on kopf's event loop and takes a thread only when a look is due."""
    status = body.get("status") or {}
    now = datetime.now(UTC)
    # Without a Ready condition to date it, the episode starts when this process first saw it.
    since = _build.deploying_since(dict(status)) or memo.setdefault("readiness_first_seen", now)
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

UNBOUND_PODS: _kube.RecentReads[str, dict[str, list[dict[str, Any]]]] = _kube.RecentReads(max_age=5.0)
"""A namespace's unbound loadline pods by model, one LIST reused for the readiness timer's interval,
so a burst's thousand looks share a LIST every few seconds."""


def unbound_pods(namespace: str, name: str) -> list[dict[str, Any]]:
    """The model's pods that no node holds yet, the only ones the scheduler can have a reason for.

    Unbound pods are not in the operator's pod watch (it takes bound pods only, for capacity), so they
    are listed: one LIST per namespace (loadline's pods, ``spec.nodeName=``) serves every model that
    looks within :data:`UNBOUND_PODS`' age, instead of a LIST per model (at fleet scale a burst's models
    all pass 20 s Deploying together: a LIST per model was a tenth of the operator's requests)."""

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

    return UNBOUND_PODS.get(namespace, read).get(name, [])


def read_readiness(
    body: kopf.Body, patch: kopf.Patch, memo: MutableMapping[str, Any], replan: bool = False
) -> None:
    """The look itself: the workload (and, when it is not ready, its unbound pods' scheduling).

    ``replan`` (capacity-aware planning): a pod the scheduler cannot place has the model re-planned
    with its GPU type counted full (:func:`_scheduler_refusal`): another type, or Pending with the
    scheduler's reason and the fix, rather than Deploying for as long as no room is made."""
    status = dict(body.get("status") or {})
    plan = status.get("plan") or {}
    multi_node = int(plan.get("nodesPerReplica", 1) or 1) > 1
    meta = body["metadata"]
    api_version, kind, workload_name = workload_ref(meta["name"], multi_node)
    workload = None if multi_node else seen_workload(meta["namespace"], workload_name)
    if workload is None:
        workload = _kube.get(api_version, kind, meta["namespace"], workload_name)
    ready, message = _build.readiness_from_workload(workload)
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
        unschedulable = _build.unschedulable_reason(unbound_pods(meta["namespace"], meta["name"]))
        if unschedulable:
            memo["readiness_reason_version"] = version
            message = f"{message}; {unschedulable}"
            gpu_type = str(plan.get("gpuType") or "")
            if replan and gpu_type:
                note_unschedulable(meta["namespace"], meta["name"], gpu_type, unschedulable)
                with contextlib.suppress(ApiException):  # the next look, or reconcile's retry, re-plans
                    _kube.annotate(body, {REPLAN_ANNOTATION: str(version)})
    changes = _build.build_readiness_status(
        status, ready=ready, message=message, now=_build.now_iso(), stuck=bool(unschedulable)
    )
    if changes:
        patch.status.update(changes)
        if changes.get("phase") == "Ready":
            _event(body, warning=False, reason="Ready", message=message)
        elif unschedulable:
            _event(body, warning=True, reason="Unschedulable", message=unschedulable)
