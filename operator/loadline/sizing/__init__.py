"""Sizing: model architecture → per-GPU memory budget → the cheapest GPU plan that serves the spec.

Pure functions only; nothing here talks to a cluster. See docs/sizing.md for the model and its limits.
"""

from loadline.sizing._arch import Architecture, QuantConfig, parse_hf_config
from loadline.sizing._budget import EngineSettings, MemoryBudget, compute_budget, resolve_dtype
from loadline.sizing._capacity import (
    FreeGPUs,
    GPUNode,
    NodeRoom,
    Reservation,
    ShapeFigures,
    cluster_shapes,
    free_gpus_by_type,
    free_rooms,
    free_rooms_by_type,
    gpu_node,
    gpus_used,
    pod_gpus,
    reserve,
    reserve_sorted,
    shape_figures,
    shapes_of,
    workload_demand,
)
from loadline.sizing._compat import check_compatibility, compat_table
from loadline.sizing._data import (
    CatalogModel,
    GPUType,
    engine_version,
    find_catalog_model,
    find_gpu,
    gpu_catalog,
    model_catalog,
    parse_version,
    quantization_methods,
)
from loadline.sizing._download import CheckpointDownload, checkpoint_download
from loadline.sizing._params import ParameterCounts, count_parameters
from loadline.sizing._plan import Candidate, Plan, plan_inference_model
from loadline.sizing._resolve import (
    ResolvedModel,
    SpecInputs,
    check_max_model_len,
    engine_settings,
    resolve_inputs,
    resolve_model,
    resolve_quantization,
)
from loadline.sizing._shapes import (
    ClusterShapes,
    NodeShape,
    PodRequest,
    node_shapes,
    pod_request,
    shapes_for,
)
from loadline.sizing._tune import Tuned, tune

__all__ = [
    "Architecture",
    "Candidate",
    "CatalogModel",
    "CheckpointDownload",
    "ClusterShapes",
    "EngineSettings",
    "FreeGPUs",
    "GPUNode",
    "GPUType",
    "MemoryBudget",
    "NodeRoom",
    "NodeShape",
    "ParameterCounts",
    "Plan",
    "PodRequest",
    "QuantConfig",
    "Reservation",
    "ResolvedModel",
    "ShapeFigures",
    "SpecInputs",
    "Tuned",
    "check_compatibility",
    "check_max_model_len",
    "checkpoint_download",
    "cluster_shapes",
    "compat_table",
    "compute_budget",
    "count_parameters",
    "engine_settings",
    "engine_version",
    "find_catalog_model",
    "find_gpu",
    "free_gpus_by_type",
    "free_rooms",
    "free_rooms_by_type",
    "gpu_catalog",
    "gpu_node",
    "gpus_used",
    "model_catalog",
    "node_shapes",
    "parse_hf_config",
    "parse_version",
    "plan_inference_model",
    "pod_gpus",
    "pod_request",
    "quantization_methods",
    "reserve",
    "reserve_sorted",
    "resolve_dtype",
    "resolve_inputs",
    "resolve_model",
    "resolve_quantization",
    "shape_figures",
    "shapes_for",
    "shapes_of",
    "tune",
    "workload_demand",
]
