"""A burst of models past the free GPUs, on the real API server and scheduler: models applied all at once,
more than the cluster's free L4s can take, each allowed L4 only. Every one of them ends Ready or Pending
with the fix ("no free GPUs"), none is left Deploying with a pod that waits for a GPU it cannot get (two
plans never count the same free GPU), and no L4 that a Pending model could use is left idle (the
reservations of models planned but not yet scheduled do not keep GPUs from the next)."""

from __future__ import annotations

import time
from typing import Any

from chart import ChartOperator
from kube import REPO, Kubectl, wait_for
from operator_helpers import example

L4 = "NVIDIA-L4"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
#: Models the burst asks for beyond the free L4s (each takes one whole L4 instance's GPU).
BEYOND = 2
#: How long the settled phases are watched for a change (a model that was Ready or Pending by luck of
#: timing and then moves, a readiness timer's late re-plan).
HOLD_SECONDS = 20


def _gpus(obj: dict[str, Any]) -> int:
    total = 0
    for container in obj["spec"].get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get("nvidia.com/gpu") or (
            resources.get("limits") or {}
        ).get("nvidia.com/gpu")
        total += int(value or 0)
    return total


def _l4_free_by_node(kubectl: Kubectl) -> dict[str, int] | None:
    """Free L4 GPUs per L4 node, None while a pod on one is terminating (its GPU not yet given back)."""
    nodes = kubectl.json("get", "nodes", "-l", f"nvidia.com/gpu.product={L4}")["items"]
    free = {n["metadata"]["name"]: int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes}
    for pod in kubectl.json("get", "pods", "-A")["items"]:
        node = pod["spec"].get("nodeName")
        if node not in free or pod["status"].get("phase") in {"Succeeded", "Failed"}:
            continue
        if pod["metadata"].get("deletionTimestamp"):
            return None
        free[node] -= _gpus(pod)
    return free


def test_a_burst_past_the_free_gpus_leaves_no_model_deploying_on_a_gpu_it_cannot_get(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    before = wait_for(lambda: _l4_free_by_node(kubectl), timeout=120, what="no pod terminating on an L4 node")
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["spec"]["gpu"] = {"types": ["L4"]}
    # The example's pod needs more host memory than a one-L4 instance has: only the bigger L4 nodes
    # take it (the planner's node shapes say so, and so does the scheduler).
    count = sum(before.values()) + BEYOND
    # One request list: the models reach the operator within milliseconds of each other, so their
    # plans overlap (their pods not bound yet when the next model is planned).
    burst = [{**doc, "metadata": {**doc["metadata"], "name": f"burst-{i}"}} for i in range(count)]
    kubectl.apply({"apiVersion": "v1", "kind": "List", "items": burst}, namespace)

    def settled() -> dict[str, dict[str, Any]] | None:
        """The models once each is Ready or Pending and no L4 a Pending one could use is idle (a model
        refused while another's reservation held a GPU it did not take in the end is planned again
        on its retry)."""
        items = kubectl.json("get", "inferencemodels", "-n", namespace)["items"]
        phases = {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in items}
        if len(phases) < count or any(p not in {"Ready", "Pending"} for p in phases.values()):
            return None
        return {i["metadata"]["name"]: i for i in items} if not _idle(kubectl, namespace) else None

    wait_for(settled, timeout=300, what=f"all {count} models Ready or Pending, no usable L4 idle")
    time.sleep(HOLD_SECONDS)
    models = wait_for(settled, timeout=5, what="the same, still")
    ready = sorted(n for n, m in models.items() if m["status"]["phase"] == "Ready")
    pending = sorted(n for n, m in models.items() if m["status"]["phase"] == "Pending")
    print(f"\n{count} models on {sum(before.values())} free L4s: {len(ready)} Ready, {len(pending)} Pending")
    assert ready and len(pending) >= BEYOND, (ready, pending)
    for name in pending:
        message = models[name]["status"]["message"]
        # Refused by the plan, not by the scheduler after a plan that counted a GPU twice.
        assert "no free GPUs" in message and "L4" in message and "cannot place" not in message, message
        planned = next(c for c in models[name]["status"]["conditions"] if c["type"] == "Planned")
        assert (planned["status"], planned["reason"]) == ("False", "NoCapacity"), planned
    pods = kubectl.json("get", "pods", "-n", namespace)["items"]
    # One bound pod per Ready model, none for a Pending one (nothing half-applied).
    assert all(p["spec"].get("nodeName") for p in pods), "a pod waits for a GPU"
    owners = sorted(p["metadata"]["labels"]["loadline.dev/inferencemodel"] for p in pods)
    assert owners == ready, owners
    # No pod ever waited for a GPU it could not get: the scheduler refused none of them.
    events = kubectl.json("get", "events", "-n", namespace)["items"]
    refused = [
        e["involvedObject"]["name"] for e in events if e["reason"] in {"FailedScheduling", "Unschedulable"}
    ]
    assert not refused, f"refused by the scheduler: {refused}"


def _idle(kubectl: Kubectl, namespace: str) -> dict[str, int]:
    """Free L4 GPUs on the nodes of the instance types the namespace's pods run on: what a Pending model
    of the same plan could take."""
    free = _l4_free_by_node(kubectl) or {}
    nodes = {
        n["metadata"]["name"]: n
        for n in kubectl.json("get", "nodes", "-l", f"nvidia.com/gpu.product={L4}")["items"]
    }
    pods = kubectl.json("get", "pods", "-n", namespace)["items"]
    shapes = {
        nodes[p["spec"]["nodeName"]]["metadata"]["labels"][INSTANCE_TYPE]
        for p in pods
        if p["spec"].get("nodeName") in nodes
    }
    return {
        n: f for n, f in free.items() if f > 0 and nodes[n]["metadata"]["labels"][INSTANCE_TYPE] in shapes
    }
