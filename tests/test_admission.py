"""The admission webhooks' glue (handlers/_admission.py) with kopf's own Patch and AdmissionError:
what `kubectl apply` gets back for each kind of policy, and what it never gets refused for."""

from __future__ import annotations

import copy
import logging
from typing import Any

import kopf
import pytest
from prometheus_client import REGISTRY

from loadline.api import FleetPolicy, parse_fleet_policy
from loadline.handlers import _admission, _events, _kube, _reconcile
from loadline.handlers._state import OperatorState
from loadline.hub import ConfigCache
from loadline.settings import OperatorSettings
from tests.conftest import inference_model

SETTINGS = OperatorSettings(hf_fetch=False)


def policy(name: str, enforcement: str = "deny", **spec: Any) -> FleetPolicy:
    return parse_fleet_policy(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "FleetPolicy",
            "metadata": {"name": name},
            "spec": {"enforcement": enforcement, "selector": {"namespaces": ["team-a"]}, **spec},
        }
    )


def validate(
    body: dict[str, Any], policies: list[FleetPolicy], *, old: dict[str, Any] | None = None
) -> list[str]:
    warnings: list[str] = []
    operation = "UPDATE" if old is not None else "CREATE"
    _admission.validate_model(body, old, operation, warnings, policies, SETTINGS, ConfigCache())
    return warnings


def mutate(body: dict[str, Any], policies: list[FleetPolicy], *, old: dict[str, Any] | None = None) -> Any:
    patch = kopf.Patch()
    operation = "UPDATE" if old is not None else "CREATE"
    _admission.mutate_model(body, old, operation, patch, policies, SETTINGS, ConfigCache())
    return patch


def test_a_deny_policy_refuses_naming_the_policy_field_and_fix() -> None:
    body = inference_model(maxModelLen=8192, concurrency=4)
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(
            body, [policy("short", limits={"maxModelLen": 4096}), policy("wide", limits={"maxReplicas": 8})]
        )
    message = str(refused.value)
    assert message.startswith("FleetPolicy short: spec.maxModelLen") and "fix:" in message
    assert "wide" not in message  # only the policies that are broken are named
    assert refused.value.code == _admission.DENIED


def test_no_allowed_gpu_type_is_refused_with_each_candidates_reason() -> None:
    body = inference_model(maxModelLen=32768, concurrency=16)  # any GPU type: the policy narrows it
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(body, [policy("small-gpus", limits={"gpuTypes": ["T4"], "maxGPUsPerReplica": 1})])
    lines = str(refused.value).splitlines()
    assert lines[0].startswith("FleetPolicy small-gpus: spec.gpu.types: no allowed GPU layout fits")
    assert any(line.startswith("  - ") and "T4" in line for line in lines[1:])


def test_a_provider_outside_the_policy_is_refused_naming_the_field_and_fix() -> None:
    body = inference_model(maxModelLen=8192, concurrency=4, gpu={"providers": ["aws", "onprem"]})
    clouds = policy("clouds", limits={"providers": ["gcp", "aws"]})
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(body, [clouds])
    assert str(refused.value) == (
        "FleetPolicy clouds: spec.gpu.providers: onprem not in providers [gcp, aws] (fix: use only aws, gcp)"
    )
    body["spec"]["gpu"]["providers"] = ["aws"]
    assert validate(body, [clouds]) == []


def test_policies_without_a_provider_in_common_are_refused_naming_each() -> None:
    body = inference_model(maxModelLen=8192, concurrency=4)
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(
            body,
            [policy("a", limits={"providers": ["aws"]}), policy("b", limits={"providers": ["azure", "gcp"]})],
        )
    assert str(refused.value).splitlines() == [
        f"FleetPolicy {name}: spec.gpu.providers: the governing policies (a, b) allow no provider in common "
        "(fix: ask the platform team to reconcile their providers)"
        for name in ("a", "b")
    ]


def test_warn_and_dryrun_admit_with_warnings_naming_the_policy() -> None:
    body = inference_model(maxModelLen=8192, concurrency=4)
    warnings = validate(
        body,
        [
            policy("soft", "warn", limits={"maxModelLen": 4096}),
            policy("trial", "dryrun", limits={"maxReplicas": 0}),
        ],
    )
    assert any(w.startswith("FleetPolicy soft: spec.maxModelLen") for w in warnings)
    assert any(w.startswith("dryrun: would refuse: FleetPolicy trial") for w in warnings)


def test_a_model_no_policy_governs_is_admitted_silently() -> None:
    body = inference_model(maxModelLen=8192)
    body["metadata"]["namespace"] = "team-b"
    assert validate(body, [policy("short", limits={"maxModelLen": 4096})]) == []


def test_an_update_that_keeps_the_spec_is_never_refused() -> None:
    """The operator's own writes (annotations, finalizers) on a model that broke a policy added after
    it, and its deletion, must go through."""
    old = inference_model(maxModelLen=8192)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"loadline.dev/last-handled-configuration": "{}"}
    new["metadata"]["finalizers"] = []
    strict = [policy("short", limits={"maxModelLen": 4096}, defaults={"engine": {"version": "0.17.0"}})]
    assert validate(new, strict, old=old) == []
    assert mutate(new, strict, old=old) == {}
    changed = copy.deepcopy(new)
    changed["spec"]["concurrency"] = 2
    with pytest.raises(kopf.AdmissionError):
        validate(changed, strict, old=old)


def test_an_unreadable_spec_is_refused_naming_the_field_without_any_policy() -> None:
    body = inference_model(maxModelLen=8192, maxNumSeqs=4096, maxNumBatchedTokens=1024)
    body["spec"]["dtype"] = "float8"
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(body, [])
    assert "spec.dtype" in str(refused.value)


def test_what_depends_on_other_objects_or_the_hub_is_admitted_with_a_warning() -> None:
    """GitOps applies in any order: a model whose config.json is on the hub (not fetched here) or in a
    ConfigMap not applied yet is not refused for it; reconcile judges it once it can be read."""
    body = inference_model(maxModelLen=8192)
    body["spec"]["model"] = {"name": "example-org/not-in-the-catalog"}
    warnings = validate(body, [policy("short", limits={"maxModelLen": 4096})])
    assert len(warnings) == 1 and warnings[0].startswith("loadline: spec.model.name: example-org/")
    # No policy: still planned (what the spec alone decides is refused), and what needs the hub is a
    # warning, never a refusal.
    [alone] = validate(body, [])
    assert alone.startswith("loadline: spec.model.name: example-org/") and "the operator will" in alone


def test_defaults_fill_only_unset_fields_from_enforcing_policies() -> None:
    body = inference_model(maxModelLen=4096)
    body["spec"]["gpu"] = {"types": ["L40S"]}
    policies = [
        policy("base", defaults={"engine": {"version": "0.17.0"}, "gpu": {"types": ["L4"]}}),
        policy("trial", "dryrun", priority=10, defaults={"engine": {"version": "0.11.0"}}),
    ]
    patch = mutate(body, policies)
    assert patch == {"spec": {"engine": {"version": "0.17.0"}}}  # gpu.types was set; dryrun fills nothing
    assert mutate(body, []) == {}


def test_providers_default_is_filled_only_when_left_out() -> None:
    body = inference_model(maxModelLen=4096)
    body["spec"]["gpu"] = {"types": ["L4"]}
    policies = [
        policy("clouds", defaults={"gpu": {"providers": ["gcp"]}}, limits={"providers": ["gcp", "aws"]})
    ]
    assert mutate(body, policies) == {"spec": {"gpu": {"providers": ["gcp"]}}}
    body["spec"]["gpu"]["providers"] = ["aws"]
    assert mutate(body, policies) == {}


def test_a_policy_the_operator_cannot_apply_is_refused_naming_the_field() -> None:
    body = {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "FleetPolicy",
        "metadata": {"name": "versions"},
        "spec": {"limits": {"vllmVersions": ">=0.17,,<"}},
    }
    with pytest.raises(kopf.AdmissionError) as refused:
        _admission.validate_policy(body)
    assert "spec.limits.vllmVersions" in str(refused.value)
    body["spec"]["limits"]["vllmVersions"] = ">=0.17.0"
    _admission.validate_policy(body)
    body["spec"]["limits"]["providers"] = ["gcp", "ibm"]
    with pytest.raises(kopf.AdmissionError) as unknown:
        _admission.validate_policy(body)
    assert "spec.limits.providers[1]" in str(unknown.value)


def test_every_answer_is_counted_by_webhook_and_result() -> None:
    def count(webhook: str, result: str) -> float:
        value = REGISTRY.get_sample_value(
            "loadline_admission_reviews_total", {"webhook": webhook, "result": result}
        )
        return value or 0.0

    before = {r: count("validate-inferencemodel", r) for r in ("allowed", "warned", "refused")}
    body = inference_model(maxModelLen=8192, concurrency=4)
    validate(body, [])
    validate(body, [policy("soft", "warn", limits={"maxModelLen": 4096})])
    with pytest.raises(kopf.AdmissionError):
        validate(body, [policy("hard", limits={"maxModelLen": 4096})])
    after = {r: count("validate-inferencemodel", r) for r in ("allowed", "warned", "refused")}
    assert {r: after[r] - before[r] for r in after} == {"allowed": 1, "warned": 1, "refused": 1}


# --- what the spec alone decides, and the operator's safe defaults, with or without a policy ---


def test_what_can_never_run_is_refused_with_every_problem_one_line_each() -> None:
    body = inference_model(
        maxModelLen=8192,
        gpu={"types": ["B900"]},
        engine={"extraArgs": ["--model=other/model", "--no-such-flag"]},
    )
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(body, [])
    lines = str(refused.value).splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [
        "spec.gpu.types[0]",
        "spec.engine.extraArgs[0]",
        "spec.engine.extraArgs[1]",
    ]
    assert "unknown GPU type 'B900'" in lines[0] and all("(fix: " in line for line in lines)
    assert refused.value.code == _admission.DENIED


def test_what_planning_or_rendering_refuses_of_the_spec_is_refused_too() -> None:
    """Found only by planning and rendering (here: a flag that replaces the planned KV cache size, and
    the same variable given twice): refused by its error's type, as the renderer words it."""
    body = inference_model(maxModelLen=8192, engine={"extraArgs": ["--num-gpu-blocks-override", "100"]})
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(body, [])
    assert str(refused.value).startswith("spec.engine.extraArgs[0]: --num-gpu-blocks-override")
    twice = inference_model(maxModelLen=8192, engine={"env": [{"name": "A", "value": "1"}, {"name": "A"}]})
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(twice, [])
    assert str(refused.value).startswith("spec.engine.env[1]")


def test_a_model_that_fits_no_gpu_is_admitted_with_a_warning() -> None:
    body = inference_model(maxModelLen=131072, gpu={"types": ["T4"], "maxGPUsPerReplica": 1})
    [warning] = validate(body, [])
    assert warning.startswith("loadline: ") and "the operator will report it in status" in warning


def test_the_safe_defaults_refuse_without_any_policy_naming_what_allows_each() -> None:
    body = inference_model(
        maxModelLen=8192,
        engine={
            "image": "evil.example/vllm:latest",
            "extraArgs": ["--trust-remote-code"],
            "env": [{"name": "LD_PRELOAD", "value": "/tmp/x.so"}],
        },
    )
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(body, [])
    image, flag, env = str(refused.value).splitlines()
    assert (
        image.startswith("spec.engine.image: evil.example/vllm:latest")
        and "settings.imageRegistries" in image
    )
    assert flag.startswith("spec.engine.extraArgs[0]: --trust-remote-code") and "spec.allow.extraArgs" in flag
    assert env.startswith("spec.engine.env[0].name: LD_PRELOAD") and "settings.allowedEnv" in env


def test_the_settings_and_a_policy_widen_the_safe_defaults() -> None:
    body = inference_model(
        maxModelLen=8192,
        engine={
            "image": "registry.example.com/vllm-openai:v0.19.0",
            "extraArgs": ["--trust-remote-code"],
            "env": [{"name": "PYTHONPATH", "value": "/opt/hooks"}],
        },
    )
    wide = OperatorSettings(
        hf_fetch=False, image_registries="registry.example.com/", allowed_env="PYTHONPATH"
    )
    trusting = policy("trusting", allow={"extraArgs": ["--trust-remote-code"]})
    warnings: list[str] = []
    _admission.validate_model(body, None, "CREATE", warnings, [trusting], wide, ConfigCache())
    assert warnings == []
    with pytest.raises(kopf.AdmissionError) as refused:  # the settings alone: the flag still needs the policy
        _admission.validate_model(body, None, "CREATE", [], [], wide, ConfigCache())
    assert str(refused.value).startswith("spec.engine.extraArgs[0]: --trust-remote-code")
    with pytest.raises(kopf.AdmissionError):  # the policy alone: image and environment still refused
        validate(body, [trusting])


def test_reconcile_refuses_what_admission_would_for_a_model_stored_without_the_webhooks(
    state: OperatorState,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Webhooks off, or a model stored before the settings narrowed: the operator still never runs it."""
    from tests.test_reconcile_requests import L4_VIEW, FakeKube, body

    fake = FakeKube()
    for name in ("apply", "get", "list_objects", "has_kind"):
        monkeypatch.setattr(_kube, name, getattr(fake, name))
    monkeypatch.setattr(_events, "event", lambda *a, **k: None)
    model = body()
    model["spec"]["engine"] = {"env": [{"name": "LD_PRELOAD", "value": "/tmp/x.so"}]}
    patch = kopf.Patch()
    with pytest.raises(kopf.PermanentError):
        _reconcile.reconcile(
            state, kopf.Body(model), patch, logging.getLogger("t"), OperatorSettings(), L4_VIEW, []
        )
    assert patch.status["phase"] == "Failed"
    [ready] = [c for c in patch.status["conditions"] if c["reason"] == "NotAllowed"]
    assert "spec.engine.env[0].name: LD_PRELOAD" in ready["message"]
    assert fake.calls == []  # nothing applied
    allowed = OperatorSettings(allowed_env="LD_PRELOAD")
    _reconcile.reconcile(state, kopf.Body(model), kopf.Patch(), logging.getLogger("t"), allowed, L4_VIEW, [])
    assert ("apply", "Deployment") in fake.calls


def test_a_configmap_lacking_its_key_is_a_warning_not_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ConfigMap's state, not the spec's (ReferencedObjectError): GitOps may fix the ConfigMap next."""
    body = inference_model(maxModelLen=8192)
    body["spec"]["model"] = {"name": "org/private", "configMapRef": {"name": "cfg", "key": "config.json"}}
    monkeypatch.setattr(_kube, "get", lambda *a, **k: {"data": {"other.json": "{}"}})
    [warning] = validate(body, [])
    assert "ConfigMap cfg has no key 'config.json'" in warning and "the operator will" in warning
