"""Range queries through prometheus-api-client: the answer as series, and never blocking or raising."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

import pytest

from loadline.traffic import query_range, query_range_async
from tests.promserver import QuietHTTPServer, send_json

MATRIX = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [
            {"metric": {"pod": "a"}, "values": [[1000, "1.5"], [1300, "2"]]},
            {"metric": {"pod": "b"}, "values": [[1000, "0.5"]]},
        ],
    },
}


class _Handler(BaseHTTPRequestHandler):
    behaviour = "ok"
    seen: list[dict[str, list[str]]] = []  # noqa: RUF012 - test-only shared record

    def do_GET(self) -> None:
        type(self).seen.append(parse_qs(urlsplit(self.path).query))
        if self.behaviour == "slow":
            time.sleep(3)
        if self.behaviour == "error":
            body, code = b'{"status":"error","error":"parse error"}', 400
        elif self.behaviour == "garbage":
            body, code = b"<html>not prometheus</html>", 200
        else:
            body, code = json.dumps(MATRIX).encode(), 200
        send_json(self, body, code)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prom() -> Iterator[str]:
    _Handler.behaviour = "ok"
    _Handler.seen = []
    server = QuietHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_series_and_query_parameters(prom: str) -> None:
    out = query_range(prom, "sum(rate(vllm:request_success_total[5m]))", 1000, 1300, 300)
    assert out == [[(1000.0, 1.5), (1300.0, 2.0)], [(1000.0, 0.5)]]
    params = _Handler.seen[-1]
    assert params["start"] == ["1000"] and params["end"] == ["1300"] and params["step"] == ["300"]
    assert params["query"] == ["sum(rate(vllm:request_success_total[5m]))"]


@pytest.mark.parametrize("behaviour", ["error", "garbage"])
def test_refused_or_garbage_answers_are_none(prom: str, behaviour: str) -> None:
    _Handler.behaviour = behaviour
    assert query_range(prom, "up", 1000, 1300) is None
    assert len(_Handler.seen) == 1  # no retries


def test_unreachable_and_bad_urls_are_none_quickly() -> None:
    began = time.monotonic()
    assert query_range("http://127.0.0.1:9", "up", 0, 600) is None  # closed port
    assert query_range("not a url", "up", 0, 600) is None
    assert time.monotonic() - began < 2


def test_slow_prometheus_does_not_hold_the_event_loop(prom: str) -> None:
    _Handler.behaviour = "slow"

    async def run() -> tuple[object, float, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        task = asyncio.create_task(ticker())
        began = time.monotonic()
        out = await query_range_async(prom, "up", 0, 600, timeout=5, deadline=0.5)
        task.cancel()
        return out, time.monotonic() - began, ticks

    out, took, ticks = asyncio.run(run())
    assert out is None and took < 1.5
    assert ticks >= 5  # the loop kept running while the request waited in its thread
