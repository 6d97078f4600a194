"""A fleet of distinct, realistic InferenceModel specs over the whole model catalog, and their plans.

Shared by ``benchmarks/plan_fleet.py`` (10,000 specs, timed) and ``tests/test_plan_fleet.py`` (a
sample, checked against plans saved from the planner before it was optimised, main's at 6879030).
Everything is seeded: the same seed gives the same specs in the same order.

A spec draws, per catalog model (round robin, so every model gets the same share): a dtype, a
quantization the model's checkpoint and vLLM release accept (its own, or an online method on an
unquantized checkpoint), a KV-cache dtype, ``maxModelLen`` (round lengths from 1K to the model's window,
sometimes the window itself), ``concurrency`` (1 to 256, log-spread), a vLLM release, now and then a
pinned engine setting, CPU KV offload, pod resources, a GPU cap, multi-node, a provider, and for about a
fifth a FleetPolicy whose limits narrow the GPU types and GPUs per replica the way admission and
``loadline plan`` apply them (:func:`loadline.policy.planning_spec`). Specs the release or the model
would refuse before planning (an architecture the release lacks, a length beyond the window) are not
drawn: the fleet is what a cluster admits.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

from loadline.api import FleetPolicy, InferenceModelSpec, parse_fleet_policy, parse_spec
from loadline.errors import LoadlineError, NoFeasiblePlanError
from loadline.policy import combine, enforced, planning_spec
from loadline.sizing import (
    Architecture,
    ClusterShapes,
    Plan,
    cluster_shapes,
    free_gpus_by_type,
    model_catalog,
    plan_inference_model,
)
from loadline.sizing._arch import parse_hf_config
from loadline.sizing._compat import check_compatibility
from loadline.sizing._memo import GuardedMemo
from loadline.sizing._resolve import resolve_quantization

SEED = 14
#: vLLM releases a fleet runs, the project's default weighted up.
VERSIONS = ("0.19.0",) * 6 + ("0.10.2", "0.11.0", "0.14.1", "0.17.1", "0.20.2", "0.24.0", "0.28.0", "0.33.0")
LENGTHS = (1024, 2048, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 65536, 131072)
#: FleetPolicy limits of the kind platform teams write: a cheap-GPU pool, a datacentre pool, a cap.
POLICIES: dict[str, dict[str, Any]] = {
    "inference-pool": {"gpuTypes": ["L4", "L40S", "A10G"], "maxGPUsPerReplica": 4},
    "datacentre": {"gpuTypes": ["A100-80GB", "H100-80GB", "H200"], "maxGPUsPerReplica": 16},
    "gpu-cap": {"maxGPUsPerReplica": 8},
}


def catalog_models() -> list[str]:
    return sorted({m.id for m in model_catalog().values()})


_ARCHS: dict[str, Architecture] = {}


def _arch(model: str) -> Architecture:
    if model not in _ARCHS:
        _ARCHS[model] = parse_hf_config(model_catalog()[model.lower()].config)
    return _ARCHS[model]


def fleet_policies() -> dict[str, FleetPolicy]:
    return {
        name: parse_fleet_policy(
            {
                "apiVersion": "loadline.dev/v1alpha1",
                "kind": "FleetPolicy",
                "metadata": {"name": name},
                "spec": {"enforcement": "deny", "limits": limits},
            }
        )
        for name, limits in POLICIES.items()
    }


def _quantizations(model: str) -> list[str]:
    """``none`` (the checkpoint's own) and the online methods vLLM applies to an unquantized one."""
    arch = _arch(model)
    if arch.quantization is not None:
        return ["none"]
    online = ["fp8", "fp8", "bitsandbytes"]
    if arch.is_moe:
        online.append("experts_int8")
    return ["none"] * 4 + online


def _length(rng: random.Random, window: int | None) -> int | None:
    if window is not None and rng.random() < 0.05:
        return None  # the model's own window
    top = min(window or 131072, 131072)
    fitting = [n for n in LENGTHS if n <= top]
    if rng.random() < 0.7:
        return rng.choice(fitting)
    # Anything between 1K and the window, in 256-token steps (what people write after a refusal).
    return min(top, 256 * rng.randint(4, max(4, top // 256)))


def _draw(rng: random.Random, model: str) -> dict[str, Any]:
    arch = _arch(model)
    spec: dict[str, Any] = {"model": {"name": model}}
    dtype = rng.choice(["auto"] * 6 + ["bfloat16", "float16"])
    if dtype != "auto":
        spec["dtype"] = dtype
    quantization = rng.choice(_quantizations(model))
    if quantization != "none":
        spec["quantization"] = quantization
    if rng.random() < 0.3:
        spec["kvCacheDtype"] = "fp8"
    length = _length(rng, arch.max_position_embeddings)
    if length is not None:
        spec["maxModelLen"] = length
    spec["concurrency"] = max(1, round(math.exp(rng.uniform(0, math.log(256)))))
    spec["replicas"] = rng.choice([1, 1, 1, 2, 3, 4])
    engine: dict[str, Any] = {"version": rng.choice(VERSIONS)}
    roll = rng.random()
    if roll < 0.06:
        engine["gpuMemoryUtilization"] = rng.choice([0.8, 0.85, 0.92])
    elif roll < 0.10:
        engine["maxNumSeqs"] = rng.choice([64, 128, 256])
    elif roll < 0.13:
        engine["enforceEager"] = True
    elif roll < 0.15:
        engine["maxNumBatchedTokens"] = rng.choice([4096, 8192, 16384])
    spec["engine"] = engine
    gpu: dict[str, Any] = {}
    if rng.random() < 0.3:
        gpu["allowMultiNode"] = True
    if rng.random() < 0.1:
        gpu["maxGPUsPerReplica"] = rng.choice([1, 2, 4, 8])
    if rng.random() < 0.1:
        gpu["providers"] = [rng.choice(["aws", "gcp", "azure", "onprem"])]
    if gpu:
        spec["gpu"] = gpu
    if rng.random() < 0.05:
        spec["kvOffload"] = {"cpuGiB": rng.choice([16, 32, 64])}
    elif rng.random() < 0.04:
        spec["resources"] = {"memoryGiB": rng.choice([32, 64, 128]), "cpu": rng.choice([4, 8])}
    roll = rng.random()
    if roll < 0.2:
        spec["policy"] = rng.choice(sorted(POLICIES))
    return spec


def _admitted(spec: dict[str, Any]) -> bool:
    """Whether the model and release take the spec as written (what admission checks before planning)."""
    entry = model_catalog()[spec["model"]["name"].lower()]
    arch = _arch(entry.id)
    engine = spec["engine"]
    try:
        check_compatibility(arch, spec.get("quantization", "none"), engine["version"], [], entry.id)
        resolve_quantization(spec.get("quantization", "none"), arch)
    except LoadlineError:
        return False
    return not (spec.get("maxModelLen") is None and arch.max_position_embeddings is None)


def build_specs(count: int, seed: int = SEED) -> list[dict[str, Any]]:
    """``count`` distinct raw specs (camelCase, as in a manifest; ``policy`` names a FleetPolicy)."""
    rng = random.Random(seed)
    models = catalog_models()
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    turn = 0
    while len(out) < count:
        model = models[turn % len(models)]
        turn += 1
        for _ in range(50):  # a model whose draws keep repeating or failing gives its turn away
            spec = _draw(rng, model)
            key = json.dumps(spec, sort_keys=True)
            if key not in seen and _admitted(spec):
                seen.add(key)
                out.append(spec)
                break
    return out


def planning_specs(raw: list[dict[str, Any]]) -> list[InferenceModelSpec]:
    """The specs as the planner sees them: validated, and narrowed by their FleetPolicy if any."""
    policies = fleet_policies()
    effective = {name: combine(enforced([p])) for name, p in policies.items()}
    out = []
    for spec in raw:
        body = {k: v for k, v in spec.items() if k != "policy"}
        parsed = parse_spec(body)
        if "policy" in spec:
            parsed = planning_spec(parsed, effective[spec["policy"]])
        out.append(parsed)
    return out


def plan_all(specs: list[InferenceModelSpec]) -> tuple[int, int]:
    """Plan every spec with the operator's entry point; (feasible, refused)."""
    feasible = refused = 0
    for spec in specs:
        try:
            plan_inference_model(spec)
            feasible += 1
        except LoadlineError:
            refused += 1
    return feasible, refused


def clear_caches() -> int:
    """Empty every GuardedMemo and ``functools`` cache in loadline's modules (a fresh process's state);
    returns how many were cleared."""
    cleared = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("loadline") or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, GuardedMemo):
                value.clear()
                cleared += 1
            elif isinstance(value, functools._lru_cache_wrapper):
                value.cache_clear()
                cleared += 1
    return cleared


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def _node(name: str, product: str, instance_type: str, gpus: int, memory: str, cpu: str) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product}
    if instance_type:
        labels["node.kubernetes.io/instance-type"] = instance_type
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "memory": memory, "cpu": cpu},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


#: A small AWS cluster with one on-prem-style node of a type the catalog does not know: what the operator
#: passes the planner when it knows the cluster (its shapes, and the free GPUs per node).
CLUSTER_NODES = [
    _node("l4-a", "NVIDIA-L4", "g6.xlarge", 1, "15Gi", "3920m"),
    _node("l4-b", "NVIDIA-L4", "g6.12xlarge", 4, "185Gi", "47810m"),
    _node("l40s-a", "NVIDIA-L40S", "g6e.12xlarge", 4, "370Gi", "47810m"),
    _node("a100-a", "NVIDIA-A100-SXM4-80GB", "", 8, "1000Gi", "120"),
    _node("h100-a", "NVIDIA-H100-80GB-HBM3", "p5.48xlarge", 8, "2000Gi", "191450m"),
    _node("h100-b", "NVIDIA-H100-80GB-HBM3", "p5.48xlarge", 8, "2000Gi", "191450m"),
]


def cluster() -> tuple[ClusterShapes | None, dict[str, list[int]]]:
    return cluster_shapes(CLUSTER_NODES), free_gpus_by_type(CLUSTER_NODES, [])


def plan_record(spec: InferenceModelSpec, in_cluster: bool = False) -> dict[str, Any]:
    """Everything a plan (or a refusal) says, as JSON: the status summary, every candidate considered
    with its settings, budget, node shape and pod, and a refusal's message, rejections and fixes.
    ``in_cluster``: planned as the operator does when it knows :data:`CLUSTER_NODES`."""
    options: dict[str, Any] = {}
    if in_cluster:
        shapes, free = cluster()
        options = {"cluster_shapes": shapes, "free_gpus": free}
    try:
        plan: Plan = plan_inference_model(spec, **options)
    except NoFeasiblePlanError as exc:
        return {
            "refused": str(exc),
            "type": type(exc).__name__,
            "rejections": list(exc.rejections),
            "fixes": exc.fixes,
        }
    except LoadlineError as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "rejections": getattr(exc, "rejections", []),
        }
    candidates = []
    for c in plan.candidates:
        fields = _jsonable(c)
        fields["gpu"] = c.gpu.name  # the catalog entry is the same for every candidate of a type
        candidates.append(fields)
    return {"plan": plan.to_dict(), "chosen": plan.candidates.index(plan.chosen), "candidates": candidates}


def digest(record: Any) -> str:
    text = json.dumps(record, sort_keys=True, ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def brief(record: dict[str, Any]) -> str:
    """One line of a record, to show which plan changed."""
    if "plan" in record:
        p = record["plan"]["plan"]
        return f"{p['gpu']} TP{p['tensorParallelSize']} PP{p['pipelineParallelSize']} ${p['pricePerHour']}"
    return (record.get("refused") or record.get("message") or "")[:100]


def sample(specs: list[dict[str, Any]], count: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """``count`` specs spread evenly over ``specs`` (every model still appears: they go round robin)."""
    step = max(1, len(specs) // count)
    for index in range(0, len(specs), step):
        if index // step >= count:
            break
        yield index, specs[index]
