"""Objects written under a newer loadline's CRD (issue 39, rollback): after `helm rollback` the CRD
keeps the newer fields, and this operator must read such models, policies and statuses, work on
them, and keep the fields it does not know. Files and offline use still refuse an unknown field: there
it is a typo."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loadline.api import RemediationState, parse_fleet_policy, parse_inference_model, validate_known
from loadline.errors import SpecError
from loadline.handlers import _admission
from loadline.hub import ConfigCache
from loadline.oom import remediation_in_force
from loadline.settings import OperatorSettings
from loadline.status.build import merge_incident
from tests.conftest import inference_model, typed_status


def newer_model() -> dict[str, Any]:
    body = inference_model(maxModelLen=4096, gpu={"types": ["L4"]})
    body["spec"]["priorityClass"] = "gold"
    body["spec"]["gpu"]["migProfile"] = "1g.10gb"
    return body


def test_a_file_with_an_unknown_field_is_refused_naming_it() -> None:
    with pytest.raises(SpecError) as refused:
        parse_inference_model(newer_model())
    assert "spec.priorityClass" in str(refused.value)
    assert "spec.gpu.migProfile" in str(refused.value)


def test_a_model_from_the_cluster_is_read_without_the_fields_this_version_lacks() -> None:
    body = newer_model()
    stored = copy.deepcopy(body)
    model = parse_inference_model(body, unknown="ignore")
    assert model.spec.gpu.types == ["L4"] and model.spec.max_model_len == 4096
    assert body == stored  # read, never changed: a write-back merges over the stored object


def test_ignoring_unknown_fields_still_refuses_a_wrong_known_one() -> None:
    body = newer_model()
    body["spec"]["maxModelLen"] = "long"
    with pytest.raises(SpecError) as refused:
        parse_inference_model(body, unknown="ignore")
    assert "spec.maxModelLen" in str(refused.value)
    assert "priorityClass" not in str(refused.value) and "migProfile" not in str(refused.value)


def test_a_policy_from_the_cluster_with_a_newer_field_is_applied() -> None:
    body = {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "FleetPolicy",
        "metadata": {"name": "gpu-budget"},
        "spec": {"enforcement": "deny", "limits": {"maxGPUsPerReplica": 2, "maxGpuHours": 9}},
    }
    with pytest.raises(SpecError, match=r"maxGpuHours"):
        parse_fleet_policy(body)
    policy = parse_fleet_policy(body, unknown="ignore")
    assert policy.spec.limits is not None and policy.spec.limits.max_gpus_per_replica == 2


def test_the_webhook_admits_a_model_carrying_a_newer_field() -> None:
    warnings: list[str] = []  # a refusal raises kopf.AdmissionError and fails the test
    _admission.validate_model(
        newer_model(), None, "CREATE", warnings, [], OperatorSettings(hf_fetch=False), ConfigCache()
    )


def test_remediation_state_written_by_a_newer_version_is_read() -> None:
    status = {
        "remediation": {
            "observedGeneration": 3,
            "revision": 7,
            "handledCrashes": ["pod-a/vllm/1"],
            "budgetWindow": {"hours": 24},  # a newer version's field
        }
    }
    state = remediation_in_force(typed_status(status), 3)
    assert state.revision == 7 and state.handled_crashes == ["pod-a/vllm/1"]
    with pytest.raises(ValueError, match="budgetWindow"):
        RemediationState.model_validate(status["remediation"])
    assert validate_known(RemediationState, status["remediation"]).revision == 7


def test_a_counted_incident_keeps_a_newer_versions_field() -> None:
    previous = [
        {
            "time": "2026-11-28T10:00:00Z", "lastSeen": "2026-11-28T10:00:00Z", "pod": "chat-0",
            "container": "vllm", "class": "kv_cache_overflow", "confidence": 0.9, "evidence": ["e"],
            "count": 1, "action": "reduce_batch", "result": "applied", "loop": "L1",
            "traceId": "abc123",  # a newer version's field
        }
    ]  # fmt: skip
    merged = merge_incident(
        typed_status({"incidents": previous}).incidents, loop="L1", oom_class="kv_cache_overflow", confidence=0.8, evidence=["f"],
        caller_side=False, action="reduce_batch", result="applied", pod="chat-1", container="vllm",
        now="2026-11-28T11:00:00Z",
    )  # fmt: skip
    assert len(merged) == 1 and merged[0]["count"] == 2 and merged[0]["pod"] == "chat-1"
    assert merged[0]["traceId"] == "abc123"
