"""Which FleetPolicies govern an InferenceModel: Kubernetes label-selector semantics, nothing more.

A policy governs a model when every part of its selector that is set matches: the namespace is one of
``namespaces`` (empty: any), the namespace's labels match ``namespaceSelector`` and the model's labels
match ``modelSelector``. An empty selector (``{}``) matches everything, as in Kubernetes.

Offline (``loadline plan``) the namespace's labels are unknown unless a Namespace object is among the
files; callers pass ``None`` then, and a policy that needs them does not match (the CLI says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from loadline.api import FleetPolicy, LabelSelector, LabelSelectorRequirement, PolicySelector

__all__ = [
    "by_precedence",
    "describe_selector",
    "label_selector_matches",
    "needs_namespace_labels",
    "policy_governs",
    "select_policies",
]


def _requirement_holds(rule: LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    present = rule.key in labels
    if rule.operator == "In":
        return present and labels[rule.key] in rule.values
    if rule.operator == "NotIn":
        # Kubernetes: NotIn also matches objects that do not carry the label at all.
        return not present or labels[rule.key] not in rule.values
    if rule.operator == "Exists":
        return present
    return not present  # DoesNotExist


def label_selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy ``selector`` (unset or empty selector: always)."""
    if selector is None:
        return True
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    return all(_requirement_holds(rule, labels) for rule in selector.match_expressions)


def _selector_is_empty(selector: LabelSelector | None) -> bool:
    return selector is None or (not selector.match_labels and not selector.match_expressions)


def needs_namespace_labels(policy: FleetPolicy) -> bool:
    """Whether deciding if ``policy`` governs a model needs its namespace's labels."""
    return not _selector_is_empty(policy.spec.selector.namespace_selector)


def policy_governs(
    policy: FleetPolicy,
    model_namespace: str,
    namespace_labels: Mapping[str, str] | None,
    model_labels: Mapping[str, str],
) -> bool:
    """Whether ``policy`` governs a model in ``model_namespace`` carrying ``model_labels``.

    ``namespace_labels=None`` means "unknown": a policy with a non-empty namespaceSelector does not match.
    """
    selector = policy.spec.selector
    if selector.namespaces and model_namespace not in selector.namespaces:
        return False
    if needs_namespace_labels(policy):
        if namespace_labels is None:
            return False
        if not label_selector_matches(selector.namespace_selector, namespace_labels):
            return False
    return label_selector_matches(selector.model_selector, model_labels)


def by_precedence(policies: Iterable[FleetPolicy]) -> list[FleetPolicy]:
    """Highest ``priority`` first, ties by name: the order in which policies' defaults win."""
    return sorted(policies, key=lambda p: (-p.spec.priority, p.name))


def select_policies(
    policies: Iterable[FleetPolicy],
    model_namespace: str,
    namespace_labels: Mapping[str, str] | None,
    model_labels: Mapping[str, str] | None,
) -> list[FleetPolicy]:
    """The policies governing one model, in precedence order (see :func:`by_precedence`)."""
    labels = model_labels or {}
    return by_precedence(p for p in policies if policy_governs(p, model_namespace, namespace_labels, labels))


def _describe_labels(selector: LabelSelector) -> list[str]:
    parts = [f"{k}={v}" for k, v in sorted(selector.match_labels.items())]
    for rule in selector.match_expressions:
        values = ",".join(rule.values)
        parts.append(
            {
                "In": f"{rule.key} in ({values})",
                "NotIn": f"{rule.key} notin ({values})",
                "Exists": rule.key,
                "DoesNotExist": f"!{rule.key}",
            }[rule.operator]
        )
    return parts


def describe_selector(selector: PolicySelector) -> str:
    """The selector in one short line, for the ``Selector`` printer column (``status.selector``)."""
    parts = []
    if selector.namespaces:
        parts.append("ns=" + ",".join(selector.namespaces))
    if not _selector_is_empty(selector.namespace_selector):
        assert selector.namespace_selector is not None
        parts.append("ns:" + ",".join(_describe_labels(selector.namespace_selector)))
    if not _selector_is_empty(selector.model_selector):
        assert selector.model_selector is not None
        parts.append(",".join(_describe_labels(selector.model_selector)))
    return " ".join(parts) or "(all)"
