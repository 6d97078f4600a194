"""What one operator process remembers between handler calls, as objects built when kopf starts.

The registry's startup handler builds one :class:`OperatorState` and puts it in kopf's operator memo,
which kopf copies (shallowly) into every object's memo: each handler reads ``memo.state`` and hands it
down. A new leadership term starts kopf again, and with it a fresh state, as a new process would.
Tests build their own. The bookkeeping types it is made of are pure (:mod:`loadline.state`); what is
here wires them with the ones that talk to the API server.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import CoordinationV1Api

from loadline.handlers._election import coordination_api
from loadline.handlers._fleet import CountRefresher
from loadline.handlers._observe import Observations
from loadline.hub import ConfigCache
from loadline.lanes import Lanes
from loadline.oom import SeenCrashes
from loadline.pacing import Pacer, PacingLimits
from loadline.sharding import ShardAssignment
from loadline.sizing import CapacityBook
from loadline.state import (
    INSTANCE_LABEL,
    AppliedChildren,
    AppliedVersions,
    ReadyPods,
    RecentReads,
    RestartClaims,
    RollOuts,
    ScaleCounts,
    SeenWorkloads,
    StatusReads,
    Views,
)


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
    #: Each model version's typed status, for the timers' filters and due-checks that ask every tick.
    status_reads: StatusReads = field(default_factory=StatusReads)

    def forget_model(self, namespace: str, name: str) -> None:
        """A deleted model's reservations, fingerprints, guard and lock go with it."""
        self.capacity.forget(f"{namespace}/{name}")
        self.pacer.cancel(f"{namespace}/{name}")
        self.applied.forget(namespace, name)
        self.roll_outs.forget_model(namespace, name)
        self.ready_pods.forget_model(namespace, name)
