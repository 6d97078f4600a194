"""LeaderWorkerSet (sigs.k8s.io/lws) on the local control plane: multi-node replicas really run.

e2e/lws.sh runs the real LWS manager against the cluster; it creates the
leader and worker StatefulSets, the controller-manager their pods, the
scheduler binds them to simulated H100 nodes and KWOK marks them Running.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube import E2E_DIR, REPO, STATE_DIR, Kubectl, lib_var, wait_for

H100 = "NVIDIA-H100-80GB-HBM3"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_UP_TIMEOUT = float(os.environ.get("LOADLINE_CLUSTER_UP_TIMEOUT", "3600"))
READY_TIMEOUT = 120


@pytest.fixture(scope="module")
def lws(kubectl: Kubectl) -> str:
    """The LWS controller is running (e2e/lws.sh up, a no-op when it already runs); returns its version."""
    if subprocess.run(
        ["bash", str(E2E_DIR / "lws.sh"), "status"], capture_output=True, check=False
    ).returncode:
        log = STATE_DIR / "lws-up.log"
        with log.open("w") as out:
            proc = subprocess.run(
                ["bash", str(E2E_DIR / "lws.sh"), "up"],
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=LWS_UP_TIMEOUT,
                check=False,
            )
        if proc.returncode:
            tail = "\n".join(log.read_text().splitlines()[-25:])
            pytest.fail(
                f"e2e/lws.sh up exited {proc.returncode}; last lines of {log}:\n{tail}", pytrace=False
            )
    return lib_var("LWS_VERSION")


def gpu_template(gpus: int, product: str) -> dict[str, Any]:
    return {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": [product]}
                                ]
                            }
                        ]
                    }
                }
            },
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": str(gpus)},
                        "limits": {"memory": "4Gi", "nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        }
    }


def wait_ready(kubectl: Kubectl, namespace: str, name: str, replicas: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        obj: dict[str, Any] = kubectl.json("get", "leaderworkerset", name, "-n", namespace)
        return obj if obj.get("status", {}).get("readyReplicas") == replicas else None

    try:
        return wait_for(ready, timeout=READY_TIMEOUT, what=f"LeaderWorkerSet {namespace}/{name} to be ready")
    except TimeoutError as exc:
        pods = kubectl("get", "pods", "-n", namespace, "-o", "wide")
        events = kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp")
        raise AssertionError(f"{exc}\npods:\n{pods}\nevents:\n{events}") from None


def group_pods(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = kubectl.json(
        "get", "pods", "-n", namespace, "-l", f"{LWS_NAME_LABEL}={name}"
    )["items"]
    return sorted(pods, key=lambda p: p["metadata"]["name"])


def assert_on_distinct_h100_nodes(kubectl: Kubectl, pods: list[dict[str, Any]]) -> None:
    assert [p["status"]["phase"] for p in pods] == ["Running"] * len(pods), [p["status"] for p in pods]
    nodes = [p["spec"]["nodeName"] for p in pods]
    assert len(set(nodes)) == len(nodes), nodes
    for node in nodes:
        labels = kubectl.json("get", "node", node)["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == H100, (node, labels)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}


def test_leaderworkerset_group_runs_on_two_h100_nodes(kubectl: Kubectl, namespace: str, lws: str) -> None:
    name = "smoke"
    kubectl.apply(
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": name},
            "spec": {
                "replicas": 1,
                "leaderWorkerTemplate": {"size": 2, "workerTemplate": gpu_template(8, H100)},
            },
        },
        namespace,
    )
    obj = wait_ready(kubectl, namespace, name, 1)
    # The LWS webhook defaulted the object (as it does in a real cluster).
    assert obj["spec"]["startupPolicy"] == "LeaderCreated"
    assert obj["spec"]["rolloutStrategy"]["type"] == "RollingUpdate"

    pods = group_pods(kubectl, namespace, name)
    assert [p["metadata"]["name"] for p in pods] == [f"{name}-0", f"{name}-0-1"]
    assert_on_distinct_h100_nodes(kubectl, pods)
    # A leader StatefulSet and one worker StatefulSet per group, both owned by the LWS chain.
    sets = kubectl.json("get", "statefulsets", "-n", namespace)["items"]
    assert sorted(s["metadata"]["name"] for s in sets) == [name, f"{name}-0"]
    # The pod webhook labelled the pods and injected the group's variables.
    leader, worker = pods
    assert leader["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert worker["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] == "1"
    assert worker["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] == "0"
    for pod in pods:
        env = env_of(pod)
        assert env["LWS_GROUP_SIZE"] == "2", env
        assert env["LWS_LEADER_ADDRESS"] == f"{name}-0.{name}.{namespace}", env
    assert env_of(worker)["LWS_WORKER_INDEX"] == "1"


def rendered_leaderworkerset(example: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "loadline.cli", "render", str(example)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    (obj,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    assert isinstance(obj, dict)
    return obj


def test_rendered_405b_multinode_example_becomes_ready(kubectl: Kubectl, namespace: str, lws: str) -> None:
    obj = rendered_leaderworkerset(REPO / "examples" / "llama-405b-multinode.yaml")
    obj["metadata"]["namespace"] = namespace
    name = obj["metadata"]["name"]
    size = obj["spec"]["leaderWorkerTemplate"]["size"]
    assert size == 2
    kubectl.apply(obj, namespace)

    wait_ready(kubectl, namespace, name, obj["spec"]["replicas"])
    pods = group_pods(kubectl, namespace, name)
    assert len(pods) == size
    assert_on_distinct_h100_nodes(kubectl, pods)
    roles = sorted(p["metadata"]["labels"]["loadline.dev/role"] for p in pods)
    assert roles == ["leader", "worker"]
    for pod in pods:
        requests = pod["spec"]["containers"][0]["resources"]["requests"]
        assert requests["nvidia.com/gpu"] == "8"
