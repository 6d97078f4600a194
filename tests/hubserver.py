"""A tiny local stand-in for a Hugging Face hub's file endpoint (``/<org>/<repo>/resolve/<rev>/<file>``).

Files are served from a directory; repositories under ``private/`` need ``Authorization: Bearer <token>``.
Used by the unit tests of :mod:`loadline.hub` and by the e2e operator fixture (loopback only).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.promserver import QuietHTTPServer, send_json

TOKEN = "hf_test_token"


class HubServer:
    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        handler = _handler(root)
        self.httpd = QuietHTTPServer(("127.0.0.1", 0), handler)
        self.root = root
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def add(self, repo: str, text: str, revision: str = "main") -> None:
        path = self.root / repo / "resolve" / revision / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _handler(root: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = self.path.lstrip("/").split("/")
            if parts and parts[0] == "private" and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_error(401)
                return
            path = (root / self.path.lstrip("/")).resolve()
            if root.resolve() not in path.parents or not path.is_file():
                self.send_error(404)
                return
            send_json(self, path.read_bytes())

        def log_message(self, *_: object) -> None:
            return

    return Handler
