"""What one crash costs the API server: the OOM handler decides on the model as the operator's index last
saw it (no GET), writes the decision once, and reads the model only when that entry was stale (409)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kopf
import pytest

from loadline.handlers import _events, _kube, _oom, _readiness, _rollout
from loadline.handlers._state import OperatorState
from loadline.settings import OperatorSettings
from loadline.state import ROLL_OUT_GUARD_SECONDS, _index
from loadline.status import build as _build
from tests.test_oom_operator_side import pod
from tests.test_reconcile_requests import FakeParent, available_deployment

LOG = logging.getLogger("test")


@pytest.fixture
def parent(monkeypatch: pytest.MonkeyPatch) -> FakeParent:
    """The Ready model on a stand-in API server (every request recorded, a stale status patch refused
    with 409); the annotation that asks for the roll-out is recorded too, Events and log reads not."""
    model = FakeParent({"phase": "Ready"})
    monkeypatch.setattr(_kube, "get", model.get)
    monkeypatch.setattr(_kube, "patch_status", model.patch_status)
    monkeypatch.setattr(_kube, "patch_status_tested", model.patch_status_tested)
    monkeypatch.setattr(_kube, "annotate", lambda obj, annotations: model.calls.append("annotate"))
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    monkeypatch.setattr(_oom, "_read_previous_log", lambda *a, **k: "")
    return model


def crashed_pod() -> dict[str, Any]:
    body = pod("OOMKilled", 137)
    body["metadata"] |= {"namespace": "team-a", "labels": {_index.INSTANCE_LABEL: "chat"}}
    body["spec"]["nodeName"] = "gpu-1"
    return body


def decided(parent: FakeParent) -> bool:
    return bool(parent.model["status"]["remediation"]["handledCrashes"])


def roll_out_with(
    monkeypatch: pytest.MonkeyPatch,
    plan: Callable[[dict[str, Any]], Any],
    start: Callable[[dict[str, Any], str, Any], Any],
) -> _oom.Indexes:
    """The crash's own roll-out, its plan stood in for by ``plan`` (given the model as the decision
    will leave it) and its start on the MODELS lane by ``start``; the (empty) indexes that turn it on."""
    monkeypatch.setattr(_rollout, "plan_remediation", lambda _state, model, *a, **k: plan(model))
    monkeypatch.setattr(
        _oom,
        "roll_out_soon",
        lambda _state, _settings, _logger, model, crash, remediation, **_: start(model, crash, remediation),
    )
    return {}, {}


def test_a_crash_is_decided_on_the_indexed_model_without_reading_it(
    state: OperatorState, parent: FakeParent
) -> None:
    known = _index.model_entry(parent.model)
    _oom.on_pod_event(state, crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "annotate"] and decided(parent)
    assert parent.model["status"]["remediation"]["revision"] == 1  # what the next decision's write tests


def test_a_readiness_write_meanwhile_does_not_refuse_the_decision(
    state: OperatorState, parent: FakeParent
) -> None:
    """The crash makes the workload unavailable, whose event writes the model's phase and Ready
    condition, often before the crash is decided on the index's older entry: the decision did not read
    them, so its write tests what it read and lands at once, keeping what readiness wrote."""
    known = _index.model_entry(parent.model)
    parent.model["status"]["phase"] = "Deploying"  # written meanwhile by the workload's event
    parent.model["metadata"]["resourceVersion"] = "8"
    _oom.on_pod_event(state, crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "annotate"] and decided(parent)
    assert parent.model["status"]["phase"] == "Deploying"


def test_a_model_changed_in_what_the_decision_read_is_read_again_and_decided_again(
    state: OperatorState,
    parent: FakeParent,
) -> None:
    """Another crash of the model decided meanwhile (the entry the decision was made on does not show
    it): the write's test refuses it, and the crash is decided again on the model as it is now, so the
    other crash's decision is kept and counted."""
    known = _index.model_entry(parent.model)
    parent.model["status"]["remediation"] = {"handledCrashes": ["earlier"], "actionsToday": 1, "revision": 1}
    parent.model["metadata"]["resourceVersion"] = "8"
    _oom.on_pod_event(state, crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "get", "patch", "annotate"] and decided(parent)
    assert parent.model["status"]["remediation"]["handledCrashes"][0] == "earlier"


def test_without_an_indexed_model_the_crash_reads_it(state: OperatorState, parent: FakeParent) -> None:
    _oom.on_pod_event(state, crashed_pod(), LOG, OperatorSettings(), [], None)  # type: ignore[arg-type]
    assert parent.calls == ["get", "patch", "annotate"] and decided(parent)


def test_a_remediation_is_planned_before_its_decision_and_written_with_it(
    state: OperatorState, parent: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roll-out plans the model as the decision will leave it (the crash in its status, the new
    overrides), before the write, so that the decision's one patch carries the plan; it is then handed
    the model as the write answered and the crash's id. The crash's thread writes nothing more, and
    reconcile is told, from before the write, to pass over versions without this decision."""
    planned: list[dict[str, Any]] = []
    handed: list[tuple[dict[str, Any], str, Any]] = []
    remediation = _rollout.Remediation(plan=None, replicas=1, workload={}, status={"message": "re-planned"})  # type: ignore[arg-type]

    def plan(model: dict[str, Any]) -> _rollout.Remediation:
        parent.calls.append("plan")
        planned.append(model)
        return remediation

    def start(model: dict[str, Any], crash: str, planned_remediation: Any) -> None:
        parent.calls.append("start")
        handed.append((model, crash, planned_remediation))

    def write(model: dict[str, Any], sets: Any, tested: Any, changes: dict[str, Any]) -> dict[str, Any]:
        assert state.roll_outs.predates(parent.model)  # guarded before the write
        return parent.patch_status_tested(model, sets, tested, changes)

    monkeypatch.setattr(_kube, "patch_status_tested", write)
    known = _index.model_entry(parent.model)
    _oom.on_pod_event(
        state, crashed_pod(), LOG, OperatorSettings(), [], known, roll_out_with(monkeypatch, plan, start)
    )  # type: ignore[arg-type]
    assert parent.calls == ["plan", "patch", "start"]
    model, crash, handed_remediation = handed[0]
    assert planned[0]["status"]["remediation"]["handledCrashes"][-1] == crash
    assert planned[0]["status"]["remediation"]["overrides"]  # what the roll-out plans with
    assert model["status"]["message"] == "re-planned" and handed_remediation is remediation
    assert not state.roll_outs.predates(parent.model)  # the decision's version ends the guard


def test_a_remediation_left_to_reconcile_is_still_handed_to_the_roll_out(
    state: OperatorState, parent: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No plan (a move between layouts, a failed plan): the decision is written alone and the roll-out
    is handed nothing to apply (it asks reconcile)."""
    handed: list[Any] = []
    roll_out = roll_out_with(
        monkeypatch, lambda model: None, lambda model, crash, remediation: handed.append(remediation)
    )
    _oom.on_pod_event(
        state, crashed_pod(), LOG, OperatorSettings(), [], _index.model_entry(parent.model), roll_out
    )  # type: ignore[arg-type]
    assert handed == [None] and decided(parent) and "plan" not in parent.model["status"]


def test_a_refused_annotation_is_tried_again(parent: FakeParent, monkeypatch: pytest.MonkeyPatch) -> None:
    """The annotation that hands a remediation to reconcile is written by nothing else (the crash is
    decided, so its next event does nothing): a refusal is tried again, up to ASK_ATTEMPTS times, and
    not at all when the model is gone."""
    from kubernetes.client.exceptions import ApiException

    answers: list[int | None] = [500, None]

    def annotate(obj: Any, annotations: Any) -> None:
        status = answers.pop(0)
        parent.calls.append(f"annotate {status or 200}")
        if status is not None:
            raise ApiException(status=status, reason="etcd timeout")

    monkeypatch.setattr(_kube, "annotate", annotate)
    monkeypatch.setattr(_rollout, "ASK_PAUSE_SECONDS", 0.0)
    assert _rollout.ask_reconcile(parent.model, "c1", LOG)
    assert parent.calls == ["annotate 500", "annotate 200"]

    answers[:] = [500] * _rollout.ASK_ATTEMPTS
    assert not _rollout.ask_reconcile(parent.model, "c2", LOG)
    assert not answers

    answers[:] = [404]  # the model is gone: nothing to try again
    assert not _rollout.ask_reconcile(parent.model, "c3", LOG)
    assert not answers


def test_the_guard_ends_with_its_decisions_version_or_its_time(
    state: OperatorState, parent: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reconcile passes over versions without the decision until one carrying it comes, and for
    ROLL_OUT_GUARD_SECONDS at most (a decision whose version never comes must not hold reconcile off)."""
    import time

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    state.roll_outs.expect("team-a", "chat", "c1")
    clock[0] += ROLL_OUT_GUARD_SECONDS - 1
    assert state.roll_outs.predates(parent.model)
    clock[0] += 2
    assert not state.roll_outs.predates(parent.model)  # its version never came


def test_a_decision_whose_write_fails_ends_the_guard(
    state: OperatorState, parent: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.client.exceptions import ApiException

    def refuse(*args: Any) -> Any:
        raise ApiException(status=500, reason="etcd timeout")

    monkeypatch.setattr(_kube, "patch_status_tested", refuse)
    roll_out = roll_out_with(monkeypatch, lambda model: None, lambda *a: None)
    with pytest.raises(ApiException):
        _oom.on_pod_event(
            state, crashed_pod(), LOG, OperatorSettings(), [], _index.model_entry(parent.model), roll_out
        )  # type: ignore[arg-type]
    assert not state.roll_outs.predates(parent.model)  # no decision: reconcile goes on as before


def test_a_crash_whose_fix_rolls_now_posts_two_events(
    state: OperatorState, parent: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What happened (OutOfMemory, a Warning) and what was done (Remediated, which says the roll-out
    starts now): no RestartStarted beside them in the same second, since Events are the largest share
    of a crash burst's writes."""
    said: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        kopf, "event", lambda obj, type, reason, message: said.append((type, reason, message))
    )
    known = _index.model_entry(parent.model)
    roll_out = roll_out_with(monkeypatch, lambda model: None, lambda *a: None)
    _oom.on_pod_event(state, crashed_pod(), LOG, OperatorSettings(), [], known, roll_out)  # type: ignore[arg-type]
    assert parent.model["status"]["maintenance"]["state"] == "Running"  # a crash loop: it rolls now
    assert [(kind, reason) for kind, reason, _ in said] == [
        ("Warning", "OutOfMemory"),
        ("Normal", "Remediated"),
    ]
    assert said[1][2].endswith("Restart: " + parent.model["status"]["maintenance"]["reason"])


def test_with_nothing_to_test_against_the_decision_is_guarded_by_the_resource_version(
    state: OperatorState,
    parent: FakeParent,
) -> None:
    """A model whose conditions the decision would reorder (or with no status to test) is written as a
    merge patch guarded by its resourceVersion: a stale entry is refused, read again and decided again."""
    known = _index.model_entry(parent.model)
    known["status"] = {}  # nothing the write could test
    parent.model["metadata"]["resourceVersion"] = "8"
    _oom.on_pod_event(state, crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert parent.calls == ["patch", "get", "patch", "annotate"] and decided(parent)


@pytest.fixture
def ready_parent(monkeypatch: pytest.MonkeyPatch) -> FakeParent:
    """A Ready model (its Ready condition Available) on the stand-in API server; Events and log reads
    not recorded."""
    conditions = _build.merge_conditions(
        [],
        [_build.build_condition(_build.READY, True, "Available", "1/1 replicas available", 1)],
        _build.now_iso(),
    )
    parent = FakeParent({"phase": "Ready", "observedGeneration": 1, "conditions": conditions})
    for name in ("get", "patch_status", "patch_status_tested"):
        monkeypatch.setattr(_kube, name, getattr(parent, name))
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    monkeypatch.setattr(_events, "event", lambda *a, **k: None)
    monkeypatch.setattr(_oom, "_read_previous_log", lambda *a, **k: "")
    return parent


def crash_rolled_now(
    monkeypatch: pytest.MonkeyPatch, state: OperatorState, parent: FakeParent, known: dict[str, Any]
) -> None:
    """A crash whose fix is the workload alone, decided on ``known`` (the index's entry)."""
    remediation = _rollout.Remediation(plan=None, replicas=1, workload={}, status={})  # type: ignore[arg-type]
    roll_out = roll_out_with(monkeypatch, lambda model: remediation, lambda *a: None)
    _oom.on_pod_event(state, crashed_pod(), LOG, OperatorSettings(), [], known, roll_out)  # type: ignore[arg-type]


def test_a_fix_that_rolls_now_says_deploying_in_its_decision_and_the_roll_out_writes_only_ready(
    state: OperatorState,
    monkeypatch: pytest.MonkeyPatch,
    ready_parent: FakeParent,
) -> None:
    """The decision's one write says the model is Deploying because its remediation rolls out (the
    Ready condition's reason Remediating, naming the fix); the workload's steps meanwhile cost no
    request, and its availability is one write, back to Ready. Before, the phase going Deploying was
    a write of its own, and the roll-out's progress more: half of a crash's writes of the model."""
    parent = ready_parent
    crash_rolled_now(monkeypatch, state, parent, _index.model_entry(parent.model))
    assert parent.calls == ["patch"] and decided(parent)
    status = parent.model["status"]
    assert status["phase"] == "Deploying"
    condition = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (
        condition["reason"] == _build.REMEDIATING
        and status["incidents"][-1]["result"] in condition["message"]
    )

    parent.calls.clear()
    known = _index.model_entry(parent.model)
    # The crashed workload (generation 1) available again before the fix is applied: not Ready.
    _readiness.on_workload_event(state, kopf.Body(available_deployment(parent.model)), LOG, known)
    assert parent.calls == []
    state.roll_outs.applied("team-a", "chat", 2)  # as the roll-out's apply does (generation 2)
    _readiness.on_workload_event(state, kopf.Body(available_deployment(parent.model)), LOG, known)
    assert parent.calls == []  # a late event of generation 1 says nothing about the fix either
    rolling = available_deployment(parent.model)
    rolling["metadata"]["generation"] = 2  # the raised limit applied, not yet observed
    _readiness.on_workload_event(state, kopf.Body(rolling), LOG, known)
    assert parent.calls == []
    rolled = available_deployment(parent.model)
    rolled["metadata"]["generation"] = rolled["status"]["observedGeneration"] = 2
    _readiness.on_workload_event(state, kopf.Body(rolled), LOG, known)
    assert parent.calls == ["patch"] and parent.model["status"]["phase"] == "Ready"


def test_the_roll_outs_end_is_judged_on_the_model_when_the_index_has_not_seen_the_decision(
    state: OperatorState,
    monkeypatch: pytest.MonkeyPatch,
    ready_parent: FakeParent,
) -> None:
    """The workload becomes available before the index shows the decision (Deploying, Remediating): on
    the index's older entry (Ready) nothing would change, and the model would stay Deploying. The
    model is read instead, and written Ready."""
    parent = ready_parent
    stale = _index.model_entry(parent.model)  # the index, before the decision
    crash_rolled_now(monkeypatch, state, parent, stale)
    assert parent.model["status"]["phase"] == "Deploying"
    parent.calls.clear()
    state.roll_outs.applied("team-a", "chat", 2)  # as the roll-out's apply does
    rolled = available_deployment(parent.model)
    rolled["metadata"]["generation"] = rolled["status"]["observedGeneration"] = 2
    _readiness.on_workload_event(state, kopf.Body(rolled), LOG, stale)
    assert parent.calls == ["get", "patch"] and parent.model["status"]["phase"] == "Ready"


def test_a_fix_that_waits_for_a_roll_out_slot_says_so_in_its_decision_and_is_handed_paused(
    monkeypatch: pytest.MonkeyPatch, ready_parent: FakeParent
) -> None:
    """A storm has taken every roll-out slot: the decision's one write says the fix waits, how many are
    ahead and which limit holds it; the roll-out is handed it to apply paused. The same workload's
    crashes meanwhile are not decided again (they are the crash the fix is for)."""
    from types import SimpleNamespace

    from loadline.pacing import Pacer, PacingLimits, RollOutRequest

    state = OperatorState(pacer=Pacer(PacingLimits(at_once=1)))
    assert state.pacer.ask(RollOutRequest("team-b/other", "L4")) is None
    plan = SimpleNamespace(chosen=SimpleNamespace(gpu=SimpleNamespace(name="L4")))
    deployment = {"kind": "Deployment", "metadata": {"name": "chat"}, "spec": {}}
    remediation = _rollout.Remediation(plan=plan, replicas=1, workload=deployment, status={})  # type: ignore[arg-type]
    handed: list[bool] = []
    monkeypatch.setattr(_rollout, "plan_remediation", lambda *a, **k: remediation)
    monkeypatch.setattr(_oom, "roll_out_soon", lambda *a, paused=False: handed.append(paused))
    parent = ready_parent
    _oom.on_pod_event(
        state, crashed_pod(), LOG, OperatorSettings(), [], _index.model_entry(parent.model), ({}, {})
    )  # type: ignore[arg-type]
    assert handed == [True] and state.pacer.waiting("team-a/chat")
    condition = next(c for c in parent.model["status"]["conditions"] if c["type"] == "Ready")
    assert condition["reason"] == _build.REMEDIATING
    assert condition["message"].startswith(
        "the remediation waits to roll out: 1 ahead of it; 1 roll-out runs fleet-wide (at most 1 at once)"
    )
    parent.calls.clear()
    again = crashed_pod()
    again["status"]["containerStatuses"][0]["restartCount"] = 5
    _oom.on_pod_event(state, again, LOG, OperatorSettings(), [], _index.model_entry(parent.model), ({}, {}))  # type: ignore[arg-type]
    assert parent.calls == [] and handed == [True]
    state.pacer.stop()
