"""The GPU product name as NVIDIA's GPU feature discovery writes it into ``nvidia.com/gpu.product``.

The agent labels its series with it, and ``loadline gpus --probe`` writes it into a catalog entry, so
that one string joins three things: the node label the planner counts free GPUs by, the catalog entry
that sizes the GPU, and the measured series of that GPU in Prometheus.
"""

from __future__ import annotations

import re

__all__ = ["gfd_product"]

_NOT_IN_A_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def gfd_product(driver_name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` → ``"NVIDIA-H100-80GB-HBM3"``: words joined by ``-``.

    GPU feature discovery joins the whitespace-separated words of NVML's device name with ``-``;
    anything a Kubernetes label value cannot hold becomes ``-`` too, and the value is cut to the
    63 characters a label value may have (trailing ``-._`` dropped, as a label value must end
    alphanumeric).
    """
    joined = "-".join(driver_name.split())
    return _NOT_IN_A_LABEL_VALUE.sub("-", joined)[:63].strip("-._")
