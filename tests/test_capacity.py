"""Free GPUs per type from Node and Pod objects, as the operator's capacity awareness reads them."""

from __future__ import annotations

from typing import Any

from loadline.sizing import free_gpus_by_type


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
