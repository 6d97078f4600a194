"""spec.autoscaling and the scale subresource: the API's rules, the KEDA ScaledObject rendered for the
model's vLLM version, the FleetPolicy bounds at the most replicas the autoscaler may run, what the plan
says of one replica and of maxReplicas, and the scale status the operator writes."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest

from loadline import telemetry
from loadline.api import parse_fleet_policy, parse_inference_model, parse_spec
from loadline.errors import RenderError, SpecError
from loadline.handlers._scale import model_gauges
from loadline.oom import OomClass
from loadline.policy import combine, evaluate
from loadline.render import render_scaled_object
from loadline.sizing import plan_inference_model
from loadline.status.build import build_scale_status as scale_status
from tests.conftest import LLAMA_8B, inference_model

PROMETHEUS = "http://prometheus.monitoring:9090"


def model(version: str = "0.19.0", **autoscaling: Any) -> Any:
    body = inference_model(
        maxModelLen=8192, concurrency=4, engine={"version": version}, autoscaling=autoscaling
    )
    return parse_inference_model(body)


def spec(**fields: Any) -> Any:
    body: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "config": dict(LLAMA_8B)},
        "maxModelLen": 8192,
        "concurrency": 4,
    }
    body.update(fields)
    return parse_spec(body)


@pytest.mark.parametrize(
    ("autoscaling", "field", "words"),
    [
        (
            {"maxReplicas": 2, "minReplicas": 3, "target": 0.7},
            "spec.autoscaling",
            "minReplicas must be at most",
        ),
        ({"maxReplicas": 2, "signal": "promql", "target": 1}, "spec.autoscaling", "query is required"),
        ({"maxReplicas": 2, "target": 0.7, "query": "up"}, "spec.autoscaling", "only with signal promql"),
        ({"maxReplicas": 2, "target": 70}, "spec.autoscaling", "fraction of the KV cache"),
        ({"maxReplicas": 2, "signal": "gpuUtil", "target": 1}, "spec.autoscaling.signal", "kvCacheUsage"),
        ({"maxReplicas": 0, "target": 1}, "spec.autoscaling.maxReplicas", "greater than or equal to 1"),
        ({"target": 0.5}, "spec.autoscaling.maxReplicas", "required"),
    ],
)
def test_bad_autoscaling_is_refused_in_one_line_naming_the_field(
    autoscaling: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as err:
        spec(autoscaling=autoscaling)
    assert err.value.field == field and words in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("version", "names"),
    [
        ("0.8.5", ["vllm:gpu_cache_usage_perc"]),
        ("0.10.1", ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]),
        ("0.19.0", ["vllm:kv_cache_usage_perc"]),
    ],
)
def test_the_kv_cache_trigger_asks_for_the_names_the_version_exports(version: str, names: list[str]) -> None:
    obj = render_scaled_object(model(version, maxReplicas=4, target=0.7), "team-a", PROMETHEUS)
    assert obj is not None
    [trigger] = obj["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    asked = [n for n in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") if n in query]
    assert asked == names
    # Each pod counted once (its fullest engine), its pods by name in its namespace.
    assert (
        query.startswith("sum(max by (pod) (") and 'namespace="team-a"' in query and 'pod=~"chat-(' in query
    )
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["serverAddress"] == PROMETHEUS and trigger["metadata"]["threshold"] == "0.7"


def test_the_scaled_object_targets_the_models_scale_subresource() -> None:
    obj = render_scaled_object(
        model(
            maxReplicas=6,
            minReplicas=2,
            signal="waitingRequests",
            target=4,
            scaleDownStabilizationSeconds=600,
        ),
        "team-a",
        PROMETHEUS,
    )
    assert obj is not None
    assert obj["apiVersion"] == "keda.sh/v1alpha1" and obj["kind"] == "ScaledObject"
    assert obj["metadata"]["name"] == "chat" and obj["metadata"]["namespace"] == "team-a"
    assert obj["metadata"]["labels"]["loadline.dev/inferencemodel"] == "chat"
    s = obj["spec"]
    assert s["scaleTargetRef"] == {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "name": "chat",
    }
    assert (s["minReplicaCount"], s["maxReplicaCount"]) == (2, 6)
    assert (
        s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
        == 600
    )
    query = s["triggers"][0]["metadata"]["query"]
    assert (
        query.startswith("sum(sum by (pod) (vllm:num_requests_waiting{")
        and s["triggers"][0]["metadata"]["threshold"] == "4"
    )


def test_a_promql_signal_is_the_users_query() -> None:
    mine = 'sum(rate(http_requests_total{service="chat"}[1m]))'
    obj = render_scaled_object(
        model(maxReplicas=3, signal="promql", query=mine, target=20), "team-a", PROMETHEUS
    )
    assert obj is not None and obj["spec"]["triggers"][0]["metadata"]["query"] == mine


def test_no_autoscaling_no_scaled_object_and_no_prometheus_is_refused_naming_the_field() -> None:
    assert render_scaled_object(parse_inference_model(inference_model()), "team-a", "") is None
    with pytest.raises(RenderError) as err:
        render_scaled_object(model(maxReplicas=2, target=0.5), "team-a", "")
    assert str(err.value).startswith("spec.autoscaling: ") and "settings.prometheusUrl" in str(err.value)


def policy(**limits: Any) -> Any:
    return parse_fleet_policy(
        {"apiVersion": "loadline.dev/v1alpha1", "kind": "FleetPolicy", "metadata": {"name": "p"},
         "spec": {"limits": limits}}
    )  # fmt: skip


def test_fleet_policy_max_replicas_bounds_the_autoscalers_max() -> None:
    eff = combine([policy(maxReplicas=3)])
    assert evaluate(spec(autoscaling={"maxReplicas": 3, "target": 0.7}), eff) == []
    [v] = evaluate(spec(autoscaling={"maxReplicas": 5, "target": 0.7}), eff)
    assert v.line() == (
        "FleetPolicy p: spec.autoscaling.maxReplicas: 5 exceeds maxReplicas 3 "
        "(fix: set spec.autoscaling.maxReplicas to 3 or fewer)"
    )


def test_the_price_limit_is_judged_at_max_replicas() -> None:
    # One replica is one L4 at $0.85/h (tests/test_policy.py): 2 fit $2/h, 3 do not.
    eff = combine([policy(maxPricePerHour=2)])
    assert evaluate(spec(autoscaling={"maxReplicas": 2, "target": 0.7}), eff) == []
    [v] = evaluate(spec(autoscaling={"maxReplicas": 3, "target": 0.7}), eff)
    assert (
        v.field == "spec.autoscaling.maxReplicas"
        and "3 × " in v.problem
        and "exceeds maxPricePerHour 2" in v.problem
    )
    assert v.fix == "set spec.autoscaling.maxReplicas to 2 or fewer"


def test_the_plan_says_what_one_replica_costs_and_what_max_replicas_cost() -> None:
    plain = plan_inference_model(spec()).to_dict()["plan"]
    assert "maxReplicas" not in plain and "pricePerReplicaPerHour" not in plain
    summary = plan_inference_model(spec(autoscaling={"maxReplicas": 5, "target": 0.7})).to_dict()["plan"]
    assert summary["maxReplicas"] == 5 and summary["pricePerReplicaPerHour"] == plain["pricePerHour"]
    assert summary["maxPricePerHour"] == pytest.approx(5 * summary["pricePerReplicaPerHour"], abs=5 * 0.005)
    assert summary["maxConcurrency"] > 0  # what one replica serves: sequences of maxModelLen at once


def test_scale_status_is_the_workloads_pods_and_the_pods_selector() -> None:
    status = scale_status("chat", {"spec": {"replicas": 3}, "status": {"replicas": 2, "readyReplicas": 1}})
    assert status == {
        "replicas": 2,
        "selector": "app.kubernetes.io/instance=chat,app.kubernetes.io/name=vllm",
    }
    assert scale_status("chat", {"spec": {"replicas": 0}})["replicas"] == 0
    # A restart's surge pod is the operator's: an HPA reading the scale subresource does not count it.
    surging = {"spec": {"replicas": 3}, "status": {"replicas": 3}}
    assert scale_status("chat", surging, 2)["replicas"] == 2
    assert scale_status("chat", surging, 4)["replicas"] == 3  # scaling up: the pods are not there yet


def deployment(generation: int, observed: int, wanted: int, pods: int, updated: int) -> dict[str, Any]:
    status = {"observedGeneration": observed, "replicas": pods}
    if updated:  # the Deployment controller leaves zero counts out
        status["updatedReplicas"] = updated
    return {"metadata": {"generation": generation}, "spec": {"replicas": wanted}, "status": status}


def test_a_roll_out_does_not_move_the_scale_subresources_count() -> None:
    # A one-pod model's remediation (maxSurge 0): the old pod ends before its successor is made. The
    # Deployment's own count goes 1 → 0 → 1; the model's status.replicas stays 1, so an HPA or KEDA
    # reading the scale subresource sees no scale-down, and the model gets no write for it.
    versions = [
        deployment(generation=2, observed=1, wanted=1, pods=1, updated=1),  # the new template applied
        deployment(generation=2, observed=2, wanted=1, pods=0, updated=0),  # the old pod gone
        deployment(generation=2, observed=2, wanted=1, pods=1, updated=1),  # its successor made
    ]
    seen = [scale_status("chat", version, 1, previous=1)["replicas"] for version in versions]
    assert seen == [1, 1, 1]
    # Without the hold the dip is what the Deployment says (and what status.replicas was before).
    assert [scale_status("chat", version, 1)["replicas"] for version in versions] == [1, 0, 1]
    # A three-replica roll-out holds its count until every pod is of the new template.
    rolling = deployment(generation=5, observed=5, wanted=3, pods=2, updated=1)
    assert scale_status("chat", rolling, 3, previous=3)["replicas"] == 3
    # A scale is no roll-out: every pod is of the current template, and the new count is written.
    scaled_down = deployment(generation=6, observed=6, wanted=1, pods=1, updated=1)
    assert scale_status("chat", scaled_down, 1, previous=3)["replicas"] == 1
    scaled_up = deployment(generation=7, observed=7, wanted=3, pods=3, updated=3)
    assert scale_status("chat", scaled_up, 3, previous=1)["replicas"] == 3
    assert scale_status("chat", deployment(8, 8, 0, 0, 0), 0, previous=1)["replicas"] == 0


def test_model_gauges_follow_spec_and_status_and_go_with_the_model() -> None:
    body = {
        "metadata": {"namespace": "team-z", "name": "gauged"},
        "spec": {"replicas": 3},
        "status": {
            "replicas": 2,
            "measuredGpuMemory": {
                "gpus": 1,
                "plannedGiB": 20.0,
                "maxUsedGiB": 21.5,
                "driftGiB": 1.5,
                "time": "2026-11-29T10:00:00Z",
            },
        },
    }
    model_gauges(body)
    labels = {"namespace": "team-z", "inferencemodel": "gauged"}
    sample = telemetry.MODEL_REPLICAS.labels(*labels.values(), "desired")._value.get()
    assert sample == 3 and telemetry.MODEL_REPLICAS.labels(*labels.values(), "ready")._value.get() == 2
    assert telemetry.MODEL_GPU_MEMORY.labels(*labels.values(), "measured")._value.get() == 21.5 * 1024**3
    # Its incident series exist at 0 for every class before a crash, so that the crash-loop alert's
    # increase() counts the first crash of a loop.
    exported = generate_latest(REGISTRY).decode()
    for oom_class in OomClass:
        line = f'loadline_oom_incidents_total{{inferencemodel="gauged",namespace="team-z",oom_class="{oom_class}"}} 0.0'
        assert line in exported
    assert telemetry.forget("team-z", "gauged") == 4 + len(OomClass)


def test_a_restart_waits_while_the_model_is_being_scaled() -> None:
    from loadline.maintenance import scaling_in_progress

    assert scaling_in_progress(3, 1)  # scaling up: the pods are not there yet
    assert scaling_in_progress(1, 3)  # scaling down
    assert not scaling_in_progress(2, 2)
    assert not scaling_in_progress(2, None)  # not mirrored yet: nothing to wait for


def _scale_fixture() -> tuple[dict[str, Any], dict[str, Any]]:
    owner = {"kind": "InferenceModel", "name": "chat", "uid": "u1"}
    workload = {
        "metadata": {"namespace": "team-a", "name": "chat", "ownerReferences": [owner]},
        "spec": {"replicas": 1},
        "status": {"replicas": 1, "observedGeneration": 1, "updatedReplicas": 1},
    }
    known = {
        "metadata": {"name": "chat", "uid": "u1", "resourceVersion": "5"},
        "spec": {"replicas": 1},
        "status": {"phase": "Deploying"},
    }
    return workload, known


def test_a_scale_count_is_written_without_a_read_and_not_again_while_the_index_lags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count is the workload's, decided on its event: one write, conditioned on the model's uid
    only (no read first); the workload's next event, seen before the index shows the write, costs no
    request."""
    import logging

    from loadline.handlers import _kube
    from loadline.handlers._scale import sync_scale_status
    from loadline.handlers._state import OperatorState

    workload, known = _scale_fixture()
    calls: list[tuple[str, Any]] = []

    def set_members(api_version: str, kind: str, namespace: str, name: str, uid: str, members: Any) -> Any:
        calls.append(("set", (namespace, name, uid, dict(members))))
        return {}

    monkeypatch.setattr(_kube, "set_status_members", set_members)
    monkeypatch.setattr(_kube, "get", lambda *a: calls.append(("get", a)))
    state = OperatorState()
    before_first_status = {key: value for key, value in known.items() if key != "status"}
    sync_scale_status(state, workload, before_first_status, logging.getLogger("test"))
    assert calls == []  # reconcile's first status write carries the count
    sync_scale_status(state, workload, known, logging.getLogger("test"))
    selector = "app.kubernetes.io/instance=chat,app.kubernetes.io/name=vllm"
    assert calls == [("set", ("team-a", "chat", "u1", {"replicas": 1, "selector": selector}))]
    sync_scale_status(state, workload, known, logging.getLogger("test"))  # the index still lags
    assert len(calls) == 1
    scaled = {
        **workload,
        "status": {**workload["status"], "replicas": 2, "updatedReplicas": 2},
        "spec": {"replicas": 2},
    }
    sync_scale_status(state, scaled, {**known, "spec": {"replicas": 2}}, logging.getLogger("test"))
    assert calls[-1] == ("set", ("team-a", "chat", "u1", {"replicas": 2}))


def test_a_scale_status_write_refused_for_a_conflict_is_written_on_the_fresh_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A uid-tested write refused (a model of that name that is not the owner, or a status emptied
    since the index saw it) has the count decided again on the model as read, and a write refused
    there because reconcile wrote the model at the same moment must still land (a single-replica
    Deployment turning available sends no event after that one)."""
    import logging

    from kubernetes.client.exceptions import ApiException

    from loadline.handlers import _kube
    from loadline.handlers._scale import sync_scale_status
    from loadline.handlers._state import OperatorState

    workload, known = _scale_fixture()
    versions = iter(["6", "7"])  # each read finds the model written again since
    writes: list[tuple[str, dict[str, Any]]] = []

    def set_members(*args: Any) -> Any:
        raise ApiException(status=422, reason="Unprocessable Entity")

    def get(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return {**known, "metadata": {**known["metadata"], "resourceVersion": next(versions)}}

    def patch_status(obj: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
        writes.append((obj["metadata"]["resourceVersion"], changes))
        if len(writes) == 1:
            raise ApiException(status=409, reason="Conflict")
        return obj

    monkeypatch.setattr(_kube, "set_status_members", set_members)
    monkeypatch.setattr(_kube, "get", get)
    monkeypatch.setattr(_kube, "patch_status", patch_status)
    sync_scale_status(OperatorState(), workload, known, logging.getLogger("test"))
    assert [version for version, _ in writes] == ["6", "7"]
    assert writes[-1][1]["replicas"] == 1
