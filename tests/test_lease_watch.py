"""loadline.handlers._lease_watch: the shard Leases kept current from a LIST and a watch, through the
official client's ``watch.Watch`` against an in-memory API that answers as the API server does (a
LIST with its resourceVersion, then chunked JSON watch lines; 410 Gone as an ERROR event)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes.client import V1Lease, V1LeaseList, V1LeaseSpec, V1ListMeta, V1ObjectMeta

from loadline.handlers._lease_watch import LeaseWatch

NS = "loadline-system"


def lease(name: str, holder: str, version: str) -> V1Lease:
    return V1Lease(
        metadata=V1ObjectMeta(name=name, namespace=NS, resource_version=version),
        spec=V1LeaseSpec(holder_identity=holder),
    )


def wire(name: str, holder: str, version: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": version},
        "spec": {"holderIdentity": holder},
    }


class Stream:
    """A watch response: its lines, in one chunk each, then the end of the request."""

    status = 200

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for event in self.events:
            yield (json.dumps(event) + "\n").encode()

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class FakeApi:
    """``list_namespaced_lease`` as the client has it: a LIST, or (``watch=True``) the next scripted
    watch answer: a Stream, or an exception to raise."""

    def __init__(self, lists: list[V1LeaseList], watches: list[Stream | Exception]) -> None:
        self.lists = lists
        self.watches = watches
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def list_namespaced_lease(self, namespace: str, **kwargs: Any) -> V1LeaseList:
        with self.lock:
            self.calls.append({"namespace": namespace, **kwargs})
            if not kwargs.get("watch"):
                return self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
            answer = self.watches.pop(0) if self.watches else Stream([])
        if isinstance(answer, Exception):
            raise answer
        if not self.watches:
            time.sleep(0.05)  # the script is done: an idle stream, as the server's timeout would end
        return answer  # type: ignore[return-value]


def wait_until(check: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def holder(watch: LeaseWatch, name: str) -> str | None:
    current, seen = watch.seen(name)
    return str(seen.spec.holder_identity) if current and seen is not None and seen.spec else None


def test_the_watch_keeps_the_list_current_and_resumes_where_it_stopped() -> None:
    api = FakeApi(
        [V1LeaseList(items=[lease("s-0", "a", "3")], metadata=V1ListMeta(resource_version="5"))],
        [
            Stream([
                {"type": "MODIFIED", "object": wire("s-0", "b", "6")},
                {"type": "ADDED", "object": wire("s-1", "c", "7")},
                {"type": "BOOKMARK", "object": {"kind": "Lease", "metadata": {"resourceVersion": "9"}}},
            ]),
            Stream([{"type": "DELETED", "object": wire("s-1", "c", "10")}]),
        ],
    )  # fmt: skip
    watch = LeaseWatch(api, NS, "loadline.dev/shards=2", retry_seconds=0.01)
    assert watch.seen("s-0") == (False, None)  # not started: not known, read instead
    watch.start()
    try:
        wait_until(lambda: holder(watch, "s-0") == "b")
        wait_until(lambda: watch.seen("s-1") == (True, None))  # added, then deleted
        assert holder(watch, "s-0") == "b"
        # The resumed watch after the DELETED one is opened by the watch's thread a moment later.
        wait_until(lambda: len([c for c in api.calls if c.get("watch")]) >= 3)
        watches = [c for c in api.calls if c.get("watch")]
        assert [c["resource_version"] for c in watches[:3]] == ["5", "9", "10"]  # bookmark's version
        assert all(c["label_selector"] == "loadline.dev/shards=2" for c in api.calls)
        assert len([c for c in api.calls if not c.get("watch")]) == 1  # one LIST: resumed, not re-listed
    finally:
        watch.stop()


def test_gone_or_no_answer_lapses_the_copy_until_it_is_listed_again() -> None:
    refused = threading.Event()

    class Unreachable(urllib3.exceptions.ProtocolError):
        def __init__(self) -> None:
            refused.set()
            super().__init__("Connection refused")

    api = FakeApi(
        [
            V1LeaseList(items=[lease("s-0", "a", "3")], metadata=V1ListMeta(resource_version="5")),
            V1LeaseList(items=[lease("s-0", "b", "20")], metadata=V1ListMeta(resource_version="20")),
        ],
        [
            Stream([{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                  "message": "too old resource version"}}]),
        ],
    )  # fmt: skip
    watch = LeaseWatch(api, NS, "loadline.dev/shards=2", retry_seconds=0.01)
    watch.start()
    try:
        # 410 Gone: listed again at once (no wait), and current with what the second LIST says.
        wait_until(lambda: holder(watch, "s-0") == "b")
        assert len([c for c in api.calls if not c.get("watch")]) == 2
        # No answer: "not known" (the keeper reads instead) until a LIST answers again.
        gate = threading.Event()
        original = api.list_namespaced_lease

        def failing(namespace: str, **kwargs: Any) -> V1LeaseList:
            if not gate.is_set():
                raise Unreachable()
            return original(namespace, **kwargs)

        api.list_namespaced_lease = failing  # type: ignore[method-assign]
        wait_until(refused.is_set)
        wait_until(lambda: watch.seen("s-0") == (False, None))
        gate.set()
        wait_until(lambda: holder(watch, "s-0") == "b")
    finally:
        watch.stop()
