"""Fixes judged by their outcome: the same class within the horizon means the fix did not work, and a
fix that did not work is not repeated (the next rung, or a person with the history)."""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loadline import telemetry
from loadline.api import RemediationState, RemediationTrial
from loadline.handlers import _events, _kube, _oom, _outcomes
from loadline.handlers._state import OperatorState
from loadline.oom import (
    Change,
    Crash,
    Diagnosis,
    OomClass,
    Option,
    Remediation,
    decide_crash,
    judge_elapsed_trials,
    judging_interval,
    parse_incident,
    propose_remediation,
)
from loadline.oom._outcome import failed_actions, judge_outcome, outcome_confidence
from loadline.oom._policy import PolicyLimits, confidence_by_class, decide
from loadline.oom._remediate import next_rung
from loadline.settings import OperatorSettings
from loadline.state import _index
from tests.conftest import typed_status
from tests.test_crash_requests import crashed_pod
from tests.test_reconcile_requests import FakeParent

LOG = logging.getLogger("test")
NOW = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def trial(cls: str, action: str, at: datetime) -> RemediationTrial:
    return RemediationTrial.model_validate({"class": cls, "action": action, "appliedAt": at})


def batch_diagnosis() -> Diagnosis:
    return Diagnosis(OomClass.BATCH_MISCONFIGURATION, 0.9, ("graph capture",), signals=("graph_capture_oom",))


def batch_proposal() -> Remediation:
    return Remediation(
        action="lower_gpu_memory_utilization",
        summary="util 0.9 -> 0.85",
        changes=(Change("config.gpu_memory_utilization", 0.9, 0.85),),
        alternatives=(
            Option("lower_max_num_seqs", "seqs 256 -> 128", (Change("config.max_num_seqs", 256, 128),)),
            Option(
                "lower_max_num_batched_tokens",
                "tokens 8192 -> 4096",
                (Change("config.max_num_batched_tokens", 8192, 4096),),
            ),
        ),
    )


# ---- judge_outcome --------------------------------------------------------------------------------------


def test_same_class_within_the_horizon_is_recurred() -> None:
    j = judge_outcome([trial("fragmentation", "restart", NOW - HOUR)], "fragmentation", NOW, 24 * HOUR)
    assert [o.result for o in j.outcomes] == ["recurred"] and not j.open


def test_horizon_passed_without_the_class_is_worked() -> None:
    j = judge_outcome([trial("fragmentation", "restart", NOW - 25 * HOUR)], "host_memory", NOW, 24 * HOUR)
    assert [o.result for o in j.outcomes] == ["worked"]


def test_another_class_within_the_horizon_judges_nothing() -> None:
    j = judge_outcome([trial("fragmentation", "restart", NOW - HOUR)], "host_memory", NOW, 24 * HOUR)
    assert not j.outcomes and len(j.open) == 1


def test_the_horizon_is_configurable() -> None:
    trials = [trial("fragmentation", "restart", NOW - 3 * HOUR)]
    assert judge_outcome(trials, "fragmentation", NOW, 2 * HOUR).outcomes[0].result == "worked"
    assert judge_outcome(trials, "fragmentation", NOW, 4 * HOUR).outcomes[0].result == "recurred"


def test_a_crash_of_an_instance_older_than_the_fix_does_not_judge_it() -> None:
    trials = [trial("fragmentation", "restart", NOW - HOUR)]
    j = judge_outcome(trials, "fragmentation", NOW, 24 * HOUR, crash_started_at=NOW - 2 * HOUR)
    assert not j.outcomes and len(j.open) == 1


def test_an_instance_started_in_the_second_of_the_fix_ran_it() -> None:
    # The kubelet's startedAt has whole seconds; the fix's time has microseconds.
    applied = NOW + timedelta(microseconds=600_000)
    j = judge_outcome([trial("host_memory", "raise_memory_limit", applied)], "host_memory",
                      NOW + HOUR, 24 * HOUR, crash_started_at=NOW)  # fmt: skip
    assert [o.result for o in j.outcomes] == ["recurred"]


def test_confidence_per_class_is_the_share_that_worked() -> None:
    trials = [
        trial("fragmentation", "restart", NOW - 30 * HOUR),
        trial("fragmentation", "restart_with_expandable_segments", NOW - HOUR),
        trial("host_memory", "raise_memory_limit", NOW - 30 * HOUR),
    ]
    outcomes = judge_outcome(trials, "fragmentation", NOW, 24 * HOUR).outcomes
    assert outcome_confidence(outcomes) == {"fragmentation": 0.5, "host_memory": 1.0}
    assert failed_actions(outcomes, "fragmentation") == {"restart_with_expandable_segments"}


# ---- next_rung --------------------------------------------------------------------------------------------


def test_a_failed_fix_is_replaced_by_the_next_rung() -> None:
    rung = next_rung(batch_proposal(), {"lower_gpu_memory_utilization"})
    assert rung is not None and rung.action == "lower_max_num_seqs"
    assert [o.action for o in rung.alternatives] == ["lower_max_num_batched_tokens"]


def test_no_rung_left_is_none() -> None:
    failed = {"lower_gpu_memory_utilization", "lower_max_num_seqs", "lower_max_num_batched_tokens"}
    assert next_rung(batch_proposal(), failed) is None


# ---- decide: the whole loop -----------------------------------------------------------------------------


def test_fix_applied_crash_recurs_next_rung_is_taken_then_a_person() -> None:
    limits = PolicyLimits(max_actions_per_day=10, cooldown=timedelta(0))
    first = decide(batch_diagnosis(), batch_proposal(), RemediationState(), limits, NOW)
    assert first.apply and first.action == "lower_gpu_memory_utilization"
    assert [t.action for t in first.state.trials] == ["lower_gpu_memory_utilization"]

    # The same class again, from an instance that ran the fix: it did not work.
    second = decide(
        batch_diagnosis(), batch_proposal(), first.state, limits, NOW + HOUR, crash_started_at=NOW + HOUR / 2
    )
    assert [(o.action, o.result) for o in second.outcomes] == [("lower_gpu_memory_utilization", "recurred")]
    assert second.apply and second.action == "lower_max_num_seqs"
    assert second.state.overrides.max_num_seqs == 128

    third = decide(batch_diagnosis(), batch_proposal(), second.state, limits, NOW + 2 * HOUR)
    assert third.apply and third.action == "lower_max_num_batched_tokens"

    fourth = decide(batch_diagnosis(), batch_proposal(), third.state, limits, NOW + 3 * HOUR)
    assert not fourth.apply and fourth.needs_person
    assert "lower_gpu_memory_utilization" in fourth.needs_person and "recurred" in fourth.needs_person
    assert confidence_by_class(fourth.state) == {"batch_misconfiguration": 0.0}


def test_fragmentation_restart_recurs_then_the_budget_goes_down_a_step_then_a_person() -> None:
    # As the operator renders it: expandable segments on, so the first fix is a clean restart.
    incident = parse_incident(
        {
            "reason": "Error",
            "exit_code": 1,
            "config": {"expandable_segments": True, "gpu_memory_utilization": 0.9},
        }
    )
    diagnosis = Diagnosis(OomClass.FRAGMENTATION, 0.9, ("cached pieces",), signals=("reserved_unallocated",))
    proposal = propose_remediation(diagnosis, incident)
    limits = PolicyLimits(max_actions_per_day=10, cooldown=timedelta(0))
    first = decide(diagnosis, proposal, RemediationState(), limits, NOW)
    assert first.apply and first.action == "restart"

    second = decide(diagnosis, proposal, first.state, limits, NOW + HOUR, crash_started_at=NOW + HOUR / 2)
    assert [(o.action, o.result) for o in second.outcomes] == [("restart", "recurred")]
    assert second.apply and second.action == "lower_gpu_memory_utilization"
    assert second.state.overrides.gpu_memory_utilization == 0.85

    third = decide(diagnosis, proposal, second.state, limits, NOW + 2 * HOUR)
    assert not third.apply and third.needs_person
    assert "restart" in third.needs_person and "lower_gpu_memory_utilization" in third.needs_person


def test_a_fix_that_held_is_recorded_as_worked_and_may_be_used_again() -> None:
    limits = PolicyLimits(max_actions_per_day=10)
    first = decide(batch_diagnosis(), batch_proposal(), RemediationState(), limits, NOW)
    later = decide(batch_diagnosis(), batch_proposal(), first.state, limits, NOW + 48 * HOUR)
    assert [(o.action, o.result) for o in later.outcomes] == [("lower_gpu_memory_utilization", "worked")]
    assert later.action == "lower_gpu_memory_utilization"
    assert confidence_by_class(later.state) == {"batch_misconfiguration": 1.0}


# ---- the handler's glue: status, Event and metric --------------------------------------------------------


def series_of(metric: Any, values: tuple[str, ...]) -> bool:
    """Whether the metric exports the series with these label values (without creating it)."""
    return any(
        tuple(sample.labels[name] for name in metric._labelnames) == values
        for family in metric.collect()
        for sample in family.samples
    )


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> FakeParent:
    """The Ready model on a stand-in API server (as tests/test_crash_requests.py sets it up)."""
    fake = FakeParent({"phase": "Ready"})
    monkeypatch.setattr(_kube, "get", fake.get)
    monkeypatch.setattr(_kube, "patch_status", fake.patch_status)
    monkeypatch.setattr(_kube, "patch_status_tested", fake.patch_status_tested)
    monkeypatch.setattr(_kube, "annotate", lambda obj, annotations: fake.calls.append("annotate"))
    monkeypatch.setattr(_oom, "_read_previous_log", lambda *a, **k: "")
    return fake


def test_the_handler_records_a_recurrence_and_hands_the_model_to_a_person(
    state: OperatorState, model: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = model
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(
        _events, "event", lambda obj, *, warning, reason, message: events.append((reason, message))
    )
    meta = parent.model["metadata"]
    labels = (meta["namespace"], meta["name"])
    judged = ("host_memory", "raise_memory_limit", "recurred")
    telemetry.forget(*labels)  # this process's earlier tests' series of the model
    if series_of(telemetry.REMEDIATION_OUTCOMES, judged):
        telemetry.REMEDIATION_OUTCOMES.remove(*judged)
    known = _index.model_entry(parent.model)
    _oom.on_pod_event(state, crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    remediation = parent.model["status"]["remediation"]
    assert [t["action"] for t in remediation["trials"]] == ["raise_memory_limit"]
    # The fix rolls now (the crash recurs at every start): a roll-out started, counted by its trigger.
    assert telemetry.RESTARTS.labels(*labels, "remediation", "crashLoop")._value.get() == 1
    # The series that judge the fix exist at 0 before it is judged: the first recurrence is an increase.
    assert series_of(telemetry.REMEDIATION_OUTCOMES, judged)
    assert series_of(telemetry.REMEDIATIONS, (*labels, "raise_memory_limit", "needs_person"))

    # The pod restarted with the raised limit and was OOMKilled again: that instance ran the fix.
    again = crashed_pod()
    started = datetime.now(UTC) + timedelta(seconds=1)
    status = again["status"]["containerStatuses"][0]
    status["restartCount"] = 2
    status["lastState"]["terminated"] |= {
        "startedAt": started.isoformat().replace("+00:00", "Z"),
        "finishedAt": (started + timedelta(seconds=30)).isoformat().replace("+00:00", "Z"),
    }
    _oom.on_pod_event(state, again, LOG, OperatorSettings(), [], None)  # type: ignore[arg-type]
    remediation = parent.model["status"]["remediation"]
    assert [(o["action"], o["result"]) for o in remediation["outcomes"]] == [
        ("raise_memory_limit", "recurred")
    ]
    assert remediation["outcomeConfidence"] == {"host_memory": 0.0}
    assert "raise_memory_limit" in remediation["needsPerson"]
    assert parent.model["status"]["phase"] == "Degraded"
    assert any(reason == "RemediationOutcome" and "recurred" in message for reason, message in events)
    assert telemetry.REMEDIATION_OUTCOMES.labels(*judged)._value.get() == 1


# ---- a fix that held, judged on the clock ---------------------------------------------------------------


def sampler_fix_status(applied: datetime, generation: int = 3) -> dict[str, Any]:
    """A model's status right after the sampler warm-up crash's fix (halve max_num_seqs) was applied at
    ``applied``: what decide_crash writes, with its own clock."""
    incident = parse_incident(
        {"reason": "Error", "exit_code": 1, "config": {"max_num_seqs": 256},
         "message": "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests."}
    )  # fmt: skip
    crash = Crash("uid-1/vllm/1", "chat-0/vllm", "chat-0", "vllm")
    decided = decide_crash(
        incident, typed_status({}), PolicyLimits(), applied, crash=crash, generation=generation
    )
    assert decided is not None and decided.decision.apply
    return {"phase": "Ready", "observedGeneration": generation, **decided.changes}


def test_a_fix_that_held_past_its_horizon_is_judged_worked_without_another_crash() -> None:
    status = sampler_fix_status(NOW - 25 * HOUR)
    judged = judge_elapsed_trials(typed_status(status), NOW, generation=3, horizon=24 * HOUR)
    assert judged is not None
    assert [(o.action, o.result) for o in judged.outcomes] == [("lower_max_num_seqs", "worked")]
    remediation = judged.changes["remediation"]
    assert remediation["trials"] == []
    assert [(o["action"], o["result"]) for o in remediation["outcomes"]] == [("lower_max_num_seqs", "worked")]
    assert remediation["outcomeConfidence"] == {"batch_misconfiguration": 1.0}
    # The fix stays in force, and the stanza's revision moves (a decision made on the old one is refused).
    assert remediation["overrides"] == status["remediation"]["overrides"] == {"maxNumSeqs": 128}
    assert remediation["revision"] == status["remediation"]["revision"] + 1
    [event] = judged.events
    assert (event.reason, event.warning) == ("RemediationOutcome", False)
    assert "lower_max_num_seqs for batch_misconfiguration" in event.message and "worked" in event.message


def test_a_fix_within_its_horizon_or_of_an_older_spec_is_not_judged() -> None:
    status = sampler_fix_status(NOW - 23 * HOUR)
    assert judge_elapsed_trials(typed_status(status), NOW, generation=3, horizon=24 * HOUR) is None
    assert (
        judge_elapsed_trials(typed_status(status), NOW + 2 * HOUR, generation=3, horizon=24 * HOUR)
        is not None
    )
    # A person changed the spec since the fix (generation 4): the trial is void, judged neither way.
    assert judge_elapsed_trials(typed_status(status), NOW + 2 * HOUR, generation=4, horizon=24 * HOUR) is None
    assert (
        judge_elapsed_trials(typed_status({"phase": "Ready"}), NOW, generation=3, horizon=24 * HOUR) is None
    )


def test_the_timer_looks_a_twelfth_of_the_horizon_apart_within_5_s_and_5_minutes() -> None:
    assert judging_interval(timedelta(days=1)) == 300.0
    assert judging_interval(timedelta(minutes=30)) == 150.0
    assert judging_interval(timedelta(minutes=1)) == 5.0
    settings = OperatorSettings(remediation_outcome_horizon_minutes=2)
    assert _outcomes.interval_seconds(settings) == 10.0


def test_the_timer_runs_for_models_with_fixes_of_their_current_spec_to_judge() -> None:
    status = sampler_fix_status(NOW)
    assert _outcomes.judging(typed_status(status), 3)
    assert not _outcomes.judging(typed_status(status), 4)  # the spec changed since: nothing to judge
    assert not _outcomes.judging(typed_status({"phase": "Ready"}), 3)


def test_the_timer_records_a_fix_that_held_in_status_an_event_and_the_metric(
    model: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[bool, str, str]] = []
    monkeypatch.setattr(
        _events, "event", lambda obj, *, warning, reason, message: events.append((warning, reason, message))
    )
    generation = model.model["metadata"]["generation"]
    model.model["status"] = sampler_fix_status(datetime.now(UTC) - 25 * HOUR, generation)
    worked = telemetry.REMEDIATION_OUTCOMES.labels("batch_misconfiguration", "lower_max_num_seqs", "worked")
    before = worked._value.get()
    _outcomes.judge_trials(copy.deepcopy(model.model), OperatorSettings(), LOG)
    remediation = model.model["status"]["remediation"]
    assert remediation["trials"] == []
    assert [(o["action"], o["result"]) for o in remediation["outcomes"]] == [("lower_max_num_seqs", "worked")]
    assert [(w, r) for w, r, _ in events] == [(False, "RemediationOutcome")]
    assert worked._value.get() == before + 1
    # Judged once: the next tick finds nothing open.
    _outcomes.judge_trials(copy.deepcopy(model.model), OperatorSettings(), LOG)
    assert worked._value.get() == before + 1 and len(events) == 1


def test_the_timer_never_overwrites_a_crash_decision_written_since_it_read_the_model(
    model: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    monkeypatch.setattr(_events, "event", lambda obj, *, warning, reason, message: events.append(reason))
    generation = model.model["metadata"]["generation"]
    model.model["status"] = sampler_fix_status(datetime.now(UTC) - 25 * HOUR, generation)
    seen = copy.deepcopy(model.model)  # what the timer's tick read
    model.model["status"]["remediation"]["revision"] += 1  # a crash's decision was written meanwhile
    model.model["status"]["remediation"]["handledCrashes"].append("uid-1/vllm/2")
    written = copy.deepcopy(model.model["status"])
    worked = telemetry.REMEDIATION_OUTCOMES.labels("batch_misconfiguration", "lower_max_num_seqs", "worked")
    before = worked._value.get()
    _outcomes.judge_trials(seen, OperatorSettings(), LOG)
    assert model.model["status"] == written, "the decision written meanwhile is kept whole"
    assert not events and worked._value.get() == before  # nothing said or counted for a write refused


def test_a_process_that_took_over_has_the_series_that_judge_an_open_fix_at_zero(
    model: FakeParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a hand-over the new process never applied the fix: its tick makes the outcome series (at 0)
    before the fix is judged, so the judgment is an increase Prometheus sees."""
    generation = model.model["metadata"]["generation"]
    model.model["status"] = sampler_fix_status(datetime.now(UTC) - HOUR, generation)  # within its horizon
    judged = ("batch_misconfiguration", "lower_max_num_seqs", "worked")
    if series_of(telemetry.REMEDIATION_OUTCOMES, judged):
        telemetry.REMEDIATION_OUTCOMES.remove(*judged)  # as in a process that did not apply the fix
    _outcomes.judge_trials(copy.deepcopy(model.model), OperatorSettings(), LOG)
    assert series_of(telemetry.REMEDIATION_OUTCOMES, judged)
    assert telemetry.REMEDIATION_OUTCOMES.labels(*judged)._value.get() == 0
    assert model.model["status"]["remediation"]["trials"], "nothing judged within the horizon"
