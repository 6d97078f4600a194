"""FleetPolicy ``maxConcurrent`` restart slots between shards: the claims table (pure) and the
maintenance timer claiming through it (handlers/_restart_slots.py, against the in-memory Lease API of
test_leader_elector, which answers 409 to a write at a stale resourceVersion as the API server does).

Each "replica" below is the same process with a fresh operator state at each tick (no claims of its
own), and a view of the other shard's models that does not show the other's
restart yet, as a sharded replica's LIST reused for seconds does not."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest

from loadline.api import FleetPolicy, parse_fleet_policy
from loadline.handlers import _kube, _maintenance, _restart_slots, _state
from loadline.handlers._state import OperatorState
from loadline.maintenance import (
    SLOT_CLAIM_GRACE,
    SlotClaim,
    claim_holders,
    format_slot_claims,
    parse_slot_claims,
    standing_claims,
)
from loadline.settings import OperatorSettings
from tests.conftest import inference_model
from tests.test_leader_elector import NS, FakeLeases
from tests.test_maintenance_handler import pod

LOG = logging.getLogger("test")
T0 = datetime(2026, 11, 23, 14, 0, tzinfo=UTC)

# --- the table (pure) ---


def test_the_table_reads_back_what_was_written_and_drops_what_it_cannot_read() -> None:
    claims = {"team-a/chat": SlotClaim(("one-at-a-time",), T0), "team-b/code": SlotClaim(("a", "b"), T0)}
    assert parse_slot_claims(format_slot_claims(claims)) == claims
    assert parse_slot_claims(None) == {} and parse_slot_claims("not json") == {}
    assert (
        parse_slot_claims('{"x/y": {"policies": ["p"]}, "x/z": 3, "x/w": {"policies": "p", "at": ""}}') == {}
    )


def test_a_claim_holds_its_slots_for_the_grace_and_then_only_while_its_model_restarts() -> None:
    claims = {"team-a/chat": SlotClaim(("p",), T0)}
    soon, later = T0 + SLOT_CLAIM_GRACE - timedelta(seconds=1), T0 + SLOT_CLAIM_GRACE
    assert standing_claims(claims, [], soon) == claims
    assert standing_claims(claims, [], later) == {}
    assert standing_claims(claims, ["team-a/chat"], later + timedelta(hours=1)) == claims
    assert claim_holders({**claims, "team-b/code": SlotClaim(("p", "q"), T0)}) == {
        "p": frozenset({"team-a/chat", "team-b/code"}),
        "q": frozenset({"team-b/code"}),
    }


# --- the timer, sharded ---

POLICY: FleetPolicy = parse_fleet_policy({
    "apiVersion": "loadline.dev/v1alpha1", "kind": "FleetPolicy", "metadata": {"name": "one-at-a-time"},
    "spec": {"selector": {"namespaces": ["team-a"]}, "restarts": {"maxConcurrent": 1}},
})  # fmt: skip
SETTINGS = OperatorSettings(lease_namespace=NS, lease_name="loadline")
TABLE = f"{NS}/loadline-restart-slots"


@pytest.fixture
def leases(monkeypatch: pytest.MonkeyPatch) -> FakeLeases:
    api = FakeLeases()
    monkeypatch.setattr(_state, "coordination_api", lambda: api)  # the Lease client each state makes
    # Two pods from yesterday: a started restart evicts one, and is not done at once.
    old = datetime.now(UTC) - timedelta(days=1)
    monkeypatch.setattr(_kube, "list_objects", lambda *a, **k: [pod("p-1", old), pod("p-2", old)])
    monkeypatch.setattr(_kube, "evict", lambda ns, name: True)
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    return api


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def due(name: str, now: datetime) -> dict[str, Any]:
    body = inference_model(replicas=2)
    body["metadata"] |= {"name": name, "namespace": "team-a", "generation": 1, "uid": name, "labels": {}}
    body["status"] = {
        "phase": "Ready",
        "plan": {"gpuType": "L4", "gpusPerReplica": 1, "nodesPerReplica": 1},
        "maintenance": {
            "action": "restart",
            "state": "Scheduled",
            "trigger": "window",
            "scheduledAt": iso(now),
            "nextWindowStart": iso(now),
            "nextWindowEnd": iso(now + timedelta(hours=2)),
        },
    }
    return body


def tend(body: dict[str, Any], restarting: dict[str, Any] | None = None, shared: bool = True) -> str:
    """One tick of a replica that has started nothing itself (a fresh state); the state it writes ("" for
    none)."""
    patch = kopf.Patch()
    fleet = _maintenance.FleetView(
        restarting or {}, [], [], [POLICY], shared_slots=shared, state=OperatorState()
    )
    _maintenance.tend(body, patch, {}, SETTINGS, fleet, LOG)  # type: ignore[arg-type]
    return str((patch.status.get("maintenance") or {}).get("state") or "")


def test_two_shards_due_together_start_one_restart_and_the_other_waits(leases: FakeLeases) -> None:
    now = datetime.now(UTC)
    assert tend(due("chat", now)) == "Running"
    # The other shard's view does not show chat Running yet; the claim in the table does.
    assert tend(due("code", now)) == "WaitingForLock"
    assert set(
        parse_slot_claims(leases.leases[TABLE].metadata.annotations[_restart_slots.SLOTS_ANNOTATION])
    ) == {"team-a/chat"}


def test_of_two_shards_deciding_at_the_same_instant_one_write_lands(leases: FakeLeases) -> None:
    """code's replica reads the empty table and decides to start; chat's claim lands before its write:
    the write is refused (409), and deciding again on the table as it now is, code waits."""
    now = datetime.now(UTC)
    chat_state: list[str] = []
    leases.before_write = lambda: chat_state.append(tend(due("chat", now)))
    assert tend(due("code", now)) == "WaitingForLock"
    assert chat_state == ["Running"]


def test_a_finished_restart_gives_its_slot_back_at_once(
    leases: FakeLeases, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    assert tend(due("chat", now)) == "Running"
    running = due("chat", now)
    running["status"]["maintenance"] |= {"state": "Running", "startedAt": iso(now - timedelta(minutes=1))}
    monkeypatch.setattr(_maintenance, "_rollout_complete", lambda *a: True)
    running["status"]["maintenance"]["action"] = "remediation"
    assert tend(running, {"team-a/chat": {"namespace": "team-a", "labels": {}}}) == "Done"
    assert tend(due("code", now)) == "Running"


def test_an_abandoned_claim_frees_its_slot_after_the_grace(leases: FakeLeases) -> None:
    """A replica that claimed and died before writing Running: its claim stops counting by itself."""
    stale = datetime.now(UTC) - SLOT_CLAIM_GRACE - timedelta(seconds=1)
    leases.leases[TABLE] = _restart_slots.V1Lease(
        metadata=_restart_slots.V1ObjectMeta(
            name="loadline-restart-slots", namespace=NS, resource_version="1",
            annotations={_restart_slots.SLOTS_ANNOTATION: format_slot_claims({"team-a/gone": SlotClaim(("one-at-a-time",), stale)})},
        )
    )  # fmt: skip
    assert tend(due("code", datetime.now(UTC))) == "Running"
    assert set(
        parse_slot_claims(leases.leases[TABLE].metadata.annotations[_restart_slots.SLOTS_ANNOTATION])
    ) == {"team-a/code"}


def test_one_deciding_process_needs_no_table(leases: FakeLeases) -> None:
    now = datetime.now(UTC)
    assert tend(due("chat", now), shared=False) == "Running"
    assert leases.writes == [] and leases.leases == {}


def test_a_restart_not_due_yet_reads_no_table(leases: FakeLeases) -> None:
    """A model waiting for its window costs no read of the table at each tick (a fleet's worth of
    them would poll it)."""
    reads: list[str] = []
    read = leases.read_namespaced_lease
    leases.read_namespaced_lease = lambda name, namespace, **k: reads.append(name) or read(name, namespace)  # type: ignore[method-assign]
    later = datetime.now(UTC) + timedelta(hours=1)
    assert tend(due("chat", later)) in {"Scheduled", ""}
    assert reads == []
    assert tend(due("chat", datetime.now(UTC))) == "Running" and reads == ["loadline-restart-slots"]
