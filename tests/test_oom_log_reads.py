"""What the OOM handler asks the API server for when it reads a crashed container's previous log: the
start of it (limitBytes) for the phase, the last lines (tailLines) for a crash without a message. The
requests go through the real client; only the transport is replaced."""

from __future__ import annotations

from typing import Any
from unittest import mock

from kubernetes import client

from loadline.handlers import _oom
from loadline.oom import OomClass, classify, parse_incident
from loadline.oom._observe import build_incident


def requested(read: Any) -> tuple[str, Any]:
    urls: list[str] = []

    def transport(self: client.ApiClient, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        urls.append(url)
        raise client.exceptions.ApiException(status=404)

    with mock.patch.object(client.ApiClient, "call_api", transport):
        result = read("team-a", "chat-abc", "vllm")
    return urls[0], result


def test_the_phase_read_asks_for_the_start_of_the_previous_log() -> None:
    url, result = requested(_oom._previous_log_head)
    assert url.startswith("/api/v1/namespaces/team-a/pods/chat-abc/log?")
    assert f"limitBytes={_oom.LOG_HEAD_BYTES}" in url and "previous=true" in url and "container=vllm" in url
    assert "tailLines" not in url
    assert result == ("", False)  # unreadable: no phase, the crash is handled without it


def test_a_crash_without_a_message_reads_the_last_lines() -> None:
    url, result = requested(_oom._previous_log)
    assert "tailLines=60" in url and "previous=true" in url and "limitBytes" not in url
    assert result == ""


RAN = {"startedAt": "2026-11-26T10:00:00Z", "finishedAt": "2026-11-26T11:00:00Z"}


def node_event(node: str, reason: str, when: str) -> dict[str, Any]:
    return {"reason": reason, "involvedObject": {"kind": "Node", "name": node}, "lastTimestamp": when}


def test_node_oom_events_are_listed_where_the_chart_lets_the_operator_list_them(
    monkeypatch: Any,
) -> None:
    """Node Events live in ``default``; the chart's namespaced RBAC grants listing Events there only, so
    a LIST across all namespaces would be refused (and counted as no OOM kill on the node). Only the OOM
    reasons are asked for, and only kills while the container ran count for it."""
    asked: list[tuple[Any, ...]] = []
    stored = [
        node_event("gpu-7", "OOMKilling", "2026-11-26T10:30:00Z"),  # while it ran
        node_event("gpu-7", "OOMKilling", "2026-11-26T11:00:20Z"),  # recorded just after its end
        node_event("gpu-7", "OOMKilling", "2026-11-26T09:00:00Z"),  # before it started: not its kill
        node_event("gpu-8", "OOMKilling", "2026-11-26T10:30:00Z"),  # another node
        node_event("gpu-7", "SystemOOM", "2026-11-26T10:45:00Z"),
    ]

    def list_objects(
        api_version: str, kind: str, namespace: str | None = None, **selectors: str
    ) -> list[Any]:
        asked.append((kind, namespace, selectors))
        reason = selectors["field_selector"].rsplit("reason=", 1)[1]
        return [e for e in stored if e["reason"] == reason]

    monkeypatch.setattr(_oom._kube, "list_objects", list_objects)
    monkeypatch.setattr(_oom, "NODE_OOMS", _oom._kube.RecentReads(max_age=5.0))
    assert _oom._node_oom_events("gpu-7", RAN, _oom.NODE_OOMS.now()) == 3
    assert asked == [
        ("Event", "default", {"field_selector": f"involvedObject.kind=Node,reason={reason}"})
        for reason in ("OOMKilling", "SystemOOM")
    ]
    assert _oom._node_oom_events("", RAN, _oom.NODE_OOMS.now()) == 0 and len(asked) == 2  # unscheduled


def test_a_burst_of_crashes_shares_a_node_events_read_begun_after_each_was_seen(monkeypatch: Any) -> None:
    """Each crash sees the Events written up to when it was seen (as a LIST of its own would), and the
    crashes seen before one read began share it."""
    now = [100.0]
    reads: list[float] = []

    def read() -> dict[str, Any]:
        reads.append(now[0])
        return {}

    monkeypatch.setattr(_oom, "_read_node_ooms", read)
    monkeypatch.setattr(_oom, "NODE_OOMS", _oom._kube.RecentReads(max_age=5.0, clock=lambda: now[0]))
    first_seen = second_seen = _oom.NODE_OOMS.now()
    _oom._node_oom_events("gpu-1", RAN, first_seen)
    _oom._node_oom_events("gpu-2", RAN, second_seen)
    assert reads == [100.0]  # one read for both
    now[0] = 101.0
    _oom._node_oom_events("gpu-3", RAN, _oom.NODE_OOMS.now())  # seen after that read began
    assert reads == [100.0, 101.0]


def test_an_error_exit_whose_node_killed_a_process_meanwhile_is_a_host_memory_crash() -> None:
    """vLLM's engine core killed by the kernel leaves the server to exit with an error, not OOMKilled:
    the node's OOM Event during the container's run is what says host memory."""
    pod = {
        "metadata": {"name": "chat-abc", "namespace": "team-a"},
        "spec": {"containers": [{"name": "vllm", "resources": {"limits": {"memory": "64Gi"}}}]},
    }
    status = {
        "name": "vllm",
        "restartCount": 1,
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", **RAN}},
    }
    model = {"metadata": {"name": "chat"}, "spec": {}, "status": {}}
    without = classify(parse_incident(build_incident(pod, status, model, node_oom_events=0)))
    with_kill = classify(parse_incident(build_incident(pod, status, model, node_oom_events=1)))
    assert without.oom_class == OomClass.UNKNOWN
    assert with_kill.oom_class == OomClass.HOST_MEMORY, with_kill
