"""The capacity book: what every plan of one operator process counts as taken, beside the planner.

Pure (no cluster access): the operator hands it snapshots of its node and pod indexes and the
Deployments it watches, and asks it for the free GPUs a model may plan on. One book per operator
process (the handlers build it at start); tests build their own.

What it keeps, each keyed ``namespace/model``:

- *planned*: what each model's applied children ask the scheduler for;
- *demands*: what each loadline Deployment of the cluster asks for, from its watch events (every
  replica watches every loadline Deployment, so the models of the other shards hold their GPUs here);
  taken over *planned* where both know a model, as the Deployment is the API server's word;
- *held*: plans made in this process, newest per model, for :data:`HOLD_SECONDS` (taken over both);
- *refused*: the GPU type the scheduler could not place a model's pods on, and its words.

And two memos of the snapshots: the capacity of the last few snapshot objects, and each node's reading.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from loadline.sizing._capacity import (
    GPUNode,
    NodeRoom,
    Reservation,
    ShapeFigures,
    free_rooms,
    gpu_node,
    pod_gpus,
    reserve_sorted,
    shape_figures,
    shapes_of,
)
from loadline.sizing._plan import Plan
from loadline.sizing._shapes import ClusterShapes

#: (GPU nodes, GPU pods) as the operator's indexes show them (one snapshot object per half second).
ClusterView = tuple[list[dict[str, Any]], list[dict[str, Any]]]

#: How long a plan holds its GPUs in the other models' capacity views before anything else shows them:
#: its apply (a few requests) and the Deployment's watch event normally come within seconds; a plan
#: that is never applied (refused by the API server, or a remediation left to reconcile) lets them go
#: after this.
HOLD_SECONDS = 30.0
#: How many snapshots' capacity is kept: reconcile's half-second ones and a remediation's longer-lived
#: one are in use at once.
CAPACITIES_KEPT = 4

_FREE_GPUS = operator.attrgetter("gpus")
NodeReading = tuple[Mapping[str, Any], GPUNode | None, ShapeFigures | None]


@dataclass(frozen=True)
class Capacity:
    """What every plan reads of one snapshot of the cluster, worked out once for it: the node shapes,
    the Ready GPU nodes by name, the GPUs held per node by every bound pod, the free GPUs (rooms) per
    type that leaves, the pods that fill each model's reservation per ``(namespace/model, GPU type)``
    (:func:`fills_reservation`), and per model with pods in it (``(namespace, model)``) the GPUs its
    pods hold per node."""

    shapes: ClusterShapes | None
    nodes: dict[str, GPUNode]
    used: dict[str, int]
    free: dict[str, list[NodeRoom]]
    bound: Counter[tuple[str, str]]
    own: dict[tuple[str, str], dict[str, int]]


def reservation(plan: Plan, replicas: int) -> Reservation:
    """What a plan's pods ask the scheduler for."""
    chosen = plan.chosen
    nodes = max(chosen.nodes, 1)
    pod = chosen.pod
    memory, cpu = (float(pod.memory_gib), float(pod.cpu)) if pod is not None else (0.0, 0.0)
    return Reservation(chosen.gpu.name, chosen.gpus // nodes, nodes * max(replicas, 1), memory, cpu)


def fills_reservation(meta: Mapping[str, Any], node: GPUNode | None) -> str | None:
    """The GPU type whose reservation a bound pod fills, or None when it fills none.

    A terminating pod fills none: its GPUs stay in ``used`` until it is gone (the scheduler counts them
    until then too), and the pod that replaces it is not bound yet, so its model's reservation must still
    hold a GPU for that pod (counted as filled, the replacement's GPU looked free to every other plan:
    with ``maxSurge: 0`` every roll-out of a crash's remediation has such a pod). A pod on a node that is
    not a Ready GPU node of a catalog type fills none either: it is no place the plan can count on."""
    if meta.get("deletionTimestamp") or node is None:
        return None
    return node.gpu


def given_back(capacity: Capacity, mine: Mapping[str, int]) -> dict[str, list[NodeRoom]]:
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


class CapacityBook:
    """One operator process's record of what its plans and the cluster's Deployments take (see the
    module docstring). Thread-safe: plans run on several threads.

    ``model_label``: the pod label naming the model a pod serves (the renderer's constant, handed in
    so that sizing does not depend on rendering)."""

    def __init__(self, model_label: str) -> None:
        self._label = model_label
        self._lock = threading.Lock()
        self.planned: dict[str, Reservation] = {}
        self.held: dict[str, tuple[Reservation, float]] = {}
        self.refused: dict[str, tuple[str, str]] = {}
        self.demands: dict[str, Reservation] = {}
        # Held from a plan's read of the free GPUs to its hold (:meth:`planning`): two plans of this
        # process never count the same free GPU. Planning is CPU-bound Python (the GIL runs one at a time
        # anyway), so the lock costs a burst nothing.
        self._planning = threading.Lock()
        self._capacity_lock = threading.Lock()
        # Keyed by the snapshot's identity; the snapshot is kept with its capacity, so an identity is
        # never reused while its entry is held.
        self._capacities: LRUCache[int, tuple[ClusterView, Capacity]] = LRUCache(maxsize=CAPACITIES_KEPT)
        # Node name → (the index entry last seen, what capacity and the node shapes make of it). An
        # index entry is a new object whenever its node changes, so an entry that is the one seen before
        # needs no second look: a snapshot of 2,000 nodes costs 2,000 lookups instead of 2,000 nodes'
        # labels, conditions and quantities read again (py-spy: a third of the operator's CPU while
        # 1,000 crashes rolled out).
        self._nodes_read: dict[str, NodeReading] = {}

    # --- what models ask for ---

    def note_planned(self, key: str, plan: Plan, replicas: int) -> None:
        """Record the pods a model's children ask for (after they were applied)."""
        with self._lock:
            self.planned[key] = reservation(plan, replicas)

    def hold(self, key: str, plan: Plan, replicas: int) -> None:
        """Hold a plan's GPUs from the moment it is made, for :data:`HOLD_SECONDS`."""
        with self._lock:
            self.held[key] = (reservation(plan, replicas), time.monotonic() + HOLD_SECONDS)

    def note_demand(self, key: str, demand: Reservation | None) -> None:
        """Keep (or, with None, forget) what a loadline Deployment of model ``key`` asks for."""
        with self._lock:
            if demand is None:
                self.demands.pop(key, None)
            else:
                self.demands[key] = demand

    def note_unschedulable(self, key: str, gpu_type: str, reason: str) -> None:
        """Remember that the scheduler cannot place model ``key``'s pods on ``gpu_type``."""
        with self._lock:
            self.refused[key] = (gpu_type, reason)

    def refusal(self, key: str) -> tuple[str, str] | None:
        """The scheduler's last refusal noted for model ``key`` (GPU type, its reason), if any."""
        with self._lock:
            return self.refused.get(key)

    def forget(self, key: str) -> None:
        """A deleted model's reservations go, its Deployment's too (in case its DELETED was not seen)."""
        with self._lock:
            for book in (self.planned, self.demands, self.held, self.refused):
                book.pop(key, None)

    def scheduler_refusal(self, key: str, bound: Counter[tuple[str, str]]) -> tuple[str, str] | None:
        """The scheduler's refusal of a GPU type for model ``key``, while it still holds: while the
        model's pods ask for that type (its Deployment, or this process's plan) and some of them are not
        bound. The scheduler's word stands until the scheduler changes its mind: once it binds the pods
        (room was made), or the model asks for another type, the refusal lapses."""
        with self._lock:
            refused = self.refused.get(key)
            demand = self.demands.get(key) or self.planned.get(key)
            if refused is None:
                return None
            if demand is None or demand.gpu != refused[0] or demand.pods <= bound[key, refused[0]]:
                del self.refused[key]
                return None
        return refused

    @contextlib.contextmanager
    def planning(self) -> Iterator[None]:
        """Held from a plan's read of the free GPUs to its :meth:`hold`, so two plans of this process
        never count the same free GPU."""
        with self._planning:
            yield

    # --- what the cluster shows ---

    def capacity(self, view: ClusterView) -> Capacity:
        """The capacity of ``view``, computed once per snapshot object.

        Why a snapshot a moment old stays safe: a pod bound since is missing from ``bound`` too, so its
        model's reservation (the plans and Deployments above are live) still holds its GPUs; a pod gone
        since is still counted as using them. Either way the plan sees less room, never more."""
        with self._capacity_lock:
            known = self._capacities.get(id(view))
            if known is not None and known[0] is view:
                return known[1]
        nodes, pods = view
        ready, shapes = self._read_nodes(nodes)
        bound: Counter[tuple[str, str]] = Counter()
        used: dict[str, int] = {}
        own: dict[tuple[str, str], dict[str, int]] = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            model = (meta.get("labels") or {}).get(self._label)
            held = pod_gpus(pod)
            if held is None:
                continue
            node, gpus = held
            used[node] = used.get(node, 0) + gpus
            if model:
                mine = own.setdefault((str(meta.get("namespace")), str(model)), {})
                mine[node] = mine.get(node, 0) + gpus
            filled = fills_reservation(meta, ready.get(node))
            if filled is not None:
                bound[(f"{meta.get('namespace')}/{model}", filled)] += 1
        capacity = Capacity(shapes, ready, used, free_rooms(ready.values(), used), bound, own)
        with self._capacity_lock:
            self._capacities[id(view)] = (view, capacity)
        return capacity

    def _read_nodes(self, nodes: list[dict[str, Any]]) -> tuple[dict[str, GPUNode], ClusterShapes | None]:
        """The Ready GPU nodes of a snapshot by name, and its node shapes; each node read only when its
        entry is new."""
        with self._capacity_lock:
            known = self._nodes_read
        seen: dict[str, NodeReading] = {}
        for node in nodes:
            name = str((node.get("metadata") or {}).get("name", ""))
            last = known.get(name)
            seen[name] = (
                last if last is not None and last[0] is node else (node, gpu_node(node), shape_figures(node))
            )
        with self._capacity_lock:
            self._nodes_read = seen  # nodes gone from the snapshot are forgotten
        ready = {name: found for name, (_, found, _) in seen.items() if found is not None}
        return ready, shapes_of(figures for _, _, figures in seen.values() if figures is not None)

    def unbound(self, bound: Counter[tuple[str, str]], leave_out: str) -> list[Reservation]:
        """The reservations of the other models' pods that the scheduler has not bound yet (``bound``:
        the pods that fill each model's reservation, per GPU type: a model re-planned onto another type
        still has pods bound on the old one, and those fill nothing of the new plan)."""
        now = time.monotonic()
        with self._lock:
            for key in [key for key, (_, until) in self.held.items() if until <= now]:
                del self.held[key]
            held = {key: reserved for key, (reserved, _) in self.held.items()}
            planned = list({**self.planned, **self.demands, **held}.items())
        return [reserved._replace(pods=reserved.pods - bound[key, reserved.gpu]) for key, reserved in planned
                if key != leave_out and reserved.pods > bound[key, reserved.gpu]]  # fmt: skip

    def free_gpus(self, name: str, namespace: str, view: ClusterView) -> dict[str, list[NodeRoom]]:
        """Free GPUs per type, leaving this model's own pods out, and the other models' pods that are
        planned but not bound yet reserved."""
        capacity = self.capacity(view)
        free = capacity.free
        mine = capacity.own.get((namespace, name))
        if mine:
            free = given_back(capacity, mine)
        return reserve_sorted(free, self.unbound(capacity.bound, f"{namespace}/{name}"))
