"""FleetPolicies offline: ``loadline plan`` and ``loadline render`` govern the InferenceModels of their
files with the FleetPolicies among them exactly as admission does in the cluster.

Deny refusals are collected over every model, so one run names every problem; the command then exits
2 with one line per violation. Before the policies' limits, each model gets the refusals admission
gives whatever the policies say (:func:`loadline.policy.spec_problems`: what the spec alone decides,
and the operator's safe defaults as ``LOADLINE_IMAGE_REGISTRIES``, ``LOADLINE_ALLOWED_ENV`` and
``LOADLINE_DENIED_ENV`` set them, the chart's ``settings`` of the same names; unset: the chart's
defaults). Warn and dryrun violations go to standard error as warnings. What
offline use cannot know is said, not guessed: namespace labels (needed by a policy's
``namespaceSelector``) are known only from Namespace objects among the files.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from loadline.api import FleetPolicy, InferenceModel, InferenceModelSpec, Manifests
from loadline.errors import LoadlineError
from loadline.policy import (
    Guard,
    PlanFn,
    admit,
    apply_defaults,
    combine,
    describe_selector,
    enforced,
    needs_namespace_labels,
    planning_spec,
    policy_governs,
    select_policies,
    spec_problems,
)
from loadline.sizing import Plan, plan_inference_model


class PolicyRefusal(LoadlineError):
    """Deny-mode FleetPolicies, or what admission refuses whatever the policies say, refuse one or more
    InferenceModels; ``lines`` name the field and the fix (and the policy, for a policy's refusal)."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


@dataclass(frozen=True)
class Governed:
    """One InferenceModel after its policies: defaults filled, planned within their limits."""

    source: str
    obj: InferenceModel
    plan: Plan
    policies: tuple[FleetPolicy, ...]
    notes: tuple[str, ...]  # defaults filled, for the plan table

    @property
    def name(self) -> str:
        meta = self.obj.metadata
        return f"{meta.get('namespace') or 'default'}/{meta.get('name', '?')}"


def _unknown_labels_note(policy: FleetPolicy, obj: InferenceModel, namespace: str) -> str | None:
    """Say so when only the namespace's unknown labels keep ``policy`` from governing ``obj``."""
    if not needs_namespace_labels(policy):
        return None
    labels = obj.metadata.get("labels") or {}
    probe = policy.model_copy(deep=True)
    probe.spec.selector.namespace_selector = None
    if not policy_governs(probe, namespace, {}, labels):
        return None
    return (
        f"FleetPolicy {policy.name} selects namespaces by label and the labels of namespace {namespace} "
        f"are unknown offline, so it is not applied to {namespace}/{obj.metadata.get('name', '?')} "
        "(fix: add the Namespace object to the files)"
    )


def env_guard(environ: Mapping[str, str] | None = None) -> Guard:
    """The operator's safe defaults as the environment sets them (the chart's values become these)."""
    env = os.environ if environ is None else environ
    return Guard.from_text(
        env.get("LOADLINE_IMAGE_REGISTRIES", ""),
        env.get("LOADLINE_ALLOWED_ENV", ""),
        env.get("LOADLINE_DENIED_ENV", ""),
    )


def govern(
    manifests: Manifests,
    *,
    err: TextIO | None = None,
    vllm_version: str | None = None,
    guard: Guard | None = None,
    plan_fn: PlanFn = plan_inference_model,
) -> list[Governed]:
    """Apply the files' FleetPolicies to the files' InferenceModels, as admission would.

    Prints warnings and notes to ``err`` (standard error); raises :class:`PolicyRefusal` naming every
    deny violation. ``vllm_version`` (``render --vllm-version``) replaces the engine version after the
    defaults, before the checks: the version that will run is the one judged. ``plan_fn``: the
    planner (``plan --observations`` passes one with learned corrections).
    """
    out_err = err or sys.stderr
    guard = guard if guard is not None else env_guard()
    refusals: list[str] = []
    governed: list[Governed] = []
    warned: set[str] = set()
    for source, obj in manifests.models:
        try:
            model = _govern_one(manifests, source, obj, out_err, warned, vllm_version, guard, plan_fn)
        except LoadlineError as exc:  # the core names the field; say which file and object
            raise exc.at(f"{source}: {where(obj)}") from None
        if isinstance(model, Governed):
            governed.append(model)
        else:
            refusals.extend(model)
    if refusals:
        raise PolicyRefusal(refusals)
    return governed


def where(obj: InferenceModel) -> str:
    """``InferenceModel team-a/chat``, for error lines."""
    meta = obj.metadata
    return f"InferenceModel {meta.get('namespace') or 'default'}/{meta.get('name', '?')}"


def _govern_one(
    manifests: Manifests,
    source: str,
    obj: InferenceModel,
    out_err: TextIO,
    warned: set[str],
    vllm_version: str | None,
    guard: Guard,
    plan_fn: PlanFn = plan_inference_model,
) -> Governed | list[str]:
    """One model governed, or the lines of its refusal."""
    namespace = str(obj.metadata.get("namespace") or "default")
    labels = obj.metadata.get("labels") or {}
    ns_labels = manifests.namespaces.get(namespace)
    if ns_labels is None:
        for policy in manifests.policies:
            note = _unknown_labels_note(policy, obj, namespace)
            if note and note not in warned:
                warned.add(note)
                print(f"loadline: note: {note}", file=out_err)
    policies = select_policies(manifests.policies, namespace, ns_labels, labels)
    adjust = None
    if vllm_version is not None:
        version = vllm_version

        def adjust(spec: InferenceModelSpec) -> InferenceModelSpec:
            return spec.model_copy(update={"engine": spec.engine.model_copy(update={"version": version})})

    name = f"{namespace}/{obj.metadata.get('name', '?')}"
    # What admission refuses whatever the policies say, judged on the spec as it would be stored
    # (the policies' defaults filled in) and for the version that will run.
    defaulted = apply_defaults(obj.spec, combine(enforced(policies)))
    problems = spec_problems(defaulted if adjust is None else adjust(defaulted), guard, policies)
    if problems:  # one line each, as an error of the core is reported (file, object, field, fix)
        return [f"{source}: {where(obj)}: {p}" for p in problems]
    admission = admit(obj.spec, policies, adjust=adjust, plan_fn=plan_fn)
    spec, decision = admission.spec, admission.decision
    notes = tuple(f"{f.path} = {f.value} (default of FleetPolicy {f.policy})" for f in admission.filled)
    for warning in decision.warnings:
        print(f"loadline: warning: {name}: {warning}", file=out_err)
    if not decision.allowed:
        return [f"{name} ({source}) refused:", *(f"  {line}" for line in decision.message.splitlines())]
    plan = admission.evaluation.plan
    if plan is None or admission.dry_run_only:
        # Warn/dryrun left no plan within all limits, or dryrun policies must not shape the plan.
        plan = plan_fn(planning_spec(spec, combine(enforced(policies))))
    return Governed(source, obj.model_copy(update={"spec": spec}), plan, tuple(policies), notes)


def describe_policies(policies: Sequence[FleetPolicy]) -> str:
    """One line per policy, for a run whose files hold policies but no InferenceModel."""
    return "\n".join(
        f"FleetPolicy {p.name}: {p.spec.enforcement}, priority {p.spec.priority}, governs "
        f"{describe_selector(p.spec.selector)} (no InferenceModel among the files to check)"
        for p in policies
    )
