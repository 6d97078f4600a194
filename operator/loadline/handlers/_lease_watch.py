"""A watch of the shard Leases, so that a replica sees the Leases it does not hold without reading them.

Every retry period a replica looks at each shard it does not hold (is it free? who holds it? did
someone ask for one?). Reading each of them cost ``shards - held`` GETs per replica per period: with 4
replicas and 4 shards, 360 requests a minute at rest and two GETs per model created (issue 14's
4-replica run). One watch per replica, on the Leases labelled with the split
(:data:`loadline.sharding.SHARD_LEASE_LABEL`), delivers the same objects as they change.

The copy is only trusted while the watch is known to be current: from the LIST that starts it until an
error or the stream's end, after which :meth:`LeaseWatch.seen` answers "not known" and the keeper reads
the Lease as before, until the watch is back (re-listed after 410 Gone, a refusal or no answer). A copy
that is late only makes a Lease look unrenewed for longer: the keeper then tries to take it, and that
is a read and a write guarded by resourceVersion, which decides on the Lease as it is.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from kubernetes import watch
from kubernetes.client import V1Lease
from kubernetes.client.exceptions import ApiException

from loadline.handlers._kube import UNREACHABLE

__all__ = ["LeaseWatch"]

log = logging.getLogger("loadline.shards")

WATCH_SECONDS = 60
"""How long the API server keeps one watch request open; the next resumes from the last
resourceVersion seen (one request a minute per replica)."""


class LeaseWatch:
    """The Leases matching ``label_selector`` in ``namespace``, kept current from a watch on a daemon
    thread (:meth:`start`). ``api`` is a ``CoordinationV1Api``."""

    def __init__(self, api: Any, namespace: str, label_selector: str, *, retry_seconds: float = 2.0) -> None:
        self.api = api
        self.namespace = namespace
        self.label_selector = label_selector
        self.retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._leases: dict[str, V1Lease] = {}
        self._current = False  # the copy is the API server's, as of the watch's last event
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._loop, name="shard-lease-watch", daemon=True)
        self._last_error: str | None = None

    # -- what the keeper asks -------------------------------------------------------------------------

    def seen(self, name: str) -> tuple[bool, V1Lease | None]:
        """``(True, lease)`` when the watch is current (``lease`` None: there is no such Lease), a copy
        the caller may change; ``(False, None)`` when it is not (not started, or between an error and
        the next LIST): read the Lease instead."""
        with self._lock:
            if not self._current:
                return False, None
            lease = self._leases.get(name)
            return True, copy.deepcopy(lease) if lease is not None else None

    # -- what the watch delivers (its thread; tests feed it directly) ---------------------------------

    def replace(self, leases: list[V1Lease]) -> None:
        """The LIST's answer: every matching Lease; the copy is current from now on."""
        with self._lock:
            self._leases = {str(lease.metadata.name): lease for lease in leases if lease.metadata}
            self._current = True

    def observe(self, event_type: str, lease: V1Lease) -> None:
        """One watch event (ADDED, MODIFIED, DELETED; BOOKMARK carries no Lease)."""
        if event_type == "BOOKMARK" or lease.metadata is None:
            return
        with self._lock:
            if event_type == "DELETED":
                self._leases.pop(str(lease.metadata.name), None)
            else:
                self._leases[str(lease.metadata.name)] = lease

    def lapse(self) -> None:
        """The watch stopped being current: answer "not known" until the next LIST."""
        with self._lock:
            self._current = False

    # -- the thread -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching. The thread ends at its stream's next event or timeout (it is a daemon)."""
        self._stop.set()
        self.lapse()
        if self._watch is not None:
            self._watch.stop()  # type: ignore[no-untyped-call]

    def _loop(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listing = self.api.list_namespaced_lease(
                        self.namespace, label_selector=self.label_selector, _request_timeout=30
                    )
                    self.replace(list(listing.items or []))
                    version = listing.metadata.resource_version
                version = self._follow(version)
                self._last_error = None
            except ApiException as exc:
                self.lapse()
                version = None  # 410 Gone (too old to resume) or a refusal: list again
                if exc.status != 410:
                    self._note(f"{exc.status} {exc.reason}")
                    self._stop.wait(self.retry_seconds)
            except UNREACHABLE as exc:
                self.lapse()
                version = None
                self._note(f"unreachable ({type(exc).__name__})")
                self._stop.wait(self.retry_seconds)
            except Exception:  # a dead watch would only cost reads, but say why
                self.lapse()
                version = None
                log.exception("shard Lease watch failed")
                self._stop.wait(self.retry_seconds)

    def _follow(self, version: str | None) -> str | None:
        """One watch request from ``version``, until the API server ends it; the last version seen."""
        stream = self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(  # type: ignore[no-untyped-call]
            self.api.list_namespaced_lease,
            self.namespace,
            label_selector=self.label_selector,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=WATCH_SECONDS + 30,
        ):
            if self._stop.is_set():
                break
            lease = event.get("object")
            if isinstance(lease, V1Lease):  # a BOOKMARK's object is left undecoded
                self.observe(str(event.get("type")), lease)
        # The client keeps the last resourceVersion of every event, bookmarks included.
        return str(stream.resource_version or version) if (stream.resource_version or version) else None

    def _note(self, detail: str) -> None:
        if detail != self._last_error:
            log.warning(
                "shard Lease watch in %s: %s; reading the Leases instead until it is back",
                self.namespace,
                detail,
            )
            self._last_error = detail
