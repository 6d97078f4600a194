"""FleetPolicy counts are refreshed off the reconcile path: a burst of changes costs two counts (one
LIST each), not one per model, and the last count reads the last change."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from loadline.handlers._fleet import CountRefresher
from loadline.settings import OperatorSettings
from loadline.state import RecentReads


class Recorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.done = threading.Event()

    def __call__(self, bodies: Mapping[str, Mapping[str, Any]], settings: OperatorSettings) -> None:
        self.calls.append(dict(bodies))
        self.done.set()


def wait_calls(recorder: Recorder, n: int, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while len(recorder.calls) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_burst_of_changes_is_counted_twice_with_the_latest_policies() -> None:
    recorder = Recorder()
    refresher = CountRefresher(recorder, delay=0.2)
    settings = OperatorSettings()
    for i in range(200):  # 200 models created back to back, each moving a policy's counts
        refresher.request({"team-a": {"generation": i}}, settings)
    wait_calls(recorder, 2)
    time.sleep(0.5)
    assert len(recorder.calls) == 2  # not 200: one count after the burst, one to settle
    assert all(call == {"team-a": {"generation": 199}} for call in recorder.calls)


def test_a_change_after_the_counts_settled_is_counted_again() -> None:
    recorder = Recorder()
    refresher = CountRefresher(recorder, delay=0.05)
    settings = OperatorSettings()
    refresher.request({"p": {"v": 1}}, settings)
    wait_calls(recorder, 2)
    time.sleep(0.2)
    refresher.request({"p": {"v": 2}}, settings)
    wait_calls(recorder, 3)
    assert recorder.calls[-1] == {"p": {"v": 2}}


def test_a_failing_count_does_not_stop_counting() -> None:
    calls: list[int] = []

    def flaky(bodies: Mapping[str, Mapping[str, Any]], settings: OperatorSettings) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("API server unreachable")

    refresher = CountRefresher(flaky, delay=0.05)
    refresher.request({}, OperatorSettings())
    deadline = time.monotonic() + 5
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 2


def test_restart_slots_of_a_sharded_replica_count_every_shards_restarts(monkeypatch: Any) -> None:
    from loadline.handlers import _fleet

    def model(name: str, state: str) -> dict[str, Any]:
        return {"metadata": {"namespace": "ns", "name": name, "labels": {"team": "a"}},
                "status": {"maintenance": {"state": state}}}  # fmt: skip

    lists: list[int] = []

    def list_models(settings: OperatorSettings) -> list[dict[str, Any]]:
        lists.append(1)
        return [model("a", "Running"), model("b", "Scheduled"), model("c", "Running")]

    monkeypatch.setattr(_fleet, "list_models", list_models)
    reads: RecentReads[str, dict[str, dict[str, Any]]] = RecentReads(max_age=5.0)
    found = _fleet.restarting_everywhere(OperatorSettings(), reads)
    assert sorted(found) == ["ns/a", "ns/c"] and found["ns/a"]["labels"] == {"team": "a"}
    _fleet.restarting_everywhere(OperatorSettings(), reads)
    assert len(lists) == 1  # reused by the timers of the next seconds


def test_without_a_fleet_policy_counting_reads_no_model(monkeypatch: Any) -> None:
    from loadline.handlers import _fleet

    lists: list[int] = []

    def list_models(settings: OperatorSettings) -> list[dict[str, Any]]:
        lists.append(1)
        return [{"metadata": {"namespace": "ns", "name": "a", "labels": {}}, "status": {}}]

    written: list[dict[str, Any]] = []
    monkeypatch.setattr(_fleet, "list_models", list_models)
    monkeypatch.setattr(_fleet._kube, "patch_status", lambda obj, changes: written.append(changes) or obj)
    _fleet.refresh_counts({}, OperatorSettings())
    assert lists == [] and written == []
    policy = {"apiVersion": "loadline.dev/v1alpha1", "kind": "FleetPolicy",
              "metadata": {"name": "all"}, "spec": {}, "status": {}}  # fmt: skip
    _fleet.refresh_counts({"all": policy}, OperatorSettings())
    assert lists == [1] and written  # a policy: one LIST, and its counts written
