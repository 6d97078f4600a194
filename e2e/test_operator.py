"""The operator (`loadline run`) against the real control plane: apply → planned, deployed, Ready.

The operator runs as the Helm chart installs it for the whole session (the `operator` fixture in
conftest: two replicas under the chart's ServiceAccount, one holding the Lease); each test works in its
own namespace.
"""

from __future__ import annotations

import copy
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import LLAMA_8B
from tests.hubserver import TOKEN, HubServer

from chart import ChartOperator
from kube import REPO, Kubectl, KubectlError, wait_for
from loadline.sizing._shapes import parse_quantity
from operator_helpers import (
    EXAMPLES,
    api_reads,
    example,
    model,
    node_products,
    pods_of,
    wait_phase,
)

STUCK_SECONDS = 150.0
"""How long the stuck model of the scheduler test is watched for the operator's reads."""
STUCK_READS_PER_MINUTE = 2
"""The operator's reads a stuck model may cost a minute (its pods' list and its workload's get)."""


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_reaches_ready_on_the_planned_gpu(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, path: Path
) -> None:
    doc = example(path, namespace)
    name = doc["metadata"]["name"]
    kubectl.apply(doc, namespace)
    obj = wait_phase(kubectl, namespace, name, "Ready")
    plan = obj["status"]["plan"]
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions == {"Planned": "True", "Deployed": "True", "Ready": "True", "PolicyCompliant": "True"}
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    pods = pods_of(kubectl, namespace, name)
    nodes_per_replica = plan["nodesPerReplica"]
    assert len(pods) == doc["spec"].get("replicas", 1) * nodes_per_replica
    products = node_products(kubectl)
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert products[pod["spec"]["nodeName"]] == plan["gpuProduct"], "pod runs on a planned-GPU node"
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == plan["gpusPerReplica"] // nodes_per_replica
    if nodes_per_replica > 1:  # a multi-node replica spans distinct nodes
        assert len({p["spec"]["nodeName"] for p in pods}) == len(pods)
    events = kubectl.json(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    said = {e["reason"]: e["message"] for e in events if e["involvedObject"]["kind"] == "InferenceModel"}
    # One Event for the decision: the plan and the children it put there.
    assert "; applied " in said["Planned"] and f"Service/{name}" in said["Planned"], said
    assert "Applied" not in said, said


def test_spec_change_rolls_out_a_new_plan(operator: ChartOperator, kubectl: Kubectl, namespace: str) -> None:
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    kubectl.apply(doc, namespace)
    first = wait_phase(kubectl, namespace, "chat", "Ready")
    assert first["status"]["plan"]["gpu"] == "L4x1"
    kubectl(
        "patch",
        "inferencemodel",
        "chat",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec": {"concurrency": 16}}',
    )

    def replanned() -> dict[str, Any] | None:
        obj = model(kubectl, namespace, "chat")
        status = obj.get("status") or {}
        done = (
            status.get("observedGeneration") == obj["metadata"]["generation"]
            and status.get("phase") == "Ready"
        )
        return obj if done else None

    second = wait_for(replanned, timeout=60, what="re-plan after the spec change")
    assert second["status"]["plan"]["gpusPerReplica"] > 1
    assert second["status"]["plan"]["maxConcurrency"] >= 16

    def rolled() -> list[dict[str, Any]] | None:
        pods = pods_of(kubectl, namespace, "chat")
        gpus = [int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) for p in pods]
        running = all(p["status"].get("phase") == "Running" for p in pods)
        return pods if pods and running and gpus == [second["status"]["plan"]["gpusPerReplica"]] else None

    wait_for(rolled, timeout=60, what="pods of the new plan")


def test_delete_leaves_nothing_behind(operator: ChartOperator, kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(example(REPO / "examples" / "chat-llama-8b.yaml", namespace), namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    kinds = "deployments,services,poddisruptionbudgets,pods"
    assert kubectl.json("get", kinds, "-n", namespace)["items"]
    kubectl("delete", "inferencemodel", "chat", "-n", namespace, "--wait=true", "--timeout=60s")

    def gone() -> bool | None:
        left = kubectl.json("get", kinds, "-n", namespace)["items"]
        return True if not left else None

    wait_for(gone, timeout=60, what="garbage collection of the children")


def _versions(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    items = kubectl.json(
        "get", "inferencemodels,deployments,services,poddisruptionbudgets,replicasets", "-n", namespace
    )
    return {f"{i['kind']}/{i['metadata']['name']}": i["metadata"]["resourceVersion"] for i in items["items"]}


def test_failover_resumes_unchanged_models_without_a_write(
    kubectl: Kubectl, namespace: str, operator: ChartOperator
) -> None:
    """The kubelet stops the active replica (SIGTERM): it releases the Lease, the standby takes over and
    resumes every object, and an unchanged model costs no write at all."""
    kubectl.apply(example(REPO / "examples" / "chat-llama-8b.yaml", namespace), namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    time.sleep(3)  # let the Deployment's own status settle
    before = _versions(kubectl, namespace)
    events_before = len(kubectl.json("get", "events", "-n", namespace)["items"])
    active = operator.active()
    standby = next(r for r in operator.replicas if r.alive() and r is not active)
    offset = len(standby.log.read_text())
    operator.kill(active, signal.SIGTERM)
    assert operator.active(timeout=20) is standby
    wait_for(
        lambda: "Resuming is processed" in standby.log.read_text()[offset:] or None,
        timeout=30,
        what="the new leader's resume pass",
    )
    time.sleep(3)
    operator.wait_replicas(2)  # the stopped one is restarted and stands by
    assert _versions(kubectl, namespace) == before
    assert len(kubectl.json("get", "events", "-n", namespace)["items"]) == events_before


def test_impossible_model_fails_with_reason(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["metadata"]["name"] = "impossible"
    doc["spec"]["model"]["name"] = "meta-llama/Llama-3.1-405B"
    doc["spec"]["maxModelLen"] = 131072
    doc["spec"]["concurrency"] = 64
    doc["spec"]["gpu"] = {"types": ["L4"]}
    kubectl.apply(doc, namespace)
    obj = wait_phase(kubectl, namespace, "impossible", "Failed")
    planned = next(c for c in obj["status"]["conditions"] if c["type"] == "Planned")
    assert planned["status"] == "False" and planned["reason"] == "NoFeasiblePlan"
    assert "no GPU candidate can serve" in obj["status"]["message"] and "short" in obj["status"]["message"]
    assert not kubectl.json("get", "deployments", "-n", namespace)["items"]
    events = kubectl.json(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=impossible"
    )["items"]
    assert any(e["reason"] == "NoFeasiblePlan" and e["type"] == "Warning" for e in events)


def test_bad_spec_the_api_server_accepts_is_refused_at_apply_clearly(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """The schema allows it, the model's context window does not: the validating webhook plans the
    model (its config.json is loadline's catalog's, so the spec alone decides) and refuses the apply."""
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["metadata"]["name"] = "toolong"
    doc["spec"]["maxModelLen"] = 1_000_000
    proc = kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False)
    assert proc.returncode != 0 and "spec.maxModelLen" in proc.stderr and "131072" in proc.stderr
    assert kubectl.run("get", "inferencemodel", "toolong", "-n", namespace, check=False).returncode != 0


def test_full_gpu_type_falls_back_to_the_next_and_says_so(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    # Occupy every L4 with placeholder pods, then ask for a model whose cheapest plan is one L4.
    products = node_products(kubectl)
    l4_nodes = [name for name, product in products.items() if product == "NVIDIA-L4"]
    nodes = {n["metadata"]["name"]: n for n in kubectl.json("get", "nodes")["items"]}
    for node_name in l4_nodes:
        gpus = nodes[node_name]["status"]["allocatable"]["nvidia.com/gpu"]
        kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"hog-{node_name}", "namespace": namespace},
                "spec": {
                    "nodeName": node_name,
                    "containers": [
                        {"name": "hog", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
                    ],
                },
            },
            namespace,
        )
    doc = copy.deepcopy(example(REPO / "examples" / "chat-llama-8b.yaml", namespace))
    doc["spec"]["gpu"] = {"types": ["L4", "L40S"]}
    kubectl.apply(doc, namespace)
    try:
        obj = wait_phase(kubectl, namespace, "chat", "Ready")
    finally:
        # Give the L4s back before the next test (namespace deletion would free them only later).
        kubectl(
            "delete", "pods", "-n", namespace, *[f"hog-{n}" for n in l4_nodes], "--wait=true", "--timeout=60s"
        )
    assert obj["status"]["plan"]["gpuType"] == "L40S"
    assert obj["status"]["plan"]["fallbackFrom"] == "L4"
    events = kubectl.json("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=chat")[
        "items"
    ]
    assert any(e["reason"] == "GPUFallback" for e in events)


def test_model_outside_the_catalog_is_sized_from_the_hub_with_a_token(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, hub: HubServer
) -> None:
    config = {**LLAMA_8B, "num_hidden_layers": 16}  # a private 4B-ish fine-tune of the 8B shape
    hub.add("private/chat-4b", json.dumps(config))
    kubectl("create", "secret", "generic", "hf", "-n", namespace, f"--from-literal=token={TOKEN}")
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["metadata"]["name"] = "private"
    doc["spec"]["model"] = {"name": "private/chat-4b", "tokenSecretRef": {"name": "hf"}}
    kubectl.apply(doc, namespace)
    obj = wait_phase(kubectl, namespace, "private", "Ready")
    assert obj["status"]["plan"]["memory"]["weightsGiB"] < 10  # half the layers of the 8B


def test_hub_refusal_names_the_token_field(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, hub: HubServer
) -> None:
    hub.add("private/locked", json.dumps(LLAMA_8B))
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["metadata"]["name"] = "locked"
    doc["spec"]["model"] = {"name": "private/locked"}
    kubectl.apply(doc, namespace)
    obj = wait_phase(kubectl, namespace, "locked", "Failed")
    assert "spec.model.tokenSecretRef" in obj["status"]["message"]


def test_a_pod_no_node_can_take_is_replanned_and_pending_in_the_schedulers_words(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """The plan fits the L4 nodes' shapes, but other pods already hold their host memory (the planner
    counts GPUs, the scheduler memory). The scheduler's reason reaches the model, and its re-plan takes
    the scheduler's word: no room on L4, the only type it allows, so it is Pending (not Deploying for as
    long as no room is made) with the scheduler's words. Once room is made the scheduler places the
    pod, the refusal lapses and the model turns Ready."""
    fillers: list[str] = []
    for node in kubectl.json("get", "nodes", "-l", "nvidia.com/gpu.product=NVIDIA-L4")["items"]:
        allocatable = parse_quantity(node["status"]["allocatable"]["memory"])
        fillers.append(f"filler-{node['metadata']['name']}")
        filler = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": fillers[-1]},
            "spec": {
                "nodeName": node["metadata"]["name"],  # placed, as a DaemonSet's pod would be
                "containers": [{"name": "hold", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": {"memory": str(int(allocatable) - (4 << 30))}}}],
            },
        }  # fmt: skip
        kubectl.apply(filler, namespace)
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["spec"]["gpu"] = {"types": ["L4"]}
    kubectl.apply(doc, namespace)

    def replanned() -> dict[str, Any] | None:
        obj = model(kubectl, namespace, "chat")
        status = obj.get("status") or {}
        pending = status.get("phase") == "Pending" and "cannot be scheduled" in status.get("message", "")
        return obj if pending else None

    obj = wait_for(replanned, timeout=120, what="the model re-planned and Pending in the scheduler's words")
    # Its readiness timer ran, yet nothing holds its deletion (kopf's timers ask for a finalizer).
    assert not obj["metadata"].get("finalizers")
    message = obj["status"]["message"]
    assert "L4" in message and "Insufficient memory" in message, message
    planned = next(c for c in obj["status"]["conditions"] if c["type"] == "Planned")
    assert planned["status"] == "False" and planned["reason"] == "NoCapacity"
    events = kubectl.json("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=chat")[
        "items"
    ]
    assert any(e["reason"] == "Unschedulable" and e["type"] == "Warning" for e in events)
    assert any(e["reason"] == "NoCapacity" and e["type"] == "Warning" for e in events)

    # Stuck while no room is made, the model costs the API server a read or two a minute, not one per
    # timer tick (the readiness back-off: 5, 10, 20, 40 s, then each minute).
    before = api_reads(operator.replicas)
    time.sleep(STUCK_SECONDS)
    spent = api_reads(operator.replicas) - before
    print(f"\nstuck {STUCK_SECONDS:.0f}s: the operator read {dict(spent)}")
    assert sum(spent.values()) <= STUCK_READS_PER_MINUTE * STUCK_SECONDS / 60 + 1, dict(spent)
    assert model(kubectl, namespace, "chat")["status"]["phase"] == "Pending"

    for name in fillers:  # room is made: the pod the scheduler refused is placed
        kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
    wait_phase(kubectl, namespace, "chat", "Ready", timeout=180)


def test_a_model_written_under_a_newer_crd_is_reconciled_and_keeps_what_this_version_lacks(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """After `helm rollback` the CRD stays the newer release's (Helm never downgrades CRDs), so the
    operator reads models with fields it does not know: here a newer CRD (this one plus a spec and a
    status field) stands in for it. The model is admitted, planned and Ready, a spec change re-plans it,
    and both fields are still there after the operator's own writes."""
    crd_name = "inferencemodels.loadline.dev"
    original = kubectl.json("get", "crd", crd_name)
    newer = copy.deepcopy(original)
    schema = newer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    schema["spec"]["properties"]["gpu"]["properties"]["migProfile"] = {"type": "string"}
    schema["status"]["properties"]["costCenter"] = {"type": "string"}
    kubectl("replace", "-f", "-", input=json.dumps(newer))
    try:
        doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
        doc["spec"]["gpu"]["migProfile"] = "1g.10gb"

        refusals: list[str] = []

        def stored_with_the_newer_field() -> dict[str, Any] | None:
            # The API server takes a moment to serve the replaced schema; until then it refuses the field.
            try:
                kubectl.apply(doc, namespace)
            except KubectlError as refused:
                refusals.append(str(refused))
                return None
            obj = model(kubectl, namespace, "chat")
            return obj if obj["spec"]["gpu"].get("migProfile") == "1g.10gb" else None

        try:
            wait_for(stored_with_the_newer_field, timeout=30, what="the newer CRD's field to be stored")
        except TimeoutError:
            raise AssertionError(f"the model was not stored: {refusals[-1:]}") from None
        wait_phase(kubectl, namespace, "chat", "Ready")
        kubectl("patch", "inferencemodel", "chat", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"costCenter": "ml-platform"}}))  # fmt: skip
        kubectl("patch", "inferencemodel", "chat", "-n", namespace, "--type=merge",
                "-p", json.dumps({"spec": {"concurrency": 16}}))  # fmt: skip

        def replanned() -> dict[str, Any] | None:
            obj = model(kubectl, namespace, "chat")
            status = obj.get("status") or {}
            current = status.get("observedGeneration") == obj["metadata"]["generation"]
            return obj if current and status.get("phase") == "Ready" else None

        after = wait_for(replanned, timeout=60, what="the re-plan after the spec change")
        assert after["status"]["plan"]["maxConcurrency"] >= 16
        assert after["spec"]["gpu"]["migProfile"] == "1g.10gb"
        assert after["status"]["costCenter"] == "ml-platform"
    finally:
        current = kubectl.json("get", "crd", crd_name)
        current["spec"] = original["spec"]
        kubectl("replace", "-f", "-", input=json.dumps(current))
