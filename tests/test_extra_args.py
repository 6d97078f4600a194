"""``spec.engine.extraArgs`` against the chosen vLLM release's flag set (issue 12, item 5).

The table (``render/data/vllm_flags.json``) is generated from every release's source from 0.8.0 to the
newest; these tests pin what users rely on: a misspelt or missing flag, a value of the wrong type, a
switch given a value or a value without its flag all fail at render time, naming the list entry, instead
of crashing ``vllm serve`` in the pod.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loadline.cli import main
from loadline.errors import RenderError
from loadline.render import check_extra_args, flag_table, resolve_version
from tests.conftest import inference_model


def check(args: list[str], version: str = "0.19.0") -> None:
    check_extra_args(args, resolve_version(version, "spec.engine.version"))


def refusal(args: list[str], version: str = "0.19.0") -> RenderError:
    with pytest.raises(RenderError) as err:
        check(args, version)
    return err.value


def test_the_table_covers_every_release_from_0_8_to_the_newest() -> None:
    table = flag_table()
    releases = [".".join(map(str, v)) for v in table.releases]
    assert releases[0] == "0.8.0" and table.newest == max(table.releases) == (0, 33, 0)
    assert {"0.10.1", "0.11.1", "0.19.0", "0.30.0"} <= set(releases)
    assert len(table.flags) > 300  # every flag of every release, not only the ones with a known lifecycle
    for entry in table.flags.values():
        assert entry.source
        if entry.since and entry.until:
            assert entry.since < entry.until


@pytest.mark.parametrize(
    "args",
    [
        ["--enable-prefix-caching"],
        ["--no-enable-prefix-caching"],
        ["--enable_prefix_caching"],  # vLLM folds underscores
        ["--seed", "7"],
        ["--seed=-1"],
        ["--seed", "-1"],  # a negative number is a value, not a flag
        ["--max-logprobs", "5", "--enable-chunked-prefill"],
        ["--uvicorn-log-level", "debug"],
        ["--compilation-config", '{"level": 3}'],
        ["--compilation-config.level", "3"],
        ["-O3"],
        ["-O", "3"],
        ["--served-model-name-not-owned-but-real"] * 0,  # nothing at all is fine too
        ["--middleware", "a.b", "c.d"],  # a flag whose values vLLM parses takes several
    ],
)
def test_valid_extra_args_pass(args: list[str]) -> None:
    check(args)


@pytest.mark.parametrize(
    ("args", "index", "words"),
    [
        (["--enable-prefix-cachin"], 0, "vLLM 0.19.0 has no flag --enable-prefix-cachin"),
        (["--seed", "seven"], 1, "'seven' is not an integer"),
        (["--seed=7.5"], 0, "'7.5' is not an integer"),
        (["--max-logprobs", "--enable-chunked-prefill"], 0, "--max-logprobs needs a value"),
        (["--seed"], 0, "--seed needs a value"),
        (["--uvicorn-log-level", "loud"], 1, "'loud' is not one of"),
        (["--enable-prefix-caching=true"], 0, "is a switch and takes no value"),
        (["--enable-prefix-caching", "true"], 1, "'true' is a value with no flag"),
        (["7"], 0, "is a value with no flag"),
        (["--no-seed"], 0, "has no flag --no-seed"),  # only switches have a --no- twin
    ],
)
def test_invalid_extra_args_name_the_entry(args: list[str], index: int, words: str) -> None:
    err = refusal(args)
    assert err.field == f"spec.engine.extraArgs[{index}]"
    assert words in err.problem
    assert err.fix


def test_float_values_are_checked_where_the_type_is_float() -> None:
    assert "'lots' is not a number" in refusal(["--mm-processor-cache-gb", "lots"]).problem
    assert "not a finite number" in refusal(["--mm-processor-cache-gb", "nan"]).problem
    check(["--mm-processor-cache-gb", "4.5"])


def test_flags_follow_their_release() -> None:
    # --async-scheduling arrived in 0.10.0 (read from the 0.10.0 source, absent from 0.9.2's).
    assert "added in vLLM 0.10.0" in refusal(["--async-scheduling"], "0.9.2").problem
    check(["--async-scheduling"], "0.10.0")
    # --task left in 0.13.0.
    check(["--task", "generate"], "0.12.0")
    assert "removed in vLLM 0.13.0" in refusal(["--task", "generate"], "0.13.0").problem


def test_a_newer_version_is_checked_as_the_newest_known(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check(["--enable-prefix-caching"], "0.99.0")
    assert "vLLM 0.33.0 has no flag --nonsense" in refusal(["--nonsense"], "0.99.0").problem

    def rendered(extra: list[str]) -> tuple[int, str, str]:
        doc: dict[str, Any] = inference_model(
            maxModelLen=4096, engine={"version": "0.99.0", "extraArgs": extra}
        )
        path = tmp_path / "m.yaml"
        path.write_text(yaml.safe_dump(doc))
        code = main(["render", str(path)])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = rendered(["--enable-prefix-caching"])
    assert code == 0 and "--enable-prefix-caching" in out
    assert err.strip() == (
        "loadline: warning: vLLM 0.99.0 is newer than loadline's flag table (newest 0.33.0); "
        "flags were checked as for 0.33.0"
    )
    code, out, err = rendered(["--enable-prefix-cachin"])
    assert code == 2 and out == ""
    assert "m.yaml: InferenceModel team-a/chat: spec.engine.extraArgs[0]: vLLM 0.33.0 has no flag" in err
    assert "Traceback" not in err


def test_every_problem_of_the_list_is_named_not_just_the_first() -> None:
    """Admission refuses with all of them at once: one `kubectl apply` shows every entry to fix."""
    from loadline.render import extra_args_problems

    problems = extra_args_problems(
        ["7", "--model=x", "--max-num-seqs", "8", "--seed", "seven", "--enforce-eager=1", "--nonsense", "v"],
        (0, 19, 0),
    )
    assert [(p.field, p.problem.split(" ")[0]) for p in problems] == [
        ("spec.engine.extraArgs[0]", "'7'"),
        ("spec.engine.extraArgs[1]", "--model"),
        ("spec.engine.extraArgs[2]", "--max-num-seqs"),
        ("spec.engine.extraArgs[5]", "--seed:"),
        ("spec.engine.extraArgs[6]", "--enforce-eager"),
        ("spec.engine.extraArgs[7]", "vLLM"),
    ]
