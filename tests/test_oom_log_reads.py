"""What the OOM handler asks the API server for when it reads a crashed container's previous log: the
start of it (limitBytes) for the phase, the last lines (tailLines) for a crash without a message. The
requests go through the real client; only the transport is replaced."""

from __future__ import annotations

from typing import Any
from unittest import mock

from kubernetes import client

from loadline.handlers import _oom


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
