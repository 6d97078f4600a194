"""A storm's roll-outs paced: which start, in what order, what the waiting ones are told
(loadline.pacing), the queue that carries it out (loadline.pacing._pacer), and a crash's fix applied
paused while it waits and rolled when a slot frees (loadline.handlers._rollout)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Any

import pytest

from loadline.handlers import _kube, _rollout
from loadline.handlers._state import OperatorState
from loadline.pacing import Pacer, PacingLimits, RollOutRequest, plan_pacing
from loadline.settings import OperatorSettings

LOG = logging.getLogger("test")


def ask(key: str, pool: str = "L4", priority: int = 0, serves: int = 1, since: float = 0.0) -> RollOutRequest:
    return RollOutRequest(key, pool, priority, serves, since)


def test_at_most_the_limit_starts_and_the_rest_are_told_how_many_are_ahead_and_why() -> None:
    queued = [ask(f"ns/m{i}", since=i) for i in range(5)]
    plan = plan_pacing({"ns/old": "L4"}, queued, PacingLimits(at_once=3))
    assert [r.key for r in plan.start] == ["ns/m0", "ns/m1"]
    assert [(w.key, w.ahead) for w in plan.waiting] == [("ns/m2", 3), ("ns/m3", 4), ("ns/m4", 5)]
    assert plan.waiting[0].reason == "3 roll-outs run fleet-wide (at most 3 at once)"


def test_priority_then_what_a_model_serves_then_when_it_asked_decide_the_order() -> None:
    queued = [
        ask("ns/early-small", serves=1, since=1),
        ask("ns/late-big", serves=64, since=5),
        ask("ns/late-small", serves=1, since=9),
        ask("ns/urgent", priority=10, serves=1, since=20),
    ]
    plan = plan_pacing({}, queued, PacingLimits(at_once=1))
    assert [r.key for r in plan.start] == ["ns/urgent"]
    assert [w.key for w in plan.waiting] == ["ns/late-big", "ns/early-small", "ns/late-small"]


def test_a_full_pool_does_not_hold_back_another_pools_roll_outs() -> None:
    """The L4 pool's storm takes its own slots; an H100 model behind it in the order starts at once."""
    queued = [ask("ns/a", "L4", since=1), ask("ns/b", "L4", since=2), ask("ns/h", "H100-80GB", since=3)]
    plan = plan_pacing({"ns/x": "L4"}, queued, PacingLimits(at_once=10, per_pool=2))
    assert [r.key for r in plan.start] == ["ns/a", "ns/h"]
    (waiting,) = plan.waiting
    assert waiting.key == "ns/b" and waiting.ahead == 2
    assert waiting.reason == "2 roll-outs run on L4 GPUs (at most 2 at once per GPU pool)"


def test_without_limits_every_roll_out_starts() -> None:
    plan = plan_pacing(
        {f"ns/r{i}": "L4" for i in range(500)}, [ask(f"ns/m{i}") for i in range(500)], PacingLimits()
    )
    assert len(plan.start) == 500 and not plan.waiting


def test_a_limit_below_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="0 \\(no limit\\) or more"):
        PacingLimits(at_once=-1)


def test_a_slot_freed_goes_to_the_next_in_order_and_its_release_runs() -> None:
    pacer = Pacer(PacingLimits(at_once=1))
    released: list[str] = []
    assert pacer.ask(ask("ns/a", since=1)) is None  # runs now
    waiting_b = pacer.ask(ask("ns/b", since=2))
    waiting_c = pacer.ask(ask("ns/c", since=3, priority=5))
    assert waiting_b is not None and waiting_c is not None and waiting_c.ahead == 1
    pacer.hold("ns/b", lambda: released.append("ns/b"))
    pacer.hold("ns/c", lambda: released.append("ns/c"))
    assert pacer.waiting("ns/b") and pacer.running("ns/a")
    pacer.finished("ns/a")
    assert released == ["ns/c"]  # the higher priority first
    pacer.finished("ns/c")
    assert released == ["ns/c", "ns/b"] and not pacer.waiting("ns/b")
    pacer.stop()


def test_asked_again_after_a_conflict_a_model_keeps_its_slot_or_its_place() -> None:
    pacer = Pacer(PacingLimits(at_once=1))
    assert pacer.ask(ask("ns/a")) is None and pacer.ask(ask("ns/a")) is None
    first = pacer.ask(ask("ns/b", since=1))
    again = pacer.ask(ask("ns/b", since=2))
    assert first is not None and again is not None and again.ahead == first.ahead
    pacer.stop()


def test_a_slot_freed_before_the_paused_apply_is_done_releases_it_at_once() -> None:
    pacer = Pacer(PacingLimits(at_once=1))
    released: list[str] = []
    pacer.ask(ask("ns/a"))
    pacer.ask(ask("ns/b", since=1))
    pacer.finished("ns/a")  # ns/b's turn, before its paused apply handed its release in
    assert released == []
    pacer.hold("ns/b", lambda: released.append("ns/b"))
    assert released == ["ns/b"] and pacer.running("ns/b")
    pacer.stop()


def test_a_roll_out_that_never_completes_gives_its_slot_up_after_a_while() -> None:
    """A model whose new pod cannot start does not stop the fleet: its slot runs out."""
    pacer = Pacer(PacingLimits(at_once=1), slot_seconds=0.2)
    released: list[str] = []
    pacer.ask(ask("ns/stuck"))
    pacer.ask(ask("ns/next", since=1))
    pacer.hold("ns/next", lambda: released.append("ns/next"))
    deadline = time.monotonic() + 5
    while not released and time.monotonic() < deadline:
        time.sleep(0.05)
    assert released == ["ns/next"]  # by the pacer's own watch, with no event at all
    pacer.stop()


def test_a_cancelled_roll_out_frees_its_slot() -> None:
    pacer = Pacer(PacingLimits(at_once=1))
    released: list[str] = []
    pacer.ask(ask("ns/a"))
    pacer.ask(ask("ns/b", since=1))
    pacer.hold("ns/b", lambda: released.append("ns/b"))
    pacer.cancel("ns/a")  # its decision was not written, or the model was deleted
    assert released == ["ns/b"]
    pacer.stop()


def _deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "team-a"},
        "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "vllm"}]}}},
    }


def test_a_fix_that_waits_is_applied_paused_and_rolled_unpaused_when_its_turn_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The template carries the fix at once (the Deployment paused: nothing rolls); when the model
    ahead finishes, the same workload is applied again without ``paused``, which server-side apply
    turns into a roll-out."""
    state = OperatorState(pacer=Pacer(PacingLimits(at_once=1)))
    applied: list[dict[str, Any]] = []

    def apply(manifest: dict[str, Any], *_: Any) -> tuple[dict[str, Any], bool]:
        applied.append(manifest)
        return {"metadata": {"generation": len(applied)}}, True

    monkeypatch.setattr(_kube, "apply", apply)
    monkeypatch.setattr(_rollout._events, "report_fallback", lambda *a: None)
    submitted: list[Future[object]] = []
    submit = state.lanes.models.submit
    monkeypatch.setattr(state.lanes.models, "submit", lambda *a, **k: submitted.append(submit(*a, **k)))
    fix = _rollout.Remediation(plan=object(), replicas=1, workload=_deployment(), status={})  # type: ignore[arg-type]
    model = {"metadata": {"namespace": "team-a", "name": "chat"}, "status": {}}
    monkeypatch.setattr(state.capacity, "note_planned", lambda *a: None)

    assert state.pacer.ask(ask("team-a/other")) is None
    assert state.pacer.ask(ask("team-a/chat", since=1)) is not None
    _rollout.roll_out(state, OperatorSettings(), model, "crash-1", fix, LOG, paused=True)
    assert applied[-1]["spec"]["paused"] is True
    assert applied[-1]["spec"]["template"] == _deployment()["spec"]["template"]

    state.pacer.finished("team-a/other")
    for future in submitted:
        future.result(timeout=10)
    assert len(applied) == 2 and "paused" not in applied[-1]["spec"]
    assert state.pacer.running("team-a/chat")
    state.pacer.stop()
    state.lanes.shutdown(wait=True)


def test_a_slot_is_held_until_the_controller_created_the_new_pods_not_until_they_serve() -> None:
    """The control plane's part of a roll-out ends when its new pods exist; their start (minutes of
    weight loading on a real GPU node) holds no slot. A paused or not yet observed Deployment has not
    started its roll-out."""
    from loadline.status import build as _build

    def deployment(
        paused: bool = False, observed: int = 2, updated: int = 1, available: int = 0
    ) -> dict[str, Any]:
        return {
            "metadata": {"generation": 2},
            "spec": {"replicas": 1, "paused": paused},
            "status": {
                "observedGeneration": observed,
                "updatedReplicas": updated,
                "availableReplicas": available,
            },
        }

    assert _build.new_pods_created(deployment())  # created, not available yet
    assert not _build.new_pods_created(deployment(paused=True, updated=0))
    assert not _build.new_pods_created(deployment(observed=1))
    assert not _build.new_pods_created(deployment(updated=0))
