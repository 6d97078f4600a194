"""The operator's side of OOM handling, pure: incidents from Pod objects, and policy decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from loadline.api import AppliedChange, Overrides, RemediationState
from loadline.oom import SeenCrashes, classify, parse_incident, propose_remediation
from loadline.oom._model import Change, Remediation
from loadline.oom._observe import build_incident, crash_id, loop_key, quantity_bytes
from loadline.oom._policy import PolicyLimits, decide
from tests.conftest import stored_plan

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
SAMPLER_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 552.50 MiB is free. Including non-PyTorch memory, this process has 78.64 GiB memory in "
    "use. Of the allocated memory 74.91 GiB is allocated by PyTorch, and 1.78 GiB is reserved by PyTorch but "
    "unallocated.\nRuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. "
    "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine."
)
MODEL: dict[str, Any] = {
    "spec": {"model": {"name": "openai/gpt-oss-20b"}},
    "status": {
        "plan": stored_plan(
            gpusPerReplica=1, tensorParallelSize=1, maxModelLen=8192, maxNumSeqs=1024,
            maxNumBatchedTokens=8192, gpuMemoryUtilization=0.95, kvCacheTokens=1277184,
            engineVersion="0.19.0", memory={"weightsGiB": 13.64, "totalGiB": 79.19},
        )
    },
}  # fmt: skip


def pod(reason: str, exit_code: int, message: str = "", restarts: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "chat-abc-1", "uid": "u1", "labels": {"pod-template-hash": "abc"}},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "resources": {"limits": {"memory": "22Gi", "nvidia.com/gpu": "1"}},
                    "env": [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}],
                }
            ]
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "vllm",
                    "restartCount": restarts,
                    "state": {"running": {"startedAt": "2026-11-21T11:59:00Z"}},
                    "lastState": {
                        "terminated": {
                            "reason": reason, "exitCode": exit_code, "message": message,
                            "startedAt": "2026-11-21T11:50:00Z", "finishedAt": "2026-11-21T11:52:30Z",
                        }
                    },
                }
            ]
        },
    }  # fmt: skip


def test_incident_from_a_crashed_pod_carries_what_the_classifier_needs() -> None:
    p = pod("Error", 1, SAMPLER_OOM)
    incident = build_incident(p, p["status"]["containerStatuses"][0], MODEL)
    assert incident is not None
    assert incident["reason"] == "Error" and incident["exit_code"] == 1 and incident["uptime_seconds"] == 150
    assert (
        incident["config"]["max_num_seqs"] == 1024
        and incident["config"]["memory_limit_bytes"] == 22 * 1024**3
    )
    assert incident["config"]["expandable_segments"] is True
    assert incident["plan"] == {"weights_gib": 13.64, "gpu_memory_gib": 79.19, "kv_cache_tokens": 1277184,
                                "quantization_allowed": False}  # fmt: skip
    diagnosis = classify(parse_incident(incident))
    assert diagnosis.oom_class.value == "batch_misconfiguration"


def test_crash_ids_are_stable_per_termination_and_loops_group_restarts() -> None:
    first, again, next_crash = pod("OOMKilled", 137), pod("OOMKilled", 137), pod("OOMKilled", 137, restarts=2)
    status = lambda p: p["status"]["containerStatuses"][0]  # noqa: E731
    assert crash_id(first, status(first)) == crash_id(again, status(again))
    assert crash_id(first, status(first)) != crash_id(next_crash, status(next_crash))
    assert loop_key(first, "vllm") == loop_key(next_crash, "vllm") == "abc/vllm"


def test_quantities() -> None:
    assert quantity_bytes("22Gi") == 22 * 1024**3
    assert quantity_bytes("512M") == 512 * 1000**2
    assert quantity_bytes("1e9") == 10**9
    assert quantity_bytes("bogus") is None


def diagnosis_and_proposal() -> tuple[Any, Remediation]:
    p = pod("Error", 1, SAMPLER_OOM)
    incident = parse_incident(build_incident(p, p["status"]["containerStatuses"][0], MODEL) or {})
    diagnosis = classify(incident)
    return diagnosis, propose_remediation(diagnosis, incident)


def test_auto_mode_applies_one_step_and_counts_it() -> None:
    diagnosis, proposal = diagnosis_and_proposal()
    decision = decide(diagnosis, proposal, RemediationState(), PolicyLimits(), NOW)
    assert decision.apply
    assert decision.state.overrides.max_num_seqs == 512
    assert decision.state.actions_today == 1 and decision.state.day == "2026-11-21"
    assert decision.changes[0].field == "config.max_num_seqs" and decision.changes[0].new == "512"


def test_recommend_and_off_modes_change_nothing() -> None:
    diagnosis, proposal = diagnosis_and_proposal()
    for mode in ("recommend", "off"):
        decision = decide(diagnosis, proposal, RemediationState(), PolicyLimits(), NOW, mode=mode)
        assert not decision.apply and decision.state.overrides == Overrides()
    assert (
        "recommended"
        in decide(diagnosis, proposal, RemediationState(), PolicyLimits(), NOW, mode="recommend").result
    )


def test_spent_budget_asks_for_a_person_and_resets_the_next_day() -> None:
    diagnosis, proposal = diagnosis_and_proposal()
    spent = RemediationState(day="2026-11-21", actions_today=3)
    decision = decide(diagnosis, proposal, spent, PolicyLimits(max_actions_per_day=3), NOW)
    assert not decision.apply and decision.needs_person.startswith("needs a person")
    tomorrow = decide(
        diagnosis, proposal, spent, PolicyLimits(max_actions_per_day=3), NOW + timedelta(days=1)
    )
    assert tomorrow.apply and tomorrow.state.actions_today == 1


def test_never_undoes_a_change_within_the_cool_down() -> None:
    raised = AppliedChange(time=NOW - timedelta(minutes=5), oom_class="host_memory",
                           field="config.max_num_seqs", old="256", new="512")  # fmt: skip
    state = RemediationState(day="2026-11-21", actions_today=1, history=[raised])
    diagnosis, _ = diagnosis_and_proposal()
    lowered = Remediation(
        action="lower", summary="lower max_num_seqs", changes=(Change("config.max_num_seqs", 512, 256),)
    )
    decision = decide(diagnosis, lowered, state, PolicyLimits(), NOW)
    assert not decision.apply and "cool-down" in decision.result
    later = decide(diagnosis, lowered, state, PolicyLimits(), NOW + timedelta(hours=1))
    assert later.apply


def test_host_memory_raise_is_at_least_20_percent_and_capped() -> None:
    diagnosis, _ = diagnosis_and_proposal()
    small = Remediation(
        action="raise_memory_limit",
        summary="raise",
        changes=(Change("config.memory_limit_bytes", 20 * 1024**3, 21 * 1024**3),),
    )
    decision = decide(diagnosis, small, RemediationState(), PolicyLimits(), NOW)
    assert decision.state.overrides.memory_gi_b == 24  # ceil(20 GiB × 1.2)
    capped = decide(diagnosis, small, RemediationState(), PolicyLimits(max_memory_gib=22), NOW)
    assert capped.state.overrides.memory_gi_b == 22
    at_cap = decide(diagnosis, small, RemediationState(), PolicyLimits(max_memory_gib=20), NOW)
    assert not at_cap.apply


def test_low_confidence_is_only_recommended() -> None:
    diagnosis, proposal = diagnosis_and_proposal()
    decision = decide(diagnosis, proposal, RemediationState(), PolicyLimits(min_confidence=0.99), NOW)
    assert not decision.apply and "confidence" in decision.result


def test_consecutive_memory_raises_are_not_mistaken_for_an_undo() -> None:
    diagnosis, _ = diagnosis_and_proposal()
    first = Remediation(
        action="raise_memory_limit",
        summary="raise",
        changes=(Change("config.memory_limit_bytes", 22 * 1024**3, 27 * 1024**3),),
    )
    state = decide(diagnosis, first, RemediationState(), PolicyLimits(), NOW).state
    assert (
        state.overrides.memory_gi_b == 27 and state.history[-1].old == "22" and state.history[-1].new == "27"
    )
    second = Remediation(
        action="raise_memory_limit",
        summary="raise",
        changes=(Change("config.memory_limit_bytes", 27 * 1024**3, 33 * 1024**3),),
    )
    # The crash comes from an instance started before the first raise (it never ran it), so it does
    # not judge that raise: the second raise is decided on its own, and is not taken for an undo.
    decision = decide(
        diagnosis, second, state, PolicyLimits(), NOW + timedelta(minutes=1),
        crash_started_at=NOW - timedelta(hours=1),
    )  # fmt: skip
    assert decision.apply and decision.state.overrides.memory_gi_b == 33


def test_seen_crashes_are_bounded_and_forget_the_least_recently_seen() -> None:
    seen = SeenCrashes(capacity=3)
    for cid in ("a", "b", "c"):
        seen.add(cid)
    assert "a" in seen  # seen again: now the most recent
    seen.add("d")
    assert len(seen) == 3
    assert "b" not in seen and {"a", "c", "d"} == {cid for cid in "abcd" if cid in seen}
