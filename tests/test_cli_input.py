"""Bad input through the CLI entry point: one line on standard error naming file, object, field and fix,
exit status 2, never a traceback; strict types as the CRD has them; duplicates refused; ``-`` is stdin."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadline.api import load_manifests
from loadline.cli import main
from loadline.errors import SpecError
from tests.conftest import LLAMA_8B, inference_model


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a command that must refuse its input; return its one error line."""
    code, out, err = run(capsys, *argv)
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("loadline: ") and "(fix: " in lines[0]
    return lines[0]


def write(tmp_path: Path, *docs: dict[str, Any], name: str = "m.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(list(docs)))
    return str(path)


@pytest.mark.parametrize("command", ["plan", "render"])
@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\xff\xfe\x00\x01binary", "is not UTF-8 text"),
        (b"\x1f\x8b\x08\x00gzip", "is not UTF-8 text"),
        (b"kind: [unclosed\n", "is not valid YAML"),
        (b"a: 1\x00\n", "NUL"),
        (b"", "holds no object"),
        (b"- just\n- a list\n", "is not a mapping"),
        (
            b"kind: InferenceModel\nspec: {maxModelLen: 8192, maxModelLen: 4096}\n",
            "duplicate key 'maxModelLen'",
        ),
    ],
)
def test_unreadable_files_name_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, content: bytes, says: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    line = refused(capsys, command, str(path))
    assert says in line
    assert str(path) in line or "document" in line


@pytest.mark.parametrize("command", ["plan", "render"])
def test_directory_and_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str) -> None:
    assert "is a directory" in refused(capsys, command, str(tmp_path))
    assert "cannot be read" in refused(capsys, command, str(tmp_path / "absent.yaml"))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"maxModelLen": 0}, "spec.maxModelLen"),
        ({"maxModelLen": True}, "spec.maxModelLen"),  # a boolean is not an integer (the CRD refuses it)
        ({"maxModelLen": "8192"}, "spec.maxModelLen"),  # nor is a string
        ({"maxModelLen": 8192.0}, "spec.maxModelLen"),
        ({"concurrency": False}, "spec.concurrency"),
        ({"replicas": 1.5}, "spec.replicas"),
        ({"engine": {"gpuMemoryUtilization": float("nan")}}, "spec.engine.gpuMemoryUtilization"),
        ({"engine": {"gpuMemoryUtilization": float("inf")}}, "spec.engine.gpuMemoryUtilization"),
        ({"engine": {"gpuMemoryUtilization": True}}, "spec.engine.gpuMemoryUtilization"),
        ({"engine": {"enforceEager": "yes"}}, "spec.engine.enforceEager"),
        ({"engine": {"enforceEager": 1}}, "spec.engine.enforceEager"),
        ({"engine": {"version": 0.19}}, "spec.engine.version"),  # unquoted YAML: a number, not a string
        ({"engine": {"maxNumSeqs": 512, "maxNumBatchedTokens": 256}}, "maxNumBatchedTokens"),
        ({"engine": {"extraArgs": [7]}}, "spec.engine.extraArgs[0]"),
        ({"kvOffload": {"cpuGiB": float("nan")}}, "spec.kvOffload.cpuGiB"),
        ({"gpu": {"allowFallback": "false"}}, "spec.gpu.allowFallback"),
        ({"dtype": "fp64"}, "spec.dtype"),
    ],
)
def test_bad_values_name_file_object_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, spec: dict[str, Any], field: str
) -> None:
    path = write(tmp_path, inference_model(**spec))
    line = refused(capsys, "plan", path)
    assert f"{path}: InferenceModel team-a/chat: " in line
    assert field in line


def test_planning_errors_name_file_and_object(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A value only the sizer can judge (beyond the model's context window) still names file and object.
    path = write(tmp_path, inference_model(maxModelLen=10_000_000))
    line = refused(capsys, "plan", path)
    assert line.startswith(f"loadline: {path}: InferenceModel team-a/chat: spec.maxModelLen: ")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hidden_size", float("nan")),
        ("hidden_size", True),
        ("num_hidden_layers", 0),
        ("num_hidden_layers", 1e308),
    ],
)
def test_garbage_in_the_models_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key: str, value: Any
) -> None:
    config = {**LLAMA_8B, key: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert f"--config.{key}: " in refused(capsys, "size", "--config", str(path))
    doc = inference_model()
    doc["spec"]["model"]["config"] = config
    assert f"spec.model.config.{key}: " in refused(capsys, "plan", write(tmp_path, doc))


def test_two_objects_with_one_name_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    first = write(tmp_path, inference_model(), name="a.yaml")
    second = write(tmp_path, inference_model(concurrency=2), name="b.yaml")
    line = refused(capsys, "plan", first, second)
    assert "InferenceModel team-a/chat" in line and "defined twice" in line and first in line
    # Within one file too; the same name in another namespace is another object.
    other = inference_model()
    other["metadata"]["namespace"] = "team-b"
    assert run(capsys, "plan", write(tmp_path, inference_model(), other, name="c.yaml"))[0] == 0
    assert "defined twice" in refused(capsys, "plan", write(tmp_path, inference_model(), inference_model()))


def test_no_namespace_is_the_default_namespace(tmp_path: Path) -> None:
    bare = inference_model()
    del bare["metadata"]["namespace"]
    explicit = inference_model()
    explicit["metadata"]["namespace"] = "default"
    with pytest.raises(SpecError, match="defined twice"):
        load_manifests([write(tmp_path, bare, explicit)])


def test_stdin_everywhere(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def stdin(text: str | bytes) -> None:
        raw = text.encode() if isinstance(text, str) else text
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))

    stdin(json.dumps(LLAMA_8B))
    code, out, _ = run(
        capsys, "size", "--config", "-", "--gpu", "L4", "--max-model-len", "4096", "--output", "json"
    )
    assert code == 0 and json.loads(out)["gpu"] == "L4"
    stdin(yaml.safe_dump(inference_model(maxModelLen=4096)))
    code, out, _ = run(capsys, "plan", "-", "--output", "json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["team-a/chat"]
    stdin(b"\xff\xfe")
    assert "-: is not UTF-8 text" in refused(capsys, "render", "-")
    assert "named more than once" in refused(capsys, "plan", "-", "-")


def test_plan_json_is_a_list_even_for_one_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "plan", write(tmp_path, inference_model(maxModelLen=4096)), "--output", "json")
    assert code == 0
    result = json.loads(out)
    assert isinstance(result, list) and len(result) == 1 and result[0]["name"] == "team-a/chat"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max-model-len", "0"], "--max-model-len"),
        (["--max-model-len", "-5"], "--max-model-len"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),  # 0 used to mean "default" silently
        (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], "--max-num-batched-tokens"),
        (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization"),
        (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization"),
        (
            ["--gpu", "L4", "--gpu-memory-gib", "nan"],
            "",
        ),  # argparse: mutually exclusive (exit 2 by SystemExit)
        (["--gpu-memory-gib", "nan"], "--gpu-memory-gib"),
        (["--gpu-memory-gib", "inf"], "--gpu-memory-gib"),
    ],
)
def test_size_refuses_impossible_numbers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], flag: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_8B))
    if not flag:
        with pytest.raises(SystemExit) as exit_info:
            main(["size", "--config", str(path), *argv])
        assert exit_info.value.code == 2
        return
    assert f"loadline: {flag}: " in refused(capsys, "size", "--config", str(path), *argv)


@pytest.mark.parametrize(
    ("content", "says"),
    [(b"\xff\xfe", "is not UTF-8"), (b"{nan", "is not valid JSON"), (b"[1, 2]", "is not a JSON object")],
)
def test_size_config_file_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    assert says in refused(capsys, "size", "--config", str(path))
    assert "is a directory" in refused(capsys, "size", "--config", str(tmp_path))


def test_an_unexpected_error_is_one_line_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from loadline import _cli_sizing

    def broken(*_: Any, **__: Any) -> Any:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(_cli_sizing, "govern", broken)
    monkeypatch.delenv("LOADLINE_DEBUG", raising=False)
    code, _, err = run(capsys, "plan", write(tmp_path, inference_model()))
    assert code == 70
    assert err.count("\n") == 1 and "internal error: ZeroDivisionError: boom" in err


def test_plan_refuses_extra_args_render_would_refuse(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = inference_model(maxModelLen=4096, engine={"extraArgs": ["--enable-prefix-cachin"]})
    line = refused(capsys, "plan", write(tmp_path, doc))
    assert "InferenceModel team-a/chat: spec.engine.extraArgs[0]: vLLM 0.19.0 has no flag" in line
