"""Per-GPU memory budget, the way vLLM's V1 engine accounts it at start-up.

vLLM loads the weights, runs one profiling step at ``max_num_batched_tokens`` (plus a sampler pass
over ``max_num_seqs`` dummy requests) to find the activation peak, measures non-torch memory (CUDA
context, NCCL buffers), and gives the KV cache what is left of ``total × gpu_memory_utilization``.
CUDA graphs are captured afterwards into a pool outside that budget (unless the version or
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`` counts them in), and the sampler is warmed up once
more with ``max_num_seqs`` requests: both need free memory *above* the utilization line, which is
why a config can pass profiling and still die at start-up (the calibration rows P26/P27).

Everything here is per GPU; with pipeline parallelism the figures are those of the most loaded stage
(the first or last, which hold the embedding and the LM head), because that GPU decides whether the
engine starts and how many KV blocks every stage gets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from loadline.sizing._arch import Architecture
from loadline.sizing._data import ModelCoefficients, QuantMethod, coefficients, quantization_methods
from loadline.sizing._memo import GuardedMemo
from loadline.sizing._params import ParameterCounts, count_parameters

GIB = 1024**3

DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
KV_DTYPE_BYTES = {"fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "bfloat16": 2.0, "float16": 2.0}


@dataclass(frozen=True)
class EngineSettings:
    """Resolved engine settings (no "auto" left): what vLLM will actually run with."""

    dtype: str
    quantization: str
    kv_cache_dtype: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    cuda_graph_in_kv_budget: bool
    block_size: int
    weight_bits: float | None = None
    weights_gib_total: float | None = None  # exact weights of the whole model, when the user knows it
    engine: str = "v1"  # "v0": vLLM's V0 engine (VLLM_USE_V1=0, 0.6.4-0.10), profiled differently

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class MemoryBudget:
    """What one GPU holds, in GiB, and what the engine as a whole can serve."""

    total_gib: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    kv_cache_gib: float
    kv_cache_tokens: int
    kv_bytes_per_token: int  # per GPU, as vLLM divides the pool into tokens
    gpu_blocks: int
    max_concurrency: float  # sequences of max_model_len that fit in the KV cache together
    startup_headroom_gib: float  # free memory above the budget after CUDA graphs are captured
    sampler_warmup_gib: float  # what the sampler warm-up (and unprofiled kernel workspace) needs of it
    problems: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def used_gib(self) -> float:
        return (
            self.weights_gib
            + self.activation_gib
            + self.non_torch_gib
            + self.cuda_graph_gib
            + self.kv_cache_gib
        )


def resolve_dtype(arch: Architecture, requested: str) -> str:
    """vLLM's ``--dtype auto``: the checkpoint's dtype, with float32 checkpoints served in bfloat16."""
    if requested != "auto":
        return requested
    native = (arch.torch_dtype or "bfloat16").replace("torch.", "")
    if native in {"float32", "float"}:
        return "bfloat16"
    return native if native in DTYPE_BYTES else "bfloat16"


def kv_dtype_bytes(kv_cache_dtype: str, dtype: str) -> float:
    if kv_cache_dtype == "auto":
        return DTYPE_BYTES[dtype]
    return KV_DTYPE_BYTES[kv_cache_dtype]


def _quantized_bits(method: QuantMethod, arch: Architecture, weight_bits: float | None) -> float:
    bits = weight_bits or (arch.quantization.bits if arch.quantization else None) or method.bits
    group = (arch.quantization.group_size if arch.quantization else None) or method.group_size
    overhead = 8.0 * method.scale_bytes / group if group and group > 0 else 0.0
    return bits + overhead


def weights_bytes(
    arch: Architecture, counts: ParameterCounts, dtype: str, quantization: str, weight_bits: float | None
) -> float:
    """Bytes of all weights of the model (every GPU together)."""
    full = DTYPE_BYTES[dtype]
    method = quantization_methods()[quantization]
    if method.scope == "none":
        return counts.total * full
    bits = _quantized_bits(method, arch, weight_bits)
    if method.scope == "experts":
        quantized = counts.experts
    else:
        quantized = counts.linear
        skipped = arch.quantization.not_converted if arch.quantization else ()
        # Checkpoints that keep attention in full precision (gpt-oss style) say so by module name.
        if any("attn" in name for name in skipped):
            quantized -= counts.attention
    rest = counts.total - quantized
    return quantized * bits / 8.0 + rest * full


def _kv_layer_groups(arch: Architecture, layers_on_gpu: int) -> tuple[int, int, int]:
    """(group_size, full_groups, sliding_groups) of vLLM's hybrid KV allocator on one GPU.

    Layers of each attention type are packed into groups of equal size (the smaller type's layer
    count) so that every group shares one block pool; the last group of a type is padded. A model
    with one attention type has a single group of all its layers.
    """
    share = layers_on_gpu / arch.num_layers
    full = sum(1 for kind in arch.layer_types if kind == "full") if arch.layer_types else arch.num_layers
    sliding = arch.num_layers - full
    full = max(1, round(full * share)) if full else 0
    sliding = max(1, round(sliding * share)) if sliding else 0
    if not full or not sliding:
        return layers_on_gpu, (1 if full else 0), (1 if sliding else 0)
    size = min(full, sliding)
    return size, math.ceil(full / size), math.ceil(sliding / size)


def kv_bytes_per_layer_token(arch: Architecture, settings: EngineSettings) -> float:
    """KV bytes one layer stores per token on one GPU."""
    elem = kv_dtype_bytes(settings.kv_cache_dtype, settings.dtype)
    if arch.is_mla:
        # One compressed latent plus the rotary key part, replicated on every tensor-parallel rank.
        return ((arch.kv_lora_rank or 0) + arch.qk_rope_head_dim) * elem
    heads_per_gpu = max(1, math.ceil(arch.num_kv_heads / settings.tensor_parallel_size))
    return 2 * heads_per_gpu * arch.head_dim * elem


def _layers_on_busiest_stage(arch: Architecture, pp: int) -> int:
    return math.ceil(arch.num_layers / pp)


def activation_bytes(arch: Architecture, settings: EngineSettings, coef: ModelCoefficients) -> float:
    """Activation peak of vLLM's profiling step, per GPU.

    Two parts, fitted to the calibration logs: the sampler pass over ``max_num_seqs`` requests holds
    a few float32 copies of the logits (``vocab`` wide, gathered on every rank, so not divided by
    tensor parallelism); the forward pass over ``max_num_batched_tokens`` holds hidden-wide and
    (sharded) intermediate-wide tensors, plus the routed-expert buffers of MoE layers.
    """
    tp = settings.tensor_parallel_size
    tokens = settings.max_num_batched_tokens
    elem = DTYPE_BYTES[settings.dtype]
    sampler = coef.sampler_logit_copies * settings.max_num_seqs * arch.vocab_size * 4.0
    inter = arch.intermediate_size if not arch.is_moe or arch.num_dense_layers else 0
    forward = (
        tokens
        * elem
        * (
            coef.forward_bytes_per_token_hidden * arch.hidden_size
            + coef.forward_bytes_per_token_intermediate * inter / tp
        )
    )
    if arch.is_moe:
        routed = arch.num_experts_per_tok * arch.moe_intermediate_size + arch.shared_expert_intermediate_size
        forward += tokens * elem * coef.moe_bytes_per_token_expert_intermediate * routed / tp
    return sampler + forward


def non_torch_gib(settings: EngineSettings, coef: ModelCoefficients) -> float:
    """CUDA context and, with tensor parallelism, NCCL/custom all-reduce buffers."""
    tp = settings.tensor_parallel_size
    if tp == 1:
        return coef.non_torch_gib_tp1
    return coef.non_torch_gib_tp_base + coef.non_torch_gib_per_tp_rank * tp


def cuda_graph_gib(arch: Architecture, settings: EngineSettings, coef: ModelCoefficients) -> float:
    if settings.enforce_eager:
        return 0.0
    layers = _layers_on_busiest_stage(arch, settings.pipeline_parallel_size)
    graph = coef.cuda_graph_gib_base + coef.cuda_graph_gib_per_layer * layers
    graph += (
        coef.cuda_graph_gib_per_khidden_layer_per_tp
        * arch.hidden_size
        / 1000
        * layers
        / settings.tensor_parallel_size
    )
    if arch.is_moe:
        graph += coef.cuda_graph_gib_moe_extra
    return graph


def compute_budget(
    arch: Architecture,
    settings: EngineSettings,
    gpu_memory_gib: float,
    *,
    exact_parameters: int | None = None,
) -> MemoryBudget:
    """The per-GPU budget of one engine configuration on GPUs of ``gpu_memory_gib``, and whether it starts.

    Memoised: a pure function of its (hashable, frozen) arguments and the coefficients table, and the
    planner asks for the same (model, GPU, layout, settings) again and again (the tuning ladder's rungs,
    refusal fixes, every reconcile of an unchanged model)."""
    coef = coefficients(settings.engine)
    return _BUDGETS.get(
        (arch, settings, gpu_memory_gib, exact_parameters),
        coef,
        lambda: _compute_budget(arch, settings, gpu_memory_gib, coef, exact_parameters),
    )


_BUDGETS: GuardedMemo[tuple[Architecture, EngineSettings, float, int | None], MemoryBudget] = GuardedMemo(
    65536
)


def _compute_budget(
    arch: Architecture,
    settings: EngineSettings,
    gpu_memory_gib: float,
    coef: ModelCoefficients,
    exact_parameters: int | None,
) -> MemoryBudget:
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    counts = count_parameters(arch)
    if settings.weights_gib_total is not None:
        total_weights = settings.weights_gib_total * GIB
    else:
        total_weights = weights_bytes(
            arch, counts, settings.dtype, settings.quantization, settings.weight_bits
        )
        if exact_parameters and counts.total:
            # A published parameter count corrects what the architecture formula misses (biases,
            # vision towers, padding) in proportion.
            total_weights *= exact_parameters / counts.total
    # The busiest pipeline stage holds its share of the layers plus the embedding or the LM head.
    per_layer_share = total_weights - (counts.embedding + counts.lm_head) * DTYPE_BYTES[settings.dtype]
    per_layer_share = max(per_layer_share, 0.0) / arch.num_layers
    if pp == 1:
        weights = total_weights / tp
    else:
        edge = max(counts.embedding, counts.lm_head or counts.embedding) * DTYPE_BYTES[settings.dtype]
        weights = (per_layer_share * _layers_on_busiest_stage(arch, pp) + edge) / tp
    weights += coef.weights_overhead_gib * GIB

    activation = activation_bytes(arch, settings, coef)
    non_torch = non_torch_gib(settings, coef) * GIB
    graphs = cuda_graph_gib(arch, settings, coef) * GIB
    total = gpu_memory_gib * GIB
    budget = total * settings.gpu_memory_utilization
    kv = budget - weights - activation - non_torch
    if settings.cuda_graph_in_kv_budget:
        kv -= graphs
    kv_positive = max(kv, 0.0)

    layers = _layers_on_busiest_stage(arch, pp)
    group_size, full_groups, sliding_groups = _kv_layer_groups(arch, layers)
    per_layer = kv_bytes_per_layer_token(arch, settings)
    block_bytes = group_size * settings.block_size * per_layer
    blocks = int(kv_positive // block_bytes) if block_bytes else 0
    groups = full_groups + sliding_groups
    kv_tokens = blocks * settings.block_size // max(groups, 1)
    bytes_per_token = int(group_size * groups * per_layer)

    bs = settings.block_size
    length = settings.max_model_len
    blocks_per_seq = full_groups * math.ceil(length / bs)
    if sliding_groups and arch.sliding_window:
        window_tokens = min(arch.sliding_window - 1 + settings.max_num_batched_tokens, length)
        blocks_per_seq += sliding_groups * (math.ceil(window_tokens / bs) + 1)
    elif sliding_groups:
        blocks_per_seq += sliding_groups * math.ceil(length / bs)
    concurrency = blocks / blocks_per_seq if blocks_per_seq else 0.0

    headroom = total - budget - (0.0 if settings.cuda_graph_in_kv_budget else graphs)
    warmup = coef.sampler_warmup_logit_copies * settings.max_num_seqs * arch.vocab_size * 4.0
    warmup += quantization_methods()[settings.quantization].startup_extra_gib * GIB

    problems = []
    if kv <= 0:
        short = (-kv + block_bytes) / GIB
        problems.append(
            f"weights {weights / GIB:.2f} + activation {activation / GIB:.2f} + non-torch "
            f"{non_torch / GIB:.2f} GiB leave no KV cache within {settings.gpu_memory_utilization:.2f} × "
            f"{gpu_memory_gib:.2f} GiB (short {short:.2f} GiB per GPU)"
        )
    elif concurrency < 1.0:
        needed = blocks_per_seq * block_bytes
        problems.append(
            f"KV cache holds {kv_tokens} tokens, less than one sequence of max-model-len {length} "
            f"(short {(needed - kv_positive) / GIB:.2f} GiB per GPU)"
        )
    if kv > 0 and headroom < warmup:
        problems.append(
            f"only {headroom / GIB:.2f} GiB stay free above gpu-memory-utilization "
            f"{settings.gpu_memory_utilization:.2f} after CUDA graphs; sampler warm-up with max-num-seqs "
            f"{settings.max_num_seqs} needs {warmup / GIB:.2f} GiB "
            f"(short {(warmup - headroom) / GIB:.2f} GiB)"
        )
    return MemoryBudget(
        total_gib=gpu_memory_gib,
        weights_gib=weights / GIB,
        activation_gib=activation / GIB,
        non_torch_gib=non_torch / GIB,
        cuda_graph_gib=graphs / GIB,
        kv_cache_gib=kv_positive / GIB,
        kv_cache_tokens=kv_tokens,
        kv_bytes_per_token=bytes_per_token,
        gpu_blocks=blocks,
        max_concurrency=concurrency,
        startup_headroom_gib=headroom / GIB,
        sampler_warmup_gib=warmup / GIB,
        problems=tuple(problems),
    )
