"""`loadline size`, `loadline plan` and `loadline crds` as scripts call them: exit codes and JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadline.cli import main
from tests.conftest import REPO, inference_model

SIZE_FIELDS = {
    "weights_gib",
    "activation_gib",
    "non_torch_gib",
    "cuda_graph_gib",
    "kv_cache_gib",
    "kv_cache_tokens",
    "max_concurrency",
    "fits",
}


@pytest.fixture
def config_file(tmp_path: Path, llama_8b_config: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(llama_8b_config))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_size_json_contract(capsys: pytest.CaptureFixture[str], config_file: Path) -> None:
    code, out, _ = run(
        capsys, "size", "--config", str(config_file), "--gpu", "H100-80GB", "--gpu-memory-utilization", "0.95",
        "--max-model-len", "8192", "--max-num-seqs", "1024", "--max-num-batched-tokens", "8192", "--output", "json",
    )  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert set(result) >= SIZE_FIELDS
    assert result["fits"] is True
    # Calibration P01 (vLLM 0.19, H100): 14.99 GiB weights, 58.11 GiB KV, 476,016 tokens.
    assert result["weights_gib"] == pytest.approx(14.99, rel=0.03)
    assert result["kv_cache_gib"] == pytest.approx(58.11, rel=0.05)
    assert result["kv_cache_tokens"] == pytest.approx(476_016, rel=0.05)
    assert result["max_concurrency"] == pytest.approx(result["kv_cache_tokens"] / 8192, rel=0.01)


def test_size_defaults_are_vllms_for_the_version_and_gpu(
    capsys: pytest.CaptureFixture[str], config_file: Path
) -> None:
    code, out, _ = run(capsys, "size", "--config", str(config_file), "--gpu", "L4", "--max-model-len", "4096",
                       "--output", "json")  # fmt: skip
    result = json.loads(out)
    assert code == 0
    assert (result["gpu_memory_utilization"], result["max_num_seqs"], result["max_num_batched_tokens"]) == (
        0.9,
        256,
        2048,
    )


def test_size_enforce_eager_and_gpu_memory_gib(capsys: pytest.CaptureFixture[str], config_file: Path) -> None:
    code, out, _ = run(capsys, "size", "--config", str(config_file), "--gpu-memory-gib", "40", "--enforce-eager",
                       "--max-model-len", "4096", "--output", "json")  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert result["cuda_graph_gib"] == 0 and result["gpu_memory_gib"] == 40


def test_size_weight_bits_for_a_method_whose_config_is_silent(
    capsys: pytest.CaptureFixture[str], config_file: Path
) -> None:
    sizes = {}
    for bits in ("4", "8"):
        _, out, _ = run(capsys, "size", "--config", str(config_file), "--quantization", "bitsandbytes",
                        "--weight-bits", bits, "--max-model-len", "4096", "--output", "json")  # fmt: skip
        sizes[bits] = json.loads(out)["weights_gib"]
    assert sizes["4"] < sizes["8"] < 14.99


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            ["--tensor-parallel-size", "3"],
            "--tensor-parallel-size: 3 does not divide the model's 32 attention heads",
        ),
        (["--quantization", "int3"], "--quantization: unknown quantization 'int3'"),
        (["--max-model-len", "1000000"], "--max-model-len: 1000000 is beyond the model's context window"),
        (["--gpu", "RTX-9090"], "--gpu: unknown GPU type 'RTX-9090'"),
        (["--vllm-version", "0.5.0"], "predates the V1 engine"),
    ],
)
def test_size_bad_input_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], config_file: Path, extra: list[str], needle: str
) -> None:
    code, out, err = run(capsys, "size", "--config", str(config_file), *extra, "--output", "json")
    assert code == 2
    assert out == ""
    assert needle in err
    assert "fix:" in err


def test_plan_json_and_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        yaml.safe_dump(inference_model(maxModelLen=8192, concurrency=4, gpu={"types": ["L4", "H100-80GB"]}))
    )
    code, out, _ = run(capsys, "plan", str(path), "--output", "json")
    assert code == 0
    [result] = json.loads(out)  # always a list, even of one
    assert result["plan"]["gpu"] == "L4x1"
    assert result["name"] == "team-a/chat"
    assert {"candidate", "reason"} <= set(result["rejected"][0])
    code, out, _ = run(capsys, "plan", str(path))
    assert code == 0
    assert "L4x1" in out and "KV cache" in out and "H100-80GB" in out


def test_plan_no_gpu_fits_exits_2_with_each_rejection(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        yaml.safe_dump(
            inference_model(maxModelLen=131072, concurrency=64, gpu={"types": ["L4"], "maxGPUsPerReplica": 2})
        )
    )
    code, _, err = run(capsys, "plan", str(path))
    assert code == 2
    assert "no GPU candidate can serve" in err and "fix:" in err
    assert "L4x1" in err and "L4x2" in err and "GiB" in err


def test_crds_command_prints_what_crds_holds(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "crds")
    assert code == 0
    assert (REPO / "crds" / "loadline.dev_inferencemodels.yaml").read_text() in out


def test_python_dash_m_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "loadline", "crds"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "kind: CustomResourceDefinition" in proc.stdout


LLAMA_70B_AWQ = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 80,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "float16",
    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
}


@pytest.mark.parametrize(
    ("tp", "needle", "fix"),
    [
        # 28672 / 64 = 448 per rank: three and a half groups of 128 (vLLM: "The input size is not aligned
        # with the quantized weight shape. This can be caused by too large tensor parallel size.")
        (
            "64",
            "--tensor-parallel-size: 64: MLP intermediate size 28672 / TP 64 = 448 per rank is not a multiple "
            "of the checkpoint's group_size 128 (awq_marlin; vLLM refuses to load it)",
            "use 32,",
        ),
        ("128", "--tensor-parallel-size: 128 does not divide the model's 64 attention heads", "use 32,"),
    ],
)
def test_size_refuses_a_tensor_parallel_size_vllm_cannot_build(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tp: str, needle: str, fix: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_70B_AWQ))
    code, out, err = run(
        capsys, "size", "--config", str(path), "--tensor-parallel-size", tp, "--output", "json"
    )
    assert code == 2 and out == ""
    assert needle in err
    assert f"fix: {fix}" in err
    assert len(err.strip().splitlines()) == 1
    code, out, _ = run(
        capsys, "size", "--config", str(path), "--tensor-parallel-size", "32", "--output", "json"
    )
    assert code == 0 and json.loads(out)["tensor_parallel_size"] == 32


def test_a_version_newer_than_every_table_says_so_on_stderr_once(
    capsys: pytest.CaptureFixture[str], config_file: Path, tmp_path: Path
) -> None:
    code, out, err = run(
        capsys, "size", "--config", str(config_file), "--vllm-version", "0.99.0", "--output", "json"
    )
    assert code == 0 and json.loads(out)["fits"] is True
    [line] = err.strip().splitlines()
    assert line.startswith("loadline: warning: vLLM 0.99.0 is newer than every loadline table")
    assert "vllm_compat.json" in line and "0.33.0" in line and "engine.json" in line
    path = tmp_path / "m.yaml"
    docs = [inference_model(maxModelLen=8192, engine={"version": "0.99.0"}) for _ in range(2)]
    docs[1]["metadata"]["name"] = "other"
    path.write_text(yaml.safe_dump_all(docs))
    code, _, err = run(capsys, "plan", str(path))
    assert code == 0 and len(err.strip().splitlines()) == 1 and "0.99.0 is newer" in err
    code, _, err = run(capsys, "size", "--config", str(config_file), "--output", "json")
    assert code == 0 and err == ""


def test_size_non_torch_memory_follows_the_interconnect(
    capsys: pytest.CaptureFixture[str], config_file: Path
) -> None:
    """NCCL's peer buffers and vLLM's custom all-reduce live in GPU memory only where the GPUs reach each
    other directly: TP 2 over PCIe (L40S) keeps ~0.12 GiB outside torch, over NVLink ~2.06 GiB."""
    figures = {}
    for gpu, flags in (("L40S", []), ("H100-80GB", []), ("L40S", ["--interconnect", "nvlink"])):
        code, out, _ = run(
            capsys, "size", "--config", str(config_file), "--gpu", gpu, "--tensor-parallel-size", "2", *flags,
            "--output", "json",
        )  # fmt: skip
        assert code == 0
        result = json.loads(out)
        figures[(gpu, result["interconnect"])] = result["non_torch_gib"]
    assert figures[("L40S", "pcie")] == pytest.approx(0.12, abs=0.005)
    assert figures[("H100-80GB", "nvlink")] == figures[("L40S", "nvlink")] == pytest.approx(2.06, abs=0.005)


def test_size_refuses_a_tensor_parallel_size_the_kv_heads_cannot_take(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, llama_8b_config: dict[str, Any]
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(llama_8b_config | {"num_attention_heads": 24, "num_key_value_heads": 6}))
    code, _, err = run(capsys, "size", "--config", str(path), "--tensor-parallel-size", "4")
    assert code == 2
    assert "--tensor-parallel-size: 4 neither divides the model's 6 KV heads nor is a multiple of them" in err
    assert "fix: use 2," in err  # 3 splits the heads, not the MLP of 14336


def test_a_fleet_policys_gpu_cap_refusal_names_the_quantization_that_fits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "FleetPolicy",
        "metadata": {"name": "one-l4"},
        "spec": {"limits": {"gpuTypes": ["L4"], "maxGPUsPerReplica": 1}},
    }
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all([policy, inference_model(maxModelLen=32768, concurrency=2)]))
    code, _, err = run(capsys, "plan", str(path))
    assert code == 2
    assert "FleetPolicy one-l4: spec.gpu.types: no allowed GPU layout fits" in err
    assert "(fix: set spec.quantization: fp8 (its weights fit within it)," in err
