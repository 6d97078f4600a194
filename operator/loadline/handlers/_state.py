"""What one operator process remembers between handler calls, as objects built when kopf starts.

The registry's startup handler builds one :class:`OperatorState` and puts it in kopf's operator memo,
which kopf copies (shallowly) into every object's memo: each handler reads ``memo.state`` and hands it
down. A new leadership term starts kopf again, and with it a fresh state, as a new process would.
Tests build their own.

Nothing here is module-level. What stays module level in ``handlers/`` is the process's, not the
operator's memory, and outlives a leadership term by design: the Prometheus metric objects
(``_metrics``, and whether its HTTP server runs) and the fixed ``_lanes`` (the process's registry of
series and threads); the Kubernetes client and its connection-pool size (``_kube``, ``_restart_slots``:
one connection pool per process); which shards this replica owns (``_shards``, set from the command
line before kopf starts, as it is the replica's identity among its peers); and whether kopf's
``ToggleSet`` was patched (``_toggles``, once per interpreter).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache, TTLCache
from kubernetes.client import CoordinationV1Api

from loadline.handlers._election import coordination_api
from loadline.handlers._fleet import CountRefresher
from loadline.handlers._index import INSTANCE_LABEL, Views
from loadline.handlers._kube import AppliedVersions, RecentReads
from loadline.handlers._observe import Observations
from loadline.hub import ConfigCache
from loadline.lanes import Lanes
from loadline.oom import SeenCrashes
from loadline.pacing import Pacer, PacingLimits
from loadline.sharding import ShardAssignment
from loadline.sizing import CapacityBook
from loadline.status import read_status
from loadline.status.build import REVISION_ANNOTATION

#: How many Deployments :class:`SeenWorkloads` keeps: an LRU, as Deployments deleted with their model by
#: the garbage collector may never show this process a DELETED.
SEEN_WORKLOADS_MAX = 50_000
#: How long a restart claim stands in for the index (seconds); after this it is dropped, so a model
#: deleted mid-restart never holds a slot for the rest of the process's life.
CLAIM_SECONDS = 300.0
#: How long a remediation being rolled out makes reconcile pass over versions of the model written
#: before its decision (the decision's own version normally reaches the operator within seconds; one
#: that never comes, because the write failed, must not hold reconcile off for longer than this).
ROLL_OUT_GUARD_SECONDS = 60.0

#: How long a ReplicaSet's revision, once read, is taken as still its own (seconds).
REVISION_SECONDS = 60.0

ModelKey = tuple[str, str]


class AppliedChildren:
    """What this process last applied of each model's children, for the model's uid and generation:
    ``(namespace, name)`` → (uid, generation, {``kind/name``: fingerprint of the manifest})."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._applied: dict[ModelKey, tuple[str, int | None, dict[str, str]]] = {}

    def already(self, meta: Mapping[str, Any], child: Mapping[str, Any], fingerprint: str) -> bool:
        """Whether this process applied ``child`` exactly so for this generation of the model already.

        A re-plan within one generation (an out-of-memory remediation; kopf re-running a reconcile)
        changes the workload, not its Service or PodDisruptionBudget: applying those again was two of a
        crash's requests at 1,000 crashes. A new generation (someone changed the spec) or a new process
        (a restart, a shard handed over) applies every child again, which also puts back one deleted or
        edited by hand."""
        key = (str(meta.get("namespace")), str(meta.get("name")))
        with self._lock:
            known = self._applied.get(key)
        if known is None or known[0] != meta.get("uid") or known[1] != meta.get("generation"):
            return False
        return known[2].get(f"{child['kind']}/{child['metadata']['name']}") == fingerprint

    def note(self, meta: Mapping[str, Any], child: Mapping[str, Any], fingerprint: str) -> None:
        key = (str(meta.get("namespace")), str(meta.get("name")))
        uid, generation = str(meta.get("uid")), meta.get("generation")
        with self._lock:
            known = self._applied.get(key)
            children = known[2] if known is not None and known[:2] == (uid, generation) else {}
            children[f"{child['kind']}/{child['metadata']['name']}"] = fingerprint
            self._applied[key] = (uid, generation, children)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._applied.pop((namespace, name), None)


class RollOuts:
    """The coordination of a crash's roll-out with reconcile.

    A guard per model whose remediation this process rolls out itself (the crash, since when): reconcile
    passes over versions of the model that do not carry that decision yet. And one lock per model, held
    by reconcile from its guard check through its last apply and by a crash's roll-out around its
    apply: a reconcile of an older version of the model that is already past its guard applies its
    workload before the roll-out does, never after (which would put the memory back)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expected: dict[ModelKey, tuple[str, float]] = {}
        #: The workload generation each in-flight remediation applied (None: not applied yet), and since.
        self._rolled: dict[ModelKey, tuple[int | None, float]] = {}
        self._locks: dict[ModelKey, threading.Lock] = {}

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def expect(self, namespace: str, name: str, crash: str) -> None:
        """Note, before its decision is written, that this process rolls out the remediation of
        ``crash`` itself."""
        with self._lock:
            self._expected[(namespace, name)] = (crash, time.monotonic())

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._expected.pop((namespace, name), None)
            self._rolled.pop((namespace, name), None)

    def rolling(self, namespace: str, name: str) -> None:
        """The decision of a remediation this process rolls out is being written: until its workload
        is applied, the workload that runs is the one that crashed."""
        with self._lock:
            self._rolled[(namespace, name)] = (None, time.monotonic())

    def applied(self, namespace: str, name: str, generation: int | None) -> None:
        """The remediation's workload is applied: it is this ``generation`` of the workload."""
        with self._lock:
            if (namespace, name) in self._rolled:
                self._rolled[(namespace, name)] = (generation, time.monotonic())

    def settled(self, namespace: str, name: str) -> None:
        """No workload of this process's is coming for the remediation (reconcile applies it)."""
        with self._lock:
            self._rolled.pop((namespace, name), None)

    def older_than_remediation(self, namespace: str, name: str, generation: int | None) -> bool:
        """Whether a workload of this ``generation`` predates the remediation this process rolls out
        for the model (its apply has not happened, or made a later generation), for
        :data:`ROLL_OUT_GUARD_SECONDS` at most: the crashed workload being available again says
        nothing about the fix. A workload of the applied generation or later ends the guard."""
        key = (namespace, name)
        with self._lock:
            found = self._rolled.get(key)
            if found is None:
                return False
            applied, since = found
            if time.monotonic() - since > ROLL_OUT_GUARD_SECONDS:
                del self._rolled[key]
                return False
            if applied is not None and (generation is None or generation >= applied):
                del self._rolled[key]
                return False
            return True

    def forget_model(self, namespace: str, name: str) -> None:
        """A deleted model's guard and lock go with it."""
        with self._lock:
            self._expected.pop((namespace, name), None)
            self._rolled.pop((namespace, name), None)
            self._locks.pop((namespace, name), None)

    def predates(self, body: Mapping[str, Any]) -> bool:
        """Whether ``body`` is a version of the model older than the decision of a remediation this
        process is rolling out: one whose ``status.remediation.handledCrashes`` lacks that crash, for
        :data:`ROLL_OUT_GUARD_SECONDS` at most. Reconciling it would put the memory back as it was, and
        roll the pods twice. A version carrying the decision ends the guard."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        with self._lock:
            found = self._expected.get(key)
            if found is None:
                return False
            crash, since = found
            remediation = read_status(body).remediation
            handled = [] if remediation is None else remediation.handled_crashes
            if crash in handled or time.monotonic() - since > ROLL_OUT_GUARD_SECONDS:
                del self._expected[key]
                return False
            return True


class SeenWorkloads:
    """The last version of each Deployment that its watch events showed, trimmed to what readiness
    reads, keyed (namespace, name): the readiness timer reads it here instead of asking the API server
    (at fleet scale a GET per look was half the operator's requests while a burst was Deploying)."""

    def __init__(self, max_entries: int = SEEN_WORKLOADS_MAX) -> None:
        self._lock = threading.Lock()
        self._seen: LRUCache[ModelKey, dict[str, Any]] = LRUCache(maxsize=max_entries)

    def note(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """Keep (or, when ``deleted``, forget) a Deployment as its watch event showed it."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        with self._lock:
            if deleted:
                self._seen.pop(key, None)
                return
            spec = body.get("spec") or {}
            revision = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
            self._seen[key] = {
                "metadata": {
                    **{k: meta.get(k) for k in ("name", "namespace", "uid", "generation", "resourceVersion")},
                    "annotations": {REVISION_ANNOTATION: revision} if revision else {},
                    "ownerReferences": list(meta.get("ownerReferences") or []),
                },
                "spec": {"replicas": spec.get("replicas"), "paused": bool(spec.get("paused"))},
                "status": dict(body.get("status") or {}),
            }

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._seen.get((namespace, name))


class ReadyPods:
    """The Ready pods of each model by the ReplicaSet that owns them, as the pod watch shows them, and
    each ReplicaSet's revision once read: what makes a model Ready when its current template's pods
    are, before the Deployment's controller writes its ready count (:func:`loadline.status.build.
    readiness_from_workload`). Noted on kopf's event loop with no I/O."""

    def __init__(
        self, revision_seconds: float = REVISION_SECONDS, max_revisions: int = SEEN_WORKLOADS_MAX
    ) -> None:
        self._lock = threading.Lock()
        #: (namespace, model) -> ReplicaSet (uid, name) -> its Ready pods' names -> their first
        #: container's name (the engine's, whose log the observation reads).
        self._ready: dict[ModelKey, dict[tuple[str, str], dict[str, str]]] = {}
        #: ReplicaSet uid -> its revision annotation; kept for a while only, as a roll-back to a
        #: template an older ReplicaSet holds moves that ReplicaSet's revision up.
        self.revisions: TTLCache[str, str] = TTLCache(maxsize=max_revisions, ttl=revision_seconds)

    def note(self, pod: Mapping[str, Any], deleted: bool = False) -> bool:
        """Record the pod's readiness; True when it has just turned Ready."""
        meta = pod.get("metadata") or {}
        model = (meta.get("labels") or {}).get(INSTANCE_LABEL)
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "ReplicaSet"), None)
        if not model or owner is None:
            return False
        key = (str(meta.get("namespace") or ""), str(model))
        replica_set = (str(owner.get("uid") or ""), str(owner.get("name") or ""))
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = (
            not deleted
            and not meta.get("deletionTimestamp")
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        )
        name = str(meta.get("name"))
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        with self._lock:
            sets = self._ready.setdefault(key, {})
            pods = sets.setdefault(replica_set, {})
            was = name in pods
            if ready:
                pods[name] = str(containers[0].get("name") or "")
            else:
                pods.pop(name, None)
                if not pods:
                    del sets[replica_set]
                if not sets:
                    del self._ready[key]
            return ready and not was

    def of_model(self, namespace: str, model: str) -> dict[tuple[str, str], int]:
        """The model's ReplicaSets (uid, name) that have Ready pods, with how many."""
        with self._lock:
            return {rs: len(pods) for rs, pods in self._ready.get((namespace, model), {}).items()}

    def serving(self, namespace: str, model: str) -> tuple[str, str] | None:
        """(pod, container) of the model's Ready pod with the smallest name, whichever ReplicaSet owns
        it; None when the pod watch shows none (a LeaderWorkerSet's pods have no ReplicaSet)."""
        with self._lock:
            pods = [
                pod for by_name in self._ready.get((namespace, model), {}).values() for pod in by_name.items()
            ]
        return min(pods) if pods else None

    def forget_model(self, namespace: str, name: str) -> None:
        with self._lock:
            self._ready.pop((namespace, name), None)


class RestartClaims:
    """Models this process set Running whose status its index may not show yet: the restart slots of
    ``maxConcurrent`` are taken under :meth:`slots`, so two timers of this process never take the last
    one together. One process decides at a time (the elected leader), so no lock in the API is needed.
    A claim stands in for the index only for :data:`CLAIM_SECONDS`."""

    def __init__(self) -> None:
        self.slots = threading.Lock()
        self._claimed: dict[str, float] = {}

    def live(self, now: float) -> list[str]:
        """The claims still standing (call under :attr:`slots`)."""
        for key in [k for k, at in self._claimed.items() if now - at > CLAIM_SECONDS]:
            del self._claimed[key]
        return list(self._claimed)

    def claim(self, key: str, now: float) -> None:
        """(Call under :attr:`slots`.)"""
        self._claimed[key] = now

    def drop(self, key: str) -> None:
        """(Call under :attr:`slots`.)"""
        self._claimed.pop(key, None)

    def claimed(self) -> frozenset[str]:
        """Models this process has started restarting and its index may not show yet."""
        with self.slots:
            return frozenset(self.live(time.time()))


#: How long a scale count this process wrote stands in for its index's copy of the model (seconds):
#: the index shows the write within a second or two; after this the index decides again, so a count
#: written meanwhile by another hand (another replica after a hand-over) is not overridden for longer.
SCALE_WRITTEN_SECONDS = 30.0


class ScaleCounts:
    """The scale subresource's ``status.replicas``/``status.selector`` this process last wrote, by
    model (namespace, name, uid), for :data:`SCALE_WRITTEN_SECONDS`. A workload's next event usually
    comes before the index shows the write: decided on the index's copy alone, it was written again
    (or read first, to find it already written), two thirds of the scale's requests at creation."""

    def __init__(self, max_entries: int = SEEN_WORKLOADS_MAX, ttl: float = SCALE_WRITTEN_SECONDS) -> None:
        self._lock = threading.Lock()
        self._written: TTLCache[tuple[str, str, str], dict[str, Any]] = TTLCache(max_entries, ttl)

    def written(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        """What this process wrote of the model's scale status lately (empty: nothing, or long ago)."""
        with self._lock:
            return dict(self._written.get((namespace, name, uid)) or {})

    def note(self, namespace: str, name: str, uid: str, changes: Mapping[str, Any]) -> None:
        """``changes`` (``replicas``, ``selector``) were written to the model's status."""
        with self._lock:
            key = (namespace, name, uid)
            self._written[key] = {**(self._written.get(key) or {}), **changes}


class LeaseClient:
    """The Lease client of the restart slots' table, made on first use (the state is built before the
    client configuration is loaded, and a process that never shares slots never needs one)."""

    def __init__(self, make: Callable[[], CoordinationV1Api] | None = None) -> None:
        self._make = make
        self._api: CoordinationV1Api | None = None
        self._lock = threading.Lock()

    def api(self) -> CoordinationV1Api:
        with self._lock:
            if self._api is None:
                self._api = (self._make or coordination_api)()
            return self._api


@dataclass(frozen=True)
class OperatorState:
    """Everything one operator process keeps between handler calls (see the module docstring)."""

    #: Reservations of plans and Deployments, the scheduler's refusals, and the snapshots' capacity.
    capacity: CapacityBook = field(default_factory=lambda: CapacityBook(INSTANCE_LABEL))
    #: Snapshots of the node and pod indexes.
    views: Views = field(default_factory=Views)
    #: Fingerprints of the children this process applied.
    applied: AppliedChildren = field(default_factory=AppliedChildren)
    #: The resourceVersion each of this process's applies returned.
    versions: AppliedVersions = field(default_factory=AppliedVersions)
    #: Crash roll-outs in flight and the per-model locks reconcile shares with them.
    roll_outs: RollOuts = field(default_factory=RollOuts)
    #: Deployments as their watch events last showed them.
    workloads: SeenWorkloads = field(default_factory=SeenWorkloads)
    #: The models' Ready pods by ReplicaSet, as their watch events last showed them.
    ready_pods: ReadyPods = field(default_factory=ReadyPods)
    #: config.json files fetched from the hub, keyed with the credential that fetched them and expiring
    #: (loadline.hub.ConfigCache says why).
    hub: ConfigCache = field(default_factory=lambda: ConfigCache(ttl=3600, max_entries=512))
    #: A namespace's unbound loadline pods by model, one LIST reused for the readiness timer's
    #: interval, so a burst's thousand looks share a LIST every few seconds.
    unbound_pods: RecentReads[str, dict[str, list[dict[str, Any]]]] = field(
        default_factory=lambda: RecentReads(max_age=5.0)
    )
    #: Every shard's running restarts, one LIST reused for a few seconds by every timer.
    restarting: RecentReads[str, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: RecentReads(max_age=5.0)
    )
    #: Crash ids already handled by this process.
    crashes: SeenCrashes = field(default_factory=lambda: SeenCrashes(capacity=10_000))
    #: Restarts this process started that its index may not show yet.
    claims: RestartClaims = field(default_factory=RestartClaims)
    #: The FleetPolicies' counts, refreshed off the reconcile path.
    counts: CountRefresher = field(default_factory=CountRefresher)
    #: The client of the restart slots' Lease (shared between shards).
    leases: LeaseClient = field(default_factory=LeaseClient)
    #: The thread pools of the handlers that wait on the network (loadline.lanes).
    lanes: Lanes = field(default_factory=lambda: Lanes.sized(16))
    #: The shards of the models this run reconciles (every model, unless sharded).
    shards: ShardAssignment = field(default_factory=ShardAssignment)
    #: The fleet's observation store as this process last read or wrote it (docs/observe.md).
    observations: Observations = field(default_factory=Observations)
    #: The crash roll-outs running and waiting their turn (docs/oom.md, "A storm of crashes").
    pacer: Pacer = field(default_factory=lambda: Pacer(PacingLimits()))
    #: The scale subresource's counts this process wrote lately (its index shows them later).
    scale_counts: ScaleCounts = field(default_factory=ScaleCounts)

    def forget_model(self, namespace: str, name: str) -> None:
        """A deleted model's reservations, fingerprints, guard and lock go with it."""
        self.capacity.forget(f"{namespace}/{name}")
        self.pacer.cancel(f"{namespace}/{name}")
        self.applied.forget(namespace, name)
        self.roll_outs.forget_model(namespace, name)
        self.ready_pods.forget_model(namespace, name)
