"""``loadline gpus --probe``: a GPU catalog entry for the GPUs of this machine, as NVML describes them.

The entry has the bundled catalog's shape (``loadline/sizing/data/gpus.json``), so a user can add a GPU
type loadline does not ship by saving the output to a file and pointing ``LOADLINE_GPU_CATALOG`` at it
(or mounting it from a ConfigMap): no new release needed.
"""

from __future__ import annotations

import json
import socket
from collections import defaultdict
from functools import cache
from importlib import resources
from typing import Any

from loadline.agent._nvml import GPU, NodeReading
from loadline.units import GIB

__all__ = ["catalog_entries", "catalog_memory_gib"]


@cache
def _min_compute_capability() -> dict[str, float]:
    raw = json.loads(
        resources.files("loadline.agent").joinpath("data", "capabilities.json").read_text(encoding="utf-8")
    )
    return {key: float(value) for key, value in raw["min_compute_capability"].items()}


def catalog_memory_gib(gpu: GPU) -> float:
    """The catalog's ``memory_gib``: what CUDA reports as the GPU's total.

    That is NVML's total less the driver's reserve, which only the v2 memory call reports (an H100
    80GB: 79.65 GiB total, about 0.46 GiB reserved, 79.19 GiB as vLLM and torch print it). With v1
    only, NVML's total is the best there is; it overstates the usable memory by about half a GiB.
    """
    if gpu.memory is None:
        return 0.0
    usable = gpu.memory.total - (gpu.memory.reserved or 0)
    return round(usable / GIB, 2)


def _memory_source(gpu: GPU) -> str:
    return "v2 total - reserved" if gpu.memory and gpu.memory.version == 2 else "v1 total"


def catalog_entries(reading: NodeReading, host: str | None = None) -> list[dict[str, Any]]:
    """One entry per GPU product on this machine (``gpus_per_node``: how many of it the node has)."""
    by_product: dict[str, list[GPU]] = defaultdict(list)
    for gpu in reading.gpus:
        by_product[gpu.product or f"gpu-{gpu.index}"].append(gpu)
    thresholds = _min_compute_capability()
    host = host or socket.gethostname()
    entries = []
    for product, gpus in by_product.items():
        first = gpus[0]
        cc = float("{}.{}".format(*first.compute_capability)) if first.compute_capability else 0.0
        memory = min(catalog_memory_gib(g) for g in gpus)
        entries.append(
            {
                "name": product.removeprefix("NVIDIA-"),
                "product": product,
                "memory_gib": memory,
                "gpus_per_node": [len(gpus)],
                "multi_node": False,
                "interconnect": "nvlink" if any(g.nvlink for g in gpus) else "pcie",
                "compute_capability": cc,
                "bf16": cc >= thresholds["bf16"],
                "fp8": cc >= thresholds["fp8"],
                "flash_attention": cc >= thresholds["flash_attention"],
                "price_per_gpu_hour": 0.0,
                "instance_types": {},
                "source": (
                    f"loadline gpus --probe on {host}: NVML name {first.name!r},"
                    f" driver {reading.driver_version}, memory {_memory_source(first)};"
                    " set price_per_gpu_hour, instance_types and multi_node (RDMA fabric) by hand"
                ),
            }
        )
    return entries
