"""Lanes: the handlers users wait on (a model's reconcile, a crash) run on bounded pools of their own,
so routine work filling kopf's pool cannot delay them, and what needs no network stays on the loop."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import inspect
import threading
import time
from typing import Any

import kopf
import pytest

from loadline import lanes
from loadline.handlers import _oom, _reconcile, _registry, _rollout
from loadline.handlers._state import OperatorState
from loadline.settings import OperatorSettings
from tests.test_oom_operator_side import pod

WHO = contextvars.ContextVar("who", default="nobody")


def test_a_lane_runs_at_most_its_size_at_once_in_the_callers_context() -> None:
    lane = lanes.Lane("test", 2)
    running, peak = 0, 0
    lock = threading.Lock()
    seen: list[tuple[str, str]] = []

    def work() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        seen.append((threading.current_thread().name, WHO.get()))
        time.sleep(0.05)
        with lock:
            running -= 1

    async def main() -> None:
        WHO.set("handler of ns/chat")
        await asyncio.gather(*(lane.run(work) for _ in range(6)))

    asyncio.run(main())
    assert peak == 2
    assert all(name.startswith("lane-test") and who == "handler of ns/chat" for name, who in seen)


def test_a_full_lane_does_not_delay_another() -> None:
    """Crashes are handled while every models thread is busy (and the other way round): the models
    lane's one thread waits for an event only the crashes lane's work sets. Were the crash queued
    behind it, the wait would run out (after 30 s) instead of seeing the event."""
    models, crashes = lanes.Lane("m", 1), lanes.Lane("c", 1)
    release = threading.Event()

    async def main() -> bool:
        blocked = asyncio.ensure_future(models.run(release.wait, 30))
        await asyncio.sleep(0.05)  # the models lane's thread is taken
        await crashes.run(release.set)
        return await blocked

    assert asyncio.run(main()) is True


def test_a_stopping_run_waits_for_its_lanes_work() -> None:
    """kopf's cleanup shuts the run's lanes down and waits: a roll-out submitted by a crash still
    writes when kopf stops, and must be done before a standby or the next run starts."""
    state = OperatorState(lanes=lanes.Lanes.sized(4))
    done: list[str] = []
    state.lanes.models.submit(lambda: (time.sleep(0.2), done.append("rolled")))
    _registry.stop_lanes(memo=kopf.Memo(state=state))
    assert done == ["rolled"]


def test_the_handlers_users_wait_on_are_coroutines_kopf_awaits() -> None:
    # kopf runs a plain function in its one shared pool; a coroutine function it awaits on its loop.
    for handler in (_registry.reconcile, _registry.pod_event, _registry.readiness):
        assert inspect.iscoroutinefunction(handler), handler.__name__


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(_oom, "on_pod_event", lambda *a, **k: seen.append(threading.current_thread().name))
    monkeypatch.setattr(_reconcile, "reconcile", lambda *a, **k: seen.append(threading.current_thread().name))
    monkeypatch.setattr(
        _rollout, "apply_remediation", lambda *a, **k: seen.append(threading.current_thread().name)
    )
    return seen


def _pod_event(body: dict[str, Any], state: OperatorState | None = None) -> None:
    body = {
        **body,
        "metadata": {
            **body["metadata"],
            "namespace": "ns",
            "labels": {"loadline.dev/inferencemodel": "chat"},
        },
    }
    asyncio.run(
        _registry.pod_event(  # type: ignore[arg-type]
            body=body,
            logger=None,
            type="MODIFIED",
            memo=kopf.Memo(state=state or OperatorState()),
            owned_models={},
            fleet_policies={},
            gpu_nodes={},
            gpu_pods={},
        )
    )


def test_a_pod_event_without_a_new_crash_takes_no_thread(calls: list[str]) -> None:
    running = copy.deepcopy(pod("OOMKilled", 137))
    running["status"]["containerStatuses"][0].pop("lastState")
    _pod_event(running)
    assert calls == []


def test_a_crash_is_handled_on_the_crashes_lane(state: OperatorState, calls: list[str]) -> None:
    crashed = copy.deepcopy(pod("OOMKilled", 137))
    assert _oom.has_new_crash(state, crashed)
    _pod_event(crashed, state)
    assert len(calls) == 1 and calls[0].startswith("lane-crashes")


def test_a_reconcile_runs_on_the_models_lane(calls: list[str]) -> None:
    body = {"metadata": {"name": "chat", "namespace": "ns", "uid": "u"}, "spec": {}, "status": {}}
    asyncio.run(
        _registry.reconcile(  # type: ignore[arg-type]
            body=body,
            patch=kopf.Patch(),
            logger=None,
            memo=kopf.Memo(state=OperatorState()),
            fleet_policies={},
            gpu_nodes={},
            gpu_pods={},
        )
    )
    assert len(calls) == 1 and calls[0].startswith("lane-models")


def _roll_out(monkeypatch: pytest.MonkeyPatch, remediation: Any, applied: bool) -> list[str]:
    """Where a crash's roll-out ran: the remediation's apply and, when needed, the annotation asking
    reconcile to take it over."""
    ran: list[str] = []

    def apply(*args: Any, **kwargs: Any) -> bool:
        ran.append(f"apply {threading.current_thread().name}")
        return applied

    def ask(*args: Any, **kwargs: Any) -> bool:
        ran.append(f"ask {threading.current_thread().name}")
        return True

    monkeypatch.setattr(_rollout, "apply_remediation", apply)
    monkeypatch.setattr(_rollout, "ask_reconcile", ask)
    model = {"metadata": {"name": "chat", "namespace": "ns", "uid": "u"}, "spec": {}, "status": {}}
    _oom.roll_out_soon(OperatorState(), OperatorSettings(), None, model, "c1", remediation).result(timeout=10)  # type: ignore[arg-type]
    return ran


def test_a_crashs_roll_out_runs_on_the_models_lane_and_asks_reconcile_for_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The roll-out users wait for takes a thread of the models lane, and a workload applied is the
    whole of it: no annotation asks reconcile to follow (its plan went with the decision)."""
    ran = _roll_out(monkeypatch, remediation=object(), applied=True)
    assert len(ran) == 1 and ran[0].startswith("apply lane-models")


def test_a_roll_out_left_to_reconcile_asks_for_it_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _roll_out(monkeypatch, remediation=None, applied=True)  # e.g. a move between layouts
    assert len(ran) == 1 and ran[0].startswith("ask lane-models")
    ran = _roll_out(monkeypatch, remediation=object(), applied=False)  # the apply was refused
    assert ran[0].startswith("apply lane-models") and ran[1].startswith("ask lane-models")
