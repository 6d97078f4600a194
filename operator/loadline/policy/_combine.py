"""Several FleetPolicies governing one model, combined into one :class:`EffectivePolicy`.

Limits combine so that the strictest wins: the intersection of GPU-type lists, of provider lists and
of version ranges, the smallest of maxima, and every registry list must be satisfied. Remediation
limits likewise (fewest actions, longest cool-down, highest confidence floor, smallest memory cap).
Defaults are taken field by field from the highest-priority policy that sets the field (ties by
name). Every combined value keeps the names of the policies that set it, so a refusal can say whose
limit it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Generic, TypeVar

from packaging.specifiers import SpecifierSet

from loadline.api import FleetPolicy, PolicyDefaults, RestartWindow
from loadline.errors import SpecError
from loadline.oom._policy import PolicyLimits as RemediationPolicyLimits
from loadline.policy._select import by_precedence
from loadline.sizing import find_gpu
from loadline.windows import PolicyWindow, parse_policy_windows

__all__ = [
    "Bound",
    "EffectivePolicy",
    "canonical_gpu_type",
    "combine",
    "enforced",
    "remediation_limits",
    "restart_window_sets",
]

T = TypeVar("T")

# Defaults a policy can set: (section of the spec, field). Data, so a new default is one line here
# plus its field in loadline.api.PolicyDefaults.
DEFAULT_FIELDS: tuple[tuple[str, str], ...] = (
    ("engine", "version"),
    ("engine", "image"),
    ("gpu", "types"),
    ("gpu", "max_gpus_per_replica"),
    ("gpu", "providers"),
    ("remediation", "mode"),
)


@dataclass(frozen=True)
class Bound(Generic[T]):
    """A combined limit and the policies that set it (for a maximum: those at the smallest value)."""

    value: T
    policies: tuple[str, ...]


def canonical_gpu_type(name: str) -> str:
    """The catalog's spelling of a GPU type (names and node-label products match case-insensitively);
    a name the catalog lacks is kept as written, so it simply never matches a planned GPU."""
    try:
        return find_gpu(name).name
    except SpecError:
        return name


@dataclass(frozen=True)
class EffectivePolicy:
    """Everything the governing policies ask of one model, combined. No policies: no limits at all."""

    policies: tuple[FleetPolicy, ...] = ()
    defaults: PolicyDefaults = field(default_factory=PolicyDefaults)
    default_sources: Mapping[str, str] = field(default_factory=dict)  # "spec.engine.version" → policy
    gpu_types: Bound[frozenset[str]] | None = None
    providers: Bound[frozenset[str]] | None = None  # where nodes may come from (spec.gpu.providers)
    max_gpus_per_replica: Bound[int] | None = None
    max_replicas: Bound[int] | None = None
    max_price_per_hour: Bound[float] | None = None
    max_model_len: Bound[int] | None = None
    vllm_versions: Bound[SpecifierSet] | None = None
    image_registries: tuple[Bound[tuple[str, ...]], ...] = ()  # an image must match one prefix of each
    max_cpu_offload_gib: Bound[float] | None = None
    max_actions_per_day: Bound[int] | None = None
    cooldown_minutes: Bound[int] | None = None
    min_confidence: Bound[float] | None = None
    max_memory_gib: Bound[float] | None = None
    restart_windows: tuple[Bound[tuple[RestartWindow, ...]], ...] = ()  # a restart must fit each set
    max_concurrent_restarts: Bound[int] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The governing policies' names, in precedence order."""
        return tuple(p.name for p in self.policies)

    def policy(self, name: str) -> FleetPolicy:
        """The governing policy called ``name``."""
        for candidate in self.policies:
            if candidate.name == name:
                return candidate
        raise KeyError(name)


def _tightest(
    policies: Iterable[FleetPolicy], get: Callable[[FleetPolicy], T | None], smallest: bool = True
) -> Bound[T] | None:
    """The smallest (or largest) value any policy sets, and every policy setting exactly that value."""
    values = [(value, p.name) for p in policies if (value := get(p)) is not None]
    if not values:
        return None
    pick = min if smallest else max
    best = pick(v for v, _ in values)  # type: ignore[type-var]
    return Bound(best, tuple(name for v, name in values if v == best))


def _defaults(ordered: list[FleetPolicy]) -> tuple[PolicyDefaults, dict[str, str]]:
    merged = PolicyDefaults()
    sources: dict[str, str] = {}
    for section, name in DEFAULT_FIELDS:
        for policy in ordered:
            value = getattr(getattr(policy.spec.defaults, section), name)
            if value is not None:
                setattr(getattr(merged, section), name, value)
                alias = type(getattr(merged, section)).model_fields[name].alias or name
                sources[f"spec.{section}.{alias}"] = policy.name
                break
    return merged, sources


def combine(policies: Iterable[FleetPolicy]) -> EffectivePolicy:
    """Combine the policies governing one model (any order; precedence is by priority, then name)."""
    ordered = by_precedence(policies)
    if not ordered:
        return EffectivePolicy()
    defaults, sources = _defaults(ordered)

    gpu_lists = [(p.name, p.spec.limits.gpu_types) for p in ordered if p.spec.limits.gpu_types is not None]
    gpu_types = None
    if gpu_lists:
        allowed = frozenset.intersection(
            *(frozenset(canonical_gpu_type(t) for t in types) for _, types in gpu_lists)
        )
        gpu_types = Bound(allowed, tuple(name for name, _ in gpu_lists))

    provider_lists = [
        (p.name, frozenset[str](p.spec.limits.providers))
        for p in ordered
        if p.spec.limits.providers is not None
    ]
    providers = None
    if provider_lists:
        common = frozenset.intersection(*(listed for _, listed in provider_lists))
        providers = Bound(common, tuple(name for name, _ in provider_lists))

    specifiers = [(p.name, p.spec.limits.specifier()) for p in ordered]
    version_sets = [(name, spec) for name, spec in specifiers if spec is not None]
    vllm_versions = None
    if version_sets:
        joined = SpecifierSet()
        for _, spec in version_sets:
            joined &= spec
        vllm_versions = Bound(joined, tuple(name for name, _ in version_sets))

    return EffectivePolicy(
        policies=tuple(ordered),
        defaults=defaults,
        default_sources=sources,
        gpu_types=gpu_types,
        providers=providers,
        max_gpus_per_replica=_tightest(ordered, lambda p: p.spec.limits.max_gpus_per_replica),
        max_replicas=_tightest(ordered, lambda p: p.spec.limits.max_replicas),
        max_price_per_hour=_tightest(ordered, lambda p: p.spec.limits.max_price_per_hour),
        max_model_len=_tightest(ordered, lambda p: p.spec.limits.max_model_len),
        vllm_versions=vllm_versions,
        image_registries=tuple(
            Bound(tuple(p.spec.limits.image_registries), (p.name,))
            for p in ordered
            if p.spec.limits.image_registries is not None
        ),
        max_cpu_offload_gib=_tightest(ordered, lambda p: p.spec.limits.max_cpu_offload_gi_b),
        max_actions_per_day=_tightest(ordered, lambda p: p.spec.remediation.max_actions_per_day),
        cooldown_minutes=_tightest(ordered, lambda p: p.spec.remediation.cooldown_minutes, smallest=False),
        min_confidence=_tightest(ordered, lambda p: p.spec.remediation.min_confidence, smallest=False),
        max_memory_gib=_tightest(ordered, lambda p: p.spec.remediation.max_memory_gi_b),
        restart_windows=tuple(
            Bound(tuple(p.spec.restarts.windows), (p.name,)) for p in ordered if p.spec.restarts.windows
        ),
        max_concurrent_restarts=_tightest(ordered, lambda p: p.spec.restarts.max_concurrent),
    )


def enforced(policies: Iterable[FleetPolicy]) -> list[FleetPolicy]:
    """The policies that change what runs (deny and warn). A dryrun policy only reports: its defaults
    and limits must not touch the spec or the plan, so combine these for defaulting and planning."""
    return [p for p in policies if p.spec.enforcement != "dryrun"]


def remediation_limits(
    effective: EffectivePolicy, fallback: RemediationPolicyLimits | None = None
) -> RemediationPolicyLimits:
    """The OOM remediation limits for one model: the policies' where they set them, else ``fallback``
    (the operator's environment settings, the cluster-wide fallback)."""
    base = fallback or RemediationPolicyLimits()
    return RemediationPolicyLimits(
        mode=effective.defaults.remediation.mode or base.mode,
        max_actions_per_day=(
            effective.max_actions_per_day.value
            if effective.max_actions_per_day is not None
            else base.max_actions_per_day
        ),
        cooldown=(
            timedelta(minutes=effective.cooldown_minutes.value)
            if effective.cooldown_minutes is not None
            else base.cooldown
        ),
        min_confidence=effective.min_confidence.value
        if effective.min_confidence is not None
        else base.min_confidence,
        max_memory_gib=effective.max_memory_gib.value
        if effective.max_memory_gib is not None
        else base.max_memory_gib,
        min_memory_raise=base.min_memory_raise,
    )


def restart_window_sets(effective: EffectivePolicy) -> list[tuple[str, list[PolicyWindow]]]:
    """Each policy's restart windows as :class:`loadline.windows.PolicyWindow` lists, with its name.

    Strictest wins here too: a restart is allowed only at a time inside some window of *every* set.
    """
    out = []
    for bound in effective.restart_windows:
        items = [w.model_dump(exclude_none=True) for w in bound.value]
        out.append((bound.policies[0], parse_policy_windows(items, f"FleetPolicy {bound.policies[0]}")))
    return out
