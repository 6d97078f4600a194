"""The operator's in-memory capacity indexes, through kopf's own index: an object that stops holding
GPUs (a finished pod, a node that lost its GPU label, a restart that is over) must leave the index."""

from __future__ import annotations

import sys
import threading
from typing import Any

from kopf._core.engines.indexing import OperatorIndexer

from loadline.handlers import _registry
from loadline.state import _index

KEY = ("team-a", "chat-abc", "uid-1")


def gpu_pod(phase: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "labels": {_index.INSTANCE_LABEL: "chat"}},
        "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": phase},
    }


def indexed(*entries: dict[str, Any]) -> dict[Any, list[Any]]:
    """What kopf's index holds after the object's indexing function returned ``entries`` in turn."""
    indexer = OperatorIndexer()
    for entry in entries:
        indexer.replace(KEY, entry)  # what kopf does with each non-None result
    return {key: list(store) for key, store in indexer.index.items()}


def test_a_finished_gpu_pod_leaves_the_capacity_index() -> None:
    assert list(indexed(_index.pod_entry(gpu_pod("Running")))) == ["n1"]
    assert indexed(_index.pod_entry(gpu_pod("Running")), _index.pod_entry(gpu_pod("Succeeded"))) == {}


def test_a_node_without_its_gpu_label_leaves_the_capacity_index() -> None:
    node = {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-L4"}}, "status": {}}
    plain = {"metadata": {"labels": {}}, "status": {}}
    assert list(indexed(_index.node_entry(node, "n1"))) == ["n1"]
    assert indexed(_index.node_entry(node, "n1"), _index.node_entry(plain, "n1")) == {}


def test_a_finished_restart_releases_its_slot() -> None:
    def model(state: str) -> Any:
        return {
            "metadata": {"namespace": "team-a", "name": "chat"},
            "status": {"maintenance": {"state": state}},
        }

    def entry(state: str) -> dict[str, Any]:
        return _registry.restarting(body=model(state), namespace="team-a", name="chat")

    assert indexed(entry("Running")) == {"team-a/chat": [{"namespace": "team-a", "labels": {}}]}
    assert indexed(entry("Running"), entry("Done")) == {}


def test_an_index_read_from_a_handlers_thread_while_kopf_changes_it() -> None:
    # kopf changes its indexes on its event loop while sync handlers (the maintenance timer, a crash's
    # remediation, reconcile) read them in threads. Reading through the mapping's views raised
    # "dictionary changed size during iteration" or KeyError in a storm of 1,000 crashes; the
    # handlers' readers take the index in one step and must never fail, however the threads interleave.
    indexer = OperatorIndexer()
    for pod in range(200):
        indexer.replace(("team-a", f"pod-{pod}", f"uid-{pod}"), {f"node-{pod % 50}": pod})
    stop = threading.Event()

    def churn() -> None:  # pods come and go, as in a storm's roll-outs
        turn = 0
        while not stop.is_set():
            turn += 1
            pod = turn % 400
            key = ("team-a", f"pod-{pod}", f"uid-{pod}")
            if turn % 2:
                indexer.replace(key, {f"node-{turn % 97}": pod})
            else:
                indexer.discard(key)

    def views_fail(reads: int) -> bool:
        for _ in range(reads):  # until the first failure: it came within a few hundred reads here
            try:
                [entry for store in indexer.index.values() for entry in store]
            except (RuntimeError, KeyError):
                return True
        return False

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave as often as the interpreter lets them
    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    try:
        assert views_fail(100_000), "the race this guards against did not happen: the test proves nothing"
        for _ in range(3000):
            pods = _index.entries(indexer.index)
            assert all(isinstance(pod, int) for pod in pods)
            assert all(len(pair) == 2 for pair in _index.pairs(indexer.index))
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(switch)
