"""The GPU node agent: what each GPU and each vLLM process really holds, as Prometheus metrics.

``loadline agent`` runs on GPU nodes (the chart's DaemonSet, off by default). It reads NVML through
``nvidia-ml-py`` (:class:`NvmlSession`), places each compute process in its pod from the node's own
files (:class:`PodResolver`) and exports per-GPU and per-container memory (:class:`AgentCollector`;
names in :data:`METRIC_NAMES`, described in docs/agent.md). ``loadline gpus --probe`` turns the same
reading into a GPU catalog entry (:func:`catalog_entries`).

The operator reads the agent's series (or dcgm-exporter's) from Prometheus through
:mod:`loadline.traffic`; nothing here talks to the Kubernetes API.
"""

from loadline.agent._metrics import METRIC_NAMES, AgentCollector
from loadline.agent._nvml import (
    GPU,
    Failure,
    Memory,
    NodeReading,
    NvmlSession,
    NvmlUnavailableError,
    Process,
    error_name,
    load_pynvml,
    require_gpus,
)
from loadline.agent._pods import ContainerRef, Owner, PodResolver, parse_cgroup, parse_container_log_name
from loadline.agent._probe import catalog_entries, catalog_memory_gib
from loadline.agent._product import gfd_product
from loadline.agent._serve import AgentConfig, serve

__all__ = [
    "GPU",
    "METRIC_NAMES",
    "AgentCollector",
    "AgentConfig",
    "ContainerRef",
    "Failure",
    "Memory",
    "NodeReading",
    "NvmlSession",
    "NvmlUnavailableError",
    "Owner",
    "PodResolver",
    "Process",
    "catalog_entries",
    "catalog_memory_gib",
    "error_name",
    "gfd_product",
    "load_pynvml",
    "parse_cgroup",
    "parse_container_log_name",
    "require_gpus",
    "serve",
]
