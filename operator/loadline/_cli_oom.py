"""``loadline classify INCIDENT.json``: the OOM classifier, offline.

Reads the same incident structure the operator builds, so a person can replay an incident (or a report
from the internet) and see exactly what the operator would conclude and propose.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from loadline._cli_input import read_json

__all__ = ["register"]


def _text(result: dict[str, Any]) -> str:
    lines = [f"class:       {result['class']} (confidence {result['confidence']:.2f})"]
    decided = result.get("decided_by")
    if decided:
        lines.append(f"decided by:  {decided['signal']}: {decided['evidence']}")
    else:
        lines.append("decided by:  nothing (the evidence does not decide)")
    lines.append("evidence:")
    lines += [f"  - {e}" for e in result["evidence"]]
    if result.get("caller_note"):
        lines += ["caller side:", f"  {result['caller_note']}"]
    rem = result["remediation"]
    lines += [f"remediation: {rem['action']}", f"  {rem['summary']}"]
    for change in rem["changes"]:
        lines.append(f"  {change['field']}: {change['old']} -> {change['new']}")
    for alt in rem["alternatives"]:
        lines.append(f"  or {alt['action']}: {alt['summary']}")
    for item in rem["look_at"]:
        lines.append(f"  look at: {item}")
    if rem["restart"]:
        lines.append("  (restarts the pod)")
    lines.append("class confidence (share of right diagnoses per class; basis: outcomes or corpus):")
    for cls, conf in result["class_confidence"].items():
        value = "not measured" if conf["value"] is None else f"{conf['value']:.2f}"
        what = "judged fixes on this model" if conf["basis"] == "outcomes" else "held-out corpus answers"
        mark = "  <-" if cls == result["class"] else ""
        lines.append(f"  {cls:<24} {value:<12} ({conf['basis']}: {conf['count']} {what}){mark}")
    return "\n".join(lines) + "\n"


def _cmd_classify(args: argparse.Namespace) -> int:
    from loadline.oom import diagnose, parse_incident, parse_outcomes

    incident = parse_incident(read_json(args.incident, "INCIDENT", "give a readable JSON file"))
    outcomes = None
    if args.outcomes is not None:
        outcomes = parse_outcomes(
            read_json(args.outcomes, "--outcomes", "give the JSON of status.remediation.outcomes")
        )
    result = diagnose(incident, outcomes)
    if args.output == "json":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        sys.stdout.write(_text(result))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``classify`` to the ``loadline`` command line."""
    p = sub.add_parser(
        "classify",
        help="classify an out-of-memory incident and propose a fix (offline)",
        description="Classify a vLLM out-of-memory incident (INCIDENT.json, see docs/oom.md) and propose "
        "a one-step remediation, exactly as the operator would.",
    )
    p.add_argument("incident", metavar="INCIDENT.json", help="the incident file, or - for standard input")
    p.add_argument("--output", "-o", choices=("text", "json"), default="text", help="output format")
    p.add_argument(
        "--outcomes",
        metavar="OUTCOMES.json",
        help="recorded remediation outcomes (status.remediation.outcomes): the per-class confidence is "
        "measured on them where they judged a class, else on the corpus",
    )
    p.set_defaults(func=_cmd_classify)
