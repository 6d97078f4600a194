"""Fleet policies, pure: which FleetPolicies govern a model, how they combine, the defaults they fill,
the violations they find and the admission decision. No Kubernetes here; the operator's webhooks and
reconcile, and ``loadline plan``/``render`` offline, all call these same functions:

    governing = select_policies(all_policies, namespace, namespace_labels, model_labels)
    effective = combine(governing)
    spec = apply_defaults(spec, combine(enforced(governing)))    # dryrun policies change nothing
    violations = evaluate(spec, effective, plan_fn)
    decision = decide(violations, governing)                     # allowed, message, warnings

(:func:`admit` does these steps for one model, as the webhooks and the CLI need them.)

See docs/policies.md.
"""

from loadline.policy._admit import Admission, admit
from loadline.policy._combine import (
    Bound,
    EffectivePolicy,
    canonical_gpu_type,
    combine,
    enforced,
    remediation_limits,
    restart_window_sets,
)
from loadline.policy._decide import AdmissionDecision, decide
from loadline.policy._defaults import Fill, apply_defaults, defaults_patch, fills
from loadline.policy._evaluate import (
    Evaluation,
    PlanFn,
    Violation,
    check,
    evaluate,
    image_allowed,
    normalize_image,
    planning_spec,
)
from loadline.policy._select import (
    by_precedence,
    describe_selector,
    label_selector_matches,
    needs_namespace_labels,
    policy_governs,
    select_policies,
)

__all__ = [
    "Admission",
    "AdmissionDecision",
    "Bound",
    "EffectivePolicy",
    "Evaluation",
    "Fill",
    "PlanFn",
    "Violation",
    "admit",
    "apply_defaults",
    "by_precedence",
    "canonical_gpu_type",
    "check",
    "combine",
    "decide",
    "defaults_patch",
    "describe_selector",
    "enforced",
    "evaluate",
    "fills",
    "image_allowed",
    "label_selector_matches",
    "needs_namespace_labels",
    "normalize_image",
    "planning_spec",
    "policy_governs",
    "remediation_limits",
    "restart_window_sets",
    "select_policies",
]
