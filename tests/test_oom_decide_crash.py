"""decide_crash: one crash, from its incident and the model's status to the status to write and the
Events to post, without a cluster (the handler only gathers, writes and posts)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from loadline.oom import Crash, decide_crash, parse_incident
from loadline.oom._policy import PolicyLimits
from tests.conftest import typed_status

NOW = datetime(2026, 11, 23, 14, 0, tzinfo=UTC)
# vLLM's sampler warm-up refusal (vllm/v1/worker/gpu_model_runner.py, _dummy_sampler_run): a start-up
# crash, which recurs at every start.
SAMPLER = "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests."
# PyTorch's allocator refusal, once the model served: a KV-cache overflow on a long prompt.
RUNTIME_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.15 GiB."
CRASH = Crash("uid-1/vllm/3", "chat-0/vllm", "chat-0", "vllm")


def sampler_crash() -> Any:
    return parse_incident(
        {"reason": "Error", "exit_code": 1, "message": SAMPLER, "config": {"max_num_seqs": 256}}
    )


def long_prompt_crash() -> Any:
    return parse_incident(
        {
            "reason": "Error", "exit_code": 1, "message": RUNTIME_OOM, "ever_ready": True,
            "config": {"max_model_len": 32768},
            "metrics": {"prompt_tokens_max": 31000, "kv_cache_usage": 0.99},
        }
    )  # fmt: skip


def test_a_crash_that_recurs_at_every_start_rolls_its_fix_now_said_in_one_event() -> None:
    decided = decide_crash(sampler_crash(), typed_status({}), PolicyLimits(), NOW, crash=CRASH, generation=3)
    assert decided is not None and decided.rolls_out
    remediation = decided.changes["remediation"]
    assert remediation["overrides"] == {"maxNumSeqs": 128}
    assert remediation["handledCrashes"] == [CRASH.id] and remediation["observedGeneration"] == 3
    assert decided.changes["maintenance"]["state"] == "Running"
    assert decided.urgent is not None
    [incident] = decided.changes["incidents"]
    assert incident["class"] == "batch_misconfiguration" and incident["pod"] == "chat-0"
    reasons = [e.reason for e in decided.events]
    assert reasons == ["OutOfMemory", "Remediated"]  # the roll-out that starts is said in Remediated
    assert "Restart:" in decided.events[-1].message


def test_a_fix_that_may_wait_is_held_for_the_window_and_its_schedule_said() -> None:
    decided = decide_crash(
        long_prompt_crash(), typed_status({}), PolicyLimits(), NOW, crash=CRASH, generation=1
    )
    assert decided is not None and decided.rolls_out and decided.urgent is None
    remediation = decided.changes["remediation"]
    assert remediation["overrides"] == {"maxModelLen": 27648}
    assert remediation["heldOverrides"] == {}  # the pods keep what they run until the window
    assert decided.changes["maintenance"]["state"] == "Scheduled"
    assert [e.reason for e in decided.events] == ["OutOfMemory", "Remediated", "RestartScheduled"]


def test_recommend_mode_changes_nothing_that_runs() -> None:
    limits = PolicyLimits(mode="recommend")
    decided = decide_crash(sampler_crash(), typed_status({}), limits, NOW, crash=CRASH, generation=1)
    assert decided is not None and not decided.rolls_out
    assert "maintenance" not in decided.changes
    assert decided.changes["remediation"]["handledCrashes"] == [CRASH.id]
    assert [e.reason for e in decided.events] == ["OutOfMemory", "RemediationRecommended"]


def test_a_crash_handled_already_or_not_out_of_memory_is_nothing_to_record() -> None:
    handled = {"remediation": {"handledCrashes": [CRASH.id], "observedGeneration": 1}}
    assert (
        decide_crash(sampler_crash(), typed_status(handled), PolicyLimits(), NOW, crash=CRASH, generation=1)
        is None
    )
    config_error = parse_incident({"reason": "Error", "exit_code": 1, "message": "ValueError: bad config"})
    assert (
        decide_crash(config_error, typed_status({}), PolicyLimits(), NOW, crash=CRASH, generation=1) is None
    )


def test_overrides_of_an_older_generation_are_not_carried_but_the_handled_crashes_are() -> None:
    """A person changed the spec since the last fix: the next decision starts from the spec again."""
    earlier = {
        "remediation": {"overrides": {"maxNumSeqs": 64}, "observedGeneration": 1, "handledCrashes": ["c0"]}
    }
    decided = decide_crash(
        sampler_crash(), typed_status(earlier), PolicyLimits(), NOW, crash=CRASH, generation=2
    )
    assert decided is not None
    remediation = decided.changes["remediation"]
    assert remediation["overrides"] == {"maxNumSeqs": 128}  # halved from the spec's 256, not from 64
    assert remediation["handledCrashes"] == ["c0", CRASH.id]
