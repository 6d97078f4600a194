"""Rendering: an InferenceModel and its plan → the Kubernetes manifests that serve it with vLLM.

Pure functions only. :func:`render_manifests` returns plain dicts (Deployment or LeaderWorkerSet,
Service, PodDisruptionBudget); :func:`manifests_yaml` prints them as a YAML stream. vLLM flags are
chosen per version from the data table ``render/data/vllm_flags.json`` (see :func:`flag_table`).
:func:`workload_ref`, :func:`service_name` and :func:`child_kinds` name the children without
rendering, for the operator (readiness of the workload, clean-up after a layout change).
"""

from loadline.render._args import PORT, VllmCommand, vllm_command
from loadline.render._autoscaling import SCALEDOBJECT, autoscaling_query, render_scaled_object
from loadline.render._flags import (
    CodeFlag,
    FlagSpec,
    FlagTable,
    Launcher,
    beyond_table,
    canonical_flag,
    check_extra_args,
    code_flags,
    extra_args_problems,
    flag_table,
    resolve_version,
    version_text,
)
from loadline.render._names import child_kinds, pod_selector, service_name, workload_ref
from loadline.render._render import (
    ANNOTATION_NOTES,
    ANNOTATION_PLAN,
    ANNOTATION_VERSION,
    LABEL_MANAGED_BY,
    LABEL_MODEL,
    MANAGED_BY,
    default_image,
    render_manifests,
)
from loadline.render._resources import PodResources, pod_resources, weights_total_gib
from loadline.render._stream import manifests_yaml

__all__ = [
    "ANNOTATION_NOTES",
    "ANNOTATION_PLAN",
    "ANNOTATION_VERSION",
    "LABEL_MANAGED_BY",
    "LABEL_MODEL",
    "MANAGED_BY",
    "PORT",
    "SCALEDOBJECT",
    "CodeFlag",
    "FlagSpec",
    "FlagTable",
    "Launcher",
    "PodResources",
    "VllmCommand",
    "autoscaling_query",
    "beyond_table",
    "canonical_flag",
    "check_extra_args",
    "child_kinds",
    "code_flags",
    "default_image",
    "extra_args_problems",
    "flag_table",
    "manifests_yaml",
    "pod_resources",
    "pod_selector",
    "render_manifests",
    "render_scaled_object",
    "resolve_version",
    "service_name",
    "version_text",
    "vllm_command",
    "weights_total_gib",
    "workload_ref",
]
