"""When a render that differs from the running pods may roll them.

An upgrade of loadline changes no model's spec, so nothing a user asked for is waiting on it: rolling
every model's pods at the new operator's first reconcile would be a fleet-wide restart caused by the
operator alone. So a difference the upgrade brings waits, as the setting says:

- ``window`` (the default): the roll is a restart like a remediation's, in the model's next restart
  window, under the FleetPolicies' ``maxConcurrent`` (``loadline.maintenance`` decides when);
- ``immediate``: it rolls at once (the workload controller still rolls one pod at a time);
- ``manual``: it waits until someone approves this render for the model (:data:`ANNOTATION_APPROVE`).

Whatever the setting, it rolls at once when it is urgent (the table marks a fix of an OOM class), when
it was approved, or when the model's pods roll anyway: the spec changed since the running render (the
user's change rolls them, with this version's rendering), or a restart of the model is running now.
A difference made by the same loadline version that rendered the running pods is not an upgrade's (a
re-plan, a remediation): those paths decide it themselves, and it is applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["ROLL_MODES", "RollDecision", "RollKind", "RollMode", "decide_roll"]

RollMode = Literal["window", "immediate", "manual"]
ROLL_MODES: tuple[str, ...] = get_args(RollMode)
#: ``apply``: render now; ``schedule``: keep the running children, roll in the model's window;
#: ``hold``: keep them until approved.
RollKind = Literal["apply", "schedule", "hold"]


@dataclass(frozen=True)
class RollDecision:
    kind: RollKind
    reason: str


def decide_roll(
    *,
    differs: bool,
    same_version: bool,
    spec_changed: bool,
    restarting: bool,
    urgent: bool,
    approved: bool,
    mode: RollMode,
    approve_hint: str = "",
) -> RollDecision:
    """Whether the model's new render is applied now. ``differs``: it would roll the pods;
    ``same_version``: the running pods were rendered by this very version; ``spec_changed``: the
    model's generation moved since they were rendered; ``restarting``: a restart or remediation of the
    model is rolling its pods now (either way the pods roll, so what runs need not be read: a caller may
    pass ``differs=False`` then); ``approve_hint``: the command that approves it, for the sentence."""
    if spec_changed:
        return RollDecision("apply", "the spec changed: its roll carries this version's rendering")
    if restarting:
        return RollDecision("apply", "its restart is running: the roll carries this version's rendering")
    if not differs:
        return RollDecision("apply", "the pods it runs are what this version renders")
    if same_version:
        return RollDecision("apply", "the running pods were rendered by this version")
    if approved:
        return RollDecision("apply", "approved for this model: rolling now")
    if urgent:
        return RollDecision("apply", "urgent (it fixes an out-of-memory class): rolling now")
    if mode == "immediate":
        return RollDecision("apply", "the operator's setting rolls upgrades at once")
    if mode == "manual":
        hint = f" ({approve_hint})" if approve_hint else ""
        return RollDecision("hold", f"waiting for approval{hint}")
    return RollDecision("schedule", "rolls in the model's next restart window")
