"""What one crash costs the API server: the OOM handler decides on the model as the operator's index last
saw it (no GET), writes the decision once, and reads the model again only when what the decision read
of it changed since (its remediation state, incidents, plan, maintenance record or spec)."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pytest

from loadline.handlers import _index, _kube, _oom
from loadline.handlers._settings import OperatorSettings
from tests.test_oom_operator_side import pod
from tests.test_reconcile_requests import FakeParent

LOG = logging.getLogger("test")


@pytest.fixture
def parent(monkeypatch: pytest.MonkeyPatch) -> FakeParent:
    """The Ready model on a stand-in API server (every request recorded, a status patch whose tested
    fields changed refused); the annotation that asks for the roll-out is recorded too, Events and log
    reads not."""
    model = FakeParent({"phase": "Ready"})
    monkeypatch.setattr(_kube, "get", model.get)
    monkeypatch.setattr(_kube, "patch_status_tested", model.patch_status_tested)
    monkeypatch.setattr(_kube, "annotate", lambda obj, annotations: model.calls.append("annotate"))
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    monkeypatch.setattr(_oom, "_read_previous_log", lambda *a, **k: "")
    monkeypatch.setattr(_oom, "SEEN", _oom.SeenCrashes(capacity=10))
    return model


def crashed_pod() -> dict[str, Any]:
    body = pod("OOMKilled", 137)
    body["metadata"] |= {"namespace": "team-a", "labels": {_index.INSTANCE_LABEL: "chat"}}
    body["spec"]["nodeName"] = "gpu-1"
    return body


def decided(parent: FakeParent) -> bool:
    return bool(parent.model["status"]["remediation"]["handledCrashes"])


def test_a_crash_is_decided_on_the_indexed_model_without_reading_it(parent: FakeParent) -> None:
    known = _index.model_entry(parent.model)
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "annotate"] and decided(parent)


def test_a_readiness_change_since_the_index_saw_the_model_costs_no_read(parent: FakeParent) -> None:
    """The crash's own roll-out moves the model's phase and conditions while its decision is made: no
    reason to refuse a decision that never read them."""
    known = _index.model_entry(parent.model)
    parent.model["status"]["phase"] = "Deploying"
    parent.model["metadata"]["resourceVersion"] = "8"
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "annotate"] and decided(parent)
    assert parent.model["status"]["phase"] == "Deploying"  # not written back to what the index showed


def test_a_crash_recorded_since_the_index_saw_the_model_is_read_again_and_kept(parent: FakeParent) -> None:
    """Another crash of the model was decided meanwhile (its remediation state moved): this decision is
    refused, made again on the model as it is, and both crashes stay recorded (one budget, not two)."""
    known = _index.model_entry(parent.model)
    parent.model["status"]["remediation"] = {"handledCrashes": ["another-crash"]}
    parent.model["metadata"]["resourceVersion"] = "8"
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "get", "patch", "annotate"] and decided(parent)
    assert parent.model["status"]["remediation"]["handledCrashes"][0] == "another-crash"


def test_without_an_indexed_model_the_crash_reads_it(parent: FakeParent) -> None:
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], None)  # type: ignore[arg-type]
    assert parent.calls == ["get", "patch", "annotate"] and decided(parent)
