"""`loadline plan` and `loadline render` with FleetPolicies among their files, as CI pipelines run them."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadline.cli import main
from tests.conftest import REPO, inference_model

EXAMPLE_POLICY = REPO / "examples" / "policies" / "fleet-policy.yaml"


def fleet_policy(name: str = "team-a-budget", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "FleetPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def write(tmp_path: Path, name: str, *docs: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def model(**spec: Any) -> dict[str, Any]:
    return inference_model(maxModelLen=8192, concurrency=4, **spec)


def test_deny_exits_2_naming_policy_field_and_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policies = write(
        tmp_path, "policy.yaml", fleet_policy(limits={"maxReplicas": 2, "vllmVersions": ">=0.17"})
    )
    models = write(tmp_path, "models.yaml", model(replicas=3, engine={"version": "0.12.0"}))
    code, out, err = run(capsys, "plan", policies, models)
    assert code == 2 and out == ""
    assert f"team-a/chat ({models}) refused" in err
    assert (
        "FleetPolicy team-a-budget: spec.replicas: 3 exceeds maxReplicas 2 (fix: set spec.replicas to 2 or fewer)"
        in err
    )
    assert (
        "FleetPolicy team-a-budget: spec.engine.version: vLLM 0.12.0 is outside vllmVersions '>=0.17'" in err
    )


def test_refusals_of_every_model_are_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = model(replicas=5), model(replicas=6)
    second["metadata"]["name"] = "other"
    path = write(tmp_path, "all.yaml", fleet_policy(limits={"maxReplicas": 2}), first, second)
    code, _, err = run(capsys, "render", path)
    assert code == 2
    assert "team-a/chat" in err and "team-a/other" in err


def test_warn_goes_on_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path,
        "all.yaml",
        fleet_policy("soft", enforcement="warn", limits={"maxReplicas": 1}),
        model(replicas=2),
    )
    code, out, err = run(capsys, "plan", path)
    assert code == 0
    assert "L4x1 × 2 replica(s)" in out
    assert "loadline: warning: team-a/chat: FleetPolicy soft: spec.replicas: 2 exceeds maxReplicas 1" in err
    assert "policies: soft (warn)" in out


def test_dryrun_only_reports_and_does_not_shape_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "all.yaml",
        fleet_policy(
            "trial",
            enforcement="dryrun",
            limits={"gpuTypes": ["H100-80GB"]},
            defaults={"engine": {"version": "0.17.0"}},
        ),
        model(),
    )
    code, out, err = run(capsys, "plan", path, "--output", "json")
    assert code == 0
    [result] = json.loads(out)
    assert result["plan"]["gpuType"] == "L4" and result["plan"]["engineVersion"] == "0.19.0"
    assert "dryrun: would refuse: FleetPolicy trial" not in err  # the spec lists no type: nothing to refuse
    refused_type = write(
        tmp_path,
        "typed.yaml",
        fleet_policy("trial", enforcement="dryrun", limits={"gpuTypes": ["H100-80GB"]}),
        model(gpu={"types": ["L4"]}),
    )
    code, out, err = run(capsys, "plan", refused_type)
    assert code == 0 and "L4x1" in out
    assert "dryrun: would refuse: FleetPolicy trial: spec.gpu.types: L4 not in gpuTypes [H100-80GB]" in err


def test_providers_refuse_and_plan_within(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clouds = fleet_policy("clouds", limits={"providers": ["aws"]})
    listed = write(tmp_path, "listed.yaml", clouds, model(gpu={"providers": ["gcp"]}))
    code, out, err = run(capsys, "plan", listed)
    assert code == 2 and out == ""
    assert "FleetPolicy clouds: spec.gpu.providers: gcp not in providers [aws] (fix: use only aws)" in err
    code, _, err = run(capsys, "render", listed)
    assert code == 2 and "spec.gpu.providers: gcp not in providers [aws]" in err
    unlisted = write(tmp_path, "unlisted.yaml", clouds, model())
    code, out, err = run(capsys, "plan", unlisted, "--output", "json")
    assert code == 0, err
    [result] = json.loads(out)
    assert result["plan"]["nodeShape"]["provider"] == "aws"  # without the policy: a gcp g2-standard-8
    code, out, _ = run(capsys, "plan", unlisted)
    assert "provider: aws (allowed: aws)" in out
    code, _, err = run(capsys, "plan", unlisted, "--provider", "gcp")  # the command line's providers too
    assert code == 2 and "gcp not in providers [aws]" in err


def test_providers_of_several_policies_intersect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = write(
        tmp_path,
        "both.yaml",
        fleet_policy("a", limits={"providers": ["aws", "azure"]}),
        fleet_policy("b", limits={"providers": ["azure", "gcp"]}),
        model(),
    )
    code, out, err = run(capsys, "plan", both, "--output", "json")
    assert code == 0, err
    [result] = json.loads(out)
    assert result["plan"]["nodeShape"]["provider"] == "azure" and result["policies"] == ["a", "b"]
    disjoint = write(
        tmp_path,
        "disjoint.yaml",
        fleet_policy("a", limits={"providers": ["aws"]}),
        fleet_policy("b", enforcement="warn", limits={"providers": ["gcp"]}),
        model(),
    )
    code, _, err = run(capsys, "plan", disjoint)
    assert code == 2
    assert (
        "FleetPolicy a: spec.gpu.providers: the governing policies (a, b) allow no provider in common" in err
    )
    assert "loadline: warning: team-a/chat: FleetPolicy b: spec.gpu.providers: the governing policies" in err


def test_dryrun_providers_do_not_shape_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path,
        "all.yaml",
        fleet_policy("trial", enforcement="dryrun", limits={"providers": ["azure"]}),
        model(gpu={"providers": ["gcp"]}),
    )
    code, out, err = run(capsys, "plan", path, "--output", "json")
    assert code == 0
    assert json.loads(out)[0]["plan"]["nodeShape"]["provider"] == "gcp"
    assert "dryrun: would refuse: FleetPolicy trial: spec.gpu.providers: gcp not in providers [azure]" in err


def test_defaults_fill_what_the_spec_leaves_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = model()
    doc["spec"].pop("engine", None)
    path = write(
        tmp_path,
        "all.yaml",
        fleet_policy(defaults={"engine": {"version": "0.17.0"}, "gpu": {"types": ["L40S"]}}),
        doc,
    )
    code, out, _ = run(capsys, "plan", path, "--output", "json")
    assert code == 0
    [result] = json.loads(out)
    assert result["plan"]["engineVersion"] == "0.17.0" and result["plan"]["gpuType"] == "L40S"
    assert result["policies"] == ["team-a-budget"]
    code, out, _ = run(capsys, "plan", path)
    assert "default: spec.engine.version = 0.17.0 (default of FleetPolicy team-a-budget)" in out


def test_providers_default_chooses_where_nodes_come_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "all.yaml", fleet_policy(defaults={"gpu": {"providers": ["aws"]}}), model())
    code, out, _ = run(capsys, "plan", path, "--output", "json")
    assert code == 0
    assert json.loads(out)[0]["plan"]["nodeShape"]["provider"] == "aws"
    code, out, _ = run(capsys, "plan", path)
    assert "default: spec.gpu.providers = ['aws'] (default of FleetPolicy team-a-budget)" in out
    written = write(
        tmp_path,
        "own.yaml",
        fleet_policy(defaults={"gpu": {"providers": ["aws"]}}),
        model(gpu={"providers": []}),
    )
    code, out, _ = run(capsys, "plan", written, "--output", "json")
    assert code == 0 and json.loads(out)[0]["plan"]["nodeShape"]["provider"] == "gcp"  # [] is "any": kept


def test_render_uses_the_policy_default_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    image = "registry.example.com/vllm-openai:v0.19.0"
    path = write(
        tmp_path,
        "all.yaml",
        fleet_policy(
            defaults={"engine": {"image": image}}, limits={"imageRegistries": ["registry.example.com/"]}
        ),
        model(),
    )
    # A mirror is outside vLLM's own registries: the operator's setting must allow it too, as in the chart.
    code, out, err = run(capsys, "render", path)
    assert code == 2 and "spec.engine.image: registry.example.com/vllm-openai:v0.19.0 is not from" in err
    assert "settings.imageRegistries" in err
    monkeypatch.setenv("LOADLINE_IMAGE_REGISTRIES", "registry.example.com/")
    code, out, err = run(capsys, "render", path)
    assert code == 0, err
    workload = next(yaml.safe_load_all(out))
    assert workload["spec"]["template"]["spec"]["containers"][0]["image"] == image


def test_policies_from_stdin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(fleet_policy(limits={"maxReplicas": 1}))))
    models = write(tmp_path, "m.yaml", model(replicas=2))
    code, _, err = run(capsys, "plan", "-", models)
    assert code == 2 and "maxReplicas 1" in err


def test_policies_of_other_namespaces_do_not_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "all.yaml",
        fleet_policy(selector={"namespaces": ["team-b"]}, limits={"maxReplicas": 1}),
        model(replicas=2),
    )
    assert run(capsys, "plan", path)[0] == 0
    no_ns = model(replicas=2)
    del no_ns["metadata"]["namespace"]
    default_ns = write(
        tmp_path,
        "d.yaml",
        fleet_policy(selector={"namespaces": ["default"]}, limits={"maxReplicas": 1}),
        no_ns,
    )
    assert run(capsys, "plan", default_ns)[0] == 2


def test_namespace_labels_are_unknown_offline_unless_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prod = fleet_policy(
        "prod", selector={"namespaceSelector": {"matchLabels": {"tier": "prod"}}}, limits={"maxReplicas": 1}
    )
    path = write(tmp_path, "all.yaml", prod, model(replicas=2))
    code, _, err = run(capsys, "plan", path)
    assert code == 0
    assert (
        "FleetPolicy prod selects namespaces by label and the labels of namespace team-a are unknown offline"
        in err
    )
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team-a", "labels": {"tier": "prod"}},
    }
    ns_file = write(tmp_path, "ns.yaml", namespace)
    code, _, err = run(capsys, "plan", ns_file, path)
    assert code == 2 and "FleetPolicy prod: spec.replicas" in err and "unknown offline" not in err


def test_a_file_of_policies_only_plans_nothing_and_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", str(EXAMPLE_POLICY))
    assert code == 0
    assert out.startswith("FleetPolicy team-a-budget: deny, priority 0, governs ns=team-a")


def test_example_policy_admits_the_team_a_examples(capsys: pytest.CaptureFixture[str]) -> None:
    files = [
        str(EXAMPLE_POLICY),
        str(REPO / "examples" / "chat-llama-8b.yaml"),
        str(REPO / "examples" / "llama-70b-tp4.yaml"),
    ]
    code, out, err = run(capsys, "plan", *files)
    assert code == 0, err
    assert out.count("policies: team-a-budget (deny)") == 2


def test_several_files_without_policies_plan_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in (REPO / "examples").glob("*.yaml"))
    code, out, _ = run(capsys, "plan", *files, "--output", "json")
    assert code == 0
    assert [r["name"] for r in json.loads(out)] == [
        "team-a/chat",
        "research/llama-405b",
        "team-b/llama-70b-fp8",
        "team-a/llama-70b",
    ]
    assert "policies" not in out


@pytest.mark.parametrize("command", ["plan", "render"])
def test_offline_refuses_what_admission_does_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """The same pure function as the webhook (spec_problems), so the same lines, every model checked;
    the operator's settings come from the environment the chart sets."""
    from loadline.api import parse_inference_model
    from loadline.policy import Guard, spec_problems

    bad = model(
        gpu={"types": ["B900"]},
        engine={
            "image": "evil.example/vllm:latest",
            "extraArgs": ["--model=x", "--trust-remote-code"],
            "env": [{"name": "LD_PRELOAD", "value": "/x.so"}],
        },
    )
    other = model()
    other["metadata"]["name"] = "other"
    other["spec"]["engine"] = {"env": [{"name": "PYTHONPATH", "value": "/hooks"}]}
    path = write(tmp_path, "m.yaml", bad, other)
    monkeypatch.delenv("LOADLINE_IMAGE_REGISTRIES", raising=False)
    code, out, err = run(capsys, command, path)
    assert code == 2 and out == ""
    expected = [
        f"{path}: InferenceModel team-a/chat: {p}" for p in spec_problems(parse_inference_model(bad).spec)
    ]
    assert len(expected) == 5
    lines = err.strip().splitlines()
    assert [line.removeprefix("loadline: ") for line in lines[:5]] == expected
    assert lines[5].endswith("InferenceModel team-a/other: spec.engine.env[0].name: PYTHONPATH changes how "
                             "code is loaded in the vLLM container: " + Guard().env_refusal("PYTHONPATH")
                             + " (fix: remove it, or ask the platform team to allow it in the chart value "
                             "settings.allowedEnv (LOADLINE_ALLOWED_ENV))")  # fmt: skip
    monkeypatch.setenv("LOADLINE_ALLOWED_ENV", "PYTHONPATH")
    code, out, err = run(capsys, command, write(tmp_path, "ok.yaml", other))
    assert code == 0, err
