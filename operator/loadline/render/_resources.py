"""Host-side sizing of a vLLM pod: memory, CPU, /dev/shm, the model cache and the start-up budget.

GPUs come from the plan; everything here is derived from it with small, documented rules, each
overridable where the API allows (``spec.resources``). All figures are per pod: a multi-node replica
has ``plan.chosen.nodes`` pods, each with ``gpus / nodes`` GPUs.

Rules (GiB unless said otherwise):

* ``/dev/shm`` = max(2, 2 × GPUs per pod). NCCL and vLLM's multiprocessing executor exchange tensors
  through shared memory; Docker's 64 MiB default makes tensor parallelism crash.
* host memory = ``spec.resources.memoryGiB``, else max(16, ⌈weights on this pod's GPUs + CPU KV
  offload share + /dev/shm + 4 + 1 per GPU⌉). Why: safetensors are memory-mapped while loading and the
  page cache they fill is charged to the pod's cgroup (a limit below one copy of the pod's weights
  makes loading thrash); the offload buffer is pinned host memory; a memory-backed emptyDir counts
  against the limit; 4 GiB for the API server, tokenizer and engine processes and ~1 GiB of CUDA host
  allocations per GPU worker. Requests equal limits, like the GPUs.
* CPU = ``spec.resources.cpu``, else 1 + 2 per GPU (API server, engine core busy loop and one worker
  process per GPU). A request only: a CPU limit would throttle the engine's busy loop (CFS quota),
  which shows up as latency spikes, not as savings.
* model cache (emptyDir at ``/data``, and the ephemeral-storage request) = ⌈1.25 × all weights + 20⌉:
  every pod downloads the checkpoint (plus tokenizer and config files) to its node's disk.
* start-up budget (seconds) = max(600, ⌈all weights / 50 MB/s⌉ + 300): worst-case download and load at
  50 MB/s, plus 5 minutes for torch.compile, CUDA-graph capture and KV-cache profiling. The startup
  probe's failureThreshold × periodSeconds covers it, so liveness never kills a pod still loading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadline.api import InferenceModel
from loadline.sizing import Plan

GIB = 1024**3
WORST_CASE_LOAD_BYTES_PER_SECOND = 50e6
STARTUP_OVERHEAD_SECONDS = 300
MIN_STARTUP_SECONDS = 600
STARTUP_PERIOD_SECONDS = 10


@dataclass(frozen=True)
class PodResources:
    """What one vLLM pod of the plan needs of its node besides GPUs."""

    gpus: int
    memory_gib: int
    cpu: int
    shm_gib: int
    cache_gib: int
    startup_seconds: int
    weights_total_gib: float

    @property
    def startup_failure_threshold(self) -> int:
        return math.ceil(self.startup_seconds / STARTUP_PERIOD_SECONDS)


def weights_total_gib(plan: Plan) -> float:
    """The whole checkpoint as loaded on the GPUs (exact when the spec gives weightsGiB).

    Otherwise the planner's per-GPU weights × GPUs; with pipeline parallelism that counts the busiest
    stage on every GPU, a slight over-estimate, which is the safe side for download budgets.
    """
    settings = plan.settings
    if settings.weights_gib_total is not None:
        return settings.weights_gib_total
    return plan.budget.weights_gib * plan.chosen.gpus


def pod_resources(obj: InferenceModel, plan: Plan) -> PodResources:
    """Apply the rules above to one InferenceModel and its plan."""
    chosen = plan.chosen
    nodes = max(chosen.nodes, 1)
    gpus = max(chosen.gpus // nodes, 1)
    total = weights_total_gib(plan)
    shm = max(2, 2 * gpus)
    offload = obj.spec.kv_offload.cpu_gi_b if obj.spec.kv_offload is not None else 0.0
    if obj.spec.resources.memory_gi_b is not None:
        memory = math.ceil(obj.spec.resources.memory_gi_b)
    else:
        needed = plan.budget.weights_gib * gpus + offload / nodes + shm + 4 + gpus
        memory = max(16, math.ceil(needed))
    cpu = obj.spec.resources.cpu or 1 + 2 * gpus
    cache = math.ceil(1.25 * total + 20)
    startup = max(
        MIN_STARTUP_SECONDS,
        math.ceil(total * GIB / WORST_CASE_LOAD_BYTES_PER_SECOND) + STARTUP_OVERHEAD_SECONDS,
    )
    startup = math.ceil(startup / STARTUP_PERIOD_SECONDS) * STARTUP_PERIOD_SECONDS
    return PodResources(
        gpus=gpus,
        memory_gib=memory,
        cpu=cpu,
        shm_gib=shm,
        cache_gib=cache,
        startup_seconds=startup,
        weights_total_gib=total,
    )
