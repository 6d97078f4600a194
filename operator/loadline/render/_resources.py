"""Host-side sizing of a vLLM pod: memory, CPU, /dev/shm, the model cache and the start-up budget.

GPUs come from the plan; everything here is derived from it with small, documented rules, each
overridable where the API allows (``spec.resources``). All figures are per pod: a multi-node replica
has ``plan.chosen.nodes`` pods, each with ``gpus / nodes`` GPUs.

Rules (GiB unless said otherwise):

* ``/dev/shm``, host memory and CPU: the planner's figures for the pod (``sizing.pod_request``, rules in
  ``loadline/sizing/_shapes.py``), the same the planner checked against the node shape it assumed, so
  the manifests ask exactly for what the plan priced. Memory requests equal limits, like the GPUs; CPU
  is a request only: a CPU limit would throttle the engine's busy loop (CFS quota), which shows up as
  latency spikes, not as savings.
* model cache (emptyDir at ``/data``, and the ephemeral-storage request) = ⌈1.1 × download + 20⌉, where
  download is the checkpoint as its files store it (``sizing.checkpoint_download``: torch_dtype or the
  pre-quantized format, never the in-GPU weights, which online fp8/bitsandbytes halve or quarter):
  10 % for the estimate's error (gpt-oss weights read 6-9 % low), 20 GiB for what else lands under
  ``HOME=/data`` (hf_xet's chunk cache, up to 10 GB by default; torch.compile, Triton and FlashInfer
  caches). With ``spec.modelCache`` the volume is the user's: no emptyDir, no ephemeral-storage request
  (a read-only volume gets a ``CACHE_EXTRA_GIB`` emptyDir for the engine's own caches).
* start-up budget (seconds) = max(600, ⌈download / DOWNLOAD_BYTES_PER_SECOND + download /
  LOAD_BYTES_PER_SECOND⌉ + 300): the download, reading it back into the GPUs, then 5 minutes for
  torch.compile, CUDA-graph capture and KV-cache profiling. With ``spec.modelCache`` the download
  term is left out (the checkpoint is assumed to be there; if not, the first start may need a
  restart, which the kubelet does). The startup probe's failureThreshold × periodSeconds covers it, so
  liveness never kills a pod still loading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadline.api import InferenceModel
from loadline.sizing import Plan, pod_request

#: Worst-case download throughput from the Hugging Face Hub, per pod. Hub/CDN downloads to cloud nodes
#: commonly run at 100-500 MB/s, but shared NAT gateways, egress proxies and many pods of one rollout
#: downloading at once cut that by several times; 50 MB/s (400 Mbit/s) is the floor loadline budgets for.
DOWNLOAD_BYTES_PER_SECOND = 50e6
#: Worst-case read of the safetensors into the GPUs: a network volume at a cloud disk's baseline
#: (AWS gp3: 125 MiB/s, GCP pd-balanced: ~140 MB/s per volume at small sizes); local NVMe is faster.
LOAD_BYTES_PER_SECOND = 125 * 1024**2
#: Fraction added to the estimated download for the estimate's own error (gpt-oss reads 6-9 % low).
CACHE_ERROR_FRACTION = 0.1
#: GiB under HOME=/data besides the checkpoint: hf_xet chunk cache (10 GB default), compile caches.
CACHE_EXTRA_GIB = 20
STARTUP_OVERHEAD_SECONDS = 300
MIN_STARTUP_SECONDS = 600
STARTUP_PERIOD_SECONDS = 10
#: What a Deployment's progress deadline allows beyond the start-up budget: pulling the image, which
#: comes before the container (and its startup probe) starts. vLLM's CUDA images are several GB; 300 s
#: is 15 GB at the download floor above.
IMAGE_PULL_SECONDS = 300


@dataclass(frozen=True)
class PodResources:
    """What one vLLM pod of the plan needs of its node besides GPUs."""

    gpus: int
    memory_gib: int
    cpu: int
    shm_gib: int
    cache_gib: int  # emptyDir sizeLimit and ephemeral-storage request (0: the user's volume)
    startup_seconds: int
    weights_total_gib: float
    download_gib: float
    scratch_gib: int = 0  # emptyDir for the engine's caches beside a read-only model cache

    @property
    def startup_failure_threshold(self) -> int:
        return math.ceil(self.startup_seconds / STARTUP_PERIOD_SECONDS)

    @property
    def progress_deadline_seconds(self) -> int:
        """The Deployment's ``progressDeadlineSeconds``: a new pod may take its image pull and its whole
        start-up budget before the roll-out counts as stalled. Kubernetes' default (600 s) is the
        smallest start-up budget alone, so a model loading its weights would show
        ``ProgressDeadlineExceeded`` (which Argo CD and ``kubectl rollout status`` read as failed)
        while its pod is still starting as it should."""
        return self.startup_seconds + IMAGE_PULL_SECONDS


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
    total = weights_total_gib(plan)
    spec = obj.spec
    pod = chosen.pod or pod_request(
        weights_gib_per_gpu=plan.budget.weights_gib,
        gpus_per_pod=chosen.gpus // nodes,
        nodes=nodes,
        kv_offload_gib=spec.kv_offload.cpu_gi_b if spec.kv_offload is not None else 0.0,
        memory_override_gib=spec.resources.memory_gi_b,
        cpu_override=spec.resources.cpu,
    )
    gpus, memory, cpu, shm = pod.gpus, pod.memory_gib, pod.cpu, pod.shm_gib
    download = plan.download
    existing = obj.spec.model_cache
    seconds = download.bytes / LOAD_BYTES_PER_SECOND
    if existing is None:
        seconds += download.bytes / DOWNLOAD_BYTES_PER_SECOND
        cache = math.ceil((1 + CACHE_ERROR_FRACTION) * download.gib + CACHE_EXTRA_GIB)
        scratch = 0
    else:
        cache = 0
        scratch = CACHE_EXTRA_GIB if existing.persistent_volume_claim.read_only else 0
    startup = max(MIN_STARTUP_SECONDS, math.ceil(seconds) + STARTUP_OVERHEAD_SECONDS)
    startup = math.ceil(startup / STARTUP_PERIOD_SECONDS) * STARTUP_PERIOD_SECONDS
    return PodResources(
        gpus=gpus,
        memory_gib=memory,
        cpu=cpu,
        shm_gib=shm,
        cache_gib=cache,
        startup_seconds=startup,
        weights_total_gib=total,
        download_gib=download.gib,
        scratch_gib=scratch,
    )
