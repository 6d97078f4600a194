"""Judge one InferenceModel spec against the policies governing it.

Pure: the planner comes in as ``plan_fn`` (the operator passes one that knows ConfigMap and hub
configs and the cluster's free GPUs; the CLI passes :func:`loadline.sizing.plan_inference_model`).
The planner is run *within* the policies' limits (only allowed GPU types and providers, at most the
allowed GPUs per replica), so "no allowed GPU type fits" is a violation listing each candidate's
reason. Each violation names one policy, the spec field, the limit and the fix, one line each; a
model breaking several policies gets one violation per policy.

Call it on the spec after :func:`loadline.policy.apply_defaults`, as admission does (mutating webhooks
run before validating ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

from packaging.version import InvalidVersion, Version

from loadline.api import FleetPolicy, InferenceModelSpec, Provider
from loadline.errors import NoCapacityError, NoFeasiblePlanError
from loadline.policy._combine import EffectivePolicy, canonical_gpu_type
from loadline.render import default_image
from loadline.sizing import Plan, gpu_catalog, plan_inference_model, shapes_for

__all__ = [
    "Evaluation",
    "PlanFn",
    "Violation",
    "check",
    "evaluate",
    "image_allowed",
    "normalize_image",
    "planning_spec",
]

PlanFn = Callable[[InferenceModelSpec], Plan]

#: Every provider ``spec.gpu.providers`` may name, in the API's order (a spec listing none: any of them).
ALL_PROVIDERS: tuple[str, ...] = get_args(Provider)


@dataclass(frozen=True)
class Violation:
    """One way a model breaks one policy. ``str()`` is the one line users see."""

    policy: str
    field: str  # e.g. "spec.replicas"
    problem: str  # what is wrong, quoting the limit
    fix: str
    details: tuple[str, ...] = ()  # e.g. each rejected GPU candidate and why

    def line(self) -> str:
        return f"FleetPolicy {self.policy}: {self.field}: {self.problem} (fix: {self.fix})"

    def __str__(self) -> str:
        return self.line()


@dataclass(frozen=True)
class Evaluation:
    """The violations, and the plan made within the policies' limits (``None`` if none could be made)."""

    violations: tuple[Violation, ...]
    plan: Plan | None
    planned_spec: InferenceModelSpec


def normalize_image(image: str) -> str:
    """``image`` with its registry spelled out, as a container runtime resolves it:
    ``vllm/vllm-openai:v1`` → ``docker.io/vllm/vllm-openai:v1``, ``ubuntu`` → ``docker.io/library/ubuntu``."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if sep else f"docker.io/library/{image}"


def _prefix_matches(image: str, prefix: str) -> bool:
    if not image.startswith(prefix):
        return False
    # "registry.example.com" must not admit "registry.example.com.evil.io/…".
    return prefix.endswith("/") or len(image) == len(prefix) or image[len(prefix)] in "/:@"


def image_allowed(image: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    """Whether ``image`` starts with one of ``prefixes`` (as written, or with its registry spelled out)."""
    full = normalize_image(image)
    return any(_prefix_matches(image, p) or _prefix_matches(full, p) for p in prefixes)


def _canon(types: list[str]) -> list[str]:
    return [canonical_gpu_type(t) for t in types]


def _catalog_order(types: frozenset[str] | set[str]) -> list[str]:
    """GPU types in the catalog's order (cheapest first as shipped), unknown names last."""
    known = [t for t in gpu_catalog() if t in types]
    return known + sorted(t for t in types if t not in known)


def _provider_order(providers: frozenset[str] | set[str]) -> list[str]:
    """Providers in the API's order (aws, gcp, azure, onprem)."""
    return [p for p in ALL_PROVIDERS if p in providers]


def _offers(provider: str, types: list[str]) -> bool:
    """Whether the catalog has a ``provider`` node shape of one of ``types``."""
    catalog = gpu_catalog()
    return any(s.provider == provider for t in types if t in catalog for s in shapes_for(catalog[t]))


def _permitted_types(eff: EffectivePolicy) -> list[str]:
    """The GPU types the policies allow, in the catalog's order (no gpuTypes limit: the catalog)."""
    return _catalog_order(eff.gpu_types.value) if eff.gpu_types else list(gpu_catalog())


def _offered_types(providers: list[str], eff: EffectivePolicy) -> list[str]:
    """The allowed GPU types of which ``providers`` have a node shape in the catalog."""
    return [t for t in _permitted_types(eff) if any(_offers(p, [t]) for p in providers)]


def _provider_fix(spec: InferenceModelSpec, eff: EffectivePolicy, own: set[str]) -> str:
    """The fix for listing a provider outside the limit: the allowed providers that have node shapes
    of a GPU type the model may be planned on (so following it can plan), else what to change too."""
    allowed = _provider_order(eff.providers.value if eff.providers else own)
    if not allowed:
        return "ask the platform team: no provider is allowed"
    permitted = _permitted_types(eff)
    wanted = _canon(spec.gpu.types) if spec.gpu.types else permitted
    types = [t for t in wanted if t in permitted] or wanted
    serving = [p for p in allowed if _offers(p, types)]
    if serving:
        return f"use only {', '.join(serving)}"
    offered = _offered_types(allowed, eff)
    if offered:
        types_text = ", ".join(offered)
        return f"use only {', '.join(allowed)}, with a GPU type they offer in spec.gpu.types ({types_text})"
    return "ask the platform team: the allowed providers offer no allowed GPU type"


def _unreachable_fix(planned: InferenceModelSpec, eff: EffectivePolicy) -> str:
    """The fix when no layout fits within the allowed providers: when none of them has a node shape of
    the GPU types planned on, other types (that they do offer); else the usual remedies."""
    usual = "quantize, lower maxModelLen or concurrency, or ask the platform team to allow another provider"
    types = _canon(planned.gpu.types)
    if not types or any(_offers(p, types) for p in planned.gpu.providers):
        return usual
    offered = _offered_types(list(planned.gpu.providers), eff)
    if not offered:
        return usual
    where = ", ".join(planned.gpu.providers)
    return (
        f"list GPU types with {where} node shapes in spec.gpu.types ({', '.join(offered)}), "
        "or ask the platform team to allow another provider"
    )


def planning_spec(spec: InferenceModelSpec, effective: EffectivePolicy) -> InferenceModelSpec:
    """``spec`` as the planner should see it under the policies: GPU types narrowed to the allowed ones
    (a spec listing none gets the allowed catalog types), providers likewise (a spec listing none gets
    the allowed providers) and GPUs per replica capped.

    When nothing allowed is left the spec's own types (or providers) are kept: planning then shows what
    was asked for, and :func:`check` reports the violation.
    """
    gpu = spec.gpu
    update: dict[str, object] = {}
    if effective.gpu_types is not None:
        allowed = effective.gpu_types.value
        wanted = _canon(gpu.types) if gpu.types else list(gpu_catalog())
        narrowed = [t for t in wanted if t in allowed]
        if narrowed and narrowed != _canon(gpu.types):
            update["types"] = narrowed
    if effective.providers is not None:
        where = list(gpu.providers) if gpu.providers else list(ALL_PROVIDERS)
        within = [p for p in where if p in effective.providers.value]
        if within and within != list(gpu.providers):
            update["providers"] = within
    if effective.max_gpus_per_replica is not None:
        cap = effective.max_gpus_per_replica.value
        if gpu.max_gpus_per_replica is None or gpu.max_gpus_per_replica > cap:
            update["max_gpus_per_replica"] = cap
    if not update:
        return spec
    return spec.model_copy(update={"gpu": gpu.model_copy(update=update)})


def _fmt(value: float) -> str:
    return f"{value:g}"


def _static_checks(spec: InferenceModelSpec, policy: FleetPolicy, eff: EffectivePolicy) -> list[Violation]:
    """Checks that need no plan, for one policy; fixes quote the combined limit so each line is enough."""
    checks = (_gpu_checks, _size_checks, _engine_checks, _offload_checks)  # in the order they are reported
    return [violation for check in checks for violation in check(spec, policy, eff)]


def _gpu_checks(spec: InferenceModelSpec, policy: FleetPolicy, eff: EffectivePolicy) -> list[Violation]:
    """The GPU types, providers and GPUs per replica the policy allows."""
    lim, name, out = policy.spec.limits, policy.name, []
    if lim.gpu_types is not None and spec.gpu.types:
        own = set(_canon(lim.gpu_types))
        outside = [t for t in _canon(spec.gpu.types) if t not in own]
        if outside:
            allowed = _catalog_order(eff.gpu_types.value if eff.gpu_types else own)
            fix = f"use only {', '.join(allowed)}" if allowed else "ask the platform team: no type is allowed"
            out.append(
                Violation(
                    name,
                    "spec.gpu.types",
                    f"{', '.join(outside)} not in gpuTypes [{', '.join(lim.gpu_types)}]",
                    fix,
                )
            )
    elif lim.gpu_types is not None and eff.gpu_types is not None and not eff.gpu_types.value:
        out.append(
            Violation(
                name,
                "spec.gpu.types",
                f"the governing policies ({', '.join(eff.gpu_types.policies)}) allow no GPU type in common",
                "ask the platform team to reconcile their gpuTypes",
            )
        )
    if lim.providers is not None and spec.gpu.providers:
        own_providers: set[str] = set(lim.providers)
        elsewhere = [p for p in spec.gpu.providers if p not in own_providers]
        if elsewhere:
            out.append(
                Violation(
                    name,
                    "spec.gpu.providers",
                    f"{', '.join(elsewhere)} not in providers [{', '.join(lim.providers)}]",
                    _provider_fix(spec, eff, own_providers),
                )
            )
    elif lim.providers is not None and eff.providers is not None and not eff.providers.value:
        out.append(
            Violation(
                name,
                "spec.gpu.providers",
                f"the governing policies ({', '.join(eff.providers.policies)}) allow no provider in common",
                "ask the platform team to reconcile their providers",
            )
        )
    cap = lim.max_gpus_per_replica
    asked = spec.gpu.max_gpus_per_replica
    if cap is not None and asked is not None and asked > cap:
        best = eff.max_gpus_per_replica.value if eff.max_gpus_per_replica else cap
        out.append(
            Violation(
                name,
                "spec.gpu.maxGPUsPerReplica",
                f"{asked} exceeds maxGPUsPerReplica {cap}",
                f"set it to {best} or less",
            )
        )
    return out


def _size_checks(spec: InferenceModelSpec, policy: FleetPolicy, eff: EffectivePolicy) -> list[Violation]:
    """The replicas (and the autoscaler's ceiling) and context length the policy allows."""
    lim, name, out = policy.spec.limits, policy.name, []
    if lim.max_replicas is not None and spec.replicas > lim.max_replicas:
        best = eff.max_replicas.value if eff.max_replicas else lim.max_replicas
        out.append(
            Violation(
                name,
                "spec.replicas",
                f"{spec.replicas} exceeds maxReplicas {lim.max_replicas}",
                f"set spec.replicas to {best} or fewer",
            )
        )
    scaling = spec.autoscaling
    if lim.max_replicas is not None and scaling is not None and scaling.max_replicas > lim.max_replicas:
        best = eff.max_replicas.value if eff.max_replicas else lim.max_replicas
        out.append(
            Violation(
                name,
                "spec.autoscaling.maxReplicas",
                f"{scaling.max_replicas} exceeds maxReplicas {lim.max_replicas}",
                f"set spec.autoscaling.maxReplicas to {best} or fewer",
            )
        )
    if (
        lim.max_model_len is not None
        and spec.max_model_len is not None
        and spec.max_model_len > lim.max_model_len
    ):
        best = eff.max_model_len.value if eff.max_model_len else lim.max_model_len
        out.append(
            Violation(
                name,
                "spec.maxModelLen",
                f"{spec.max_model_len} exceeds maxModelLen {lim.max_model_len}",
                f"set spec.maxModelLen to {best} or less",
            )
        )
    return out


def _engine_checks(spec: InferenceModelSpec, policy: FleetPolicy, eff: EffectivePolicy) -> list[Violation]:
    """The vLLM versions and image registries the policy allows."""
    lim, name, out = policy.spec.limits, policy.name, []
    specifier = lim.specifier()
    if specifier is not None:
        version = spec.engine.version
        combined = str(eff.vllm_versions.value) if eff.vllm_versions else str(specifier)
        try:
            allowed_version = specifier.contains(Version(version))
            problem = f"vLLM {version} is outside vllmVersions '{lim.vllm_versions}'"
        except InvalidVersion:
            allowed_version = False
            problem = (
                f"{version!r} is not a PEP 440 version, so vllmVersions '{lim.vllm_versions}' cannot admit it"
            )
        if not allowed_version:
            out.append(
                Violation(name, "spec.engine.version", problem, f"use a vLLM version matching '{combined}'")
            )
    if lim.image_registries is not None:
        image = spec.engine.image or default_image(spec.engine.version)
        if not image_allowed(image, lim.image_registries):
            what = image if spec.engine.image else f"the default image {image}"
            prefixes = ", ".join(lim.image_registries)
            out.append(
                Violation(
                    name,
                    "spec.engine.image",
                    f"{what} is not from imageRegistries [{prefixes}]",
                    f"set spec.engine.image to an image under {prefixes}",
                )
            )
    return out


def _offload_checks(spec: InferenceModelSpec, policy: FleetPolicy, eff: EffectivePolicy) -> list[Violation]:
    """The CPU KV offload (host memory per replica) the policy allows."""
    lim, name, out = policy.spec.limits, policy.name, []
    offload = spec.kv_offload.cpu_gi_b if spec.kv_offload else None
    cap_gib = lim.max_cpu_offload_gi_b
    if cap_gib is not None and offload is not None and offload > cap_gib:
        best_gib = eff.max_cpu_offload_gib.value if eff.max_cpu_offload_gib else cap_gib
        out.append(
            Violation(
                name,
                "spec.kvOffload.cpuGiB",
                f"{_fmt(offload)} GiB exceeds maxCpuOffloadGiB {_fmt(cap_gib)}",
                f"set spec.kvOffload.cpuGiB to {_fmt(best_gib)} or less",
            )
        )
    return out


def _plan_checks(
    spec: InferenceModelSpec, plan: Plan, policy: FleetPolicy, eff: EffectivePolicy
) -> list[Violation]:
    """Checks of the plan made within the limits: the served context length and the price."""
    lim, name, out = policy.spec.limits, policy.name, []
    served = plan.settings.max_model_len
    if lim.max_model_len is not None and spec.max_model_len is None and served > lim.max_model_len:
        best = eff.max_model_len.value if eff.max_model_len else lim.max_model_len
        out.append(
            Violation(
                name,
                "spec.maxModelLen",
                f"unset, so the model's own {served} is served, over maxModelLen {lim.max_model_len}",
                f"set spec.maxModelLen to {best} or less",
            )
        )
    if lim.max_price_per_hour is not None:
        per_replica = plan.chosen.price_per_hour
        # The most replicas the model may run: an autoscaler may take it up to maxReplicas at any time.
        scaling = spec.autoscaling
        most_replicas = max(spec.replicas, scaling.max_replicas) if scaling is not None else spec.replicas
        field = "spec.autoscaling.maxReplicas" if most_replicas > spec.replicas else "spec.replicas"
        total = per_replica * most_replicas
        if total > lim.max_price_per_hour + 1e-9:
            budget = eff.max_price_per_hour.value if eff.max_price_per_hour else lim.max_price_per_hour
            most = math.floor(budget / per_replica + 1e-9) if per_replica > 0 else most_replicas
            basis = plan.price_basis
            problem = (
                f"{most_replicas} × {plan.chosen.label} at ${per_replica:.2f}/h = ${total:.2f}/h exceeds "
                f"maxPricePerHour {_fmt(lim.max_price_per_hour)}"
                + (f"; per replica {basis}" if basis else "")
            )
            if most >= 1:
                out.append(Violation(name, field, problem, f"set {field} to {most} or fewer"))
            else:
                shared = " or unset spec.gpu.dedicatedNodes (pay a share of each node)"
                out.append(
                    Violation(
                        name,
                        "spec.gpu.types",
                        problem,
                        "make one replica cheaper: quantize, or lower maxModelLen or concurrency so a "
                        "cheaper GPU fits" + (shared if spec.gpu.dedicated_nodes else ""),
                    )
                )
    return out


def _restricting(policy: FleetPolicy, spec: InferenceModelSpec, planned: InferenceModelSpec) -> str | None:
    """The field to name when ``policy``'s GPU limits are among those that narrowed ``spec`` into
    ``planned``: ``spec.gpu.types`` for GPU types or GPUs per replica, ``spec.gpu.providers`` when only
    its providers did; ``None`` when it narrowed nothing."""
    lim = policy.spec.limits
    if lim.gpu_types is not None:
        own = set(_canon(lim.gpu_types))
        if any(t not in own for t in (_canon(spec.gpu.types) or list(gpu_catalog()))):
            return "spec.gpu.types"
    cap = lim.max_gpus_per_replica
    asked = spec.gpu.max_gpus_per_replica
    if cap is not None and (asked is None or asked > cap) and planned.gpu.max_gpus_per_replica == cap:
        return "spec.gpu.types"
    if lim.providers is not None and any(p not in lim.providers for p in spec.gpu.providers or ALL_PROVIDERS):
        return "spec.gpu.providers"
    return None


def check(
    spec: InferenceModelSpec, effective: EffectivePolicy, plan_fn: PlanFn = plan_inference_model
) -> Evaluation:
    """Every violation of ``spec`` against the governing policies, and the plan within their limits.

    Errors that are not the policies' doing propagate as before: an invalid spec (:class:`SpecError`),
    a model that fits no GPU even without the policies (:class:`NoFeasiblePlanError`), no free GPUs
    (:class:`NoCapacityError`).
    """
    violations = [v for p in effective.policies for v in _static_checks(spec, p, effective)]
    planned = planning_spec(spec, effective)
    if not effective.policies:
        return Evaluation((), plan_fn(spec), spec)
    # A refused list the policies cannot narrow to anything allowed: planning would only plan what is refused.
    types_refused = (
        any(v.field == "spec.gpu.types" for v in violations) and planned.gpu.types == spec.gpu.types
    )
    providers_refused = (
        any(v.field == "spec.gpu.providers" for v in violations)
        and planned.gpu.providers == spec.gpu.providers
    )
    plan = None
    if not (types_refused or providers_refused):
        try:
            plan = plan_fn(planned)
        except NoCapacityError:
            raise
        except NoFeasiblePlanError as exc:
            if planned is spec:
                raise
            plan_fn(spec)  # fits without the policies? If not, that error is the one to report.
            limit_words = []
            if planned.gpu.types != spec.gpu.types:
                limit_words.append(f"GPU types {', '.join(planned.gpu.types)}")
            if planned.gpu.max_gpus_per_replica != spec.gpu.max_gpus_per_replica:
                limit_words.append(f"at most {planned.gpu.max_gpus_per_replica} GPUs per replica")
            if planned.gpu.providers != spec.gpu.providers:
                limit_words.append(f"providers {', '.join(planned.gpu.providers)}")
            problem = (
                f"no allowed GPU layout fits ({' and '.join(limit_words)}); each candidate's reason follows"
            )
            # The planner's own fixes name an online quantization that fits within the allowance.
            method = next((f["quantization"] for f in exc.fixes if "quantization" in f), None)
            quantize = (
                f"set spec.quantization: {method} (its weights fit within it)" if method else "quantize"
            )
            fixes = {
                "spec.gpu.types": f"{quantize}, lower maxModelLen or concurrency, or ask the platform team "
                "for a larger GPU allowance",
                "spec.gpu.providers": _unreachable_fix(planned, effective),
            }
            for p in effective.policies:
                field = _restricting(p, spec, planned)
                if field is not None:
                    violations.append(Violation(p.name, field, problem, fixes[field], tuple(exc.rejections)))
    if plan is not None:
        violations.extend(v for p in effective.policies for v in _plan_checks(spec, plan, p, effective))
    order = {name: i for i, name in enumerate(effective.names)}
    violations.sort(key=lambda v: order.get(v.policy, len(order)))
    return Evaluation(tuple(violations), plan, planned)


def evaluate(
    spec: InferenceModelSpec, effective: EffectivePolicy, plan_fn: PlanFn = plan_inference_model
) -> list[Violation]:
    """The violations of ``spec`` against the governing policies (see :func:`check`)."""
    return list(check(spec, effective, plan_fn).violations)
