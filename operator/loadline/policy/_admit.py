"""One model through its governing policies, as admission sees it: defaults, checks, decision.

The mutating and validating webhooks, and ``loadline plan``/``render`` offline, all call :func:`admit`
so a model is judged the same way wherever it is judged. ``adjust`` lets the CLI's ``--vllm-version``
replace the engine version after the defaults and before the checks (the version that will run is the
one judged).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loadline.api import FleetPolicy, InferenceModelSpec
from loadline.policy._combine import combine, enforced
from loadline.policy._decide import AdmissionDecision, decide
from loadline.policy._defaults import Fill, apply_defaults, fills
from loadline.policy._evaluate import Evaluation, PlanFn, check
from loadline.sizing import plan_inference_model

__all__ = ["Admission", "admit"]


@dataclass(frozen=True)
class Admission:
    """What the governing policies make of one model's spec."""

    spec: InferenceModelSpec  # with the enforcing policies' defaults filled in
    filled: tuple[Fill, ...]  # the defaults that were filled, each naming its policy
    evaluation: Evaluation  # violations against every governing policy, and the plan within them
    decision: AdmissionDecision  # allowed or refused, and the warnings kubectl prints
    dry_run_only: bool  # some governing policies are dryrun: they must not shape the plan


def admit(
    spec: InferenceModelSpec,
    governing: Sequence[FleetPolicy],
    plan_fn: PlanFn = plan_inference_model,
    adjust: Callable[[InferenceModelSpec], InferenceModelSpec] | None = None,
) -> Admission:
    """Judge ``spec`` under ``governing`` (already selected for the model's namespace and labels).

    Dryrun policies fill no defaults (they change nothing); every policy is checked, and the decision
    follows each one's enforcement. Errors that are not the policies' doing propagate as
    :func:`loadline.policy.check` says (an invalid spec, a model that fits no GPU at all)."""
    acting = combine(enforced(governing))
    filled = tuple(fills(spec, acting))
    spec = apply_defaults(spec, acting)
    if adjust is not None:
        spec = adjust(spec)
    evaluation = check(spec, combine(governing), plan_fn)
    decision = decide(evaluation.violations, governing)
    return Admission(spec, filled, evaluation, decision, len(acting.policies) != len(governing))
