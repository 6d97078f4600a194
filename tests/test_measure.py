"""The operator's measured-GPU-memory timer (loadline.handlers._measure), against a stand-in Prometheus
that answers the used-memory query, with the pod listing replaced (no cluster)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from loadline.api import parse_inference_model
from loadline.handlers import _measure
from loadline.settings import OperatorSettings
from loadline.sizing import plan_inference_model
from loadline.status import build as _build
from tests.conftest import inference_model, typed_status
from tests.promserver import FakePrometheus

SUMMARY = plan_inference_model(parse_inference_model(inference_model()).spec).summary()
# status.plan as the API server stores it
PLAN = SUMMARY.model_dump(by_alias=True, mode="json", exclude_none=True)
LOG = logging.getLogger("test")


def _answer(query: str) -> dict[str, Any]:
    """The agent's per-GPU figure for pod chat-0 only."""
    result = []
    if 'pod="chat-0"' in query:
        result = [{"metric": {"uuid": "GPU-a", "source": "loadline-agent"}, "value": [0, "20.25"]}]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    server = FakePrometheus(_answer)
    yield server
    server.close()


@pytest.fixture
def prometheus(fake: FakePrometheus) -> str:
    return fake.url


def pod(name: str, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-20T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def body(phase: str = "Ready", **status: Any) -> kopf.Body:
    raw = {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "1", "generation": 1},
        "status": {"phase": phase, "plan": PLAN, **status},
    }
    return kopf.Body(raw)


@pytest.fixture
def selectors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The model's pods as the API lists them; the label selectors the handler listed them by."""
    seen: list[str] = []

    def list_objects(api_version: str, kind: str, namespace: str | None = None, **sel: str) -> list[Any]:
        assert (api_version, kind, namespace) == ("v1", "Pod", "team-a")
        seen.append(sel["label_selector"])
        return [pod("chat-0"), pod("chat-1"), pod("chat-2", "Pending")]

    monkeypatch.setattr(_measure._kube, "list_objects", list_objects)
    return seen


def settings(url: str, interval: int = 60) -> OperatorSettings:
    return OperatorSettings(prometheus_url=url, measure_interval_seconds=interval)


def test_only_running_models_with_prometheus_are_measured() -> None:
    on = settings("http://prometheus:9090")
    assert _measure.measuring(on, typed_status({"phase": "Ready"})) and _measure.measuring(
        on, typed_status({"phase": "Degraded"})
    )
    for phase in ("Pending", "Deploying", "Failed", None):
        assert not _measure.measuring(on, typed_status({"phase": phase}))
    assert not _measure.measuring(settings(""), typed_status({"phase": "Ready"}))
    assert not _measure.measuring(settings("http://prometheus:9090", 0), typed_status({"phase": "Ready"}))


def test_only_running_pods_are_asked_about() -> None:
    listed = [pod("b"), pod("a"), pod("c", "Pending"), pod("d", deleting=True), pod("e", "Succeeded")]
    assert _measure.running_pods(listed) == ["a", "b"]


def test_a_reading_lands_in_status_beside_the_plan(
    fake: FakePrometheus, prometheus: str, selectors: list[str]
) -> None:
    patch = kopf.Patch()
    _measure.measure(body(), patch, settings(prometheus), LOG)
    reading = patch["status"]["measuredGpuMemory"]
    planned = _build.planned_gpu_gib(SUMMARY)
    assert planned is not None
    assert {k: v for k, v in reading.items() if k != "time"} == {
        "gpus": 1, "maxUsedGiB": 20.25, "plannedGiB": planned, "driftGiB": round(20.25 - planned, 2),
        "source": "loadline-agent",
    }  # fmt: skip
    # The pods by the model's label; only the running ones asked about, each once.
    assert selectors == ["loadline.dev/inferencemodel=chat"]
    assert len(fake.queries) == 2 and all('namespace="team-a"' in q for q in fake.queries)
    # The same reading again: nothing to write.
    again = kopf.Patch()
    _measure.measure(body(measuredGpuMemory=reading), again, settings(prometheus), LOG)
    assert not again


def test_nothing_is_asked_or_written_outside_the_measured_phases(
    fake: FakePrometheus, prometheus: str, selectors: list[str]
) -> None:
    for status in (body("Deploying"), body("Failed")):
        patch = kopf.Patch()
        _measure.measure(status, patch, settings(prometheus), LOG)
        assert not patch
    no_plan = kopf.Body({**dict(body()), "status": {"phase": "Ready"}})
    _measure.measure(no_plan, kopf.Patch(), settings(prometheus), LOG)
    assert fake.queries == []


def test_an_unreachable_prometheus_costs_one_failed_request_and_writes_nothing(
    selectors: list[str],
) -> None:
    with socket.socket() as s:  # a loopback port where nothing listens
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    patch = kopf.Patch()
    started = time.monotonic()
    _measure.measure(body(), patch, settings(url), LOG)
    # The contract: a handler is never held past the measurement's deadline (refused is instant anyway).
    assert time.monotonic() - started < _measure.DEADLINE_SECONDS and not patch


def test_a_slow_prometheus_is_bounded_by_the_deadline(
    fake: FakePrometheus, prometheus: str, selectors: list[str]
) -> None:
    fake.delay = 3.0  # longer than a query's timeout
    patch = kopf.Patch()
    started = time.monotonic()
    _measure.measure(body(), patch, settings(prometheus), LOG)
    assert time.monotonic() - started < _measure.QUERY_TIMEOUT_SECONDS + 1.5 and not patch
