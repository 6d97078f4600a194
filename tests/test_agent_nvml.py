"""``loadline agent`` and ``loadline gpus --probe`` against a fake libnvidia-ml.so.1, through the real pynvml.

Each test runs the CLI as a subprocess with ``LD_LIBRARY_PATH`` pointing at the fake library built from
tests/fake_nvml/fake_nvml.c, a scripted GPU state, a fake ``/proc`` (the processes' cgroups) and a fake
``/var/log/containers``; the agent is scraped over HTTP like Prometheus does.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_nvml import (
    DRIVER_NOT_LOADED,
    GIB,
    GPU_IS_LOST,
    NOT_SUPPORTED,
    FakeGPU,
    build,
    nvml_env,
    write_script,
)

CID_A = "a" * 64
CID_B = "b" * 64
UID_A = "5f1c1d2e-0000-4000-8000-00000000000a"
UID_B = "5f1c1d2e-0000-4000-8000-00000000000b"


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("nvml"))


@pytest.fixture(scope="module")
def libdir_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("nvml-v1"), memory_v2=False)


@dataclass
class Node:
    """A fake node: its /proc (cgroups of GPU processes) and /var/log/containers."""

    root: Path

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def containers(self) -> Path:
        return self.root / "containers"

    def process(self, pid: int, cgroup: str) -> None:
        (self.proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.proc / str(pid) / "cgroup").write_text(cgroup)

    def container(self, namespace: str, pod: str, container: str, cid: str) -> None:
        self.containers.mkdir(parents=True, exist_ok=True)
        (self.containers / f"{pod}_{namespace}_{container}-{cid}.log").touch()


def systemd_cgroup(uid: str, cid: str) -> str:
    """cgroup v2 with the systemd driver and containerd, as a process in a Burstable pod shows it."""
    u = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{cid}.scope\n"


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = Node(tmp_path / "node")
    n.proc.mkdir(parents=True)
    n.containers.mkdir(parents=True)
    n.process(1001, systemd_cgroup(UID_A, CID_A))  # team-a/vllm-0 rank 0 on GPU 0
    n.process(1002, systemd_cgroup(UID_A, CID_A))  # team-a/vllm-0 rank 1 on GPU 1
    n.process(2001, f"12:memory:/kubepods/besteffort/pod{UID_B}/{CID_B}\n")  # cgroup v1, cgroupfs
    n.process(3001, "0::/system.slice/nv-hostengine.service\n")  # a host daemon, not in a pod
    n.container("team-a", "vllm-0", "vllm", CID_A)
    n.container("team-b", "embed-7f9c", "server", CID_B)
    return n


def two_h100s() -> list[FakeGPU]:
    return [
        FakeGPU("GPU-0000aaaa", used=70 * GIB, procs=[(1001, 70 * GIB)], nvlink=True),
        FakeGPU(
            "GPU-1111bbbb",
            used=75 * GIB,
            procs=[(1002, 70 * GIB), (2001, 4 * GIB), (3001, 1 * GIB)],
            nvlink=True,
        ),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Samples = dict[str, list[tuple[dict[str, str], float]]]


class Agent:
    """``loadline agent`` as a subprocess on the fake node."""

    def __init__(self, env: dict[str, str], node: Node, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loadline", "agent", "--port", str(self.port), "--address", "127.0.0.1",
             "--node", "gpu-node-1", "--proc-root", str(node.proc), "--containers-dir", str(node.containers),
             "--min-interval", "0"],
            env=env, stdout=self._out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                self.scrape()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"the agent did not serve /metrics:\n{self.output()}") from None
                time.sleep(0.1)

    def scrape(self) -> Samples:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
            text = response.read().decode()
        out: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return out

    def output(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        code = self.proc.wait(timeout=10)
        self._out.close()
        return code


@pytest.fixture
def run_agent(node: Node, tmp_path: Path) -> Iterator[Any]:
    agents: list[Agent] = []

    def start(env: dict[str, str]) -> Agent:
        agents.append(Agent(env, node, tmp_path / f"agent-{len(agents)}.log"))
        return agents[-1]

    yield start
    for agent in agents:
        agent.stop()


def per_read(agent: Agent, metric: str, /, **labels: str) -> float:
    """How much a counter grows with one read (each scrape is one read with --min-interval 0)."""
    before = value(agent.scrape(), metric, **labels) or 0.0
    return (value(agent.scrape(), metric, **labels) or 0.0) - before


def value(samples: Samples, metric: str, /, **labels: str) -> float | None:
    """The value of the one sample of ``metric`` whose labels include ``labels`` (None: no such sample)."""
    found = [v for lab, v in samples.get(metric, []) if all(lab.get(k) == want for k, want in labels.items())]
    assert len(found) <= 1, (metric, labels, found)
    return found[0] if found else None


def test_agent_exports_memory_per_gpu_container_and_process(
    libdir: Path, node: Node, tmp_path: Path, run_agent: Any
) -> None:
    script = write_script(tmp_path / "gpus.txt", two_h100s())
    agent = run_agent(nvml_env(libdir, script))
    s = agent.scrape()
    gpu0 = {"node": "gpu-node-1", "gpu": "0", "uuid": "GPU-0000aaaa", "product": "NVIDIA-H100-80GB-HBM3"}
    assert value(s, "loadline_agent_nvml_up") == 1
    assert value(s, "loadline_agent_gpus") == 2
    # v2 memory: used excludes the driver's reserve, which has its own series.
    assert value(s, "loadline_gpu_memory_total_bytes", **gpu0) == 81559 * 1024**2
    assert value(s, "loadline_gpu_memory_used_bytes", **gpu0) == 70 * GIB
    assert value(s, "loadline_gpu_memory_reserved_bytes", **gpu0) == 471 * 1024**2
    assert value(s, "loadline_gpu_memory_free_bytes", **gpu0) == (81559 - 471) * 1024**2 - 70 * GIB
    assert value(s, "loadline_gpu_info", **gpu0, name="NVIDIA H100 80GB HBM3", compute_capability="9.0") == 1
    # The tensor-parallel pod holds both GPUs; each GPU's series names it.
    for gpu, uuid in (("0", "GPU-0000aaaa"), ("1", "GPU-1111bbbb")):
        used = value(
            s, "loadline_gpu_container_memory_used_bytes",
            gpu=gpu, uuid=uuid, namespace="team-a", pod="vllm-0", container="vllm",
        )  # fmt: skip
        assert used == 70 * GIB
    assert (
        value(s, "loadline_gpu_process_memory_used_bytes", pid="2001", namespace="team-b", pod="embed-7f9c")
        == 4 * GIB
    )
    # A process outside Kubernetes is still shown (it takes memory from the GPU), without a pod.
    assert value(s, "loadline_gpu_process_memory_used_bytes", pid="3001", namespace="", pod="") == 1 * GIB
    assert per_read(agent, "loadline_agent_pod_lookup_failures_total", reason="not_in_a_pod") == 1
    assert value(s, "loadline_agent_nvml_errors_total") is None
    assert agent.stop() == 0  # SIGTERM: a clean exit


def test_each_scrape_reads_the_gpus_anew(libdir: Path, node: Node, tmp_path: Path, run_agent: Any) -> None:
    gpus = two_h100s()
    script = write_script(tmp_path / "gpus.txt", gpus)
    agent = run_agent(nvml_env(libdir, script))
    gpus[0].used, gpus[0].procs = 72 * GIB, [(1001, 72 * GIB)]
    gpus[1].procs = [(1002, 70 * GIB)]  # team-b's process ended
    write_script(script, gpus)
    s = agent.scrape()
    assert value(s, "loadline_gpu_container_memory_used_bytes", uuid="GPU-0000aaaa", pod="vllm-0") == 72 * GIB
    assert value(s, "loadline_gpu_process_memory_used_bytes", pid="2001") is None  # no stale series
    assert value(s, "loadline_gpu_container_memory_used_bytes", pod="embed-7f9c") is None


def test_a_gpu_fallen_off_the_bus_costs_that_gpu_only(
    libdir: Path, node: Node, tmp_path: Path, run_agent: Any
) -> None:
    gpus = two_h100s()
    gpus[1].errors = {"*": GPU_IS_LOST}
    script = write_script(tmp_path / "gpus.txt", gpus)
    agent = run_agent(nvml_env(libdir, script))
    s = agent.scrape()
    assert value(s, "loadline_agent_gpus") == 1
    assert value(s, "loadline_gpu_memory_used_bytes", uuid="GPU-0000aaaa") == 70 * GIB
    assert value(s, "loadline_gpu_memory_used_bytes", uuid="GPU-1111bbbb") is None
    lost = value(
        s, "loadline_agent_nvml_errors_total", call="nvmlDeviceGetHandleByIndex", error="GPU_IS_LOST"
    )
    assert lost is not None and lost >= 1
    # The GPU comes back (reset): its figures return, and the log says both transitions once.
    gpus[1].errors = {}
    write_script(script, gpus)
    s = agent.scrape()
    assert value(s, "loadline_gpu_memory_used_bytes", uuid="GPU-1111bbbb") == 75 * GIB
    assert agent.proc.poll() is None
    log = agent.output()
    assert log.count("GPU 1: nvmlDeviceGetHandleByIndex failed with NVML error GPU_IS_LOST") == 1, log
    assert "GPU 1: nvmlDeviceGetHandleByIndex works again" in log
    assert "Traceback" not in log


def test_not_supported_values_are_counted_and_the_rest_exported(
    libdir: Path, node: Node, tmp_path: Path, run_agent: Any
) -> None:
    gpus = two_h100s()
    gpus[0].errors = {"nvmlDeviceGetComputeRunningProcesses_v3": NOT_SUPPORTED}
    gpus[1].procs = [(1002, 70 * GIB), (2001, -1)]  # NVML cannot tell the second process's memory
    script = write_script(tmp_path / "gpus.txt", gpus)
    agent = run_agent(nvml_env(libdir, script))
    s = agent.scrape()
    assert value(s, "loadline_gpu_memory_used_bytes", uuid="GPU-0000aaaa") == 70 * GIB
    assert value(s, "loadline_gpu_container_memory_used_bytes", uuid="GPU-0000aaaa") is None
    call = "nvmlDeviceGetComputeRunningProcesses"
    assert per_read(agent, "loadline_agent_nvml_errors_total", call=call, error="NOT_SUPPORTED") == 1
    assert per_read(agent, "loadline_agent_nvml_errors_total", call=call, error="VALUE_NOT_AVAILABLE") == 1
    assert value(s, "loadline_gpu_process_memory_used_bytes", pid="2001") is None
    assert value(s, "loadline_gpu_process_memory_used_bytes", pid="1002") == 70 * GIB


def test_processes_that_exit_mid_read_are_left_out(
    libdir: Path, node: Node, tmp_path: Path, run_agent: Any
) -> None:
    gpus = two_h100s()
    gpus[0].procs = [(1001, 70 * GIB), (4242, 1 * GIB)]  # 4242 exits before its /proc entry is read
    gpus[1].vanish = 1  # and one process on GPU 1 exits between NVML's sizing call and the list
    script = write_script(tmp_path / "gpus.txt", gpus)
    agent = run_agent(nvml_env(libdir, script))
    s = agent.scrape()
    assert value(s, "loadline_gpu_process_memory_used_bytes", pid="4242") is None
    assert per_read(agent, "loadline_agent_pod_lookup_failures_total", reason="exited") == 1
    on_gpu1 = [lab["pid"] for lab, _ in s["loadline_gpu_process_memory_used_bytes"] if lab["gpu"] == "1"]
    assert on_gpu1 == ["1002", "2001"]
    assert value(s, "loadline_agent_nvml_errors_total") is None


def test_a_driver_without_the_v2_memory_call_falls_back_to_v1(
    libdir_v1: Path, node: Node, tmp_path: Path, run_agent: Any
) -> None:
    script = write_script(tmp_path / "gpus.txt", two_h100s())
    s = run_agent(nvml_env(libdir_v1, script)).scrape()
    # v1's used includes the reserve; there is no reserve series and no error.
    assert value(s, "loadline_gpu_memory_used_bytes", uuid="GPU-0000aaaa") == 70 * GIB + 471 * 1024**2
    assert value(s, "loadline_gpu_memory_reserved_bytes", uuid="GPU-0000aaaa") is None
    assert value(s, "loadline_agent_nvml_errors_total") is None


def test_no_library_keeps_the_agent_up_and_says_so(node: Node, tmp_path: Path, run_agent: Any) -> None:
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    agent = run_agent(nvml_env(empty, tmp_path / "absent.txt"))
    s = agent.scrape()
    assert value(s, "loadline_agent_nvml_up") == 0
    assert value(s, "loadline_agent_gpus") == 0
    assert (
        value(s, "loadline_agent_nvml_errors_total", call="nvmlInit", error="LIBRARY_NOT_FOUND") or 0
    ) >= 1
    assert agent.proc.poll() is None
    assert "nvmlInit failed with NVML error LIBRARY_NOT_FOUND" in agent.output()


def test_a_driver_that_loads_later_is_picked_up(
    libdir: Path, node: Node, tmp_path: Path, run_agent: Any
) -> None:
    script = write_script(tmp_path / "gpus.txt", two_h100s(), init=DRIVER_NOT_LOADED)
    agent = run_agent(nvml_env(libdir, script))
    s = agent.scrape()
    assert value(s, "loadline_agent_nvml_up") == 0
    assert (
        value(s, "loadline_agent_nvml_errors_total", call="nvmlInit", error="DRIVER_NOT_LOADED") or 0
    ) >= 1
    write_script(script, two_h100s())
    s = agent.scrape()
    assert value(s, "loadline_agent_nvml_up") == 1
    assert value(s, "loadline_agent_gpus") == 2


def test_a_node_without_gpus_exports_zero(libdir: Path, node: Node, tmp_path: Path, run_agent: Any) -> None:
    script = write_script(tmp_path / "gpus.txt", [])
    s = run_agent(nvml_env(libdir, script)).scrape()
    assert value(s, "loadline_agent_nvml_up") == 1
    assert value(s, "loadline_agent_gpus") == 0
    assert "loadline_gpu_memory_used_bytes" not in s


def probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadline", "gpus", "--probe"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_probe_prints_a_catalog_entry_for_the_local_gpus(libdir: Path, tmp_path: Path) -> None:
    gpus = [
        FakeGPU(f"GPU-{i}", name="NVIDIA RTX PRO 6000 Blackwell Server Edition", total=97887 * 1024**2,
                reserved=512 * 1024**2, cc=(12, 0), nvlink=False)
        for i in range(4)
    ]  # fmt: skip
    result = probe(nvml_env(libdir, write_script(tmp_path / "gpus.txt", gpus, driver="580.65.06")))
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads(result.stdout)["gpus"]
    assert entry["product"] == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"  # as GFD labels the node
    assert entry["name"] == "RTX-PRO-6000-Blackwell-Server-Edition"
    assert entry["memory_gib"] == round((97887 - 512) / 1024, 2)  # what CUDA reports as total
    assert entry["gpus_per_node"] == [4]
    assert entry["compute_capability"] == 12.0
    assert (entry["bf16"], entry["fp8"], entry["flash_attention"]) == (True, True, True)
    assert entry["interconnect"] == "pcie"
    assert "580.65.06" in entry["source"]


def test_probe_output_is_a_catalog_the_planner_uses(libdir: Path, tmp_path: Path) -> None:
    gpus = [
        FakeGPU(f"GPU-{i}", name="NVIDIA B200", total=183359 * 1024**2, cc=(10, 0), nvlink=True)
        for i in range(8)
    ]
    result = probe(nvml_env(libdir, write_script(tmp_path / "gpus.txt", gpus)))
    assert result.returncode == 0, result.stderr
    catalog = tmp_path / "catalog.json"
    catalog.write_text(result.stdout)
    entry = json.loads(result.stdout)["gpus"][0]
    assert entry["interconnect"] == "nvlink" and entry["gpus_per_node"] == [8]
    model = tmp_path / "model.yaml"
    model.write_text(
        "apiVersion: loadline.dev/v1alpha1\nkind: InferenceModel\nmetadata: {name: chat, namespace: team-a}\n"
        "spec:\n  model: {name: meta-llama/Llama-3.1-8B-Instruct}\n  maxModelLen: 8192\n  concurrency: 4\n"
        "  gpu: {types: [NVIDIA-B200]}\n"
    )
    env = {"LOADLINE_GPU_CATALOG": str(catalog), "PATH": "/usr/bin:/bin"}
    plan = subprocess.run(
        [sys.executable, "-m", "loadline", "plan", str(model), "--output", "json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    [planned] = [item["plan"] for item in json.loads(plan.stdout)]
    assert (planned["gpuType"], planned["gpuProduct"]) == ("B200", "NVIDIA-B200")


def test_probe_without_nvml_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    result = probe(nvml_env(empty, tmp_path / "absent.txt"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "loadline: NVML: nvmlInit failed with LIBRARY_NOT_FOUND (fix: run it on a node with the NVIDIA "
        "driver, or put libnvidia-ml.so.1 on LD_LIBRARY_PATH)"
    ]


def test_probe_on_a_machine_without_gpus_is_one_line(libdir: Path, tmp_path: Path) -> None:
    result = probe(nvml_env(libdir, write_script(tmp_path / "gpus.txt", [])))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "no usable GPU" in result.stderr and "Traceback" not in result.stderr
