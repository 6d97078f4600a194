"""kopf starts only once the API server's discovery lists loadline's resources.

kopf reads discovery once at start; a replica restarted while a just-started API server served the CRDs'
objects but did not list them yet answered every admission request 404 until it was restarted again
(CI, after ``test_api_server_and_etcd_restart_under_the_operator``). The startup handler of each registry
waits for discovery instead. Here it reads a local stand-in for the API server's discovery endpoints
through the real Kubernetes client, as the operator does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from loadline.api import GROUP, PLURAL, POLICY_PLURAL, VERSION
from loadline.handlers import _discovery, _registry
from tests.promserver import QuietHTTPServer, send_json

TOKEN = "discovery-test-token"


def group_list(*versions: str, group: str = GROUP) -> dict[str, Any]:
    """``/apis`` as the API server answers it (APIGroupList), with the built-in apps group beside ours."""
    groups = [{"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
               "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}}]  # fmt: skip
    if versions:
        groups.append({
            "name": group,
            "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
        })  # fmt: skip
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def resource_list(*names: str) -> dict[str, Any]:
    """``/apis/loadline.dev/v1alpha1`` (APIResourceList) listing ``names``."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{VERSION}",
        "resources": [
            {"name": n, "singularName": "", "namespaced": True, "kind": "X", "verbs": ["get"]} for n in names
        ],
    }


ALL = (PLURAL, f"{PLURAL}/status", POLICY_PLURAL)


def test_every_resource_is_missing_until_apis_lists_the_group_at_our_version() -> None:
    assert _discovery.unserved(group_list(), resource_list(*ALL)) == list(ALL)
    assert _discovery.unserved(group_list("v1beta9"), resource_list(*ALL)) == list(ALL)
    assert _discovery.unserved(group_list(VERSION, group="other.dev"), resource_list(*ALL)) == list(ALL)
    # Listed, but the group version's own document answered 404 (None).
    assert _discovery.unserved(group_list(VERSION), None) == list(ALL)


def test_listed_group_is_served_once_its_resource_list_has_each_resource() -> None:
    assert _discovery.unserved(group_list(VERSION), resource_list(PLURAL)) == [
        f"{PLURAL}/status",
        POLICY_PLURAL,
    ]
    assert _discovery.unserved(group_list("v1", VERSION), resource_list(*ALL)) == []


class FakeDiscovery:
    """The two discovery documents the startup handler reads, changed by the test as the API server
    changes them while it starts; requests without the kubeconfig's token are refused (401)."""

    def __init__(self) -> None:
        self.documents: dict[str, dict[str, Any]] = {}
        self.paths: list[str] = []
        self.kubeconfig = Path()  # set by the fixture
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.paths.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_error(401)
                    return
                document = fake.documents.get(self.path.split("?")[0])
                if document is None:
                    self.send_error(404)
                    return
                send_json(self, json.dumps(document).encode())

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDiscovery]:
    fake = FakeDiscovery()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": fake.url}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    fake.kubeconfig = kubeconfig
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    try:
        yield fake
    finally:
        fake.close()


def test_startup_waits_while_a_starting_api_server_does_not_list_the_crds_yet(api: FakeDiscovery) -> None:
    """Both registries' startup handlers, called as kopf calls them, against discovery as an API server
    that has just started answers it: the objects are there, discovery does not list them yet."""
    handlers = [_registry.wait_for_discovery, _registry.wait_for_discovery_admission]
    api.documents["/apis"] = group_list()
    for handler in handlers:
        with pytest.raises(kopf.TemporaryError) as refused:
            handler()
        assert refused.value.delay == _discovery.RETRY_SECONDS
        assert f"does not list {GROUP}/{VERSION} {PLURAL}, {PLURAL}/status, {POLICY_PLURAL}" in str(
            refused.value
        )
    assert api.paths == ["/apis", "/apis"]  # nothing more read while the group is not listed

    api.documents["/apis"] = group_list(VERSION)  # listed; its own document not served yet (404)
    with pytest.raises(kopf.TemporaryError, match=f"does not list {GROUP}/{VERSION} {PLURAL},"):
        _registry.wait_for_discovery()
    api.documents[f"/apis/{GROUP}/{VERSION}"] = resource_list(PLURAL, f"{PLURAL}/status")
    with pytest.raises(kopf.TemporaryError, match=f"does not list {GROUP}/{VERSION} {POLICY_PLURAL} in"):
        _registry.wait_for_discovery_admission()

    api.documents[f"/apis/{GROUP}/{VERSION}"] = resource_list(*ALL)
    for handler in handlers:
        assert handler() is None  # done: kopf goes on to its watches and its webhook server


def test_startup_waits_while_the_api_server_is_down_or_refuses(api: FakeDiscovery) -> None:
    api.documents["/apis"] = group_list(VERSION)
    api.documents[f"/apis/{GROUP}/{VERSION}"] = resource_list(*ALL)
    config = yaml.safe_load(api.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = "wrong"
    api.kubeconfig.write_text(yaml.safe_dump(config))
    with pytest.raises(kopf.TemporaryError, match=r"discovery cannot be read \(HTTP 401"):
        _registry.wait_for_discovery()
    api.close()
    with pytest.raises(kopf.TemporaryError, match=r"the API server is unreachable \(\w+\): waiting"):
        _registry.wait_for_discovery()
