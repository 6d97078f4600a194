"""Tune before scale: engine settings that serve the concurrency on a layout before more GPUs are tried.

vLLM's defaults are sized for throughput on a GPU with room to spare: max-num-seqs 256 or 1024 dummy
requests in the profiling step's sampler pass (float32 logits, ``seqs × vocab × 4`` bytes, a few
copies), max-num-batched-tokens 2048 or 8192 tokens of forward activations, gpu-memory-utilization 0.9,
and CUDA graphs captured outside the budget. When a layout's KV cache is a little short of
``concurrency`` sequences of ``maxModelLen``, giving up some of that is far cheaper than doubling the
GPUs. The ladder, least costly to the user first, stops at the first rung that serves:

1. gpu-memory-utilization up to the safe bound: at most 0.95, and only as far as leaves the CUDA-graph
   pool, the sampler warm-up and a 0.5 GiB margin free above it (the check that decided the calibration
   runs P26/P27, where vLLM died at 0.95). Costs nothing while the margin holds.
2. max-num-seqs down, never below the concurrency: fewer short requests run at once.
3. max-num-batched-tokens down, never below max-num-seqs nor 512: long prompts take more steps to
   prefill (chunked prefill, always on in the V1 engine).
4. enforce-eager (no CUDA graphs), then rungs 1–3 again: the graph pool's memory is freed (and
   utilization may rise into it), at the price of slower decode.

Each rung searches for the largest value that serves, not the smallest, so as little as needed is
given up. A value the spec pins (``spec.engine``) is never changed. Feasibility is monotone along the
ladder, so when its last rung (every free setting at its bound) does not serve, nothing will, and the
layout is rejected with that last rung's shortfall.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from loadline.sizing._budget import (
    GIB,
    EngineSettings,
    MemoryBudget,
    compute_budget,
    kv_bytes_per_layer_token,
)
from loadline.sizing._data import GPUType
from loadline.sizing._resolve import SpecInputs, engine_settings

#: Highest gpu-memory-utilization the planner sets by itself (vLLM's own examples go to 0.95).
MAX_UTILIZATION = 0.95
#: GiB kept free above the utilization line beyond the modelled CUDA graphs and sampler warm-up: the
#: graph estimate is 0.2–0.5 GiB off for MoE models (docs/sizing.md).
SAFE_HEADROOM_GIB = 0.5
#: Smallest max-num-batched-tokens the planner sets by itself.
MIN_BATCHED_TOKENS = 512


@dataclass(frozen=True)
class Tuned:
    """The settings chosen for one layout, their budget, and what was chosen and why."""

    settings: EngineSettings
    budget: MemoryBudget
    notes: tuple[str, ...]
    rejection: str = ""

    @property
    def serves(self) -> bool:
        return not self.rejection


def serves(budget: MemoryBudget, concurrency: int) -> bool:
    return budget.fits and budget.max_concurrency >= concurrency


def shortfall(inputs: SpecInputs, settings: EngineSettings, budget: MemoryBudget) -> str:
    """Why a budget does not serve the spec, with the shortfall in GiB; empty when it does."""
    if budget.problems:
        return "; ".join(budget.problems)
    if budget.max_concurrency >= inputs.concurrency:
        return ""
    arch = inputs.model.architecture
    per_layer = kv_bytes_per_layer_token(arch, settings)
    per_seq = budget.kv_bytes_per_token * inputs.max_model_len if per_layer else 0
    missing = (inputs.concurrency - budget.max_concurrency) * per_seq / GIB
    return (
        f"KV cache holds {budget.max_concurrency:.2f} sequences of {inputs.max_model_len} tokens, "
        f"concurrency {inputs.concurrency} needs ~{missing:.2f} GiB more per GPU"
    )


class _Layout:
    """One layout's budgets, computed on demand (each is a few dozen microseconds)."""

    def __init__(self, inputs: SpecInputs, gpu: GPUType, tp: int, pp: int) -> None:
        self.inputs, self.gpu, self.tp, self.pp = inputs, gpu, tp, pp
        self.base = engine_settings(inputs, gpu, tp, pp)
        self.free_util = inputs.gpu_memory_utilization is None
        self.free_seqs = inputs.max_num_seqs is None
        self.free_tokens = inputs.max_num_batched_tokens is None
        self.free_eager = not inputs.enforce_eager
        self.seq_floor = min(max(inputs.concurrency, 1), self.base.max_num_seqs)
        self.token_floor = min(max(self.seq_floor, MIN_BATCHED_TOKENS), self.base.max_num_batched_tokens)

    def budget(self, settings: EngineSettings) -> MemoryBudget:
        arch = self.inputs.model.architecture
        return compute_budget(
            arch, settings, self.gpu.memory_gib, exact_parameters=self.inputs.model.exact_parameters
        )

    def config(self, seqs: int, tokens: int, eager: bool) -> tuple[EngineSettings, MemoryBudget]:
        settings = engine_settings(
            self.inputs,
            self.gpu,
            self.tp,
            self.pp,
            max_num_seqs=seqs,
            max_num_batched_tokens=max(tokens, seqs),
            enforce_eager=eager,
        )
        budget = self.budget(settings)
        if self.free_util:
            safe = safe_utilization(settings, budget)
            if safe > settings.gpu_memory_utilization:
                settings = replace(settings, gpu_memory_utilization=safe)
                budget = self.budget(settings)
        return settings, budget

    def ok(self, budget: MemoryBudget) -> bool:
        return serves(budget, self.inputs.concurrency)


def safe_utilization(settings: EngineSettings, budget: MemoryBudget) -> float:
    """The highest utilization (≤ 0.95, two decimals) that leaves CUDA graphs, the sampler warm-up and
    the safety margin free above the line; ``budget`` is of ``settings`` at any utilization."""
    total = budget.total_gib
    graphs = 0.0 if settings.cuda_graph_in_kv_budget else budget.cuda_graph_gib
    room = (total - graphs - budget.sampler_warmup_gib - SAFE_HEADROOM_GIB) / total
    return min(MAX_UTILIZATION, math.floor(room * 100) / 100)


def _largest(values: list[int], works: Callable[[int], bool]) -> int | None:
    """The largest of ascending ``values`` for which ``works(v)`` holds, assuming it is monotone."""
    if not values or not works(values[0]):
        return None
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if works(values[mid]):
            lo = mid
        else:
            hi = mid - 1
    return values[lo]


def _steps(floor: int, top: int, step: int) -> list[int]:
    """Ascending candidates from ``floor`` to ``top``: both ends and the round values between."""
    inner = range((floor // step + 1) * step, top, step)
    return sorted({floor, *inner, top})


def _hopeless(layout: _Layout, budget: MemoryBudget) -> bool:
    """Weights and non-torch memory alone exceed the most any tuning could give: skip the ladder."""
    ceiling = MAX_UTILIZATION if layout.free_util else layout.base.gpu_memory_utilization
    return budget.weights_gib + budget.non_torch_gib >= budget.total_gib * ceiling


def tune(inputs: SpecInputs, gpu: GPUType, tp: int, pp: int) -> Tuned:
    """Walk the ladder of this module's docstring for one layout."""
    layout = _Layout(inputs, gpu, tp, pp)
    base = layout.base
    base_budget = layout.budget(base)
    if layout.ok(base_budget):
        return Tuned(
            base,
            base_budget,
            (
                f"vLLM's defaults serve concurrency {inputs.concurrency}: KV cache holds "
                f"{base_budget.max_concurrency:.2f} sequences of {inputs.max_model_len} "
                f"(max-num-seqs {base.max_num_seqs}, max-num-batched-tokens {base.max_num_batched_tokens}, "
                f"gpu-memory-utilization {base.gpu_memory_utilization})",
            ),
        )
    if _hopeless(layout, base_budget):
        return Tuned(base, base_budget, (), shortfall(inputs, base, base_budget))
    seqs_low = layout.seq_floor if layout.free_seqs else base.max_num_seqs
    tokens_low = layout.token_floor if layout.free_tokens else base.max_num_batched_tokens
    eager_last = True if layout.free_eager else base.enforce_eager
    last = layout.config(seqs_low, tokens_low, eager_last)
    if not layout.ok(last[1]):
        reason = shortfall(inputs, *last)
        if last[0] != base:
            reason += f" (also after tuning: {_settings_text(last[0])})"
        return Tuned(last[0], last[1], (), reason)
    eagers = [base.enforce_eager] + ([True] if layout.free_eager and not base.enforce_eager else [])
    for eager in eagers:
        found = _rung(layout, eager)
        if found is not None:
            return Tuned(found[0], found[1], _explain(layout, base_budget, *found))
    # Unreachable while feasibility is monotone (the last rung served); keep the last rung.
    return Tuned(last[0], last[1], _explain(layout, base_budget, *last))


def _rung(layout: _Layout, eager: bool) -> tuple[EngineSettings, MemoryBudget] | None:
    base = layout.base
    seqs, tokens = base.max_num_seqs, base.max_num_batched_tokens
    first = layout.config(seqs, tokens, eager)
    if layout.ok(first[1]):
        return first
    if layout.free_seqs:
        chosen = _largest(
            _steps(layout.seq_floor, seqs, 16), lambda v: layout.ok(layout.config(v, tokens, eager)[1])
        )
        if chosen is not None:
            return layout.config(chosen, tokens, eager)
        seqs = layout.seq_floor
    if layout.free_tokens:
        chosen = _largest(
            _steps(max(layout.token_floor, seqs), tokens, 256),
            lambda v: layout.ok(layout.config(seqs, v, eager)[1]),
        )
        if chosen is not None:
            return layout.config(seqs, chosen, eager)
    return None


def _settings_text(s: EngineSettings) -> str:
    text = (
        f"max-num-seqs {s.max_num_seqs}, max-num-batched-tokens {s.max_num_batched_tokens}, "
        f"gpu-memory-utilization {s.gpu_memory_utilization}"
    )
    return text + (", enforce-eager" if s.enforce_eager else "")


def _explain(
    layout: _Layout, base_budget: MemoryBudget, settings: EngineSettings, budget: MemoryBudget
) -> tuple[str, ...]:
    base, inputs = layout.base, layout.inputs
    notes = [
        f"vLLM's defaults hold {base_budget.max_concurrency:.2f} sequences of {inputs.max_model_len}"
        + (f" ({base_budget.problems[0]})" if base_budget.problems else "")
        + f"; tuned to serve concurrency {inputs.concurrency} on these GPUs instead of adding more:"
    ]
    if settings.gpu_memory_utilization != base.gpu_memory_utilization:
        free = budget.total_gib * (1 - settings.gpu_memory_utilization)
        notes.append(
            f"gpu-memory-utilization {settings.gpu_memory_utilization} (default "
            f"{base.gpu_memory_utilization}): {free:.2f} GiB stay free above it for CUDA graphs "
            f"({budget.cuda_graph_gib:.2f}), the sampler warm-up ({budget.sampler_warmup_gib:.2f}) and a "
            f"{SAFE_HEADROOM_GIB} GiB margin"
        )
    if settings.max_num_seqs != base.max_num_seqs:
        notes.append(
            f"max-num-seqs {settings.max_num_seqs} (default {base.max_num_seqs}, not below concurrency "
            f"{inputs.concurrency}): the profiling pass's sampler over fewer dummy requests leaves more "
            "for the KV cache; fewer short requests run at once"
        )
    if settings.max_num_batched_tokens != base.max_num_batched_tokens:
        notes.append(
            f"max-num-batched-tokens {settings.max_num_batched_tokens} (default "
            f"{base.max_num_batched_tokens}): smaller prefill chunks, smaller activation peak; long "
            "prompts take more steps to prefill"
        )
    if settings.enforce_eager and not base.enforce_eager:
        notes.append(
            "enforce-eager: no CUDA graphs, whose pool is freed for a higher utilization; decode is slower"
        )
    pinned = [
        name
        for name, free in (
            ("maxNumSeqs", layout.free_seqs),
            ("maxNumBatchedTokens", layout.free_tokens),
            ("gpuMemoryUtilization", layout.free_util),
        )
        if not free
    ]
    if pinned:
        notes.append("left as spec.engine pins them: " + ", ".join(pinned))
    notes.append(
        f"KV cache then holds {budget.max_concurrency:.2f} sequences of {inputs.max_model_len} "
        f"(≥ concurrency {inputs.concurrency})"
    )
    return tuple(notes)
