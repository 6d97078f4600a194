"""Real vLLM logs through the real API server: KWOK's ``Logs`` objects make the pod log endpoint
(``kubectl logs``, the operator's reads) return a file's text for a simulated pod, so the operator reads
what a vLLM container would have written.

The logs are real: ``data/vllm_0.19.0_gpt_oss_20b_sampler_oom.log`` is the whole log of a vLLM 0.19.0
server that ran out of GPU memory warming up its sampler after the weights had loaded
(https://github.com/llm-d-incubation/llm-d-planner/blob/d3121e059da88662db39a926a3ead964be97359b/accuracy/results/v0.19.0/logs/openai-gpt-oss-20b--h100-80gb--tp1pp1dp1--8192.FAILED.log);
the start-up logs are ``tests/corpus/startup`` (each cited in its index.json).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chart import OPERATOR_NAMESPACE, ChartOperator
from crash import crash_container
from kube import E2E_DIR, REPO, Kubectl, wait_for
from operator_helpers import example, pods_of, wait_phase
from test_oom import age_container
from test_sharding import _restart_replicas

CRASH_LOG = E2E_DIR / "data" / "vllm_0.19.0_gpt_oss_20b_sampler_oom.log"
STARTUP = REPO / "tests" / "corpus" / "startup"


def cri_file(text: str, path: Path) -> Path:
    """``text`` as a container runtime writes a container's log (the CRI format KWOK reads and the
    kubelet serves: ``<time> stdout F <line>``); the API server returns the lines as they were."""
    stamp = "2026-11-28T00:00:00.000000000Z"
    path.write_text("".join(f"{stamp} stdout F {line}\n" for line in text.splitlines()), encoding="utf-8")
    return path


def serve_logs(
    kubectl: Kubectl,
    namespace: str,
    pod: dict[str, Any],
    where: Path,
    logs: Path,
    previous: Path | None = None,
) -> None:
    """A KWOK ``Logs`` object for ``pod``: its container's log is ``logs``, its previous one ``previous``
    (written in the CRI format into ``where``)."""
    entry: dict[str, Any] = {
        "containers": [c["name"] for c in pod["spec"]["containers"]],
        "logsFile": str(cri_file(logs.read_text(), where / f"{pod['metadata']['name']}.log")),
    }
    if previous is not None:
        entry["previousLogsFile"] = str(
            cri_file(previous.read_text(), where / f"{pod['metadata']['name']}.previous.log")
        )
    doc = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": pod["metadata"]["name"], "namespace": namespace},
        "spec": {"logs": [entry]},
    }
    kubectl.apply(doc, namespace)


def served(kubectl: Kubectl, namespace: str, pod: str, *flags: str) -> str:
    """The pod's log as the API server returns it, once KWOK serves it."""

    said: list[str] = []

    def read() -> str | None:
        done = kubectl.run("logs", pod, "-n", namespace, *flags, check=False)
        said[:] = [done.stderr.strip()]
        return done.stdout if done.returncode == 0 and done.stdout.strip() else None

    try:
        return wait_for(read, timeout=30, what=f"the log of {pod} through the API server")
    except TimeoutError:
        logs = kubectl.run("get", "logs.kwok.x-k8s.io", "-n", namespace, "-o", "yaml", check=False)
        raise AssertionError(
            f"kubectl logs said: {said}; Logs objects: {logs.stdout[-1500:]} {logs.stderr}"
        ) from None


def test_an_incident_phase_is_read_from_a_real_crash_log_through_the_api_server(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["spec"]["gpu"] = {"types": ["L4"]}
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    [pod] = pods_of(kubectl, namespace, "chat")
    name = pod["metadata"]["name"]
    serve_logs(
        kubectl, namespace, pod, tmp_path, STARTUP / "vllm_0.19.0_llama70b_fp8_tp2_h100.log", CRASH_LOG
    )
    previous = served(kubectl, namespace, name, "--previous")
    assert previous.splitlines() == CRASH_LOG.read_text().splitlines()
    # The termination message says only that the GPU ran out of memory (a thin message: alone, the
    # classifier cannot tell when). The previous log's start says the weights had loaded and the server
    # never served: the "starting" phase, which the timing table reads as a batch misconfiguration.
    thin = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB."
    age_container(kubectl, namespace, pod, 0)  # the crashed instance had just started: a start-up crash
    crash_container(kubectl, name, namespace, "cuda-oom", message=thin)

    def incident() -> dict[str, Any] | None:
        status = kubectl.json("get", "inferencemodel", "chat", "-n", namespace).get("status") or {}
        found = status.get("incidents") or []
        return found[-1] if found else None

    found = wait_for(incident, timeout=30, what="the incident in status")
    assert found["class"] == "batch_misconfiguration", found
    assert any("after the weights had loaded but before Ready" in e for e in found["evidence"]), found


#: The InferenceModel the server of STARTUP/vllm_0.19.0_llama70b_fp8_tp2_h100.log ran: the planner puts it
#: on two H100s (TP 2) at vLLM 0.19.0, max-model-len 8192, gpu-memory-utilization 0.95, as the log says.
LLAMA_70B = {
    "model": {"name": "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic"},
    "maxModelLen": 8192,
    "concurrency": 8,
    "engine": {"version": "0.19.0", "gpuMemoryUtilization": 0.95},
    "gpu": {"types": ["H100-80GB"]},
}


def test_observed_memory_in_status_is_kept_and_corrects_the_next_plan_of_its_kind(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    doc = {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "llama-70b", "namespace": namespace},
        "spec": LLAMA_70B,
    }
    kubectl.apply(doc, namespace)
    ready = wait_phase(kubectl, namespace, "llama-70b", "Ready")
    plan = ready["status"]["plan"]
    assert (plan["gpu"], plan["tensorParallelSize"], plan["kvReserveGiB"]) == ("H100-80GBx2", 2, 0.0)
    [pod] = pods_of(kubectl, namespace, "llama-70b")
    serve_logs(kubectl, namespace, pod, tmp_path, STARTUP / "vllm_0.19.0_llama70b_fp8_tp2_h100.log")

    def observed() -> dict[str, Any] | None:
        status = kubectl.json("get", "inferencemodel", "llama-70b", "-n", namespace).get("status") or {}
        return status if status.get("observed") else None

    status = wait_for(observed, timeout=60, what="status.observed of llama-70b")
    seen = status["observed"]
    # vLLM's own figures, read from the pod's log through the API server, beside the plan's.
    assert (seen["kvCacheGiB"], seen["kvCacheTokens"], seen["maxConcurrency"]) == (37.28, 244304, 29.82)
    assert seen["weightsGiB"] == 33.88 and seen["vllmVersion"] == "0.19.0"
    assert seen["plannedKvCacheGiB"] == plan["memory"]["kvCacheGiB"]
    assert abs(seen["kvCacheErrorPercent"]) < 2.0
    assert seen["pod"] == pod["metadata"]["name"]
    [capacity] = [c for c in status["conditions"] if c["type"] == "KVCapacity"]
    assert capacity["status"] == "True", capacity
    # Kept in the fleet's store, readable with kubectl.
    data = kubectl.json("get", "configmap", "loadline-observations", "-n", OPERATOR_NAMESPACE)["data"]
    records = json.loads(data["observations.json"])["observations"]
    mine = [r for r in records if r["source"] == f"pod {namespace}/{pod['metadata']['name']} log"]
    assert len(mine) == 1 and mine[0]["family"] == "llama" and mine[0]["gpuType"] == "H100-80GB", records
    # The next model of that family, quantization and release on that GPU is planned with it.
    kubectl.apply({**doc, "metadata": {"name": "llama-70b-next", "namespace": namespace}}, namespace)
    nxt = wait_phase(kubectl, namespace, "llama-70b-next", "Ready")["status"]["plan"]
    notes = [t for t in nxt["tuning"] if t.startswith("KV budget corrected by")]
    assert notes and "of llama on H100-80GB, vLLM 0.19, quantization compressed-tensors" in notes[0], nxt[
        "tuning"
    ]
    shortfall = round(plan["memory"]["kvCacheGiB"] - seen["kvCacheGiB"], 2)
    assert nxt["kvReserveGiB"] != 0.0 and abs(nxt["kvReserveGiB"]) <= abs(shortfall) + 0.01


#: A GPU catalog that believes an H100 has 89 GiB, as a catalog entry for another board or driver might:
#: the planner then expects 20 % more KV cache than vLLM (whose real log says 79.19 GiB) finds.
OVERSTATED_H100_GIB = 89.0
CATALOG_CONFIGMAP = "loadline-e2e-gpus"


@pytest.fixture
def overstated_h100(operator: ChartOperator, kubectl: Kubectl) -> Iterator[ChartOperator]:
    """The operator rolled out with a GPU catalog (chart value ``gpuCatalog.configMap``) whose H100
    entry overstates its memory, and an empty observation store; all put back afterwards."""
    bundled = json.loads((REPO / "operator" / "loadline" / "sizing" / "data" / "gpus.json").read_text())
    h100 = next(g for g in bundled["gpus"] if g["name"] == "H100-80GB")
    catalog = {"gpus": [{**h100, "memory_gib": OVERSTATED_H100_GIB, "source": "e2e: overstated on purpose"}]}
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CATALOG_CONFIGMAP, "namespace": OPERATOR_NAMESPACE},
        "data": {"gpus.yaml": json.dumps(catalog)},
    }
    kubectl.apply(configmap, OPERATOR_NAMESPACE)
    forget = ("delete", "configmap", "loadline-observations", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
    kubectl(*forget)
    _restart_replicas(operator, {"gpuCatalog": {"configMap": CATALOG_CONFIGMAP}})
    try:
        operator.active(timeout=60)
        yield operator
    finally:
        kubectl(*forget)
        _restart_replicas(operator, {"gpuCatalog": {"configMap": ""}})
        kubectl("delete", "configmap", CATALOG_CONFIGMAP, "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
        operator.active(timeout=60)


def test_a_model_whose_engine_reports_20_percent_less_kv_than_planned_is_replanned(
    overstated_h100: ChartOperator, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    # 32 sequences: two H100s hold 37 of them by the overstated catalog, 29.82 by vLLM's real log.
    doc = {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "llama-70b", "namespace": namespace},
        "spec": {**LLAMA_70B, "concurrency": 32},
    }
    kubectl.apply(doc, namespace)
    first = wait_phase(kubectl, namespace, "llama-70b", "Ready")["status"]["plan"]
    assert first["gpu"] == "H100-80GBx2" and first["maxConcurrency"] >= 32, first
    [pod] = pods_of(kubectl, namespace, "llama-70b")
    serve_logs(kubectl, namespace, pod, tmp_path, STARTUP / "vllm_0.19.0_llama70b_fp8_tp2_h100.log")

    def replanned() -> dict[str, Any] | None:
        status = kubectl.json("get", "inferencemodel", "llama-70b", "-n", namespace).get("status") or {}
        plan = status.get("plan") or {}
        return status if status.get("observed") and plan.get("gpu") != "H100-80GBx2" else None

    status = wait_for(replanned, timeout=90, what="llama-70b observed and planned again")
    seen = status["observed"]
    assert seen["kvCacheGiB"] == 37.28 and seen["plannedKvCacheGiB"] == first["memory"]["kvCacheGiB"]
    short = 1 - seen["kvCacheGiB"] / seen["plannedKvCacheGiB"]
    assert 0.18 < short < 0.22, seen  # vLLM found 20 % less KV cache than the plan counted
    [capacity] = [c for c in status["conditions"] if c["type"] == "KVCapacity"]
    assert capacity["status"] == "False" and capacity["reason"] == "BelowSpec", capacity
    assert "room for only 29.82 sequences" in capacity["message"]
    # The new plan holds the shortfall back on the H100s and takes more of them, before any crash.
    plan = status["plan"]
    assert plan["gpu"] == "H100-80GBx4", plan
    assert plan["kvReserveGiB"] == pytest.approx(seen["plannedKvCacheGiB"] - seen["kvCacheGiB"], abs=0.02)
    assert any(
        t.startswith("KV budget corrected by 1 observation of llama on H100-80GB") for t in plan["tuning"]
    )
    assert not status.get("incidents")
