"""``loadline observe``: real vLLM start-up logs of several versions (tests/corpus/startup, each quoted
from a public report cited in its index.json) read into the figures vLLM logged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadline.cli import main
from loadline.observe import ObserveError, parse_startup_log
from loadline.observe._parse import _read_line, _Reading, _tables

CORPUS = Path(__file__).parent / "corpus" / "startup"
INDEX = json.loads((CORPUS / "index.json").read_text())
LOGS = sorted(name for name in INDEX if not name.startswith("_"))


def test_corpus_spans_three_releases_and_both_engines() -> None:
    releases = {INDEX[name]["vllm"] for name in LOGS}
    assert len(releases) >= 3
    engines = {parse_startup_log((CORPUS / name).read_text()).engine for name in LOGS}
    assert "v1" in engines
    assert all(INDEX[name]["source"].startswith("https://") for name in LOGS)


@pytest.mark.parametrize("name", LOGS)
def test_figures_as_vllm_logged_them(name: str) -> None:
    obs = parse_startup_log((CORPUS / name).read_text())
    facts = {**obs.to_dict(), **obs.settings, "tensor_parallel_size": obs.tensor_parallel_size}
    for key, want in INDEX[name]["expect"].items():
        assert facts.get(key) == pytest.approx(want), key


def test_block_count_times_block_size_is_vllms_own_token_count() -> None:
    # The V0 log says both: 1478 blocks, and (refusing max-model-len 29000) "KV cache (23648)" tokens.
    text = (CORPUS / "vllm_0.6_v0_llama8b_rtx3090_issue10517.log").read_text()
    obs = parse_startup_log(text)
    assert obs.kv_cache_tokens == 23648
    assert "stored in KV cache (23648)" in text


def test_tensor_parallel_ranks_are_told_apart_and_the_busiest_kept() -> None:
    obs = parse_startup_log((CORPUS / "vllm_0.19.0_llama70b_fp8_tp2_h100.log").read_text())
    assert obs.ranks == 2
    assert obs.minor == "0.19"
    assert obs.gpu_type is None  # vLLM 0.19 does not name the GPU; the caller says it (--gpu)


def test_worker_prefixes_of_every_engine_are_removed() -> None:
    # Real prefixed lines: vast-data/VUA#7 (V1 multiproc, rank=), vLLM #38820 (Worker_TP0), vLLM PR #14447.
    lines = [
        "(VllmWorker rank=1 pid=3275251) INFO 06-17 15:32:29 [utils.py:1136] Found nccl from library libnccl.so.2",
        "(Worker_TP0 pid=34322) INFO 05-06 20:59:59 [gpu_model_runner.py:4879] Model loading took 12.66 GiB memory "
        "and 31.657031 seconds",
    ]
    reading = _Reading()
    for line in lines:
        _read_line(line, _tables(), reading)
    assert reading.ranks == {"1", "0"}
    assert reading.per_rank["weights"] == {"Worker_TP0 pid=34322": 12.66}


def test_colour_codes_do_not_hide_figures() -> None:
    line = "\x1b[1;36m(EngineCore_DP0 pid=1133552)\x1b[0;0m INFO 10-03 16:22:17 [gpu_worker.py:298] Available KV cache memory: 6.51 GiB"
    assert parse_startup_log(line).kv_cache_gib == 6.51


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello\nworld\n",
        "INFO Available KV cache memory: GiB\n",
        "Traceback (most recent call last):\n  boom\n",
    ],
)
def test_no_figures_is_one_named_error(text: str) -> None:
    with pytest.raises(ObserveError, match="LOGFILE: holds none of vLLM's start-up figures"):
        parse_startup_log(text)


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    log = CORPUS / "vllm_0.19.0_llama70b_fp8_tp2_h100.log"
    assert main(["observe", str(log), "--output", "json", "--gpu", "NVIDIA-H100-80GB-HBM3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_cache_gib"] == 37.28 and out["gpu_type"] == "H100-80GB" and out["version"] == "0.19.0"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"not a log at all\n", "holds none of vLLM's start-up figures"),
        (b"\x1f\x8b\x08\x00\x00\x00\x00\x00", "is binary, not a log"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(content)
    done = subprocess.run(
        [sys.executable, "-m", "loadline", "observe", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_cli_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["observe", str(tmp_path / "absent.log")]) == 2
    assert "cannot read" in capsys.readouterr().err
