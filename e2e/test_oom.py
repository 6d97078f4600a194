"""Out-of-memory incidents on the real control plane: crash a running model's pod, watch loadline
classify it, apply the remediation (within policy), roll the pods out, and record it all.

The crash texts are what vLLM and torch print (the same shapes as tests/corpus/oom); the rest of the
incident (timing, plan, limits) the operator reads from the cluster itself.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chart import ChartOperator
from conftest import OUTCOME_HORIZON_MINUTES
from crash import crash_container, crashed_status, termination_for
from kube import E2E_DIR, REPO, STATE_DIR, Kubectl, kubectl_binary, wait_for
from operator_helpers import example, metric_total, pods_of, wait_phase
from test_prometheus import HISTORY, STEP, Pod, llama_0, openmetrics

SAMPLER = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 500.00 MiB. GPU 0 has a total capacity of "
    "22.05 GiB of which 300.50 MiB is free. Including non-PyTorch memory, this process has 21.70 GiB memory in "
    "use. Of the allocated memory 20.10 GiB is allocated by PyTorch, and 0.78 GiB is reserved by PyTorch but "
    "unallocated.\nRuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests. "
    "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine."
)
LOAD = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
    "22.05 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 21.02 GiB memory in use. "
    "Of the allocated memory 20.61 GiB is allocated by PyTorch, and 0.11 GiB is reserved by PyTorch but "
    "unallocated.\nRuntimeError: Failed to load model - not enough GPU memory"
)
KV = (
    "ValueError: The model's max seq len (8192) is larger than the maximum number of tokens that can be stored "
    "in KV cache (7344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    "initializing the engine."
)
FRAGMENTED = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "22.05 GiB of which 0.41 GiB is free. Including non-PyTorch memory, this process has 21.63 GiB memory in use. "
    "Of the allocated memory 14.20 GiB is allocated by PyTorch, and 6.90 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def deploy_chat(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    """The 8B example pinned to one L4: the crash texts below quote an L4's 22.05 GiB."""
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["spec"]["gpu"] = {"types": ["L4"]}
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    [pod] = pods_of(kubectl, namespace, "chat")
    return pod


def age_container(kubectl: Kubectl, namespace: str, pod: dict[str, Any], hours: float) -> None:
    """Pretend the vLLM container has been running for ``hours`` (a kubelet would report that)."""
    fresh = kubectl.json("get", "pod", pod["metadata"]["name"], "-n", namespace)
    status = fresh["status"]
    started = (
        (datetime.now(UTC) - timedelta(hours=hours)).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    )
    for entry in status["containerStatuses"]:
        entry["state"] = {"running": {"startedAt": started}}
    patch = {"metadata": {"resourceVersion": fresh["metadata"]["resourceVersion"]}, "status": status}
    kubectl("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps(patch))  # fmt: skip


def age_readiness(kubectl: Kubectl, namespace: str, hours: float, name: str = "chat") -> None:
    """Make the model's Ready transition as old as the aged container (a consistent long-running world)."""
    obj = kubectl.json("get", "inferencemodel", name, "-n", namespace)
    when = (
        (datetime.now(UTC) - timedelta(hours=hours)).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    )
    conditions = obj["status"]["conditions"]
    for cond in conditions:
        if cond["type"] == "Ready":
            cond["lastTransitionTime"] = when
    patch = {
        "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
        "status": {"conditions": conditions},
    }
    kubectl("patch", "inferencemodel", name, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps(patch))  # fmt: skip


class ModelWrites:
    """Every write of the model ``chat`` from now on, as ``kubectl get -w`` shows it (a watch delivers
    each version: none is coalesced away), as (phase, the Ready condition's reason, crashes handled)."""

    def __init__(self, kubectl: Kubectl, namespace: str) -> None:
        binary = kubectl.binary or kubectl_binary()
        self._proc = subprocess.Popen(
            [str(binary), "--kubeconfig", str(kubectl.kubeconfig), "get", "inferencemodel", "chat",
             "-n", namespace, "-w", "--watch-only", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        time.sleep(1)  # watching before the crash is written

    def stop(self) -> list[tuple[str, str, int]]:
        """The writes seen so far; the watch ends (a second call, or one after a failed test: none)."""
        if self._proc.poll() is not None:
            return []
        self._proc.terminate()
        text, _ = self._proc.communicate(timeout=10)
        decoder, at = json.JSONDecoder(), 0
        seen: list[tuple[str, str, int]] = []
        while (at := len(text) - len(text[at:].lstrip())) < len(text):
            obj, at = decoder.raw_decode(text, at)
            status = obj.get("status") or {}
            reason = next((c["reason"] for c in status.get("conditions", []) if c["type"] == "Ready"), "")
            handled = len((status.get("remediation") or {}).get("handledCrashes") or [])
            seen.append((status.get("phase", ""), reason, handled))
        return seen


def remediated(kubectl: Kubectl, namespace: str, oom_class: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = kubectl.json("get", "inferencemodel", "chat", "-n", namespace)
        incidents = (obj.get("status") or {}).get("incidents") or []
        return obj if incidents and incidents[-1]["class"] == oom_class else None

    try:
        return wait_for(check, timeout=30, what=f"a {oom_class} incident in status")
    except Exception:
        obj = kubectl.json("get", "inferencemodel", "chat", "-n", namespace)
        raise AssertionError(f"no {oom_class} incident: {json.dumps(obj.get('status'))[:2000]}") from None


def rolled_out(kubectl: Kubectl, namespace: str, old_pod: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pods = [p for p in pods_of(kubectl, namespace, "chat") if p["metadata"]["name"] != old_pod]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running[0] if running and len(pods_of(kubectl, namespace, "chat")) == 1 else None

    return wait_for(check, timeout=60, what="the remediated pod rolled out")


def events(kubectl: Kubectl, namespace: str) -> set[str]:
    return set(event_messages(kubectl, namespace))


def event_messages(kubectl: Kubectl, namespace: str) -> dict[str, list[str]]:
    """The Events of the model ``chat``: their messages by reason."""
    items = kubectl.json("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=chat")[
        "items"
    ]
    said: dict[str, list[str]] = {}
    for event in items:
        said.setdefault(event["reason"], []).append(event.get("message") or "")
    return said


# age_hours: how long the crashed instance ran; 0 means it had just been restarted (a start-up crash,
# before it could be Ready), None leaves the running instance as KWOK started it.
CASES = [
    ("batch_misconfiguration", "cuda-oom", SAMPLER, 0, {"maxNumSeqs": 128}),
    ("model_exceeds_vram", "cuda-oom", LOAD, 0, {"minGpusPerReplica": 2}),
    ("kv_cache_overflow", "cuda-oom", KV, 0, {"maxModelLen": 7168}),
    ("host_memory", "oomkilled", None, None, None),
    ("fragmentation", "cuda-oom", FRAGMENTED, 72, None),
]


@pytest.mark.parametrize(
    ("oom_class", "kind", "message", "age_hours", "overrides"), CASES, ids=[c[0] for c in CASES]
)
def test_each_class_is_classified_remediated_and_rolled_out(
    request: pytest.FixtureRequest,
    operator: ChartOperator,
    kubectl: Kubectl,
    namespace: str,
    oom_class: str,
    kind: str,
    message: str | None,
    age_hours: float | None,
    overrides: dict[str, Any] | None,
) -> None:
    pod = deploy_chat(kubectl, namespace)
    old_memory = pod["spec"]["containers"][0]["resources"]["limits"]["memory"]
    if age_hours is not None:
        age_container(kubectl, namespace, pod, age_hours)
        if age_hours > 1:
            age_readiness(kubectl, namespace, age_hours - 1)
    writes = ModelWrites(kubectl, namespace)
    request.addfinalizer(writes.stop)  # ended however the test ends (a held fix returns early)
    crash_container(kubectl, pod["metadata"]["name"], namespace, kind, message=message)  # type: ignore[arg-type]
    obj = remediated(kubectl, namespace, oom_class)
    incident = obj["status"]["incidents"][-1]
    assert incident["result"].startswith("applied"), incident
    assert incident["evidence"] and incident["count"] == 1
    remediation = obj["status"]["remediation"]
    assert remediation["actionsToday"] == 1 and len(remediation["handledCrashes"]) == 1
    if overrides is not None:
        assert {k: remediation["overrides"][k] for k in overrides} == overrides
    if oom_class in WAITS_FOR_THE_WINDOW:
        held_for_the_window(kubectl, namespace, pod, oom_class)
        return
    new_pod = rolled_out(kubectl, namespace, pod["metadata"]["name"])
    container = new_pod["spec"]["containers"][0]
    if oom_class == "model_exceeds_vram":
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 2
    if oom_class == "host_memory":
        assert remediation["overrides"]["memoryGiB"] >= 1.2 * int(old_memory.removesuffix("Gi"))
        assert container["resources"]["limits"]["memory"] != old_memory
    if oom_class == "batch_misconfiguration":
        args = container["args"]
        assert args[args.index("--max-num-seqs") + 1] == str(next(iter(overrides.values())))  # type: ignore[union-attr]
    # A fix whose crash recurs at every start rolls at once, and status says so.
    maintenance = kubectl.json("get", "inferencemodel", "chat", "-n", namespace)["status"]["maintenance"]
    assert maintenance["trigger"] == "crashLoop" and maintenance["state"] in {"Running", "Done"}
    said = event_messages(kubectl, namespace)
    assert {"OutOfMemory", "Remediated"} <= set(said), said
    # One Event says what was done and that it rolls now; no RestartStarted beside it.
    assert any("Restart: " in message for message in said["Remediated"]), said["Remediated"]
    assert "RestartStarted" not in said, said
    final = wait_phase(kubectl, namespace, "chat", "Ready")
    assert final["status"]["observedGeneration"] == final["metadata"]["generation"]
    seen = writes.stop()
    decided = [i for i, (_, _, handled) in enumerate(seen) if handled]
    assert decided, seen
    if oom_class in ROLLED_BY_THE_WORKLOAD_ALONE:
        # The decision's own write says the roll-out; its steps write nothing until the model is Ready.
        after = [(phase, reason) for phase, reason, _ in seen[decided[0] :]]
        assert after[0] == ("Deploying", "Remediating"), seen
        assert ("Ready", "Available") in after and ("Deploying", "Progressing") not in after, seen


#: Classes whose fix changes the workload alone (no move between layouts, which reconcile applies).
ROLLED_BY_THE_WORKLOAD_ALONE = {"batch_misconfiguration", "host_memory"}

#: Classes whose crash comes back only intermittently: their fix waits for the model's restart window.
WAITS_FOR_THE_WINDOW = {"kv_cache_overflow", "fragmentation"}


def held_for_the_window(kubectl: Kubectl, namespace: str, pod: dict[str, Any], oom_class: str) -> None:
    """The fix is scheduled into the next window (this model has no traffic history: the default one)
    and nothing rolls meanwhile: the pods keep the overrides they run (test_restarts carries one out)."""

    def scheduled() -> dict[str, Any] | None:
        status = kubectl.json("get", "inferencemodel", "chat", "-n", namespace)["status"]
        return status if (status.get("maintenance") or {}).get("scheduledAt") else None

    status = wait_for(scheduled, timeout=30, what="the fix scheduled into a window")
    maintenance = status["maintenance"]
    assert maintenance["state"] == "Scheduled" and maintenance["trigger"] == "window", maintenance
    assert maintenance["action"] == ("restart" if oom_class == "fragmentation" else "remediation")
    assert datetime.fromisoformat(maintenance["scheduledAt"].replace("Z", "+00:00")) > datetime.now(UTC)
    if oom_class == "kv_cache_overflow":
        assert status["remediation"]["heldOverrides"] == {}  # the pods run no override yet
    time.sleep(6)  # three ticks of the maintenance timer
    assert [p["metadata"]["name"] for p in pods_of(kubectl, namespace, "chat")] == [pod["metadata"]["name"]]
    deployment = kubectl.json("get", "deployment", "chat", "-n", namespace)
    assert deployment["metadata"]["generation"] == 1, "nothing may roll before the window"
    assert {"OutOfMemory", "Remediated", "RestartScheduled"} <= events(kubectl, namespace)


def handled(kubectl: Kubectl, namespace: str, count: int) -> dict[str, Any]:
    """The model once ``count`` crashes are in its status."""

    def check() -> dict[str, Any] | None:
        obj = kubectl.json("get", "inferencemodel", "chat", "-n", namespace)
        done = ((obj.get("status") or {}).get("remediation") or {}).get("handledCrashes") or []
        return obj if len(done) == count else None

    return wait_for(check, timeout=30, what=f"crash {count} handled")


def test_a_fix_that_did_not_work_is_not_repeated_the_next_rung_is_taken(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """The sampler warm-up crash halves max_num_seqs; the pod that runs the fix crashes the same way:
    the outcome says the fix recurred, and the next rung (gpu_memory_utilization) is taken instead of
    halving max_num_seqs again."""
    pod = deploy_chat(kubectl, namespace)
    age_container(kubectl, namespace, pod, 0)
    crash_container(kubectl, pod["metadata"]["name"], namespace, "cuda-oom", message=SAMPLER)
    first = handled(kubectl, namespace, 1)["status"]["remediation"]
    assert first["overrides"]["maxNumSeqs"] == 128, first
    assert [t["action"] for t in first["trials"]] == ["lower_max_num_seqs"], first
    new_pod = rolled_out(kubectl, namespace, pod["metadata"]["name"])
    wait_phase(kubectl, namespace, "chat", "Ready")

    # The instance that runs max_num_seqs 128 crashes the same way: the fix did not work.
    age_container(kubectl, namespace, new_pod, 0)
    crash_container(kubectl, new_pod["metadata"]["name"], namespace, "cuda-oom", message=SAMPLER)
    obj = handled(kubectl, namespace, 2)
    remediation = obj["status"]["remediation"]
    assert [(o["action"], o["result"]) for o in remediation["outcomes"]] == [
        ("lower_max_num_seqs", "recurred")
    ], remediation
    assert remediation["outcomeConfidence"] == {"batch_misconfiguration": 0.0}
    assert remediation["overrides"]["maxNumSeqs"] == 128, "the failed fix is not repeated"
    assert remediation["overrides"]["gpuMemoryUtilization"] is not None, remediation
    assert [t["action"] for t in remediation["trials"]] == ["lower_gpu_memory_utilization"]
    assert obj["status"]["incidents"][-1]["result"].startswith("applied"), obj["status"]["incidents"]
    said = event_messages(kubectl, namespace)
    assert any("lower_max_num_seqs" in m and "recurred" in m for m in said.get("RemediationOutcome", [])), (
        said
    )
    rolled_out(kubectl, namespace, new_pod["metadata"]["name"])


def outcome_count(operator: ChartOperator, action: str, result: str) -> float:
    """``loadline_remediation_outcomes_total`` of the active replica for the sampler's class."""
    labels = {"class": "batch_misconfiguration", "action": action, "result": result}
    return metric_total(operator.active(), "loadline_remediation_outcomes_total", **labels)


def test_a_fix_that_held_for_its_horizon_is_judged_worked_without_another_crash(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """The sampler warm-up crash halves max_num_seqs and the new pod serves. The fix holds past its
    horizon (the test dates the fix back, as if the model had served since): the operator judges it
    worked on its own, with no crash to judge it by, in status, an Event and the outcome counter."""
    pod = deploy_chat(kubectl, namespace)
    age_container(kubectl, namespace, pod, 0)
    crash_container(kubectl, pod["metadata"]["name"], namespace, "cuda-oom", message=SAMPLER)
    remediation = handled(kubectl, namespace, 1)["status"]["remediation"]
    assert [t["action"] for t in remediation["trials"]] == ["lower_max_num_seqs"], remediation
    rolled_out(kubectl, namespace, pod["metadata"]["name"])
    wait_phase(kubectl, namespace, "chat", "Ready")
    before = outcome_count(operator, "lower_max_num_seqs", "worked")

    applied = datetime.now(UTC) - timedelta(minutes=OUTCOME_HORIZON_MINUTES + 1)
    dated = applied.replace(microsecond=0).isoformat().replace("+00:00", "Z")
    kubectl("patch", "inferencemodel", "chat", "-n", namespace, "--subresource=status", "--type=json", "-p",
            json.dumps([{"op": "replace", "path": "/status/remediation/trials/0/appliedAt", "value": dated}]))  # fmt: skip

    def judged() -> dict[str, Any] | None:
        obj = kubectl.json("get", "inferencemodel", "chat", "-n", namespace)
        return obj["status"]["remediation"] if obj["status"]["remediation"].get("outcomes") else None

    # The timer looks every twelfth of the horizon (25 s here), then writes.
    remediation = wait_for(judged, timeout=60, what="the fix judged on the clock")
    assert [(o["action"], o["result"]) for o in remediation["outcomes"]] == [("lower_max_num_seqs", "worked")]
    assert remediation["trials"] == [] and remediation["outcomeConfidence"] == {"batch_misconfiguration": 1.0}
    assert remediation["overrides"]["maxNumSeqs"] == 128, "the fix that worked stays"
    said = event_messages(kubectl, namespace).get("RemediationOutcome", [])
    assert any("lower_max_num_seqs" in m and "worked" in m for m in said), said
    assert outcome_count(operator, "lower_max_num_seqs", "worked") == before + 1
    assert kubectl.json("get", "inferencemodel", "chat", "-n", namespace)["status"]["phase"] == "Ready"


def test_a_crash_is_acted_on_once_and_a_fix_that_recurs_with_no_rung_left_needs_a_person(
    operator: ChartOperator,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    """OOMKilled: the memory limit is raised; the pod that runs the raised limit is OOMKilled again.
    Raising it again is the fix that did not work, and host memory has no other rung without a KV
    offload to shrink: the model is Degraded and a person is told what was tried."""
    for round_ in range(2):
        [pod] = [p for p in pods_of(kubectl, namespace, "chat") if p["status"].get("phase") == "Running"] or [
            deploy_chat(kubectl, namespace)
        ]
        crash_container(kubectl, pod["metadata"]["name"], namespace, "oomkilled")

        def counted(expected: int = round_ + 1) -> dict[str, Any] | None:
            obj = kubectl.json("get", "inferencemodel", "chat", "-n", namespace)
            handled = ((obj.get("status") or {}).get("remediation") or {}).get("handledCrashes") or []
            return obj if len(handled) == expected else None

        obj = wait_for(counted, timeout=30, what=f"crash {round_ + 1} handled")
        if round_ < 1:
            try:
                rolled_out(kubectl, namespace, pod["metadata"]["name"])
            except TimeoutError:
                pods = kubectl("get", "pods", "-n", namespace, "-o", "wide")
                raise AssertionError(
                    f"round {round_}: no rollout; {json.dumps(obj['status'])[:3000]}\n{pods}"
                ) from None
    remediation = obj["status"]["remediation"]
    assert remediation["actionsToday"] == 1
    assert obj["status"]["phase"] == "Degraded"
    assert obj["status"]["message"].startswith("needs a person")
    assert "raise_memory_limit" in obj["status"]["message"] and "recurred" in obj["status"]["message"]
    assert {"NeedsAPerson", "RemediationOutcome"} <= events(kubectl, namespace)
    # The same crash seen again (e.g. after an operator restart) is not acted on twice.
    assert len(set(remediation["handledCrashes"])) == 2


RUNTIME_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 0 has a total capacity of "
    "22.05 GiB of which 0.35 GiB is free. Including non-PyTorch memory, this process has 21.68 GiB memory in use. "
    "Of the allocated memory 20.90 GiB is allocated by PyTorch, and 0.31 GiB is reserved by PyTorch but "
    "unallocated."
)


def test_growing_prompts_from_prometheus_blame_the_caller_and_shrink_max_model_len(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, prometheus_url: str
) -> None:
    """The operator reads the minutes before the crash from a real Prometheus: prompts grew from 2k to 30k
    tokens and the KV cache filled up, so it says the callers' prompts are the cause and caps maxModelLen."""
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["spec"].update(maxModelLen=32768, concurrency=1, gpu={"types": ["L4"]})
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    [pod] = pods_of(kubectl, namespace, "chat")
    crash = (int(time.time()) - 300) // STEP * STEP  # five minutes ago, on the scrape grid
    history = dataclasses.replace(llama_0(), namespace=namespace, name=pod["metadata"]["name"])
    source = STATE_DIR / "prometheus" / "oom-e2e.om"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(openmetrics([history], crash))
    backfill = subprocess.run(["bash", str(E2E_DIR / "prometheus.sh"), "backfill", str(source)],
                              capture_output=True, text=True, timeout=180, check=True)  # fmt: skip
    assert backfill.stdout.strip().splitlines()[-1] == prometheus_url  # same Prometheus, same port
    age_container(kubectl, namespace, pod, 3)
    age_readiness(kubectl, namespace, 2)
    fresh = kubectl.json("get", "pod", pod["metadata"]["name"], "-n", namespace)
    at = datetime.fromtimestamp(crash, UTC).isoformat().replace("+00:00", "Z")
    status = crashed_status(fresh, "vllm", termination_for("cuda-oom", RUNTIME_OOM), now=at)
    patch = {"metadata": {"resourceVersion": fresh["metadata"]["resourceVersion"]}, "status": status}
    kubectl("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps(patch))  # fmt: skip
    obj = remediated(kubectl, namespace, "kv_cache_overflow")
    incident = obj["status"]["incidents"][-1]
    assert incident["callerSide"] is True
    assert any("caller" in line for line in incident["evidence"])
    assert obj["status"]["remediation"]["overrides"]["maxModelLen"] < 32768
    assert "CallerSidePrompts" in events(kubectl, namespace)


def climbing_gpu_memory(namespace: str, pod: str) -> Pod:
    """Two hours of a pod's history whose GPU memory climbs 2.5 GiB an hour toward an L4's 22 GiB."""
    return Pod(
        namespace, pod, ("vllm:kv_cache_usage_perc",),
        lambda t: 0.4, lambda t: 3.0, lambda t: 2000, lambda t: 0,
        lambda t: 1024.0 * (15.0 + 2.5 * (t + HISTORY) / 3600),  # MiB: 15 GiB two hours ago, 20 GiB now
        after_crash=0,
    )  # fmt: skip


def test_growing_gpu_memory_in_prometheus_is_an_oom_risk_before_any_crash(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, prometheus_url: str
) -> None:
    """Two hours of dcgm-exporter history in which the model's GPU memory climbs 2.5 GiB an hour toward
    the L4's 22 GiB: before anything crashed, the operator predicts when it will, says why in the
    OOMRisk condition and an Event, and nothing restarts."""
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["spec"].update(gpu={"types": ["L4"]})
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    [pod] = pods_of(kubectl, namespace, "chat")
    end = (int(time.time()) - 60) // STEP * STEP  # the last scrape a minute ago
    climbing = climbing_gpu_memory(namespace, pod["metadata"]["name"])
    source = STATE_DIR / "prometheus" / "risk-e2e.om"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(openmetrics([climbing], end))
    subprocess.run(["bash", str(E2E_DIR / "prometheus.sh"), "backfill", str(source)],
                   capture_output=True, text=True, timeout=180, check=True)  # fmt: skip

    def predicted() -> dict[str, Any] | None:
        status = kubectl.json("get", "inferencemodel", "chat", "-n", namespace).get("status") or {}
        risk = status.get("oomRisk") or {}
        return status if risk.get("predictedAt") else None

    status = wait_for(predicted, timeout=90, what="an OOM-risk prediction in status")
    risk = status["oomRisk"]
    assert risk["signal"] == "gpu_memory" and risk["limit"] == status["plan"]["memory"]["totalGiB"]
    assert 2.0 < risk["slopePerHour"] < 3.0  # the climb's own slope, robustly fitted
    hours = (datetime.fromisoformat(risk["predictedAt"].replace("Z", "+00:00")).timestamp() - end) / 3600
    assert 0.5 < hours < 1.2  # (22.05 - 20) GiB at 2.5 GiB/h
    [condition] = [c for c in status["conditions"] if c["type"] == "OOMRisk"]
    assert condition["status"] == "True" and condition["reason"] == "GpuMemoryGrowing"
    assert "GPU memory" in condition["message"]
    assert "OOMRisk" in events(kubectl, namespace)
    assert [p["metadata"]["name"] for p in pods_of(kubectl, namespace, "chat")] == [pod["metadata"]["name"]]
