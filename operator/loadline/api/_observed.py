"""The fleet's observations of vLLM's KV cache, as the operator keeps them and ``loadline plan
--observations FILE`` reads them.

Format: a ConfigMap (``OBSERVATIONS_CONFIGMAP`` in the operator's namespace) whose key
``OBSERVATIONS_KEY`` holds one :class:`ObservationStore` as JSON; the same JSON (or the ConfigMap's
YAML) is the file the command line takes.

A ConfigMap rather than a CRD: the records are the operator's own memory, written by it alone, read
by people (``kubectl get configmap loadline-observations -o jsonpath='{.data.observations\\.json}'``)
and by GitOps pipelines as a file; a CRD would add a cluster-wide type to install, upgrade and grant
for no field the API server needs to select or validate. The store is bounded (records per key and in
all, see :mod:`loadline.observe`) far below a ConfigMap's 1 MiB.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from loadline.api._v1alpha1 import _Model

OBSERVATIONS_CONFIGMAP = "loadline-observations"
OBSERVATIONS_KEY = "observations.json"
OBSERVATIONS_KIND = "ObservationStore"
#: Records the store holds in all (newest kept); with ~400 bytes each, well inside a ConfigMap.
MAX_RECORDS = 1000


class ObservationRecord(_Model):
    """What vLLM reported for one running model beside what the plan expected, with its provenance."""

    family: str = Field(description="Architecture family: config.json's model_type (llama, qwen2, …).")
    gpu_type: str = Field(description="GPU catalog name the engine ran on.")
    vllm_minor: str = Field(pattern=r"^\d+\.\d+$", description="vLLM minor release, e.g. '0.19'.")
    quantization: str = Field(description="vLLM quantization method ('none' for full precision).")
    model: str = Field(default="", description="The model id the engine served.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="Tensor-parallel size it ran with.")
    planned_kv_cache_gi_b: float = Field(
        alias="plannedKvCacheGiB", gt=0, description="KV cache per GPU the uncorrected plan expected."
    )
    observed_kv_cache_gi_b: float = Field(
        alias="observedKvCacheGiB", ge=0, description="KV cache per GPU vLLM reported at start-up."
    )
    observed_kv_cache_tokens: int | None = Field(
        default=None, ge=0, description="KV cache tokens vLLM reported (whole engine)."
    )
    observed_max_concurrency: float | None = Field(
        default=None, ge=0, description="Sequences of max-model-len vLLM said fit at once."
    )
    source: str = Field(
        description="Where the figures come from: 'pod NAMESPACE/NAME log', 'prometheus', a file or a URL."
    )
    time: datetime | None = Field(default=None, description="When it was observed.")

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.family, self.gpu_type, self.vllm_minor, self.quantization)

    @property
    def shortfall_gi_b(self) -> float:
        """GiB per GPU vLLM gave the KV cache less than planned (negative: more)."""
        return self.planned_kv_cache_gi_b - self.observed_kv_cache_gi_b


class ObservationStore(_Model):
    """All observations the fleet keeps, oldest first."""

    api_version: Literal["loadline.dev/v1alpha1"] = Field(
        default="loadline.dev/v1alpha1", description="API version."
    )
    kind: Literal["ObservationStore"] = Field(default="ObservationStore", description="Kind.")
    observations: list[ObservationRecord] = Field(
        default_factory=list, max_length=MAX_RECORDS, description="The records, oldest first."
    )
