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


# ---- which figure decided, and how far each class is trusted -------------------------------------------

RUNPOD = CORPUS / "runpod_worker_vllm_40_graph_capture.json"


def outcome(cls: str, action: str, result: str) -> dict[str, str]:
    return {
        "class": cls,
        "action": action,
        "result": result,
        "appliedAt": "2026-11-27T10:00:00Z",
        "judgedAt": "2026-11-28T10:00:00Z",
    }


def test_json_names_the_evidence_that_decided(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", str(CORPUS / "qwen_295_max_seq_len_gt_kv.json"), "-o", "json"]) == 0
    decided = json.loads(capsys.readouterr().out)["decided_by"]
    assert decided["signal"] == "max_len_exceeds_kv"
    assert "max_model_len 32768" in decided["evidence"]


def test_timing_that_decides_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A bare CUDA error 5 s after Ready, nothing else: the first-batch timing row decides.
    data = {
        "reason": "Error",
        "message": "CUDA error: out of memory",
        "ever_ready": True,
        "seconds_since_ready": 5,
    }
    assert main(["classify", str(write(tmp_path, data)), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decided_by"] is not None and out["decided_by"]["signal"] == "first_batch"


def test_unknown_says_nothing_decided(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", str(CORPUS / "vllm_188_cuda_error_thin.json")]) == 0
    assert "decided by:  nothing" in capsys.readouterr().out


def test_confidence_per_class_comes_from_the_corpus_without_outcomes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["classify", str(RUNPOD), "-o", "json"]) == 0
    conf = json.loads(capsys.readouterr().out)["class_confidence"]
    assert set(conf) == {
        "model_exceeds_vram",
        "batch_misconfiguration",
        "kv_cache_overflow",
        "fragmentation",
        "host_memory",
        "unknown",
    }
    assert all(c["basis"] == "corpus" and c["count"] > 0 for c in conf.values())


def test_confidence_comes_from_outcomes_where_they_judged_the_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcomes = [
        outcome("batch_misconfiguration", "lower_gpu_memory_utilization", "recurred"),
        outcome("batch_misconfiguration", "lower_max_num_seqs", "worked"),
        outcome("batch_misconfiguration", "lower_max_num_batched_tokens", "worked"),
    ]
    path = write(tmp_path, outcomes, "outcomes.json")
    assert main(["classify", str(RUNPOD), "-o", "json", "--outcomes", str(path)]) == 0
    conf = json.loads(capsys.readouterr().out)["class_confidence"]
    assert conf["batch_misconfiguration"] == {"value": 0.67, "basis": "outcomes", "count": 3}
    assert conf["host_memory"]["basis"] == "corpus"


def test_a_status_remediation_object_is_read_for_its_outcomes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = {"trials": [], "outcomes": [outcome("host_memory", "raise_memory_limit", "recurred")]}
    path = write(tmp_path, status, "remediation.json")
    assert main(["classify", str(RUNPOD), "--outcomes", str(path)]) == 0
    out = capsys.readouterr().out
    assert "host_memory              0.00         (outcomes: 1 judged fixes on this model)" in out


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"outcomes": 3}, "outcomes"),
        ([outcome("oom", "restart", "worked")], "outcomes[0].class"),
        ([outcome("host_memory", "restart", "maybe")], "outcomes[0].result"),
        ([{"class": "host_memory", "action": "restart", "result": "worked"}], "outcomes[0].appliedAt"),
        ("[1,", "--outcomes"),
    ],
    ids=["not-a-list", "bad-class", "bad-result", "missing-time", "not-json"],
)
def test_bad_outcomes_exit_2_in_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: Any, field: str
) -> None:
    path = write(tmp_path, data, "outcomes.json")
    assert main(["classify", str(RUNPOD), "--outcomes", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"loadline: {field}")
