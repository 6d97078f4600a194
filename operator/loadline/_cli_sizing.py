"""``loadline size`` and ``loadline plan``: the sizing core from the command line.

``size`` answers "what does this engine configuration use on this GPU?" for one config.json;
``plan`` answers "what should I run this InferenceModel on?" for a manifest file.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from typing import Any

from loadline._cli_input import read_json
from loadline._cli_policy import Governed, describe_policies, govern, where
from loadline.api import InferenceModel, load_manifests
from loadline.errors import LoadlineError, SpecError
from loadline.policy import PlanFn
from loadline.render import resolve_version, vllm_command
from loadline.sizing import (
    Candidate,
    EngineSettings,
    Plan,
    beyond_tables,
    check_max_model_len,
    compute_budget,
    engine_version,
    find_gpu,
    gpu_catalog,
    model_catalog,
    parse_hf_config,
    plan_inference_model,
    resolve_dtype,
    resolve_quantization,
)
from loadline.sizing._align import head_problem, tp_problem
from loadline.sizing._arch import Architecture
from loadline.sizing._shapes import PROVIDERS

_DTYPES = ("auto", "bfloat16", "float16", "float32")
_KV_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


def _read_config(path: str) -> dict[str, Any]:
    data = read_json(path, "--config", "pass the model's config.json (- for standard input)")
    if not isinstance(data, dict):
        raise SpecError("--config", f"{path} is not a JSON object", "pass the model's config.json")
    return data


def _positive(flag: str, value: float | None) -> None:
    """argparse's int/float accept 0, negatives, ``nan`` and ``inf``; vLLM accepts none of them here."""
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise SpecError(flag, f"{value} is not a positive number", "give a value above 0")


def _check_parallel(arch: Architecture, tp: int, pp: int, quantization: str, version: str) -> None:
    """vLLM's own checks of the layout: the heads split over the ranks, and every layer's shard is whole
    (whole quantization blocks and groups too: :func:`loadline.sizing._align.tp_problem`)."""
    problem = f"{tp} is not a positive size" if tp < 1 else head_problem(arch, tp)
    if not problem and tp_problem(arch, quantization, version, tp):
        problem = f"{tp}: {tp_problem(arch, quantization, version, tp)}"
    if problem:
        below = range(max(min(tp, 65), 2) - 1, 0, -1)
        best = next(
            n for n in below if not head_problem(arch, n) and not tp_problem(arch, quantization, version, n)
        )
        fix = f"use {best}, the largest size below that vLLM accepts (--pipeline-parallel-size for more GPUs)"
        raise SpecError("--tensor-parallel-size", problem, fix)
    if pp < 1 or pp > arch.num_layers:
        raise SpecError(
            "--pipeline-parallel-size", f"{pp} is not between 1 and {arch.num_layers} layers", "lower it"
        )


def _cmd_size(args: argparse.Namespace) -> int:
    arch = parse_hf_config(_read_config(args.config), field_prefix="--config")
    table = engine_version(args.vllm_version)
    for flag in ("--gpu-memory-gib", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens"):
        _positive(flag, getattr(args, flag[2:].replace("-", "_")))
    if args.gpu_memory_gib is not None:
        gpu_name, memory, interconnect = "", float(args.gpu_memory_gib), args.interconnect or "nvlink"
    else:
        gpu = find_gpu(args.gpu, "--gpu")
        gpu_name, memory, interconnect = gpu.name, gpu.memory_gib, args.interconnect or gpu.interconnect
    _warn_beyond_tables([args.vllm_version])
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    quantization = resolve_quantization(args.quantization, arch, "--quantization")
    _check_parallel(arch, tp, pp, quantization, args.vllm_version)
    util = args.gpu_memory_utilization
    util = table.gpu_memory_utilization if util is None else util
    if not 0 < util <= 1:  # also false for nan
        raise SpecError("--gpu-memory-utilization", f"{util} is not in (0, 1]", "use e.g. 0.9")
    tier = table.batch_default(gpu_name, memory)
    seqs = tier.max_num_seqs if args.max_num_seqs is None else args.max_num_seqs
    tokens = args.max_num_batched_tokens
    tokens = tier.max_num_batched_tokens if tokens is None else tokens
    if tokens < seqs:  # vLLM's SchedulerConfig refuses to start
        raise SpecError(
            "--max-num-batched-tokens",
            f"{tokens} is below --max-num-seqs {seqs} (vLLM refuses to start)",
            f"raise it to at least {seqs} or lower --max-num-seqs",
        )
    if args.weight_bits is not None and not 1 <= args.weight_bits <= 16:
        raise SpecError("--weight-bits", f"{args.weight_bits} is not between 1 and 16", "use e.g. 4 or 8")
    settings = EngineSettings(
        dtype=resolve_dtype(arch, args.dtype),
        quantization=quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=util,
        max_model_len=check_max_model_len(arch, args.max_model_len, "--max-model-len"),
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        enforce_eager=args.enforce_eager,
        cuda_graph_in_kv_budget=table.cuda_graph_in_kv_budget,
        block_size=table.block_size,
        weight_bits=args.weight_bits,
        interconnect=interconnect,
    )
    budget = compute_budget(arch, settings, memory)
    result = {
        "gpu": gpu_name or None,
        "gpu_memory_gib": round(memory, 2),
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "interconnect": interconnect,
        "dtype": settings.dtype,
        "quantization": settings.quantization,
        "kv_cache_dtype": settings.kv_cache_dtype,
        "gpu_memory_utilization": util,
        "max_model_len": settings.max_model_len,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": tokens,
        "weights_gib": round(budget.weights_gib, 3),
        "activation_gib": round(budget.activation_gib, 3),
        "non_torch_gib": round(budget.non_torch_gib, 3),
        "cuda_graph_gib": round(budget.cuda_graph_gib, 3),
        "kv_cache_gib": round(budget.kv_cache_gib, 3),
        "kv_cache_tokens": budget.kv_cache_tokens,
        "gpu_blocks": budget.gpu_blocks,
        "max_concurrency": round(budget.max_concurrency, 2),
        "fits": budget.fits,
        "problems": list(budget.problems),
    }
    if args.output == "json":
        print(json.dumps(result))
    else:
        width = max(len(k) for k in result)
        for key, value in result.items():
            print(f"{key:<{width}}  {value}")
    return 0


def _plan_table(name: str, plan: Plan) -> str:
    s = plan.summary().model_dump(by_alias=True, mode="json")  # as status.plan shows it
    mem = s["memory"]
    shape = s["nodeShape"]
    caveat = ""
    if shape is not None and shape["pricePerHour"] is None:
        caveat = f" (no price known for {shape['name']})"
    elif shape is not None and not shape["priceVerified"]:
        caveat = f" (UNVERIFIED price: no dated source for {shape['name']}'s figure)"
    lines = [
        f"{name}: {plan.model.model_id} → {s['gpu']} × {plan.replicas} replica(s)"
        f" (TP {s['tensorParallelSize']}, PP {s['pipelineParallelSize']}, {s['nodesPerReplica']} node(s)),"
        f" ${s['pricePerHour']:.2f}/h{caveat}",
        f"  engine: vLLM {s['engineVersion']}, dtype {plan.settings.dtype}, quantization "
        f"{plan.settings.quantization}, kv-cache-dtype {plan.settings.kv_cache_dtype}",
        f"  batching: max-model-len {s['maxModelLen']}, max-num-seqs {s['maxNumSeqs']}, "
        f"max-num-batched-tokens {s['maxNumBatchedTokens']}, "
        f"gpu-memory-utilization {s['gpuMemoryUtilization']}",
        f"  per GPU ({mem['totalGiB']} GiB): weights {mem['weightsGiB']}, "
        f"activation {mem['activationGiB']}, non-torch {mem['nonTorchGiB']}, "
        f"CUDA graphs {mem['cudaGraphGiB']}, KV cache {mem['kvCacheGiB']} GiB",
        f"  KV cache: {s['kvCacheTokens']} tokens = {s['maxConcurrency']} sequences of {s['maxModelLen']}",
        f"  download: {s['downloadGiB']} GiB per pod ({plan.download.format} checkpoint)",
        _provider_line(plan),
    ]
    if shape is not None:
        price = "no price" if shape["pricePerHour"] is None else f"${shape['pricePerHour']:.2f}/h"
        if shape["pricePerHour"] is not None and not shape["priceVerified"]:
            price += " UNVERIFIED"
        host = (
            f"{shape['hostMemoryGiB']:g} GiB ({shape['allocatableMemoryGiB']:g} allocatable), "
            f"{shape['vcpus']:g} vCPU ({shape['allocatableCPU']:g} allocatable)"
            if shape["hostMemoryGiB"] is not None
            else "host memory and CPU not in the catalog"
        )
        lines.append(
            f"  node shape: {shape['instancesPerReplica']} × {shape['name']} ({shape['provider']}, "
            f"{shape['gpusPerNode']} GPUs {shape['interconnect']}, rdma {shape['rdma']}, {host}, {price}); "
            f"pod asks {shape['podMemoryGiB']} GiB, {shape['podCPU']} CPU"
        )
        if shape["why"]:
            lines.append(f"    why: {shape['why']}")
        if s["priceBasis"]:
            lines.append(f"  price per replica: {s['priceBasis']}")
    if s["tuning"]:
        lines.append("  tuning: " + s["tuning"][0])
        lines.extend(f"    - {note}" for note in s["tuning"][1:])
    if plan.fallback_from:
        lines.append(f"  fallback: {plan.fallback_from} had no free capacity")
    if plan.rejected:
        # One line per GPU type: its largest layout tried (the closest miss); JSON lists them all.
        closest: dict[str, Candidate] = {}
        for candidate in plan.rejected:
            best = closest.get(candidate.gpu.name)
            if best is None or candidate.gpus >= best.gpus:
                closest[candidate.gpu.name] = candidate
        hidden = len(plan.rejected) - len(closest)
        lines.append("  other candidates (largest layout tried per GPU type):")
        lines.extend(f"    - {c.label}: {c.rejection}" for c in closest.values())
        if hidden:
            lines.append(f"    ({hidden} smaller layouts also rejected; --output json lists every one)")
    return "\n".join(lines)


def _cmd_plan(args: argparse.Namespace) -> int:
    if args.list_models:
        for entry in sorted({m.id: m for m in model_catalog().values()}.values(), key=lambda m: m.id):
            print(entry.id)
        return 0
    if not args.file:
        raise SpecError("FILE", "is required", "pass an InferenceModel YAML file")
    manifests = load_manifests(args.file)
    if args.provider:
        manifests.models = [(source, _with_providers(obj, args.provider)) for source, obj in manifests.models]
    if not manifests.models:
        print(describe_policies(manifests.policies))
        return 0
    # FleetPolicies among the files govern the models as admission does in the cluster.
    results = govern(manifests, plan_fn=planner(args.observations))
    for governed in results:
        _check_command(governed)
    _warn_beyond_tables([g.plan.inputs.version for g in results])
    if args.output == "json":
        payload = [
            {
                "name": g.name,
                **g.plan.to_dict(),
                **({"policies": [p.name for p in g.policies]} if g.policies else {}),
            }
            for g in results
        ]
        print(json.dumps(payload, indent=2))  # always a list: scripts need not test for one model
    else:
        print("\n\n".join(_governed_table(g) for g in results))
    return 0


def planner(observations: str | None) -> PlanFn:
    """The planner, with the learned corrections of an observations file (``--observations``)."""
    if not observations:
        return plan_inference_model
    from loadline._cli_observe import read_store

    store = read_store(observations, "--observations")
    return functools.partial(plan_inference_model, corrections=store)


def _warn_beyond_tables(versions: list[str]) -> None:
    """One line on standard error per vLLM version newer than every table (:func:`beyond_tables`)."""
    for version in dict.fromkeys(versions):
        warning = beyond_tables(version)
        if warning:
            print(f"loadline: warning: {warning}", file=sys.stderr)


def _with_providers(obj: InferenceModel, providers: list[str]) -> InferenceModel:
    """``--provider``: the command line does not know the cluster, so it says where the nodes come from
    (replacing ``spec.gpu.providers``), as the operator learns it from the cluster's nodes."""
    gpu = obj.spec.gpu.model_copy(update={"providers": list(dict.fromkeys(providers))})
    return obj.model_copy(update={"spec": obj.spec.model_copy(update={"gpu": gpu})})


def _provider_line(plan: Plan) -> str:
    """Which provider the plan assumes, and whether the user chose it or the planner did."""
    shape = plan.chosen.shape
    provider = shape.provider if shape is not None else "?"
    chosen = plan.inputs.providers
    if chosen:
        return f"  provider: {provider} (allowed: {', '.join(chosen)})"
    return (
        f"  provider: {provider}, the cheapest of all providers' shapes, verified prices first "
        "(pass --provider aws|gcp|azure|onprem or set spec.gpu.providers to plan for yours)"
    )


def _check_command(governed: Governed) -> None:
    """Build the vLLM command line without printing it: a plan whose extraArgs or env vLLM (or the
    renderer) would refuse is refused here too, so ``plan`` never blesses what ``render`` rejects."""
    obj = governed.obj
    try:
        version = resolve_version(obj.spec.engine.version, "spec.engine.version")
        vllm_command(obj, governed.plan, version)
    except LoadlineError as exc:
        raise exc.at(f"{governed.source}: {where(obj)}") from None


def _governed_table(governed: Governed) -> str:
    table = _plan_table(governed.name, governed.plan)
    if not governed.policies:
        return table
    names = ", ".join(f"{p.name} ({p.spec.enforcement})" for p in governed.policies)
    lines = [f"  policies: {names}", *(f"  default: {note}" for note in governed.notes)]
    return table + "\n" + "\n".join(lines)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    size = sub.add_parser("size", help="memory budget of one vLLM configuration on one GPU type")
    size.add_argument("--config", required=True, help="the model's Hugging Face config.json; - for stdin")
    where = size.add_mutually_exclusive_group()
    where.add_argument("--gpu", default="H100-80GB", help=f"GPU type: {', '.join(gpu_catalog())}")
    where.add_argument("--gpu-memory-gib", type=float, help="GPU memory in GiB instead of a catalog GPU")
    size.add_argument("--dtype", choices=_DTYPES, default="auto")
    size.add_argument("--quantization", default="none", help="vLLM quantization method")
    size.add_argument("--weight-bits", type=float, help="bits per quantized weight when the config lacks it")
    size.add_argument("--kv-cache-dtype", choices=_KV_DTYPES, default="auto")
    size.add_argument("--tensor-parallel-size", type=int, default=1)
    size.add_argument("--pipeline-parallel-size", type=int, default=1)
    size.add_argument(
        "--interconnect",
        choices=("nvlink", "pcie"),
        help="between the tensor-parallel GPUs (non-torch memory); default: the GPU type's, nvlink with "
        "--gpu-memory-gib",
    )
    size.add_argument("--gpu-memory-utilization", type=float)
    size.add_argument("--max-model-len", type=int)
    size.add_argument("--max-num-seqs", type=int)
    size.add_argument("--max-num-batched-tokens", type=int)
    size.add_argument("--enforce-eager", action="store_true")
    size.add_argument("--vllm-version", default="0.19.0")
    size.add_argument("--output", choices=("text", "json"), default="text")
    size.set_defaults(func=_cmd_size)

    plan = sub.add_parser(
        "plan",
        help="plan GPUs for the InferenceModels in YAML files, under the FleetPolicies among them",
    )
    plan.add_argument(
        "file",
        nargs="*",
        help="YAML files of InferenceModels, FleetPolicies and Namespaces; - for standard input",
    )
    plan.add_argument("--output", choices=("table", "json"), default="table")
    plan.add_argument("--list-models", action="store_true", help="list the bundled model catalog")
    plan.add_argument(
        "--provider",
        action="append",
        choices=PROVIDERS,
        help="where the nodes come from (repeatable; replaces spec.gpu.providers); default: any",
    )
    plan.add_argument(
        "--observations",
        metavar="FILE",
        help="learned corrections: an ObservationStore ('loadline observe --add-to' writes one) or the "
        "operator's loadline-observations ConfigMap as YAML",
    )
    plan.set_defaults(func=_cmd_plan)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
