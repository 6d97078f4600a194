"""The ``loadline.dev/v1alpha1`` InferenceModel resource as pydantic models.

These models are the single source of truth: the CRD in ``crds/`` is generated from them
(``loadline crds``), the CLI validates files with them and the operator parses objects with them.
Field descriptions become ``kubectl explain`` text, so they are written for a platform engineer.
Cross-field rules are written twice on purpose: as CEL (``x-kubernetes-validations``) so the API server
rejects a bad object at ``kubectl apply`` time, and as a pydantic validator so offline use
(``loadline plan``) rejects the same object with the same words.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel

GROUP = "loadline.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceModel"
PLURAL = "inferencemodels"
SINGULAR = "inferencemodel"
# The Gateway API Inference Extension's (now renamed) InferenceModel used no short name; "im" and
# "infmodel" are common guesses elsewhere, so ours is distinct: "lim" (loadline inference model).
SHORT_NAMES = ("lim",)
CATEGORIES = ("loadline",)

DEFAULT_ENGINE_VERSION = "0.19.0"

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
KVCacheDtype = Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
# vLLM's --quantization names that run on NVIDIA GPUs, plus "none". The weight footprint of each is
# data (sizing/data/quantization.json), not code.
Quantization = Literal[
    "none",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "marlin",
    "fp8",
    "fbgemm_fp8",
    "ptpc_fp8",
    "compressed-tensors",
    "bitsandbytes",
    "mxfp4",
    "modelopt",
    "modelopt_fp4",
    "gguf",
    "experts_int8",
    "moe_wna16",
    "torchao",
    "auto-round",
    "hqq",
    "quark",
]
Phase = Literal["Pending", "Planning", "Deploying", "Ready", "Degraded", "Failed"]
RemediationMode = Literal["auto", "recommend", "off"]
OOMClass = Literal[
    "model_exceeds_vram",
    "batch_misconfiguration",
    "kv_cache_overflow",
    "fragmentation",
    "host_memory",
    "unknown",
]

_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(/[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?$"
_K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
_VERSION_PATTERN = r"^[0-9]+\.[0-9]+(\.[0-9]+)?([.+-][0-9A-Za-z.+-]*)?$"


class _Model(BaseModel):
    """Shared settings: camelCase on the wire, unknown fields rejected (as a structural CRD does)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


class _SpecModel(_Model):
    """Desired state, as strict as the CRD's structural schema: the API server refuses ``true`` or
    ``"8"`` where an integer is wanted, a number where a string is wanted, and NaN or infinity (JSON has
    neither), so offline use refuses them too instead of coercing them (pydantic's lax mode would read
    ``true`` as 1)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class ConfigMapKeyRef(_SpecModel):
    """A key of a ConfigMap in the InferenceModel's namespace."""

    name: str = Field(
        description="Name of the ConfigMap.", min_length=1, max_length=253, pattern=_K8S_NAME_PATTERN
    )
    key: str = Field(default="config.json", description="Key holding the model's config.json.", min_length=1)


class SecretKeyRef(_SpecModel):
    """A key of a Secret in the InferenceModel's namespace; the value never appears in a manifest."""

    name: str = Field(
        description="Name of the Secret.", min_length=1, max_length=253, pattern=_K8S_NAME_PATTERN
    )
    key: str = Field(default="token", description="Key of the Secret holding the value.", min_length=1)


class ModelSource(_SpecModel):
    """Which model to serve and where its architecture (Hugging Face config.json) comes from.

    The architecture is taken, in order, from ``config`` (inline), ``configMapRef``, then loadline's
    bundled catalog of popular models.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.config) && has(self.configMapRef))",
                    "message": "set at most one of model.config and model.configMapRef",
                }
            ]
        }
    )

    name: str = Field(
        description="Hugging Face repository id of the model, e.g. meta-llama/Llama-3.1-8B-Instruct.",
        min_length=1,
        max_length=200,
        pattern=_NAME_PATTERN,
    )
    revision: str | None = Field(
        default=None,
        description="Git revision (branch, tag or commit) of the repository to load; default: main.",
        max_length=100,
        pattern=r"^[A-Za-z0-9._/-]+$",
    )
    served_name: str | None = Field(
        default=None,
        description="Model name clients send in API requests (--served-model-name); default: name.",
        max_length=200,
        pattern=_NAME_PATTERN,
    )
    config: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Inline copy of the model's Hugging Face config.json. Use it for models that are not in "
            "loadline's catalog."
        ),
    )
    config_map_ref: ConfigMapKeyRef | None = Field(
        default=None, description="ConfigMap holding the model's config.json, for models not in the catalog."
    )
    weights_gi_b: float | None = Field(
        default=None,
        alias="weightsGiB",
        gt=0,
        le=100000,
        description=(
            "Exact size of the model's weights in GiB as loaded on the GPUs (all shards together). "
            "When set it replaces the estimate made from the architecture."
        ),
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding a Hugging Face token (HF_TOKEN) for gated or private models.",
    )


class EnvVar(_SpecModel):
    """An environment variable for the vLLM container."""

    name: str = Field(description="Variable name.", min_length=1, max_length=256, pattern=_ENV_NAME_PATTERN)
    value: str = Field(default="", description="Variable value.", max_length=32768)


class Engine(_SpecModel):
    """The vLLM engine: version, image and the batching settings that drive memory use.

    Settings left empty are chosen by loadline's planner, which starts from vLLM's own defaults for
    the version.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.maxNumSeqs) || !has(self.maxNumBatchedTokens)"
                    " || self.maxNumBatchedTokens >= self.maxNumSeqs",
                    "message": "engine.maxNumBatchedTokens must be at least engine.maxNumSeqs",
                }
            ]
        }
    )

    version: str = Field(
        default=DEFAULT_ENGINE_VERSION,
        description="vLLM version the image runs, e.g. 0.19.0. Flags are chosen for this version.",
        max_length=40,
        pattern=_VERSION_PATTERN,
    )
    image: str = Field(
        default="",
        description="Container image; default: vllm/vllm-openai:v<version>.",
        max_length=512,
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "Fraction of each GPU's memory vLLM may use (--gpu-memory-utilization); default: vLLM's "
            "default for the version (0.9)."
        ),
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Most sequences batched together (--max-num-seqs); default: chosen by the planner.",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description=(
            "Most tokens processed in one engine step (--max-num-batched-tokens); the activation peak "
            "grows with it. Default: vLLM's default for the version."
        ),
    )
    enforce_eager: bool = Field(
        default=False,
        description="Disable CUDA graphs (--enforce-eager): saves their memory, costs decode speed.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Extra vLLM command-line arguments, e.g. ['--enable-prefix-caching']. A flag the chosen "
            "version does not have is an error."
        ),
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Extra environment variables for vLLM."
    )


class KVOffload(_SpecModel):
    """CPU memory that extends the KV cache (--kv-offloading-size, or --swap-space on old versions)."""

    cpu_gi_b: float = Field(
        alias="cpuGiB",
        ge=0,
        le=4096,
        description="GiB of host memory per replica for offloaded KV cache blocks; 0 turns offload off.",
    )


class GPUSelector(_SpecModel):
    """Which GPUs the planner may choose from."""

    types: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Allowed GPU types by loadline catalog name (e.g. L4, L40S, A100-80GB, H100-80GB); "
            "empty: any type in the catalog."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    max_gpus_per_replica: int | None = Field(
        default=None,
        alias="maxGPUsPerReplica",
        ge=1,
        le=256,
        description="Upper bound on GPUs for one replica (tensor × pipeline parallel).",
    )
    providers: list[Literal["aws", "gcp", "azure", "onprem"]] = Field(
        default_factory=list,
        max_length=4,
        description=(
            "Where the nodes come from, for the node shapes (instance types) the plan may assume and price: "
            "aws, gcp, azure, onprem; empty: any shape in the catalog."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    allow_multi_node: bool = Field(
        default=True,
        description="Allow a replica to span nodes (pipeline parallel across nodes, LeaderWorkerSet).",
    )
    allow_fallback: bool = Field(
        default=True,
        description=(
            "When the cheapest plan's GPU type is absent or full in the cluster, use the next "
            "feasible type instead of waiting."
        ),
    )
    dedicated_nodes: bool = Field(
        default=False,
        description=(
            "Price each pod's node whole, as when no other pod shares it. Default false: a pod is charged "
            "its share of the node (the largest of its GPU, host-memory and CPU shares), and the whole "
            "node only when it leaves no room for another GPU pod."
        ),
    )


class Resources(_SpecModel):
    """Host (CPU-side) resources of each vLLM pod; GPU counts come from the plan."""

    memory_gi_b: float | None = Field(
        default=None,
        alias="memoryGiB",
        gt=0,
        le=8192,
        description="Host memory request and limit per pod in GiB; default: sized by the planner.",
    )
    cpu: int | None = Field(default=None, ge=1, le=1024, description="CPU cores per pod; default: sized.")


class Remediation(_SpecModel):
    """What loadline may do by itself when the model runs out of memory."""

    mode: RemediationMode | None = Field(
        default=None,
        description=(
            "auto: apply fixes within policy limits; recommend: only report; off: do nothing. "
            "Default: the fleet policy's mode."
        ),
    )


class PersistentVolumeClaimCache(_SpecModel):
    """A PersistentVolumeClaim in the InferenceModel's namespace that holds (or will hold) the cache."""

    claim_name: str = Field(
        description="Name of the PersistentVolumeClaim.",
        min_length=1,
        max_length=253,
        pattern=_K8S_NAME_PATTERN,
    )
    read_only: bool = Field(
        default=False,
        description=(
            "Mount it read-only: the checkpoint must already be in it (HF_HUB_OFFLINE=1 is set) and the "
            "engine's own caches go to a small emptyDir instead. Lets many pods share one ReadOnlyMany "
            "volume."
        ),
    )


class ModelCache(_SpecModel):
    """An existing volume mounted at /data, where the pod keeps the Hugging Face cache, instead of an
    emptyDir the pod fills by downloading the checkpoint at every start."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # matches() is core CEL (RE2); no string-extension library needed.
                    "rule": "!has(self.subPath) || (!self.subPath.startsWith('/') && "
                    "!self.subPath.matches('(^|/)[.][.](/|$)'))",
                    "message": "modelCache.subPath must be a relative path without '..' (e.g. models/llama)",
                }
            ]
        }
    )

    persistent_volume_claim: PersistentVolumeClaimCache = Field(
        description=(
            "The PersistentVolumeClaim to mount at /data (the Hugging Face cache is /data/huggingface). "
            "Every pod of the model mounts it: with several replicas or nodes it must be ReadWriteMany or "
            "ReadOnlyMany."
        )
    )
    sub_path: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="A directory inside the volume to mount instead of its root, e.g. one per model.",
    )

    @model_validator(mode="after")
    def _relative_sub_path(self) -> ModelCache:
        # Mirrors the CEL rule: the kubelet refuses absolute subPaths and '..'; refuse them at plan time.
        path = self.sub_path
        if path is not None and (path.startswith("/") or ".." in path.split("/")):
            raise ValueError(
                f"subPath {path!r} must be a relative path without '..' (fix: write it like models/llama)"
            )
        return self


AutoscalingSignal = Literal["kvCacheUsage", "waitingRequests", "promql"]


class Autoscaling(_SpecModel):
    """Replicas driven by load through KEDA: a ScaledObject on the model's scale subresource, with a
    Prometheus trigger on the vLLM series of the model's version (docs/autoscaling.md)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "autoscaling.minReplicas must be at most autoscaling.maxReplicas",
                },
                {
                    "rule": "self.signal != 'promql' || has(self.query)",
                    "message": "autoscaling.query is required with signal promql",
                },
                {
                    "rule": "self.signal == 'promql' || !has(self.query)",
                    "message": "autoscaling.query applies only with signal promql",
                },
                {
                    "rule": "self.signal != 'kvCacheUsage' || self.target <= 1.0",
                    "message": "autoscaling.target is a fraction of the KV cache (0 to 1) with signal "
                    "kvCacheUsage",
                },
            ]
        }
    )

    min_replicas: int = Field(default=1, ge=1, le=1000, description="Fewest replicas the autoscaler keeps.")
    max_replicas: int = Field(
        ge=1,
        le=1000,
        description="Most replicas the autoscaler may add; a FleetPolicy's maxReplicas and price limit "
        "bound it at admission.",
    )
    signal: AutoscalingSignal = Field(
        default="kvCacheUsage",
        description="What load is: kvCacheUsage (vLLM's KV-cache usage, 0..1, averaged over the "
        "replicas), waitingRequests (requests queued for the running batch, per replica) or promql "
        "(the value of query, per replica).",
    )
    target: float = Field(
        gt=0,
        le=1_000_000,
        description="The load per replica to keep: replicas = ceil(total load / target), as an HPA "
        "computes it.",
    )
    query: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="With signal promql: a PromQL expression whose single value is the model's total load.",
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="How long the load must stay low before replicas are removed (the HPA's scale-down "
        "stabilization window).",
    )

    @model_validator(mode="after")
    def _rules(self) -> Autoscaling:
        # Mirrors the CEL rules above, for offline use (loadline render, plan).
        if self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.minReplicas must be at most autoscaling.maxReplicas")
        if self.signal == "promql" and self.query is None:
            raise ValueError("autoscaling.query is required with signal promql")
        if self.signal != "promql" and self.query is not None:
            raise ValueError("autoscaling.query applies only with signal promql")
        if self.signal == "kvCacheUsage" and self.target > 1:
            raise ValueError(
                "autoscaling.target is a fraction of the KV cache (0 to 1) with signal kvCacheUsage"
            )
        return self


class InferenceModelSpec(_SpecModel):
    """The model to serve and the load it must carry. loadline plans GPUs and renders vLLM from it."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.quantization != 'none' || !has(self.weightBits)",
                    "message": "weightBits applies only together with a quantization method",
                },
                {
                    "rule": "!has(self.kvOffload) || !has(self.resources) || !has(self.resources.memoryGiB)"
                    " || self.resources.memoryGiB > self.kvOffload.cpuGiB",
                    "message": "resources.memoryGiB must be larger than kvOffload.cpuGiB (offloaded KV "
                    "blocks live in the pod's host memory)",
                },
            ]
        }
    )

    model: ModelSource = Field(description="The model to serve.")
    dtype: Dtype = Field(
        default="auto",
        description=(
            "Weight and activation dtype (--dtype); auto: the model's torch_dtype (float32 → bfloat16)."
        ),
    )
    quantization: Quantization = Field(
        default="none",
        description=(
            "vLLM quantization method (--quantization); none: the checkpoint's own quantization_config "
            "if it has one, else unquantized."
        ),
    )
    weight_bits: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="Bits per quantized weight, for methods whose bit width the config does not say.",
    )
    kv_cache_dtype: KVCacheDtype = Field(
        default="auto",
        description="KV cache dtype (--kv-cache-dtype); fp8 halves KV memory per token.",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        le=10_485_760,
        description="Longest sequence (prompt + output) in tokens (--max-model-len); default: the model's.",
    )
    concurrency: int = Field(
        default=1,
        ge=1,
        le=100_000,
        description="Sequences of maxModelLen tokens whose KV cache must fit at once in each replica.",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Number of vLLM replicas to run; the scale subresource's (kubectl scale, an HPA, KEDA "
        "write it). The operator never changes it.",
    )
    priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description="Order among models when the operator paces a storm of crash remediations: higher "
        "rolls out first (then the models that serve more replicas × concurrency).",
    )
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="Scale replicas on load with KEDA (a ScaledObject the operator renders); unset: "
        "replicas stays where it is set.",
    )
    engine: Engine = Field(default_factory=Engine, description="vLLM engine settings.")
    kv_offload: KVOffload | None = Field(default=None, description="Optional CPU KV-cache offload.")
    gpu: GPUSelector = Field(default_factory=GPUSelector, description="GPU types the planner may use.")
    resources: Resources = Field(default_factory=Resources, description="Host resources of each pod.")
    remediation: Remediation = Field(
        default_factory=Remediation, description="Automatic out-of-memory remediation."
    )
    model_cache: ModelCache | None = Field(
        default=None,
        description=(
            "Mount an existing volume as the model cache instead of an emptyDir sized for the download; "
            "the start-up probe then budgets loading from it, not downloading."
        ),
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> InferenceModelSpec:
        # Mirrors the CEL rules above so offline use fails the same way as `kubectl apply`.
        if self.quantization == "none" and self.weight_bits is not None:
            raise ValueError("weightBits applies only together with a quantization method")
        if self.model.config is not None and self.model.config_map_ref is not None:
            raise ValueError("set at most one of model.config and model.configMapRef")
        offload, memory = self.kv_offload, self.resources.memory_gi_b
        if offload is not None and memory is not None and memory <= offload.cpu_gi_b:
            raise ValueError(
                "resources.memoryGiB must be larger than kvOffload.cpuGiB (offloaded KV blocks live in "
                "the pod's host memory)"
            )
        eng = self.engine
        if (
            eng.max_num_seqs is not None
            and eng.max_num_batched_tokens is not None
            and eng.max_num_batched_tokens < eng.max_num_seqs
        ):
            raise ValueError("engine.maxNumBatchedTokens must be at least engine.maxNumSeqs")
        return self


class Condition(_Model):
    """A Kubernetes-style condition (Planned, Deployed, Ready)."""

    type: str = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="One-word CamelCase reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(default=None, description="Generation the condition is about.")


class MemoryBreakdown(_Model):
    """Per-GPU memory budget in GiB, as vLLM's engine accounts it."""

    total_gi_b: float = Field(alias="totalGiB", description="GPU memory as the driver reports it.")
    weights_gi_b: float = Field(alias="weightsGiB", description="Model weights on this GPU.")
    activation_gi_b: float = Field(alias="activationGiB", description="Activation peak of one step.")
    non_torch_gi_b: float = Field(alias="nonTorchGiB", description="CUDA context, NCCL and other non-torch.")
    cuda_graph_gi_b: float = Field(alias="cudaGraphGiB", description="CUDA-graph pool.")
    kv_cache_gi_b: float = Field(alias="kvCacheGiB", description="KV cache pool.")


class NodeShapeSummary(_Model):
    """The node shape (instance type or server) a plan assumes, and what its pods ask of it."""

    name: str = Field(description="Instance type or server name, e.g. 'g6.2xlarge'.")
    provider: str = Field(description="aws, gcp, azure or onprem.")
    gpus_per_node: int = Field(description="GPUs one instance has.")
    interconnect: str = Field(description="GPU-to-GPU link inside the instance: nvlink or pcie.")
    rdma: str = Field(description="Fabric between instances (efa, infiniband, ...), or none.")
    host_memory_gi_b: float | None = Field(
        default=None, alias="hostMemoryGiB", description="Host memory of one instance (null: not known)."
    )
    allocatable_memory_gi_b: float | None = Field(
        default=None,
        alias="allocatableMemoryGiB",
        description="Host memory left for pods after the node's reserve (docs/sizing.md).",
    )
    vcpus: float | None = Field(default=None, description="Logical CPUs of one instance (null: not known).")
    allocatable_cpu: float | None = Field(
        default=None, alias="allocatableCPU", description="CPUs left for pods after the node's reserve."
    )
    price_per_hour: float | None = Field(
        default=None, description="Catalog price of one instance per hour (USD); null when unknown."
    )
    price_verified: bool = Field(
        default=False,
        description="Whether a dated public source states pricePerHour (false: recalled, unverified).",
    )
    price_source: str = Field(default="", description="Where pricePerHour comes from (a URL), or why none.")
    price_as_of: str | None = Field(
        default=None, description="The date the price's source states (null: no dated source)."
    )
    instances_per_replica: int = Field(description="Instances one replica occupies (one per pod).")
    charged_share: float = Field(
        default=1.0,
        description=(
            "Share of one instance's price each pod is charged: the largest of its GPU, host-memory and "
            "CPU shares, or 1 for the whole node (see wholeNode)."
        ),
    )
    whole_node: bool = Field(
        default=True,
        description=(
            "Whether each pod is charged the whole instance: it leaves no room for another GPU pod, or "
            "spec.gpu.dedicatedNodes is set."
        ),
    )
    pod_memory_gi_b: int = Field(alias="podMemoryGiB", description="Host memory each pod requests (GiB).")
    pod_cpu: int = Field(alias="podCPU", description="CPUs each pod requests.")
    why: str = Field(
        default="",
        description="Why this shape: NVLink preference, idle GPUs, cheaper shapes that did not fit.",
    )
    source: str = Field(default="", description="Where the shape's figures come from.")


class PlanSummary(_Model):
    """The plan loadline chose, as shown in status."""

    gpu: str = Field(description="GPU type × GPUs per replica, e.g. 'L4x1'.")
    gpu_type: str = Field(description="GPU catalog name.")
    gpu_product: str = Field(default="", description="nvidia.com/gpu.product node label value.")
    gpus_per_replica: int = Field(description="GPUs per replica.")
    tensor_parallel_size: int = Field(description="Tensor-parallel size.")
    pipeline_parallel_size: int = Field(description="Pipeline-parallel size.")
    nodes_per_replica: int = Field(default=1, description="Nodes one replica spans.")
    max_model_len: int = Field(description="Longest sequence served.")
    max_num_seqs: int = Field(description="Batch size limit.")
    max_num_batched_tokens: int = Field(description="Tokens per engine step.")
    gpu_memory_utilization: float = Field(description="Fraction of GPU memory vLLM uses.")
    kv_cache_tokens: int = Field(description="Tokens the KV cache holds per replica.")
    max_concurrency: float = Field(description="Sequences of maxModelLen that fit in the KV cache at once.")
    memory: MemoryBreakdown = Field(description="Per-GPU memory budget.")
    download_gi_b: float = Field(
        default=0.0,
        alias="downloadGiB",
        description=(
            "GiB each pod downloads: the checkpoint as its files store it (torch_dtype or its pre-quantized "
            "format), which online quantization does not shrink; sizes the model cache and start-up probe."
        ),
    )
    price_per_hour: float = Field(
        default=0.0,
        description=(
            "What all replicas cost per hour (USD): each pod's share of its node's catalog price, or whole "
            "nodes (priceBasis says which)."
        ),
    )
    price_per_replica_per_hour: float | None = Field(
        default=None,
        description="With spec.autoscaling: what one replica costs per hour (USD), as pricePerHour counts.",
    )
    max_replicas: int | None = Field(
        default=None, description="spec.autoscaling.maxReplicas: the most replicas the autoscaler may run."
    )
    max_price_per_hour: float | None = Field(
        default=None,
        description="What maxReplicas replicas cost per hour (USD): the most the autoscaler may spend.",
    )
    price_basis: str = Field(
        default="",
        description=(
            "How one replica's price was found, e.g. \"$6.88/h: 1/8 of p5.48xlarge's $55.04/h (GPU share)\" "
            'or "whole node" and why.'
        ),
    )
    fallback_from: str = Field(default="", description="Cheaper GPU type that was absent or full, if any.")
    engine_version: str = Field(default="", description="vLLM version planned for.")
    enforce_eager: bool = Field(default=False, description="Whether the plan runs without CUDA graphs.")
    tuning: list[str] = Field(
        default_factory=list,
        description="The engine settings chosen to serve the concurrency on these GPUs, and why.",
    )
    node_shape: NodeShapeSummary | None = Field(
        default=None, description="The node shape the plan assumes and prices."
    )
    model_family: str = Field(
        default="", description="The model's architecture family (config.json's model_type)."
    )
    quantization: str = Field(default="", description="The vLLM quantization method planned for.")
    kv_reserve_gi_b: float = Field(
        default=0.0,
        alias="kvReserveGiB",
        description="GiB per GPU a learned correction holds back from the KV cache (negative: adds), "
        "counted in memory.nonTorchGiB (docs/observe.md).",
    )


class ObservedMemory(_Model):
    """What vLLM reported at start-up for the model's running engine, beside the plan's figures."""

    time: datetime = Field(description="When it was read.")
    pod: str = Field(default="", description="The pod whose log it was read from.")
    source: str = Field(default="", description="Where it was read: the pod's log through the API server.")
    plan_fingerprint: str = Field(
        default="", description="The plan it was observed under; a new plan is observed again."
    )
    vllm_version: str | None = Field(default=None, description="vLLM version the engine logged.")
    weights_gi_b: float | None = Field(default=None, alias="weightsGiB", description="Weights per GPU (GiB).")
    kv_cache_gi_b: float | None = Field(
        default=None, alias="kvCacheGiB", description="KV cache per GPU vLLM allocated (GiB)."
    )
    kv_cache_tokens: int | None = Field(default=None, description="KV cache tokens of the whole engine.")
    max_concurrency: float | None = Field(
        default=None, description="Sequences of maxModelLen that fit, by vLLM's figures."
    )
    planned_kv_cache_gi_b: float | None = Field(
        default=None, alias="plannedKvCacheGiB", description="The plan's KV cache per GPU (GiB)."
    )
    planned_kv_cache_tokens: int | None = Field(default=None, description="The plan's KV cache tokens.")
    planned_max_concurrency: float | None = Field(default=None, description="The plan's max concurrency.")
    kv_cache_error_percent: float | None = Field(
        default=None, description="(planned - observed) / observed KV cache GiB, in per cent."
    )


class MeasuredGpuMemory(_Model):
    """GPU memory the model's pods really hold, read from Prometheus, beside the plan's per-GPU budget."""

    gpus: int = Field(ge=0, description="GPUs on which the model's pods hold memory.")
    max_used_gi_b: float = Field(
        alias="maxUsedGiB", description="GiB held on the busiest of those GPUs (the one that runs out first)."
    )
    planned_gi_b: float = Field(
        alias="plannedGiB",
        description="What the plan expects one GPU to hold: weights, activation peak, non-torch, CUDA "
        "graphs and KV cache (status.plan.memory).",
    )
    drift_gi_b: float = Field(
        alias="driftGiB", description="maxUsedGiB - plannedGiB: above 0, the model holds more than planned."
    )
    time: datetime = Field(
        description="When this reading was taken. Readings within 0.5 GiB of it are not written (an idle "
        "model makes no writes); it is refreshed at least hourly while the figure is measured."
    )
    source: Literal["loadline-agent", "dcgm"] | None = Field(
        default=None,
        description="Where the figure comes from: loadline's GPU node agent (per container) or "
        "dcgm-exporter (the whole GPU).",
    )


class Incident(_Model):
    """One out-of-memory incident (a crash loop counts once, with a count)."""

    # Fields it does not know are kept (the CRD prunes those no version declares): status.incidents is a
    # list, which a write replaces whole, so an incident a newer loadline recorded (kept after a
    # rollback) is counted up with its newer fields instead of losing them. The other stanzas are
    # objects, whose merge patch keeps what it does not name.
    model_config = ConfigDict(extra="allow")

    time: datetime = Field(description="When the incident was first seen.")
    last_seen: datetime | None = Field(default=None, description="When it was last seen.")
    pod: str = Field(default="", description="Pod that crashed.")
    container: str = Field(default="", description="Container that crashed.")
    oom_class: OOMClass = Field(alias="class", description="Classification of the incident.")
    confidence: float = Field(default=0.0, ge=0, le=1, description="Classifier confidence 0..1.")
    evidence: list[str] = Field(default_factory=list, description="Why, in short sentences.")
    count: int = Field(default=1, ge=1, description="Crashes of the same loop.")
    action: str = Field(default="", description="What loadline did or recommends.")
    result: str = Field(default="", description="Outcome of the action.")
    loop: str = Field(
        default="", description="Crash-loop key (pod template and container) that groups restarts."
    )
    caller_side: bool = Field(default=False, description="Whether the likely cause is the callers' prompts.")


class Overrides(_Model):
    """Settings loadline's OOM remediation changed, applied on top of the spec when planning.

    Kept in status, not written into the spec, so GitOps tools that own the spec never fight the
    operator; a spec change by a person clears them (they are re-derived from new incidents).
    """

    max_num_seqs: int | None = Field(default=None, ge=1, description="--max-num-seqs in force.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="--max-num-batched-tokens in force."
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="--gpu-memory-utilization in force."
    )
    max_model_len: int | None = Field(default=None, ge=16, description="--max-model-len in force.")
    kv_offload_cpu_gi_b: float | None = Field(
        default=None, alias="kvOffloadCpuGiB", ge=0, description="CPU KV offload GiB in force."
    )
    memory_gi_b: float | None = Field(
        default=None, alias="memoryGiB", gt=0, description="Pod memory in force."
    )
    min_gpus_per_replica: int | None = Field(default=None, ge=1, description="Plan at least this many GPUs.")
    min_gpu_memory_gi_b: float | None = Field(
        default=None, alias="minGpuMemoryGiB", gt=0, description="Plan only GPUs with at least this memory."
    )


class AppliedChange(_Model):
    """One change remediation made."""

    time: datetime = Field(description="When it was applied.")
    oom_class: OOMClass = Field(alias="class", description="Incident class it answered.")
    field: str = Field(description="Setting changed, as INCIDENT.json names it.")
    old: str = Field(default="", description="Value before.")
    new: str = Field(default="", description="Value after.")


OutcomeResult = Literal["worked", "recurred"]


class RemediationTrial(_Model):
    """A remediation applied and not judged yet: did the same class come back within the horizon?"""

    oom_class: OOMClass = Field(alias="class", description="Incident class the fix answered.")
    action: str = Field(description="The fix applied (its action name).")
    applied_at: datetime = Field(description="When it was applied.")


class RemediationOutcome(_Model):
    """What became of one applied remediation."""

    oom_class: OOMClass = Field(alias="class", description="Incident class the fix answered.")
    action: str = Field(description="The fix applied (its action name).")
    result: OutcomeResult = Field(
        description="worked: no crash of the same class within the horizon; recurred: one came back."
    )
    applied_at: datetime = Field(description="When the fix was applied.")
    judged_at: datetime = Field(description="When the outcome was decided.")


class RemediationState(_Model):
    """Remediation bookkeeping that must survive an operator restart."""

    overrides: Overrides = Field(default_factory=Overrides, description="Settings changed by remediation.")
    held_overrides: Overrides | None = Field(
        default=None,
        description="The overrides the pods still run while the newer ones above wait for the model's "
        "restart window (status.maintenance); unset: the overrides above are rolled out.",
    )
    day: str = Field(default="", description="UTC day the counter below counts.")
    actions_today: int = Field(default=0, ge=0, description="Changes applied on that day.")
    history: list[AppliedChange] = Field(
        default_factory=list, max_length=50, description="Recent changes, newest last."
    )
    restart_requested_at: str = Field(
        default="", description="When a restart of the pods was requested (rolls the pod template)."
    )
    handled_crashes: list[str] = Field(
        default_factory=list, max_length=100, description="Crash ids already handled (no double action)."
    )
    observed_generation: int | None = Field(
        default=None, description="Spec generation the overrides apply to."
    )
    needs_person: str = Field(
        default="", description="Set when the daily budget is spent: what a person should look at."
    )
    revision: int = Field(
        default=0,
        ge=0,
        description="Moved by every write of this stanza (a crash's decision, a held remediation "
        "released): a decision's write tests it, so that it never overwrites another's.",
    )
    trials: list[RemediationTrial] = Field(
        default_factory=list, max_length=20, description="Applied fixes whose outcome is not judged yet."
    )
    outcomes: list[RemediationOutcome] = Field(
        default_factory=list, max_length=50, description="Judged fixes, newest last."
    )
    outcome_confidence: dict[str, float] = Field(
        default_factory=dict,
        description="Per incident class, the share of this model's judged fixes that worked: how often "
        "the diagnosis and its fix held here.",
    )


MaintenanceAction = Literal["restart", "remediation"]
MaintenanceState = Literal["Idle", "Scheduled", "WaitingForLock", "CoolingDown", "Running", "Done"]
MaintenanceTrigger = Literal["window", "policyWindow", "oomRisk", "crashLoop", "noWindow"]


class Maintenance(_Model):
    """A restart that rolls the model's pods (a fragmentation restart, or a remediation that changes
    the pod template), and when loadline does it: in the model's next low-traffic window, earlier when an
    out-of-memory crash is predicted before it, at once for a crash loop (docs/restarts.md)."""

    action: MaintenanceAction | None = Field(
        default=None,
        description="restart: the pods are restarted as they are (fragmentation); remediation: a changed "
        "pod template rolls them. Unset: nothing pending.",
    )
    state: MaintenanceState = Field(
        default="Idle",
        description="Idle (nothing pending), Scheduled, WaitingForLock (another governed model restarts; "
        "FleetPolicy maxConcurrent), CoolingDown (restarted too recently), Running or Done.",
    )
    trigger: MaintenanceTrigger | None = Field(
        default=None,
        description="Why this time: window (learned low-traffic window), policyWindow (a FleetPolicy "
        "window as written), oomRisk (a crash is predicted before the next window), crashLoop, noWindow.",
    )
    next_window_start: datetime | None = Field(
        default=None, description="Start of the window it is scheduled in."
    )
    next_window_end: datetime | None = Field(default=None, description="End of that window.")
    scheduled_at: datetime | None = Field(
        default=None,
        description="When the restart starts (kept across operator restarts: never moved twice).",
    )
    started_at: datetime | None = Field(
        default=None, description="When the running restart began: pods created before it are restarted."
    )
    last_restart_at: datetime | None = Field(
        default=None, description="When the last restart finished (the cool-down counts from it)."
    )
    reason: str = Field(default="", description="Why now or why then, in a sentence.")


class OOMRisk(_Model):
    """The estimated time to an out-of-memory crash and the evidence; the OOMRisk condition says it."""

    predicted_at: datetime | None = Field(
        default=None, description="When the deciding signal reaches its limit; unset: no crash predicted."
    )
    signal: str = Field(
        default="",
        description="The deciding signal: gpu_memory (used vs the GPU's total), prompt_tokens (the longest "
        "prompt vs the KV cache's tokens) or kv_cache_usage (vs full, while vLLM preempts).",
    )
    current: float | None = Field(default=None, description="The signal's robust current level.")
    limit: float | None = Field(default=None, description="Where it runs out.")
    slope_per_hour: float | None = Field(default=None, description="Theil–Sen slope per hour.")
    unit: str = Field(default="", description="Unit of current, limit and slope (GiB, tokens, fraction).")
    evidence: list[str] = Field(
        default_factory=list, max_length=10, description="One sentence per signal judged, the deciding first."
    )
    time: datetime | None = Field(default=None, description="When the estimate was made.")


class RenderState(_Model):
    """Which loadline version rendered the running children, and what this version would change in
    their pods if that differs (docs/upgrades.md). A change waits for the model's restart window, or an
    approval, unless it is urgent; the RenderOutdated condition says the same in a sentence."""

    rendered_by: str | None = Field(
        default=None,
        description="The loadline version that rendered the running workload (its "
        "loadline.dev/rendered-by annotation); unset: a loadline from before the stamp.",
    )
    fingerprint: str | None = Field(
        default=None, description="Fingerprint of the running pod templates, as that version rendered them."
    )
    pending_fingerprint: str | None = Field(
        default=None,
        description="Fingerprint of what this version renders, while it waits; approve it with "
        "kubectl annotate inferencemodel NAME upgrade.loadline.dev/approve=<this>.",
    )
    changes: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="What rolling would change in the pods, and why, one sentence each; empty: nothing "
        "waits.",
    )
    urgent: bool = Field(default=False, description="A waiting change fixes an out-of-memory class.")
    decision: str = Field(default="", description="When it rolls, in a sentence.")


class InferenceModelStatus(_Model):
    """What loadline observed and decided. Written by the operator only."""

    phase: Phase = Field(
        default="Pending", description="Pending, Planning, Deploying, Ready, Degraded or Failed."
    )
    message: str = Field(default="", description="Human-readable summary of the phase.")
    observed_generation: int | None = Field(default=None, description="Last spec generation acted on.")
    replicas: int | None = Field(
        default=None,
        ge=0,
        description="Pods of the model's workload (the scale subresource's status.replicas).",
    )
    selector: str | None = Field(
        default=None,
        description="Label selector of the model's pods (the scale subresource's, for an HPA).",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Planned, Deployed, Ready, PolicyCompliant, OOMRisk, KVCapacity, RenderOutdated.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    plan: PlanSummary | None = Field(default=None, description="The current plan.")
    incidents: list[Incident] = Field(
        default_factory=list, max_length=50, description="Recent out-of-memory incidents, newest last."
    )
    remediation: RemediationState | None = Field(default=None, description="Out-of-memory remediation state.")
    policies: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="FleetPolicies that govern this model, by precedence.",
    )
    violated_policies: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="FleetPolicies this model breaks (the PolicyCompliant condition says how and the fix).",
    )
    measured_gpu_memory: MeasuredGpuMemory | None = Field(
        default=None,
        description="Measured per-GPU memory beside the plan's budget, from loadline's node agent or "
        "dcgm-exporter through Prometheus (docs/agent.md); absent when nothing was measured.",
    )
    maintenance: Maintenance | None = Field(
        default=None,
        description="The pending or last restart of the pods and its schedule (docs/restarts.md).",
    )
    oom_risk: OOMRisk | None = Field(
        default=None, description="Estimated time to an out-of-memory crash, with the evidence."
    )
    observed: ObservedMemory | None = Field(
        default=None,
        description="What vLLM reported at start-up (weights, KV cache, max concurrency) beside the plan "
        "(docs/observe.md); absent until the running engine's log says it.",
    )
    render: RenderState | None = Field(
        default=None,
        description="The loadline version that rendered the running children and what a newer one would "
        "change (docs/upgrades.md).",
    )
    last_handled_configuration: str | None = Field(
        default=None,
        description="The spec, labels and annotations the operator last acted on, as JSON (its diff base: "
        "a change from it is what starts a reconcile). Kept in status so that it is written with the "
        "status, in one request.",
    )
    kopf: dict[str, Any] | None = Field(
        default=None,
        description="The operator framework's record of handlers in progress (retries, back-off): "
        "empty while none is.",
    )


class InferenceModel(_Model):
    """A model served by vLLM on GPUs, sized and kept out of out-of-memory trouble by loadline."""

    api_version: Literal["loadline.dev/v1alpha1"] = Field(
        default="loadline.dev/v1alpha1", description="API version."
    )
    kind: Literal["InferenceModel"] = Field(default="InferenceModel", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: InferenceModelSpec = Field(description="Desired state.")
    status: InferenceModelStatus | None = Field(default=None, description="Observed state.")
