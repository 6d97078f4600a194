"""The e2e helpers' own logic (no cluster needed): fleet rendering and the crash status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crash import crash_events, crashed_status, termination_for
from fleet import FleetError, load_fleet, render_fleet, reserved_cpu_millicores


def running_pod(restarts: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": "engine", "namespace": "ns", "uid": "u-1"},
        "spec": {"nodeName": "gpu-h100-8x-0", "containers": [{"name": "vllm"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
            ],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "ready": True,
                    "restartCount": restarts,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }
            ],
        },
    }


def test_cuda_oom_status_matches_a_restarted_container() -> None:
    status = crashed_status(running_pod(2), "vllm", termination_for("cuda-oom"), now="2026-01-01T00:05:00Z")
    cs = status["containerStatuses"][0]
    assert cs["restartCount"] == 3
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    assert cs["lastState"]["terminated"]["reason"] == "Error"
    assert cs["lastState"]["terminated"]["startedAt"] == "2026-01-01T00:00:00Z"
    assert cs["lastState"]["terminated"]["message"].count("torch.OutOfMemoryError: CUDA out of memory.") == 1
    assert cs["state"] == {"running": {"startedAt": "2026-01-01T00:05:00Z"}}


def test_oomkilled_crashloop_marks_the_pod_not_ready() -> None:
    status = crashed_status(running_pod(), "vllm", termination_for("oomkilled"), crashloop=True)
    cs = status["containerStatuses"][0]
    assert (cs["lastState"]["terminated"]["exitCode"], cs["lastState"]["terminated"]["reason"]) == (
        137,
        "OOMKilled",
    )
    assert "message" not in cs["lastState"]["terminated"]
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "False",
        "ContainersReady": "False",
    }


def test_unknown_container_is_an_error() -> None:
    with pytest.raises(ValueError, match="no status for container 'sidecar'"):
        crashed_status(running_pod(), "sidecar", termination_for("cuda-oom"))


def test_only_host_oom_records_a_node_event() -> None:
    assert [e["reason"] for e in crash_events(running_pod(), "vllm", "cuda-oom")] == ["BackOff"]
    events = crash_events(running_pod(), "vllm", "oomkilled")
    assert [e["reason"] for e in events] == ["BackOff", "OOMKilling"]
    assert events[1]["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-h100-8x-0",
        "uid": "gpu-h100-8x-0",
    }


def test_default_fleet_has_every_product_and_gpu_allocatable() -> None:
    nodes = render_fleet(load_fleet())["items"]
    products = {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes}
    assert products == {"NVIDIA-L4", "NVIDIA-L40S", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"}
    for node in nodes:
        labels, status = node["metadata"]["labels"], node["status"]
        assert status["allocatable"]["nvidia.com/gpu"] == labels["nvidia.com/gpu.count"]
        assert int(status["allocatable"]["cpu"].removesuffix("m")) < int(status["capacity"]["cpu"]) * 1000


def test_cpu_reservation_follows_the_managed_node_formula() -> None:
    assert reserved_cpu_millicores(4) == 80  # 60 + 10 + 2 * 5
    assert reserved_cpu_millicores(48) == 190  # 80 + 44 * 2.5


def test_scale_keeps_at_least_one_node_per_pool() -> None:
    pools = load_fleet(scale=0.1)
    assert all(p.nodes == 1 for p in pools)


def test_unknown_product_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text(
        "products: {}\npools:\n- {name: x, product: NVIDIA-B200, instanceType: p6, gpusPerNode: 8,"
        " nodes: 1, cpu: 8, memory: 8Gi}\n"
    )
    with pytest.raises(FleetError, match="unknown product 'NVIDIA-B200'"):
        load_fleet(bad)
