"""What the spec alone decides, refused where it is judged; and the operator's safe defaults.

Two questions, answered the same way by the admission webhook, reconcile and ``loadline plan``/``render``:

* Which problems are the spec's own, to refuse at ``kubectl apply``, and which depend on objects that
  may be applied later or on the cluster (a ConfigMap, a Secret, the hub's config.json, free GPUs), to
  warn about and report in status? Decided by the error's type (:func:`refused_now`), never its text.
* Without any FleetPolicy, what may a model's author make the operator run? Images from vLLM's own
  registries (plus the chart's list), no environment variable that changes how code is loaded, no
  ``extraArgs`` flag that runs code from outside the image unless a FleetPolicy allows it
  (:func:`spec_problems`). Each refusal names the setting that would allow it: the operator acts with
  its own identity, so what a model's author may not do directly they may not do through it.

The tables are data (``data/safe_defaults.json``; the flags' ``runs_code`` in the render flag table),
each entry with its source.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadline.api import FleetPolicy, InferenceModelSpec
from loadline.errors import ModelConfigError, NotAllowedError, ReferencedObjectError, SpecError
from loadline.policy._evaluate import image_allowed
from loadline.render import (
    canonical_flag,
    code_flags,
    default_image,
    extra_args_problems,
    flag_table,
    resolve_version,
)
from loadline.sizing import find_gpu

__all__ = [
    "DEFERRED",
    "Guard",
    "allowed_code_flags",
    "denied_env",
    "refused_now",
    "spec_problems",
    "vllm_registries",
]

#: Chart values (and the operator's env) that widen the safe defaults; refusals name them.
IMAGE_SETTING = "chart value settings.imageRegistries (LOADLINE_IMAGE_REGISTRIES)"
ENV_SETTING = "chart value settings.allowedEnv (LOADLINE_ALLOWED_ENV)"
FLAG_SETTING = "FleetPolicy spec.allow.extraArgs"

#: Spec errors that are not the spec's alone: the config.json (from a ConfigMap or the hub) or an
#: object the spec names lacks something. GitOps applies objects in any order, so these are warned
#: about at admission and reported by reconcile. Every other :class:`SpecError` is the spec's own.
#: Errors that are no ``SpecError`` at all (no feasible plan, no capacity, the hub unreachable) depend
#: on the model's config or the cluster and are deferred too.
DEFERRED: tuple[type[SpecError], ...] = (ModelConfigError, ReferencedObjectError)


def refused_now(exc: BaseException) -> bool:
    """Whether ``exc`` is decided by the spec alone (refuse it at ``kubectl apply``), by its type."""
    return isinstance(exc, SpecError) and not isinstance(exc, DEFERRED)


class _Registry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    prefix: str = Field(min_length=1)
    source: str = Field(min_length=1)


class _EnvRule(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    pattern: str = Field(min_length=1)
    why: str = Field(min_length=1)
    source: str = Field(min_length=1)


class _Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    about: str = Field(alias="_about")
    image_registries: list[_Registry]
    denied_env: list[_EnvRule]


@cache
def _defaults() -> _Defaults:
    node = resources.files("loadline.policy").joinpath("data").joinpath("safe_defaults.json")
    try:
        return _Defaults.model_validate_json(node.read_text(encoding="utf-8"))
    except ValidationError as exc:  # a packaging bug, not user input
        raise RuntimeError(f"policy/data/safe_defaults.json is malformed: {exc}") from None


def vllm_registries() -> tuple[str, ...]:
    """The image prefixes of vLLM's own published images (always allowed)."""
    return tuple(r.prefix for r in _defaults().image_registries)


def denied_env() -> dict[str, str]:
    """The built-in refused environment names (``NAME`` or ``PREFIX*``) and why each is refused."""
    return {rule.pattern: rule.why for rule in _defaults().denied_env}


def _split(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern


@dataclass(frozen=True)
class Guard:
    """The operator's safe defaults as a platform team set them (the chart's ``settings``)."""

    image_registries: tuple[str, ...] = ()  # image prefixes allowed beside vLLM's own; "*": any image
    allowed_env: tuple[str, ...] = ()  # names (or PREFIX*) allowed although the built-in list refuses them
    denied_env: tuple[str, ...] = ()  # names (or PREFIX*) refused beside the built-in list

    @classmethod
    def from_text(cls, image_registries: str = "", allowed_env: str = "", denied_env: str = "") -> Guard:
        """From the comma-separated ``LOADLINE_IMAGE_REGISTRIES``, ``LOADLINE_ALLOWED_ENV`` and
        ``LOADLINE_DENIED_ENV`` (what the chart's ``settings`` become)."""
        return cls(_split(image_registries), _split(allowed_env), _split(denied_env))

    def image_ok(self, image: str) -> bool:
        return "*" in self.image_registries or image_allowed(image, vllm_registries() + self.image_registries)

    def env_refusal(self, name: str) -> str | None:
        """Why ``name`` is refused (None: allowed). An allowed name wins over a denied pattern."""
        if any(_matches(name, p) for p in self.allowed_env):
            return None
        for pattern, why in denied_env().items():
            if _matches(name, pattern):
                return why
        if any(_matches(name, p) for p in self.denied_env):
            return "the platform team refuses it (chart value settings.deniedEnv)"
        return None


def allowed_code_flags(governing: Iterable[FleetPolicy]) -> frozenset[str]:
    """The code-running flags the governing policies allow (any enforcing one; dryrun changes nothing)."""
    aliases = flag_table().aliases
    return frozenset(
        canonical_flag(flag, aliases)
        for policy in governing
        if policy.spec.enforcement != "dryrun"
        for flag in policy.spec.allow.extra_args
    )


def _image_problems(spec: InferenceModelSpec, guard: Guard) -> list[SpecError]:
    image = spec.engine.image or default_image(spec.engine.version)
    if guard.image_ok(image):
        return []
    allowed = ", ".join(vllm_registries() + guard.image_registries)
    return [
        NotAllowedError(
            "spec.engine.image",
            f"{image} is not from vLLM's own registries or the operator's allowed list ({allowed})",
            f"leave spec.engine.image empty for vLLM's image, or ask the platform team to add the "
            f"registry to the {IMAGE_SETTING}",
            IMAGE_SETTING,
        )
    ]


def _env_problems(spec: InferenceModelSpec, guard: Guard) -> list[SpecError]:
    out: list[SpecError] = []
    for index, var in enumerate(spec.engine.env):
        why = guard.env_refusal(var.name)
        if why is not None:
            out.append(
                NotAllowedError(
                    f"spec.engine.env[{index}].name",
                    f"{var.name} changes how code is loaded in the vLLM container: {why}",
                    f"remove it, or ask the platform team to allow it in the {ENV_SETTING}",
                    ENV_SETTING,
                )
            )
    return out


def _flag_problems(spec: InferenceModelSpec, governing: Sequence[FleetPolicy]) -> list[SpecError]:
    allowed = allowed_code_flags(governing)
    out: list[SpecError] = []
    for flag in code_flags(spec.engine.extra_args):
        if flag.name in allowed:
            continue
        what = flag.runs_code.split(":", 1)[0]
        out.append(
            NotAllowedError(
                f"spec.engine.extraArgs[{flag.index}]",
                f"{flag.name} makes vLLM run code from outside its image ({what})",
                f"remove it, or ask the platform team for a FleetPolicy governing this model that lists "
                f"{flag.name} in spec.allow.extraArgs",
                FLAG_SETTING,
            )
        )
    return out


def spec_problems(
    spec: InferenceModelSpec, guard: Guard | None = None, governing: Sequence[FleetPolicy] = ()
) -> list[SpecError]:
    """Every problem the spec alone decides (and the GPU catalog), one error per problem, in field
    order: an engine version loadline cannot render, GPU types the catalog lacks, ``extraArgs`` the
    version refuses or loadline sets itself, and the safe defaults of ``guard`` (image, environment,
    code-running flags a governing FleetPolicy does not allow). Judge the spec after the policies'
    defaults were filled in (a defaulted image is judged too). Empty: nothing to refuse."""
    guard = guard or Guard()
    out: list[SpecError] = []
    version = None
    try:
        version = resolve_version(spec.engine.version, "spec.engine.version")
    except SpecError as exc:
        out.append(exc)
    for index, name in enumerate(spec.gpu.types):
        try:
            find_gpu(name, f"spec.gpu.types[{index}]")
        except SpecError as exc:
            out.append(exc)
    out.extend(_image_problems(spec, guard))
    if version is not None:
        out.extend(extra_args_problems(list(spec.engine.extra_args), version))
    out.extend(_flag_problems(spec, governing))
    out.extend(_env_problems(spec, guard))
    return out
