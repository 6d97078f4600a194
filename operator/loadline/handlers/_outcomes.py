"""Fixes judged on the clock: an applied fix whose horizon passed with no crash of its class worked.

The decision is :func:`loadline.oom.judge_elapsed_trials`; this writes it (guarded like a crash's
decision, so that the two never overwrite each other's remediation stanza), counts it in
``loadline_remediation_outcomes_total`` and posts its ``RemediationOutcome`` Events.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from loadline import telemetry
from loadline.api import InferenceModelStatus
from loadline.handlers import _events, _kube
from loadline.handlers._oom import write_decision
from loadline.oom import judge_elapsed_trials, judging_interval
from loadline.settings import OperatorSettings
from loadline.status import read_status

__all__ = ["interval_seconds", "judge_trials", "judging"]


def horizon(settings: OperatorSettings) -> timedelta:
    return timedelta(minutes=settings.remediation_outcome_horizon_minutes)


def interval_seconds(settings: OperatorSettings) -> float:
    """The timer's interval (:func:`loadline.oom.judging_interval` of the configured horizon)."""
    return judging_interval(horizon(settings))


def judging(status: InferenceModelStatus, generation: int | None) -> bool:
    """Whether the model has fixes waiting to be judged (the timer runs only for those): open trials
    made for its current spec (a spec change voids them; see :func:`loadline.oom.judge_elapsed_trials`)."""
    remediation = status.remediation
    return (
        remediation is not None and bool(remediation.trials) and remediation.observed_generation == generation
    )


def judge_trials(
    body: Mapping[str, Any], settings: OperatorSettings, logger: logging.Logger | kopf.Logger
) -> None:
    """Judge the model's trials whose horizon passed, and record what was judged."""
    meta = body["metadata"]
    status, now = read_status(body), datetime.now(UTC)
    for trial in [] if status.remediation is None else status.remediation.trials:
        # The series that will judge it, at 0, in this process too: one that took over from the process
        # that applied the fix (a hand-over, a restart) would otherwise show the judgment as the
        # series' first sample, which increase() and rate() do not see.
        telemetry.zero_trial(meta["namespace"], meta["name"], trial.oom_class, trial.action)
    judged = judge_elapsed_trials(status, now, generation=meta.get("generation"), horizon=horizon(settings))
    if judged is None:
        return
    try:
        write_decision(body, judged.changes)
    except _kube.Changed:
        return  # a crash's decision (or a spec change) came first: the next tick judges what it left
    for outcome in judged.outcomes:
        telemetry.REMEDIATION_OUTCOMES.labels(outcome.oom_class, outcome.action, outcome.result).inc()
    for said in judged.events:
        _events.event(body, warning=said.warning, reason=said.reason, message=said.message)
    logger.info(
        "%s/%s: %s held for %s: worked",
        meta["namespace"], meta["name"], ", ".join(o.action for o in judged.outcomes), horizon(settings),
    )  # fmt: skip
