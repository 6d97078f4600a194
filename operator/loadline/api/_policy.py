"""The ``loadline.dev/v1alpha1`` FleetPolicy resource as pydantic models.

A FleetPolicy is how a platform team governs many InferenceModels at once: defaults filled in where a
model's spec says nothing, limits (GPU types and counts, the providers nodes come from, replicas,
price, context length, vLLM versions, image registries, CPU offload), allowances beyond the
operator's safe defaults (``extraArgs`` flags that run code from outside the image), limits on automatic
out-of-memory remediation, and the windows restarts may happen in. It is cluster-scoped because the
team that writes it is not the team that owns the namespaces it governs.

Like the InferenceModel, these models are the source of the CRD (``crds/``) and of offline
validation. Rules the API server cannot express (PEP 440 version ranges, IANA time zones) are checked
here only; the operator validates FleetPolicy objects with these same models. How several policies
combine and how a model is judged against them lives in :mod:`loadline.policy`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from loadline.api._v1alpha1 import (
    _VERSION_PATTERN,
    CATEGORIES,
    Condition,
    RemediationMode,
    _Model,
    _SpecModel,
)

POLICY_KIND = "FleetPolicy"
POLICY_PLURAL = "fleetpolicies"
POLICY_SINGULAR = "fleetpolicy"
# "lfp": loadline fleet policy, in line with "lim"; "fp" alone is too likely to clash.
POLICY_SHORT_NAMES = ("lfp",)
POLICY_CATEGORIES = CATEGORIES

Enforcement = Literal["deny", "warn", "dryrun"]
SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
DayName = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
ALL_DAYS: tuple[DayName, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

_LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_CLOCK_PATTERN = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=_LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=_LABEL_VALUE_PATTERN)]
GPUTypeName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
#: Where nodes come from: the values of an InferenceModel's ``spec.gpu.providers`` (the planner's
#: catalog providers, ``loadline.sizing``'s ``PROVIDERS``; tests keep the three in step).
Provider = Literal["aws", "gcp", "azure", "onprem"]


class LabelSelectorRequirement(_SpecModel):
    """One label rule, as in a Kubernetes LabelSelector."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(self.operator in ['In', 'NotIn'])"
                    " == (has(self.values) && size(self.values) > 0)",
                    "message": "values must be non-empty for In and NotIn and empty for Exists and "
                    "DoesNotExist",
                }
            ]
        }
    )

    key: LabelKey = Field(description="Label key the rule applies to.")
    operator: SelectorOperator = Field(
        description="In, NotIn (also matches objects without the label), Exists or DoesNotExist."
    )
    values: list[LabelValue] = Field(
        default_factory=list,
        max_length=64,
        description="Label values for In and NotIn; must be empty for Exists and DoesNotExist.",
    )

    @model_validator(mode="after")
    def _values_match_operator(self) -> LabelSelectorRequirement:
        # Same rule as the CEL above (and as Kubernetes' own LabelSelector validation).
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise ValueError(
                "values must be non-empty for In and NotIn and empty for Exists and DoesNotExist"
            )
        return self


class LabelSelector(_SpecModel):
    """Kubernetes label selector: every matchLabels pair and every matchExpressions rule must hold.

    An empty selector matches everything.
    """

    # Plain str → str: constrained keys would become patternProperties, which a CRD schema may not use.
    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels that must be present with exactly these values."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="Label rules that must all hold."
    )

    @field_validator("match_labels")
    @classmethod
    def _label_syntax(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if not re.match(_LABEL_KEY_PATTERN, key) or len(key) > 317:
                raise ValueError(f"{key!r} is not a valid label key")
            if not re.match(_LABEL_VALUE_PATTERN, label) or len(label) > 63:
                raise ValueError(f"{label!r} (label {key}) is not a valid label value")
        return value


class PolicySelector(_SpecModel):
    """Which InferenceModels the policy governs. Every part that is set must match; empty: all."""

    namespaces: list[Annotated[str, StringConstraints(min_length=1, max_length=63)]] = Field(
        default_factory=list,
        max_length=256,
        description="Namespaces whose models are governed; empty: every namespace.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    namespace_selector: LabelSelector | None = Field(
        default=None,
        description="Labels the model's namespace must carry; unset: any namespace.",
    )
    model_selector: LabelSelector | None = Field(
        default=None, description="Labels the InferenceModel itself must carry; unset: any model."
    )


class EngineDefaults(_SpecModel):
    """Engine settings filled in where a model's spec.engine leaves them out."""

    version: str | None = Field(
        default=None,
        description="vLLM version for models that do not name one, e.g. 0.19.0.",
        max_length=40,
        pattern=_VERSION_PATTERN,
    )
    image: str | None = Field(
        default=None,
        description="Container image for models that do not name one, e.g. a mirror of vllm/vllm-openai.",
        min_length=1,
        max_length=512,
    )


class GPUDefaults(_SpecModel):
    """GPU choices filled in where a model's spec.gpu leaves them out."""

    types: list[GPUTypeName] | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="GPU types the planner may use for models that list none.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    max_gpus_per_replica: int | None = Field(
        default=None,
        alias="maxGPUsPerReplica",
        ge=1,
        le=256,
        description="Upper bound on GPUs per replica for models that set none.",
    )
    providers: list[Provider] | None = Field(
        default=None,
        min_length=1,
        max_length=4,
        description=(
            "Where the nodes come from (aws, gcp, azure, onprem) for models that list no providers: "
            "the node shapes the planner may assume and price."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class RemediationDefaults(_SpecModel):
    """Out-of-memory remediation settings filled in where a model's spec.remediation leaves them out."""

    mode: RemediationMode | None = Field(
        default=None,
        description="auto, recommend or off for models that set no mode.",
    )


class PolicyDefaults(_SpecModel):
    """Values filled in where a governed InferenceModel's spec says nothing; never over a set value."""

    engine: EngineDefaults = Field(default_factory=EngineDefaults, description="Engine defaults.")
    gpu: GPUDefaults = Field(default_factory=GPUDefaults, description="GPU defaults.")
    remediation: RemediationDefaults = Field(
        default_factory=RemediationDefaults, description="Out-of-memory remediation defaults."
    )


class PolicyLimits(_SpecModel):
    """Limits every governed InferenceModel must keep. Unset: no limit. Several policies: strictest wins."""

    gpu_types: list[GPUTypeName] | None = Field(
        default=None,
        alias="gpuTypes",
        min_length=1,
        max_length=64,
        description=(
            "GPU types models may use (loadline catalog names). A model listing another type is "
            "refused; a model listing none is planned on these only."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    max_gpus_per_replica: int | None = Field(
        default=None,
        alias="maxGPUsPerReplica",
        ge=1,
        le=256,
        description="Most GPUs one replica may use; the planner is run within it.",
    )
    providers: list[Provider] | None = Field(
        default=None,
        min_length=1,
        max_length=4,
        description=(
            "Where nodes may come from (aws, gcp, azure, onprem): the node shapes the planner may assume "
            "and price. A model listing another provider in spec.gpu.providers is refused; a model "
            "listing none is planned on these only."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    max_replicas: int | None = Field(default=None, ge=0, le=1000, description="Most replicas per model.")
    max_price_per_hour: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Most a model may cost per hour, all replicas together, at the plan's price (USD): each pod's "
            "share of its node's catalog price, or the whole node when it leaves no room for another GPU "
            "pod or the model sets spec.gpu.dedicatedNodes."
        ),
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        description="Longest maxModelLen a model may serve (also when taken from the model).",
    )
    vllm_versions: str | None = Field(
        default=None,
        alias="vllmVersions",
        min_length=1,
        max_length=200,
        description="Allowed vLLM versions as a PEP 440 specifier, e.g. '>=0.17.0,<0.40'.",
    )
    image_registries: list[Annotated[str, StringConstraints(min_length=1, max_length=255)]] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description=(
            "Image prefixes the vLLM image must start with, e.g. registry.example.com/ (docker.io/ for "
            "Docker Hub images written without a registry). The default image counts too."
        ),
    )
    max_cpu_offload_gi_b: float | None = Field(
        default=None,
        alias="maxCpuOffloadGiB",
        ge=0,
        description="Most host memory per replica for KV-cache offload (spec.kvOffload.cpuGiB), in GiB.",
    )

    @field_validator("vllm_versions")
    @classmethod
    def _pep440(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError(
                f"{value!r} is not a PEP 440 version specifier (write e.g. '>=0.17.0,<0.40')"
            ) from None
        return value

    def specifier(self) -> SpecifierSet | None:
        """``vllmVersions`` parsed (validated when the model was built)."""
        return None if self.vllm_versions is None else SpecifierSet(self.vllm_versions)


class PolicyAllow(_SpecModel):
    """What governed models may do beyond the operator's safe defaults. Unlike limits, an allowance of
    any governing policy that is enforced (deny or warn; dryrun changes nothing) grants it."""

    extra_args: list[
        Annotated[
            str, StringConstraints(min_length=3, max_length=128, pattern=r"^--?[A-Za-z0-9][A-Za-z0-9._-]*$")
        ]
    ] = Field(
        default_factory=list,
        alias="extraArgs",
        max_length=64,
        description=(
            "vLLM flags that run code from outside the image (the flag table's runs_code: "
            "--trust-remote-code, --tool-parser-plugin, --reasoning-parser-plugin, "
            "--enable-prompt-embeds) that governed models may give in spec.engine.extraArgs; "
            "refused without such an allowance."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class RemediationLimits(_SpecModel):
    """Limits on automatic out-of-memory remediation; unset fields fall back to the operator's settings."""

    max_actions_per_day: int | None = Field(
        default=None, ge=0, le=1000, description="Automatic changes per model per UTC day."
    )
    cooldown_minutes: int | None = Field(
        default=None,
        ge=0,
        le=10080,
        description="Minutes in which a change may not be undone by the opposite change.",
    )
    min_confidence: float | None = Field(
        default=None, ge=0, le=1, description="Act automatically only at or above this classifier confidence."
    )
    max_memory_gi_b: float | None = Field(
        default=None,
        alias="maxMemoryGiB",
        gt=0,
        description="Cap on host memory remediation may raise a pod to.",
    )


class RestartWindow(_SpecModel):
    """A weekly wall-clock interval in which restarts are allowed; an end at or before start runs past
    midnight (days name the day it starts on)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self.start != self.end", "message": "end equals start (an empty window)"}
            ]
        }
    )

    days: list[DayName] = Field(
        default_factory=lambda: list(ALL_DAYS),
        min_length=1,
        max_length=7,
        description="Days the window starts on: Mon, Tue, Wed, Thu, Fri, Sat, Sun; default: every day.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    # maxLength bounds the CEL rule's cost as the API server estimates it (unbounded strings exceed it).
    start: str = Field(description='Start, "HH:MM" wall-clock time.', pattern=_CLOCK_PATTERN, max_length=5)
    end: str = Field(description='End, "HH:MM" ("24:00": midnight).', pattern=_CLOCK_PATTERN, max_length=5)
    timezone: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="IANA time zone of start and end, e.g. Europe/Berlin; default: the operator's.",
    )

    @field_validator("timezone")
    @classmethod
    def _iana(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r} (use an IANA name such as UTC or Europe/Berlin)"
            ) from None
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> RestartWindow:
        if self.start == self.end:
            raise ValueError("end equals start (an empty window); give a later end")
        return self


class RestartPolicy(_SpecModel):
    """When loadline's low-traffic scheduler may restart governed models."""

    windows: list[RestartWindow] = Field(
        default_factory=list,
        max_length=32,
        description="Allowed restart windows; empty: any time the scheduler finds quiet.",
    )
    max_concurrent: int | None = Field(
        default=None, ge=1, le=1000, description="Most governed models restarting at the same time."
    )


class FleetPolicySpec(_SpecModel):
    """Defaults and limits for the InferenceModels the selector picks."""

    selector: PolicySelector = Field(
        default_factory=PolicySelector, description="Which InferenceModels are governed; empty: all."
    )
    enforcement: Enforcement = Field(
        default="deny",
        description=(
            "deny: refuse violating models at admission; warn: admit with a warning and an Event; "
            "dryrun: admit, only record what would have been refused."
        ),
    )
    priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description="When several policies set the same default, the highest priority wins (ties: by name).",
    )
    defaults: PolicyDefaults = Field(
        default_factory=PolicyDefaults, description="Filled in where a governed model's spec says nothing."
    )
    limits: PolicyLimits = Field(
        default_factory=PolicyLimits, description="Limits governed models must keep."
    )
    allow: PolicyAllow = Field(
        default_factory=PolicyAllow,
        description="What governed models may do beyond the operator's safe defaults.",
    )
    remediation: RemediationLimits = Field(
        default_factory=RemediationLimits, description="Limits on automatic out-of-memory remediation."
    )
    restarts: RestartPolicy = Field(default_factory=RestartPolicy, description="When restarts may happen.")


class FleetPolicyStatus(_Model):
    """What the operator observed. Written by the operator only."""

    selector: str = Field(default="", description="The selector in words (for the printer column).")
    models_governed: int = Field(default=0, ge=0, description="InferenceModels this policy governs.")
    violations: int = Field(default=0, ge=0, description="Governed InferenceModels that break it.")
    violating_models: list[str] = Field(
        default_factory=list, max_length=50, description="namespace/name of violating models (first 50)."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Conditions of the policy itself.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, description="Last spec generation acted on.")


class FleetPolicy(_Model):
    """Defaults and limits a platform team sets for every InferenceModel it governs."""

    api_version: Literal["loadline.dev/v1alpha1"] = Field(
        default="loadline.dev/v1alpha1", description="API version."
    )
    kind: Literal["FleetPolicy"] = Field(default="FleetPolicy", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: FleetPolicySpec = Field(default_factory=FleetPolicySpec, description="Desired state.")
    status: FleetPolicyStatus | None = Field(default=None, description="Observed state.")

    @property
    def name(self) -> str:
        """``metadata.name``: what every refusal and warning calls the policy."""
        return str(self.metadata.get("name") or self.metadata.get("generateName") or "(unnamed)")
