"""Measured GPU memory beside the plan's budget: the figure ``status`` shows so a platform team sees
when plan and reality drift apart. Pure: query answers in, a status dict out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadline.traffic._parse import samples

__all__ = ["measured_gpu_memory"]

_SOURCES = ("loadline-agent", "dcgm")


def measured_gpu_memory(answers: Mapping[str, Any], planned_gib: float) -> dict[str, Any] | None:
    """``{"gpus", "maxUsedGiB", "plannedGiB", "driftGiB"[, "source"]}`` from
    :func:`gpu_memory_used_query` answers.

    ``answers`` maps each of the model's pods to the decoded answer for that pod; ``planned_gib`` is
    what the plan expects one GPU to hold (weights, activation peak, non-torch, CUDA graphs and KV
    cache). The busiest GPU is the one that runs out first, so the maximum is compared with the plan;
    ``driftGiB`` > 0 means the model holds more than planned; ``source`` (``loadline-agent`` or
    ``dcgm``) is the busiest GPU's, when the answers say. None when nothing was measured (no agent
    and no dcgm-exporter, or Prometheus unreachable): status then leaves the field out.
    """
    per_gpu: dict[str, tuple[float, str]] = {}
    for answer in answers.values():
        for labels, value in samples(answer):
            uuid = labels.get("uuid", "")
            if value > per_gpu.get(uuid, (-1.0, ""))[0]:
                per_gpu[uuid] = (value, labels.get("source", ""))
    if not per_gpu:
        return None
    busiest, source = max(per_gpu.values())
    measured: dict[str, Any] = {
        "gpus": len(per_gpu),
        "maxUsedGiB": round(busiest, 2),
        "plannedGiB": round(planned_gib, 2),
        "driftGiB": round(busiest - planned_gib, 2),
    }
    if source in _SOURCES:
        measured["source"] = source  # the busiest GPU's: loadline-agent or dcgm
    return measured
