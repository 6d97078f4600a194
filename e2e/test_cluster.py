"""The local control plane itself: real components, the simulated GPU fleet, scheduling and crashes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from crash import crash_container
from fleet import load_fleet
from kube import E2E_DIR, Kubectl, lib_var, wait_for

FLEET = load_fleet()


def gpu_pod(name: str, gpus: int, product: str | None = None, **extra_spec: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.11.0",
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "resources": {
                    "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": str(gpus)},
                    "limits": {"memory": "4Gi", "nvidia.com/gpu": str(gpus)},
                },
            }
        ],
        **extra_spec,
    }
    if product:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_running(kubectl: Kubectl, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod: dict[str, Any] = kubectl.json("get", "pod", name, "-n", namespace)
        return pod if pod.get("status", {}).get("phase") == "Running" else None

    return wait_for(running, timeout=timeout, what=f"pod {namespace}/{name} to be Running")


def node_labels(kubectl: Kubectl, node: str) -> dict[str, str]:
    labels: dict[str, str] = kubectl.json("get", "node", node)["metadata"]["labels"]
    return labels


def test_control_plane_is_the_pinned_real_kubernetes(kubectl: Kubectl) -> None:
    version = json.loads(kubectl("get", "--raw", "/version"))
    assert version["gitVersion"] == lib_var("K8S_VERSION")
    # The real scheduler and controller-manager run (not KWOK stand-ins): both hold their leader lease.
    leases = kubectl.json("get", "lease", "-n", "kube-system")["items"]
    holders = {lease["metadata"]["name"]: lease["spec"].get("holderIdentity", "") for lease in leases}
    assert holders.get("kube-scheduler"), holders
    assert holders.get("kube-controller-manager"), holders


def test_gpu_node_pools_are_listed_with_their_products(kubectl: Kubectl) -> None:
    table = kubectl("get", "nodes", "-L", "nvidia.com/gpu.product", "-L", "node.kubernetes.io/instance-type")
    header, *rows = table.splitlines()
    assert header.split()[-2:] == ["GPU.PRODUCT", "INSTANCE-TYPE"]
    seen = Counter((row.split()[-2], row.split()[-1]) for row in rows)
    expected: Counter[tuple[str, str]] = Counter()
    for pool in FLEET:
        expected[(pool.product.name, pool.instance_type)] += pool.nodes
    assert seen == expected
    assert all(row.split()[1] == "Ready" for row in rows), table


def test_nodes_carry_gpu_discovery_labels_and_allocatable_gpus(kubectl: Kubectl) -> None:
    nodes = kubectl.json("get", "nodes", "-l", "loadline.dev/e2e-pool")["items"]
    by_pool = {pool.name: pool for pool in FLEET}
    assert len(nodes) == sum(pool.nodes for pool in FLEET)
    for node in nodes:
        labels = node["metadata"]["labels"]
        pool = by_pool[labels["loadline.dev/e2e-pool"]]
        assert labels["nvidia.com/gpu.product"] == pool.product.name
        assert labels["nvidia.com/gpu.memory"] == str(pool.product.memory_mib)
        assert labels["nvidia.com/gpu.count"] == str(pool.gpus_per_node)
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(pool.gpus_per_node)
        assert node["status"]["capacity"]["cpu"] == str(pool.cpu)


def test_gpu_pod_is_scheduled_onto_an_l4_node_and_runs(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(gpu_pod("one-l4", 1, "NVIDIA-L4"), namespace)
    pod = wait_running(kubectl, namespace, "one-l4")
    labels = node_labels(kubectl, pod["spec"]["nodeName"])
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert pod["status"]["containerStatuses"][0]["state"]["running"]
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["PodScheduled"] == "True"
    assert conditions["Ready"] == "True"


def test_scheduler_packs_gpus_by_node_capacity(kubectl: Kubectl, namespace: str) -> None:
    # Two L4s fit only on a 4-GPU g6.12xlarge, never on a 1-GPU g6.xlarge.
    kubectl.apply(gpu_pod("two-l4", 2, "NVIDIA-L4"), namespace)
    pod = wait_running(kubectl, namespace, "two-l4")
    assert node_labels(kubectl, pod["spec"]["nodeName"])["nvidia.com/gpu.count"] == "4"

    # No L4 node has 8 GPUs: the real scheduler reports it and the pod stays Pending.
    kubectl.apply(gpu_pod("eight-l4", 8, "NVIDIA-L4"), namespace)

    def unschedulable() -> str | None:
        pod = kubectl.json("get", "pod", "eight-l4", "-n", namespace)
        for cond in pod.get("status", {}).get("conditions", []):
            if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
                return str(cond.get("message", ""))
        return None

    message = wait_for(unschedulable, timeout=30, what="eight-l4 to be reported Unschedulable")
    assert "Insufficient nvidia.com/gpu" in message
    assert kubectl.json("get", "pod", "eight-l4", "-n", namespace)["status"]["phase"] == "Pending"


def test_deployment_pods_run_and_are_garbage_collected(kubectl: Kubectl, namespace: str) -> None:
    """The real controller-manager: Deployment -> ReplicaSet -> Pods, and ownerReference GC."""
    pod_template = gpu_pod("unused", 1, "NVIDIA-H100-80GB-HBM3")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serve"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "serve"}},
            "template": {"metadata": {"labels": {"app": "serve"}}, "spec": pod_template["spec"]},
        },
    }
    kubectl.apply(deployment, namespace)

    def available() -> bool:
        status = kubectl.json("get", "deployment", "serve", "-n", namespace).get("status", {})
        return bool(status.get("availableReplicas") == 2)

    wait_for(available, timeout=60, what="deployment serve to have 2 available replicas")
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", "app=serve")["items"]
    assert {p["metadata"]["ownerReferences"][0]["kind"] for p in pods} == {"ReplicaSet"}

    kubectl("delete", "deployment", "serve", "-n", namespace, "--cascade=background", "--wait=false")
    wait_for(
        lambda: not kubectl.json("get", "pods,replicasets", "-n", namespace, "-l", "app=serve")["items"],
        timeout=60,
        what="the garbage collector to delete the ReplicaSet and its pods",
    )


def _container_status(kubectl: Kubectl, namespace: str, pod: str) -> dict[str, Any]:
    status: dict[str, Any] = kubectl.json("get", "pod", pod, "-n", namespace)["status"]["containerStatuses"][
        0
    ]
    return status


def test_crash_helper_cuda_oom_then_host_oom(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(gpu_pod("engine", 1, "NVIDIA-H100-80GB-HBM3"), namespace)
    wait_running(kubectl, namespace, "engine")

    crash_container(kubectl, "engine", namespace, "cuda-oom")
    time.sleep(3)  # give KWOK the chance to (wrongly) rewrite the status
    status = _container_status(kubectl, namespace, "engine")
    terminated = status["lastState"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (1, "Error")
    assert (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB." in terminated["message"]
    )
    assert status["restartCount"] == 1
    assert "running" in status["state"]

    crash_container(kubectl, "engine", namespace, "oomkilled", crashloop=True)
    status = _container_status(kubectl, namespace, "engine")
    terminated = status["lastState"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "OOMKilled")
    assert status["restartCount"] == 2
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["ready"] is False

    events = kubectl.json("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=engine")
    assert [e["reason"] for e in events["items"]].count("BackOff") == 2
    node = kubectl.json("get", "pod", "engine", "-n", namespace)["spec"]["nodeName"]
    node_events = kubectl.json(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={node},reason=OOMKilling"
    )
    assert node_events["items"], f"no OOMKilling event for node {node}"


def test_crash_cli(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(gpu_pod("cli", 1, "NVIDIA-L40S"), namespace)
    wait_running(kubectl, namespace, "cli")
    proc = subprocess.run(
        [sys.executable, str(E2E_DIR / "crash.py"), "cli", "--namespace", namespace, "--kind", "oomkilled",
         "--kubeconfig", str(kubectl.kubeconfig)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "restartCount=1 lastState.terminated.reason=OOMKilled exitCode=137" in proc.stdout
    assert _container_status(kubectl, namespace, "cli")["lastState"]["terminated"]["exitCode"] == 137


def test_crash_helper_refuses_a_pod_that_is_not_running(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(gpu_pod("waiting", 8, "NVIDIA-L4"), namespace)  # unschedulable: stays Pending
    with pytest.raises(ValueError, match="is Pending, not Running"):
        crash_container(kubectl, "waiting", namespace, "cuda-oom")


def _listening_addresses(pid: int) -> set[str]:
    """host:port of every TCP socket the process listens on (from /proc, no ss needed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            host_hex, port_hex = local.split(":")
            raw = bytes.fromhex(host_hex)
            # /proc prints the address as native-endian 32-bit words.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(f"{socket.inet_ntop(family, raw)}:{int(port_hex, 16)}")
    return found


def test_every_component_listens_on_loopback_only(kubectl: Kubectl) -> None:
    pid_dir = Path(lib_var("KWOK_WORKDIR")) / "clusters" / lib_var("CLUSTER_NAME") / "pids"
    pid_files = sorted(pid_dir.glob("*.pid"))
    assert {p.stem for p in pid_files} == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok-controller",
    }
    for pid_file in pid_files:
        addresses = _listening_addresses(int(pid_file.read_text()))
        assert addresses, f"{pid_file.stem} listens on nothing"
        assert all(a.startswith(("127.0.0.1:", "::1:")) for a in addresses), (pid_file.stem, addresses)


def test_the_service_range_holds_a_fleet(kubectl: Kubectl) -> None:
    """Every InferenceModel has a Service: the API server's default /24 would refuse the 255th. The
    cluster's ServiceCIDR (what allocates ClusterIPs since Kubernetes 1.33) is the /16 lib.sh sets,
    and a Service created now gets an address from it."""
    cidr = lib_var("SERVICE_CIDR")
    cidrs = kubectl.json("get", "servicecidr", "kubernetes")["spec"]["cidrs"]
    assert cidrs == [cidr]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "range-probe", "namespace": "default"},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "none"}},
    }
    kubectl.apply(service, "default")
    try:
        address = kubectl.json("get", "service", "range-probe", "-n", "default")["spec"]["clusterIP"]
        assert address.startswith(cidr.split(".0.0/")[0] + ".")
    finally:
        kubectl.run("delete", "service", "range-probe", "-n", "default", check=False)


def test_the_controllers_clients_are_sized_for_a_fleet(kubectl: Kubectl) -> None:
    """The controller-manager runs with the request rate cluster-up.sh gives it (a misspelt component
    in kwokctl's componentsPatches is dropped without a word): at the default 20 a second, 200 models'
    roll-outs waited a minute for the Deployment controller (benchmarks/oom_latency.py)."""
    pid_dir = Path(lib_var("KWOK_WORKDIR")) / "clusters" / lib_var("CLUSTER_NAME") / "pids"
    pid = int((pid_dir / "kube-controller-manager.pid").read_text())
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert {"--kube-api-qps=200", "--kube-api-burst=200"} <= set(args), args
