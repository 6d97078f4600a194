"""``loadline render``: a YAML stream like ``helm template``; bad input exits 2 naming the field and fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loadline.cli import main
from tests.conftest import LLAMA_8B

ROOT = Path(__file__).resolve().parent.parent

LLAMA = LLAMA_8B  # the shared Llama-3.1-8B config (tests/conftest.py)


def _write(tmp_path: Path, docs: list[dict[str, Any]]) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def _cr(name: str, **engine: Any) -> dict[str, Any]:
    return {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "config": LLAMA},
            "maxModelLen": 4096,
            "kvOffload": {"cpuGiB": 8},
            "engine": {"version": "0.19.0", **engine},
            "gpu": {"types": ["L40S"]},
        },
    }


def test_render_prints_a_yaml_stream_with_headers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, [_cr("one"), _cr("two")])
    assert main(["render", str(path)]) == 0
    out = capsys.readouterr().out
    docs = list(yaml.safe_load_all(out))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Deployment", "one"),
        ("Service", "one"),
        ("PodDisruptionBudget", "one"),
        ("Deployment", "two"),
        ("Service", "two"),
        ("PodDisruptionBudget", "two"),
    ]
    assert "# Deployment ns/one\n" in out
    assert f"# Source: {path} (InferenceModel ns/one)" in out


def test_vllm_version_flag_changes_flags_and_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, [_cr("chat")])
    assert main(["render", str(path), "--vllm-version", "0.11.0"]) == 0
    out = capsys.readouterr().out
    deployment = next(yaml.safe_load_all(out))
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "vllm/vllm-openai:v0.11.0"
    assert "--swap-space" in c["args"]
    assert "--kv-offloading-size" not in c["args"]
    assert "# Note: spec.kvOffload: vLLM 0.11.0 has no --kv-offloading-size" in out


def test_extra_arg_the_version_lacks_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, [_cr("chat", extraArgs=["--enable-prefix-caching", "--disable-log-requests"])])
    assert main(["render", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "spec.engine.extraArgs[1]" in captured.err
    assert "--disable-log-requests was removed in vLLM 0.17.0" in captured.err
    assert "(fix: remove --disable-log-requests" in captured.err
    assert "Traceback" not in captured.err
    # The same file renders for a version that still has the flag.
    assert main(["render", str(path), "--vllm-version", "0.16.0"]) == 0


@pytest.mark.parametrize("version", ["0.7.3", "latest", "0.12.0; rm -rf /", "0.12.0\nkind: Secret"])
def test_bad_vllm_version_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str) -> None:
    path = _write(tmp_path, [_cr("chat")])
    assert main(["render", str(path), "--vllm-version", version]) == 2
    err = capsys.readouterr().err
    assert "--vllm-version" in err
    assert "fix:" in err


def test_bad_name_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _cr("chat")
    doc["metadata"]["name"] = "chat.v2"
    path = _write(tmp_path, [doc])
    assert main(["render", str(path)]) == 2
    assert "metadata.name" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_render(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs and docs[0]["kind"] in {"Deployment", "LeaderWorkerSet"}
