"""What one crash costs the API server: the OOM handler decides on the model as the operator's index last
saw it (no GET), writes the decision once, and reads the model only when that entry was stale (409)."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pytest

from loadline.handlers import _index, _kube, _oom, _reconcile
from loadline.handlers._settings import OperatorSettings
from tests.test_oom_operator_side import pod
from tests.test_reconcile_requests import FakeParent

LOG = logging.getLogger("test")


@pytest.fixture
def parent(monkeypatch: pytest.MonkeyPatch) -> FakeParent:
    """The Ready model on a stand-in API server (every request recorded, a stale status patch refused
    with 409); the annotation that asks for the roll-out is recorded too, Events and log reads not."""
    model = FakeParent({"phase": "Ready"})
    monkeypatch.setattr(_kube, "get", model.get)
    monkeypatch.setattr(_kube, "patch_status", model.patch_status)
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


def test_a_stale_indexed_model_is_read_again_and_the_crash_still_decided(parent: FakeParent) -> None:
    known = _index.model_entry(parent.model)
    known["metadata"]["resourceVersion"] = "6"  # the model changed since the index saw it
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "get", "patch", "annotate"] and decided(parent)


def test_without_an_indexed_model_the_crash_reads_it(parent: FakeParent) -> None:
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], None)  # type: ignore[arg-type]
    assert parent.calls == ["get", "patch", "annotate"] and decided(parent)


def test_a_remediation_is_rolled_out_from_the_decisions_write_before_the_annotation(
    parent: FakeParent,
) -> None:
    """The roll-out is handed the model as the decision's write answered it (the remediation in its
    status), ahead of the annotation whose watch event reconcile waits for; reconcile is told to pass
    over versions of the model older than it."""
    handed: list[dict[str, Any]] = []

    def roll_out(model: dict[str, Any]) -> None:
        parent.calls.append("roll_out")
        handed.append(model)

    known = _index.model_entry(parent.model)
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known, roll_out)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "roll_out", "annotate"]
    crash = handed[0]["status"]["remediation"]["handledCrashes"][-1]
    assert handed[0]["status"]["remediation"]["overrides"]  # what the roll-out plans with
    assert _reconcile.predates_roll_out(parent.model)  # no annotation yet (the stand-in records it only)
    parent.model["metadata"]["annotations"] = {_reconcile.REMEDIATION_ANNOTATION: crash}
    assert not _reconcile.predates_roll_out(parent.model)


def test_when_the_annotation_fails_reconcile_does_not_wait_for_it(
    parent: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roll-out went out but its annotation was refused: no version of the model will carry it, so
    reconcile must not pass over the next one (a spec change would be counted handled and never applied)."""
    from kubernetes.client.exceptions import ApiException

    def refused(obj: Any, annotations: Any) -> None:
        raise ApiException(status=500, reason="etcd timeout")

    monkeypatch.setattr(_kube, "annotate", refused)
    known = _index.model_entry(parent.model)
    with pytest.raises(ApiException):
        _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known, lambda model: None)  # type: ignore[arg-type]
    assert not _reconcile.predates_roll_out(parent.model)
