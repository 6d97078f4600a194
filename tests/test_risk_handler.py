"""The operator's OOM-risk glue (handlers/_risk.py) against a stand-in Prometheus over HTTP, through
prometheus-api-client's range queries: what ends up in status, and when nothing is written."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from loadline.handlers import _risk
from loadline.settings import OperatorSettings
from tests.conftest import stored_plan
from tests.promserver import FakePrometheus

PLAN = stored_plan(engineVersion="0.19.0", kvCacheTokens=34112, memory={"totalGiB": 22.05})
NOW = time.time()


def matrix(values: list[tuple[float, float]]) -> dict[str, Any]:
    series = [{"metric": {}, "values": [[t, str(v)] for t, v in values]}]
    return {"status": "success", "data": {"resultType": "matrix", "result": series}}


def empty(_query: str) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix", "result": []}}


def rising(start_gib: float, per_hour: float, hours: float = 3) -> list[tuple[float, float]]:
    """GPU memory every minute for ``hours`` up to now, growing ``per_hour`` GiB an hour."""
    points = int(hours * 60)
    return [(NOW - (points - i) * 60, start_gib + per_hour * i / 60) for i in range(points + 1)]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda _obj, *, type, reason, message: posted.append((type, reason)))
    return posted


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus(empty)
    yield fake
    fake.close()


def body(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "chat", "namespace": "team-a", "generation": 1, "uid": "u"},
        "status": {"phase": "Ready", "plan": PLAN, **(status or {})},
    }


def assess(prometheus: FakePrometheus, obj: dict[str, Any]) -> tuple[kopf.Patch, Any]:
    settings = OperatorSettings(prometheus_url=prometheus.url)
    patch = kopf.Patch()
    estimate = _risk.assess(obj, patch, settings, ["chat-abc"], logging.getLogger("test"))  # type: ignore[arg-type]
    return patch, estimate


def test_growing_gpu_memory_predicts_the_crash_with_its_evidence_and_warns_once(
    prometheus: FakePrometheus, events: list[tuple[str, str]]
) -> None:
    series = rising(16.0, 1.0)  # 19 GiB now of 22.05, one more GiB an hour: about 3 hours left
    prometheus.answer = lambda q: matrix(series) if "memory" in q else empty(q)
    patch, estimate = assess(prometheus, body())
    risk = patch.status["oomRisk"]
    assert risk["signal"] == "gpu_memory" and risk["unit"] == "GiB" and risk["limit"] == 22.05
    hours = (estimate.predicted_at.timestamp() - NOW) / 3600
    assert 2.0 < hours < 4.5, hours
    [condition] = [c for c in patch.status["conditions"] if c["type"] == "OOMRisk"]
    assert condition["status"] == "True" and condition["reason"] == "GpuMemoryGrowing"
    assert "GPU memory" in condition["message"]
    assert events == [("Warning", "OOMRisk")]
    # The next interval, the same trend: nothing written, no second Event.
    again, _ = assess(prometheus, body(dict(patch.status)))
    assert dict(again.status) == {} and events == [("Warning", "OOMRisk")]
    assert any(
        "query_range" not in q and "loadline_gpu_container_memory_used_bytes" in q for q in prometheus.queries
    )


def test_flat_memory_is_judged_no_risk_and_a_cleared_risk_says_so(
    prometheus: FakePrometheus, events: list[tuple[str, str]]
) -> None:
    flat = [(t, 15.0 + (0.05 if i % 2 else 0.0)) for i, (t, _v) in enumerate(rising(15.0, 0.0))]
    prometheus.answer = lambda q: matrix(flat) if "memory" in q else empty(q)
    was_at_risk = {"conditions": [{"type": "OOMRisk", "status": "True", "reason": "GpuMemoryGrowing",
                                   "message": "m", "lastTransitionTime": "2026-11-23T00:00:00Z"}]}  # fmt: skip
    patch, estimate = assess(prometheus, body(was_at_risk))
    assert estimate.predicted_at is None
    [condition] = [c for c in patch.status["conditions"] if c["type"] == "OOMRisk"]
    assert condition["status"] == "False" and condition["reason"] == "NoRisingSignal"
    assert events == [("Normal", "OOMRisk")]


def test_without_history_the_risk_is_unknown_and_nothing_is_predicted(
    prometheus: FakePrometheus, events: list[tuple[str, str]]
) -> None:
    patch, estimate = assess(prometheus, body())
    assert estimate.status == "Unknown" and estimate.predicted_at is None
    assert patch.status["conditions"][0]["reason"] == "InsufficientData" and events == []


def test_the_estimate_runs_once_per_interval_per_model() -> None:
    settings = OperatorSettings(risk_interval_seconds=300)
    memo: dict[str, Any] = {}
    assert _risk.risk_due(memo, settings, 1000.0)
    assert not _risk.risk_due(memo, settings, 1200.0)
    assert _risk.risk_due(memo, settings, 1300.0)
    assert not _risk.risk_due({}, OperatorSettings(risk_interval_seconds=0), 1000.0)


def test_prompts_growing_toward_the_kv_cache_predict_the_crash(
    prometheus: FakePrometheus, events: list[tuple[str, str]]
) -> None:
    """The longest prompt of each 5 minutes climbs 3,000 tokens an hour toward the 34,112 the KV cache
    holds: the prompts are the deciding signal, read with histogram_quantile(1, ...)."""
    prompts = [(t, 20000.0 + 3000.0 * (t - NOW) / 3600 + 9000) for t, _ in rising(0.0, 0.0)]
    prometheus.answer = lambda q: matrix(prompts) if q.startswith("histogram_quantile(1,") else empty(q)
    patch, estimate = assess(prometheus, body())
    assert patch.status["oomRisk"]["signal"] == "prompt_tokens", patch.status["oomRisk"]
    hours = (estimate.predicted_at.timestamp() - NOW) / 3600
    assert 1.0 < hours < 2.5, hours  # (34112 - 29000) / 3000 ≈ 1.7 h
    assert any("vllm:request_prompt_tokens_bucket" in q for q in prometheus.queries)
