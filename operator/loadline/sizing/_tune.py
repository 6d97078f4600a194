"""Tune before scale: engine settings that serve the concurrency on a layout before more GPUs are tried.

vLLM's defaults are sized for throughput on a GPU with room to spare: max-num-seqs 256 or 1024 dummy
requests in the profiling step's sampler pass (float32 logits, ``seqs × vocab × 4`` bytes, a few
copies), max-num-batched-tokens 2048 or 8192 tokens of forward activations, gpu-memory-utilization 0.9,
and CUDA graphs captured outside the budget. When a layout's KV cache is a little short of
``concurrency`` sequences of ``maxModelLen``, giving up some of that is far cheaper than doubling the
GPUs. The ladder, least costly to the user first, stops at the first rung that serves:

1. gpu-memory-utilization to the safe bound: at most 0.95, and only as far as leaves the CUDA-graph
   pool, the sampler warm-up and a 0.5 GiB margin free above it (the check that decided the calibration
   runs P26/P27, where vLLM died at 0.95). Costs nothing while the margin holds. Where vLLM's default
   leaves too little above the line (a large graph pool or warm-up on a small GPU), the bound is below
   the default: CUDA graphs at a lower utilization, before eager mode is tried.
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
from dataclasses import dataclass
from functools import cache

from loadline.sizing._budget import (
    EngineSettings,
    FixedTerms,
    MemoryBudget,
    ModelTerms,
    Pool,
    blocks_within,
    kv_bytes_per_layer_token,
    model_terms,
)
from loadline.sizing._data import GPUType, engine_version
from loadline.sizing._resolve import SpecInputs
from loadline.units import GIB

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


#: One setting of the tuned values: (max-num-seqs, max-num-batched-tokens, gpu-memory-utilization,
#: enforce-eager); every other engine setting is the layout's own.
Config = tuple[int, int, float, bool]


def defaults(inputs: SpecInputs, gpu: GPUType, concurrency: int | None = None) -> Config:
    """engine_settings(inputs, gpu, tp, pp)'s tuned values: vLLM's defaults for this version and GPU
    (max-num-seqs at least the concurrency), or what the spec pins."""
    tier_seqs, tier_tokens, utilization, _ = version_defaults(inputs.version, gpu.name, gpu.memory_gib)
    concurrency = inputs.concurrency if concurrency is None else concurrency
    seqs = inputs.max_num_seqs or max(tier_seqs, concurrency)
    tokens = inputs.max_num_batched_tokens or max(tier_tokens, seqs)
    return (seqs, tokens, inputs.gpu_memory_utilization or utilization, inputs.enforce_eager)


@cache
def version_defaults(version: str, gpu_name: str, memory_gib: float) -> tuple[int, int, float, int]:
    """vLLM's max-num-seqs, max-num-batched-tokens, gpu-memory-utilization and block size for a version
    on a GPU (the engine table is bundled data, read once)."""
    table = engine_version(version)
    tier = table.batch_default(gpu_name, memory_gib)
    return tier.max_num_seqs, tier.max_num_batched_tokens, table.gpu_memory_utilization, table.block_size


def _config(
    fixed: FixedTerms, inputs: SpecInputs, base: Config, seqs: int, tokens: int, eager: bool
) -> Config:
    """engine_settings(max_num_seqs=seqs, max_num_batched_tokens=max(tokens, seqs), enforce_eager=
    eager), with the utilization raised to the safe bound when the spec leaves it free."""
    seqs = seqs or inputs.max_num_seqs or base[0]
    tokens = max(tokens, seqs) or inputs.max_num_batched_tokens or base[1]
    utilization = base[2]
    if inputs.gpu_memory_utilization is None:
        # The safe bound, up or down: below vLLM's default where that leaves too little above the line
        # for the CUDA-graph pool and the sampler warm-up (graphs at a lower utilization, not eager).
        graphs = 0.0 if inputs.cuda_graphs_counted else fixed.cuda_graph_gib(eager)
        utilization = _safe_utilization(fixed.gpu_memory_gib, graphs, fixed.sampler_warmup_gib(seqs))
    return (seqs, tokens, utilization, eager)


def _floors(inputs: SpecInputs, base: Config, concurrency: int) -> tuple[int, int]:
    """The lowest max-num-seqs (the concurrency) and max-num-batched-tokens (512, or max-num-seqs) the
    ladder sets, never above the defaults."""
    seq_floor = min(max(concurrency, 1), base[0])
    return seq_floor, min(max(seq_floor, MIN_BATCHED_TOKENS), base[1])


def last_rung(fixed: FixedTerms, inputs: SpecInputs, base: Config, concurrency: int) -> Config:
    """The ladder's last rung: every free setting at its bound."""
    seq_floor, token_floor = _floors(inputs, base, concurrency)
    seqs_low = seq_floor if inputs.max_num_seqs is None else base[0]
    tokens_low = token_floor if inputs.max_num_batched_tokens is None else base[1]
    eager_last = True if not inputs.enforce_eager else base[3]
    return _config(fixed, inputs, base, seqs_low, tokens_low, eager_last)


def hopeless(fixed: FixedTerms, inputs: SpecInputs, base: Config) -> bool:
    """Weights and non-torch memory alone exceed the most any tuning could give: skip the ladder."""
    ceiling = MAX_UTILIZATION if inputs.gpu_memory_utilization is None else base[2]
    return fixed.weights_gib + fixed.non_torch_gib >= fixed.gpu_memory_gib * ceiling


def layout_serves(fixed: FixedTerms, inputs: SpecInputs, base: Config, length: int, concurrency: int) -> bool:
    """Whether :func:`tune` finds settings that serve ``concurrency`` sequences of ``length`` on this
    layout (``base``: :func:`defaults`). Feasibility is monotone along the ladder, so vLLM's defaults or
    the last rung decide: the defaults serve, or the weights leave room and the last rung serves."""
    if fixed.serves(fixed.cached_pool(base), length, concurrency):
        return True
    return ladder_serves(fixed, inputs, base, length, concurrency)


def ladder_serves(fixed: FixedTerms, inputs: SpecInputs, base: Config, length: int, concurrency: int) -> bool:
    """:func:`layout_serves` when vLLM's defaults do not serve: whether the last rung does."""
    if hopeless(fixed, inputs, base):
        return False
    # The last rung runs eager (no CUDA graphs) at the safe utilization (at most 0.95) or the spec's:
    # when even that much of the GPU, with no activations, holds too few blocks, it does not serve.
    utilization = base[2] if inputs.gpu_memory_utilization is not None else max(base[2], MAX_UTILIZATION)
    if not fixed.may_serve(utilization, length, concurrency):
        return False
    return last_rung_serves(fixed, inputs, base, length, concurrency)


def last_rung_serves(
    fixed: FixedTerms, inputs: SpecInputs, base: Config, length: int, concurrency: int
) -> bool:
    """Whether the ladder's last rung serves (memoised per layout): :func:`ladder_serves` once the
    weights leave room and the blocks at its utilization might hold the sequences (the planner tests
    both before the layout's terms exist)."""
    key = (
        base,
        concurrency,
        inputs.max_num_seqs,
        inputs.max_num_batched_tokens,
        inputs.gpu_memory_utilization,
        inputs.enforce_eager,
    )
    ladders = fixed.ladders
    if ladders is None or len(ladders) >= 256:
        ladders = fixed.ladders = {}
    pool = ladders.get(key)
    if pool is None:
        pool = ladders[key] = fixed.cached_pool(last_rung(fixed, inputs, base, concurrency))
    return fixed.serves(pool, length, concurrency)


class _Layout:
    """One layout's settings and budgets. The ladder probes settings with :meth:`ok` (a few
    multiplications on the layout's :class:`~loadline.sizing._budget.FixedTerms`); only the settings it
    returns become an :class:`EngineSettings` and a :class:`MemoryBudget` (:meth:`materialize`), with the
    very figures the probe judged. ``length`` and ``concurrency`` replace the spec's (refusal fixes)."""

    __slots__ = (
        "base",
        "block_size",
        "concurrency",
        "fixed",
        "free_eager",
        "free_seqs",
        "free_tokens",
        "free_util",
        "inputs",
        "interconnect",
        "length",
        "pp",
        "seq_floor",
        "token_floor",
        "tp",
    )

    def __init__(
        self,
        inputs: SpecInputs,
        gpu: GPUType,
        tp: int,
        pp: int,
        *,
        length: int | None = None,
        concurrency: int | None = None,
        terms: ModelTerms | None = None,
    ) -> None:
        self.inputs, self.tp, self.pp = inputs, tp, pp
        self.length = inputs.max_model_len if length is None else length
        self.concurrency = inputs.concurrency if concurrency is None else concurrency
        self.base = defaults(inputs, gpu, self.concurrency)
        self.block_size = version_defaults(inputs.version, gpu.name, gpu.memory_gib)[3]
        self.fixed = (terms or terms_for(inputs)).layout(gpu.memory_gib, tp, pp, gpu.interconnect, gpu.name)
        self.interconnect = gpu.interconnect
        self.free_util = inputs.gpu_memory_utilization is None
        self.free_seqs = inputs.max_num_seqs is None
        self.free_tokens = inputs.max_num_batched_tokens is None
        self.free_eager = not inputs.enforce_eager
        self.seq_floor, self.token_floor = _floors(inputs, self.base, self.concurrency)

    def config(self, seqs: int, tokens: int, eager: bool) -> Config:
        return _config(self.fixed, self.inputs, self.base, seqs, tokens, eager)

    def ok(self, config: Config) -> bool:
        """``serves(budget of config, concurrency)``."""
        fixed = self.fixed
        return fixed.serves(fixed.cached_pool(config), self.length, self.concurrency)

    def last(self) -> Config:
        return last_rung(self.fixed, self.inputs, self.base, self.concurrency)

    def serves(self) -> bool:
        return layout_serves(self.fixed, self.inputs, self.base, self.length, self.concurrency)

    def length_pools(self) -> tuple[Pool, Pool | None]:
        """The pools that decide :meth:`serves` at any max-model-len: vLLM's defaults', and the last
        rung's unless the layout is hopeless."""
        fixed = self.fixed
        base = fixed.cached_pool(self.base)
        last = None if hopeless(fixed, self.inputs, self.base) else fixed.cached_pool(self.last())
        return base, last

    def serves_lengths(self) -> Callable[[int], bool]:
        """:meth:`serves` as a function of max-model-len alone (the KV pools do not depend on it)."""
        fixed, concurrency = self.fixed, self.concurrency
        base, last = self.length_pools()

        def works(length: int) -> bool:
            if fixed.serves(base, length, concurrency):
                return True
            return last is not None and fixed.serves(last, length, concurrency)

        return works

    def longest(self, high: int) -> int | None:
        """``largest_int(1, high, self.serves_lengths())``, worked out when no layer has a sliding
        window: a sequence of ``n`` tokens then takes ``full_groups × ⌈n / block⌉`` blocks, and a pool
        of ``b`` blocks that starts holds ``c`` of them (``b / blocks ≥ c``, which for integers this
        size is ``b ≥ c × blocks``) up to ``⌊b / (c × full_groups)⌋`` blocks, that many block sizes of
        tokens; the longest of the two pools' serves."""
        fixed = self.fixed
        if fixed.sliding_groups:
            return largest_int(1, high, self.serves_lengths())
        if high < 1:
            return None
        per_block = fixed.full_groups * max(1, self.concurrency)  # serves() asks held >= 1 too
        longest = 0
        for pool in self.length_pools():
            if pool is not None and pool[2] and per_block:
                longest = max(longest, pool[0] // per_block * fixed.block_size)
        return min(longest, high) if longest else None

    def materialize(self, config: Config) -> tuple[EngineSettings, MemoryBudget]:
        seqs, tokens, utilization, eager = config
        inputs = self.inputs
        settings = EngineSettings(  # positionally: keywords cost twice as much in a hot path
            inputs.dtype,
            inputs.quantization,
            inputs.kv_cache_dtype,
            self.tp,  # tensor_parallel_size
            self.pp,  # pipeline_parallel_size
            utilization,  # gpu_memory_utilization
            self.length,  # max_model_len
            seqs,  # max_num_seqs
            tokens,  # max_num_batched_tokens
            eager,  # enforce_eager
            inputs.cuda_graphs_counted,  # cuda_graph_in_kv_budget
            self.block_size,
            inputs.weight_bits,
            inputs.weights_gib_total,
            "v1",  # engine
            self.interconnect,
        )
        return settings, self.fixed.budget(self.length, seqs, tokens, utilization, eager)


def _safe_utilization(total: float, graphs: float, warmup_gib: float) -> float:
    room = (total - graphs - warmup_gib - SAFE_HEADROOM_GIB) / total
    return min(MAX_UTILIZATION, math.floor(room * 100) / 100)


def safe_utilization(settings: EngineSettings, budget: MemoryBudget) -> float:
    """The highest utilization (≤ 0.95, two decimals) that leaves CUDA graphs, the sampler warm-up and
    the safety margin free above the line; ``budget`` is of ``settings`` at any utilization."""
    graphs = 0.0 if settings.cuda_graph_in_kv_budget else budget.cuda_graph_gib
    return _safe_utilization(budget.total_gib, graphs, budget.sampler_warmup_gib)


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


def terms_for(inputs: SpecInputs) -> ModelTerms:
    """The budget terms of the spec's model, dtype and quantization (for every layout of every GPU)."""
    model = inputs.model
    return model_terms(
        model.architecture,
        model.exact_parameters,
        inputs.dtype,
        inputs.quantization,
        inputs.kv_cache_dtype,
        inputs.cuda_graphs_counted,
        engine_version(inputs.version).block_size,
        inputs.weight_bits,
        inputs.weights_gib_total,
        reserves=inputs.kv_reserve,
    )


def serves_at(
    inputs: SpecInputs,
    gpu: GPUType,
    tp: int,
    pp: int,
    *,
    length: int | None = None,
    concurrency: int | None = None,
    terms: ModelTerms | None = None,
) -> bool:
    """``tune(inputs with max_model_len=length, concurrency=concurrency, ...).serves``, without building
    the settings and budgets (refusal fixes ask it a few dozen times per layout)."""
    return _Layout(inputs, gpu, tp, pp, length=length, concurrency=concurrency, terms=terms).serves()


def serves_lengths(
    inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, terms: ModelTerms | None = None
) -> Callable[[int], bool]:
    """``n → serves_at(inputs, gpu, tp, pp, length=n)``, with what does not depend on ``n`` done once."""
    return _Layout(inputs, gpu, tp, pp, terms=terms).serves_lengths()


def longest_serving(
    inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, high: int, terms: ModelTerms | None = None
) -> int | None:
    """The largest max-model-len up to ``high`` that the layout serves (None: not even 1), as
    ``largest_int(1, high, serves_lengths(...))`` (:meth:`_Layout.longest`)."""
    return _Layout(inputs, gpu, tp, pp, terms=terms).longest(high)


def largest_int(low: int, high: int, works: Callable[[int], bool]) -> int | None:
    """The largest n in [low, high] with works(n), assuming works is monotone (true, then false)."""
    if high < low or not works(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if works(mid):
            low = mid
        else:
            high = mid - 1
    return low


def serves_concurrencies(
    inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, terms: ModelTerms | None = None
) -> Callable[[int], bool]:
    """``n → serves_at(inputs, gpu, tp, pp, concurrency=n)``, with what does not depend on ``n`` done
    once (the layout's terms; vLLM's defaults and the ladder's pools are memoised on them)."""
    fixed = (terms or terms_for(inputs)).layout(gpu.memory_gib, tp, pp, gpu.interconnect, gpu.name)
    length = inputs.max_model_len
    # defaults(inputs, gpu, concurrency), with the version's table row read once.
    tier_seqs, tier_tokens, tier_utilization, _ = version_defaults(inputs.version, gpu.name, gpu.memory_gib)
    pinned_seqs, pinned_tokens = inputs.max_num_seqs, inputs.max_num_batched_tokens
    utilization, eager = inputs.gpu_memory_utilization or tier_utilization, inputs.enforce_eager

    def works(concurrency: int) -> bool:
        seqs = pinned_seqs or max(tier_seqs, concurrency)
        tokens = pinned_tokens or max(tier_tokens, seqs)
        return layout_serves(fixed, inputs, (seqs, tokens, utilization, eager), length, concurrency)

    return works


def concurrency_ceiling(
    inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, terms: ModelTerms | None = None
) -> int:
    """The most sequences of max-model-len any setting of this layout could hold (0: not one): the KV
    blocks within the ladder's highest utilization (0.95 or vLLM's default, or what the spec pins) with
    no activations and no CUDA graphs, over the fewest blocks a sequence takes. vLLM's defaults (a lower
    utilization, activations) and every rung hold no more (:meth:`FixedTerms.may_serve`), so
    ``serves_concurrencies(...)(n)`` is false above it: refusal fixes search the concurrencies below."""
    fixed = (terms or terms_for(inputs)).layout(gpu.memory_gib, tp, pp, gpu.interconnect, gpu.name)
    pinned = inputs.gpu_memory_utilization
    utilization = pinned or version_defaults(inputs.version, gpu.name, gpu.memory_gib)[2]  # as defaults()
    ceiling = utilization if pinned is not None else max(utilization, MAX_UTILIZATION)  # as ladder_serves
    blocks = blocks_within(fixed.total, ceiling, fixed.weights, fixed.non_torch, fixed.block_bytes)
    blocks_per_seq = fixed._blocks_per_seq(inputs.max_model_len, 0)
    held = blocks / blocks_per_seq if blocks_per_seq else 0.0
    return int(held) if held >= 1.0 else 0  # n <= held for a whole n is n <= floor(held)


def tune(inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, terms: ModelTerms | None = None) -> Tuned:
    """Walk the ladder of this module's docstring for one layout (``terms``: :func:`terms_for` the
    inputs, when the caller has them)."""
    return Tuned(*tuned(inputs, gpu, tp, pp, terms or terms_for(inputs)))


def tuned(
    inputs: SpecInputs, gpu: GPUType, tp: int, pp: int, terms: ModelTerms
) -> tuple[EngineSettings, MemoryBudget, tuple[str, ...], str]:
    """:func:`tune`'s settings, budget, notes and rejection. Most layouts end at the first step (the
    defaults serve, or the weights alone do not fit), which is worked out here without the ladder."""
    concurrency, length = inputs.concurrency, inputs.max_model_len
    # defaults(inputs, gpu), and the block size of the same table row.
    tier_seqs, tier_tokens, tier_utilization, block_size = version_defaults(
        inputs.version, gpu.name, gpu.memory_gib
    )
    seqs = inputs.max_num_seqs or max(tier_seqs, concurrency)
    tokens = inputs.max_num_batched_tokens or max(tier_tokens, seqs)
    utilization = inputs.gpu_memory_utilization or tier_utilization
    eager = inputs.enforce_eager
    fixed = terms.layout(gpu.memory_gib, tp, pp, gpu.interconnect, gpu.name)
    config = (seqs, tokens, utilization, eager)
    layout = last = None
    if not fixed.serves(fixed.cached_pool(config), length, concurrency) and not hopeless(
        fixed, inputs, config
    ):
        # The ladder decides. When even its last rung falls short, the layout is rejected with that
        # rung's figures, and vLLM's defaults' settings and budget are not needed (a refusal lists
        # thousands of such layouts). FixedTerms.serves is budget()'s verdict on the same figures.
        layout = _Layout(inputs, gpu, tp, pp, terms=terms)
        last = layout.last()
        if not layout.ok(last):
            settings, budget = layout.materialize(last)
            reason = shortfall(inputs, settings, budget)
            if last != layout.base:
                reason += f" (also after tuning: {_settings_text(settings)})"
            return settings, budget, (), reason
    settings = EngineSettings(  # positionally: keywords cost twice as much in a hot path
        inputs.dtype,
        inputs.quantization,
        inputs.kv_cache_dtype,
        tp,  # tensor_parallel_size
        pp,  # pipeline_parallel_size
        utilization,  # gpu_memory_utilization
        length,  # max_model_len
        seqs,  # max_num_seqs
        tokens,  # max_num_batched_tokens
        eager,  # enforce_eager
        inputs.cuda_graphs_counted,  # cuda_graph_in_kv_budget
        block_size,
        inputs.weight_bits,
        inputs.weights_gib_total,
        "v1",  # engine
        gpu.interconnect,
    )
    budget = fixed.budget(length, seqs, tokens, utilization, eager)
    if layout is None or last is None:
        if not budget.problems and budget.max_concurrency >= concurrency:  # serves(budget, concurrency)
            return (
                settings,
                budget,
                (
                    f"vLLM's defaults serve concurrency {concurrency}: KV cache holds "
                    f"{budget.max_concurrency:.2f} sequences of {length} "
                    f"(max-num-seqs {seqs}, max-num-batched-tokens {tokens}, "
                    f"gpu-memory-utilization {utilization})",
                ),
                "",
            )
        return settings, budget, (), shortfall(inputs, settings, budget)  # hopeless
    base = layout.base
    eagers = [base[3]] + ([True] if layout.free_eager and not base[3] else [])
    chosen = last  # unreachable while feasibility is monotone (the last rung served): keep the last rung
    for eager in eagers:
        found = _rung(layout, eager)
        if found is not None:
            chosen = found
            break
    base_budget = budget
    settings, budget = layout.materialize(chosen)
    return settings, budget, _explain(layout, base_budget, settings, budget), ""


def _rung(layout: _Layout, eager: bool) -> Config | None:
    seqs, tokens = layout.base[0], layout.base[1]
    first = layout.config(seqs, tokens, eager)
    if layout.ok(first):
        return first
    if layout.free_seqs:
        chosen = _largest(
            _steps(layout.seq_floor, seqs, 16), lambda v: layout.ok(layout.config(v, tokens, eager))
        )
        if chosen is not None:
            return layout.config(chosen, tokens, eager)
        seqs = layout.seq_floor
    if layout.free_tokens:
        chosen = _largest(
            _steps(max(layout.token_floor, seqs), tokens, 256),
            lambda v: layout.ok(layout.config(seqs, v, eager)),
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
    base_seqs, base_tokens, base_util, base_eager = layout.base
    inputs = layout.inputs
    notes = [
        f"vLLM's defaults hold {base_budget.max_concurrency:.2f} sequences of {inputs.max_model_len}"
        + (f" ({base_budget.problems[0]})" if base_budget.problems else "")
        + f"; tuned to serve concurrency {inputs.concurrency} on these GPUs instead of adding more:"
    ]
    if settings.gpu_memory_utilization != base_util:
        free = budget.total_gib * (1 - settings.gpu_memory_utilization)
        notes.append(
            f"gpu-memory-utilization {settings.gpu_memory_utilization} (default "
            f"{base_util}): {free:.2f} GiB stay free above it for CUDA graphs "
            f"({budget.cuda_graph_gib:.2f}), the sampler warm-up ({budget.sampler_warmup_gib:.2f}) and a "
            f"{SAFE_HEADROOM_GIB} GiB margin"
        )
    if settings.max_num_seqs != base_seqs:
        notes.append(
            f"max-num-seqs {settings.max_num_seqs} (default {base_seqs}, not below concurrency "
            f"{inputs.concurrency}): the profiling pass's sampler over fewer dummy requests leaves more "
            "for the KV cache; fewer short requests run at once"
        )
    if settings.max_num_batched_tokens != base_tokens:
        notes.append(
            f"max-num-batched-tokens {settings.max_num_batched_tokens} (default "
            f"{base_tokens}): smaller prefill chunks, smaller activation peak; long "
            "prompts take more steps to prefill"
        )
    if settings.enforce_eager and not base_eager:
        # What keeping the graphs would have given: the graph rungs' last setting (their most KV).
        graphs = layout.config(layout.seq_floor, layout.token_floor, False)
        _, kept = layout.materialize(graphs)
        held = f"{kept.max_concurrency:.2f} sequences" if kept.fits else "no start"
        notes.append(
            f"enforce-eager: with CUDA graphs ({kept.cuda_graph_gib:.2f} GiB) the KV cache holds at most "
            f"{held} (gpu-memory-utilization {graphs[2]}, max-num-seqs {graphs[0]}, "
            f"max-num-batched-tokens {graphs[1]}), short of concurrency {inputs.concurrency}; without them "
            "decode is slower (each step launches its kernels one by one)"
        )
    elif layout.free_eager and not settings.enforce_eager:
        notes.append(
            f"CUDA graphs kept ({budget.cuda_graph_gib:.2f} GiB above the line): these settings serve "
            "without --enforce-eager, which would give the KV cache that memory at the cost of slower decode"
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
