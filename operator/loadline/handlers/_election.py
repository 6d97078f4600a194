"""Leader election against the API server: :class:`LeaderElector` reads and writes the Lease.

The decisions (create, take over, renew, wait) are :func:`loadline.election.plan_lease`'s; this module
does the I/O around them with the official client's ``CoordinationV1Api``:

* every write is guarded by the resourceVersion it was decided on (``replace_namespaced_lease`` with
  the object as read; ``create_namespaced_lease`` when there was none), so when two replicas decide at
  once exactly one write lands and the other gets 409 Conflict, re-reads and sees the winner;
* :meth:`LeaderElector.acquire` blocks (waiting on an Event, never spinning) until this replica holds
  the Lease, reading it every retry period;
* :meth:`LeaderElector.start_renewing` renews from a daemon thread every retry period and calls
  ``on_lost`` once it has not renewed for the renew deadline, or sees that someone else holds it; a
  renewal writes the Lease as this replica last wrote it, without reading it first (client-go's
  "optimistic" renewal: one request, not two), and only a refusal (409: someone wrote since, such as a
  shard request) makes it read, decide and write as a standby does;
* :meth:`LeaderElector.release` writes an empty holder, so a standby takes over on its next read
  instead of waiting out the lease duration.

Why not the client's own ``kubernetes.leaderelection`` (``LeaderElection`` + ``LeaseLock``, client 37)?
It gets the resourceVersion guard right, but: it cannot release the Lease (a rolling update would cost
a full lease duration with no leader); ``acquire()`` and the renew loop are ``while True`` around
``time.sleep`` with no stop, so a SIGTERM cannot end a standby's wait and ``run()`` owns its thread;
``Config`` calls ``sys.exit()`` on bad timings; it never counts ``leaseTransitions``; it logs at INFO on
every retry period; it is untyped; and it hands the client ``datetime`` values, which the client
serialises with ``isoformat()``, dropping the fraction whenever the microsecond is 0, which the API
server's ``MicroTime`` parser rejects with 400 (seen against kube-apiserver: one renewal in a million
fails). The loop below is short; see :func:`_client_time` for that last point.
"""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

from kubernetes.client import CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.exceptions import ApiException
from prometheus_client import Gauge

from loadline.election import (
    LeaseAction,
    LeaseDecision,
    LeaseRecord,
    format_micro_time,
    parse_micro_time,
    plan_lease,
    release_record,
)
from loadline.handlers import _kube
from loadline.settings import OperatorSettings

__all__ = [
    "LEADER",
    "UNREACHABLE",
    "LeaderElector",
    "StandbyHealth",
    "apply_record",
    "coordination_api",
    "lease_record",
]

log = logging.getLogger("loadline.election")

LEADER = Gauge(
    "loadline_leader_election_status",
    "1 while this replica holds the leader-election Lease, else 0 (client-go's "
    "leader_election_master_status).",
    ["name"],
)

CONFLICT_RETRIES = 3
"""Re-reads after a 409 within one round; more means the Lease is being fought over: try next period."""

#: What a Lease request may fail with besides the API's answer (by status): no answer (refused, reset,
#: timed out). The shards' Lease watch (_lease_watch) lapses on the same.
UNREACHABLE = _kube.UNREACHABLE


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _wire_time(value: datetime | None) -> str | None:
    """A timestamp of the client's model as the ``MicroTime`` string the API server sent."""
    if value is None:
        return None
    try:
        return format_micro_time(value)
    except ValueError:  # naive: not an instant, treated as unreadable (expired) by plan_lease
        return None


def _client_time(text: str | None) -> datetime | None:
    """A record's timestamp as the ``datetime`` the client's model takes.

    The client serialises datetimes with ``isoformat()``, which omits the fraction when the microsecond
    is 0; the API server parses ``MicroTime`` with exactly six fraction digits and rejects the write.
    One microsecond later is the same instant for a lease counted in seconds."""
    moment = parse_micro_time(text)
    if moment is not None and moment.microsecond == 0:
        moment += timedelta(microseconds=1)
    return moment


def lease_record(lease: V1Lease | None) -> LeaseRecord | None:
    """The election fields of a Lease as read (None: there is no Lease)."""
    if lease is None:
        return None
    spec = lease.spec or V1LeaseSpec()
    return LeaseRecord(
        holder_identity=spec.holder_identity or "",
        acquire_time=_wire_time(spec.acquire_time),
        renew_time=_wire_time(spec.renew_time),
        lease_duration_seconds=spec.lease_duration_seconds,
        lease_transitions=spec.lease_transitions or 0,
    )


def apply_record(spec: V1LeaseSpec | None, record: LeaseRecord) -> V1LeaseSpec:
    """``spec`` with the election fields of ``record`` written in; the fields this election does not
    own (``preferredHolder``, ``strategy``) are kept as read."""
    spec = spec if spec is not None else V1LeaseSpec()
    spec.holder_identity = record.holder_identity
    spec.acquire_time = _client_time(record.acquire_time)
    spec.renew_time = _client_time(record.renew_time)
    spec.lease_duration_seconds = record.lease_duration_seconds
    spec.lease_transitions = record.lease_transitions
    return spec


def coordination_api() -> CoordinationV1Api:
    """A client of its own (in-cluster config, else KUBECONFIG) without urllib3's hidden retries: the
    election loop retries every period itself, and a round must end within its timeout to keep the
    renew deadline."""
    configuration = _kube.client_configuration()
    configuration.retries = 0
    return CoordinationV1Api(_kube.CountingApiClient(configuration))


class LeaderElector:
    """One replica's side of the election on Lease ``namespace/name``, as ``identity``.

    Timings as in client-go: a standby reads and a leader renews every ``retry_period_seconds``; a
    leader that has not renewed for ``renew_deadline_seconds`` gives up (before anyone may take the
    Lease, ``lease_duration_seconds`` after its last renewal), so two replicas never both lead."""

    def __init__(
        self,
        api: CoordinationV1Api,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration_seconds: int = 15,
        renew_deadline_seconds: float = 10,
        retry_period_seconds: float = 2,
        clock: Callable[[], datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        if not identity:
            raise ValueError("identity must not be empty")
        if not lease_duration_seconds > renew_deadline_seconds > retry_period_seconds > 0:
            raise ValueError(
                "need lease_duration_seconds > renew_deadline_seconds > retry_period_seconds > 0, got "
                f"{lease_duration_seconds}, {renew_deadline_seconds}, {retry_period_seconds}"
            )
        self.api = api
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration_seconds = lease_duration_seconds
        self.renew_deadline_seconds = renew_deadline_seconds
        self.retry_period_seconds = retry_period_seconds
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()  # one read-decide-write round at a time (renewer vs release)
        self._leading = False
        self._renewed_at = 0.0  # monotonic time of our last successful write
        self._seen_version: str | None = None  # resourceVersion last read, and since when (monotonic)
        self._seen_since = 0.0
        self._standby_holder: str | None = None  # the holder last logged while standing by
        self._last_error: str | None = None
        self._stop_renewing = threading.Event()
        self._renewer: threading.Thread | None = None
        self._annotations: dict[str, str] = {}  # of the Lease as last read (the shards' requests)
        self._labels = dict(labels or {})  # written on every create and update (the shards' watch)
        self._written: V1Lease | None = None  # the Lease as this replica last wrote it (API's answer)
        LEADER.labels(name=name).set(0)

    @classmethod
    def from_settings(cls, settings: OperatorSettings, api: CoordinationV1Api | None = None) -> LeaderElector:
        """An elector with the settings' Lease, identity and timings (the namespace and identity
        resolved as :meth:`OperatorSettings.resolved_lease_namespace` says; raises its SpecError)."""
        namespace = settings.resolved_lease_namespace()
        return cls(
            api if api is not None else coordination_api(),
            name=settings.lease_name,
            namespace=namespace,
            identity=settings.resolved_identity(),
            lease_duration_seconds=settings.lease_duration_seconds,
            renew_deadline_seconds=settings.renew_deadline_seconds,
            retry_period_seconds=settings.retry_period_seconds,
        )

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_leader(self) -> bool:
        return self._leading

    # -- one round ------------------------------------------------------------------------------------

    @property
    def annotations(self) -> dict[str, str]:
        """The Lease's annotations as last read (every renewal and peek reads it): where a replica
        short of its shards asks for this one (:mod:`loadline.sharding`)."""
        return dict(self._annotations)

    def judge(self, lease: V1Lease | None) -> LeaseDecision:
        """Decide on the Lease as seen elsewhere (a watch's copy; None: there is none), reading and
        writing nothing: what :meth:`peek` decides on what it reads."""
        with self._lock:
            self._annotations = dict((lease.metadata.annotations if lease and lease.metadata else None) or {})
            return self._decide(lease)

    def _decide(self, lease: V1Lease | None) -> LeaseDecision:
        return plan_lease(
            lease_record(lease),
            self.identity,
            self._clock(),
            self.lease_duration_seconds,
            unchanged_for=self._unchanged_for(lease),
        )

    def _read(self, timeout: float) -> V1Lease | None:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status == 404:
                self._annotations = {}
                return None
            raise
        self._annotations = dict((lease.metadata.annotations if lease.metadata else None) or {})
        return lease

    def annotate(self, annotations: dict[str, str]) -> bool:
        """Write ``annotations`` onto the Lease without touching its election fields (read, then
        replace guarded by the resourceVersion read; a 409 re-reads). True when written; False when
        there is no Lease or no answer (logged once per kind). Its holder's next renewal keeps them:
        a renewal replaces the object as read."""
        timeout = float(self.renew_deadline_seconds)
        with self._lock:
            for _attempt in range(CONFLICT_RETRIES):
                what = "read"
                try:
                    lease = self._read(timeout)
                    if lease is None:
                        return False
                    if lease.metadata is None:
                        lease.metadata = V1ObjectMeta()
                    lease.metadata.annotations = {**(lease.metadata.annotations or {}), **annotations}
                    what = "annotate"
                    self._written = None  # its resourceVersion is gone once this lands
                    self.api.replace_namespaced_lease(
                        self.name, self.namespace, lease, _request_timeout=timeout
                    )
                except ApiException as exc:
                    if exc.status == 409:
                        continue
                    self._note_error(what, exc)
                    return False
                except UNREACHABLE as exc:
                    self._note_error(what, exc)
                    return False
                self._annotations = dict(lease.metadata.annotations)
                return True
            return False

    def _unchanged_for(self, lease: V1Lease | None) -> float | None:
        """How long this replica has seen the very same Lease (same resourceVersion), by its own clock."""
        version = lease.metadata.resource_version if lease is not None and lease.metadata else None
        now = self._monotonic()
        if version is None or version != self._seen_version:
            self._seen_version, self._seen_since = version, now
        return now - self._seen_since if version is not None else None

    def _write(self, record: LeaseRecord, lease: V1Lease | None, timeout: float) -> None:
        """Create the Lease, or replace ``lease`` (the object as read or as last written: its
        resourceVersion makes the API server refuse a stale write, 409); keep the answer for the next
        renewal."""
        self._written = None
        if lease is None:
            body = V1Lease(
                metadata=V1ObjectMeta(name=self.name, namespace=self.namespace, labels=self._labels or None),
                spec=apply_record(None, record),
            )
            answer = self.api.create_namespaced_lease(self.namespace, body, _request_timeout=timeout)
        else:
            lease.spec = apply_record(lease.spec, record)
            if self._labels:
                if lease.metadata is None:
                    lease.metadata = V1ObjectMeta()
                lease.metadata.labels = {**(lease.metadata.labels or {}), **self._labels}
            answer = self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=timeout
            )
        if isinstance(answer, V1Lease) and answer.metadata is not None and answer.metadata.resource_version:
            self._written = answer
            self._annotations = dict(answer.metadata.annotations or {})

    def _renew_as_written(self, timeout: float) -> tuple[bool, LeaseDecision | None]:
        """The leader's renewal without a read: the Lease as this replica last wrote it, renewed.
        ``(True, decision)`` when written, ``(True, None)`` when the API server did not answer
        (logged); ``(False, None)`` when it must read first: nothing kept, or refused (409: a write
        landed since, such as a shard request; 404: deleted)."""
        lease = self._written
        if lease is None or not self._leading:
            return False, None
        decision = plan_lease(lease_record(lease), self.identity, self._clock(), self.lease_duration_seconds)
        if decision.action is not LeaseAction.RENEW or decision.write is None:
            return False, None
        try:
            self._write(decision.write, lease, timeout)
        except ApiException:
            return False, None  # refused (409, 404: deleted, ...): read and decide on what is there
        except UNREACHABLE as exc:
            self._written = lease  # unchanged unless it landed; if it did, the next write gets 409
            self._note_error("update", exc)
            return True, None
        self._last_error = None
        self._renewed_at = self._monotonic()
        return True, decision

    def _note_error(self, what: str, exc: Exception) -> None:
        detail = (
            f"{exc.status} {exc.reason}"
            if isinstance(exc, ApiException)
            else f"unreachable ({type(exc).__name__})"
        )
        key = f"{what}: {detail}"
        if key != self._last_error:  # once per kind of failure, not every retry period
            log.warning(
                "lease %s: cannot %s: %s (retrying every %g s)",
                self.lease,
                what,
                detail,
                self.retry_period_seconds,
            )
            self._last_error = key

    def try_acquire_or_renew(
        self, *, renew_only: bool = False, timeout: float | None = None
    ) -> LeaseDecision | None:
        """One round: read the Lease, decide, write. Returns the decision, which was written exactly
        when it ``acquires`` (with ``renew_only``: when it is ``RENEW``; a leader must not take back a
        Lease that passed through other hands); or None when the API server did not answer or refused
        (logged once per kind of failure). A 409 Conflict means another replica wrote between our read
        and our write: read again and decide again (a few times, then None)."""
        timeout = timeout if timeout is not None else float(self.renew_deadline_seconds)
        with self._lock:
            if renew_only:
                done, renewed = self._renew_as_written(timeout)
                if done:
                    return renewed
            for _attempt in range(CONFLICT_RETRIES):
                what = "read"
                try:
                    lease = self._read(timeout)
                    decision = self._decide(lease)
                    hands_off = renew_only and decision.action is not LeaseAction.RENEW
                    if decision.write is None or hands_off:
                        self._last_error = None
                        return decision
                    what = "create" if lease is None else "update"
                    self._write(decision.write, lease, timeout)
                except ApiException as exc:
                    if exc.status == 409:
                        continue  # lost a race for this write: re-read, the winner's record decides
                    self._note_error(what, exc)
                    return None
                except UNREACHABLE as exc:
                    self._note_error(what, exc)
                    return None
                self._last_error = None
                self._renewed_at = self._monotonic()
                return decision
            return None

    # -- standby --------------------------------------------------------------------------------------

    def peek(self) -> LeaseDecision | None:
        """Read the Lease and decide, writing nothing: whether it is free to take (``acquires``), who
        holds it and until when. None when the API server did not answer (logged once per kind)."""
        timeout = float(self.renew_deadline_seconds)
        with self._lock:
            try:
                lease = self._read(timeout)
            except ApiException as exc:
                self._note_error("read", exc)
                return None
            except UNREACHABLE as exc:
                self._note_error("read", exc)
                return None
            self._last_error = None
            return self._decide(lease)

    def try_acquire(self, since: float | None = None) -> bool:
        """One round that takes the Lease if it is free (True: this replica holds it now, logged)."""
        return self._took(self.try_acquire_or_renew(), since)

    def _took(self, decision: LeaseDecision | None, since: float | None) -> bool:
        if decision is None or not decision.acquires:
            return False
        self._leading = True
        LEADER.labels(name=self.name).set(1)
        now = self._monotonic()
        log.info(
            "leader: acquired lease %s as %s after %.1f s (%s)",
            self.lease,
            self.identity,
            now - (since if since is not None else now),
            _how(decision),
        )
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this replica holds the Lease (True), or until ``stop`` is set (False).

        Logs one line when it starts standing by and whenever the holder changes, one when it leads."""
        started = self._monotonic()
        log.info("candidate: for lease %s as %s", self.lease, self.identity)
        while not stop.is_set():
            decision = self.try_acquire_or_renew()
            if self._took(decision, started):
                return True
            if decision is not None and decision.holder != self._standby_holder:
                self._standby_holder = decision.holder
                log.info(
                    "standby: lease %s held by %s (expires in %.0f s unless renewed)",
                    self.lease,
                    decision.holder,
                    decision.wait_seconds,
                )
            stop.wait(self.retry_period_seconds)
        return False

    # -- leader ---------------------------------------------------------------------------------------

    def start_renewing(self, on_lost: Callable[[str], None]) -> None:
        """Renew from a daemon thread every retry period until :meth:`stop_renewing` or :meth:`release`.

        ``on_lost(reason)`` is called once, from that thread, when the Lease is lost: another replica
        holds it (or it was deleted or cleared), or no renewal succeeded for the renew deadline. The
        thread then ends; this replica must stop leading at once."""
        if not self._leading:
            raise RuntimeError(f"start_renewing before acquiring lease {self.lease}")
        if self._renewer is not None and self._renewer.is_alive():
            return
        self._stop_renewing.clear()
        self._renewer = threading.Thread(
            target=self._renew_loop, args=(on_lost,), name=f"lease-renewer-{self.name}", daemon=True
        )
        self._renewer.start()

    def _renew_loop(self, on_lost: Callable[[str], None]) -> None:
        while True:
            # Never sleep or wait on a request past the renew deadline: a hung API server must not hold
            # this loop beyond the point where a standby may take over.
            left = self._renewed_at + self.renew_deadline_seconds - self._monotonic()
            if self._stop_renewing.wait(min(float(self.retry_period_seconds), max(left, 0.0))):
                return
            left = self._renewed_at + self.renew_deadline_seconds - self._monotonic()
            if left <= 0:
                self._lose(on_lost, f"not renewed for {self.renew_deadline_seconds:g} s (the renew deadline)")
                return
            try:
                decision = self.try_acquire_or_renew(renew_only=True, timeout=left)
            except Exception:  # a dead renewer would leave kopf running on a Lease nobody renews
                log.exception("lease %s: renewal failed unexpectedly", self.lease)
                decision = None
            if self._stop_renewing.is_set():
                return  # released meanwhile: what this round saw is no longer ours to judge
            if decision is None or decision.action is LeaseAction.RENEW:
                continue  # renewed, or no answer (the deadline above decides)
            if decision.holder:
                reason = f"held by {decision.holder}"
            else:
                reason = "the Lease was deleted" if decision.reason == "absent" else "the Lease was cleared"
            self._lose(on_lost, reason)
            return

    def _lose(self, on_lost: Callable[[str], None], reason: str) -> None:
        self._leading = False
        LEADER.labels(name=self.name).set(0)
        log.error("lost lease %s: %s; stopping", self.lease, reason)
        on_lost(reason)

    def stop_renewing(self) -> None:
        """Stop the renewer thread (and wait for its round in flight to end)."""
        self._stop_renewing.set()
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join()

    def release(self) -> bool:
        """Stop renewing and hand the Lease over: write an empty holder (``renewTime`` now) if this
        replica still holds it, so a standby takes it on its next read. True when released; never
        raises, because a release that fails only means the standby waits for the lease to expire."""
        self.stop_renewing()
        timeout = float(self.renew_deadline_seconds)
        with self._lock:
            was_leading, self._leading = self._leading, False
            self._written = None
            LEADER.labels(name=self.name).set(0)
            for _attempt in range(CONFLICT_RETRIES):
                try:
                    lease = self._read(timeout)
                    record = release_record(lease_record(lease), self.identity, self._clock())
                    if lease is None or record is None:
                        if was_leading:
                            log.info("lease %s: not released, no longer ours", self.lease)
                        return False
                    lease.spec = apply_record(lease.spec, record)
                    self.api.replace_namespaced_lease(
                        self.name, self.namespace, lease, _request_timeout=timeout
                    )
                except ApiException as exc:
                    if exc.status == 409:
                        continue
                    log.warning(
                        "lease %s: release failed: %s %s; it expires on its own",
                        self.lease,
                        exc.status,
                        exc.reason,
                    )
                    return False
                except UNREACHABLE as exc:
                    log.warning(
                        "lease %s: release failed: unreachable (%s); it expires on its own",
                        self.lease,
                        type(exc).__name__,
                    )
                    return False
                log.info("released lease %s", self.lease)
                return True
            return False


def _how(decision: LeaseDecision) -> str:
    if decision.reason == "absent":
        return "created it"
    if decision.reason == "ours":
        return "it named this replica already"
    if decision.reason == "released":
        return "it had been released"
    return f"the lease of {decision.holder} had expired"


class StandbyHealth:
    """``/healthz`` for a standby (200, body ``standby``), so the kubelet's liveness probe does not
    restart a replica that is only waiting for the Lease. Closed once the replica leads, before kopf
    serves its own ``/healthz`` on the same port."""

    def __init__(self, port: int, host: str = "0.0.0.0") -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/healthz":
                    self.send_error(404)
                    return
                body = b"standby"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a probe every few seconds is not news

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="standby-healthz",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
