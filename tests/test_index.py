"""The operator's in-memory capacity indexes, through kopf's own index: an object that stops holding
GPUs (a finished pod, a node that lost its GPU label, a restart that is over) must leave the index."""

from __future__ import annotations

from typing import Any

from kopf._core.engines.indexing import OperatorIndexer

from loadline.handlers import _index, _registry

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
