"""The operator's side of FleetPolicies, pure parts: compliance in status and each policy's counts."""

from __future__ import annotations

from typing import Any

from loadline.api import parse_fleet_policy, parse_inference_model
from loadline.handlers import _policies
from loadline.policy import policy_counts
from loadline.sizing import plan_inference_model
from loadline.status import build as _build
from tests.conftest import inference_model, typed_status

T0, T1 = "2026-11-23T00:00:00Z", "2026-11-23T01:00:00Z"


def policy(name: str, enforcement: str = "deny", **limits: Any) -> Any:
    return parse_fleet_policy(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "FleetPolicy",
            "metadata": {"name": name, "generation": 2},
            "spec": {"enforcement": enforcement, "selector": {"namespaces": ["team-a"]}, "limits": limits},
        }
    )


def model_body(**spec: Any) -> dict[str, Any]:
    doc = inference_model(**spec)
    doc["metadata"] |= {"namespace": "team-a", "generation": 1, "labels": {"app": "chat"}}
    return doc


def compliance(body: dict[str, Any], *policies: Any) -> dict[str, Any]:
    spec = parse_inference_model(body).spec
    return _policies.compliance_status(
        body, typed_status(body.get("status") or {}), spec, list(policies), plan_inference_model
    )


def test_a_model_breaking_a_policy_is_told_which_field_and_the_fix() -> None:
    body = model_body(replicas=3)
    status = compliance(body, policy("team-a-budget", maxReplicas=2), policy("other", maxModelLen=1 << 20))
    [condition] = [c for c in status["conditions"] if c["type"] == "PolicyCompliant"]
    assert condition["status"] == "False" and condition["reason"] == "Violation"
    assert (
        "FleetPolicy team-a-budget: spec.replicas" in condition["message"] and "fix:" in condition["message"]
    )
    assert status["policies"] == ["other", "team-a-budget"] and status["violatedPolicies"] == [
        "team-a-budget"
    ]


def test_compliance_flips_back_and_only_writes_when_it_changes() -> None:
    body = model_body(replicas=1)
    ok = compliance(body, policy("team-a-budget", maxReplicas=2))
    assert next(c for c in ok["conditions"] if c["type"] == "PolicyCompliant")["status"] == "True"
    body["status"] = ok
    assert (
        _build.status_changes(typed_status(ok), compliance(body, policy("team-a-budget", maxReplicas=2)))
        == {}
    )
    none = compliance({**body, "metadata": {**body["metadata"], "namespace": "team-b"}})
    assert none["policies"] == [] and none["violatedPolicies"] == []


def test_a_policy_counts_the_models_that_name_it() -> None:
    budget = policy("team-a-budget", maxReplicas=2)
    models = [
        {"metadata": {"namespace": "team-a", "name": "a"}, "status": {"policies": ["team-a-budget"]}},
        {
            "metadata": {"namespace": "team-a", "name": "b"},
            "status": {"policies": ["team-a-budget"], "violatedPolicies": ["team-a-budget"]},
        },
        {"metadata": {"namespace": "team-b", "name": "c"}, "status": {}},
    ]
    counts = policy_counts(budget, models)
    assert counts["modelsGoverned"] == 2 and counts["violations"] == 1
    assert counts["violatingModels"] == ["team-a/b"] and counts["observedGeneration"] == 2
    assert "team-a" in counts["selector"]


def test_remediation_limits_come_from_the_governing_policy_else_the_environment() -> None:
    from loadline.handlers import _oom
    from loadline.settings import OperatorSettings

    strict = parse_fleet_policy(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "FleetPolicy",
            "metadata": {"name": "careful"},
            "spec": {"selector": {"namespaces": ["team-a"]}, "remediation": {"maxActionsPerDay": 1}},
        }
    )
    settings = OperatorSettings(remediation_max_actions_per_day=5, remediation_min_confidence=0.7)
    governed = _oom.model_limits(model_body(), [strict], settings)
    assert governed.max_actions_per_day == 1 and governed.min_confidence == 0.7  # the rest from env
    elsewhere = {**model_body(), "metadata": {**model_body()["metadata"], "namespace": "team-b"}}
    assert _oom.model_limits(elsewhere, [strict], settings).max_actions_per_day == 5
