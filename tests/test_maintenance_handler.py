"""The operator's restart glue (handlers/_maintenance.py and the OOM handler's hand-over to it): which
fixes wait for the window, what status says meanwhile, and the steps a running restart takes."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest

from loadline.api import Maintenance, OOMRisk, Overrides, RemediationState, parse_fleet_policy
from loadline.handlers import _inputs, _kube, _maintenance, _reconcile
from loadline.handlers._state import OperatorState
from loadline.hub import ConfigCache
from loadline.maintenance import (
    MaintenanceRecord,
    crash_urgency,
    pending_record,
    pending_remediation,
    record_from_status,
)
from loadline.risk import estimate_from_status
from loadline.settings import OperatorSettings
from loadline.state import CLAIM_SECONDS
from loadline.status import build as _build
from loadline.traffic import model_load_query
from tests.conftest import inference_model, stored_plan

NOW = datetime(2026, 11, 23, 14, 0, tzinfo=UTC)
LOG = logging.getLogger("test")


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def pod(name: str, created: datetime, *, ready: bool = True, waiting: str = "") -> dict[str, Any]:
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {
        "metadata": {"name": name, "creationTimestamp": iso(created), "labels": {}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "vllm", "state": state}],
        },
    }


# --- which fixes wait ---


def test_fixes_of_crashes_that_recur_at_every_start_roll_now_and_intermittent_ones_wait() -> None:
    for oom_class in ("model_exceeds_vram", "batch_misconfiguration", "host_memory"):
        reason = crash_urgency(oom_class, 1)
        assert reason is not None and "spares no one" in reason
    assert crash_urgency("kv_cache_overflow", 1) is None
    assert crash_urgency("fragmentation", 1) is None
    # ...unless the crash came back before the window
    assert "recurred (2 crashes)" in (crash_urgency("kv_cache_overflow", 2) or "")
    # a class loadline does not know is not waited on
    assert crash_urgency("something_new", 1) is not None


def test_a_held_back_fix_keeps_the_pods_on_the_overrides_they_run() -> None:
    before = RemediationState(overrides=Overrides(max_num_seqs=128))
    decided = RemediationState(overrides=Overrides(max_num_seqs=64))
    state, action = pending_remediation(before, decided, urgent=None)
    assert action == "remediation" and state.held_overrides == Overrides(max_num_seqs=128)
    assert state.overrides == Overrides(max_num_seqs=64)
    # a second fix before the window: the pods still run the first overrides
    again, _ = pending_remediation(state, RemediationState(overrides=Overrides(max_num_seqs=32)), None)
    assert again.held_overrides == Overrides(max_num_seqs=128)
    # an urgent fix rolls at once: nothing held
    newer = RemediationState(overrides=Overrides(max_num_seqs=32), held_overrides=state.held_overrides)
    urgent, action = pending_remediation(state, newer, urgent="recurs at every start")
    assert urgent.held_overrides is None and action == "remediation"


def test_a_restart_request_without_new_overrides_is_a_plain_restart() -> None:
    before = RemediationState()
    decided = RemediationState(restart_requested_at=iso(NOW))
    assert pending_remediation(before, decided, None) == (decided, "restart")
    assert pending_remediation(decided, decided, None) == (decided, None)


def test_status_right_after_the_crash_says_scheduled_or_running() -> None:
    waiting = pending_record(None, "restart", None, NOW)
    assert (waiting.state, waiting.action, waiting.scheduled_at) == ("Scheduled", "restart", None)
    assert waiting.pending  # the timer takes it from here
    running = pending_record(None, "remediation", "recurs at every start", NOW)
    assert (running.state, running.trigger, running.started_at) == ("Running", "crashLoop", NOW)
    # a remediation covers a restart already waiting (it rolls every pod anyway)
    assert pending_record(waiting, "remediation", None, NOW).action == "remediation"
    # a running restart is never restarted by a second crash's decision
    assert pending_record(running, "restart", None, NOW).started_at == NOW


def test_the_status_patch_clears_what_the_new_record_no_longer_has() -> None:
    previous = {"state": "Scheduled", "scheduledAt": iso(NOW), "nextWindowStart": iso(NOW), "reason": "x"}
    done = MaintenanceRecord(action="restart", state="Done", last_restart_at=NOW, reason="done")
    patch = _build.maintenance_patch(Maintenance.model_validate(previous), done)
    assert patch["scheduledAt"] is None and patch["nextWindowStart"] is None
    assert patch["state"] == "Done" and patch["lastRestartAt"].startswith("2026-11-23T14:00:00")
    assert record_from_status({k: v for k, v in patch.items() if v is not None}) == done


# --- reading the cluster ---


def test_a_rollout_is_complete_only_when_every_replica_runs_the_latest_template() -> None:
    def workload(
        generation: int, observed: int, replicas: int, updated: int, available: int
    ) -> dict[str, Any]:
        return {
            "metadata": {"generation": generation},
            "spec": {"replicas": 2},
            "status": {"observedGeneration": observed, "replicas": replicas, "updatedReplicas": updated,
                       "availableReplicas": available},
        }  # fmt: skip

    assert _build.rollout_complete(workload(3, 3, 2, 2, 2))
    assert not _build.rollout_complete(workload(3, 2, 2, 2, 2))  # the controller has not seen it yet
    assert not _build.rollout_complete(workload(3, 3, 3, 2, 2))  # an old pod still runs
    assert not _build.rollout_complete(workload(3, 3, 2, 1, 2))
    assert not _build.rollout_complete(None)


def test_a_pod_in_crash_loop_back_off_means_the_model_is_not_serving_from_it() -> None:
    assert _build.crash_looping([pod("a", NOW), pod("b", NOW, waiting="CrashLoopBackOff")])
    assert not _build.crash_looping([pod("a", NOW), pod("b", NOW, waiting="ContainerCreating")])


def test_the_load_history_query_matches_every_pod_the_model_had_and_no_other_model() -> None:
    query = model_load_query("team-a", "chat")
    pattern = re.search(r'pod=~"(.*)"', query)
    assert pattern is not None and 'namespace="team-a"' in query
    regex = re.compile(pattern.group(1))
    for name in ("chat-7d9f8c6b5-abcde", "chat-59b7d-x2k9q", "chat-0", "chat-12"):
        assert regex.fullmatch(name), name
    for name in ("chat-big-7d9f8c6b5-abcde", "chatty-7d9f8c6b5-abcde", "chat-0-1"):
        assert not regex.fullmatch(name), name


def test_the_history_step_keeps_under_prometheus_points_limit() -> None:
    for days in (1, 6, 7, 28, 90):
        step = _maintenance._history_step(days)
        assert step % 60 == 0 and days * 86400 / step <= _maintenance.MAX_POINTS
    assert _maintenance._history_step(6) == 60  # six days still at minute resolution


def test_a_predicted_crash_in_status_is_read_back_for_the_planner() -> None:
    at = NOW + timedelta(hours=1)
    risk = estimate_from_status(
        OOMRisk.model_validate({"predictedAt": iso(at), "evidence": ["GPU memory: x"]})
    )
    assert risk is not None and risk.predicted_at == at
    assert estimate_from_status(OOMRisk(evidence=[])) is None
    assert estimate_from_status(None) is None


def test_reconcile_renders_the_held_overrides_until_the_window() -> None:
    body = inference_model(engine={"maxNumSeqs": 128})
    body["metadata"] |= {"namespace": "team-a", "generation": 1}
    body["status"] = {
        "remediation": {"overrides": {"maxNumSeqs": 32}, "heldOverrides": {}, "observedGeneration": 1}
    }
    held = _inputs.model_inputs(body, OperatorSettings(), ConfigCache())
    assert held.obj.spec.engine.max_num_seqs == 128
    body["status"]["remediation"].pop("heldOverrides")
    assert _inputs.model_inputs(body, OperatorSettings(), ConfigCache()).obj.spec.engine.max_num_seqs == 32


# --- the timer ---


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A stand-in for the API calls the timer makes: the model's pods, evictions, scale patches."""
    world: dict[str, Any] = {"pods": [], "evicted": [], "scaled": [], "events": []}
    monkeypatch.setattr(_kube, "list_objects", lambda *a, **k: world["pods"])
    monkeypatch.setattr(_kube, "evict", lambda ns, name: world["evicted"].append(name) or True)
    monkeypatch.setattr(
        _kube, "patch_spec", lambda api, kind, ns, name, spec: world["scaled"].append(spec["replicas"])
    )
    monkeypatch.setattr(kopf, "event", lambda _o, *, type, reason, message: world["events"].append(reason))
    return world


def model(
    maintenance: dict[str, Any], replicas: int = 2, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    body = inference_model(replicas=replicas)
    body["metadata"] |= {"namespace": "team-a", "generation": 1, "uid": "u", "labels": labels or {}}
    body["status"] = {
        "phase": "Ready",
        # No node shape: the surge's room is the GPUs alone.
        "plan": {**stored_plan(gpuType="L4", gpusPerReplica=1, nodesPerReplica=1), "nodeShape": None},
        "maintenance": maintenance,
    }
    return body


def tend(
    body: dict[str, Any],
    fleet: _maintenance.FleetView | None = None,
    state: OperatorState | None = None,
    **settings: Any,
) -> kopf.Patch:
    """One tick of the timer (``state``: the operator's memory, a fresh one unless given)."""
    patch = kopf.Patch()
    memo: dict[str, Any] = {}
    fleet = fleet or _maintenance.FleetView({}, [], [], [], state=state or OperatorState())
    _maintenance.tend(body, patch, memo, OperatorSettings(**settings), fleet, LOG)  # type: ignore[arg-type]
    return patch


def test_without_history_a_pending_restart_is_scheduled_in_the_default_window(
    cluster: dict[str, Any],
) -> None:
    cluster["pods"] = [pod("chat-a", NOW - timedelta(days=3))]
    patch = tend(model({"action": "restart", "state": "Scheduled", "reason": "being chosen"}))
    written = patch.status["maintenance"]
    assert written["state"] == "Scheduled" and written["trigger"] == "window"
    scheduled = datetime.fromisoformat(written["scheduledAt"].replace("Z", "+00:00"))
    assert scheduled > datetime.now(UTC) and scheduled.hour == 2 and scheduled.minute == 0  # 02:00 UTC
    assert cluster["evicted"] == [] and cluster["events"] == ["RestartScheduled"]


def test_a_crash_looping_model_restarts_at_once_oldest_pod_first(cluster: dict[str, Any]) -> None:
    old, older = NOW - timedelta(days=1), NOW - timedelta(days=2)
    cluster["pods"] = [pod("chat-a", old, waiting="CrashLoopBackOff", ready=False), pod("chat-b", older)]
    patch = tend(model({"action": "restart", "state": "Scheduled", "reason": "being chosen"}))
    assert patch.status["maintenance"]["state"] == "Running"
    assert patch.status["maintenance"]["trigger"] == "crashLoop"
    # one at a time: chat-a is not Ready, so chat-b may not go yet
    assert cluster["evicted"] == [] and cluster["events"] == ["RestartStarted"]


def test_a_running_restart_evicts_one_pod_per_step_and_ends_done(cluster: dict[str, Any]) -> None:
    start = datetime.now(UTC) - timedelta(minutes=1)
    running = {"action": "restart", "state": "Running", "startedAt": iso(start), "trigger": "window"}
    cluster["pods"] = [pod("chat-b", start - timedelta(days=2)), pod("chat-a", start - timedelta(days=1))]
    tend(model(running))
    assert cluster["evicted"] == ["chat-b"] and cluster["events"] == ["Restarting"]
    cluster["pods"] = [pod("chat-a", start - timedelta(days=1)), pod("chat-c", start + timedelta(seconds=5))]
    tend(model(running))
    assert cluster["evicted"] == ["chat-b", "chat-a"]
    cluster["pods"] = [
        pod("chat-c", start + timedelta(seconds=5)),
        pod("chat-d", start + timedelta(seconds=9)),
    ]
    patch = tend(model(running))
    assert patch.status["maintenance"]["state"] == "Done" and patch.status["maintenance"]["lastRestartAt"]
    assert cluster["events"][-1] == "RestartDone"


def test_a_single_replica_surges_a_second_pod_when_a_gpu_is_free(cluster: dict[str, Any]) -> None:
    start = datetime.now(UTC) - timedelta(minutes=1)
    running = {"action": "restart", "state": "Running", "startedAt": iso(start), "trigger": "window"}
    cluster["pods"] = [pod("chat-a", start - timedelta(days=1))]
    node = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
            "status": {"allocatable": {"nvidia.com/gpu": "1"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    free = _maintenance.FleetView({}, [node], [], [], state=OperatorState())
    tend(model(running, replicas=1), free)
    assert cluster["scaled"] == [2] and cluster["evicted"] == []
    # no free GPU: the pod restarts in place, and the Event says the model serves nothing meanwhile
    cluster["scaled"].clear()
    tend(model(running, replicas=1))
    assert cluster["scaled"] == [] and cluster["evicted"] == ["chat-a"]


def test_a_running_remediation_roll_out_reads_its_workload_and_not_its_pods(
    cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workload controller rolls a remediation's pods: each tick asks only whether it is done (a
    LIST of the pods per tick was one request per crashed model in a burst)."""
    listed: list[Any] = []
    monkeypatch.setattr(_kube, "list_objects", lambda *a, **k: listed.append(a) or cluster["pods"])
    rolled = {"metadata": {"generation": 2}, "spec": {"replicas": 2},
              "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}}  # fmt: skip
    monkeypatch.setattr(_kube, "get", lambda *a: rolled)
    start = datetime.now(UTC) - timedelta(minutes=1)
    running = {"action": "remediation", "state": "Running", "startedAt": iso(start), "trigger": "crashLoop"}
    patch = tend(model(running))
    assert patch.status["maintenance"]["state"] == "Done" and cluster["events"] == ["RestartDone"]
    assert listed == []
    # a plain restart is carried out pod by pod: it reads them
    tend(model({**running, "action": "restart"}))
    assert listed == [("v1", "Pod", "team-a")]


def test_a_remediation_roll_out_still_rolling_in_the_deployments_events_costs_no_read(
    state: OperatorState, cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each tick of a roll-out asked the API server for the Deployment (1.5 GETs per crash in a burst of
    1,000); its watch events already say it is still rolling. Done is confirmed by a GET, as the last
    event may predate the remediation's template."""

    def deployment(generation: int, observed: int, updated: int) -> dict[str, Any]:
        return {"metadata": {"name": "chat", "namespace": "team-a", "generation": generation},
                "spec": {"replicas": 2},
                "status": {"observedGeneration": observed, "replicas": 2, "updatedReplicas": updated,
                           "availableReplicas": 2}}  # fmt: skip

    reads: list[Any] = []
    stored = [deployment(2, 2, 1)]
    monkeypatch.setattr(_kube, "get", lambda *a: reads.append(a) or stored[0])
    start = datetime.now(UTC) - timedelta(minutes=1)
    running = {"action": "remediation", "state": "Running", "startedAt": iso(start), "trigger": "crashLoop"}
    try:
        state.workloads.note(deployment(2, 2, 1))  # the watch: one of two pods updated
        assert "maintenance" not in tend(model(running), state=state).status and reads == []
        # The timer's tick stops before gathering the fleet's view for tend: nothing to do.
        assert _maintenance.remediation_rolling(state, model(running))
        state.workloads.note(deployment(1, 1, 2))  # an event from before the new template
        assert not _maintenance.remediation_rolling(state, model(running))  # it may be done: tend asks
        assert (
            "maintenance" not in tend(model(running), state=state).status and len(reads) == 1
        )  # the GET says no
        stored[0] = deployment(2, 2, 2)
        state.workloads.note(stored[0])
        assert not _maintenance.remediation_rolling(state, model(running))
        assert tend(model(running), state=state).status["maintenance"]["state"] == "Done" and len(reads) == 2
        # Other records are tend's whatever the workload shows: a restart steps pod by pod, and a
        # remediation whose overrides are held back waits for the operator to render them.
        state.workloads.note(deployment(2, 2, 1))
        assert not _maintenance.remediation_rolling(state, model({**running, "action": "restart"}))
        held = model(running)
        held["status"]["remediation"] = {"heldOverrides": {"gpuMemoryUtilization": 0.85}}
        assert not _maintenance.remediation_rolling(state, held)
    finally:
        state.workloads.note(deployment(2, 2, 2), deleted=True)


def test_max_concurrent_makes_a_due_restart_wait_for_the_slot(
    state: OperatorState, cluster: dict[str, Any]
) -> None:
    policy = parse_fleet_policy({
        "apiVersion": "loadline.dev/v1alpha1", "kind": "FleetPolicy", "metadata": {"name": "one-at-a-time"},
        "spec": {"selector": {"namespaces": ["team-a"]}, "restarts": {"maxConcurrent": 1}},
    })  # fmt: skip
    now = datetime.now(UTC)
    cluster["pods"] = [pod("chat-a", now - timedelta(days=1))]
    other = {"team-a/other": {"namespace": "team-a", "labels": {}}}
    due = {"action": "restart", "state": "Scheduled", "trigger": "window", "scheduledAt": iso(now),
           "nextWindowStart": iso(now), "nextWindowEnd": iso(now + timedelta(hours=2))}  # fmt: skip
    patch = tend(model(due), _maintenance.FleetView(other, [], [], [policy], state=state))
    assert patch.status["maintenance"]["state"] == "WaitingForLock"
    assert "team-a/other" in patch.status["maintenance"]["reason"]
    assert cluster["events"] == ["RestartWaiting"]
    # once the other restart is over, the slot is this model's
    waiting = {**due, "state": "WaitingForLock"}
    patch = tend(model(waiting), _maintenance.FleetView({}, [], [], [policy], state=state))
    assert patch.status["maintenance"]["state"] == "Running"
    assert state.claims.claimed() == {"team-a/chat"}


def test_a_claim_of_a_model_deleted_mid_restart_expires(
    state: OperatorState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot taken by this process stands in for the index only until the index catches up: a model
    deleted before its restart finished must not hold the policy's slot for the rest of the process."""
    state.claims.claim("team-a/gone", 1000.0)
    assert state.claims.live(1000.0 + CLAIM_SECONDS - 1) == ["team-a/gone"]
    assert state.claims.live(1000.0 + CLAIM_SECONDS + 1) == []


def test_releasing_held_overrides_moves_the_remediation_revision(
    cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window came: the held overrides are rendered and released. The write moves the stanza's
    revision, which a crash's decision made meanwhile on the held overrides tests
    (_build.build_decision_patch), so that decision is refused and made again instead of holding them
    again."""
    rendered: list[Any] = []
    monkeypatch.setattr(
        _reconcile, "reconcile", lambda _state, body, *a, **k: rendered.append(body["status"])
    )
    start = datetime.now(UTC) - timedelta(seconds=5)
    running = {"action": "remediation", "state": "Running", "startedAt": iso(start), "trigger": "window"}
    body = model(running)
    body["status"]["remediation"] = {"overrides": {"maxNumSeqs": 32}, "heldOverrides": {}, "revision": 4}
    patch = tend(body)
    assert rendered and rendered[0]["remediation"].get("heldOverrides") is None
    assert patch.status["remediation"] == {"heldOverrides": None, "revision": 5}
