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
from loadline.sizing._records import quick_init
from loadline.units import GIB

DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
KV_DTYPE_BYTES = {"fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "bfloat16": 2.0, "float16": 2.0}


@quick_init
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
    interconnect: str = "nvlink"  # between the tensor-parallel GPUs: "nvlink" or "pcie" (non-torch memory)

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@quick_init
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
    with one attention type has a single group of all its layers. Layers that reuse another layer's
    cache (Gemma 3n's last ``num_kv_shared_layers``) have none of their own and join no group.
    """
    full, sliding = _kv_layer_kinds(arch)
    return _layer_groups(arch.num_layers, full, layers_on_gpu, sliding)


def _kv_layer_kinds(arch: Architecture) -> tuple[int, int]:
    """(full, sliding): how many layers of each attention type have a KV cache of their own."""
    kinds = arch.layer_types[: arch.kv_layers] if arch.layer_types else ()
    if not kinds:
        return arch.kv_layers, 0
    full = sum(1 for kind in kinds if kind == "full")
    return full, len(kinds) - full


def _full_layers(arch: Architecture) -> int:
    return _kv_layer_kinds(arch)[0]


def _layer_groups(
    num_layers: int, full: int, layers_on_gpu: int, sliding: int | None = None
) -> tuple[int, int, int]:
    """:func:`_kv_layer_groups` of a model of ``num_layers`` layers, ``full`` of them full attention and
    ``sliding`` (default: the rest) sliding-window attention."""
    share = layers_on_gpu / num_layers
    sliding = num_layers - full if sliding is None else sliding
    own = full + sliding
    full = max(1, round(full * share)) if full else 0
    sliding = max(1, round(sliding * share)) if sliding else 0
    if not full or not sliding:
        # One attention type: one group of the GPU's layers that have a cache (all, unless shared).
        size = layers_on_gpu if own == num_layers else full + sliding
        return size, (1 if full else 0), (1 if sliding else 0)
    size = min(full, sliding)
    return size, math.ceil(full / size), math.ceil(sliding / size)


def kv_bytes_per_layer_token(arch: Architecture, settings: EngineSettings) -> float:
    """KV bytes one layer stores per token on one GPU."""
    return _kv_bytes_per_layer_token(
        arch, settings.kv_cache_dtype, settings.dtype, settings.tensor_parallel_size
    )


def _kv_bytes_per_layer_token(arch: Architecture, kv_cache_dtype: str, dtype: str, tp: int) -> float:
    if not arch.has_kv_cache:
        return 0.0  # encoder-only attention: vLLM allocates no KV cache
    if arch.is_state_space:
        # One "block" holds a whole sequence's state (below); per token is its share of that block.
        return _state_bytes_per_layer(arch, dtype, tp) / STATE_BLOCK_TOKENS
    elem = kv_dtype_bytes(kv_cache_dtype, dtype)
    if arch.is_mla:
        # One compressed latent plus the rotary key part, replicated on every tensor-parallel rank.
        return ((arch.kv_lora_rank or 0) + arch.qk_rope_head_dim) * elem
    heads_per_gpu = max(1, math.ceil(arch.num_kv_heads / tp))
    return 2 * heads_per_gpu * arch.head_dim * elem


#: The block size of a state-space model's cache: vLLM's V1 engine gives a Mamba layer one page per
#: request holding its whole state, its block size the max-model-len (vllm/v1/worker/gpu_model_runner.py
#: MambaSpec, block_size=max_model_len), so a sequence of any length takes one block per layer. Any
#: max-model-len loadline plans is below this, which keeps the planner's blocks-per-sequence at one.
STATE_BLOCK_TOKENS = 2**40


def _state_bytes_per_layer(arch: Architecture, dtype: str, tp: int) -> float:
    """A sequence's conv and SSM state in one Mamba layer on one GPU, as vLLM's
    MambaStateShapeCalculator shapes them (vllm/model_executor/layers/mamba/mamba_utils.py): Mamba
    ``(kernel - 1) × inner/tp`` and ``inner/tp × state``; Mamba 2 ``(kernel - 1) × (inner + 2 × groups ×
    state)/tp`` (groups padded to a multiple of tp) and ``heads/tp × head_dim × state``; in the model
    dtype (``--mamba-cache-dtype auto``)."""
    kernel, state, inner = arch.ssm_conv_kernel, arch.ssm_state_size, arch.intermediate_size
    if arch.ssm_heads:
        groups = arch.ssm_groups if arch.ssm_groups % tp == 0 else arch.ssm_groups + tp - arch.ssm_groups
        conv = (kernel - 1) * (inner + 2 * groups * state) // tp
        ssm = arch.ssm_heads // tp * arch.ssm_head_dim * state
    else:
        conv = (kernel - 1) * (inner // tp)
        ssm = inner // tp * state
    return (conv + ssm) * DTYPE_BYTES[dtype]


def _layers_on_busiest_stage(arch: Architecture, pp: int) -> int:
    return math.ceil(arch.num_layers / pp)


def _sampled_vocab(arch: Architecture) -> int:
    """The logits' width of the sampler pass and its warm-up: none for pooling models, which vLLM runs
    through a pooler instead of the LM head and the sampler (vllm/v1/worker/gpu_model_runner.py
    ``_dummy_pooler_run`` instead of ``_dummy_sampler_run``)."""
    return arch.vocab_size if arch.samples else 0


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
    sampler = coef.sampler_logit_copies * settings.max_num_seqs * _sampled_vocab(arch) * 4.0
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
    return _non_torch_gib(settings.tensor_parallel_size, coef, settings.interconnect)


def _non_torch_gib(tp: int, coef: ModelCoefficients, interconnect: str = "nvlink") -> float:
    """Memory vLLM counts outside torch's allocator. With tensor parallelism over NVLink (or PCIe
    peer-to-peer) NCCL keeps its send/receive buffers in GPU memory for every peer and channel, and
    vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py) maps IPC
    buffers of its own: it is on only where the GPUs reach each other directly (NVLink, or two PCIe
    GPUs whose peer-to-peer test passes) and off for more than two PCIe-only GPUs. Without
    peer-to-peer access NCCL moves data through host shared memory, and neither takes GPU memory:
    the pcie coefficients (engine.json), fitted to PCIe runs, are a fraction of NVLink's."""
    if tp == 1:
        return coef.non_torch_gib_tp1
    if interconnect == "pcie":
        return coef.non_torch_gib_tp_base_pcie + coef.non_torch_gib_per_tp_rank_pcie * tp
    return coef.non_torch_gib_tp_base + coef.non_torch_gib_per_tp_rank * tp


def cuda_graph_gib(arch: Architecture, settings: EngineSettings, coef: ModelCoefficients) -> float:
    if settings.enforce_eager:
        return 0.0
    return _cuda_graph_gib(arch, settings.tensor_parallel_size, settings.pipeline_parallel_size, coef)


def _cuda_graph_gib(arch: Architecture, tp: int, pp: int, coef: ModelCoefficients) -> float:
    layers = _layers_on_busiest_stage(arch, pp)
    graph = coef.cuda_graph_gib_base + coef.cuda_graph_gib_per_layer * layers
    graph += coef.cuda_graph_gib_per_khidden_layer_per_tp * arch.hidden_size / 1000 * layers / tp
    if arch.is_moe:
        graph += coef.cuda_graph_gib_moe_extra
    return graph


def compute_budget(
    arch: Architecture,
    settings: EngineSettings,
    gpu_memory_gib: float,
    *,
    exact_parameters: int | None = None,
    reserves: tuple[tuple[str, float], ...] = (),
    gpu: str = "",
) -> MemoryBudget:
    """The per-GPU budget of one engine configuration on GPUs of ``gpu_memory_gib``, and whether it starts.
    ``reserves`` and ``gpu``: learned corrections by GPU type, and the type this budget is for
    (:func:`model_terms`).

    Memoised: a pure function of its (hashable, frozen) arguments and the coefficients table, and the
    planner asks for the same (model, GPU, layout, settings) again and again (the tuning ladder's rungs,
    refusal fixes, every reconcile of an unchanged model)."""
    coef = coefficients(settings.engine)
    return _BUDGETS.get(
        (arch, settings, gpu_memory_gib, exact_parameters, reserves, gpu),
        coef,
        lambda: _compute_budget(arch, settings, gpu_memory_gib, exact_parameters, reserves, gpu),
    )


_BUDGETS: GuardedMemo[
    tuple[Architecture, EngineSettings, float, int | None, tuple[tuple[str, float], ...], str], MemoryBudget
] = GuardedMemo(65536)


def _compute_budget(
    arch: Architecture,
    settings: EngineSettings,
    gpu_memory_gib: float,
    exact_parameters: int | None,
    reserves: tuple[tuple[str, float], ...],
    gpu: str,
) -> MemoryBudget:
    s = settings
    model = model_terms(
        arch,
        exact_parameters,
        s.dtype,
        s.quantization,
        s.kv_cache_dtype,
        s.cuda_graph_in_kv_budget,
        s.block_size,
        s.weight_bits,
        s.weights_gib_total,
        s.engine,
        reserves=reserves,
    )
    fixed = model.layout(
        gpu_memory_gib, s.tensor_parallel_size, s.pipeline_parallel_size, s.interconnect, gpu
    )
    return fixed.budget(
        s.max_model_len, s.max_num_seqs, s.max_num_batched_tokens, s.gpu_memory_utilization, s.enforce_eager
    )


#: The KV blocks of one setting, its batched tokens (a sliding window's share of a sequence grows with
#: them) and whether the engine starts with it (a KV cache at all, and room above the line).
Pool = tuple[int, int, bool]


#: A layout's terms on its busiest GPU whatever the GPU and settings (:meth:`ModelTerms.static_terms`):
#: weights and non-torch memory (bytes), their sum (GiB), the KV cache's bytes per block, its groups of
#: full-attention and of sliding-window layers, the layers per group and the KV bytes per layer-token.
StaticTerms = tuple[float, float, float, float, int, int, int, float]


def blocks_within(
    total: float, utilization: float, weights: float, non_torch: float, block_bytes: float
) -> int:
    """KV blocks within ``utilization`` of ``total`` bytes with no activations and no CUDA graphs: the
    most any setting at that utilization gives (:meth:`FixedTerms.may_serve`; the planner asks it before
    a layout's :class:`FixedTerms` exist)."""
    kv = total * utilization - weights - 0.0 - non_torch
    kv_positive = 0.0 if kv < 0.0 else kv  # max(kv, 0.0) without the call (the planner's hottest line)
    return int(kv_positive // block_bytes) if block_bytes else _no_kv_blocks(kv)


#: The "blocks" of a model without a KV cache (encoder-only) whose budget leaves room: no count of
#: sequences is short of them, so the planner's block arithmetic serves any concurrency.
NO_KV_BLOCKS = 2**53


def _no_kv_blocks(kv: float) -> int:
    return NO_KV_BLOCKS if kv > 0.0 else 0


class ModelTerms:
    """What a per-GPU budget owes to the model, its dtype, quantization and KV-cache dtype and the
    engine's rules alone, for every GPU and layout: the weights of the whole model, the share of one
    layer and of the embedding or LM head, how many layers have full attention. :meth:`layout` gives the
    :class:`FixedTerms` of one GPU size and layout."""

    __slots__ = (
        "arch",
        "block_size",
        "coef",
        "counted",
        "dtype",
        "edge",
        "full_layers",
        "kv_cache_dtype",
        "layouts",
        "methods",
        "per_gpu",
        "per_layer_share",
        "quantization",
        "reserves",
        "sliding_layers",
        "total_weights",
    )

    def __init__(
        self,
        arch: Architecture,
        exact_parameters: int | None,
        dtype: str,
        quantization: str,
        kv_cache_dtype: str,
        cuda_graph_in_kv_budget: bool,
        block_size: int,
        weight_bits: float | None,
        weights_gib_total: float | None,
        coef: ModelCoefficients,
        methods: dict[str, QuantMethod],
        reserves: tuple[tuple[str, float], ...] = (),
    ) -> None:
        self.arch, self.coef, self.methods = arch, coef, methods
        #: GPU type → GiB per GPU held back for learned corrections (``SpecInputs.kv_reserve``).
        self.reserves = {gpu: gib * GIB for gpu, gib in reserves}
        self.dtype, self.quantization, self.kv_cache_dtype = dtype, quantization, kv_cache_dtype
        self.counted, self.block_size = cuda_graph_in_kv_budget, block_size
        if arch.is_state_space:
            self.block_size = STATE_BLOCK_TOKENS
        # Layers with a KV cache of their own, by type (full ones: full_layers, set below).
        self.sliding_layers = _kv_layer_kinds(arch)[1]
        counts = count_parameters(arch)
        if weights_gib_total is not None:
            total_weights = weights_gib_total * GIB
        else:
            total_weights = weights_bytes(arch, counts, dtype, quantization, weight_bits)
            if exact_parameters and counts.total:
                # A published parameter count corrects what the architecture formula misses (biases,
                # vision towers, padding) in proportion.
                total_weights *= exact_parameters / counts.total
        self.total_weights = total_weights
        # The busiest pipeline stage holds its share of the layers plus the embedding or the LM head.
        per_layer_share = total_weights - (counts.embedding + counts.lm_head) * DTYPE_BYTES[dtype]
        self.per_layer_share = max(per_layer_share, 0.0) / arch.num_layers
        self.edge = max(counts.embedding, counts.lm_head or counts.embedding) * DTYPE_BYTES[dtype]
        self.full_layers = _full_layers(arch)
        self.layouts: dict[tuple[float, int, int, str, str], FixedTerms] = {}
        self.per_gpu: dict[tuple[int, int, str, str], StaticTerms] = {}

    def static_terms(self, tp: int, pp: int, interconnect: str = "nvlink", gpu: str = "") -> StaticTerms:
        """What a tp × pp layout holds on its busiest GPU whatever the GPU and the settings
        (:data:`StaticTerms`): the weights and non-torch memory (bytes) and their sum in GiB (what
        :func:`~loadline.sizing._tune.hopeless` compares with the room on a GPU), and the KV cache's
        shape, from which :class:`FixedTerms` and the planner count blocks. ``gpu``: the GPU type, whose
        learned reserve (if any) counts as non-torch memory, so every test of the planner sees it."""
        if gpu and gpu not in self.reserves:
            gpu = ""  # types without a reserve share one entry
        found = self.per_gpu.get((tp, pp, interconnect, gpu))
        if found is None:
            arch, coef = self.arch, self.coef
            if pp == 1:
                weights = self.total_weights / tp
            else:
                weights = (self.per_layer_share * _layers_on_busiest_stage(arch, pp) + self.edge) / tp
            weights += coef.weights_overhead_gib * GIB
            non_torch = _non_torch_gib(tp, coef, interconnect) * GIB + self.reserves.get(gpu, 0.0)
            layers = _layers_on_busiest_stage(arch, pp)
            group_size, full_groups, sliding_groups = _layer_groups(
                arch.num_layers, self.full_layers, layers, self.sliding_layers
            )
            per_layer = _kv_bytes_per_layer_token(arch, self.kv_cache_dtype, self.dtype, tp)
            found = self.per_gpu[(tp, pp, interconnect, gpu)] = (
                weights,
                non_torch,
                weights / GIB + non_torch / GIB,
                group_size * self.block_size * per_layer,
                full_groups,
                sliding_groups,
                group_size,
                per_layer,
            )
        return found

    def weights_gib(self, tp: int, pp: int) -> float:
        return self.static_terms(tp, pp)[0] / GIB

    def static_gib(self, tp: int, pp: int) -> float:
        """Weights and non-torch memory on the busiest GPU, GiB."""
        return self.static_terms(tp, pp)[2]

    def layout(
        self, gpu_memory_gib: float, tp: int, pp: int, interconnect: str = "nvlink", gpu: str = ""
    ) -> FixedTerms:
        """The :class:`FixedTerms` of one GPU size and layout (``gpu``: the GPU type, for its learned
        reserve, as :meth:`static_terms`)."""
        if gpu and gpu not in self.reserves:
            gpu = ""
        key = (gpu_memory_gib, tp, pp, interconnect, gpu)
        found = self.layouts.get(key)
        if found is None:
            if len(self.layouts) >= 128:  # GPU sizes × layouts of the catalog fit; bounded all the same
                self.layouts.clear()
            found = self.layouts[key] = FixedTerms(self, gpu_memory_gib, tp, pp, interconnect, gpu)
        return found


class FixedTerms:
    """What a per-GPU budget owes to the model, the GPU and the layout alone, not to max-model-len nor to
    the settings the planner tunes (max-num-seqs, max-num-batched-tokens, gpu-memory-utilization,
    enforce-eager): the weights on the busiest GPU, non-torch memory, the CUDA-graph pool, the KV cache's
    layer groups and block size, and the constant factors of the activation and sampler terms.

    :meth:`budget` is the whole budget of one setting of the tuned values, and :meth:`pool` and
    :meth:`serves` only whether it starts and holds ``concurrency`` sequences; they evaluate the same
    expressions in the same order (those :func:`compute_budget` always evaluated), so a setting tuned
    with :meth:`serves` has exactly the :meth:`budget` it was chosen for. The tuning ladder and refusal
    fixes ask dozens of settings per layout; computed once per (model, GPU size, layout), these terms
    leave a handful of multiplications per setting."""

    __slots__ = (
        "block_bytes",
        "block_size",
        "bytes_per_token",
        "ceiling_blocks",
        "counted",
        "elem",
        "forward_factor",
        "full_groups",
        "gpu_memory_gib",
        "graphs",
        "groups",
        "kv_cache",
        "ladders",
        "moe_factor",
        "non_torch",
        "non_torch_gib",
        "per_layer",
        "pools",
        "routed",
        "sampler_copies",
        "sliding_groups",
        "sliding_window",
        "startup_extra",
        "starved",
        "total",
        "tp",
        "vocab",
        "warmup_copies",
        "weights",
        "weights_gib",
    )

    def __init__(
        self,
        model: ModelTerms,
        gpu_memory_gib: float,
        tp: int,
        pp: int,
        interconnect: str = "nvlink",
        gpu: str = "",
    ) -> None:
        arch, coef = model.arch, model.coef
        self.gpu_memory_gib = gpu_memory_gib
        self.tp = tp
        self.counted = model.counted
        self.block_size = model.block_size
        self.sliding_window = arch.sliding_window
        self.vocab = _sampled_vocab(arch)
        self.kv_cache = arch.has_kv_cache
        weights, non_torch, _, block_bytes, full_groups, sliding_groups, group_size, per_layer = (
            model.static_terms(tp, pp, interconnect, gpu)
        )
        self.weights = weights
        self.weights_gib = weights / GIB
        # activation_bytes: sampler + tokens × elem × forward_factor (+ the routed experts' share).
        self.sampler_copies = coef.sampler_logit_copies
        self.elem = DTYPE_BYTES[model.dtype]
        inter = arch.intermediate_size if not arch.is_moe or arch.num_dense_layers else 0
        self.forward_factor = (
            coef.forward_bytes_per_token_hidden * arch.hidden_size
            + coef.forward_bytes_per_token_intermediate * inter / tp
        )
        self.moe_factor = coef.moe_bytes_per_token_expert_intermediate if arch.is_moe else None
        routed = arch.num_experts_per_tok * arch.moe_intermediate_size
        self.routed = routed + arch.shared_expert_intermediate_size
        self.non_torch = non_torch
        self.non_torch_gib = non_torch / GIB
        self.graphs = _cuda_graph_gib(arch, tp, pp, coef) * GIB
        self.total = gpu_memory_gib * GIB
        self.full_groups, self.sliding_groups = full_groups, sliding_groups
        self.per_layer = per_layer
        self.block_bytes = block_bytes
        self.groups = self.full_groups + self.sliding_groups
        self.bytes_per_token = int(group_size * self.groups * self.per_layer)
        self.warmup_copies = coef.sampler_warmup_logit_copies
        self.startup_extra = model.methods[model.quantization].startup_extra_gib * GIB
        # Budgets that leave no KV cache, per setting: they hold no block at any max-model-len, so they
        # are the same for all of them (a layout too small for the weights is rejected with one).
        self.pools: dict[tuple[int, int, float, bool], Pool] = {}
        # Created when first needed (most layouts never need them): budgets that leave no KV cache,
        # the blocks at a utilization ceiling, and the last rung's pool per (defaults, concurrency,
        # engine pins), for the planner.
        self.starved: dict[tuple[int, int, float, bool], MemoryBudget] | None = None
        self.ceiling_blocks: dict[float, int] | None = None
        self.ladders: dict[tuple[object, ...], Pool] | None = None

    def _activation(self, seqs: int, tokens: int) -> float:
        sampler = self.sampler_copies * seqs * self.vocab * 4.0
        forward = tokens * self.elem * self.forward_factor
        if self.moe_factor is not None:
            forward += tokens * self.elem * self.moe_factor * self.routed / self.tp
        return sampler + forward

    def _blocks_per_seq(self, length: int, tokens: int) -> int:
        bs = self.block_size
        blocks_per_seq = self.full_groups * math.ceil(length / bs)
        if self.sliding_groups and self.sliding_window:
            window_tokens = min(self.sliding_window - 1 + tokens, length)
            blocks_per_seq += self.sliding_groups * (math.ceil(window_tokens / bs) + 1)
        elif self.sliding_groups:
            blocks_per_seq += self.sliding_groups * math.ceil(length / bs)
        return blocks_per_seq

    def pool(self, seqs: int, tokens: int, utilization: float, eager: bool) -> Pool:
        """The KV pool of one setting, and whether the engine starts with it at any max-model-len (the
        first and last of :meth:`budget`'s problems do not depend on it)."""
        activation = self._activation(seqs, tokens)
        graphs = 0.0 if eager else self.graphs
        budget = self.total * utilization
        kv = budget - self.weights - activation - self.non_torch
        if self.counted:
            kv -= graphs
        kv_positive = 0.0 if kv < 0.0 else kv  # max(kv, 0.0), as blocks_within
        blocks = int(kv_positive // self.block_bytes) if self.block_bytes else _no_kv_blocks(kv)
        headroom = self.total - budget - (0.0 if self.counted else graphs)
        warmup = self.warmup_copies * seqs * self.vocab * 4.0
        warmup += self.startup_extra
        return (blocks, tokens, kv > 0 and not headroom < warmup)

    def cached_pool(self, config: tuple[int, int, float, bool]) -> Pool:
        """:meth:`pool` of a (max-num-seqs, max-num-batched-tokens, utilization, eager) setting,
        memoised: every spec of a model on this layout shares vLLM's defaults and the ladder's bounds."""
        found = self.pools.get(config)
        if found is None:
            if len(self.pools) >= 256:
                self.pools.clear()
            found = self.pools[config] = self.pool(*config)
        return found

    def may_serve(self, utilization: float, length: int, concurrency: int) -> bool:
        """False when no setting at ``utilization`` or below can serve: even with no activations, no
        CUDA graphs and the shortest window a sequence needs, the KV blocks fall short. (Each step of
        :meth:`pool` and :meth:`serves` is monotone in these, so this bounds them in floating point too.)"""
        if self.ceiling_blocks is None:
            self.ceiling_blocks = {}
        blocks = self.ceiling_blocks.get(utilization)
        if blocks is None:
            blocks = blocks_within(self.total, utilization, self.weights, self.non_torch, self.block_bytes)
            if len(self.ceiling_blocks) >= 16:
                self.ceiling_blocks.clear()
            self.ceiling_blocks[utilization] = blocks
        blocks_per_seq = self._blocks_per_seq(length, 0)
        held = blocks / blocks_per_seq if blocks_per_seq else 0.0
        return not held < 1.0 and held >= concurrency

    def serves(self, pool: Pool, length: int, concurrency: int) -> bool:
        """``budget(...).fits and budget(...).max_concurrency >= concurrency`` for the pool's setting."""
        blocks, tokens, starts = pool
        if not starts:
            return False
        blocks_per_seq = self._blocks_per_seq(length, tokens)
        held = blocks / blocks_per_seq if blocks_per_seq else 0.0
        return not held < 1.0 and held >= concurrency

    def sampler_warmup_gib(self, seqs: int) -> float:
        warmup = self.warmup_copies * seqs * self.vocab * 4.0
        warmup += self.startup_extra
        return warmup / GIB

    def cuda_graph_gib(self, eager: bool) -> float:
        graphs = 0.0 if eager else self.graphs
        return graphs / GIB

    def budget(self, length: int, seqs: int, tokens: int, utilization: float, eager: bool) -> MemoryBudget:
        """The budget of one setting (what :func:`compute_budget` returns for it)."""
        activation = self._activation(seqs, tokens)
        non_torch = self.non_torch
        graphs = 0.0 if eager else self.graphs
        total = self.total
        weights = self.weights
        budget = total * utilization
        kv = budget - weights - activation - non_torch
        if self.counted:
            kv -= graphs
        if kv <= 0 and self.starved is not None:
            starved = self.starved.get((seqs, tokens, utilization, eager))
            if starved is not None:
                return starved
        kv_positive = 0.0 if kv < 0.0 else kv  # max(kv, 0.0), as blocks_within
        block_bytes = self.block_bytes
        blocks = int(kv_positive // block_bytes) if block_bytes else _no_kv_blocks(kv)
        kv_tokens = blocks * self.block_size // max(self.groups, 1)
        bytes_per_token = self.bytes_per_token
        blocks_per_seq = self._blocks_per_seq(length, tokens)
        concurrency = blocks / blocks_per_seq if blocks_per_seq else 0.0
        if not self.kv_cache:
            # No KV cache: nothing is held per sequence; the scheduler's max-num-seqs bounds a batch.
            blocks, kv_tokens, kv_positive = 0, 0, 0.0
            concurrency = float(seqs) if kv > 0 else 0.0
        elif self.block_size == STATE_BLOCK_TOKENS:
            kv_tokens = blocks * length  # one block: one sequence's state, up to max-model-len tokens
            bytes_per_token = math.ceil(block_bytes / length)  # a whole sequence's state, per token

        headroom = total - budget - (0.0 if self.counted else graphs)
        warmup = self.warmup_copies * seqs * self.vocab * 4.0
        warmup += self.startup_extra

        problems = []
        if kv <= 0:
            short = (-kv + block_bytes) / GIB
            left = "no KV cache" if self.kv_cache else "nothing"
            problems.append(
                f"weights {weights / GIB:.2f} + activation {activation / GIB:.2f} + non-torch "
                f"{non_torch / GIB:.2f} GiB leave {left} within {utilization:.2f} × "
                f"{self.gpu_memory_gib:.2f} GiB (short {short:.2f} GiB per GPU)"
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
                f"{utilization:.2f} after CUDA graphs; sampler warm-up with max-num-seqs "
                f"{seqs} needs {warmup / GIB:.2f} GiB "
                f"(short {(warmup - headroom) / GIB:.2f} GiB)"
            )
        result = MemoryBudget(  # positionally: keywords cost twice as much in a hot path
            self.gpu_memory_gib,  # total_gib
            weights / GIB,  # weights_gib
            activation / GIB,  # activation_gib
            non_torch / GIB,  # non_torch_gib
            graphs / GIB,  # cuda_graph_gib
            kv_positive / GIB,  # kv_cache_gib
            kv_tokens,  # kv_cache_tokens
            bytes_per_token,  # kv_bytes_per_token
            blocks,  # gpu_blocks
            concurrency,  # max_concurrency
            headroom / GIB,  # startup_headroom_gib
            warmup / GIB,  # sampler_warmup_gib
            tuple(problems),
        )
        if kv <= 0:
            if self.starved is None or len(self.starved) >= 64:
                self.starved = {}
            self.starved[(seqs, tokens, utilization, eager)] = result
        return result


def model_terms(
    arch: Architecture,
    exact_parameters: int | None,
    dtype: str,
    quantization: str,
    kv_cache_dtype: str,
    cuda_graph_in_kv_budget: bool,
    block_size: int,
    weight_bits: float | None,
    weights_gib_total: float | None,
    engine: str = "v1",
    reserves: tuple[tuple[str, float], ...] = (),
) -> ModelTerms:
    """:class:`ModelTerms`, memoised. The key holds the architecture, coefficients and quantization
    table by identity (hashing an architecture walks its per-layer tuple); each entry keeps those
    objects, so no other object can take their ids while it lives, and a table reloaded since is a new
    key."""
    coef = coefficients(engine)
    methods = quantization_methods()
    key = (
        id(arch),
        id(coef),
        id(methods),
        exact_parameters,
        dtype,
        quantization,
        kv_cache_dtype,
        cuda_graph_in_kv_budget,
        block_size,
        weight_bits,
        weights_gib_total,
        reserves,
    )
    found = _MODEL_TERMS.peek(key, arch)
    if found is not None:
        return found
    return _MODEL_TERMS.get(
        key,
        arch,
        lambda: ModelTerms(
            arch,
            exact_parameters,
            dtype,
            quantization,
            kv_cache_dtype,
            cuda_graph_in_kv_budget,
            block_size,
            weight_bits,
            weights_gib_total,
            coef,
            methods,
            reserves,
        ),
    )


_MODEL_TERMS: GuardedMemo[tuple[object, ...], ModelTerms] = GuardedMemo(1024)
