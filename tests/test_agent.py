"""The agent's pure parts: pod mapping from cgroups and log names, product names, the user GPU catalog."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loadline.agent import (
    METRIC_NAMES,
    ContainerRef,
    Failure,
    NodeReading,
    NvmlUnavailableError,
    Owner,
    PodResolver,
    error_name,
    gfd_product,
    load_pynvml,
    parse_cgroup,
    parse_container_log_name,
    require_gpus,
)
from loadline.cli import main
from loadline.errors import SpecError
from loadline.sizing import find_gpu, gpu_catalog
from loadline.sizing._data import GPU_CATALOG_ENV

UID = "0b9e5c1a-3f2d-4c7e-9a10-2f6d8e4b7c21"
CID = "4f" * 32
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver, containerd (the common case today)
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
        # the same seen from inside another cgroup namespace (the agent's own container)
        f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
        # Guaranteed QoS (no QoS slice), docker
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope",
        # cgroup v1, cgroupfs driver: many hierarchies, the pod path in each
        f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n0::/",
    ],
)
def test_the_cgroup_names_pod_and_container(text: str) -> None:
    assert parse_cgroup(text) == ContainerRef(UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/containerd.service",
        "0::/user.slice/user-1000.slice/session-3.scope",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice",  # the pod, no container
        "",
    ],
)
def test_processes_outside_a_container_have_no_pod(text: str) -> None:
    assert parse_cgroup(text) is None


def test_container_log_names_map_ids_to_pods() -> None:
    assert parse_container_log_name(f"vllm-llama-7d9f-x2k4p_team-a_vllm-engine-{CID}.log") == (
        CID,
        Owner("team-a", "vllm-llama-7d9f-x2k4p", "vllm-engine"),
    )
    for bad in ("kube-proxy.log", f"a_b-{CID}.log", f"a_b_c-{CID[:-1]}.log", f"a_b_c-{CID}.txt"):
        assert parse_container_log_name(bad) is None


def test_resolver_reads_proc_and_the_log_directory(tmp_path: Path) -> None:
    proc, logs = tmp_path / "proc", tmp_path / "containers"
    (proc / "10").mkdir(parents=True)
    (proc / "10" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    (proc / "11").mkdir()
    (proc / "11" / "cgroup").write_text("0::/system.slice/sshd.service\n")
    (proc / "12").mkdir()
    (proc / "12" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{'9' * 64}\n")
    logs.mkdir()
    (logs / f"vllm-0_team-a_vllm-{CID}.log").symlink_to("/nonexistent/0.log")  # names only: never followed
    owners, problems = PodResolver(proc, logs).resolve([10, 11, 12, 13])
    assert owners == {10: Owner("team-a", "vllm-0", "vllm"), 11: Owner(), 12: Owner()}
    assert sorted(problems) == ["exited", "not_in_a_pod", "unknown_container"]


def test_resolver_without_a_log_directory_still_answers(tmp_path: Path) -> None:
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    owners, problems = PodResolver(tmp_path, tmp_path / "absent").resolve([5])
    assert owners == {5: Owner()} and problems == ["unknown_container"]


@pytest.mark.parametrize(
    ("driver", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("  NVIDIA   L40S ", "NVIDIA-L40S"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"),
        ("X" * 80, "X" * 63),
    ],
)
def test_product_names_match_gpu_feature_discovery(driver: str, label: str) -> None:
    assert gfd_product(driver) == label


def test_bundled_catalog_products_are_gfd_names() -> None:
    # A product the agent exports must be able to equal a catalog product: same alphabet, same joiner.
    for gpu in gpu_catalog().values():
        assert gfd_product(gpu.product.replace("-", " ")) == gpu.product


def test_error_names_come_from_the_binding() -> None:
    nvml = load_pynvml()
    assert error_name(nvml, nvml.NVMLError(nvml.NVML_ERROR_GPU_IS_LOST)) == "GPU_IS_LOST"
    assert error_name(nvml, nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)) == "NOT_SUPPORTED"
    assert error_name(nvml, nvml.NVMLError(12345)) == "CODE_12345"


def test_require_gpus_names_the_failure_and_the_fix() -> None:
    with pytest.raises(NvmlUnavailableError, match=r"nvmlInit failed with DRIVER_NOT_LOADED \(fix: load the"):
        require_gpus(NodeReading(up=False, failures=(Failure("nvmlInit", "DRIVER_NOT_LOADED"),)))
    with pytest.raises(NvmlUnavailableError, match="GPU 0: nvmlDeviceGetHandleByIndex GPU_IS_LOST"):
        require_gpus(
            NodeReading(up=True, failures=(Failure("nvmlDeviceGetHandleByIndex", "GPU_IS_LOST", 0),))
        )


def test_every_metric_is_documented() -> None:
    doc = (REPO / "docs" / "agent.md").read_text()
    documented = set(re.findall(r"`(loadline_(?:gpu|agent)_[a-z_]+)", doc))
    assert set(METRIC_NAMES) <= documented, set(METRIC_NAMES) - documented


# --- user GPU catalog (LOADLINE_GPU_CATALOG) ------------------------------------------------------


@pytest.fixture
def user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def use(content: str, name: str = "gpus.yaml") -> Path:
        path = tmp_path / name
        path.write_text(content)
        monkeypatch.setenv(GPU_CATALOG_ENV, str(path))
        gpu_catalog.cache_clear()
        return path

    yield use
    monkeypatch.delenv(GPU_CATALOG_ENV, raising=False)
    gpu_catalog.cache_clear()


B200 = {
    "name": "B200", "product": "NVIDIA-B200", "memory_gib": 178.35, "gpus_per_node": [8], "interconnect": "nvlink",
    "compute_capability": 10.0, "bf16": True, "fp8": True, "flash_attention": True, "price_per_gpu_hour": 9.5,
}  # fmt: skip


def test_user_entries_join_the_bundled_catalog(user_catalog) -> None:  # type: ignore[no-untyped-def]
    user_catalog("gpus:\n  - " + json.dumps(B200) + "\n")
    assert find_gpu("nvidia-b200").memory_gib == 178.35
    assert "H100-80GB" in gpu_catalog()  # the bundled ones stay


def test_a_user_entry_replaces_the_bundled_one_of_its_name(user_catalog) -> None:  # type: ignore[no-untyped-def]
    h100 = {
        **B200,
        "name": "H100-80GB",
        "product": "NVIDIA-H100-80GB-HBM3",
        "memory_gib": 79.19,
        "price_per_gpu_hour": 2.0,
    }
    user_catalog(json.dumps({"gpus": [h100]}), "gpus.json")
    assert find_gpu("H100-80GB").price_per_gpu_hour == 2.0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"gpus": [{"name": "X"}]}', r"gpus\[0\]\.product: is missing"),
        ("gpus: [: oops", "is not JSON or YAML"),
        ('{"gpu": []}', "has no list under 'gpus'"),
        (json.dumps({"gpus": [{**B200, "memory_gib": "lots"}]}), r"gpus\[0\]: has a value of the wrong type"),
        (json.dumps({"gpus": [{**B200, "gpus_per_node": []}]}), "positive memory_gib and gpus_per_node"),
    ],
)
def test_a_bad_user_catalog_is_one_error_naming_the_problem(user_catalog, content: str, message: str) -> None:  # type: ignore[no-untyped-def]
    user_catalog(content)
    with pytest.raises(SpecError, match=message):
        gpu_catalog()


def test_gpus_lists_the_catalog_with_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "extra.json"
    path.write_text(json.dumps({"gpus": [B200]}))
    try:
        assert main(["gpus", "--catalog", str(path)]) == 0
        out = capsys.readouterr().out
        assert re.search(r"^B200 +NVIDIA-B200 +178\.35 GiB  8 per node$", out, re.M), out
        assert main(["gpus", "--catalog", str(tmp_path / "missing.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot read" in err[0] and "missing.json" in err[0]
    finally:
        import os

        os.environ.pop(GPU_CATALOG_ENV, None)
        gpu_catalog.cache_clear()


def test_agent_refuses_a_bad_port_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip() == "loadline: --port: 70000 is not a TCP port (fix: use e.g. 9402)"
