"""``loadline_api_requests_total``: the operator's own requests by verb and resource, so a platform team
(and benchmarks/fleet.py) can tell which of the operator's API traffic is loadline's and which kopf's."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from loadline import telemetry
from loadline.handlers import _kube

APPLY = {"Content-Type": "application/apply-patch+yaml"}


@pytest.mark.parametrize(
    ("method", "url", "headers", "expected"),
    [
        ("GET", "https://h/api/v1/namespaces/ns/pods/p", None, ("get", "pods")),
        ("GET", "https://h/api/v1/namespaces/ns/pods?labelSelector=a%3Db", None, ("list", "pods")),
        ("GET", "https://h/api/v1/nodes?watch=true&resourceVersion=5", None, ("watch", "nodes")),
        ("GET", "https://h/api/v1/nodes?watch=1", None, ("watch", "nodes")),
        ("GET", "https://h/api/v1/nodes/n1", None, ("get", "nodes")),
        ("PATCH", "https://h/apis/apps/v1/namespaces/ns/deployments/d?fieldManager=x", APPLY, ("apply", "deployments")),
        ("PATCH", "https://h/apis/apps/v1/namespaces/ns/deployments/d", {"content-type": "application/merge-patch+json"}, ("patch", "deployments")),
        ("PATCH", "https://h/apis/loadline.dev/v1alpha1/namespaces/ns/inferencemodels/m/status", None, ("patch", "inferencemodels/status")),
        ("POST", "https://h/api/v1/namespaces/ns/pods/p/eviction", None, ("create", "pods/eviction")),
        ("POST", "https://h/api/v1/namespaces/ns/events", None, ("create", "events")),
        ("PUT", "https://h/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", None, ("update", "leases")),
        ("DELETE", "https://h/api/v1/namespaces/ns/services/s", None, ("delete", "services")),
        ("DELETE", "https://h/api/v1/namespaces/ns/pods", None, ("deletecollection", "pods")),
        ("GET", "https://h/api/v1/namespaces/ns", None, ("get", "namespaces")),
        ("GET", "https://h/api/v1/namespaces", None, ("list", "namespaces")),
        ("GET", "https://h/apis/apps/v1", None, ("get", "discovery")),
        ("GET", "https://h/apis", None, ("get", "discovery")),
        ("GET", "https://h/version", None, ("get", "discovery")),
    ],
)  # fmt: skip
def test_requests_are_named_as_the_api_server_names_them(
    method: str, url: str, headers: dict[str, str] | None, expected: tuple[str, str]
) -> None:
    assert telemetry.api_verb_and_resource(method, url, headers) == expected


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/api/v1/namespaces/ns/pods/missing"):
            self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
        elif self.path.startswith("/api/v1/namespaces/ns/pods/"):
            self._answer(200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p"}})
        else:
            self._answer(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []})

    def _answer(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def count(verb: str, resource: str, code: str) -> float:
    value = REGISTRY.get_sample_value(
        "loadline_api_requests_total", {"verb": verb, "resource": resource, "code": code}
    )
    return value or 0.0


def test_the_operator_client_counts_each_request_it_makes_over_http(api_server: str) -> None:
    configuration = client.Configuration()
    configuration.host = api_server
    pods = client.CoreV1Api(_kube.CountingApiClient(configuration))  # type: ignore[no-untyped-call]
    before = (count("get", "pods", "200"), count("list", "pods", "200"), count("get", "pods", "404"))

    pods.read_namespaced_pod("p", "ns")
    pods.read_namespaced_pod("p", "ns")
    pods.list_namespaced_pod("ns", label_selector="app=x")
    with pytest.raises(ApiException):
        pods.read_namespaced_pod("missing", "ns")

    after = (count("get", "pods", "200"), count("list", "pods", "200"), count("get", "pods", "404"))
    assert [b - a for a, b in zip(before, after, strict=True)] == [2, 1, 1]


def test_a_request_that_gets_no_answer_is_counted_as_an_error() -> None:
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard port: nothing listens
    configuration.retries = 0
    pods = client.CoreV1Api(_kube.CountingApiClient(configuration))  # type: ignore[no-untyped-call]
    before = count("list", "pods", "error")
    with pytest.raises(Exception):  # noqa: B017 (urllib3's connection error, whichever it is)
        pods.list_namespaced_pod("ns", _request_timeout=2)
    assert count("list", "pods", "error") == before + 1
