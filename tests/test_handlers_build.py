"""Pure status and ownership builders the operator writes with (no kopf, no cluster)."""

from __future__ import annotations

import itertools
from typing import Any

import pydantic
import pytest

from loadline import telemetry
from loadline.api import Condition, Incident, PlanSummary, RemediationState, parse_inference_model
from loadline.sizing import plan_inference_model
from loadline.status import build as _build
from loadline.status.build import (
    build_deployed_status,
    build_failed_status,
    build_owner_reference,
    build_readiness_status,
    merge_conditions,
    readiness_from_workload,
    status_changes,
    with_owner,
)
from tests.conftest import inference_model, stored_plan, typed_status

BODY = {
    "apiVersion": "loadline.dev/v1alpha1",
    "kind": "InferenceModel",
    "metadata": {"name": "chat", "namespace": "team-a", "uid": "1234", "generation": 3},
}
# status.plan as a real plan gives it (the builders validate it against the PlanSummary model).
SUMMARY = plan_inference_model(parse_inference_model(inference_model()).spec).summary()
# status.plan as the API server stores it
PLAN = SUMMARY.model_dump(by_alias=True, mode="json", exclude_none=True)
T0, T1, T2, T3 = (f"2026-11-2{d}T0{d}:00:00Z" for d in range(4))


def typed(conditions: list[dict[str, Any]]) -> list[Condition]:
    """Conditions as a typed status holds them."""
    return [Condition.model_validate(c) for c in conditions]


def incidents(wire: list[dict[str, Any]]) -> list[Incident]:
    return [Incident.model_validate(i) for i in wire]


def deployed(previous: dict[str, object], ready: bool, now: str) -> dict[str, object]:
    return build_deployed_status(
        typed_status(previous), plan_summary=SUMMARY, generation=3, ready=ready, ready_message="1/1 replicas available", now=now,
        message="L4x1 per replica",
    )  # fmt: skip


def test_resync_of_an_unchanged_object_changes_nothing() -> None:
    first = deployed({}, True, "2026-01-01T00:00:00Z")
    again = deployed(first, True, "2026-01-01T01:00:00Z")
    assert status_changes(typed_status(first), again) == {}


def test_transition_time_moves_only_when_the_status_flips() -> None:
    old = merge_conditions([], [Condition(type="Ready", status="False", reason="Progressing")], T1)
    same = merge_conditions(
        typed(old), [Condition(type="Ready", status="False", reason="Progressing", message="x")], T2
    )
    flipped = merge_conditions(typed(same), [Condition(type="Ready", status="True", reason="Available")], T3)
    assert same[0]["lastTransitionTime"] == T1 and same[0]["message"] == "x"
    assert flipped[0]["lastTransitionTime"] == T3


def test_status_is_typed_by_the_api_models() -> None:
    """What the CRD would prune without a word (a misspelt plan field, a phase it does not know, a
    time that is not one) fails in the builder instead."""
    with pytest.raises(pydantic.ValidationError, match="gpuz"):
        build_deployed_status(
            typed_status({}),
            plan_summary=PlanSummary.model_validate({**PLAN, "gpuz": 1}),
            generation=1,
            ready=True,
            ready_message="",
            now=T0,
            message="",
        )
    with pytest.raises(pydantic.ValidationError, match="phase"):
        build_failed_status(typed_status({}), reason="R", message="m", generation=1, now=T0, phase="Broken")  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError, match="lastTransitionTime"):
        merge_conditions([], [Condition(type="Ready", status="True")], "yesterday")


def test_deployed_status_phases_and_conditions() -> None:
    status = deployed({}, False, T0)
    assert status["phase"] == "Deploying" and status["observedGeneration"] == 3 and status["plan"] == PLAN
    kinds = {c["type"]: c["status"] for c in status["conditions"]}  # type: ignore[union-attr,index]
    assert kinds == {"Planned": "True", "Deployed": "True", "Ready": "False"}
    assert deployed(status, True, T2)["phase"] == "Ready"


def test_failed_status_keeps_the_reason_and_names_the_field() -> None:
    status = build_failed_status(
        typed_status({}), reason="InvalidSpec", message="spec.maxModelLen: too long", generation=2, now=T0
    )
    assert status["phase"] == "Failed"
    assert status["conditions"][0]["reason"] == "InvalidSpec"
    assert "spec.maxModelLen" in status["message"]


def test_readiness_follows_the_workload() -> None:
    rolling = {"metadata": {"generation": 2}, "spec": {"replicas": 2}, "status": {"observedGeneration": 1}}
    assert readiness_from_workload(rolling) == (False, "rolling out generation 2")
    half = {"metadata": {"generation": 2}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 2, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 2}}  # fmt: skip
    assert readiness_from_workload(half)[0] is False
    full = {**half, "status": {**half["status"], "availableReplicas": 2, "readyReplicas": 2}}
    assert readiness_from_workload(full) == (True, "2/2 replicas available")
    # A restart surges the one-replica model's Deployment to two: its one replica serves, it is Ready.
    surging = {**half, "status": {**half["status"], "updatedReplicas": 2}}
    assert readiness_from_workload(surging, desired=1) == (True, "1/1 replicas available")
    assert readiness_from_workload(surging, desired=2)[0] is False
    # The surge's own scale bumps the generation: until its controller observes it, the status is
    # about the spec before, and the readiness mirrors wait for the next one (no Deploying flicker).
    from loadline.status.build import workload_observed

    scaled = {**full, "metadata": {"generation": 3}}
    assert not workload_observed(scaled) and workload_observed(full) and workload_observed(None)


def test_readiness_status_is_none_when_nothing_changes_and_never_overrides_failed() -> None:
    ready = deployed({}, True, T0)
    assert (
        build_readiness_status(typed_status(ready), ready=True, message="1/1 replicas available", now=T2)
        is None
    )
    change = build_readiness_status(
        typed_status(ready), ready=False, message="0/1 replicas available", now=T2
    )
    assert change is not None and change["phase"] == "Deploying"
    failed = {"phase": "Failed", "conditions": []}
    assert build_readiness_status(typed_status(failed), ready=True, message="", now=T0) is None


def ready_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_a_remediation_rolling_out_is_deploying_until_the_workload_is_available_or_stuck() -> None:
    """The decision says the roll-out (phase and Ready condition) in its own write; the roll-out's
    progress then writes nothing, its availability writes Ready, and a pod the scheduler cannot place
    says so in the condition."""
    ready = deployed({}, True, T0)
    said = _build.build_remediating_status(typed_status(ready), result="applied: memoryGiB 12 → 15", now=T1)
    assert said["phase"] == "Deploying"
    condition = ready_condition(said)
    assert (condition["status"], condition["reason"]) == ("False", _build.REMEDIATING)
    assert "memoryGiB 12 → 15" in condition["message"] and condition["lastTransitionTime"] == T1
    # Only the Ready condition changes: the others keep their times and words.
    assert [c for c in said["conditions"] if c["type"] != "Ready"] == [
        c for c in ready["conditions"] if c["type"] != "Ready"
    ]
    rolling = {**ready, **said}
    for step in ("rolling out generation 3", "0/1 replicas available, 1 updated"):
        assert build_readiness_status(typed_status(rolling), ready=False, message=step, now=T2) is None
    back = build_readiness_status(typed_status(rolling), ready=True, message="1/1 replicas available", now=T2)
    assert back is not None and back["phase"] == "Ready" and ready_condition(back)["reason"] == "Available"
    stuck = build_readiness_status(
        typed_status(rolling),
        ready=False,
        message="0/1 replicas available; 0/4 nodes are available",
        now=T3,
        stuck=True,
    )
    assert stuck is not None and ready_condition(stuck)["reason"] == "Progressing"
    # Another phase is decided elsewhere: a Degraded or Failed model is not said to be rolling out.
    for phase in ("Degraded", "Failed", "Pending"):
        assert (
            _build.build_remediating_status(typed_status({**ready, "phase": phase}), result="x", now=T1) == {}
        )


def test_a_readiness_change_is_an_event_unless_loadlines_own_restart_rolls_the_pods() -> None:
    ready = deployed({}, True, T0)
    going = build_readiness_status(typed_status(ready), ready=False, message="0/1 replicas available", now=T2)
    assert going is not None
    assert _build.readiness_event_reason(typed_status(ready), going) == "Progressing"
    back = build_readiness_status(
        typed_status({**ready, **going}), ready=True, message="1/1 replicas available", now=T2
    )
    assert (
        back is not None and _build.readiness_event_reason(typed_status({**ready, **going}), back) == "Ready"
    )
    # A condition's message changing within a phase is no Event.
    assert _build.readiness_event_reason(typed_status(ready), {**going, "phase": "Ready"}) is None
    # While loadline restarts the model (RestartStarted posted, RestartDone to come): no Event.
    rolling = {**ready, "maintenance": {"state": "Running"}}
    assert _build.readiness_event_reason(typed_status(rolling), going) is None
    assert _build.readiness_event_reason(typed_status({**rolling, **going}), back) is None


def test_children_are_owned_for_garbage_collection() -> None:
    owner = build_owner_reference(BODY)
    assert owner == {"apiVersion": "loadline.dev/v1alpha1", "kind": "InferenceModel", "name": "chat",
                     "uid": "1234", "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    child = with_owner({"kind": "Service", "metadata": {"name": "chat"}}, owner, "team-a")
    assert child["metadata"]["ownerReferences"] == [owner] and child["metadata"]["namespace"] == "team-a"


def test_unschedulable_reason_quotes_the_scheduler() -> None:
    from loadline.status.build import unschedulable_reason

    placed = {
        "metadata": {"name": "a"},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    stuck = {"metadata": {"name": "b"}, "status": {"conditions": [{"type": "PodScheduled", "status": "False",
             "reason": "Unschedulable", "message": "0/12 nodes are available: 12 Insufficient memory."}]}}  # fmt: skip
    assert unschedulable_reason([placed]) == ""
    assert (
        unschedulable_reason([placed, stuck])
        == "pod b cannot be scheduled: 0/12 nodes are available: 12 Insufficient memory."
    )


def _pod(name: str, created: str, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T10:00:00Z"
    cond = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": meta, "status": {"conditions": [cond]}}


@pytest.mark.parametrize(
    ("previous", "nodes", "listed"),
    [
        (None, 2, False),  # a new model: nothing of another layout exists
        ({"nodesPerReplica": 1, "memory": {"kvCacheGiB": 20.0}}, 1, False),  # a remediation's raised memory
        ({"nodesPerReplica": 2}, 4, False),  # still a LeaderWorkerSet
        ({"nodesPerReplica": 1}, 2, True),  # Deployment -> LeaderWorkerSet
        ({"nodesPerReplica": 2}, 1, True),  # LeaderWorkerSet -> Deployment
        ({}, 2, True),  # a plan written before nodesPerReplica existed was one node
    ],
)
def test_children_are_listed_for_removal_only_when_the_layout_changes(
    previous: dict[str, Any] | None, nodes: int, listed: bool
) -> None:
    plan = None
    if previous is not None:
        wire = stored_plan(**previous)
        if "nodesPerReplica" not in previous:
            del wire["nodesPerReplica"]
        plan = PlanSummary.model_validate(wire)
    assert _build.layout_changed(plan, nodes) is listed


def test_stale_children_are_only_those_this_model_controls_and_no_longer_wants() -> None:
    owner = {"uid": "u1", "controller": True}
    existing = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "m", "ownerReferences": [owner]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "m", "ownerReferences": [owner]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "hand-made"}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "other", "ownerReferences": [{"uid": "u2", "controller": True}]}},
    ]  # fmt: skip
    wanted = [("LeaderWorkerSet", "m-lws"), ("Service", "m")]
    assert _build.stale_children(existing, wanted, "u1") == [("apps/v1", "Deployment", "m")]


def test_a_refused_apply_keeps_the_plan_and_says_deployed_false() -> None:
    previous = _build.build_deployed_status(
        typed_status({}),
        plan_summary=SUMMARY,
        generation=2,
        ready=True,
        ready_message="1/1",
        now=T0,
        message="m",
    )
    status = _build.build_apply_failed_status(
        typed_status(previous), message="HTTP 403: frozen", generation=2, now=T1
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Pending" and conditions["Deployed"]["status"] == "False"
    assert conditions["Planned"]["status"] == "True" and conditions["Planned"]["lastTransitionTime"] == T0
    assert "plan" not in status  # the plan in status stays as it was


def test_a_deleted_models_metric_series_are_removed() -> None:
    telemetry.OOM_INCIDENTS.labels("ns-gone", "chat", "host_memory").inc()
    telemetry.REMEDIATIONS.labels("ns-gone", "chat", "raise_memory", "applied").inc()
    telemetry.OOM_INCIDENTS.labels("ns-kept", "chat", "host_memory").inc()
    assert telemetry.forget("ns-gone", "chat") == 2

    def series(namespace: str) -> int:
        return sum(
            1
            for metric in (telemetry.OOM_INCIDENTS, telemetry.REMEDIATIONS)
            for family in metric.collect()
            for sample in family.samples
            if sample.labels.get("namespace") == namespace
        )

    assert series("ns-gone") == 0 and series("ns-kept") > 0


def test_a_crash_loop_counts_up_one_incident_and_a_new_class_adds_one() -> None:
    crash = {
        "loop": "chat-abc/vllm", "confidence": 0.83333, "evidence": ["x"], "caller_side": False,
        "action": "raised memory", "result": "applied", "container": "vllm",
    }  # fmt: skip
    first = _build.merge_incident([], oom_class="host_memory", pod="chat-1", now=T0, **crash)
    again = _build.merge_incident(incidents(first), oom_class="host_memory", pod="chat-2", now=T1, **crash)
    other = _build.merge_incident(
        incidents(again), oom_class="kv_cache_overflow", pod="chat-2", now=T2, **crash
    )
    assert (
        len(again) == 1 and again[0]["count"] == 2 and again[0]["lastSeen"] == T1 and again[0]["time"] == T0
    )
    assert again[0]["pod"] == "chat-2" and again[0]["confidence"] == 0.83
    assert [i["class"] for i in other] == ["host_memory", "kv_cache_overflow"]
    with pytest.raises(pydantic.ValidationError, match="class"):
        _build.merge_incident([], oom_class="cosmic_rays", pod="p", now=T0, **crash)


def test_an_incident_status_writes_every_remediation_field_even_at_its_default() -> None:
    """A merge patch leaves out what it does not name: a counter back at 0 must still be written."""
    state = RemediationState(needs_person="")
    status = _build.build_incident_status([], state)
    assert status["remediation"]["actionsToday"] == 0 and status["remediation"]["needsPerson"] == ""
    assert "phase" not in status
    degraded = _build.build_incident_status([], state, needs_person="3 changes today; look at the prompts")
    assert degraded["phase"] == "Degraded" and degraded["message"].startswith("3 changes")


def test_the_readiness_check_backs_off_to_once_a_minute() -> None:
    """Over an hour stuck in Deploying, a timer firing every 5 s reads the cluster ~65 times (5, 10,
    20, 40 s, then each minute), not 720; and always at once when this process has not looked yet."""
    reads, last = [], None
    for tick in range(0, 3600, 5):
        if _build.readiness_check_due(float(tick), last):
            reads.append(tick)
            last = float(tick)
    assert reads[:6] == [0, 5, 10, 20, 40, 100]
    assert all(b - a == 60 for a, b in itertools.pairwise(reads[4:]))
    assert len(reads) <= 65
    assert _build.readiness_check_due(3000.0, None)  # a new leader looks once at once


def test_deploying_since_is_when_ready_turned_false() -> None:
    status = deployed({}, False, T1)
    since = _build.deploying_since(typed_status(status))
    assert since is not None and since.isoformat().startswith("2026-11-21T01:00")
    assert _build.deploying_since(typed_status(deployed({}, True, T1))) is None


# --- measured GPU memory beside the plan's budget (status.measuredGpuMemory) ---

READING = {"gpus": 1, "maxUsedGiB": 20.3, "plannedGiB": 21.0, "driftGiB": -0.7, "source": "loadline-agent"}


def test_planned_gpu_gib_is_the_plans_per_gpu_budget() -> None:
    memory = PLAN["memory"]
    parts = ("weightsGiB", "activationGiB", "nonTorchGiB", "cudaGraphGiB", "kvCacheGiB")
    assert _build.planned_gpu_gib(SUMMARY) == pytest.approx(sum(memory[k] for k in parts), abs=0.01)
    # The budget is what vLLM takes: about gpuMemoryUtilization of the GPU, never more than the GPU.
    assert (_build.planned_gpu_gib(SUMMARY) or 0) <= memory["totalGiB"]
    assert _build.planned_gpu_gib(None) is None
    # A stored plan the API model refuses (cut short by a hand edit) is read as no plan at all.
    assert _build.planned_gpu_gib(typed_status({"plan": {"memory": {"weightsGiB": 1.0}}}).plan) is None


def test_a_first_reading_is_written_with_its_time_and_source() -> None:
    status = _build.build_measured_status(typed_status({}), READING, now=T0)
    assert status == {"measuredGpuMemory": {**READING, "time": T0}}
    assert _build.build_measured_status(typed_status({"phase": "Ready"}), READING, now=T0) == status


def test_nothing_measured_writes_nothing_and_keeps_the_last_figure() -> None:
    previous = _build.build_measured_status(typed_status({}), READING, now=T0)
    assert _build.build_measured_status(typed_status(previous), None, now=T1) == {}
    assert _build.build_measured_status(typed_status({}), None, now=T1) == {}
    assert _build.build_measured_status(typed_status(None), {}, now=T1) == {}


def test_an_idle_model_writes_nothing_within_the_step() -> None:
    previous = _build.build_measured_status(typed_status({}), READING, now="2026-11-20T00:00:00Z")
    for minute, used in enumerate((20.3, 20.5, 20.71, 19.9, 20.79)):
        reading = {**READING, "maxUsedGiB": used, "driftGiB": round(used - 21.0, 2)}
        now = f"2026-11-20T00:{minute + 1:02d}:00Z"
        assert _build.build_measured_status(typed_status(previous), reading, now=now) == {}, used


def test_a_move_of_a_step_or_a_changed_shape_is_written() -> None:
    previous = _build.build_measured_status(typed_status({}), READING, now=T0)
    grown = _build.build_measured_status(
        typed_status(previous), {**READING, "maxUsedGiB": 20.8, "driftGiB": -0.2}, now=T1
    )
    assert grown["measuredGpuMemory"]["maxUsedGiB"] == 20.8 and grown["measuredGpuMemory"]["time"] == T1
    for change in ({"gpus": 2}, {"plannedGiB": 30.0, "driftGiB": -9.7}, {"source": "dcgm"}):
        assert _build.build_measured_status(typed_status(previous), {**READING, **change}, now=T1), change
    # A reading without a source (answers that do not say) replaces one that had it.
    no_source = {k: v for k, v in READING.items() if k != "source"}
    assert (
        "source"
        not in _build.build_measured_status(typed_status(previous), no_source, now=T1)["measuredGpuMemory"]
    )


def test_a_steady_figure_is_refreshed_hourly_so_its_time_tells_it_from_a_stale_one() -> None:
    previous = _build.build_measured_status(typed_status({}), READING, now="2026-11-20T00:00:00Z")
    assert _build.build_measured_status(typed_status(previous), READING, now="2026-11-20T00:59:59Z") == {}
    refreshed = _build.build_measured_status(typed_status(previous), READING, now="2026-11-20T01:00:00Z")
    assert refreshed["measuredGpuMemory"]["time"] == "2026-11-20T01:00:00Z"
    # A stored time that cannot be read is rewritten rather than trusted.
    broken = {"measuredGpuMemory": {**previous["measuredGpuMemory"], "time": "yesterday"}}
    assert _build.build_measured_status(typed_status(broken), READING, now=T1)


def test_a_reading_the_api_would_not_take_fails_here() -> None:
    with pytest.raises(pydantic.ValidationError):
        _build.build_measured_status(typed_status({}), {**READING, "source": "nvidia-smi"}, now=T0)
    with pytest.raises(pydantic.ValidationError):
        _build.build_measured_status(typed_status({}), {**READING, "gpus": -1}, now=T0)


def test_a_decision_is_written_as_the_merge_patch_would_leave_it_testing_what_it_read() -> None:
    """Members merged as RFC 7386 merges them (a null member removed), conditions set in place, and a
    test of each thing the decision read; the phase and the Ready condition, which the crash's own
    readiness writes meanwhile, are not tested."""
    status = {
        "phase": "Ready",
        "observedGeneration": 2,
        "remediation": {
            "handledCrashes": ["a", "b"],
            "heldOverrides": {"maxNumSeqs": 64},
            "revision": 2,
        },
        "maintenance": {"state": "Scheduled", "action": "remediation"},
        "plan": {"gpu": "L4x1", "gpusPerReplica": 1, "maxModelLen": 8192},
        "conditions": [
            {"type": "Planned", "status": "True", "message": "old"},
            {"type": "Ready", "status": "True", "message": "1/1"},
        ],
    }
    model = {"metadata": {"generation": 2}, "status": status}
    changes = {
        "remediation": {"handledCrashes": ["a", "b", "c"], "heldOverrides": None, "revision": 3},
        "plan": {"gpu": "L4x1", "maxModelLen": 4096},
        "conditions": [{**status["conditions"][0], "message": "new"}, status["conditions"][1]],
    }
    built = _build.build_decision_patch(model, changes)
    assert built is not None
    sets, tested = built
    assert sets["/status/remediation"] == {"handledCrashes": ["a", "b", "c"], "revision": 3}
    assert sets["/status/plan"] == {"gpu": "L4x1", "gpusPerReplica": 1, "maxModelLen": 4096}
    assert sets["/status/conditions/0"]["message"] == "new" and "/status/conditions/1" not in sets
    assert {"/metadata/generation", "/status/observedGeneration", "/status/remediation/revision",
            "/status/maintenance/state", "/status/plan/gpu", "/status/conditions/0/type"} <= set(tested)  # fmt: skip
    assert not [path for path in tested if path in ("/status/phase", "/status/conditions/1/status")]
    # The resourceVersion guard instead: nothing to test against, a member removed, conditions reordered.
    assert _build.build_decision_patch({"metadata": {}, "status": {}}, changes) is None
    assert _build.build_decision_patch(model, {"maintenance": None}) is None
    assert _build.build_decision_patch(model, {"conditions": status["conditions"][::-1]}) is None


def test_a_version_newer_than_every_table_is_a_condition_that_names_the_newest_used() -> None:
    from loadline.sizing import beyond_tables

    warning = beyond_tables("0.99.0")
    assert "0.99.0 is newer than every loadline table" in warning and "0.33.0" in warning
    assert beyond_tables("0.19.0") == ""
    beyond = build_deployed_status(
        typed_status({}), plan_summary=SUMMARY, generation=3, ready=True, ready_message="", now=T0, message="m",
        beyond_tables=warning,
    )  # fmt: skip
    [known] = [c for c in beyond["conditions"] if c["type"] == _build.ENGINE_TABLES]  # type: ignore[union-attr,index]
    assert known["status"] == "False" and known["reason"] == "NewerThanTables" and known["message"] == warning
    # Back to a version the tables know: the condition turns True (and is absent where it never was).
    again = deployed(beyond, True, T1)
    [known] = [c for c in again["conditions"] if c["type"] == _build.ENGINE_TABLES]  # type: ignore[union-attr,index]
    assert known["status"] == "True"
    assert all(c["type"] != _build.ENGINE_TABLES for c in deployed({}, True, T0)["conditions"])  # type: ignore[union-attr,index]
