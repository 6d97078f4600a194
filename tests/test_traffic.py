"""loadline.traffic without a Prometheus: PromQL builders, answer parsing, and the client's failure modes
against a tiny in-process HTTP server. The real Prometheus is in e2e/test_prometheus.py."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from loadline.oom import OomClass, classify, parse_incident
from loadline.traffic import (
    PrometheusClient,
    Windows,
    bucket_increases,
    crash_timestamp,
    duration,
    gpu_memory_growth_query,
    incident_metrics,
    kv_cache_usage_names,
    kv_cache_usage_query,
    label_value,
    parse_version,
    preemptions_query,
    prompt_buckets_query,
    requests_running_query,
    samples,
    scalar,
    selector,
    top_bucket,
    trend_times,
)
from tests.promserver import QuietHTTPServer

KV_NEW = "vllm:kv_cache_usage_perc"
KV_OLD = "vllm:gpu_cache_usage_perc"
SEL = '{namespace="team-a",pod="vllm-0"}'


# ---------------------------------------------------------------- versions and names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.9.2", (0, 9, 2)),
        ("v0.10.1.post1", (0, 10, 1)),
        ("vllm/vllm-openai:v0.11.0", (0, 11, 0)),
        ("registry.local:5000/vllm/vllm-openai:v0.6.3", (0, 6, 3)),
        ("0.12.0rc1", (0, 12, 0)),
        ("0.8", (0, 8, 0)),
        ("latest", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_version(text: str | None, expected: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    ("version", "names"),
    [
        ("0.6.3", (KV_OLD,)),
        ("0.9.1", (KV_OLD,)),
        ("0.9.2", (KV_NEW, KV_OLD)),  # renamed in 0.9.2; the V0 engine kept the old name
        ("0.10.1", (KV_NEW, KV_OLD)),
        ("0.11.2", (KV_NEW, KV_OLD)),  # hidden, unless --show-hidden-metrics-for-version=0.10
        ("0.12.0", (KV_NEW,)),  # removed
        ("1.0.0", (KV_NEW,)),
        (None, (KV_NEW, KV_OLD)),
        ("nightly", (KV_NEW, KV_OLD)),
    ],
)
def test_kv_cache_usage_names_follow_the_engine_version(version: str | None, names: tuple[str, ...]) -> None:
    assert kv_cache_usage_names(version) == names


# ---------------------------------------------------------------- PromQL builders


def test_label_values_are_escaped() -> None:
    assert label_value('a"b\\c') == '"a\\"b\\\\c"'
    assert selector(namespace="ns", pod='p"0') == '{namespace="ns",pod="p\\"0"}'


@pytest.mark.parametrize(
    ("seconds", "text"), [(600, "10m"), (120, "2m"), (3600, "1h"), (7200, "2h"), (90, "90s")]
)
def test_duration(seconds: int, text: str) -> None:
    assert duration(seconds) == text


def test_duration_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        duration(0)


def test_kv_query_for_a_new_engine_asks_one_name() -> None:
    assert kv_cache_usage_query("team-a", "vllm-0", "0.12.1") == f"max(max_over_time({KV_NEW}{SEL}[10m]))"


def test_kv_query_for_an_old_engine_asks_the_old_name() -> None:
    assert (
        kv_cache_usage_query("team-a", "vllm-0", "0.8.5", window=300)
        == f"max(max_over_time({KV_OLD}{SEL}[5m]))"
    )


def test_kv_query_in_the_overlap_prefers_the_new_name_and_falls_back() -> None:
    assert kv_cache_usage_query("team-a", "vllm-0", "0.10.0") == (
        f"max(max_over_time({KV_NEW}{SEL}[10m])) or max(max_over_time({KV_OLD}{SEL}[10m]))"
    )


def test_running_preemptions_and_prompt_queries() -> None:
    assert (
        requests_running_query("team-a", "vllm-0")
        == f"sum(last_over_time(vllm:num_requests_running{SEL}[10m]))"
    )
    assert preemptions_query("team-a", "vllm-0") == f"sum(increase(vllm:num_preemptions_total{SEL}[10m]))"
    assert prompt_buckets_query("team-a", "vllm-0", 120) == (
        f"sum by (le) (increase(vllm:request_prompt_tokens_bucket{SEL}[2m]))"
    )


def test_gpu_growth_query_tries_pod_labels_then_exported_labels() -> None:
    q = gpu_memory_growth_query("team-a", "vllm-0")
    assert q == (
        f"(max(deriv(DCGM_FI_DEV_FB_USED{SEL}[1h])) or "
        'max(deriv(DCGM_FI_DEV_FB_USED{exported_namespace="team-a",exported_pod="vllm-0"}[1h]))) * 3600 / 1024'
    )
    assert "Hostname" not in q


def test_gpu_growth_query_falls_back_to_the_node_only_when_asked() -> None:
    q = gpu_memory_growth_query("team-a", "vllm-0", window=7200, node="gpu-node-3")
    assert 'or max(deriv(DCGM_FI_DEV_FB_USED{Hostname="gpu-node-3"}[2h])))' in q


# ---------------------------------------------------------------- parsing answers


def vector(*entries: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [1700000000.0, v]} for m, v in entries],
        },
    }


def test_samples_of_a_vector_and_a_scalar() -> None:
    assert samples(vector(({"a": "1"}, "0.5"))) == [({"a": "1"}, 0.5)]
    assert samples({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "3"]}}) == [
        ({}, 3.0)
    ]


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "not json",
        {"status": "error", "errorType": "bad_data", "error": "parse error"},
        {
            "status": "success",
            "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "1"]]}]},
        },
        {"status": "success", "data": {"resultType": "vector", "result": "nope"}},
        vector(({}, "NaN")),
        vector(({}, "+Inf")),
        vector(({}, "twelve")),
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1]}]}},
    ],
    ids=["none", "string", "error", "matrix", "bad-result", "nan", "inf", "garbage", "short-value"],
)
def test_anything_unexpected_reads_as_not_available(payload: Any) -> None:
    assert scalar(payload) is None


def test_scalar_of_several_samples_is_the_largest() -> None:
    assert scalar(vector(({"engine": "0"}, "0.4"), ({"engine": "1"}, "0.9"))) == 0.9
    assert scalar(vector()) is None


BOUNDS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]  # vLLM, max_model_len 32768


def histogram(prompts: list[int], scale: float = 1.0) -> dict[float, float]:
    """What ``sum by (le) (increase(..._bucket[w]))`` returns for these prompts (scaled like extrapolation)."""
    out = {float(b): scale * sum(p <= b for p in prompts) for b in BOUNDS}
    out[math.inf] = scale * len(prompts)
    return out


def answer(increases: dict[float, float]) -> dict[str, Any]:
    return vector(*(({"le": "+Inf" if math.isinf(b) else repr(b)}, repr(v)) for b, v in increases.items()))


def test_bucket_increases_read_le_labels() -> None:
    got = bucket_increases(answer(histogram([1500, 3000])))
    assert got[2000.0] == 1 and got[5000.0] == 2 and got[math.inf] == 2
    assert bucket_increases(vector(({"le": "x"}, "1"), ({}, "2"))) == {}


@pytest.mark.parametrize(
    ("prompts", "max_model_len", "expected"),
    [
        ([1500], 32768, 2000),
        ([2000], 32768, 2000),  # bounds are inclusive
        ([2001], 32768, 5000),
        ([100] * 500 + [14000], 32768, 20000),  # one long prompt among many short ones is the max
        ([25000], 32768, 32768),  # the open bucket above 20000 is bounded by max_model_len
        ([25000], None, 20000),  # without it, the last finite bound (a lower bound)
        ([7000], 8000, 8000),  # a finite bound above max_model_len is capped
        ([], 32768, None),
    ],
)
def test_top_bucket(prompts: list[int], max_model_len: int | None, expected: int | None) -> None:
    assert top_bucket(histogram(prompts), max_model_len) == expected


def test_top_bucket_survives_extrapolated_increases() -> None:
    # increase() extrapolates to the window's edges: all buckets share the factor.
    assert top_bucket(histogram([300, 4000, 900], scale=1.0256410256), 32768) == 5000


def test_top_bucket_without_an_inf_bucket_uses_the_largest_count() -> None:
    inc = histogram([300, 4000])
    del inc[math.inf]
    assert top_bucket(inc, None) == 5000


def test_trend_times_end_at_the_crash() -> None:
    assert trend_times(10_000.0, Windows()) == [9520.0, 9640.0, 9760.0, 9880.0, 10_000.0]
    assert trend_times(10_000.0, Windows(recent=300, trend_intervals=3)) == [9800.0, 9900.0, 10_000.0]
    assert Windows().trend_window == 180  # 2 minutes plus one minute of overlap
    assert Windows(overlap=0).trend_window == 120


def test_crash_timestamp_accepts_what_the_operator_has() -> None:
    moment = datetime(2026, 11, 22, 0, 10, tzinfo=UTC)
    assert crash_timestamp(moment) == moment.timestamp()
    assert crash_timestamp(moment.replace(tzinfo=None)) == moment.timestamp()  # naive means UTC
    assert crash_timestamp("2026-11-22T00:10:00Z") == moment.timestamp()
    assert crash_timestamp(moment.astimezone(timezone(timedelta(hours=2)))) == moment.timestamp()
    assert crash_timestamp(1700000000) == 1700000000.0


# ---------------------------------------------------------------- client and incident_metrics


Handler = Callable[[str, float], tuple[int, Any]]


class FakePrometheus:
    """An in-process HTTP server answering /api/v1/query with ``handler(query, time)``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.queries: list[tuple[str, float]] = []
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                params = parse_qs(url.query)
                if url.path != "/api/v1/query":
                    self.send_error(404)
                    return
                query, at = params["query"][0], float(params["time"][0])
                fake.queries.append((query, at))
                status, body = fake.handler(query, at)
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = QuietHTTPServer(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[Callable[[Handler], FakePrometheus]]:
    servers: list[FakePrometheus] = []

    def start(handler: Handler) -> FakePrometheus:
        servers.append(FakePrometheus(handler))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


CRASH = 1_800_000_000.0


def overflow_answers(query: str, at: float) -> tuple[int, Any]:
    """A pod whose prompts grew to 30k before the crash, as Prometheus would answer."""
    if KV_NEW in query:
        return 200, vector(({}, "0.981"))
    if "num_requests_running" in query:
        return 200, vector(({}, "14"))
    if "num_preemptions_total" in query:
        return 200, vector(({}, "12.3"))
    if "request_prompt_tokens_bucket" in query:
        if "[10m]" in query:
            return 200, answer(histogram([2000, 9000, 16000, 24000, 30000]))
        step = round((CRASH - at) / 120)  # 4 .. 0
        return 200, answer(histogram([[7600], [13200], [18800], [24400], [30000]][4 - step]))
    if "DCGM_FI_DEV_FB_USED" in query:
        return 200, vector(({}, "0.0012"))
    return 200, vector()


def test_incident_metrics_assembles_the_metrics_dict(fake: Callable[[Handler], FakePrometheus]) -> None:
    prom = fake(overflow_answers)
    m = incident_metrics(prom.url, "team-a", "vllm-0", CRASH, "0.12.0", max_model_len=32768)
    assert m == {
        "kv_cache_usage": 0.981,
        "requests_running": 14,
        "preemptions": 12,
        "prompt_tokens_max": 32768,
        "prompt_tokens_recent": [10000, 20000, 20000, 32768, 32768],
        "gpu_memory_growth_gib_per_hour": 0.0012,
    }
    # Every query is evaluated at the crash or at the end of a trend interval, never later.
    assert max(at for _, at in prom.queries) == CRASH
    assert sorted({at for q, at in prom.queries if "[3m]" in q}) == [
        CRASH - 480,
        CRASH - 360,
        CRASH - 240,
        CRASH - 120,
        CRASH,
    ]
    assert len(prom.queries) == 10


def test_the_metrics_dict_is_what_the_classifier_reads(fake: Callable[[Handler], FakePrometheus]) -> None:
    prom = fake(overflow_answers)
    metrics = incident_metrics(prom.url, "team-a", "vllm-0", CRASH, "0.12.0", max_model_len=32768)
    incident = parse_incident(
        {
            "reason": "Error",
            "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free.",
            "ever_ready": True,
            "seconds_since_ready": 5400,
            "config": {"max_model_len": 32768},
            "metrics": metrics,
        }
    )
    d = classify(incident)
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW
    assert d.caller_side is True


def test_kv_usage_is_clamped_to_a_fraction(fake: Callable[[Handler], FakePrometheus]) -> None:
    prom = fake(lambda q, at: (200, vector(({}, "1.02"))) if "cache_usage" in q else (200, vector()))
    assert incident_metrics(prom.url, "ns", "p", CRASH) == {"kv_cache_usage": 1.0}


def test_no_finished_requests_means_no_prompt_figures_and_no_trend_queries(
    fake: Callable[[Handler], FakePrometheus],
) -> None:
    prom = fake(lambda q, at: (200, answer(histogram([]))) if "bucket" in q else (200, vector()))
    assert incident_metrics(prom.url, "ns", "p", CRASH) == {}
    assert sum("bucket" in q for q, _ in prom.queries) == 1


def test_a_rejected_query_loses_only_its_figure(fake: Callable[[Handler], FakePrometheus]) -> None:
    def handler(query: str, at: float) -> tuple[int, Any]:
        if "num_preemptions_total" in query:
            return 400, {"status": "error", "errorType": "bad_data", "error": "parse error"}
        return overflow_answers(query, at)

    m = incident_metrics(fake(handler).url, "team-a", "vllm-0", CRASH, "0.12.0", max_model_len=32768)
    assert "preemptions" not in m
    assert m["kv_cache_usage"] == 0.981 and m["prompt_tokens_max"] == 32768


def test_a_server_error_ends_the_conversation(fake: Callable[[Handler], FakePrometheus]) -> None:
    prom = fake(lambda q, at: (503, "overloaded"))
    assert incident_metrics(prom.url, "ns", "p", CRASH) == {}
    assert len(prom.queries) == 1


def test_an_answer_that_is_not_json_is_ignored(fake: Callable[[Handler], FakePrometheus]) -> None:
    prom = fake(lambda q, at: (200, "<html>login</html>"))
    assert incident_metrics(prom.url, "ns", "p", CRASH) == {}


def test_the_deadline_bounds_a_slow_prometheus(fake: Callable[[Handler], FakePrometheus]) -> None:
    def slow(query: str, at: float) -> tuple[int, Any]:
        time.sleep(0.3)
        return overflow_answers(query, at)

    prom = fake(slow)
    started = time.monotonic()
    m = incident_metrics(prom.url, "team-a", "vllm-0", CRASH, "0.12.0", timeout=2.0, deadline=0.5)
    assert time.monotonic() - started < 1.5
    assert len(prom.queries) <= 3
    assert "kv_cache_usage" in m


def test_requests_carry_the_headers(fake: Callable[[Handler], FakePrometheus]) -> None:
    prom = fake(lambda q, at: (200, vector()))
    client = PrometheusClient(prom.url, headers={"Authorization": "Bearer t"})
    assert client.query("up", CRASH) == vector()


@pytest.mark.parametrize("url", ["", "prometheus:9090", "file:///etc/passwd", "ftp://x"])
def test_a_bad_url_gives_nothing(url: str) -> None:
    started = time.monotonic()
    assert incident_metrics(url, "ns", "p", CRASH) == {}
    assert time.monotonic() - started < 0.5


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_bad_crash_time_gives_nothing() -> None:
    assert incident_metrics(f"http://127.0.0.1:{closed_port()}", "ns", "p", "yesterday") == {}


def test_a_refused_connection_gives_nothing_quickly() -> None:
    started = time.monotonic()
    assert incident_metrics(f"http://127.0.0.1:{closed_port()}", "ns", "p", CRASH, "0.10.0") == {}
    assert time.monotonic() - started < 1.0
