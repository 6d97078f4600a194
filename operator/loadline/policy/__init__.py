"""Fleet policies, pure: which FleetPolicies govern a model, how they combine, the defaults they fill,
the violations they find and the admission decision. No Kubernetes here; the operator's webhooks and
reconcile, and ``loadline plan``/``render`` offline, all call these same functions:

    governing = select_policies(all_policies, namespace, namespace_labels, model_labels)
    effective = combine(governing)
    spec = apply_defaults(spec, combine(enforced(governing)))    # dryrun policies change nothing
    violations = evaluate(spec, effective, plan_fn)
    decision = decide(violations, governing)                     # allowed, message, warnings

(:func:`admit` does these steps for one model, as the webhooks and the CLI need them.)

Before any of it, :func:`spec_problems` lists what the spec alone decides (a GPU type the catalog
lacks, ``extraArgs`` the version refuses) and what the operator's safe defaults refuse without any
policy (:class:`Guard`: images, environment names, code-running flags); :func:`refused_now` says by
an error's type whether admission refuses it or only warns.

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
from loadline.policy._counts import policy_counts
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
from loadline.policy._guard import (
    DEFERRED,
    Guard,
    allowed_code_flags,
    denied_env,
    refused_now,
    spec_problems,
    vllm_registries,
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
    "DEFERRED",
    "Admission",
    "AdmissionDecision",
    "Bound",
    "EffectivePolicy",
    "Evaluation",
    "Fill",
    "Guard",
    "PlanFn",
    "Violation",
    "admit",
    "allowed_code_flags",
    "apply_defaults",
    "by_precedence",
    "canonical_gpu_type",
    "check",
    "combine",
    "decide",
    "defaults_patch",
    "denied_env",
    "describe_selector",
    "enforced",
    "evaluate",
    "fills",
    "image_allowed",
    "label_selector_matches",
    "needs_namespace_labels",
    "normalize_image",
    "planning_spec",
    "policy_counts",
    "policy_governs",
    "refused_now",
    "remediation_limits",
    "restart_window_sets",
    "select_policies",
    "spec_problems",
    "vllm_registries",
]
