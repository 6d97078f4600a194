"""Proposing a fix for a diagnosed out-of-memory incident.

Pure: the proposal is plain data (the action, each field to change with its old and new value, and
alternatives). Whether to apply it, when, and how often (budgets, cool-downs, ``auto``/``recommend``
modes) is the operator's decision; the old values are in the proposal so it can record them and never
undo a change within its cool-down. Every change is one step, so a wrong guess costs little and a
repeated incident walks down the ladder instead of jumping to the bottom.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from loadline.oom._model import Change, Config, Diagnosis, Incident, OomClass, Option, Remediation
from loadline.sizing import weights_from_name
from loadline.units import GIB

__all__ = ["next_rung", "propose_remediation"]

# vLLM's defaults, used when the config does not say (old value then reported as None).
_DEFAULT_GPU_UTIL = 0.9
# One step down for gpu_memory_utilization, and the floor below which we stop and ask a person.
_UTIL_STEP = 0.05
_UTIL_FLOOR = 0.5
# Raised (only for vLLM's "no room for KV blocks" refusal) up to this: above it CUDA graphs, NCCL and the
# CUDA context, which vLLM's budget does not hold, have too little left.
_UTIL_CEILING = 0.95
# max_num_batched_tokens is not halved below this: smaller prefill chunks cost more than they save.
_MIN_BATCHED_TOKENS = 2048
# max_model_len is proposed in multiples of this (a whole number of KV blocks for any block size).
_LEN_STEP = 256
# A re-plan keeps the weights under this share of a GPU, leaving the rest for KV cache and activations.
_WEIGHTS_SHARE = 0.7
# A raised memory limit is at least this much bigger, rounded up to a whole GiB.
_MEMORY_FACTOR = 1.2
# A crash at prompt length P proposes a limit under P by this margin...
_PROMPT_MARGIN = 0.9
# ...but only when P was long for the limit (or grew on the caller's side): a KV cache full of many
# short requests is not cured by a lower max_model_len.
_LONG_PROMPT = 0.75


def _round_len(tokens: float) -> int:
    return max(_LEN_STEP, int(tokens // _LEN_STEP) * _LEN_STEP)


def _util_step(old: float) -> float | None:
    new = round(old - _UTIL_STEP, 2)
    return new if new >= _UTIL_FLOOR else None


def _util_raise(old: float) -> float | None:
    new = round(min(_UTIL_CEILING, old + _UTIL_STEP), 2)
    return new if new > old else None


def _replan(incident: Incident, diagnosis: Diagnosis) -> Remediation:
    plan, config = incident.plan, incident.config
    tp = config.tensor_parallel_size or 1
    # The plan's figures, else the model's name (the catalog's count or a floor) and the allocator's
    # "total capacity": the same witnesses the classifier read.
    weights, said = plan.weights_gib, ""
    if weights is None and incident.model:
        named = weights_from_name(incident.model, config.dtype, config.quantization)
        if named is not None:
            weights, said = round(named.gib, 1), f"at least {round(named.gib, 1)} GiB, from {named.basis}"
    gpu = plan.gpu_memory_gib or (diagnosis.figures.total_gib if diagnosis.figures else None)
    if weights is None or gpu is None:
        return Remediation(
            action="replan",
            summary=(
                f"The weights do not fit: re-plan with tensor parallel {tp * 2} (twice the GPUs), a bigger "
                "GPU or a quantized checkpoint. The plan's weight size is unknown, so check the new plan "
                "with `loadline plan` before applying it."
            ),
            changes=(Change("config.tensor_parallel_size", config.tensor_parallel_size, tp * 2),),
            look_at=("plan.weights_gib and plan.gpu_memory_gib (missing, so the step is a guess)",),
        )
    budget = _WEIGHTS_SHARE * gpu
    new_tp = tp * 2
    while weights / new_tp > budget and new_tp < 64:
        new_tp *= 2
    min_gpu = math.ceil(weights / tp / _WEIGHTS_SHARE * 10) / 10
    alternatives = [
        Option(
            action="bigger_gpu",
            summary=f"Keep tensor parallel {tp} on a GPU with at least {min_gpu} GiB.",
            changes=(Change("plan.gpu_memory_gib", gpu, min_gpu),),
        )
    ]
    if plan.quantization_allowed:
        alternatives.append(
            Option(
                action="quantize",
                summary=(
                    f"Serve an FP8 checkpoint: 16-bit weights halve to about {round(weights / 2, 1)} GiB."
                ),
                changes=(Change("config.quantization", None, "fp8"),),
            )
        )
    return Remediation(
        action="replan",
        summary=(
            f"The weights ({said or f'{weights} GiB'}) do not fit {tp} GPU(s) of {gpu} GiB: "
            f"spread them over tensor parallel {new_tp} ({round(weights / new_tp, 1)} GiB per GPU)."
        ),
        changes=(Change("config.tensor_parallel_size", config.tensor_parallel_size, new_tp),),
        alternatives=tuple(alternatives),
    )


def _util_option(
    direction: str, old: float | None, start: float, new: float | None, why: str
) -> Option | None:
    """One step of gpu_memory_utilization (``direction``: "lower" or "raise") from ``start`` (``old``
    as the config said it, None: vLLM's default) to ``new``; None when there is no step left."""
    if new is None:
        return None
    return Option(
        f"{direction}_gpu_memory_utilization",
        f"{direction.capitalize()} gpu_memory_utilization from {start} to {new}: {why}",
        (Change("config.gpu_memory_utilization", old, new),),
    )


def _lower_util(config: Config, why: str) -> Option | None:
    """One step down of gpu_memory_utilization from the config's (vLLM's default when it does not say)."""
    old = config.gpu_memory_utilization
    start = old if old is not None else _DEFAULT_GPU_UTIL
    return _util_option("lower", old, start, _util_step(start), why)


def _batch_options(diagnosis: Diagnosis, incident: Incident) -> list[Option]:
    """Each knob that could go down one step, most relevant first."""
    config = incident.config
    seqs_old = config.max_num_seqs if config.max_num_seqs is not None else diagnosis.warmup_requests
    util_old = config.gpu_memory_utilization
    util_from = util_old if util_old is not None else _DEFAULT_GPU_UTIL
    batched_old = config.max_num_batched_tokens

    seqs = None
    if seqs_old is not None and seqs_old > 1:
        new = max(1, seqs_old // 2)
        seqs = Option(
            "lower_max_num_seqs",
            f"Halve max_num_seqs from {seqs_old} to {new}: fewer sequences per step need less memory for "
            "sampling and CUDA graphs.",
            (Change("config.max_num_seqs", seqs_old, new),),
        )
    util = _lower_util(
        config, "the KV cache gets a little less and CUDA graphs, the sampler and NCCL get that headroom."
    )
    batched = None
    if batched_old is not None and batched_old > _MIN_BATCHED_TOKENS:
        new = max(_MIN_BATCHED_TOKENS, batched_old // 2)
        batched = Option(
            "lower_max_num_batched_tokens",
            f"Halve max_num_batched_tokens from {batched_old} to {new}: the activation peak of a step "
            "shrinks with it.",
            (Change("config.max_num_batched_tokens", batched_old, new),),
        )

    signals = set(diagnosis.signals)
    if "no_cache_blocks" in signals:
        # vLLM's budget (gpu_memory_utilization of the GPU) held the weights and the profiling batch's
        # peak but nothing for KV blocks: a smaller profiling batch or a larger budget makes room; a
        # smaller budget makes less (kv_cache_utils.check_enough_kv_cache_memory, the V0 worker alike).
        raise_util = _util_option(
            "raise", util_old, util_from, _util_raise(util_from),
            "vLLM left no room for KV cache blocks within its budget, as its own message says.",
        )  # fmt: skip
        return [o for o in (batched, seqs, raise_util) if o is not None]
    if "sampler_warmup" in signals:
        order = [seqs, util, batched]
    elif "profiling_oom" in signals:
        order = [batched, util, seqs]
    else:  # CUDA graph capture, a too-high utilization, or the first batches
        order = [util, seqs, batched]
    return [o for o in order if o is not None]


def _batch(diagnosis: Diagnosis, incident: Incident) -> Remediation:
    options = _batch_options(diagnosis, incident)
    if not options:
        return Remediation(
            action="none",
            summary="Every batch knob is already at its floor; a person should look at the plan.",
            look_at=("whether the model needs a bigger GPU even though the weights fit",),
        )
    first = options[0]
    return Remediation(
        action=first.action,
        summary=first.summary + " One step; if it happens again the next incident takes the next step.",
        changes=first.changes,
        alternatives=tuple(options[1:]),
    )


def _kv_pool_gib(incident: Incident) -> float | None:
    plan, config = incident.plan, incident.config
    if plan.weights_gib is None or plan.gpu_memory_gib is None:
        return None
    util = config.gpu_memory_utilization or _DEFAULT_GPU_UTIL
    pool = plan.gpu_memory_gib * util - plan.weights_gib / (config.tensor_parallel_size or 1)
    return round(pool, 1) if pool > 0 else None


def _kv(diagnosis: Diagnosis, incident: Incident) -> Remediation:
    config, metrics = incident.config, incident.metrics
    old = config.max_model_len if config.max_model_len is not None else diagnosis.logged_max_model_len
    capacity = diagnosis.kv_capacity_tokens
    prompt = metrics.prompt_tokens_max
    if prompt is None and metrics.prompt_tokens_recent:
        prompt = max(metrics.prompt_tokens_recent)
    new: int | None = None
    why = ""
    if capacity is not None and (old is None or capacity < old):
        new = _round_len(capacity)
        why = f"the KV cache holds {capacity} tokens"
    elif prompt is not None and (old is None or diagnosis.caller_side or prompt >= _LONG_PROMPT * old):
        new = _round_len(min(prompt, old or prompt) * _PROMPT_MARGIN)
        why = f"the crash came with prompts of {prompt} tokens"
    elif old is not None and prompt is None:
        new = _round_len(old * 0.75)
        why = "one step down (a quarter) from the current limit"
    # Otherwise the prompts were short: a lower limit would not have helped, offload or a tier might.

    alternatives: list[Option] = []
    if not config.kv_offload_cpu_gib:
        pool = _kv_pool_gib(incident)
        alternatives.append(
            Option(
                "enable_kv_offload",
                "Enable CPU KV offload so long contexts spill to host RAM"
                + (f" (about {pool} GiB, the size of the GPU KV pool)" if pool else "")
                + "; the memory limit must grow by as much.",
                (Change("config.kv_offload_cpu_gib", config.kv_offload_cpu_gib, pool),) if pool else (),
            )
        )
    alternatives.append(
        Option("move_up_tier", "Move to a bigger GPU tier so the full max_model_len fits in the KV cache.")
    )
    if new is None or (old is not None and new >= old):
        first = alternatives[0]
        return Remediation(
            action=first.action,
            summary=first.summary,
            changes=first.changes,
            alternatives=tuple(alternatives[1:]),
        )
    return Remediation(
        action="lower_max_model_len",
        summary=(
            f"Lower max_model_len {f'from {old} ' if old is not None else ''}to {new} ({why}): requests "
            "longer than that get a clear 400 error from vLLM instead of crashing the server."
        ),
        changes=(Change("config.max_model_len", old, new),),
        alternatives=tuple(alternatives),
    )


def _fragmentation(incident: Incident) -> Remediation:
    """Expandable segments (or, once they are on, a clean restart); then one step less of the budget.

    vLLM sizes its KV cache once, at start-up, to fill gpu_memory_utilization of the GPU; what the engine
    allocates after that (activations, the sampler's tensors) comes from PyTorch's caching allocator,
    out of what the KV cache left. One step lower leaves that share of the GPU unallocated, where the
    allocator can map a new segment when its cached pieces cannot hold a request, whatever split them:
    the next rung when the allocator's own fixes did not hold."""
    config = incident.config
    already = bool(config.expandable_segments)
    look_at = (
        "If GPU memory climbs again after the restart, it is a leak rather than fragmentation: check the "
        "engine version's known issues.",
    )
    lower = _lower_util(
        config,
        "the KV cache gives up that share of the GPU, which the allocator then has as fresh memory "
        "beside its cached pieces.",
    )
    alternatives = (lower,) if lower is not None else ()
    if already:
        return Remediation(
            action="restart",
            summary=(
                "expandable_segments is already on: restart the pod (at a quiet moment) to give the "
                "allocator a clean slate."
            ),
            restart=True,
            alternatives=alternatives,
            look_at=look_at,
        )
    return Remediation(
        action="restart_with_expandable_segments",
        summary=(
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so freed blocks can be reused whatever "
            "their size, and restart the pod (at a quiet moment)."
        ),
        changes=(Change("env.PYTORCH_CUDA_ALLOC_CONF", None, "expandable_segments:True"),),
        restart=True,
        alternatives=alternatives,
        look_at=look_at,
    )


def _host(diagnosis: Diagnosis, incident: Incident) -> Remediation:
    config = incident.config
    limit = config.memory_limit_bytes
    offload = config.kv_offload_cpu_gib
    raise_limit: Option | None = None
    if limit is not None:
        new_limit = math.ceil(limit * _MEMORY_FACTOR / GIB) * GIB
        raise_limit = Option(
            "raise_memory_limit",
            f"Raise the memory request and limit from {limit / GIB:.1f} GiB to {new_limit // GIB} GiB "
            "(at least +20%).",
            (Change("config.memory_limit_bytes", limit, new_limit),),
        )
    shrink: Option | None = None
    if offload:
        new_offload = math.floor(offload / 2 * 10) / 10
        shrink = Option(
            "shrink_kv_offload",
            f"Halve the CPU KV offload from {offload} GiB to {new_offload} GiB so it fits the limit.",
            (Change("config.kv_offload_cpu_gib", offload, new_offload),),
        )
    offload_heavy = "offload_large" in diagnosis.signals
    order = [shrink, raise_limit] if offload_heavy else [raise_limit, shrink]
    options = [o for o in order if o is not None]
    look_at = []
    if "ray_oom" in diagnosis.signals:
        look_at.append("Ray's memory monitor acts on the whole node: other pods' RAM counts too.")
    if {"shm_full", "bus_error"} & set(diagnosis.signals):
        look_at.append(
            "the pod's /dev/shm: an emptyDir in memory whose sizeLimit the plan sets; a raised memory "
            "limit leaves that size as it is"
        )
    if not options:
        return Remediation(
            action="raise_memory_limit",
            summary="Raise the container's memory request and limit by at least 20%; the current limit is "
            "not recorded, so a person must pick the number.",
            look_at=(*look_at, "the pod's resources.limits.memory"),
        )
    first = options[0]
    return Remediation(
        action=first.action,
        summary=first.summary,
        changes=first.changes,
        alternatives=tuple(options[1:]),
        look_at=tuple(look_at),
    )


def _unknown(diagnosis: Diagnosis) -> Remediation:
    look_at: list[str] = []
    signals = set(diagnosis.signals)
    if "external_memory" in signals:
        look_at.append("Other processes on the GPU (nvidia-smi on the node): memory was held outside vLLM.")
    if not diagnosis.signals:
        look_at.append("Whether this was a memory problem at all: the termination reason and exit code.")
    look_at.append(
        "The whole previous log (kubectl logs --previous) and the node's OOMKilling/SystemOOM events."
    )
    look_at.append(
        "Prometheus just before the crash: vllm:kv_cache_usage_perc, vllm:request_prompt_tokens, "
        "vllm:num_requests_running and the GPU memory trend."
    )
    ranked = sorted((s for s in diagnosis.scores if s[1] > 0), key=lambda cs: -cs[1])
    if ranked:
        look_at.append(
            "The candidates, strongest first: " + ", ".join(f"{c.value} ({s})" for c, s in ranked[:3]) + "."
        )
    return Remediation(
        action="none",
        summary="The evidence does not decide the cause; changing settings blindly could make it worse.",
        look_at=tuple(look_at),
    )


def propose_remediation(diagnosis: Diagnosis, incident: Incident) -> Remediation:
    """The one-step fix for ``diagnosis``, computed from the incident's config and plan."""
    match diagnosis.oom_class:
        case OomClass.MODEL_EXCEEDS_VRAM:
            return _replan(incident, diagnosis)
        case OomClass.BATCH_MISCONFIGURATION:
            return _batch(diagnosis, incident)
        case OomClass.KV_CACHE_OVERFLOW:
            return _kv(diagnosis, incident)
        case OomClass.FRAGMENTATION:
            return _fragmentation(incident)
        case OomClass.HOST_MEMORY:
            return _host(diagnosis, incident)
        case _:
            return _unknown(diagnosis)


def next_rung(proposal: Remediation, failed: Collection[str]) -> Remediation | None:
    """``proposal`` without the fixes that already failed for its class (the class came back after them):
    its first alternative not tried in vain becomes the action. None when every rung has failed: then a
    person must look, with the history.

    A fix that did not work is not repeated, however sure the diagnosis: doing the same thing again
    costs a restart and changes nothing the last one did not.
    """
    if proposal.action == "none" or proposal.action not in failed:
        return proposal
    left = [o for o in proposal.alternatives if o.action not in failed]
    if not left:
        return None
    first = left[0]
    return Remediation(
        action=first.action,
        summary=f"{first.summary} ({proposal.action} was tried and the crash came back.)",
        changes=first.changes,
        alternatives=tuple(left[1:]),
        look_at=proposal.look_at,
    )
