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


def test_a_remediation_is_handed_to_the_roll_out_and_the_crash_thread_writes_only_its_decision(
    parent: FakeParent,
) -> None:
    """The roll-out is handed the model as the decision's write answered it (the remediation in its
    status) and the crash's id; the crash's thread writes nothing more (the annotation that asks
    reconcile to follow is the roll-out's to write, after it), and reconcile is told to pass over
    versions of the model older than the remediation."""
    handed: list[tuple[dict[str, Any], str]] = []

    def roll_out(model: dict[str, Any], crash: str) -> None:
        parent.calls.append("roll_out")
        handed.append((model, crash))

    known = _index.model_entry(parent.model)
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known, roll_out)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "roll_out"]
    model, crash = handed[0]
    assert model["status"]["remediation"]["handledCrashes"][-1] == crash
    assert model["status"]["remediation"]["overrides"]  # what the roll-out plans with
    assert _reconcile.predates_roll_out(parent.model)  # no annotation yet
    parent.model["metadata"]["annotations"] = {_reconcile.REMEDIATION_ANNOTATION: crash}
    assert not _reconcile.predates_roll_out(parent.model)


def test_a_refused_annotation_is_tried_again_and_then_ends_the_guard(
    parent: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The annotation that asks reconcile to follow a roll-out is written by nothing else (the crash is
    decided, so its next event does nothing): a refusal is tried again; when it never lands, no version
    will carry it, so reconcile must not pass over the next one (a spec change would be counted handled
    and never applied)."""
    from kubernetes.client.exceptions import ApiException

    answers: list[int | None] = [500, None]

    def annotate(obj: Any, annotations: Any) -> None:
        status = answers.pop(0)
        parent.calls.append(f"annotate {status or 200}")
        if status is not None:
            raise ApiException(status=status, reason="etcd timeout")

    monkeypatch.setattr(_kube, "annotate", annotate)
    monkeypatch.setattr(_reconcile, "ASK_PAUSE_SECONDS", 0.0)
    _reconcile.expect_roll_out("team-a", "chat", "c1")
    assert _reconcile.ask_reconcile(parent.model, "c1", LOG)
    assert parent.calls == ["annotate 500", "annotate 200"]
    assert _reconcile.predates_roll_out(parent.model)  # written: its version is still to come

    answers[:] = [500] * _reconcile.ASK_ATTEMPTS
    _reconcile.expect_roll_out("team-a", "chat", "c2")
    assert not _reconcile.ask_reconcile(parent.model, "c2", LOG)
    assert not answers and not _reconcile.predates_roll_out(parent.model)

    answers[:] = [404]  # the model is gone: nothing to try again
    _reconcile.expect_roll_out("team-a", "chat", "c3")
    assert not _reconcile.ask_reconcile(parent.model, "c3", LOG)
    assert not answers and not _reconcile.predates_roll_out(parent.model)


def test_the_guard_lasts_until_the_annotation_is_written_and_its_time_runs_from_then(
    parent: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a burst of crashes the annotations wait in their lane behind the roll-outs: the guard must not
    lapse while one waits (reconcile would undo the roll-out from an older version)."""
    import time

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    _reconcile.expect_roll_out("team-a", "chat", "c1")
    clock[0] += 10 * _reconcile.ROLL_OUT_GUARD_SECONDS
    assert _reconcile.predates_roll_out(parent.model)  # still waiting for its annotation
    assert _reconcile.ask_reconcile(parent.model, "c1", LOG)
    clock[0] += _reconcile.ROLL_OUT_GUARD_SECONDS - 1
    assert _reconcile.predates_roll_out(parent.model)
    clock[0] += 2
    assert not _reconcile.predates_roll_out(parent.model)  # its version never came: someone rewrote it


def test_a_crash_whose_fix_rolls_now_posts_two_events(
    parent: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What happened (OutOfMemory, a Warning) and what was done (Remediated, which says the roll-out
    starts now): no RestartStarted beside them in the same second, since Events are the largest share
    of a crash burst's writes."""
    said: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        kopf, "event", lambda obj, type, reason, message: said.append((type, reason, message))
    )
    known = _index.model_entry(parent.model)
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known, lambda model, crash: None)  # type: ignore[arg-type]
    assert parent.model["status"]["maintenance"]["state"] == "Running"  # a crash loop: it rolls now
    assert [(kind, reason) for kind, reason, _ in said] == [
        ("Warning", "OutOfMemory"),
        ("Normal", "Remediated"),
    ]
    assert said[1][2].endswith("Restart: " + parent.model["status"]["maintenance"]["reason"])
