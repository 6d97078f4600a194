"""Turn violations into an admission answer, by each policy's enforcement.

- ``deny``: refused; the message has one line per violation, naming the policy, field and fix.
- ``warn``: admitted; each violation becomes an admission warning (kubectl prints it) and, in the
  operator, an Event.
- ``dryrun``: admitted; each violation is recorded (warning text marked "dryrun") so a platform team can
  see what a policy would refuse before turning it on. It changes nothing else.

A violation of a policy not in ``policies`` is treated as deny: failing closed is the safe reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loadline.api import FleetPolicy
from loadline.policy._evaluate import Violation

__all__ = ["AdmissionDecision", "decide"]


@dataclass(frozen=True)
class AdmissionDecision:
    """What admission answers for one object."""

    allowed: bool
    message: str  # the refusal, one line per deny violation (plus indented details); "" when allowed
    warnings: tuple[str, ...]  # admission warnings: warn and dryrun violations, one line each
    denied: tuple[Violation, ...] = ()
    warned: tuple[Violation, ...] = ()
    dry_run: tuple[Violation, ...] = ()


def _with_details(violation: Violation) -> str:
    return "\n".join([violation.line(), *(f"  - {d}" for d in violation.details)])


def decide(violations: Iterable[Violation], policies: Sequence[FleetPolicy]) -> AdmissionDecision:
    """The admission decision for ``violations`` under the enforcement of the governing ``policies``."""
    enforcement = {p.name: p.spec.enforcement for p in policies}
    denied: list[Violation] = []
    warned: list[Violation] = []
    dry: list[Violation] = []
    for violation in violations:
        mode = enforcement.get(violation.policy, "deny")
        {"deny": denied, "warn": warned, "dryrun": dry}[mode].append(violation)
    warnings = tuple(v.line() for v in warned) + tuple(f"dryrun: would refuse: {v.line()}" for v in dry)
    message = "\n".join(_with_details(v) for v in denied)
    return AdmissionDecision(not denied, message, warnings, tuple(denied), tuple(warned), tuple(dry))
