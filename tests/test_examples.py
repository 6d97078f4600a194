"""Every claim the examples' comments and the README make about a plan or an output holds.

Each ``examples/*.yaml`` states what ``loadline plan`` and ``loadline render`` make of it in structured
comment lines, written for people and read here, so a comment cannot drift from what the planner does:

* ``# plan: 2 × A100-80GB (TP 2, PP 1, 1 node), $6.86/h per replica: 1/4 of p4de.24xlarge's $27.45/h
  (GPU share)`` (one line): the chosen plan, exactly as :func:`plan_line` writes it from
  ``loadline plan --output json``;
* ``# rejected: L40Sx4 (TP4): fits, but costs``: that candidate lost, its reason containing the text;
* ``# why: g6.xlarge: 16 GiB host memory``: the node shape's ``why`` contains the text;
* ``# settings: quantization compressed-tensors, kvCacheDtype fp8``: the plan's settings;
* ``# checkpoint: ~69 GiB``: what each pod downloads, within 3 %;
* ``# renders: Deployment, Service, PodDisruptionBudget``: the kinds ``loadline render`` emits, in order;
* ``# args: --kv-offloading-size, --enable-prefix-caching``: vLLM flags the rendered pods run with.

Every example has a ``plan:`` line; a line starting with one of these keys that does not parse fails.
The FleetPolicy example's ``loadline plan`` command is run as written and must pass its limits. The
README's claims (its model, the columns of ``kubectl get lim -o wide``, ``loadline size``'s JSON keys)
are checked below them.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadline.api import all_crds
from loadline.cli import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
KEYS = ("plan", "rejected", "why", "settings", "checkpoint", "renders", "args")
CLAIM = re.compile(r"^#\s*(" + "|".join(KEYS) + r"):\s*(.*)$")


def claims(path: Path) -> list[tuple[str, str]]:
    """The structured comment lines of an example, in order: (key, text)."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = CLAIM.match(line)
        if match:
            found.append((match.group(1), match.group(2).strip()))
    return found


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["plan", "--output", "json", *args]) == 0
    result: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return result


def rendered(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[list[dict[str, Any]], str]:
    capsys.readouterr()
    assert main(["render", str(path)]) == 0
    text = capsys.readouterr().out
    return [doc for doc in yaml.safe_load_all(text) if doc], text


def plan_line(summary: dict[str, Any]) -> str:
    """The ``plan:`` claim of a plan (``status.plan``): GPUs, layout, and what a replica costs and why."""
    nodes = summary["nodesPerReplica"]
    price, _, how = summary["priceBasis"].partition(": ")
    return (
        f"{summary['gpusPerReplica']} × {summary['gpuType']} (TP {summary['tensorParallelSize']}, "
        f"PP {summary['pipelineParallelSize']}, {nodes} node{'s' if nodes > 1 else ''}), "
        f"{price} per replica: {how}"
    )


def problems(
    name: str, stated: list[tuple[str, str]], result: dict[str, Any], kinds: list[str], text: str
) -> list[str]:
    """What in ``stated`` (an example's claims) ``result`` (its ``loadline plan --output json`` entry),
    ``kinds`` and ``text`` (its ``loadline render`` output) contradict; empty when every claim holds."""
    out = []
    keys = [key for key, _ in stated]
    if keys.count("plan") != 1:
        out.append(f"{name}: needs exactly one '# plan:' line")
    summary = result["plan"]
    rejected = {r["candidate"]: r["reason"] for r in result["rejected"]}
    for key, claim in stated:
        if key == "plan" and claim != plan_line(summary):
            out.append(f"{name}: the plan is now\n# plan: {plan_line(summary)}")
        elif key == "rejected":
            label, _, reason = claim.partition(": ")
            if label not in rejected:
                out.append(f"{name}: {label} was not rejected (rejected: {sorted(rejected)})")
            elif not reason or reason not in rejected[label]:
                out.append(f"{name}: {label} was rejected for: {rejected[label]}")
        elif key == "why" and claim not in (summary["nodeShape"] or {}).get("why", ""):
            out.append(f"{name}: the node shape's why is: {summary['nodeShape']['why']}")
        elif key == "settings":
            for setting in claim.split(", "):
                field, _, value = setting.partition(" ")
                if str(result["settings"].get(field)) != value:
                    out.append(f"{name}: {field} is {result['settings'].get(field)}")
        elif key == "checkpoint":
            match = re.fullmatch(r"~(\d+(?:\.\d+)?) GiB", claim)
            actual = summary["downloadGiB"]
            if not match:
                out.append(f"{name}: write '# checkpoint: ~N GiB'")
            elif abs(float(match.group(1)) - actual) > 0.03 * actual:
                out.append(f"{name}: each pod downloads {actual} GiB")
        elif key == "renders" and claim.split(", ") != kinds:
            out.append(f"{name}: renders {', '.join(kinds)}")
        elif key == "args":
            for flag in claim.split(", "):
                if not re.search(rf"(^|\s|- ){re.escape(flag)}(\s|$)", text, re.M):
                    out.append(f"{name}: the rendered pods have no {flag}")
    return out


def example_outputs(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[dict[str, Any], list[str], str]:
    """``loadline plan --output json`` of the example, and the kinds and text ``loadline render`` gives."""
    [result] = plan_json(capsys, str(path))
    docs, text = rendered(capsys, path)
    return result, [doc["kind"] for doc in docs], text


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_claim_of_an_example_holds(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stated = claims(path)
    assert stated, f"{path.name}: no structured claims"
    result, kinds, text = example_outputs(capsys, path)
    assert problems(path.name, stated, result, kinds, text) == []


def test_a_claim_that_drifted_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    """The check is not vacuous: the claims llama-70b-fp8.yaml once made (4 × L40S, the A100 skipped),
    another checkpoint size, a flag vLLM is not given and a kind not rendered are each reported."""
    path = REPO / "examples" / "llama-70b-fp8.yaml"
    result, kinds, text = example_outputs(capsys, path)
    plan = next(c for k, c in claims(path) if k == "plan")
    wrong = [
        ("plan", plan.replace("2 × A100-80GB (TP 2", "4 × L40S (TP 4", 1)),
        ("rejected", "A100-80GBx2 (TP2): fp8 KV cache needs compute capability"),
        ("checkpoint", "~40 GiB"),
        ("settings", "quantization fp8"),
        ("why", "TP 2 over PCIe"),
        ("args", "--enforce-eager"),
        ("renders", "LeaderWorkerSet"),
    ]
    found = problems(path.name, wrong, result, kinds, text)
    assert len(found) == len(wrong), found


def test_the_fleet_policy_examples_command_passes_its_limits(capsys: pytest.CaptureFixture[str]) -> None:
    policy = REPO / "examples" / "policies" / "fleet-policy.yaml"
    [command] = [
        line.lstrip("# ").strip()
        for line in policy.read_text(encoding="utf-8").splitlines()
        if line.lstrip("# ").startswith("loadline plan ")
    ]
    args = shlex.split(command)[1:]
    files = [a for a in args[1:] if a.endswith(".yaml")]
    assert all((REPO / f).is_file() for f in files), command
    results = plan_json(capsys, *(str(REPO / f) for f in files))
    # Every model it names is governed by the policy, and none breaks a limit (a "deny" refusal exits 2).
    assert len(results) == len(files) - 1 and all(r["policies"] == ["team-a-budget"] for r in results)


# --- the README ------------------------------------------------------------------------------------

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_model_is_the_chat_example(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The README's InferenceModel is examples/chat-llama-8b.yaml (their plans are the same)."""
    [block] = re.findall(r"```yaml\n(.*?)```", README, re.S)
    readme = tmp_path / "readme.yaml"
    readme.write_text(block, encoding="utf-8")
    [ours] = plan_json(capsys, str(readme))
    [example] = plan_json(capsys, str(REPO / "examples" / "chat-llama-8b.yaml"))
    assert ours["plan"] == example["plan"]


def test_the_readme_columns_of_kubectl_get_lim_wide() -> None:
    # "kubectl get lim -A -o wide   # MODEL, GPU (type x count), PHASE, MAX-CONCURRENCY"
    match = re.search(r"kubectl get lim -A -o wide\s+# (.*)", README)
    assert match
    claimed = [c.split(" (")[0].strip() for c in match.group(1).split(", ")]
    crd = next(c for c in all_crds() if c["spec"]["names"]["kind"] == "InferenceModel")
    served = next(v for v in crd["spec"]["versions"] if v["served"])
    columns = [c["name"].upper() for c in served["additionalPrinterColumns"]]
    assert claimed == [c for c in columns if c in claimed] and set(claimed) <= set(columns), columns
    assert "lim" in crd["spec"]["names"]["shortNames"]


def test_the_readme_keys_of_loadline_size_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # "`loadline size` prints one JSON object with per-GPU `weights_gib ...`, and `kv_cache_tokens` ..."
    match = re.search(r"`loadline size` prints one JSON object with per-GPU `([^`]+)`", README)
    assert match
    keys = [*match.group(1).split(), "kv_cache_tokens", "max_concurrency", "fits"]
    assert all(f"`{k}`" in README for k in keys[-3:])
    config = tmp_path / "config.json"
    from tests.conftest import LLAMA_8B

    config.write_text(json.dumps(LLAMA_8B), encoding="utf-8")
    capsys.readouterr()
    assert (
        main(["size", "--config", str(config), "--gpu", "L4", "--max-model-len", "8192", "--output", "json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert set(keys) <= set(out), sorted(set(keys) - set(out))
