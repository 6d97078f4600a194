"""Out-of-memory incidents of vLLM pods: parse, classify, propose a fix. Pure; no Kubernetes here.

The operator builds an :class:`Incident` from what it observes (termination state, previous logs,
Prometheus, the rendered config and the plan); ``loadline classify INCIDENT.json`` builds the same
structure from a file. Both then call :func:`classify` and :func:`propose_remediation`, so they agree.

    incident = parse_incident(json.load(f))
    diagnosis = classify(incident)
    remediation = propose_remediation(diagnosis, incident)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from loadline.api import RemediationOutcome
from loadline.oom._classify import classify, start_up_phase
from loadline.oom._confidence import ClassConfidence, class_confidences, parse_outcomes
from loadline.oom._crash import (
    Crash,
    CrashDecision,
    CrashEvent,
    TrialsJudged,
    decide_crash,
    judge_elapsed_trials,
    remediation_in_force,
)
from loadline.oom._model import (
    CAUSES,
    AllocatorFigures,
    Change,
    Config,
    Diagnosis,
    Incident,
    Metrics,
    OomClass,
    Option,
    Plan,
    Remediation,
)
from loadline.oom._outcome import judging_interval
from loadline.oom._parse import parse_oom_text
from loadline.oom._remediate import propose_remediation
from loadline.oom._schema import parse_incident
from loadline.oom._seen import SeenCrashes

__all__ = [
    "CAUSES",
    "AllocatorFigures",
    "Change",
    "ClassConfidence",
    "Config",
    "Crash",
    "CrashDecision",
    "CrashEvent",
    "Diagnosis",
    "Incident",
    "Metrics",
    "OomClass",
    "Option",
    "Plan",
    "Remediation",
    "SeenCrashes",
    "TrialsJudged",
    "class_confidences",
    "classify",
    "decide_crash",
    "diagnose",
    "judge_elapsed_trials",
    "judging_interval",
    "parse_incident",
    "parse_oom_text",
    "parse_outcomes",
    "propose_remediation",
    "remediation_in_force",
    "start_up_phase",
]


def diagnose(incident: Incident, outcomes: Iterable[RemediationOutcome] | None = None) -> dict[str, Any]:
    """Classification and proposal in the JSON shape of ``loadline classify --output json``.

    ``class_confidence`` gives, per class, the share of right diagnoses from ``outcomes`` (fixes judged
    on this model) where they judged that class, else the corpus's measured precision, each saying which.
    """
    diagnosis = classify(incident)
    result = diagnosis.to_dict()
    result["remediation"] = propose_remediation(diagnosis, incident).to_dict()
    if diagnosis.figures is not None:
        result["allocator"] = diagnosis.figures.to_dict()
    result["class_confidence"] = {cls: conf.to_dict() for cls, conf in class_confidences(outcomes).items()}
    return result
