"""The InferenceModel's scale subresource on the real API server: `kubectl scale` moves a model 1 → 3 → 1
with nothing else rolled (the first pod keeps running, its ReplicaSet stays the only one), status.replicas
and status.selector follow, and a scale beyond a FleetPolicy's maxReplicas is refused at the scale
subresource with one line naming the field. Then KEDA (built from its Go module, e2e/keda.sh) scales a
model with spec.autoscaling 1 → 3 → 1 on vLLM's waiting requests as the real Prometheus scrapes them from
a loopback exporter standing in for the model's pods (docs/autoscaling.md)."""

from __future__ import annotations

import functools
import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from chart import ChartOperator
from kube import E2E_DIR, REPO, STATE_DIR, Kubectl, wait_for
from loadline.render import workload_ref
from operator_helpers import example, pods_of, wait_phase


def _scale(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    """The model's Scale as the API server serves it (autoscaling/v1, what an HPA and KEDA read)."""
    result: dict[str, Any] = kubectl.json(
        "get", "inferencemodel", "chat", "-n", namespace, "--subresource=scale"
    )
    return result


def _replica_sets(kubectl: Kubectl, namespace: str) -> set[str]:
    items = kubectl.json("get", "replicasets", "-n", namespace, "-l", "loadline.dev/inferencemodel=chat")[
        "items"
    ]
    return {i["metadata"]["name"] for i in items}


def _running(kubectl: Kubectl, namespace: str, count: int) -> list[dict[str, Any]] | None:
    pods = pods_of(kubectl, namespace, "chat")
    ready = [p for p in pods if p["status"].get("phase") == "Running"]
    return pods if len(pods) == count and len(ready) == count else None


def _at(kubectl: Kubectl, namespace: str, count: int) -> dict[str, Any] | None:
    scale = _scale(kubectl, namespace)
    if scale["spec"].get("replicas") != count or scale["status"].get("replicas") != count:
        return None
    return scale if _running(kubectl, namespace, count) else None


def test_kubectl_scale_moves_a_model_1_3_1_and_rolls_nothing(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(example(REPO / "examples" / "chat-llama-8b.yaml", namespace), namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    first = wait_for(lambda: _running(kubectl, namespace, 1), timeout=60, what="the first pod")[0]
    scale = wait_for(lambda: _at(kubectl, namespace, 1), timeout=60, what="status.replicas 1")
    assert scale["status"]["selector"] == "app.kubernetes.io/instance=chat,app.kubernetes.io/name=vllm"
    selected = kubectl.json("get", "pods", "-n", namespace, "-l", scale["status"]["selector"])["items"]
    assert [p["metadata"]["name"] for p in selected] == [first["metadata"]["name"]]
    sets = _replica_sets(kubectl, namespace)
    template = kubectl.json("get", "deployment", "chat", "-n", namespace)["spec"]["template"]

    served = {first["metadata"]["name"]}
    for count in (3, 1):
        kubectl("scale", "inferencemodel", "chat", "-n", namespace, f"--replicas={count}")
        wait_for(functools.partial(_at, kubectl, namespace, count), timeout=90, what=f"the model at {count}")
        names = {p["metadata"]["name"] for p in pods_of(kubectl, namespace, "chat")}
        # Nothing rolled: scaling up kept every pod that served and added new ones, scaling down only
        # removed pods (the ReplicaSet picks which), one ReplicaSet, the pod template unchanged.
        assert served <= names if count > len(served) else names <= served
        served = names
        assert _replica_sets(kubectl, namespace) == sets
        assert kubectl.json("get", "deployment", "chat", "-n", namespace)["spec"]["template"] == template
        wait_phase(kubectl, namespace, "chat", "Ready")


def test_kubectl_scale_moves_a_multi_node_model_and_its_group_count_follows(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """A model whose replica spans two nodes runs as a LeaderWorkerSet: `kubectl scale` moves its groups
    1 → 2 → 1 and status.replicas (what KEDA and an HPA read) follows the LeaderWorkerSet's count."""
    doc = example(REPO / "examples" / "llama-405b-multinode.yaml", namespace)
    name = doc["metadata"]["name"]
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, name, "Ready", timeout=120)
    _, _, workload = workload_ref(name, multi_node=True)

    def groups(count: int) -> dict[str, Any] | None:
        scale = kubectl.json("get", "inferencemodel", name, "-n", namespace, "--subresource=scale")
        lws = kubectl.json("get", "leaderworkerset", workload, "-n", namespace)
        at = (
            scale["spec"].get("replicas"),
            scale["status"].get("replicas"),
            lws["status"].get("readyReplicas"),
        )
        return scale if at == (count, count, count) else None

    assert wait_for(lambda: groups(1), timeout=60, what="status.replicas 1")["status"]["selector"]
    for count in (2, 1):
        kubectl("scale", "inferencemodel", name, "-n", namespace, f"--replicas={count}")
        wait_for(functools.partial(groups, count), timeout=120, what=f"{count} group(s) in status.replicas")
        assert len(pods_of(kubectl, namespace, name)) == 2 * count  # a leader and a worker per group
        wait_phase(kubectl, namespace, name, "Ready", timeout=120)


def test_a_scale_beyond_the_free_gpus_is_reported_with_the_fix_and_nothing_is_applied(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """The cluster has fewer free L4 GPUs than a scale asks for: the model says so with the fix, its
    workload keeps the replicas it had (nothing half-applied: no pod waits for a GPU it cannot get, the
    serving pod is left alone), and a scale back within the free GPUs makes it Ready again."""
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["spec"]["gpu"] = {"types": ["L4"]}
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    [serving] = wait_for(lambda: _running(kubectl, namespace, 1), timeout=60, what="the first pod")
    nodes = kubectl.json("get", "nodes", "-l", "nvidia.com/gpu.product=NVIDIA-L4")["items"]
    beyond = sum(int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes) + 1
    kubectl("scale", "inferencemodel", "chat", "-n", namespace, f"--replicas={beyond}")
    obj = wait_phase(kubectl, namespace, "chat", "Pending")
    message = obj["status"]["message"]
    assert "no free GPUs" in message and "lower replicas" in message, message
    planned = next(c for c in obj["status"]["conditions"] if c["type"] == "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "NoCapacity"), planned
    time.sleep(10)  # what a half-applied scale would have started by now
    assert kubectl.json("get", "deployment", "chat", "-n", namespace)["spec"]["replicas"] == 1
    assert [p["metadata"]["name"] for p in pods_of(kubectl, namespace, "chat")] == [
        serving["metadata"]["name"]
    ]
    kubectl("scale", "inferencemodel", "chat", "-n", namespace, "--replicas=2")
    wait_for(lambda: _at(kubectl, namespace, 2), timeout=90, what="the model at 2 replicas")
    wait_phase(kubectl, namespace, "chat", "Ready")
    assert serving["metadata"]["name"] in {p["metadata"]["name"] for p in pods_of(kubectl, namespace, "chat")}


def test_a_scale_beyond_a_fleet_policy_is_refused_naming_the_field(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    policy: dict[str, Any] = {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "FleetPolicy",
        "metadata": {"name": f"{namespace}-replicas"},
        "spec": {
            "enforcement": "deny",
            "selector": {"namespaces": [namespace]},
            "limits": {"maxReplicas": 2},
        },
    }
    kubectl.apply(policy)
    try:
        kubectl.apply(example(REPO / "examples" / "chat-llama-8b.yaml", namespace), namespace)
        wait_phase(kubectl, namespace, "chat", "Ready")
        kubectl("scale", "inferencemodel", "chat", "-n", namespace, "--replicas=2")
        wait_for(lambda: _at(kubectl, namespace, 2), timeout=90, what="the model at 2 replicas")
        proc = kubectl.run("scale", "inferencemodel", "chat", "-n", namespace, "--replicas=3", check=False)
        assert proc.returncode != 0
        assert (
            f"FleetPolicy {namespace}-replicas: spec.replicas: 3 exceeds maxReplicas 2 "
            "(fix: set spec.replicas to 2 or fewer)"
        ) in proc.stderr
        # Nothing half-applied: the spec and the workload stay at 2.
        assert _scale(kubectl, namespace)["spec"]["replicas"] == 2
        assert kubectl.json("get", "deployment", "chat", "-n", namespace)["spec"]["replicas"] == 2
        # An autoscaler's maximum beyond the policy is refused when the spec is applied.
        doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
        doc["spec"]["autoscaling"] = {"maxReplicas": 4, "target": 0.7}
        refused = kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False)
        assert refused.returncode != 0
        assert "spec.autoscaling.maxReplicas: 4 exceeds maxReplicas 2" in refused.stderr
    finally:
        kubectl.run("delete", "fleetpolicy", policy["metadata"]["name"], "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def keda() -> Iterator[None]:
    """KEDA's operator and metrics adapter on the local control plane (e2e/keda.sh), stopped after the
    module: its APIService would fail every client's discovery once the adapter is gone."""
    proc = subprocess.run(
        ["bash", str(E2E_DIR / "keda.sh"), "up"], capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        pytest.fail(f"e2e/keda.sh up exited {proc.returncode}:\n{proc.stderr[-3000:]}", pytrace=False)
    try:
        yield
    finally:
        subprocess.run(
            ["bash", str(E2E_DIR / "keda.sh"), "down"], capture_output=True, timeout=120, check=False
        )


class VllmExporter:
    """vLLM's /metrics as the model's pods would serve it (``vllm:num_requests_waiting`` per pod, in
    vLLM's exposition: one series per engine), with the namespace and pod labels Prometheus's pod
    discovery would attach; the session's Prometheus scrapes it every 2 s (e2e/prometheus.sh)."""

    def __init__(self, namespace: str, pod: str) -> None:
        self.namespace, self.pod, self.waiting = namespace, pod, 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                labels = f'namespace="{exporter.namespace}",pod="{exporter.pod}",engine="0",model_name="chat"'
                body = (
                    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    f"vllm:num_requests_waiting{{{labels}}} {exporter.waiting}\n"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = STATE_DIR / "prometheus" / "targets" / "vllm-exporter.json"

    def __enter__(self) -> VllmExporter:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.target.write_text(json.dumps([{"targets": [f"127.0.0.1:{self.server.server_port}"]}]))
        return self

    def __exit__(self, *_: object) -> None:
        self.target.unlink(missing_ok=True)
        self.server.shutdown()


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(
        f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=10
    ) as r:
        result: list[dict[str, Any]] = json.load(r)["data"]["result"]
    return result


def test_keda_scales_a_model_up_and_down_on_vllm_series_in_prometheus(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, prometheus_url: str, keda: None
) -> None:
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "signal": "waitingRequests",
        "target": 2,
        "scaleDownStabilizationSeconds": 0,
    }
    with VllmExporter(namespace, "chat-5d8f7c9b4-x2k4q") as exporter:
        kubectl.apply(doc, namespace)
        wait_phase(kubectl, namespace, "chat", "Ready")
        scaled = kubectl.json("get", "scaledobject", "chat", "-n", namespace)
        trigger = scaled["spec"]["triggers"][0]["metadata"]
        assert trigger["serverAddress"] == prometheus_url and "vllm:num_requests_waiting" in trigger["query"]
        wait_for(
            lambda: _query(prometheus_url, trigger["query"]), timeout=60, what="the trigger's query answered"
        )
        first = wait_for(lambda: _running(kubectl, namespace, 1), timeout=60, what="the first pod")[0]
        sets = _replica_sets(kubectl, namespace)

        exporter.waiting = 6  # 6 waiting / 2 per replica: 3 replicas
        wait_for(lambda: _at(kubectl, namespace, 3), timeout=240, what="KEDA's HPA to scale the model to 3")
        hpa = kubectl.json("get", "hpa", "-n", namespace)["items"][0]
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "InferenceModel",
            "name": "chat",
        }

        at_three = {p["metadata"]["name"] for p in pods_of(kubectl, namespace, "chat")}
        assert first["metadata"]["name"] in at_three  # scaling up kept the pod that served

        exporter.waiting = 0
        wait_for(
            lambda: _at(kubectl, namespace, 1), timeout=240, what="KEDA's HPA to scale the model back to 1"
        )
        # Nothing rolled on the way: scaling down only removed pods (the ReplicaSet picks which), and
        # every pod is of the one ReplicaSet the model started with.
        assert {p["metadata"]["name"] for p in pods_of(kubectl, namespace, "chat")} <= at_three
        assert _replica_sets(kubectl, namespace) == sets
