"""Fleet policies, pure: the FleetPolicy model and CRD, selection, combination, defaults, every limit
and the admission decision."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, get_args

import pytest

from loadline.api import (
    FleetPolicy,
    GPUSelector,
    InferenceModelSpec,
    Provider,
    all_crds,
    load_manifests,
    parse_fleet_policy,
    parse_spec,
)
from loadline.errors import NoFeasiblePlanError, SpecError
from loadline.oom._policy import PolicyLimits as RemediationLimits
from loadline.policy import (
    AdmissionDecision,
    Violation,
    apply_defaults,
    check,
    combine,
    decide,
    defaults_patch,
    describe_selector,
    enforced,
    evaluate,
    fills,
    image_allowed,
    planning_spec,
    remediation_limits,
    restart_window_sets,
    select_policies,
)
from loadline.sizing import plan_inference_model
from loadline.sizing._shapes import PROVIDERS
from tests.conftest import LLAMA_8B, REPO


def policy(name: str = "p", **spec: Any) -> FleetPolicy:
    return parse_fleet_policy(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "FleetPolicy",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def spec(**fields: Any) -> InferenceModelSpec:
    body: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "config": dict(LLAMA_8B)},
        "maxModelLen": 8192,
        "concurrency": 4,
    }
    body.update(fields)
    return parse_spec(body)


def fields(violations: list[Violation]) -> list[tuple[str, str]]:
    return [(v.policy, v.field) for v in violations]


# --- the API ---------------------------------------------------------------------------------------


def test_issue_example_policy_is_accepted() -> None:
    manifests = load_manifests([REPO / "examples" / "policies" / "fleet-policy.yaml"])
    [p] = manifests.policies
    assert p.name == "team-a-budget"
    versions = p.spec.limits.specifier()
    assert versions is not None and versions.contains("0.19.0") and not versions.contains("0.16.0")
    assert p.spec.restarts.windows[0].timezone == "Europe/Berlin"
    assert manifests.models == []


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"limits": {"vllmVersions": "newest please"}}, "spec.limits.vllmVersions", "PEP 440"),
        (
            {"restarts": {"windows": [{"start": "01:00", "end": "02:00", "timezone": "Mars/Olympus"}]}},
            "spec.restarts.windows[0].timezone",
            "unknown time zone",
        ),
        (
            {"restarts": {"windows": [{"start": "01:00", "end": "01:00"}]}},
            "spec.restarts.windows[0]",
            "empty window",
        ),
        (
            {"selector": {"modelSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}},
            "spec.selector.modelSelector.matchExpressions[0]",
            "non-empty for In",
        ),
        (
            {
                "selector": {
                    "modelSelector": {
                        "matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]
                    }
                }
            },
            "spec.selector.modelSelector.matchExpressions[0]",
            "empty for Exists",
        ),
        ({"enforcement": "block"}, "spec.enforcement", "deny"),
        ({"limits": {"maxGpus": 4}}, "spec.limits.maxGpus", "remove it"),
    ],
)
def test_bad_policies_are_refused_naming_the_field(body: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        policy(**body)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_policy_providers_are_the_models_and_the_planners() -> None:
    model_providers = GPUSelector.model_fields["providers"].annotation
    assert get_args(Provider) == get_args(get_args(model_providers)[0]) == PROVIDERS


def test_policy_providers_must_be_known_and_not_empty() -> None:
    with pytest.raises(SpecError) as unknown:
        policy(limits={"providers": ["aws", "oracle"]})
    assert unknown.value.field == "spec.limits.providers[1]"
    with pytest.raises(SpecError) as empty:
        policy(defaults={"gpu": {"providers": []}})
    assert empty.value.field == "spec.defaults.gpu.providers"


def test_unnamed_policy_is_refused() -> None:
    with pytest.raises(SpecError, match=r"metadata\.name"):
        parse_fleet_policy({"apiVersion": "loadline.dev/v1alpha1", "kind": "FleetPolicy", "spec": {}})


def test_fleetpolicy_crd_is_cluster_scoped_with_status_and_columns() -> None:
    [crd] = [c for c in all_crds() if c["spec"]["names"]["kind"] == "FleetPolicy"]
    assert crd["metadata"]["name"] == "fleetpolicies.loadline.dev"
    assert crd["spec"]["scope"] == "Cluster"
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Selector", "Enforcement", "Models", "Violations", "Age"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert set(schema["spec"]["properties"]) == {
        "selector",
        "enforcement",
        "priority",
        "defaults",
        "limits",
        "allow",
        "remediation",
        "restarts",
    }
    assert {"modelsGoverned", "violations", "conditions", "observedGeneration"} <= set(
        schema["status"]["properties"]
    )
    limits = schema["spec"]["properties"]["limits"]["properties"]
    gpu_defaults = schema["spec"]["properties"]["defaults"]["properties"]["gpu"]["properties"]
    for providers in (limits["providers"], gpu_defaults["providers"]):
        assert providers["items"]["enum"] == ["aws", "gcp", "azure", "onprem"]
        assert providers["x-kubernetes-list-type"] == "set" and providers["minItems"] == 1
    text = repr(crd)
    for forbidden in ("$ref", "anyOf", "patternProperties", "propertyNames", "'title'"):
        assert forbidden not in text, f"{forbidden} makes the CRD schema non-structural"


# --- selection -------------------------------------------------------------------------------------


def test_empty_selector_governs_every_model() -> None:
    p = policy("all")
    assert select_policies([p], "anything", None, {}) == [p]


def test_namespaces_list_limits_the_policy() -> None:
    p = policy(selector={"namespaces": ["team-a", "team-b"]})
    assert select_policies([p], "team-b", None, {}) == [p]
    assert select_policies([p], "team-c", None, {}) == []


@pytest.mark.parametrize(
    ("rule", "labels", "selected"),
    [
        ({"key": "app", "operator": "In", "values": ["chat", "code"]}, {"app": "chat"}, True),
        ({"key": "app", "operator": "In", "values": ["chat"]}, {"app": "batch"}, False),
        ({"key": "app", "operator": "In", "values": ["chat"]}, {}, False),
        ({"key": "app", "operator": "NotIn", "values": ["chat"]}, {"app": "batch"}, True),
        ({"key": "app", "operator": "NotIn", "values": ["chat"]}, {}, True),  # Kubernetes: absent matches
        ({"key": "app", "operator": "NotIn", "values": ["chat"]}, {"app": "chat"}, False),
        ({"key": "gpu-heavy", "operator": "Exists"}, {"gpu-heavy": ""}, True),
        ({"key": "gpu-heavy", "operator": "Exists"}, {}, False),
        ({"key": "gpu-heavy", "operator": "DoesNotExist"}, {}, True),
        ({"key": "gpu-heavy", "operator": "DoesNotExist"}, {"gpu-heavy": "yes"}, False),
    ],
)
def test_match_expressions_follow_kubernetes(
    rule: dict[str, Any], labels: dict[str, str], selected: bool
) -> None:
    p = policy(selector={"modelSelector": {"matchExpressions": [rule]}})
    assert (select_policies([p], "ns", None, labels) == [p]) is selected


def test_match_labels_need_every_pair() -> None:
    p = policy(selector={"modelSelector": {"matchLabels": {"app": "chat", "tier": "prod"}}})
    assert select_policies([p], "ns", None, {"app": "chat", "tier": "prod", "x": "y"}) == [p]
    assert select_policies([p], "ns", None, {"app": "chat"}) == []


def test_namespace_selector_needs_the_namespace_labels() -> None:
    p = policy(selector={"namespaceSelector": {"matchLabels": {"tier": "prod"}}})
    assert select_policies([p], "team-a", {"tier": "prod"}, {}) == [p]
    assert select_policies([p], "team-a", {"tier": "dev"}, {}) == []
    assert select_policies([p], "team-a", None, {}) == []  # unknown labels (offline): not governed
    everything = policy("e", selector={"namespaceSelector": {}})
    assert select_policies([everything], "team-a", None, {}) == [everything]


def test_selected_policies_come_highest_priority_first_then_by_name() -> None:
    low, b, a = policy("low", priority=-5), policy("b", priority=10), policy("a", priority=10)
    assert [p.name for p in select_policies([low, b, a], "ns", None, {})] == ["a", "b", "low"]


def test_selector_in_words_for_the_printer_column() -> None:
    p = policy(
        selector={
            "namespaces": ["team-a"],
            "namespaceSelector": {"matchLabels": {"tier": "prod"}},
            "modelSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]},
        }
    )
    assert describe_selector(p.spec.selector) == "ns=team-a ns:tier=prod app notin (x)"
    assert describe_selector(policy().spec.selector) == "(all)"


# --- combining -------------------------------------------------------------------------------------


def test_limits_combine_strictest_and_remember_their_policies() -> None:
    a = policy(
        "a",
        limits={
            "gpuTypes": ["L4", "L40S", "H100-80GB"],
            "maxReplicas": 4,
            "maxModelLen": 32768,
            "vllmVersions": ">=0.17.0",
            "maxPricePerHour": 40,
        },
    )
    b = policy(
        "b",
        limits={
            "gpuTypes": ["l40s", "H100-80GB", "A100-80GB"],
            "maxReplicas": 8,
            "maxModelLen": 32768,
            "vllmVersions": "<0.20",
        },
    )
    eff = combine([b, a])
    assert eff.gpu_types is not None and eff.gpu_types.value == {"L40S", "H100-80GB"}
    assert eff.gpu_types.policies == ("a", "b")
    assert eff.max_replicas is not None and (eff.max_replicas.value, eff.max_replicas.policies) == (4, ("a",))
    assert eff.max_model_len is not None and eff.max_model_len.policies == ("a", "b")  # a tie names both
    assert eff.max_price_per_hour is not None and eff.max_price_per_hour.policies == ("a",)
    assert eff.vllm_versions is not None
    assert eff.vllm_versions.value.contains("0.19.0") and not eff.vllm_versions.value.contains("0.20.0")
    assert not eff.vllm_versions.value.contains("0.16.0")
    assert eff.max_gpus_per_replica is None  # nobody set it: no limit


def test_providers_combine_by_intersection_naming_each_policy() -> None:
    a = policy("a", limits={"providers": ["aws", "gcp", "onprem"]})
    b = policy("b", limits={"providers": ["gcp", "onprem", "azure"]})
    other = policy("other", limits={"maxReplicas": 3})
    eff = combine([b, other, a])
    assert eff.providers is not None and eff.providers.value == {"gcp", "onprem"}
    assert eff.providers.policies == ("a", "b")  # only the policies that limit providers
    assert combine([other]).providers is None  # nobody set it: no limit


def test_remediation_limits_strictest_and_env_fallback() -> None:
    a = policy("a", remediation={"maxActionsPerDay": 5, "cooldownMinutes": 10, "minConfidence": 0.5})
    b = policy(
        "b",
        remediation={"maxActionsPerDay": 2, "cooldownMinutes": 60, "minConfidence": 0.8},
        defaults={"remediation": {"mode": "recommend"}},
    )
    env = RemediationLimits(mode="auto", max_memory_gib=300, min_confidence=0.7)
    limits = remediation_limits(combine([a, b]), env)
    assert limits.max_actions_per_day == 2
    assert limits.cooldown == timedelta(minutes=60)
    assert limits.min_confidence == 0.8  # the highest floor of the policies; they replace the env's 0.7
    assert limits.max_memory_gib == 300  # unset by policies: the environment's
    assert limits.mode == "recommend"
    assert remediation_limits(combine([]), env) == env


def test_defaults_come_field_by_field_from_the_highest_priority() -> None:
    high = policy("high", priority=5, defaults={"engine": {"version": "0.18.0"}})
    tie_b = policy(
        "b", defaults={"engine": {"version": "0.17.0", "image": "b.example/vllm:1"}, "gpu": {"types": ["L4"]}}
    )
    tie_a = policy("a", defaults={"engine": {"image": "a.example/vllm:1"}})
    eff = combine([tie_b, high, tie_a])
    assert eff.defaults.engine.version == "0.18.0"
    assert eff.defaults.engine.image == "a.example/vllm:1"  # same priority: by name
    assert eff.defaults.gpu.types == ["L4"]
    assert eff.default_sources == {
        "spec.engine.version": "high",
        "spec.engine.image": "a",
        "spec.gpu.types": "b",
    }


def test_dryrun_policies_are_not_enforced() -> None:
    d, w, x = policy("d", enforcement="dryrun"), policy("w", enforcement="warn"), policy("x")
    assert [p.name for p in enforced([d, w, x])] == ["w", "x"]


def test_restart_windows_convert_for_the_scheduler() -> None:
    p = policy(
        "nights",
        restarts={
            "windows": [
                {"days": ["Sat", "Sun"], "start": "01:00", "end": "06:00", "timezone": "Europe/Berlin"}
            ],
            "maxConcurrent": 3,
        },
    )
    other = policy("other", restarts={"maxConcurrent": 2})
    eff = combine([p, other])
    [(name, windows)] = restart_window_sets(eff)
    assert name == "nights"
    assert windows[0].days == frozenset({5, 6}) and str(windows[0].timezone) == "Europe/Berlin"
    assert eff.max_concurrent_restarts is not None and eff.max_concurrent_restarts.value == 2


# --- defaults --------------------------------------------------------------------------------------


def test_defaults_fill_only_what_the_spec_leaves_out() -> None:
    eff = combine(
        [
            policy(
                defaults={
                    "engine": {"version": "0.17.0", "image": "r.example/vllm:1"},
                    "gpu": {"types": ["L40S"], "maxGPUsPerReplica": 2},
                    "remediation": {"mode": "off"},
                }
            )
        ]
    )
    bare = spec()
    filled = apply_defaults(bare, eff)
    assert filled.engine.version == "0.17.0"
    assert filled.engine.image == "r.example/vllm:1"
    assert filled.gpu.types == ["L40S"] and filled.gpu.max_gpus_per_replica == 2
    assert filled.remediation.mode == "off"
    assert bare.engine.version == "0.19.0" and bare.gpu.types == []  # the input is not changed

    own = spec(engine={"version": "0.19.0"}, gpu={"types": []}, remediation={"mode": "auto"})
    kept = apply_defaults(own, eff)
    assert kept.engine.version == "0.19.0"  # written, even though it is the built-in default
    assert kept.gpu.types == []  # written empty: "any type" is the user's choice
    assert kept.remediation.mode == "auto"
    assert kept.engine.image == "r.example/vllm:1"  # left out: filled


def test_providers_default_fills_only_a_spec_that_leaves_them_out() -> None:
    eff = combine(
        [
            policy("cheap", priority=1, defaults={"gpu": {"providers": ["gcp"]}}),
            policy("other", defaults={"gpu": {"providers": ["aws"]}}),
        ]
    )
    bare = spec()
    [fill] = fills(bare, eff)
    assert (fill.path, fill.value, fill.policy) == ("spec.gpu.providers", ["gcp"], "cheap")
    assert apply_defaults(bare, eff).gpu.providers == ["gcp"] and bare.gpu.providers == []
    assert defaults_patch(bare, eff) == {"gpu": {"providers": ["gcp"]}}
    typed = spec(gpu={"types": ["L4"]})  # gpu written, providers not: still filled
    assert apply_defaults(typed, eff).gpu.providers == ["gcp"]
    for written in (["azure"], []):  # a written list, even an empty one ("any provider"), stays
        own = spec(gpu={"providers": written})
        assert apply_defaults(own, eff) is own and defaults_patch(own, eff) == {}
    planned = plan_inference_model(
        apply_defaults(spec(), combine([policy(defaults={"gpu": {"providers": ["aws"]}})]))
    )
    assert planned.chosen.shape is not None and planned.chosen.shape.provider == "aws"


def test_defaults_are_idempotent_and_become_a_merge_patch() -> None:
    eff = combine(
        [policy("team", defaults={"engine": {"version": "0.17.0"}, "gpu": {"maxGPUsPerReplica": 2}})]
    )
    bare = spec()
    assert defaults_patch(bare, eff) == {"engine": {"version": "0.17.0"}, "gpu": {"maxGPUsPerReplica": 2}}
    once = apply_defaults(bare, eff)
    assert defaults_patch(once, eff) == {}
    assert apply_defaults(once, eff) == once


def test_no_policies_leave_the_spec_alone() -> None:
    s = spec()
    assert apply_defaults(s, combine([])) is s
    assert evaluate(s, combine([])) == []


# --- every limit -----------------------------------------------------------------------------------


def test_compliant_model_has_no_violations_and_a_plan() -> None:
    eff = combine(
        [
            policy(
                limits={
                    "gpuTypes": ["L4", "L40S"],
                    "maxReplicas": 2,
                    "maxModelLen": 8192,
                    "vllmVersions": ">=0.17",
                    "maxPricePerHour": 5,
                }
            )
        ]
    )
    result = check(spec(), eff)
    assert result.violations == ()
    assert result.plan is not None and result.plan.chosen.gpu.name == "L4"


def test_gpu_type_outside_the_list_is_refused_with_the_allowed_ones() -> None:
    eff = combine([policy("gpus", limits={"gpuTypes": ["L4", "L40S"]})])
    [v] = evaluate(spec(gpu={"types": ["L4", "H100-80GB"]}), eff)
    assert (v.policy, v.field) == ("gpus", "spec.gpu.types")
    assert "H100-80GB not in gpuTypes" in v.problem and v.fix == "use only L4, L40S"


def test_planner_uses_only_allowed_gpu_types_when_the_spec_lists_none() -> None:
    eff = combine([policy(limits={"gpuTypes": ["L40S", "H100-80GB"]})])
    result = check(spec(), eff)
    assert result.violations == ()
    assert result.plan is not None and result.plan.chosen.gpu.name == "L40S"  # L4 is cheaper but not allowed


def _provider(result: Any) -> str:
    assert result.plan is not None and result.plan.chosen.shape is not None
    return str(result.plan.chosen.shape.provider)


def test_provider_outside_the_list_is_refused_with_the_allowed_ones() -> None:
    eff = combine([policy("clouds", limits={"providers": ["gcp", "azure"]})])
    result = check(spec(gpu={"providers": ["aws", "gcp"]}), eff)
    [v] = result.violations
    assert v.line() == (
        "FleetPolicy clouds: spec.gpu.providers: aws not in providers [gcp, azure] (fix: use only gcp, azure)"
    )
    assert _provider(result) == "gcp"  # planned on what is allowed of what it lists
    fixed = check(spec(gpu={"providers": ["gcp", "azure"]}), eff)
    assert fixed.violations == () and _provider(fixed) in {"gcp", "azure"}


def test_provider_fix_names_only_allowed_providers_with_shapes_of_the_models_gpu_types() -> None:
    eff = combine([policy("clouds", limits={"providers": ["gcp", "azure"]})])
    [v] = evaluate(spec(gpu={"types": ["L4"], "providers": ["aws"]}), eff)
    assert v.fix == "use only gcp"  # the catalog has no azure L4 shape: listing only azure would not plan
    assert evaluate(spec(gpu={"types": ["L4"], "providers": ["gcp"]}), eff) == []
    [l40s] = evaluate(spec(gpu={"types": ["L40S"], "providers": ["aws"]}), eff)  # L40S: aws shapes only
    assert l40s.fix.startswith("use only gcp, azure, with a GPU type they offer in spec.gpu.types (T4, L4,")
    assert "L40S" not in l40s.fix


def test_planner_uses_only_allowed_providers_when_the_spec_lists_none() -> None:
    assert _provider(check(spec(), combine([]))) == "gcp"  # unlimited, the cheapest shape is a gcp one
    result = check(spec(), combine([policy(limits={"providers": ["aws"]})]))
    assert result.violations == ()
    assert _provider(result) == "aws" and result.planned_spec.gpu.providers == ["aws"]
    on_azure = check(spec(), combine([policy(limits={"providers": ["azure", "onprem"]})]))
    assert _provider(on_azure) == "azure" and on_azure.plan is not None
    assert on_azure.plan.chosen.gpu.name != "L4"  # no azure or onprem L4 shape: another type is planned


def test_several_policies_plan_on_the_providers_all_allow() -> None:
    eff = combine(
        [policy("a", limits={"providers": ["aws", "azure"]}), policy("b", limits={"providers": ["azure"]})]
    )
    result = check(spec(), eff)
    assert result.violations == () and _provider(result) == "azure"
    [v] = evaluate(spec(gpu={"providers": ["aws"]}), eff)  # inside a's list, outside b's
    assert (v.policy, v.field, v.fix) == ("b", "spec.gpu.providers", "use only azure")


def test_providers_no_policy_shares_are_reported_for_each_policy() -> None:
    eff = combine(
        [policy("a", limits={"providers": ["aws", "gcp"]}), policy("b", limits={"providers": ["azure"]})]
    )
    result = check(spec(), eff)
    assert fields(list(result.violations)) == [("a", "spec.gpu.providers"), ("b", "spec.gpu.providers")]
    assert {v.problem for v in result.violations} == {
        "the governing policies (a, b) allow no provider in common"
    }
    assert {v.fix for v in result.violations} == {"ask the platform team to reconcile their providers"}
    assert result.plan is None  # nothing allowed to plan on
    [listed] = evaluate(spec(gpu={"providers": ["aws"]}), eff)  # a's own list allows aws; b refuses it
    assert (listed.policy, listed.fix) == ("b", "ask the platform team: no provider is allowed")


def test_no_gpu_type_with_an_allowed_provider_is_refused_on_providers() -> None:
    eff = combine([policy("gcp-only", limits={"providers": ["gcp"]})])
    l40s = spec(gpu={"types": ["L40S"]})
    assert evaluate(l40s, combine([])) == []  # L40S fits, on aws
    [v] = evaluate(l40s, eff)
    assert (v.policy, v.field) == ("gcp-only", "spec.gpu.providers")
    assert v.problem.startswith("no allowed GPU layout fits (providers gcp)")
    assert v.details and all("no L40S node shape from gcp" in d for d in v.details)
    assert v.fix.startswith("list GPU types with gcp node shapes in spec.gpu.types (T4, L4,")
    assert evaluate(spec(gpu={"types": ["L4"]}), eff) == []  # following the fix plans


def test_providers_narrow_what_the_planner_sees_with_the_other_gpu_limits() -> None:
    eff = combine([policy(limits={"providers": ["onprem", "gcp"], "gpuTypes": ["H100-80GB"]})])
    planned = planning_spec(spec(), eff)
    assert (planned.gpu.types, planned.gpu.providers) == (["H100-80GB"], ["gcp", "onprem"])
    assert planning_spec(spec(gpu={"providers": ["gcp"]}), eff).gpu.providers == ["gcp"]
    assert planning_spec(spec(gpu={"providers": ["aws"]}), eff).gpu.providers == ["aws"]  # refused instead


def test_max_gpus_per_replica_is_a_limit_and_caps_the_planner() -> None:
    eff = combine([policy("small", limits={"gpuTypes": ["L4"], "maxGPUsPerReplica": 1})])
    [asked] = evaluate(spec(gpu={"maxGPUsPerReplica": 4}), eff)
    assert (asked.field, asked.fix) == ("spec.gpu.maxGPUsPerReplica", "set it to 1 or less")
    # 32 sequences of 32K tokens do not fit one L4, but fit elsewhere: the policy is what refuses.
    [v] = evaluate(spec(maxModelLen=32768, concurrency=32), eff)
    assert (v.policy, v.field) == ("small", "spec.gpu.types")
    assert "no allowed GPU layout fits" in v.problem and "at most 1 GPUs per replica" in v.problem
    assert v.details and all(d.startswith("L4x1") for d in v.details)


def test_a_model_that_fits_nowhere_is_not_blamed_on_the_policy() -> None:
    eff = combine([policy(limits={"gpuTypes": ["L4"]})])
    with pytest.raises(NoFeasiblePlanError):
        evaluate(
            spec(
                gpu={"types": ["L4"], "allowMultiNode": False, "maxGPUsPerReplica": 1},
                maxModelLen=131072,
                concurrency=64,
            ),
            eff,
        )


def test_max_replicas() -> None:
    eff = combine([policy("r", limits={"maxReplicas": 2})])
    assert evaluate(spec(replicas=2), eff) == []
    [v] = evaluate(spec(replicas=3), eff)
    assert (
        v.line()
        == "FleetPolicy r: spec.replicas: 3 exceeds maxReplicas 2 (fix: set spec.replicas to 2 or fewer)"
    )


def test_max_price_per_hour_counts_every_replica() -> None:
    # One replica is one L4 on a g2-standard-8 at $0.85/h: its pod's 22 GiB host memory does not fit the
    # 16 GiB one-L4 instances (g2-standard-4, g6.xlarge), so the plan prices the next shape up.
    eff = combine([policy("budget", limits={"maxPricePerHour": 2})])
    assert evaluate(spec(replicas=2), eff) == []
    [v] = evaluate(spec(replicas=3), eff)
    assert v.field == "spec.replicas" and "$2.56/h exceeds maxPricePerHour 2" in v.problem
    assert v.fix == "set spec.replicas to 2 or fewer"
    [one] = evaluate(spec(), combine([policy("tiny", limits={"maxPricePerHour": 0.5})]))
    assert one.field == "spec.gpu.types" and "quantize" in one.fix


def test_max_price_per_hour_is_judged_on_the_pods_share_of_its_node() -> None:
    # A TP 4 70B model uses half of a p5.48xlarge: $27.52/h of the node's $55.04/h fits a $50/h budget;
    # with dedicated nodes it pays the whole node and does not.
    llama_70b = {
        "model": {"name": "meta-llama/Llama-3.3-70B-Instruct"},
        "maxModelLen": 16384,
        "concurrency": 16,
        "gpu": {"types": ["H100-80GB"], "providers": ["aws"]},
    }
    eff = combine([policy("budget", limits={"maxPricePerHour": 50})])
    shared = parse_spec(llama_70b)
    assert plan_inference_model(shared).chosen.tensor_parallel_size == 4
    assert evaluate(shared, eff) == []
    [two] = evaluate(parse_spec({**llama_70b, "replicas": 2}), eff)
    assert two.field == "spec.replicas" and "= $55.04/h exceeds maxPricePerHour 50" in two.problem
    assert "per replica $27.52/h: 1/2 of p5.48xlarge's $55.04/h (GPU share)" in two.problem
    assert two.fix == "set spec.replicas to 1 or fewer"
    dedicated = parse_spec({**llama_70b, "gpu": {**llama_70b["gpu"], "dedicatedNodes": True}})
    [whole] = evaluate(dedicated, eff)
    assert whole.field == "spec.gpu.types" and "$55.04/h: whole node" in whole.problem
    assert "unset spec.gpu.dedicatedNodes" in whole.fix


def test_max_model_len_written_or_taken_from_the_model() -> None:
    eff = combine([policy("ctx", limits={"maxModelLen": 16384})])
    [written] = evaluate(spec(maxModelLen=32768), eff)
    assert (written.field, written.fix) == ("spec.maxModelLen", "set spec.maxModelLen to 16384 or less")
    body = spec()
    unset = parse_spec(
        {k: v for k, v in body.model_dump(by_alias=True, exclude_unset=True).items() if k != "maxModelLen"}
        | {"concurrency": 1}
    )
    [from_model] = evaluate(unset, eff)
    assert from_model.field == "spec.maxModelLen" and "model's own 131072" in from_model.problem


@pytest.mark.parametrize(
    ("version", "allowed"), [("0.19.0", True), ("0.17.0", True), ("0.12.0", False), ("0.40.1", False)]
)
def test_vllm_versions_are_a_pep440_range(version: str, allowed: bool) -> None:
    eff = combine([policy("versions", limits={"vllmVersions": ">=0.17.0,<0.40"})])
    violations = evaluate(spec(engine={"version": version}), eff)
    assert (violations == []) is allowed
    if not allowed:
        assert violations[0].field == "spec.engine.version"
        assert "'<0.40,>=0.17.0'" in violations[0].fix or "'>=0.17.0,<0.40'" in violations[0].fix


def test_image_registries_check_the_default_image_too() -> None:
    eff = combine([policy("mirror", limits={"imageRegistries": ["registry.example.com/"]})])
    [v] = evaluate(spec(), eff)
    assert v.field == "spec.engine.image" and "default image vllm/vllm-openai:v0.19.0" in v.problem
    assert evaluate(spec(engine={"image": "registry.example.com/vllm-openai:v0.19.0"}), eff) == []
    hub = combine([policy(limits={"imageRegistries": ["docker.io/vllm/"]})])
    assert evaluate(spec(), hub) == []  # vllm/vllm-openai is docker.io/vllm/vllm-openai


def test_image_prefix_without_slash_does_not_admit_a_lookalike_registry() -> None:
    assert image_allowed("registry.example.com/vllm:1", ["registry.example.com"])
    assert not image_allowed("registry.example.com.evil.io/vllm:1", ["registry.example.com"])
    assert image_allowed("ubuntu:24.04", ["docker.io/library/"])


def test_max_cpu_offload() -> None:
    eff = combine([policy("host", limits={"maxCpuOffloadGiB": 32})])
    assert evaluate(spec(kvOffload={"cpuGiB": 32}), eff) == []
    [v] = evaluate(spec(kvOffload={"cpuGiB": 64}), eff)
    assert (v.field, v.fix) == ("spec.kvOffload.cpuGiB", "set spec.kvOffload.cpuGiB to 32 or less")


def test_every_broken_policy_is_named_and_each_fix_suffices() -> None:
    eff = combine([policy("loose", limits={"maxReplicas": 8}), policy("strict", limits={"maxReplicas": 4})])
    violations = evaluate(spec(replicas=10), eff)
    assert fields(violations) == [("loose", "spec.replicas"), ("strict", "spec.replicas")]
    assert {v.fix for v in violations} == {"set spec.replicas to 4 or fewer"}
    assert fields(evaluate(spec(replicas=6), eff)) == [("strict", "spec.replicas")]


def test_planner_runs_through_plan_fn() -> None:
    seen: list[InferenceModelSpec] = []

    def plan_fn(s: InferenceModelSpec) -> Any:
        seen.append(s)
        from loadline.sizing import plan_inference_model

        return plan_inference_model(s)

    check(spec(), combine([policy(limits={"gpuTypes": ["L40S"], "maxGPUsPerReplica": 2})]), plan_fn)
    assert [(s.gpu.types, s.gpu.max_gpus_per_replica) for s in seen] == [(["L40S"], 2)]
    seen.clear()
    check(spec(), combine([policy(limits={"providers": ["aws"]})]), plan_fn)
    assert [s.gpu.providers for s in seen] == [["aws"]]


# --- the decision ----------------------------------------------------------------------------------


def _violation(policy_name: str) -> Violation:
    return Violation(
        policy_name, "spec.replicas", "9 exceeds maxReplicas 4", "set spec.replicas to 4 or fewer"
    )


def test_decide_by_enforcement() -> None:
    deny, warn, dry = policy("deny"), policy("warn", enforcement="warn"), policy("dry", enforcement="dryrun")
    refused = decide([_violation("deny"), _violation("warn")], [deny, warn])
    assert not refused.allowed
    assert (
        refused.message
        == "FleetPolicy deny: spec.replicas: 9 exceeds maxReplicas 4 (fix: set spec.replicas to 4 or fewer)"
    )
    assert refused.warnings == (_violation("warn").line(),)
    warned = decide([_violation("warn")], [warn])
    assert warned.allowed and warned.message == "" and warned.warned == (_violation("warn"),)
    dry_run = decide([_violation("dry")], [dry])
    assert dry_run.allowed and dry_run.warnings[0].startswith("dryrun: would refuse: FleetPolicy dry:")
    assert decide([], [deny]) == AdmissionDecision(True, "", ())


def test_a_violation_of_an_unknown_policy_fails_closed() -> None:
    assert not decide([_violation("gone")], []).allowed


def test_planner_violation_details_reach_the_refusal(tmp_path: Path) -> None:
    p = policy("small", limits={"gpuTypes": ["L4"], "maxGPUsPerReplica": 1})
    decision = decide(evaluate(spec(maxModelLen=32768, concurrency=32), combine([p])), [p])
    assert not decision.allowed
    assert "\n  - L4x1" in decision.message
