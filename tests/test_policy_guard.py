"""What the spec alone decides, and the operator's safe defaults (policy/_guard.py): one test per rule,
through the pure function admission, reconcile and ``loadline plan``/``render`` all call."""

from __future__ import annotations

from typing import Any

import pytest

from loadline.api import FleetPolicy, InferenceModelSpec, parse_fleet_policy, parse_inference_model
from loadline.errors import (
    LoadlineError,
    ModelConfigError,
    NoCapacityError,
    NoFeasiblePlanError,
    NotAllowedError,
    ReferencedObjectError,
    RenderError,
    SpecError,
)
from loadline.hub import HubUnavailable
from loadline.policy import Guard, denied_env, refused_now, spec_problems, vllm_registries
from loadline.render import flag_table
from tests.conftest import inference_model


def spec(**fields: Any) -> InferenceModelSpec:
    return parse_inference_model(inference_model(**fields)).spec


def engine(**fields: Any) -> InferenceModelSpec:
    return spec(engine=fields)


def allowing(*flags: str, enforcement: str = "deny") -> FleetPolicy:
    return parse_fleet_policy(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "FleetPolicy",
            "metadata": {"name": "code"},
            "spec": {"enforcement": enforcement, "allow": {"extraArgs": list(flags)}},
        }
    )


def fields(problems: list[SpecError]) -> list[str]:
    return [p.field for p in problems]


def test_a_clean_spec_has_no_problem() -> None:
    assert spec_problems(spec()) == []
    assert (
        spec_problems(engine(extraArgs=["--enable-prefix-caching"], env=[{"name": "HF_HOME", "value": "/d"}]))
        == []
    )


def test_every_problem_is_listed_once_with_its_field_not_just_the_first() -> None:
    problems = spec_problems(
        spec(
            gpu={"types": ["B900", "L4"]},
            engine={
                "version": "0.9.0",
                "image": "evil.example/vllm:latest",
                "extraArgs": ["--model=x", "--enable-log-requests", "--trust-remote-code"],
                "env": [{"name": "LD_PRELOAD", "value": "/x.so"}, {"name": "FOO", "value": "1"}],
            },
        )
    )
    assert fields(problems) == [
        "spec.gpu.types[0]",  # unknown GPU type
        "spec.engine.image",
        "spec.engine.extraArgs[0]",  # a flag loadline sets
        "spec.engine.extraArgs[1]",  # added in 0.10.1: 0.9.0 lacks it
        "spec.engine.extraArgs[2]",  # runs code from the model repository
        "spec.engine.env[0].name",
    ]
    assert "unknown GPU type 'B900'" in str(problems[0]) and "use one of" in str(problems[0])
    assert "--model is set by loadline from spec.model.name" in str(problems[2])
    assert "vLLM 0.9.0 has no --enable-log-requests" in str(problems[3])
    assert all("(fix: " in str(p) for p in problems)


def test_an_engine_version_loadline_cannot_render_is_refused() -> None:
    [problem] = spec_problems(engine(version="0.7.3"))
    assert problem.field == "spec.engine.version" and "predates" in str(problem)


@pytest.mark.parametrize(
    ("error", "now"),
    [
        (SpecError("spec.gpu.types[0]", "unknown GPU type 'B900'"), True),
        (RenderError("spec.engine.extraArgs[0]", "--model is set by loadline"), True),
        (NotAllowedError("spec.engine.image", "elsewhere", "fix", "chart value"), True),
        (ModelConfigError("spec.model.name", "not in the catalog"), False),
        (ReferencedObjectError("spec.model.configMapRef.key", "no key"), False),
        (NoFeasiblePlanError("no GPU fits"), False),
        (NoCapacityError("no free GPUs"), False),
        (HubUnavailable("cannot reach the hub"), False),
    ],
)
def test_what_is_refused_now_is_decided_by_the_error_type(error: LoadlineError, now: bool) -> None:
    assert refused_now(error) is now


# --- images ---


@pytest.mark.parametrize(
    "image",
    [
        "",  # loadline's default, vllm/vllm-openai:v<version>
        "vllm/vllm-openai:v0.19.0",
        "docker.io/vllm/vllm-openai:latest",
        "vllm/vllm-openai-rocm:v0.19.0",
        "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.19.0",
    ],
)
def test_vllm_own_images_are_allowed(image: str) -> None:
    assert spec_problems(engine(image=image)) == []


@pytest.mark.parametrize(
    "image",
    [
        "evil.example/vllm:latest",
        "evil.example/vllm/vllm-openai:v0.19.0",  # vLLM's path on another registry
        "vllmx/vllm-openai:v0.19.0",  # a Docker Hub namespace that starts like vLLM's
        "ubuntu",
        "docker.io/vllm.evil.io/x",
    ],
)
def test_other_images_are_refused_naming_the_chart_value(image: str) -> None:
    [problem] = spec_problems(engine(image=image))
    assert isinstance(problem, NotAllowedError) and problem.field == "spec.engine.image"
    assert "settings.imageRegistries" in problem.setting and "settings.imageRegistries" in str(problem)


def test_the_chart_value_widens_the_images() -> None:
    mirror = engine(image="registry.example.com/mirror/vllm-openai:v0.19.0")
    assert spec_problems(mirror, Guard(image_registries=("registry.example.com/mirror/",))) == []
    assert spec_problems(mirror, Guard(image_registries=("registry.example.com/other/",))) != []
    assert spec_problems(engine(image="anything.example/x:1"), Guard(image_registries=("*",))) == []


def test_vllm_registries_come_from_the_data_with_docker_hub_first() -> None:
    assert vllm_registries()[0] == "docker.io/vllm/"


# --- environment ---


def _sample(pattern: str) -> str:
    return pattern[:-1] + "X" if pattern.endswith("*") else pattern


@pytest.mark.parametrize("pattern", sorted(denied_env()))
def test_each_code_loading_environment_name_is_refused(pattern: str) -> None:
    name = _sample(pattern)
    [problem] = spec_problems(engine(env=[{"name": name, "value": "x"}]))
    assert isinstance(problem, NotAllowedError) and problem.field == "spec.engine.env[0].name"
    assert name in str(problem) and "settings.allowedEnv" in str(problem)


def test_the_refused_names_include_the_loaders_of_the_issue() -> None:
    names = ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE"]
    problems = spec_problems(engine(env=[{"name": n, "value": "x"} for n in [*names, "BASH_ENV", "ENV"]]))
    assert len(problems) == len(names) + 2


def test_names_that_only_look_alike_are_allowed() -> None:
    env = [{"name": n, "value": "1"} for n in ("LDFLAGS", "ENVIRONMENT", "PYTHONUNBUFFERED", "HF_HOME")]
    assert spec_problems(engine(env=env)) == []


def test_the_chart_values_widen_and_narrow_the_environment() -> None:
    preload = engine(env=[{"name": "LD_PRELOAD", "value": "/x.so"}])
    assert spec_problems(preload, Guard(allowed_env=("LD_PRELOAD",))) == []
    assert spec_problems(preload, Guard(allowed_env=("LD_*",))) == []
    assert spec_problems(preload, Guard(allowed_env=("LD_LIBRARY_PATH",))) != []
    mine = engine(env=[{"name": "MY_HOOK", "value": "1"}])
    assert spec_problems(mine) == []
    [problem] = spec_problems(mine, Guard(denied_env=("MY_*",)))
    assert "settings.deniedEnv" in str(problem)


def test_guard_from_the_settings_text() -> None:
    guard = Guard.from_text("a.example/, b.example/", "PYTHONPATH", "")
    assert guard == Guard(("a.example/", "b.example/"), ("PYTHONPATH",), ())


# --- extraArgs that run code from outside the image ---


CODE_FLAGS = sorted(name for name, entry in flag_table().flags.items() if entry.runs_code)


def test_the_flag_table_marks_the_code_running_flags_with_their_sources() -> None:
    assert {"--trust-remote-code", "--tool-parser-plugin"} <= set(CODE_FLAGS)
    for name in CODE_FLAGS:
        what, _, how = flag_table().flags[name].runs_code.partition(":")
        assert what and "vllm" in how.lower(), name  # the vLLM source is cited


def _args(name: str) -> list[str]:
    entry = flag_table().flags[name]
    return [name] if entry.value is not None and entry.value.type == "bool" else [name, "/models/plugin.py"]


@pytest.mark.parametrize("name", CODE_FLAGS)
def test_each_code_running_flag_is_refused_without_a_policy_naming_the_policy_field(name: str) -> None:
    problems = spec_problems(engine(extraArgs=_args(name)))
    [problem] = [p for p in problems if isinstance(p, NotAllowedError)]
    assert (
        problem.field == "spec.engine.extraArgs[0]" and problem.setting == "FleetPolicy spec.allow.extraArgs"
    )
    assert f"lists {name} in spec.allow.extraArgs" in str(problem)


@pytest.mark.parametrize("name", CODE_FLAGS)
def test_a_policy_allowing_the_flag_admits_it(name: str) -> None:
    problems = spec_problems(engine(extraArgs=_args(name)), governing=[allowing(name)])
    assert not [p for p in problems if isinstance(p, NotAllowedError)]


def test_spellings_of_the_flag_are_caught_and_its_off_switch_is_not() -> None:
    assert fields(spec_problems(engine(extraArgs=["--trust_remote_code"]))) == ["spec.engine.extraArgs[0]"]
    assert spec_problems(engine(extraArgs=["--no-trust-remote-code"])) == []


def test_a_warn_policy_allows_and_a_dryrun_policy_changes_nothing() -> None:
    trusting = engine(extraArgs=["--trust-remote-code"])
    assert spec_problems(trusting, governing=[allowing("--trust-remote-code", enforcement="warn")]) == []
    assert spec_problems(trusting, governing=[allowing("--trust-remote-code", enforcement="dryrun")]) != []
    assert spec_problems(trusting, governing=[allowing("--tool-parser-plugin")]) != []  # another flag
