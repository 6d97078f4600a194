"""Upgrades of loadline without restarting the fleet. Pure: no clock, no API.

A new loadline version may render a model's children differently (flags, env, probes, labels). The
workload it applied carries a stamp (:func:`stamped`: the loadline version and a fingerprint of the pod
templates, on the workload's metadata, so the stamp itself rolls nothing). At reconcile the operator
compares what runs with what it renders now:

    differences = template_differences(live_workload, rendered_workload)   # empty: no pod would roll
    explained = explain(differences, read_stamp(live_workload).version, __version__)
    decision = decide_roll(differs=bool(differences), same_version=..., spec_changed=...,
                           restarting=..., urgent=explained.urgent, approved=..., mode="window")

and either applies at once or keeps the running children, says so on the model (the ``RenderOutdated``
condition, with ``explained.lines``), and rolls them in the model's restart window. See docs/upgrades.md.
"""

from loadline.upgrade._changes import Explained, RenderChange, explain, render_changes
from loadline.upgrade._decide import ROLL_MODES, RollDecision, RollKind, RollMode, decide_roll
from loadline.upgrade._diff import Difference, DifferenceKind, template_differences
from loadline.upgrade._stamp import (
    ANNOTATION_APPROVE,
    ANNOTATION_RENDER_FINGERPRINT,
    ANNOTATION_RENDERED_BY,
    Stamp,
    pod_templates,
    read_stamp,
    render_fingerprint,
    stamped,
)

__all__ = [
    "ANNOTATION_APPROVE",
    "ANNOTATION_RENDERED_BY",
    "ANNOTATION_RENDER_FINGERPRINT",
    "ROLL_MODES",
    "Difference",
    "DifferenceKind",
    "Explained",
    "RenderChange",
    "RollDecision",
    "RollKind",
    "RollMode",
    "Stamp",
    "decide_roll",
    "explain",
    "pod_templates",
    "read_stamp",
    "render_changes",
    "render_fingerprint",
    "stamped",
    "template_differences",
]
