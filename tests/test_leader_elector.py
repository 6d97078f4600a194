"""loadline.handlers._election and the election side of ``loadline run``, against an in-memory Lease API.

The fake keeps one Lease per name with a resourceVersion and answers as the API server does: 404 for
a missing Lease, 409 for a create of an existing one or a replace with a stale resourceVersion."""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import os
import signal
import socket
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client import CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

import loadline.settings
from loadline import _cli_run
from loadline.election import LeaseAction, LeaseRecord, format_micro_time
from loadline.errors import SpecError
from loadline.handlers import _election
from loadline.handlers._election import LeaderElector, StandbyHealth, apply_record, lease_record
from loadline.settings import OperatorSettings

NS = "loadline-system"


class FakeLeases:
    """Just enough of CoordinationV1Api: read, create, replace, with resourceVersion conflicts."""

    def __init__(self) -> None:
        self.leases: dict[str, V1Lease] = {}
        self.version = 0
        self.lock = threading.Lock()
        self.fail: Exception | None = None  # raised by every call while set
        self.before_write: Callable[[], object] | None = None  # runs once, between a read and a write
        self.writes: list[V1Lease] = []
        self.reads: list[str] = []  # the names read, in order
        self.watchers: list[Any] = []  # LeaseWatch-likes: every stored Lease goes to their observe()

    def _key(self, name: str, namespace: str) -> str:
        return f"{namespace}/{name}"

    def _store(self, lease: V1Lease) -> V1Lease:
        self.version += 1
        stored = copy.deepcopy(lease)
        assert stored.metadata is not None
        stored.metadata.resource_version = str(self.version)
        self.leases[self._key(str(stored.metadata.name), str(stored.metadata.namespace))] = stored
        self.writes.append(copy.deepcopy(stored))
        for watcher in self.watchers:
            watcher.observe("MODIFIED", copy.deepcopy(stored))
        return copy.deepcopy(stored)

    def _hook(self) -> None:
        hook, self.before_write = self.before_write, None
        if hook is not None:
            hook()

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> V1Lease:
        if self.fail is not None:
            raise self.fail
        with self.lock:
            self.reads.append(name)
            lease = self.leases.get(self._key(name, namespace))
            if lease is None:
                raise ApiException(status=404, reason="Not Found")
            return copy.deepcopy(lease)

    def create_namespaced_lease(self, namespace: str, body: V1Lease, **_: Any) -> V1Lease:
        if self.fail is not None:
            raise self.fail
        self._hook()
        with self.lock:
            assert body.metadata is not None and body.metadata.name
            if self._key(body.metadata.name, namespace) in self.leases:
                raise ApiException(status=409, reason="AlreadyExists")
            body = copy.deepcopy(body)
            body.metadata.namespace = namespace  # type: ignore[union-attr]
            return self._store(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: V1Lease, **_: Any) -> V1Lease:
        if self.fail is not None:
            raise self.fail
        self._hook()
        with self.lock:
            current = self.leases.get(self._key(name, namespace))
            if current is None:
                raise ApiException(status=404, reason="Not Found")
            assert body.metadata is not None and current.metadata is not None
            if body.metadata.resource_version != current.metadata.resource_version:
                raise ApiException(status=409, reason="Conflict")
            return self._store(body)

    # test helpers

    def record(self, name: str = "loadline") -> LeaseRecord | None:
        return lease_record(self.leases.get(self._key(name, NS)))

    def set_holder(self, holder: str, renewed: datetime, name: str = "loadline") -> None:
        with self.lock:
            lease = copy.deepcopy(self.leases[self._key(name, NS)])
            assert lease.spec is not None
            lease.spec.holder_identity = holder
            lease.spec.renew_time = renewed
            self._store(lease)


class Clock:
    """A wall clock the test moves (the elector's `clock`); monotonic time stays real."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 23, 10, 0, 0, 250000, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def api() -> FakeLeases:
    return FakeLeases()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def elector(api: FakeLeases, identity: str, clock: Clock | None = None, **timings: float) -> LeaderElector:
    kwargs: dict[str, Any] = {
        "lease_duration_seconds": 15,
        "renew_deadline_seconds": 10,
        "retry_period_seconds": 2,
    }
    kwargs.update(timings)
    if clock is not None:
        kwargs["clock"] = clock
    fake: CoordinationV1Api = api  # type: ignore[assignment]
    return LeaderElector(fake, name="loadline", namespace=NS, identity=identity, **kwargs)


class Lost:
    """An on_lost callback that records its reasons."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.event = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.event.set()


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- model conversion ------------------------------------------------------------------------------------


def test_lease_record_reads_the_clients_model() -> None:
    stamp = datetime(2026, 11, 23, 10, 0, 0, 123456, tzinfo=UTC)
    lease = V1Lease(
        metadata=V1ObjectMeta(name="loadline"),
        spec=V1LeaseSpec(
            holder_identity="a",
            acquire_time=stamp,
            renew_time=stamp,
            lease_duration_seconds=15,
            lease_transitions=2,
        ),
    )
    assert lease_record(lease) == LeaseRecord("a", format_micro_time(stamp), format_micro_time(stamp), 15, 2)
    assert lease_record(None) is None
    assert lease_record(V1Lease(metadata=V1ObjectMeta(name="x"))) == LeaseRecord()


def test_written_times_always_carry_six_fraction_digits() -> None:
    """The client serialises datetimes with isoformat(), which drops a zero fraction; the API server
    rejects MicroTime without one (400), so a whole second is written one microsecond later."""
    record = LeaseRecord("a", "2026-11-23T10:00:00.000000Z", "2026-11-23T10:00:01.000000Z", 15, 0)
    lease = V1Lease(metadata=V1ObjectMeta(name="loadline"), spec=apply_record(None, record))
    wire = client.ApiClient().sanitize_for_serialization(lease)  # type: ignore[no-untyped-call]
    assert wire["spec"]["acquireTime"] == "2026-11-23T10:00:00.000001+00:00"
    assert wire["spec"]["renewTime"] == "2026-11-23T10:00:01.000001+00:00"
    assert wire["spec"]["holderIdentity"] == "a" and wire["spec"]["leaseTransitions"] == 0


def test_apply_record_keeps_fields_it_does_not_own() -> None:
    spec = V1LeaseSpec(holder_identity="old", preferred_holder="b", strategy="OldestEmulationVersion")
    out = apply_record(spec, LeaseRecord("", None, None, 1, 3))
    assert (out.holder_identity, out.preferred_holder, out.strategy) == ("", "b", "OldestEmulationVersion")
    assert out.renew_time is None and out.lease_duration_seconds == 1


# -- acquiring -------------------------------------------------------------------------------------------


def test_first_replica_creates_the_lease_and_the_second_stands_by(
    api: FakeLeases, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "loadline.election")
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.acquire(threading.Event()) and a.is_leader
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    b.retry_period_seconds = 0.01
    assert not b.acquire(stop) and not b.is_leader
    record = api.record()
    assert record is not None and record.holder_identity == "a" and record.lease_transitions == 0
    assert record.lease_duration_seconds == 15
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith(f"leader: acquired lease {NS}/loadline as a after") for line in lines)
    standby = [line for line in lines if line.startswith("standby:")]
    assert standby == [f"standby: lease {NS}/loadline held by a (expires in 15 s unless renewed)"]  # once


def test_a_conflict_means_the_race_was_lost_and_the_winner_is_reread(api: FakeLeases, clock: Clock) -> None:
    """Both replicas decide on the same read; the other one's write lands first: ours gets 409."""
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    api.before_write = lambda: b.try_acquire_or_renew()  # b creates between a's read and a's create
    decision = a.try_acquire_or_renew()
    assert decision is not None and decision.action is LeaseAction.WAIT and decision.holder == "b"
    record = api.record()
    assert record is not None and record.holder_identity == "b"
    assert len(api.writes) == 1  # exactly one write landed


def test_a_conflict_on_take_over_leaves_one_holder(api: FakeLeases, clock: Clock) -> None:
    a, b, c = elector(api, "a", clock), elector(api, "b", clock), elector(api, "c", clock)
    a.try_acquire_or_renew()
    clock.advance(20)  # a died: expired for both b and c
    api.before_write = lambda: c.try_acquire_or_renew()
    decision = b.try_acquire_or_renew()
    assert decision is not None and decision.action is LeaseAction.WAIT and decision.holder == "c"
    record = api.record()
    assert record is not None and record.holder_identity == "c" and record.lease_transitions == 1


def test_expired_lease_is_taken_over(api: FakeLeases, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "loadline.election")
    elector(api, "a", clock).try_acquire_or_renew()
    clock.advance(15)
    b = elector(api, "b", clock)
    assert b.acquire(threading.Event())
    record = api.record()
    assert record is not None and record.holder_identity == "b" and record.lease_transitions == 1
    assert "the lease of a had expired" in caplog.text


def test_a_record_that_never_changes_expires_by_our_own_clock(api: FakeLeases, clock: Clock) -> None:
    """A holder whose clock runs far ahead writes renewTimes in our future; if they stop changing for a
    lease duration of our monotonic clock, the lease is taken anyway."""
    elector(api, "a", clock).try_acquire_or_renew()
    api.set_holder("a", clock.now + timedelta(hours=1))
    ticks = [100.0]
    fake: CoordinationV1Api = api  # type: ignore[assignment]
    b = LeaderElector(
        fake, name="loadline", namespace=NS, identity="b", clock=clock, monotonic=lambda: ticks[0]
    )
    first = b.try_acquire_or_renew()
    assert first is not None and first.action is LeaseAction.WAIT and first.wait_seconds == pytest.approx(15)
    ticks[0] += 14.5  # our wall clock stands still too: only the record's staleness counts
    held = b.try_acquire_or_renew()
    assert held is not None and held.action is LeaseAction.WAIT and held.wait_seconds == pytest.approx(0.5)
    ticks[0] += 0.5
    taken = b.try_acquire_or_renew()
    assert taken is not None and taken.action is LeaseAction.TAKE_OVER


def test_acquire_returns_false_when_stopped(api: FakeLeases, clock: Clock) -> None:
    elector(api, "a", clock).try_acquire_or_renew()
    stop = threading.Event()
    stop.set()
    assert not elector(api, "b", clock).acquire(stop)


def test_api_errors_are_logged_once_per_kind_and_retried(
    api: FakeLeases, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "loadline.election")
    api.fail = ApiException(status=403, reason="Forbidden")
    b = elector(api, "b", clock, retry_period_seconds=0.01)
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    assert not b.acquire(stop)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"lease {NS}/loadline: cannot read: 403 Forbidden (retrying every 0.01 s)"]
    api.fail = ConnectionRefusedError(111, "Connection refused")
    assert b.try_acquire_or_renew() is None
    assert "cannot read: unreachable (ConnectionRefusedError)" in caplog.text
    api.fail = None
    assert b.acquire(threading.Event())


# -- renewing, losing, releasing --------------------------------------------------------------------------


def test_the_leader_renews_every_retry_period(api: FakeLeases, clock: Clock) -> None:
    a = elector(
        api, "a", clock, lease_duration_seconds=2, renew_deadline_seconds=1, retry_period_seconds=0.02
    )
    assert a.acquire(threading.Event())
    first = api.record()
    lost = Lost()
    a.start_renewing(lost)
    clock.advance(1)
    wait_until(lambda: len(api.writes) >= 4)
    a.stop_renewing()
    record = api.record()
    assert first is not None and record is not None and not lost.reasons
    assert record.holder_identity == "a" and record.acquire_time == first.acquire_time
    assert record.renew_time != first.renew_time and record.lease_transitions == 0


def test_a_renewal_is_one_write_until_someone_else_writes(api: FakeLeases, clock: Clock) -> None:
    """The leader renews the Lease as it last wrote it, without reading it (half the requests at
    rest); a write by anyone else (here a shard request's annotation) refuses that renewal, and the
    leader then reads, keeps what was written, and renews."""
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire()
    api.reads.clear()
    for _ in range(3):
        clock.advance(2)
        decision = a.try_acquire_or_renew(renew_only=True)
        assert decision is not None and decision.action is LeaseAction.RENEW
    assert api.reads == []
    record = api.record()
    assert record is not None and record.renew_time == format_micro_time(clock.now)
    assert b.annotate({"loadline.dev/shard-wanted-by": "b"})
    api.reads.clear()
    clock.advance(2)
    decision = a.try_acquire_or_renew(renew_only=True)
    assert decision is not None and decision.action is LeaseAction.RENEW
    assert api.reads == ["loadline"]  # refused (409), then read once
    assert a.annotations == {"loadline.dev/shard-wanted-by": "b"}
    lease = api.leases[f"{NS}/loadline"]
    assert lease.metadata.annotations == {"loadline.dev/shard-wanted-by": "b"}
    assert lease.spec.renew_time == clock.now


def test_losing_the_lease_to_another_holder_calls_on_lost(
    api: FakeLeases, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    a = elector(
        api, "a", clock, lease_duration_seconds=2, renew_deadline_seconds=1, retry_period_seconds=0.02
    )
    assert a.acquire(threading.Event())
    lost = Lost()
    a.start_renewing(lost)
    api.set_holder("b", clock.now)
    assert lost.event.wait(2)
    assert lost.reasons == ["held by b"] and not a.is_leader
    assert f"lost lease {NS}/loadline: held by b" in caplog.text
    record = api.record()
    assert record is not None and record.holder_identity == "b"  # the leader never takes it back


@pytest.mark.parametrize(
    "failure",
    [
        ApiException(status=500, reason="Internal Server Error"),
        urllib3.exceptions.ProtocolError("Connection aborted"),
        ValueError("a bug, not an API error: the renewer must survive it"),
    ],
)
def test_not_renewing_within_the_deadline_calls_on_lost(
    api: FakeLeases, clock: Clock, failure: Exception
) -> None:
    a = elector(
        api, "a", clock, lease_duration_seconds=2, renew_deadline_seconds=0.3, retry_period_seconds=0.05
    )
    assert a.acquire(threading.Event())
    acquired = time.monotonic()
    lost = Lost()
    api.fail = failure
    a.start_renewing(lost)
    assert lost.event.wait(2)
    elapsed = time.monotonic() - acquired
    assert lost.reasons == ["not renewed for 0.3 s (the renew deadline)"]
    # Not before the deadline; and before the 2 s lease could be taken by a standby, the contract that
    # keeps two leaders apart (a tighter bound would time the machine, not the elector).
    assert 0.3 <= elapsed < 2


def test_a_deleted_lease_is_lost_not_recreated_by_the_leader(api: FakeLeases, clock: Clock) -> None:
    a = elector(
        api, "a", clock, lease_duration_seconds=2, renew_deadline_seconds=1, retry_period_seconds=0.02
    )
    assert a.acquire(threading.Event())
    lost = Lost()
    a.start_renewing(lost)
    with api.lock:
        api.leases.clear()
    assert lost.event.wait(2) and lost.reasons == ["the Lease was deleted"]
    assert api.record() is None


def test_release_hands_over_at_once(api: FakeLeases, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "loadline.election")
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.acquire(threading.Event())
    a.start_renewing(lambda reason: None)
    clock.advance(1)
    assert a.release() and not a.is_leader
    released = api.record()
    assert released is not None and released.holder_identity == "" and released.lease_duration_seconds == 1
    assert released.renew_time == format_micro_time(clock.now)
    assert f"released lease {NS}/loadline" in caplog.text
    decision = b.try_acquire_or_renew()  # no waiting for expiry
    assert decision is not None and decision.action is LeaseAction.TAKE_OVER and decision.reason == "released"
    record = api.record()
    assert record is not None and record.holder_identity == "b" and record.lease_transitions == 1


def test_release_of_a_lease_someone_else_holds_writes_nothing(api: FakeLeases, clock: Clock) -> None:
    a = elector(api, "a", clock)
    assert a.acquire(threading.Event())
    api.set_holder("b", clock.now)
    writes = len(api.writes)
    assert not a.release()
    assert len(api.writes) == writes


def test_release_never_raises(api: FakeLeases, clock: Clock) -> None:
    a = elector(api, "a", clock)
    assert a.acquire(threading.Event())
    api.fail = ApiException(status=503, reason="Service Unavailable")
    assert not a.release()


def test_timings_must_leave_a_standby_margin(api: FakeLeases) -> None:
    with pytest.raises(ValueError, match="lease_duration_seconds > renew_deadline_seconds"):
        elector(api, "a", lease_duration_seconds=10, renew_deadline_seconds=10)
    with pytest.raises(ValueError, match="identity"):
        elector(api, "")


def test_the_leader_gauge_follows_the_lease(api: FakeLeases, clock: Clock) -> None:
    gauge = _election.LEADER.labels(name="loadline")
    a = elector(api, "a", clock)
    assert gauge._value.get() == 0
    assert a.acquire(threading.Event())
    assert gauge._value.get() == 1
    a.release()
    assert gauge._value.get() == 0


# -- the standby's /healthz --------------------------------------------------------------------------------


def test_standby_answers_healthz_and_frees_its_port() -> None:
    health = StandbyHealth(0, host="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{health.port}/healthz", timeout=2) as response:
            assert (response.status, response.read()) == (200, b"standby")
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{health.port}/metrics", timeout=2)
        assert missing.value.code == 404
    finally:
        health.close()
    with socket.socket() as sock:  # kopf binds the same port next
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", health.port))


# -- settings -----------------------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    for name in list(os.environ):
        if name.startswith("LOADLINE_") or name in ("POD_NAME", "POD_NAMESPACE"):
            monkeypatch.delenv(name)
    sa_file = tmp_path / "namespace"
    monkeypatch.setattr(loadline.settings, "SERVICE_ACCOUNT_NAMESPACE_FILE", sa_file)
    yield sa_file


def test_settings_defaults_and_env(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = OperatorSettings()
    assert not settings.leader_election
    assert (settings.lease_name, settings.lease_namespace, settings.identity) == ("loadline", "", "")
    timings = (
        settings.lease_duration_seconds,
        settings.renew_deadline_seconds,
        settings.retry_period_seconds,
    )
    assert timings == (15, 10, 2)
    for gone in ("peering_name", "priority", "standalone"):
        assert gone not in OperatorSettings.model_fields
    monkeypatch.setenv("LOADLINE_LEADER_ELECTION", "true")
    monkeypatch.setenv("LOADLINE_LEASE_NAME", "other")
    monkeypatch.setenv("LOADLINE_LEASE_DURATION_SECONDS", "30")
    settings = OperatorSettings()
    assert (
        settings.leader_election and settings.lease_name == "other" and settings.lease_duration_seconds == 30
    )


def test_settings_refuse_timings_without_a_margin_only_with_election(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOADLINE_RENEW_DEADLINE_SECONDS", "20")
    OperatorSettings()  # election off: irrelevant
    monkeypatch.setenv("LOADLINE_LEADER_ELECTION", "true")
    with pytest.raises(ValueError, match="LOADLINE_LEASE_DURATION_SECONDS > LOADLINE_RENEW_DEADLINE_SECONDS"):
        OperatorSettings()


def test_lease_namespace_falls_back_to_pod_namespace_then_the_service_account(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SpecError, match="LOADLINE_LEASE_NAMESPACE"):
        OperatorSettings().resolved_lease_namespace()
    clean_env.write_text("from-token\n")
    assert OperatorSettings().resolved_lease_namespace() == "from-token"
    monkeypatch.setenv("POD_NAMESPACE", "from-pod")
    assert OperatorSettings().resolved_lease_namespace() == "from-pod"
    monkeypatch.setenv("LOADLINE_LEASE_NAMESPACE", "explicit")
    assert OperatorSettings().resolved_lease_namespace() == "explicit"


def test_identity_falls_back_to_pod_name_then_hostname_with_a_suffix(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generated = OperatorSettings().resolved_identity()
    assert generated.startswith(f"{socket.gethostname()}_") and len(generated) > len(socket.gethostname()) + 1
    assert OperatorSettings().resolved_identity() == generated  # stable within the process
    monkeypatch.setenv("POD_NAME", "loadline-7c9f-abcde")
    from_pod = OperatorSettings().resolved_identity()
    assert from_pod.startswith("loadline-7c9f-abcde_")  # kubectl shows the pod
    assert from_pod != "loadline-7c9f-abcde_" and from_pod.endswith(generated.rsplit("_", 1)[1])
    monkeypatch.setenv("LOADLINE_IDENTITY", "explicit")
    assert OperatorSettings().resolved_identity() == "explicit"


# -- loadline run with leader election ------------------------------------------------------------------------


@pytest.fixture
def elected_run(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, api: FakeLeases
) -> Iterator[Callable[[Callable[..., None]], int]]:
    """``loadline run`` with election on, the fake API, and ``fake_kopf`` in place of kopf.run."""
    import kopf

    import loadline.handlers

    # A stand-in for the handler registrations: this is about the election around kopf, not the handlers.
    registry = types.ModuleType("loadline.handlers._registry")
    registry.SETTINGS = OperatorSettings()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "loadline.handlers._registry", registry)
    monkeypatch.setattr(loadline.handlers, "_registry", registry, raising=False)
    monkeypatch.setenv("LOADLINE_LEADER_ELECTION", "true")
    monkeypatch.setenv("LOADLINE_LEASE_NAMESPACE", NS)
    monkeypatch.setenv("LOADLINE_IDENTITY", "me")
    monkeypatch.setenv("LOADLINE_LIVENESS_PORT", "0")
    monkeypatch.setenv("LOADLINE_METRICS_PORT", "0")
    monkeypatch.setenv("LOADLINE_LEASE_DURATION_SECONDS", "3")
    monkeypatch.setenv("LOADLINE_RENEW_DEADLINE_SECONDS", "2")
    monkeypatch.setenv("LOADLINE_RETRY_PERIOD_SECONDS", "1")
    monkeypatch.setattr(kopf, "configure", lambda **_: None)
    monkeypatch.setattr(_election, "coordination_api", lambda: api)

    def run(fake_kopf: Callable[..., None]) -> int:
        monkeypatch.setattr(kopf, "run", fake_kopf)
        args = argparse.Namespace(namespace=None, standalone=False, verbose=False, debug=False)
        return _cli_run._cmd_run(args)

    yield run


def test_run_releases_the_lease_after_kopf_stops_on_sigterm(elected_run: Any, api: FakeLeases) -> None:
    seen: dict[str, Any] = {}

    def fake_kopf(**kwargs: Any) -> None:
        seen.update(kwargs)
        record = api.record()
        seen["holder"] = record.holder_identity if record else None
        os.kill(os.getpid(), signal.SIGTERM)  # the kubelet stopping the pod
        assert kwargs["stop_flag"].wait(5)

    assert elected_run(fake_kopf) == 0
    assert seen["holder"] == "me" and seen["standalone"] is True and "peering_name" not in seen
    assert seen["clusterwide"] is True and seen["loop"].is_closed()
    record = api.record()
    assert record is not None and record.holder_identity == ""  # released for the standby


def test_sigterm_to_kopfs_own_loop_handler_raises_the_stop_flag_at_once(
    elected_run: Any, api: FakeLeases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf stops on SIGTERM through a handler on its loop; the flag must rise with it, else kopf 1.45
    waits 5 s for its waiter on the flag and the standby gets the Lease that much later."""
    raised: list[bool] = []

    def fake_kopf(*, loop: asyncio.AbstractEventLoop, stop_flag: threading.Event, **_: Any) -> None:
        async def operator() -> None:  # what kopf.operator does with signals
            received: asyncio.Future[int] = loop.create_future()
            loop.add_signal_handler(signal.SIGTERM, received.set_result, signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            await received
            raised.append(stop_flag.is_set())

        loop.run_until_complete(operator())

    during_release: list[object] = []
    release = LeaderElector.release

    def watched_release(self: LeaderElector) -> bool:
        during_release.append(signal.getsignal(signal.SIGTERM))
        return release(self)

    monkeypatch.setattr(LeaderElector, "release", watched_release)
    assert elected_run(fake_kopf) == 0
    assert raised == [True]
    record = api.record()
    assert record is not None and record.holder_identity == ""
    # Closing kopf's loop reset SIGTERM to the default action; a second SIGTERM must not cut the release.
    assert len(during_release) == 1 and during_release[0] not in (signal.SIG_DFL, signal.SIG_IGN, None)


def test_run_exits_non_zero_when_the_lease_is_lost(elected_run: Any, api: FakeLeases) -> None:
    def fake_kopf(**kwargs: Any) -> None:
        api.set_holder("other", datetime.now(UTC))  # someone else took it
        assert kwargs["stop_flag"].wait(5)

    assert elected_run(fake_kopf) == _cli_run.EXIT_LOST
    record = api.record()
    assert record is not None and record.holder_identity == "other"  # not released: it is not ours


def test_run_stands_by_and_stops_on_sigterm_without_starting_kopf(elected_run: Any, api: FakeLeases) -> None:
    api.create_namespaced_lease(
        NS,
        V1Lease(
            metadata=V1ObjectMeta(name="loadline"),
            spec=V1LeaseSpec(
                holder_identity="other", renew_time=datetime.now(UTC), lease_duration_seconds=60
            ),
        ),
    )
    threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
    started: list[bool] = []
    assert elected_run(lambda **_: started.append(True)) == 0
    assert not started
    record = api.record()
    assert record is not None and record.holder_identity == "other"


def test_standalone_flag_is_still_accepted() -> None:
    from loadline.cli import build_parser

    args = build_parser().parse_args(["run", "--standalone"])
    assert args.func is _cli_run._cmd_run
