"""A model's status read once into the API model, and given back as the API server stores it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from loadline.api import InferenceModelStatus, RemediationState
from loadline.maintenance import MaintenanceRecord
from loadline.status import build as _build
from loadline.status import read_status, stored, with_changes
from loadline.status.patch import merged

T0, T1 = "2026-11-29T10:00:00Z", "2026-11-29T11:00:00Z"


def written_status() -> dict[str, Any]:
    """A status as the operator's builders write it, one merge patch after another."""
    from loadline.api import PlanSummary, parse_inference_model
    from loadline.sizing import plan_inference_model
    from tests.conftest import inference_model

    plan: PlanSummary = plan_inference_model(parse_inference_model(inference_model()).spec).summary()
    status = _build.build_deployed_status(
        InferenceModelStatus(), plan_summary=plan, generation=2, ready=True, ready_message="1/1", now=T0,
        message="L4x1",
    )  # fmt: skip
    incidents = _build.merge_incident(
        [], loop="chat-abc/vllm", oom_class="kv_cache_overflow", confidence=0.8, evidence=["e"],
        caller_side=True, action="reduce_batch", result="applied", pod="chat-1", container="vllm", now=T1,
    )  # fmt: skip
    status = merged(status, _build.build_incident_status(incidents, RemediationState(day="2026-11-29")))
    record = MaintenanceRecord(action="restart", state="Scheduled", reason="in the window")
    status = merged(status, {"maintenance": _build.maintenance_patch(None, record)})
    return merged(status, {"replicas": 1, "lastHandledConfiguration": '{"spec": {}}'})


def test_a_status_the_operator_wrote_reads_typed_and_back_unchanged() -> None:
    """What keeps a resync from writing: the typed read gives back exactly what is stored."""
    status = written_status()
    typed = read_status({"status": status})
    assert typed.phase == "Ready" and typed.plan is not None and typed.plan.gpu == status["plan"]["gpu"]
    assert typed.incidents[0].caller_side and typed.maintenance is not None
    assert stored(typed) == status
    assert _build.status_changes(typed, status) == {}


def test_an_absent_member_is_not_its_default_when_compared() -> None:
    typed = read_status({"status": {"phase": "Ready"}})
    assert typed.policies == [] and "policies" not in stored(typed)
    assert _build.status_changes(typed, {"policies": [], "phase": "Ready"}) == {"policies": []}


def test_a_newer_versions_field_is_ignored_and_a_refused_member_read_as_unset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Read from the cluster, a status never stops the operator: a member the model refuses (a hand
    edit through the status subresource) is read as unset, so its next write replaces it, and a field
    a newer loadline wrote is left alone."""
    status = {
        "phase": "Ready",
        "plan": {"gpu": "L4x1"},  # cut short: the model refuses it
        "remediation": {"revision": 3, "budgetWindow": {"hours": 24}},  # a newer version's field
        "futureStanza": {"x": 1},
    }
    with caplog.at_level(logging.WARNING, logger="loadline.status.read"):
        typed = read_status({"status": status})
    assert typed.phase == "Ready" and typed.plan is None
    assert typed.remediation is not None and typed.remediation.revision == 3
    assert "plan" in caplog.text
    assert read_status({"status": "not a status"}) == InferenceModelStatus()
    assert read_status({}) == InferenceModelStatus() and read_status(None) == InferenceModelStatus()


def test_with_changes_is_the_status_as_the_api_server_applies_a_merge_patch() -> None:
    typed = read_status({"status": {**written_status(), "message": "before"}})
    record = MaintenanceRecord(action="restart", state="Done", reason="done")
    patch = {"message": "after", "maintenance": _build.maintenance_patch(typed.maintenance, record)}
    after = with_changes(typed, patch)
    assert after.message == "after" and after.maintenance is not None
    assert after.maintenance.state == "Done" and after.maintenance.scheduled_at is None
    assert stored(after)["plan"] == stored(typed)["plan"]  # what the patch does not name is kept
    assert typed.message == "before"  # the typed status read is not changed
