"""``loadline classify``: the JSON contract, the human output, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadline.cli import main

CORPUS = Path(__file__).parent / "corpus" / "oom"


def write(tmp_path: Path, data: Any, name: str = "incident.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def test_json_output_shape(capsys: pytest.CaptureFixture[str]) -> None:
    path = CORPUS / "calib_p26_gpt_oss_20b_tp1_sampler_warmup.json"
    assert main(["classify", str(path), "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"class", "confidence", "evidence", "remediation"} <= set(out)
    assert out["class"] == "batch_misconfiguration"
    assert 0.0 <= out["confidence"] <= 1.0
    assert out["evidence"] and all(isinstance(e, str) for e in out["evidence"])
    assert out["remediation"]["action"] == "lower_max_num_seqs"
    assert out["remediation"]["changes"] == [{"field": "config.max_num_seqs", "old": 1024, "new": 512}]
    assert out["allocator"]["total_gib"] == 79.19


def test_json_output_for_caller_side(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", str(CORPUS / "club3090_58_agent_multiturn.json"), "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["caller_side"] is True
    assert "agent" in out["caller_note"]


def test_text_output_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", str(CORPUS / "qwen_295_max_seq_len_gt_kv.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("class:       kv_cache_overflow (confidence 0.90)")
    assert "config.max_model_len: 32768 -> 7168" in out


def test_reads_standard_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    data = json.dumps({"reason": "OOMKilled", "exit_code": 137}).encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))  # like the real one: has .buffer
    assert main(["classify", "-", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["class"] == "host_memory"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"reason": "Error", "metrics": {"kv_cache_usage": 97}}, "incident.metrics.kv_cache_usage"),
        ({"exit_code": 137}, "incident.reason"),
        ({"reason": "Error", "config": {"max_num_seqs": 0}}, "incident.config.max_num_seqs"),
        (
            {"reason": "Error", "config": {"gpu_memory_utilisation": 0.9}},
            "incident.config.gpu_memory_utilisation",
        ),
        ({"reason": "Error", "plan": {"weights_gib": "a lot"}}, "incident.plan.weights_gib"),
        ([1, 2], "incident"),
    ],
    ids=["kv-percent", "no-reason", "zero-seqs", "misspelt", "not-a-number", "not-an-object"],
)
def test_bad_input_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: Any, field: str
) -> None:
    assert main(["classify", str(write(tmp_path, data))]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"loadline: {field}")


def test_kv_percent_error_says_how_to_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["classify", str(write(tmp_path, {"reason": "Error", "metrics": {"kv_cache_usage": 97}}))])
    assert "0.97, not 97" in capsys.readouterr().err


def test_two_bad_fields_are_both_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {"reason": "Error", "metrics": {"kv_cache_usage": 2}, "config": {"tensor_parallel_size": 0}}
    assert main(["classify", str(write(tmp_path, data))]) == 2
    err = capsys.readouterr().err
    assert "incident.metrics.kv_cache_usage" in err and "incident.config.tensor_parallel_size" in err


def test_unreadable_json_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", str(write(tmp_path, '{"reason": "Error",'))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loadline: INCIDENT:") and "not valid JSON" in err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_corpus_annotations_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    # Corpus files carry source/expected_class/note; the CLI must read them as incidents.
    assert main(["classify", str(CORPUS / "vllm_188_cuda_error_thin.json"), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["class"] == "unknown"


def test_installed_command_in_a_subprocess() -> None:
    path = CORPUS / "vllm_53042_kv_offload_oomkilled.json"
    proc = subprocess.run(
        [sys.executable, "-m", "loadline", "classify", str(path), "--output", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["class"] == "host_memory"
    assert out["remediation"]["changes"] == [
        {"field": "config.kv_offload_cpu_gib", "old": 200.0, "new": 100.0}
    ]
