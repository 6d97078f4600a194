"""Real vLLM logs through the real API server: KWOK's ``Logs`` objects make the pod log endpoint
(``kubectl logs``, the operator's reads) return a file's text for a simulated pod, so the operator reads
what a vLLM container would have written.

The logs are real: ``data/vllm_0.19.0_gpt_oss_20b_sampler_oom.log`` is the whole log of a vLLM 0.19.0
server that ran out of GPU memory warming up its sampler after the weights had loaded
(https://github.com/llm-d-incubation/llm-d-planner/blob/d3121e059da88662db39a926a3ead964be97359b/accuracy/results/v0.19.0/logs/openai-gpt-oss-20b--h100-80gb--tp1pp1dp1--8192.FAILED.log);
the start-up logs are ``tests/corpus/startup`` (each cited in its index.json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chart import ChartOperator
from crash import crash_container
from kube import E2E_DIR, REPO, Kubectl, wait_for
from operator_helpers import example, pods_of, wait_phase
from test_oom import age_container

CRASH_LOG = E2E_DIR / "data" / "vllm_0.19.0_gpt_oss_20b_sampler_oom.log"
STARTUP = REPO / "tests" / "corpus" / "startup"


def serve_logs(
    kubectl: Kubectl, namespace: str, pod: dict[str, Any], logs: Path, previous: Path | None = None
) -> None:
    """A KWOK ``Logs`` object for ``pod``: its container's log is ``logs``, its previous one ``previous``."""
    entry: dict[str, Any] = {
        "containers": [c["name"] for c in pod["spec"]["containers"]],
        "logsFile": str(logs),
    }
    if previous is not None:
        entry["previousLogsFile"] = str(previous)
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
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["spec"]["gpu"] = {"types": ["L4"]}
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    [pod] = pods_of(kubectl, namespace, "chat")
    name = pod["metadata"]["name"]
    serve_logs(kubectl, namespace, pod, STARTUP / "vllm_0.19.0_llama70b_fp8_tp2_h100.log", CRASH_LOG)
    previous = served(kubectl, namespace, name, "--previous")
    assert previous == CRASH_LOG.read_text()
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
