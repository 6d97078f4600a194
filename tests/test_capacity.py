"""Free GPUs per type from Node and Pod objects, as the operator's capacity awareness reads them."""

from __future__ import annotations

from typing import Any

from loadline.api import parse_inference_model
from loadline.handlers import _reconcile
from loadline.render import render_manifests
from loadline.sizing import free_gpus_by_type, plan_inference_model, reserve, workload_demand
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
    assert reserve({"L4": [1, 4, 1, 4]}, [("L4", 1, 3)]) == {"L4": [3, 2, 1, 1]}
    # A pod no node can hold takes nothing; other types are untouched.
    assert reserve({"L4": [1, 1], "A100-80GB": [8]}, [("L4", 2, 1)]) == {"L4": [1, 1], "A100-80GB": [8]}


def test_a_burst_of_models_overflows_to_the_next_type_instead_of_piling_onto_the_cheapest() -> None:
    """Eight models planned on L4 (one GPU each), none bound yet: the ninth sees no free L4 and falls
    back, where without the reservations it would see all 8 L4 free and be Pending for good."""
    nodes = [node("l4-a", "NVIDIA-L4", 4), node("l4-b", "NVIDIA-L4", 4), node("l40s", "NVIDIA-L40S", 4)]
    for i in range(8):
        _reconcile._PLANNED[f"ns/m{i}"] = ("L4", 1, 1)
    free = _reconcile._free_gpus("m8", "ns", (nodes, []))
    assert free == {"L4": [0, 0], "L40S": [4]}
    # Once the scheduler binds a model's pod, the index counts it and its reservation ends.
    bound = [pod("l4-a", 1, labels={"loadline.dev/inferencemodel": "m0"}) | {"metadata": {
        "namespace": "ns", "labels": {"loadline.dev/inferencemodel": "m0"}}}]  # fmt: skip
    assert _reconcile._free_gpus("m8", "ns", (nodes, bound)) == {"L4": [0, 0], "L40S": [4]}
    _reconcile.forget_planned("ns", "m1")  # a deleted model frees its reservation
    assert _reconcile._free_gpus("m8", "ns", (nodes, bound)) == {"L4": [1, 0], "L40S": [4]}
    # A model's own reservation is not held against its own re-plan.
    assert _reconcile._free_gpus("m2", "ns", (nodes, bound)) == {"L4": [1, 1], "L40S": [4]}


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
    assert workload_demand(rendered_deployment("chat", "L4", 3)) == ("L4", 1, 3)
    assert workload_demand(rendered_deployment("chat", "L40S", 1)) == ("L40S", 1, 1)
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


def test_models_planned_by_another_replica_hold_their_gpus_from_their_deployments() -> None:
    """Two replicas plan models of their own shards at once: each replica's plans are in its own memory,
    but the Deployments are watched by both. Before, a model of the other shard held no GPU until its
    pods were bound, so both replicas could plan onto the last free L4 (e2e test_sharding saw it)."""
    nodes = [node("l4-a", "NVIDIA-L4", 2), node("l40s", "NVIDIA-L40S", 4)]
    for other in ("m0", "m1"):  # the other replica's models: only their Deployments are seen here
        _reconcile.note_demand(rendered_deployment(other, "L4", 1))
    assert _reconcile._free_gpus("mine", "ns", (nodes, [])) == {"L4": [0], "L40S": [4]}
    # A bound pod ends its model's reservation (the index counts the pod instead).
    bound = [
        pod("l4-a", 1) | {"metadata": {"namespace": "ns", "labels": {"loadline.dev/inferencemodel": "m0"}}}
    ]
    assert _reconcile._free_gpus("mine", "ns", (nodes, bound)) == {"L4": [0], "L40S": [4]}
    # The Deployment's watch event wins over a stale note of this replica's (its shard moved on).
    _reconcile._PLANNED["ns/m1"] = ("L40S", 1, 4)
    assert _reconcile._free_gpus("mine", "ns", (nodes, bound)) == {"L4": [0], "L40S": [4]}
    _reconcile.note_demand(rendered_deployment("m1", "L4", 1), deleted=True)
    assert _reconcile._free_gpus("mine", "ns", (nodes, bound)) == {"L4": [1], "L40S": [0]}
    _reconcile.forget_planned("ns", "m1")  # the model's DELETED (on its own shard's replica)
    assert _reconcile._free_gpus("mine", "ns", (nodes, bound)) == {"L4": [1], "L40S": [4]}
