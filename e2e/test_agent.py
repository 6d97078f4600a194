"""The GPU node agent end to end: fake NVML → real pynvml → ``loadline agent`` → a real Prometheus → the
operator's GPU-memory trend; and the chart's DaemonSet, rendered and dry-run applied to the API server.

The agent runs as a process against the fake ``libnvidia-ml.so.1`` (tests/fake_nvml) whose script a
thread rewrites every half second: the vLLM container's memory on GPU 0 grows at a known rate. A
Prometheus of its own (Debian's, from the cache; its own port and data dir, so it never disturbs
e2e/prometheus.sh's) scrapes the agent every second. ``loadline.traffic.incident_metrics``, the call the
operator makes for an out-of-memory incident, must then read that growth from Prometheus.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import inference_model
from tests.fake_nvml import GIB, FakeGPU, build, nvml_env, write_script

from chart import OPERATOR_NAMESPACE, ChartOperator, install, render, uninstall
from kube import Kubectl, answers, lib_var, wait_for
from loadline.status import read_status
from loadline.status.build import planned_gpu_gib
from loadline.traffic import gpu_memory_used_query, incident_metrics, measured_gpu_memory
from operator_helpers import model, pods_of, wait_phase

CID = "c0" * 32
UID = "7d0e6f42-1c1b-4c55-9d2e-5a3b2c1d0e9f"
GROWTH_BYTES_PER_S = GIB // 16  # 225 GiB per hour: unmistakable within a minute of samples
BASE = 60 * GIB
SCRAPE_SECONDS = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    agent_port: int
    prometheus_url: str
    started: float
    proc_root: Path
    containers: Path
    #: Further processes on GPU 1 (host pid, bytes) a test adds; the script is rewritten within 0.5 s.
    extra: list[tuple[int, int]]


def _wait_http(url: str, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    def ok() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited:\n{log.read_text()[-3000:]}")
        return answers(url)

    wait_for(ok, timeout=60, what=what, interval=0.2)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("agent-e2e")
    libdir = build(root / "nvml")
    # The node: one vLLM process of team-a/vllm-llama-0 on GPU 0, seen through cgroup v2 + containerd.
    proc_root, containers = root / "proc", root / "containers"
    (proc_root / "4242").mkdir(parents=True)
    (proc_root / "4242" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
        f"/cri-containerd-{CID}.scope\n"
    )
    containers.mkdir()
    (containers / f"vllm-llama-0_team-a_vllm-{CID}.log").touch()

    script = root / "gpus.txt"
    started = time.time()

    extra: list[tuple[int, int]] = []

    def gpus() -> list[FakeGPU]:
        used = BASE + int((time.time() - started) * GROWTH_BYTES_PER_S)
        gpu1 = GIB + sum(size for _pid, size in extra)
        return [
            FakeGPU("GPU-e2e00000", used=used, procs=[(4242, used)]),
            FakeGPU("GPU-e2e11111", used=gpu1, procs=list(extra)),
        ]

    write_script(script, gpus())
    stop = threading.Event()

    def grow() -> None:
        while not stop.wait(0.5):
            write_script(script, gpus())

    grower = threading.Thread(target=grow, daemon=True)
    grower.start()

    agent_port = free_port()
    agent_log = root / "agent.log"
    agent = subprocess.Popen(
        [sys.executable, "-m", "loadline", "agent", "--port", str(agent_port), "--address", "127.0.0.1",
         "--node", "gpu-node-e2e", "--proc-root", str(proc_root), "--containers-dir", str(containers)],
        env=nvml_env(libdir, script), stdout=agent_log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    prom_port = free_port()
    prom_log = root / "prometheus.log"
    config = root / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": "15s"},
                "scrape_configs": [
                    {
                        "job_name": "loadline-agent",
                        "honor_labels": True,  # the agent's namespace/pod are the workload's, keep them
                        "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}],
                    }
                ],
            }
        )
    )
    prometheus = subprocess.Popen(
        [str(Path(lib_var("PROMETHEUS_BIN")) / "prometheus"), f"--config.file={config}",
         f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=prom_log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_http(f"http://127.0.0.1:{agent_port}/metrics", "the agent", agent, agent_log)
        url = f"http://127.0.0.1:{prom_port}"
        _wait_http(f"{url}/-/ready", "prometheus", prometheus, prom_log)
        yield Running(agent_port, url, started, proc_root, containers, extra)
    finally:
        stop.set()
        for proc in (prometheus, agent):
            proc.terminate()
        for proc in (prometheus, agent):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        grower.join(timeout=5)


def _query(url: str, promql: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}") as r:
        result: list[dict[str, object]] = json.load(r)["data"]["result"]
    return result


def test_prometheus_scrapes_the_agents_series(running: Running) -> None:
    def scraped() -> list[dict[str, object]]:
        return _query(running.prometheus_url, 'loadline_gpu_container_memory_used_bytes{pod="vllm-llama-0"}')

    (series,) = wait_for(scraped, timeout=30, what="the agent's series in Prometheus")
    labels = series["metric"]
    assert isinstance(labels, dict)
    assert {k: labels[k] for k in ("namespace", "pod", "container", "uuid", "product", "node")} == {
        "namespace": "team-a",
        "pod": "vllm-llama-0",
        "container": "vllm",
        "uuid": "GPU-e2e00000",
        "product": "NVIDIA-H100-80GB-HBM3",
        "node": "gpu-node-e2e",
    }


def test_the_operator_reads_the_gpu_memory_trend_from_the_agent(running: Running) -> None:
    # Enough scrapes for deriv to see the slope through the noise of the script's half-second steps.
    time.sleep(max(0.0, running.started + 25 - time.time()))
    m = incident_metrics(running.prometheus_url, "team-a", "vllm-llama-0", time.time(), "0.19.0")
    expected = GROWTH_BYTES_PER_S * 3600 / GIB  # 225 GiB per hour
    assert m["gpu_memory_growth_gib_per_hour"] == pytest.approx(expected, rel=0.1), m
    # A neighbour with no GPU process has no trend at all (no DCGM fallback to blame it with).
    assert "gpu_memory_growth_gib_per_hour" not in incident_metrics(
        running.prometheus_url, "team-a", "vllm-llama-1", time.time(), "0.19.0"
    )


def test_measured_use_beside_the_plan(running: Running) -> None:
    with urllib.request.urlopen(
        f"{running.prometheus_url}/api/v1/query?"
        + urllib.parse.urlencode({"query": gpu_memory_used_query("team-a", "vllm-llama-0")})
    ) as r:
        answer = json.load(r)
    measured = measured_gpu_memory({"vllm-llama-0": answer}, planned_gib=70.0)
    assert measured is not None
    assert measured["gpus"] == 1  # GPU 1 holds nothing of this pod
    assert 60 <= float(measured["maxUsedGiB"]) <= 60 + (time.time() - running.started) / 16 + 1


def test_the_chart_daemonset_is_accepted_by_the_api_server(kubectl: Kubectl, namespace: str) -> None:
    docs = render("loadline", namespace, {"agent": {"enabled": True}}, include_crds=False)
    agent_docs = [d for d in docs if d["metadata"]["name"].endswith("-agent")]
    assert sorted(d["kind"] for d in agent_docs) == ["DaemonSet", "ServiceAccount"]
    (ds,) = (d for d in agent_docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostPID"] is True and "hostNetwork" not in pod
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["privileged"] is False
    assert [v["hostPath"]["path"] for v in pod["volumes"]] == ["/var/log/containers"]
    assert all(m["readOnly"] for m in container["volumeMounts"])
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # The operator's Deployment must not select the agent's pods.
    (deployment,) = (d for d in docs if d["kind"] == "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert not all(pod_labels.get(k) == v for k, v in selector.items())
    out = kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-",
        input="\n---\n".join(yaml.safe_dump(d) for d in agent_docs),
    )  # fmt: skip
    assert "daemonset.apps/loadline-loadline-agent created (server dry run)" in out
    # Off by default: no agent objects at all.
    assert not [
        d for d in render("loadline", namespace, {}, include_crds=False) if "agent" in d["metadata"]["name"]
    ]


# --- the chart's operator writes the measured use into status, beside the plan ---

MEASURE_SECONDS = 2


@pytest.fixture
def measuring_operator(kubectl: Kubectl, namespace: str, running: Running) -> Iterator[ChartOperator]:
    """The chart installed as a platform team would with the agent: its Prometheus (the one scraping
    the agent above) and a short measuring interval. A release of its own that watches only the test's
    namespace (and its own Lease), so it never shares a model with the session's operator."""
    values = {
        "replicas": 1,
        "leaderElection": {"leaseName": "loadline-measure"},
        "settings": {
            "namespaces": namespace,
            "prometheusUrl": running.prometheus_url,
            "measureIntervalSeconds": MEASURE_SECONDS,
            "retryDelaySeconds": 3,
        },
    }
    chart = install(kubectl, "measure", OPERATOR_NAMESPACE, values)
    try:
        chart.active(timeout=60)
        yield chart
    finally:
        # Its models go first, while it still runs (none has a finalizer; the order only keeps the log tidy).
        kubectl.run("delete", "inferencemodels", "--all", "-n", namespace, "--timeout=60s", check=False)
        uninstall(chart)
        kubectl.run("delete", "lease", "loadline-measure", "-n", OPERATOR_NAMESPACE, check=False)


def _place_on_gpu(running: Running, pod: dict[str, Any], pid: int, size: int) -> None:
    """A vLLM process of ``pod`` (the real pod the Deployment made) on GPU 1, as the node shows it:
    its cgroup names the pod's UID and a container ID, the kubelet's log symlink maps that ID to the pod."""
    meta = pod["metadata"]
    cid = f"{pid:064x}"
    (running.proc_root / str(pid)).mkdir()
    (running.proc_root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{meta['uid'].replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
    )
    container = pod["spec"]["containers"][0]["name"]
    (running.containers / f"{meta['name']}_{meta['namespace']}_{container}-{cid}.log").touch()
    running.extra.append((pid, size))


def test_status_shows_the_measured_use_beside_the_plan(
    measuring_operator: ChartOperator, kubectl: Kubectl, namespace: str, running: Running
) -> None:
    doc = inference_model()
    doc["metadata"] = {"name": "measured", "namespace": namespace}
    kubectl.apply(doc, namespace)
    obj = wait_phase(kubectl, namespace, "measured", "Ready", timeout=90)
    planned = planned_gpu_gib(read_status(obj).plan)
    assert planned is not None and planned > 1
    (pod,) = pods_of(kubectl, namespace, "measured")
    assert pod["status"]["phase"] == "Running"
    # No GPU process of the model yet: nothing measured, nothing written.
    time.sleep(2 * MEASURE_SECONDS + 1)
    assert "measuredGpuMemory" not in model(kubectl, namespace, "measured")["status"]

    # The model's vLLM process holds 1.5 GiB more than the plan on GPU 1.
    _place_on_gpu(running, pod, 5151, int((planned + 1.5) * GIB))

    def measured() -> dict[str, Any] | None:
        status = model(kubectl, namespace, "measured")["status"]
        reading: dict[str, Any] | None = status.get("measuredGpuMemory")
        return reading

    reading = wait_for(measured, timeout=60, what="status.measuredGpuMemory", interval=0.5)
    assert {k: reading[k] for k in ("gpus", "source", "plannedGiB")} == {
        "gpus": 1,
        "source": "loadline-agent",
        "plannedGiB": planned,
    }
    assert reading["maxUsedGiB"] == pytest.approx(planned + 1.5, abs=0.02)
    assert reading["driftGiB"] == pytest.approx(1.5, abs=0.02)
    assert reading["time"].endswith("Z")
    # `kubectl get -o wide` shows it beside the plan.
    header, row = kubectl("get", "inferencemodel", "measured", "-n", namespace, "-o", "wide").splitlines()
    assert "GPU-USED-GIB" in header.split()
    assert float(row.split()[header.split().index("GPU-USED-GIB")]) == reading["maxUsedGiB"]

    # Idle: readings within 0.5 GiB of the stored one write nothing.
    version = model(kubectl, namespace, "measured")["metadata"]["resourceVersion"]
    running.extra[-1] = (5151, int((planned + 1.7) * GIB))
    time.sleep(3 * MEASURE_SECONDS + 1)
    assert model(kubectl, namespace, "measured")["metadata"]["resourceVersion"] == version

    # Growth by a GiB is written.
    running.extra[-1] = (5151, int((planned + 2.5) * GIB))
    grown = wait_for(
        lambda: (r := measured()) is not None and r["maxUsedGiB"] > planned + 2 and r,
        timeout=30,
        what="the grown reading in status",
        interval=0.5,
    )
    assert grown["driftGiB"] == pytest.approx(2.5, abs=0.02)
