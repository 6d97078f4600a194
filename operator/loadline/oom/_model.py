"""The plain data the out-of-memory classifier works on and returns.

Frozen dataclasses, not pydantic models: validation happens once, at the boundary
(:mod:`loadline.oom._schema`), and everything past it can trust these values. The operator builds the
same :class:`Incident` from what it observes in the cluster, so the CLI and the operator classify
identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class OomClass(StrEnum):
    """Why a vLLM server ran out of memory, as the platform teams' field guide names it."""

    MODEL_EXCEEDS_VRAM = "model_exceeds_vram"
    BATCH_MISCONFIGURATION = "batch_misconfiguration"
    KV_CACHE_OVERFLOW = "kv_cache_overflow"
    FRAGMENTATION = "fragmentation"
    HOST_MEMORY = "host_memory"
    UNKNOWN = "unknown"


#: The classes that name a cause (everything but ``unknown``), in the order ties are broken.
CAUSES: tuple[OomClass, ...] = (
    OomClass.MODEL_EXCEEDS_VRAM,
    OomClass.BATCH_MISCONFIGURATION,
    OomClass.KV_CACHE_OVERFLOW,
    OomClass.FRAGMENTATION,
    OomClass.HOST_MEMORY,
)


@dataclass(frozen=True)
class Metrics:
    """Prometheus figures just before the crash; every one may be missing."""

    prompt_tokens_max: int | None = None
    kv_cache_usage: float | None = None
    requests_running: int | None = None
    gpu_memory_growth_gib_per_hour: float | None = None
    #: Recent per-interval maxima of the prompt length, oldest first (lets us see prompts growing).
    prompt_tokens_recent: tuple[int, ...] = ()
    #: Set by an operator that has already judged the trend itself (for example from a PromQL deriv()).
    prompt_tokens_growing: bool | None = None
    preemptions: int | None = None


@dataclass(frozen=True)
class Config:
    """The engine settings the crashed pod ran with."""

    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    dtype: str | None = None
    #: The quantization method the weights were loaded with (vLLM's ``--quantization``, or a GGUF type).
    quantization: str | None = None
    memory_limit_bytes: int | None = None
    kv_offload_cpu_gib: float | None = None
    #: Whether PYTORCH_CUDA_ALLOC_CONF already holds ``expandable_segments:True``.
    expandable_segments: bool | None = None


@dataclass(frozen=True)
class Plan:
    """What the sizer planned: total weights and the memory of one GPU."""

    weights_gib: float | None = None
    gpu_memory_gib: float | None = None
    #: KV cache capacity in tokens, as planned or as vLLM logged it ("GPU KV cache size: N tokens").
    kv_cache_tokens: int | None = None
    #: Whether the spec lets the operator switch to a quantized checkpoint.
    quantization_allowed: bool | None = None


@dataclass(frozen=True)
class Incident:
    """One container termination, as the CLI reads it from JSON or the operator observes it."""

    reason: str
    exit_code: int | None = None
    message: str = ""
    log_tail: str = ""
    ever_ready: bool | None = None
    uptime_seconds: float | None = None
    seconds_since_ready: float | None = None
    #: The moment of the pod's life the crash came at, when the operator knows it from the full log or
    #: the probes: ``loading`` (weights loading), ``starting`` (weights loaded, not yet Ready: profiling,
    #: KV cache, CUDA graphs, sampler warm-up) or ``serving``. The message alone often does not say.
    phase: str | None = None
    engine_version: str | None = None
    #: The model served, as its spec or a report names it: the weights' size when the plan's figure is
    #: missing (the catalog's count, else a floor read from the name: ``sizing.weights_from_name``).
    model: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    config: Config = field(default_factory=Config)
    plan: Plan = field(default_factory=Plan)

    @property
    def text(self) -> str:
        """Termination message and log tail together: the signals may sit in either."""
        return "\n".join(part for part in (self.message, self.log_tail) if part)


@dataclass(frozen=True)
class AllocatorFigures:
    """The numbers in torch's ``OutOfMemoryError`` text, in GiB.

    ``fmt`` is ``"old"`` for "(GPU 0; X total capacity; Y already allocated; Z free; W reserved in
    total by PyTorch)" and ``"new"`` for "GPU 0 has a total capacity of X of which Y is free ...".
    Fields the text does not give are ``None``.
    """

    fmt: str
    gpu: int | None = None
    requested_gib: float | None = None
    total_gib: float | None = None
    free_gib: float | None = None
    #: New format: memory the process holds, PyTorch or not ("this process has X memory in use").
    process_in_use_gib: float | None = None
    allocated_gib: float | None = None
    private_pools_gib: float | None = None
    reserved_unallocated_gib: float | None = None
    #: Old format: "W reserved in total by PyTorch" (allocated plus reserved-but-unallocated).
    reserved_total_gib: float | None = None
    #: The largest free block the allocator had, where it says so (XLA's PJRT on TPU: "The largest
    #: contiguous region of free memory is X"; tt-metal: "largest free block: X").
    largest_free_gib: float | None = None

    @property
    def outside_gib(self) -> float | None:
        """GPU memory neither free nor held by this process's PyTorch allocator.

        That is CUDA context, NCCL buffers and, when large, other processes on the same GPU.
        """
        if self.total_gib is None or self.free_gib is None:
            return None
        if self.process_in_use_gib is not None:
            return max(0.0, self.total_gib - self.free_gib - self.process_in_use_gib)
        if self.reserved_total_gib is not None:
            return max(0.0, self.total_gib - self.free_gib - self.reserved_total_gib)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Diagnosis:
    """The classifier's answer: a class, how sure it is, and why, in sentences a person can check."""

    oom_class: OomClass
    confidence: float
    evidence: tuple[str, ...]
    caller_side: bool = False
    caller_note: str | None = None
    #: Score per cause before the decision (for status and debugging; not a probability).
    scores: tuple[tuple[OomClass, float], ...] = ()
    figures: AllocatorFigures | None = None
    #: KV cache capacity in tokens when the text or plan tells it (feeds the max_model_len proposal).
    kv_capacity_tokens: int | None = None
    #: max_model_len as vLLM's own refusal message states it (when the config does not say).
    logged_max_model_len: int | None = None
    #: Dummy request count from vLLM's sampler warm-up error (that is max_num_seqs).
    warmup_requests: int | None = None
    #: Signal ids that fired, for tests and for the operator's records.
    signals: tuple[str, ...] = ()
    #: The evidence that decided: the signal (or timing row) weighing most for the class, and its
    #: sentence. None for ``unknown``, where nothing decided.
    decided_by: tuple[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of ``loadline classify --output json`` (without the remediation)."""
        return {
            "class": self.oom_class.value,
            "confidence": self.confidence,
            "evidence": list(self.evidence),
            "caller_side": self.caller_side,
            "caller_note": self.caller_note,
            "scores": {c.value: s for c, s in self.scores},
            "signals": list(self.signals),
            "decided_by": (
                {"signal": self.decided_by[0], "evidence": self.decided_by[1]} if self.decided_by else None
            ),
        }


@dataclass(frozen=True)
class Change:
    """One setting to change: the field as INCIDENT.json names it, the value now and the proposal."""

    field: str
    old: float | int | str | bool | None
    new: float | int | str | bool | None

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class Option:
    """An alternative action the policy may prefer (or be the only one it allows)."""

    action: str
    summary: str
    changes: tuple[Change, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "summary": self.summary,
            "changes": [c.to_dict() for c in self.changes],
        }


@dataclass(frozen=True)
class Remediation:
    """A proposed fix, as plain data. Applying it (budgets, cool-downs, policy) is the operator's job."""

    action: str
    summary: str
    changes: tuple[Change, ...] = ()
    restart: bool = False
    alternatives: tuple[Option, ...] = ()
    look_at: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "summary": self.summary,
            "changes": [c.to_dict() for c in self.changes],
            "restart": self.restart,
            "alternatives": [o.to_dict() for o in self.alternatives],
            "look_at": list(self.look_at),
        }
