"""Free GPUs per type from Node and Pod objects, as the operator's capacity awareness reads them."""

from __future__ import annotations

import random
from typing import Any

from loadline.api import parse_inference_model
from loadline.handlers import _plan
from loadline.handlers._state import OperatorState
from loadline.render import render_manifests
from loadline.sizing import (
    NodeRoom,
    Reservation,
    _book,
    free_gpus_by_type,
    free_rooms_by_type,
    plan_inference_model,
    reserve,
    reserve_sorted,
    workload_demand,
)
from tests.conftest import inference_model


def node(
    name: str, product: str, gpus: int, ready: bool = True, unschedulable: bool = False
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "spec": {"unschedulable": unschedulable},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "32"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def gpus(free: dict[str, list[NodeRoom]]) -> dict[str, list[int]]:
    """Free GPUs per node of each type, from rooms."""
    return {name: [room.gpus for room in rooms] for name, rooms in free.items()}


def pod(
    node_name: str, gpus: int, phase: str = "Running", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels or {}},
        "spec": {
            "nodeName": node_name,
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": phase},
    }


def test_free_gpus_subtract_bound_pods_and_skip_unusable_nodes() -> None:
    nodes = [
        node("l4-a", "NVIDIA-L4", 4),
        node("l4-b", "NVIDIA-L4", 4),
        node("h100-a", "NVIDIA-H100-80GB-HBM3", 8),
        node("h100-down", "NVIDIA-H100-80GB-HBM3", 8, ready=False),
        node("h100-cordoned", "NVIDIA-H100-80GB-HBM3", 8, unschedulable=True),
        node("mystery", "NVIDIA-Quantum-X", 8),
        {"metadata": {"name": "cpu-only", "labels": {}}, "status": {"allocatable": {"cpu": "8"}}},
    ]
    pods = [
        pod("l4-a", 3),
        pod("l4-a", 1, phase="Succeeded"),  # finished pods hold nothing
        pod("h100-a", 8),
        pod("", 1),  # pending, not bound
    ]
    assert free_gpus_by_type(nodes, pods) == {"L4": [4, 1], "H100-80GB": [0]}


def test_own_pods_can_be_ignored_when_replanning() -> None:
    nodes = [node("l4-a", "NVIDIA-L4", 1)]
    mine = {"loadline.dev/inferencemodel": "chat"}
    pods = [pod("l4-a", 1, labels=mine)]
    assert free_gpus_by_type(nodes, pods) == {"L4": [0]}
    assert free_gpus_by_type(nodes, pods, ignore_pods_labelled=mine) == {"L4": [1]}


# --- pods planned but not bound yet (a burst of models created back to back) ---


def test_reserved_pods_take_the_most_free_nodes_first() -> None:
    assert gpus(reserve({"L4": [1, 4, 1, 4]}, [Reservation("L4", 1, 3)])) == {"L4": [3, 2, 1, 1]}
    # A pod no node can hold takes nothing; other types are untouched.
    assert gpus(reserve({"L4": [1, 1], "A100-80GB": [8]}, [Reservation("L4", 2, 1)])) == {
        "L4": [1, 1],
        "A100-80GB": [8],
    }


def test_a_reserved_pod_takes_gpus_only_where_its_host_memory_fits() -> None:
    """The scheduler binds a pending pod to a node that holds its memory too: its GPUs are reserved
    there, not on the node with the most free GPUs whose memory is too small for it."""
    free = {"L4": [NodeRoom(1, memory_gib=12.0, cpu=3.0), NodeRoom(1, memory_gib=170.0, cpu=44.0)]}
    held = reserve(free, [Reservation("L4", 1, 1, 20.0, 3.0)])["L4"]
    assert sorted((r.memory_gib, r.gpus) for r in held) == [(12.0, 1), (170.0, 0)]


def test_a_burst_of_models_overflows_to_the_next_type_instead_of_piling_onto_the_cheapest(
    state: OperatorState,
) -> None:
    """Eight models planned on L4 (one GPU each), none bound yet: the ninth sees no free L4 and falls
    back, where without the reservations it would see all 8 L4 free and be Pending for good."""
    nodes = [node("l4-a", "NVIDIA-L4", 4), node("l4-b", "NVIDIA-L4", 4), node("l40s", "NVIDIA-L40S", 4)]
    for i in range(8):
        state.capacity.planned[f"ns/m{i}"] = Reservation("L4", 1, 1)
    free = gpus(state.capacity.free_gpus("m8", "ns", (nodes, [])))
    assert free == {"L4": [0, 0], "L40S": [4]}
    # Once the scheduler binds a model's pod, the index counts it and its reservation ends.
    bound = [pod("l4-a", 1, labels={"loadline.dev/inferencemodel": "m0"}) | {"metadata": {
        "namespace": "ns", "labels": {"loadline.dev/inferencemodel": "m0"}}}]  # fmt: skip
    assert gpus(state.capacity.free_gpus("m8", "ns", (nodes, bound))) == {"L4": [0, 0], "L40S": [4]}
    state.capacity.forget("ns/m1")  # a deleted model frees its reservation
    assert gpus(state.capacity.free_gpus("m8", "ns", (nodes, bound))) == {"L4": [1, 0], "L40S": [4]}
    # A model's own reservation is not held against its own re-plan.
    assert gpus(state.capacity.free_gpus("m2", "ns", (nodes, bound))) == {"L4": [1, 1], "L40S": [4]}


# --- capacity shared between operator replicas (sharding): the Deployments every replica sees ---


def rendered_deployment(name: str, gpu_type: str, replicas: int) -> dict[str, Any]:
    """The Deployment loadline renders for a model planned on ``gpu_type``, as its watch event shows it."""
    obj = parse_inference_model(
        inference_model(gpu={"types": [gpu_type]}, replicas=replicas, maxModelLen=8192, concurrency=1)
        | {"metadata": {"name": name, "namespace": "ns"}}
    )
    manifests = render_manifests(obj, plan_inference_model(obj.spec))
    return next(m for m in manifests if m["kind"] == "Deployment")


def test_a_deployment_says_which_gpus_its_pods_ask_for() -> None:
    demand = workload_demand(rendered_deployment("chat", "L4", 3))
    assert demand is not None and demand[:3] == ("L4", 1, 3)
    # The pod's host requests too, as rendered from the plan (where the scheduler can bind it).
    plan = plan_inference_model(
        parse_inference_model(inference_model(gpu={"types": ["L4"]}, maxModelLen=8192, concurrency=1)).spec
    )
    assert plan.chosen.pod is not None
    assert (demand.memory_gib, demand.cpu) == (plan.chosen.pod.memory_gib, plan.chosen.pod.cpu)
    other = workload_demand(rendered_deployment("chat", "L40S", 1))
    assert other is not None and other[:3] == ("L40S", 1, 1)
    cpu_only = rendered_deployment("chat", "L4", 1)
    for container in cpu_only["spec"]["template"]["spec"]["containers"]:
        container["resources"] = {}
    assert workload_demand(cpu_only) is None
    # Pods that may land on two products reserve on neither: where they go is the scheduler's pick.
    either = rendered_deployment("chat", "L4", 1)
    terms = either["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0][
        "values"
    ] = ["NVIDIA-L4", "NVIDIA-L40S"]
    assert workload_demand(either) is None


def test_models_planned_by_another_replica_hold_their_gpus_from_their_deployments(
    state: OperatorState,
) -> None:
    """Two replicas plan models of their own shards at once: each replica's plans are in its own memory,
    but the Deployments are watched by both. Before, a model of the other shard held no GPU until its
    pods were bound, so both replicas could plan onto the last free L4 (e2e test_sharding saw it)."""
    nodes = [node("l4-a", "NVIDIA-L4", 2), node("l40s", "NVIDIA-L40S", 4)]
    for other in ("m0", "m1"):  # the other replica's models: only their Deployments are seen here
        _plan.note_demand(state, rendered_deployment(other, "L4", 1))
    assert gpus(state.capacity.free_gpus("mine", "ns", (nodes, []))) == {"L4": [0], "L40S": [4]}
    # A bound pod ends its model's reservation (the index counts the pod instead).
    bound = [
        pod("l4-a", 1) | {"metadata": {"namespace": "ns", "labels": {"loadline.dev/inferencemodel": "m0"}}}
    ]
    assert gpus(state.capacity.free_gpus("mine", "ns", (nodes, bound))) == {"L4": [0], "L40S": [4]}
    # The Deployment's watch event wins over a stale note of this replica's (its shard moved on).
    state.capacity.planned["ns/m1"] = Reservation("L40S", 1, 4)
    assert gpus(state.capacity.free_gpus("mine", "ns", (nodes, bound))) == {"L4": [0], "L40S": [4]}
    _plan.note_demand(state, rendered_deployment("m1", "L4", 1), deleted=True)
    assert gpus(state.capacity.free_gpus("mine", "ns", (nodes, bound))) == {"L4": [1], "L40S": [0]}
    state.capacity.forget("ns/m1")  # the model's DELETED (on its own shard's replica)
    assert gpus(state.capacity.free_gpus("mine", "ns", (nodes, bound))) == {"L4": [1], "L40S": [4]}


# --- a GPU type's nodes in several shapes: a free GPU counts only where the pod's host memory fits ---


def shaped_node(name: str, instance_type: str, gpus: int, memory: str, cpu: str) -> dict[str, Any]:
    """An L4 node as a cloud's node controller labels it (instance type), with its allocatable."""
    return {
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-L4",
                "node.kubernetes.io/instance-type": instance_type,
            },
        },
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "memory": memory, "cpu": cpu},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_free_gpu_on_a_node_too_small_for_the_pod_is_no_capacity_for_it() -> None:
    """e2e's fleet has L4 nodes of one GPU on 16 GiB (g6.xlarge) beside four-GPU ones (g6.12xlarge).
    With the four-GPU nodes full, an 8B chat model's pod (more host memory than a g6.xlarge has) must
    fall back to L40S: counted as capacity, the small node's free GPU got it planned on L4, where it
    stayed Pending ("Insufficient memory"), a failure seen in the sharded e2e test."""
    nodes = [
        shaped_node("small", "g6.xlarge", 1, "15Gi", "4"),
        shaped_node("big", "g6.12xlarge", 4, "185Gi", "47"),
        node("l40s", "NVIDIA-L40S", 4),
    ]
    full = [pod("big", 4)]
    spec = parse_inference_model(
        inference_model(gpu={"types": ["L4", "L40S"]}, maxModelLen=8192, concurrency=1)
    ).spec
    assert plan_inference_model(spec).chosen.gpu.name == "L4"  # the cheapest, with the cluster free
    rooms = free_rooms_by_type(nodes, full)
    assert [r.gpus for r in rooms["L4"]] == [1, 0]
    plan = plan_inference_model(spec, free_gpus=rooms)
    assert plan.chosen.gpu.name == "L40S" and plan.fallback_from == "L4"
    # Counted by GPUs alone (what the planner read before), the small node's GPU looked free for it.
    assert plan_inference_model(spec, free_gpus=free_gpus_by_type(nodes, full)).chosen.gpu.name == "L4"
    # With a GPU free on the big node, L4 again.
    assert (
        plan_inference_model(spec, free_gpus=free_rooms_by_type(nodes, [pod("big", 3)])).chosen.gpu.name
        == "L4"
    )


# --- one snapshot of the indexes per half second, and its capacity worked out once ---


def test_one_snapshot_of_the_indexes_serves_the_plans_of_half_a_second(
    state: OperatorState, monkeypatch: Any
) -> None:
    """A burst of creations plans several models a second; each plan went over every node and pod of
    the cluster (a third of the operator's CPU while 1,000 models were created, py-spy). One snapshot
    (and the capacity worked out from it) serves them all for ``VIEW_SECONDS``; a change of the
    indexes shows in the first plan after that."""
    import time

    from loadline.state import _index

    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    nodes_index = {"l4-a": [node("l4-a", "NVIDIA-L4", 4)]}
    pods_index: dict[str, list[dict[str, Any]]] = {}
    first = state.views.view(nodes_index, pods_index)
    pods_index["p"] = [pod("l4-a", 3, labels={"loadline.dev/inferencemodel": "other"})]
    assert state.views.view(nodes_index, pods_index) is first  # within the snapshot's time
    assert gpus(state.capacity.free_gpus("mine", "ns", first)) == {"L4": [4]}
    clock[0] += _index.VIEW_SECONDS
    later = state.views.view(nodes_index, pods_index)
    assert later is not first and gpus(state.capacity.free_gpus("mine", "ns", later)) == {"L4": [1]}


def test_a_crashs_remediation_plans_on_the_last_snapshot_for_longer(
    state: OperatorState, monkeypatch: Any
) -> None:
    """A burst of crashes re-plans a model each; a snapshot (which only ever shows less room than there
    is) serves them for REMEDIATION_VIEW_SECONDS, while reconcile still asks for one of half a second."""
    import time

    from loadline.state import _index

    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    nodes_index = {"l4-a": [node("l4-a", "NVIDIA-L4", 4)]}
    pods_index: dict[str, list[dict[str, Any]]] = {}
    first = state.views.view(nodes_index, pods_index)
    clock[0] += _index.VIEW_SECONDS
    age = _index.REMEDIATION_VIEW_SECONDS
    assert state.views.view(nodes_index, pods_index, max_age=age) is first
    clock[0] += age
    later = state.views.view(nodes_index, pods_index, max_age=age)
    assert later is not first
    assert state.views.view(nodes_index, pods_index, max_age=age) is later
    clock[0] += _index.VIEW_SECONDS
    assert state.views.view(nodes_index, pods_index) is not later  # reconcile's


def test_a_remediations_snapshot_and_its_capacity_outlive_reconciles_newer_ones(
    state: OperatorState, monkeypatch: Any
) -> None:
    """Reconcile and the maintenance timer take a new snapshot every half second; the crashes of a burst
    keep planning on theirs (and its capacity is worked out once) until it is REMEDIATION_VIEW_SECONDS
    old, rather than switching to each newer one."""
    import time

    from loadline.state import _index

    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    nodes_index = {"l4-a": [node("l4-a", "NVIDIA-L4", 4)]}
    pods_index: dict[str, list[dict[str, Any]]] = {}
    age = _index.REMEDIATION_VIEW_SECONDS
    remediations = state.views.view(nodes_index, pods_index, max_age=age)
    capacity = state.capacity.capacity(remediations)
    reconciles = [remediations]
    for _ in range(5):
        clock[0] += _index.VIEW_SECONDS
        reconciles.append(state.views.view(nodes_index, pods_index))
        state.capacity.capacity(reconciles[-1])
        assert state.views.view(nodes_index, pods_index, max_age=age) is remediations
        assert state.capacity.capacity(remediations) is capacity  # not worked out again
    assert len({id(v) for v in reconciles}) == 6  # reconcile's were new each time
    clock[0] += age
    assert state.views.view(nodes_index, pods_index, max_age=age) is not remediations


def test_a_snapshot_a_moment_old_never_shows_a_planned_models_gpus_free(
    state: OperatorState, monkeypatch: Any
) -> None:
    """The race a stale snapshot opens: model a is planned and its pod bound after the snapshot was
    taken. Its reservation is live (this process's plans, every Deployment's watch event) and counts
    against the snapshot's own bound pods, so a plan within the snapshot's half second still sees a's
    GPU taken, as does the first plan after it (bound now, the reservation ended); and a deleted
    model's pods, still in the snapshot, keep holding their GPUs until a snapshot without them."""
    import time

    from loadline.state import _index

    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    nodes_index = {"l4-a": [node("l4-a", "NVIDIA-L4", 1)], "l40s": [node("l40s", "NVIDIA-L40S", 1)]}
    pods_index: dict[str, list[dict[str, Any]]] = {}
    a_pod = pod("l4-a", 1, labels={"loadline.dev/inferencemodel": "a"}) | {"metadata": {
        "namespace": "ns", "labels": {"loadline.dev/inferencemodel": "a"}}}  # fmt: skip

    stale = state.views.view(nodes_index, pods_index)
    assert gpus(state.capacity.free_gpus("b", "ns", stale)) == {"L4": [1], "L40S": [1]}
    state.capacity.planned["ns/a"] = Reservation("L4", 1, 1)  # a is planned and applied
    pods_index["a"] = [a_pod]  # its pod is bound: in the index, not in the snapshot
    assert state.views.view(nodes_index, pods_index) is stale
    assert gpus(state.capacity.free_gpus("b", "ns", stale)) == {"L4": [0], "L40S": [1]}
    clock[0] += _index.VIEW_SECONDS
    fresh = state.views.view(nodes_index, pods_index)
    assert fresh is not stale and gpus(state.capacity.free_gpus("b", "ns", fresh)) == {"L4": [0], "L40S": [1]}
    # a is deleted: its reservation goes at once, its pod with the next snapshot without it.
    state.capacity.forget("ns/a")
    del pods_index["a"]
    assert gpus(state.capacity.free_gpus("b", "ns", state.views.view(nodes_index, pods_index))) == {
        "L4": [0],
        "L40S": [1],
    }
    clock[0] += _index.VIEW_SECONDS
    assert gpus(state.capacity.free_gpus("b", "ns", state.views.view(nodes_index, pods_index))) == {
        "L4": [1],
        "L40S": [1],
    }


def test_the_capacity_of_a_snapshot_is_worked_out_once_and_a_models_own_pods_still_left_out(
    state: OperatorState,
    monkeypatch: Any,
) -> None:
    reads: list[str] = []
    original = _book.gpu_node
    monkeypatch.setattr(_book, "gpu_node", lambda n: (reads.append(n["metadata"]["name"]), original(n))[1])
    nodes = [node("l4-a", "NVIDIA-L4", 4), node("l4-b", "NVIDIA-L4", 4)]
    mine = {"loadline.dev/inferencemodel": "mine"}
    other = {"loadline.dev/inferencemodel": "other"}
    snapshot = (nodes, [pod("l4-a", 2, labels=mine), pod("l4-b", 1, labels=other)])
    for name in ("new-1", "new-2", "new-3"):  # models without pods: the snapshot's figures
        assert gpus(state.capacity.free_gpus(name, "", snapshot)) == {"L4": [3, 2]}
    assert reads == ["l4-a", "l4-b"]
    # A re-plan of a model with pods in it gets its own GPUs back, as before the snapshot, and reads
    # no node again (a crash's roll-out at fleet scale read all of them, every time).
    snapshot[1][0]["metadata"]["namespace"] = snapshot[1][1]["metadata"]["namespace"] = "ns"
    state = OperatorState()  # a fresh process: no snapshot read before
    reads.clear()
    assert gpus(state.capacity.free_gpus("mine", "ns", snapshot)) == {"L4": [4, 3]}
    assert gpus(state.capacity.free_gpus("new-4", "ns", snapshot)) == {"L4": [3, 2]}
    assert gpus(state.capacity.free_gpus("other", "ns", snapshot)) == {"L4": [4, 2]}
    assert reads == ["l4-a", "l4-b"]


def test_a_new_snapshot_reads_only_the_nodes_that_changed(state: OperatorState, monkeypatch: Any) -> None:
    """The index gives a node a new entry when it changes: only that one is read again; a node gone is
    gone from the free GPUs."""
    reads: list[str] = []
    original = _book.gpu_node
    monkeypatch.setattr(_book, "gpu_node", lambda n: (reads.append(n["metadata"]["name"]), original(n))[1])
    a, b, c = node("l4-a", "NVIDIA-L4", 4), node("l4-b", "NVIDIA-L4", 4), node("l4-c", "NVIDIA-L4", 1)
    assert gpus(state.capacity.free_gpus("m", "ns", ([a, b, c], []))) == {"L4": [4, 4, 1]}
    assert reads == ["l4-a", "l4-b", "l4-c"]
    reads.clear()
    cordoned = node("l4-b", "NVIDIA-L4", 4, unschedulable=True)
    assert gpus(state.capacity.free_gpus("m", "ns", ([a, cordoned], []))) == {"L4": [4]}
    assert reads == ["l4-b"]
    reads.clear()
    assert gpus(state.capacity.free_gpus("m", "ns", ([a, cordoned, c], []))) == {"L4": [4, 1]}
    assert reads == ["l4-c"]  # l4-c left the snapshot before: read again, not remembered from then


def test_a_models_own_gpus_given_back_match_counting_without_its_pods(state: OperatorState) -> None:
    """The snapshot's rooms with a model's own GPUs given back are exactly the rooms counted from the
    pods without that model's, for every model of random clusters (busy and idle nodes of several
    types, pods of several models, finished pods, unbound pods)."""
    rng = random.Random(7)
    products = ["NVIDIA-L4", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]
    for _ in range(40):
        nodes = [
            node(f"n{i}", rng.choice(products), rng.choice([1, 2, 4, 8]), ready=rng.random() > 0.1)
            for i in range(rng.randint(1, 12))
        ]
        pods = []
        for _ in range(rng.randint(0, 16)):
            model = rng.choice(["a", "b", "c"])
            placed = pod(
                rng.choice([n["metadata"]["name"] for n in nodes] + [""]),
                rng.randint(1, 4),
                phase=rng.choice(["Running", "Running", "Pending", "Succeeded"]),
                labels={"loadline.dev/inferencemodel": model},
            )
            placed["metadata"]["namespace"] = "ns"
            pods.append(placed)
        state = OperatorState()  # a fresh process: no snapshot read before
        for model in ("a", "b", "c", "d"):
            expected = free_rooms_by_type(
                nodes, [p for p in pods if p["metadata"]["labels"]["loadline.dev/inferencemodel"] != model]
            )
            got = state.capacity.free_gpus(model, "ns", (nodes, pods))
            assert {t: sorted(r) for t, r in got.items()} == {t: sorted(r) for t, r in expected.items()}


def placed_one_sort_per_pod(
    free: dict[str, list[NodeRoom]], held: list[Reservation]
) -> dict[str, list[NodeRoom]]:
    """The reference: every node of the type re-sorted after each pod placed (what reserve did before)."""
    out = {name: sorted(rooms, key=lambda r: -r.gpus) for name, rooms in free.items()}
    for r in held:
        nodes = out.get(r.gpu)
        if not nodes or r.per_pod < 1:
            continue
        for _pod in range(r.pods):
            index = next(
                (i for i, n in enumerate(nodes) if n.gpus >= r.per_pod and n.takes(r.memory_gib, r.cpu)), None
            )
            if index is None:
                break
            nodes[index] = nodes[index]._replace(gpus=nodes[index].gpus - r.per_pod)
            nodes.sort(key=lambda room: -room.gpus)
    return out


def test_reserving_by_bisection_places_every_pod_where_resorting_did_and_leaves_the_snapshot_alone() -> None:
    """Random rooms (several shapes, many equal counts: the ties are where order matters) and bursts of
    reservations: the same rooms in the same order as re-sorting every node per pod, and the sorted
    lists passed in (a capacity snapshot's, shared by every plan of its half second) unchanged."""
    rng = random.Random(11)
    shapes = [(16.0, 4.0), (192.0, 48.0), (1000.0, 96.0)]
    for _ in range(200):
        free = {
            gpu: sorted(
                (
                    NodeRoom(rng.choice([0, 1, 2, 4, 8]), *rng.choice(shapes))
                    for _ in range(rng.randint(0, 30))
                ),
                key=lambda r: -r.gpus,
            )
            for gpu in ("L4", "A100-80GB", "H100")
        }
        held = [
            Reservation(rng.choice(["L4", "H100", "T4"]), rng.choice([0, 1, 2, 4]), rng.randint(0, 6),
                        rng.choice([0.0, 20.0, 100.0]), rng.choice([0.0, 8.0]))
            for _ in range(rng.randint(0, 12))
        ]  # fmt: skip
        before = {gpu: list(rooms) for gpu, rooms in free.items()}
        assert reserve_sorted(free, held) == placed_one_sort_per_pod(free, held)
        assert free == before
        assert reserve(free, held) == placed_one_sort_per_pod(free, held)


# --- what fills a model's reservation: its live pods bound on nodes of the planned GPU type ---


def model_pod(node_name: str, model: str, *, terminating: bool = False) -> dict[str, Any]:
    """A one-GPU pod of ``model`` bound to ``node_name``, as the pod index keeps it."""
    meta: dict[str, Any] = {"namespace": "ns", "labels": {"loadline.dev/inferencemodel": model}}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-28T08:00:00Z"
    return pod(node_name, 1) | {"metadata": meta}


def test_a_terminating_pod_keeps_its_gpu_and_its_replacement_still_holds_one(state: OperatorState) -> None:
    """A crash's roll-out (maxSurge 0) deletes model a's pod, then creates its replacement. While the
    old pod terminates it still holds its GPU, and the replacement, not bound yet, needs one: both are
    taken for model b's plan. Counted as filling a's reservation, the terminating pod let b's plan take
    the replacement's GPU, and one of the two stayed Pending (issue 41's over-commit)."""
    nodes = [node("l4-a", "NVIDIA-L4", 1), node("l4-b", "NVIDIA-L4", 1), node("l40s", "NVIDIA-L40S", 1)]
    state.capacity.planned["ns/a"] = Reservation("L4", 1, 1)
    terminating = [model_pod("l4-a", "a", terminating=True)]
    assert gpus(state.capacity.free_gpus("b", "ns", (nodes, terminating))) == {"L4": [0, 0], "L40S": [1]}
    # Once the replacement is bound, the reservation is filled and nothing is counted twice.
    replaced = [model_pod("l4-b", "a")]
    assert gpus(state.capacity.free_gpus("b", "ns", (nodes, replaced))) == {"L4": [1, 0], "L40S": [1]}


def test_pods_on_the_old_gpu_type_fill_nothing_of_a_model_replanned_onto_another(
    state: OperatorState,
) -> None:
    """Model a ran on an L4 and was re-planned onto an L40S (a remediation's fallback): its L4 pod is
    still bound until the roll-out replaces it, and holds the L4; the L40S its new pod will take is
    not free for model b meanwhile."""
    nodes = [node("l4-a", "NVIDIA-L4", 1), node("l40s", "NVIDIA-L40S", 1)]
    state.capacity.planned["ns/a"] = Reservation("L40S", 1, 1)
    old = [model_pod("l4-a", "a")]
    assert gpus(state.capacity.free_gpus("b", "ns", (nodes, old))) == {"L4": [0], "L40S": [0]}


def test_the_pod_index_keeps_whether_a_pod_is_terminating() -> None:
    """The capacity view reads the index's trimmed pods: the deletion mark must survive the trim."""
    from loadline.state import _index

    body = model_pod("l4-a", "a", terminating=True)
    body["spec"]["containers"] = [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    kept = _index.pod_entry(body)["l4-a"]
    assert kept["metadata"]["deletionTimestamp"] == "2026-11-28T08:00:00Z"
    assert "deletionTimestamp" not in _index.pod_entry(model_pod("l4-a", "a"))["l4-a"]["metadata"]


def test_two_plans_made_before_either_is_applied_never_count_the_same_free_gpu(state: OperatorState) -> None:
    """Reconciles run in several threads: model a's plan takes the last free L4, and model b is planned
    while a's children are still being applied. b must see the L4 taken. Before, a plan's GPUs were
    recorded only after its apply, so b was planned onto the same L4 and stayed Deploying, "cannot be
    scheduled ... Insufficient nvidia.com/gpu" (issue 41: one model over a 240-GPU fleet's capacity)."""
    from loadline.settings import OperatorSettings

    settings = OperatorSettings(hf_fetch=False, capacity_aware=True)
    view = ([node("l4-a", "NVIDIA-L4", 1), node("l40s", "NVIDIA-L40S", 1)], [])
    gpu_types = {"gpu": {"types": ["L4", "L40S"]}, "maxModelLen": 4096, "concurrency": 1}
    a = inference_model(**gpu_types) | {"metadata": {"name": "a", "namespace": "ns", "uid": "ua"}}
    b = inference_model(**gpu_types) | {"metadata": {"name": "b", "namespace": "ns", "uid": "ub"}}
    _, plan_a, _ = _plan.plan_and_render(state, a, settings, view)
    _, plan_b, _ = _plan.plan_and_render(state, b, settings, view)  # a not applied yet
    assert (plan_a.chosen.gpu.name, plan_b.chosen.gpu.name) == ("L4", "L40S")
    # A plan that is never applied lets its GPUs go after the hold, not for good.
    held, _until = state.capacity.held["ns/a"]
    state.capacity.held["ns/a"] = (held, 0.0)
    state.capacity.held.pop("ns/b")
    _, again, _ = _plan.plan_and_render(state, b, settings, view)
    assert again.chosen.gpu.name == "L4"


def test_a_gpu_type_the_scheduler_refused_is_full_for_its_models_replan_until_it_binds_the_pods(
    state: OperatorState,
) -> None:
    """The planner saw a free L4 but the scheduler cannot place a's pod there (a pod the planner does
    not count holds the node's memory, say). a's re-plan takes the scheduler's word: the L4 is full, so
    a falls back to the L40S, or, allowed only L4, is Pending naming the scheduler's reason. Once the
    scheduler binds a's L4 pod (room was made), the refusal lapses and L4 is planned as usual."""
    from loadline.errors import NoCapacityError
    from loadline.settings import OperatorSettings

    settings = OperatorSettings(hf_fetch=False, capacity_aware=True)
    nodes = [node("l4-a", "NVIDIA-L4", 1), node("l40s", "NVIDIA-L40S", 1)]
    spec = {"gpu": {"types": ["L4", "L40S"]}, "maxModelLen": 8192, "concurrency": 1}
    a = inference_model(**spec) | {"metadata": {"name": "a", "namespace": "ns", "uid": "ua"}}
    _plan.note_demand(state, rendered_deployment("a", "L4", 1))  # a's Deployment asks for one L4 pod
    assert _plan.plan_and_render(state, a, settings, (nodes, []))[1].chosen.gpu.name == "L4"

    state.capacity.note_unschedulable("ns/a", "L4", "0/2 nodes are available: 1 Insufficient memory.")
    assert _plan.plan_and_render(state, a, settings, (nodes, []))[1].chosen.gpu.name == "L40S"
    only_l4 = inference_model(**(spec | {"gpu": {"types": ["L4"]}}))
    only_l4["metadata"] = a["metadata"]
    try:
        _plan.plan_and_render(state, only_l4, settings, (nodes, []))
        raise AssertionError("planned onto the L4 the scheduler refused")
    except NoCapacityError:
        pass

    bound = [model_pod("l4-a", "a")]  # the scheduler placed it after all
    assert _plan.plan_and_render(state, a, settings, (nodes, bound))[1].chosen.gpu.name == "L4"
    assert "ns/a" not in state.capacity.refused
