"""A stand-in Prometheus HTTP API for unit tests: answers each query with what the test scripts,
records the queries, and can be made slow (for the operator's time bounds)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Answer = Callable[[str], dict[str, Any]]  # PromQL → the JSON body of the answer


def send_json(handler: BaseHTTPRequestHandler, body: bytes, status: int = 200) -> None:
    """Answer a request with ``body`` as application/json (the stand-ins' one way of answering)."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class QuietHTTPServer(ThreadingHTTPServer):
    """A test server that does not print a client's broken pipe to stderr: the time-bound tests make
    clients give up on purpose, and the server's late write would otherwise land, traceback and all,
    in whatever test runs next (and break its one-line-on-stderr assertions)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class FakePrometheus:
    """Serve ``answer`` on 127.0.0.1 (a random port) until :meth:`close`."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.queries: list[str] = []
        self.delay = 0.0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)["query"][0]
                fake.queries.append(query)
                time.sleep(fake.delay)
                send_json(self, json.dumps(fake.answer(query)).encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
