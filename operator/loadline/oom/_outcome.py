"""Whether an applied remediation worked: the same class coming back within the horizon says it did not.

Pure. Every automatic fix opens a *trial* (its class, its action, when it was applied). A later crash
of the same class within the horizon judges it ``recurred``; a trial whose horizon passes without one
is ``worked``. Only a crash of an instance started after the fix counts against it: an instance started
before ran the old settings (the roll-out had not reached it), so its crash says nothing about the fix.
A crash of another class judges nothing (a different cause, not this fix's failure).

The outcomes then steer the next decision (a fix that did not work is not repeated:
:func:`loadline.oom._remediate.next_rung`) and say how often each class's diagnosis and fix held
(:func:`outcome_confidence`), which is the classifier's confidence measured on what happened.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from loadline.api import RemediationOutcome, RemediationTrial

__all__ = [
    "DEFAULT_HORIZON",
    "MAX_OUTCOMES",
    "Judgment",
    "failed_actions",
    "history_sentence",
    "judge_outcome",
    "judging_interval",
    "outcome_confidence",
]

#: How long a fix must hold before it counts as having worked (the operator's setting overrides it).
DEFAULT_HORIZON = timedelta(hours=24)
#: How many judged outcomes a model's status keeps (the newest).
MAX_OUTCOMES = 50


def judging_interval(horizon: timedelta) -> float:
    """Seconds between two looks at a model's open trials for the ones whose horizon passed: a twelfth
    of the horizon, between 5 s and 5 minutes. A fix is then judged ``worked`` at most that long after
    its horizon ends (5 minutes for the default day, 5 s for a one-minute horizon), and a fleet of
    models with open trials costs the operator at most one look per model every 5 s (short horizons)
    and one every 5 minutes for horizons of an hour or more."""
    return min(300.0, max(5.0, horizon.total_seconds() / 12))


@dataclass(frozen=True)
class Judgment:
    """The trials judged now and the ones still open."""

    outcomes: tuple[RemediationOutcome, ...]
    open: tuple[RemediationTrial, ...]


def judge_outcome(
    trials: Sequence[RemediationTrial],
    incident_class: str | None,
    now: datetime,
    horizon: timedelta,
    *,
    crash_started_at: datetime | None = None,
) -> Judgment:
    """Judge the open ``trials`` at ``now``, given the class of the incident seen now (None: no incident,
    a look at the clock only). ``crash_started_at``: when the crashed instance started; a crash of an
    instance older than a fix does not count against that fix."""
    judged: list[RemediationOutcome] = []
    still: list[RemediationTrial] = []
    for trial in trials:
        # Kubernetes states a container's start to the second: an instance started in the second the
        # fix was applied (a roll-out takes less) is read as started after it.
        applied = trial.applied_at.replace(microsecond=0)
        ran_the_fix = crash_started_at is None or crash_started_at >= applied
        if now - trial.applied_at <= horizon:
            if incident_class == trial.oom_class and ran_the_fix:
                judged.append(_outcome(trial, "recurred", now))
            else:
                still.append(trial)
        else:
            # The horizon passed without the class coming back (a recurrence would have closed it).
            judged.append(_outcome(trial, "worked", now))
    return Judgment(outcomes=tuple(judged), open=tuple(still))


def _outcome(trial: RemediationTrial, result: str, now: datetime) -> RemediationOutcome:
    return RemediationOutcome.model_validate(
        {
            "class": trial.oom_class,
            "action": trial.action,
            "result": result,
            "appliedAt": trial.applied_at,
            "judgedAt": now,
        }
    )


def failed_actions(outcomes: Iterable[RemediationOutcome], oom_class: str) -> set[str]:
    """The fixes for ``oom_class`` after which the class came back: not to be repeated."""
    return {o.action for o in outcomes if o.oom_class == oom_class and o.result == "recurred"}


def outcome_confidence(outcomes: Iterable[RemediationOutcome]) -> dict[str, float]:
    """Per class, the share of its judged fixes that worked: how often the diagnosis and its fix held.

    A class whose fixes keep failing is a class the classifier (or its fix) gets wrong on this model,
    whatever confidence the classifier stated for each incident.
    """
    worked: dict[str, int] = {}
    total: dict[str, int] = {}
    for outcome in outcomes:
        total[outcome.oom_class] = total.get(outcome.oom_class, 0) + 1
        worked[outcome.oom_class] = worked.get(outcome.oom_class, 0) + (outcome.result == "worked")
    return {cls: round(worked[cls] / n, 2) for cls, n in sorted(total.items())}


def history_sentence(outcomes: Iterable[RemediationOutcome], oom_class: str) -> str:
    """The fixes tried for ``oom_class`` and what became of each, for a person to read."""
    parts = [
        f"{o.action} (applied {o.applied_at:%Y-%m-%d %H:%M}Z, {o.result})"
        for o in outcomes
        if o.oom_class == oom_class
    ]
    return "; ".join(parts) or "none recorded"
