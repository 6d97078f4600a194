"""The exception tree of loadline.

Every error a user can cause names the field at fault and what would fix it, so the CLI can print it
and the operator can put it in status and an Event without rewording.

    LoadlineError
    ├── SpecError            a resource or CLI input is invalid (bad field value, unknown name)
    │   ├── ModelConfigError the model's config.json cannot be read or lacks what sizing needs
    │   ├── ReferencedObjectError  an object the spec names (ConfigMap, Secret) lacks what it needs
    │   ├── NotAllowedError  the operator's safe defaults refuse it; names the setting that allows it
    │   └── RenderError      the plan cannot be rendered for the chosen engine version
    ├── NoFeasiblePlanError  the spec is valid but no GPU candidate fits (carries the rejections)
    │   └── NoCapacityError  a plan fits, but the cluster has no free GPUs for it now (wait, retry)

Which of these admission refuses at ``kubectl apply`` and which it only warns about is decided by type
in :mod:`loadline.policy` (``refused_now``): what the spec alone decides is refused; what depends on
objects that may be applied later (a ConfigMap, a Secret, the hub's config.json) or on the cluster's
capacity is a warning and a status condition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

__all__ = [
    "LoadlineError",
    "ModelConfigError",
    "NoCapacityError",
    "NoFeasiblePlanError",
    "NotAllowedError",
    "ReferencedObjectError",
    "RenderError",
    "SpecError",
]


class LoadlineError(Exception):
    """Base of every error loadline raises on purpose."""

    def at(self, where: str) -> Self:
        """Prefix the one-line message with where the error is (a file and the object in it), once:
        the core names the field, the caller that knows the file and object adds them."""
        if where and not str(self).startswith(where):
            self.args = (f"{where}: {self}",)
        return self


class SpecError(LoadlineError):
    """An input value is wrong. ``field`` is a dotted path such as ``spec.maxModelLen``."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{field}: {problem}"
        if fix:
            text += f" (fix: {fix})"
        super().__init__(text)


class ModelConfigError(SpecError):
    """The model's architecture (Hugging Face config.json) is missing, unreadable or incomplete."""


class ReferencedObjectError(SpecError):
    """An object the spec names (a ConfigMap's key, a Secret's key) is there but lacks what the spec
    needs. The other object's state, not the spec's: it may be fixed by applying that object."""


class NotAllowedError(SpecError):
    """The spec asks for something the operator refuses by default (an image from elsewhere than
    vLLM's registries, an environment variable that changes how code is loaded, an ``extraArgs`` flag
    that runs code from outside the image). ``setting`` names what would allow it: a chart value or a
    FleetPolicy field, so a platform team, not the model's author, decides."""

    def __init__(self, field: str, problem: str, fix: str, setting: str) -> None:
        self.setting = setting
        super().__init__(field, problem, fix)


class NoFeasiblePlanError(LoadlineError):
    """No GPU type × count can serve the spec; ``rejections`` says why, one line per candidate."""

    def __init__(
        self, message: str, rejections: Sequence[str] = (), fixes: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        self.rejections = list(rejections)
        #: Spec changes that were re-planned and work, each ``{camelCase path under spec: value}``.
        self.fixes = [dict(f) for f in fixes]
        super().__init__(message)


class NoCapacityError(NoFeasiblePlanError):
    """A plan fits the spec, but the cluster has no free GPUs of the planned type(s) right now.

    Unlike its parent this is the world's state, not the spec's: the operator waits and retries."""


class RenderError(SpecError):
    """The manifests cannot be rendered as asked (for example a flag the engine version lacks)."""
