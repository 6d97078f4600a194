"""The operator's Kubernetes client keeps a connection per handler thread: with fewer, threads queue for
a connection and urllib3 warns "Connection pool is full" (seen at 200 models on 2,000 nodes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from loadline.handlers import _kube
from loadline.state import RecentReads

KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "x",
}


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(KUBECONFIG))
    # The client reads KUBECONFIG when it is imported; point its default at the file instead.
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    saved = client.Configuration.get_default_copy()
    yield path
    client.Configuration.set_default(saved)
    client.ApiClient.set_default(None)
    _kube.set_pool_size(16)


def pool_size(api: client.ApiClient) -> int:
    return int(api.rest_client.pool_manager.connection_pool_kw["maxsize"])


def test_every_client_made_after_loading_has_a_connection_per_handler_thread(kubeconfig: Path) -> None:
    _kube.set_pool_size(40)
    _kube.load_config()
    assert pool_size(client.ApiClient()) == 40  # the dynamic client's
    assert pool_size(client.CoreV1Api().api_client) == 40  # the log reads' and evictions'
    assert client.Configuration.get_default_copy().host == "https://127.0.0.1:6443"


def test_recent_reads_share_one_read_in_flight_and_read_again_when_old() -> None:
    """A burst's timers asking at once wait for one LIST; an answer older than max_age is read again."""
    import threading
    import time

    now = [0.0]
    reads: list[str] = []
    started = threading.Event()

    def slow_read() -> list[str]:
        reads.append("list")
        started.set()
        time.sleep(0.2)  # the LIST in flight while the others ask
        return ["pod-a"]

    recent: RecentReads[str, list[str]] = RecentReads(max_age=5.0, clock=lambda: now[0])
    answers: list[list[str]] = []
    first = threading.Thread(target=lambda: answers.append(recent.get("team-a", slow_read)))
    first.start()
    started.wait(5)
    others = [
        threading.Thread(target=lambda: answers.append(recent.get("team-a", slow_read))) for _ in range(5)
    ]
    for thread in [*others]:
        thread.start()
    for thread in [first, *others]:
        thread.join(5)
    assert reads == ["list"] and answers == [["pod-a"]] * 6
    assert recent.get("team-b", lambda: ["pod-b"]) == ["pod-b"]  # another key: its own read
    now[0] = 6.0
    recent.get("team-a", slow_read)
    assert reads == ["list", "list"]


@pytest.mark.parametrize("workers", [1, 4, 16, 64, 256])
def test_the_pool_holds_every_thread_that_may_call_the_api_server(workers: int) -> None:
    """kopf's pool and the three lanes each take up to their size in threads at once."""
    from loadline.lanes import Lanes
    from loadline.settings import OperatorSettings

    lanes = Lanes.sized(workers)
    threads = workers + lanes.models.workers + lanes.crashes.workers + lanes.checks.workers
    assert OperatorSettings(max_workers=workers).api_connections >= threads
