"""What the operator observes about a crashed vLLM container, as an INCIDENT.json-shaped dict.

Pure: it reads a Pod (as the API returns it), the owning InferenceModel and optionally the previous
container log, and returns the same structure ``loadline classify`` reads from a file, so the CLI and
the operator classify identically.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity as _untyped_parse_quantity

from loadline.api import InferenceModelStatus
from loadline.status.read import read_status

_parse_quantity: Callable[[str], Decimal] = _untyped_parse_quantity  # the client ships no types


def quantity_bytes(value: Any) -> int | None:
    """Kubernetes memory quantity ("22Gi", "512M", "1e9") in bytes, None when it is not one."""
    if value is None:
        return None
    try:
        return int(_parse_quantity(str(value).strip()))
    except ValueError:
        return None


def parse_timestamp(text: Any) -> datetime | None:
    """A Kubernetes timestamp (``2026-11-28T08:00:00Z``) as an aware datetime; None when absent or not
    one (a status written by hand)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def terminated_state(container_status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's most recent termination (current state if terminated, else its last state)."""
    for key in ("state", "lastState"):
        term = (container_status.get(key) or {}).get("terminated")
        if term:
            return dict(term)
    return None


def crash_id(pod: Mapping[str, Any], container_status: Mapping[str, Any]) -> str | None:
    """A stable id of one termination: the same crash seen twice (or after a restart) has the same id."""
    term = terminated_state(container_status)
    if term is None:
        return None
    uid = pod.get("metadata", {}).get("uid", "")
    finished = term.get("finishedAt") or term.get("startedAt") or ""
    return f"{uid}/{container_status.get('name', '')}/{container_status.get('restartCount', 0)}/{finished}"


def loop_key(pod: Mapping[str, Any], container_name: str) -> str:
    """Restarts of one crash loop share this key: the pod template's hash (or pod name) and container."""
    labels = pod.get("metadata", {}).get("labels") or {}
    template = (
        labels.get("pod-template-hash") or labels.get("controller-revision-hash") or pod["metadata"]["name"]
    )
    return f"{template}/{container_name}"


def _container_spec(pod: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for container in pod.get("spec", {}).get("containers", []) or []:
        if container.get("name") == name:
            return dict(container)
    return {}


def startup_budget_seconds(container: Mapping[str, Any]) -> float | None:
    """How long the kubelet lets the container start before its startup probe kills it."""
    probe = container.get("startupProbe")
    if not isinstance(probe, Mapping):
        return None
    period = float(probe.get("periodSeconds", 10) or 10)
    return float(probe.get("initialDelaySeconds", 0) or 0) + period * float(
        probe.get("failureThreshold", 3) or 3
    )


def _readiness(
    container: Mapping[str, Any],
    model_status: InferenceModelStatus,
    started: datetime | None,
    finished: datetime | None,
    uptime: float | None,
) -> tuple[bool | None, float | None]:
    """(ever_ready, seconds_since_ready) of the crashed container instance, when we can tell.

    The InferenceModel turning Ready while this instance ran says it was Ready; an instance that lived
    longer than its startup probe allows must have passed the probe (vLLM's /health), so it was up.
    """
    for cond in model_status.conditions:
        if cond.type == "Ready" and cond.status == "True":
            when = cond.last_transition_time
            if when and started and finished and started < when <= finished:
                return True, (finished - when).total_seconds()
    budget = startup_budget_seconds(container)
    if uptime is not None and budget is not None and uptime > budget:
        return True, None
    return None, None


def build_incident(
    pod: Mapping[str, Any],
    container_status: Mapping[str, Any],
    model: Mapping[str, Any],
    *,
    log_tail: str = "",
) -> dict[str, Any] | None:
    """INCIDENT.json for the container's last termination, or None when it has not terminated."""
    term = terminated_state(container_status)
    if term is None:
        return None
    name = str(container_status.get("name", ""))
    container = _container_spec(pod, name)
    started, finished = parse_timestamp(term.get("startedAt")), parse_timestamp(term.get("finishedAt"))
    status = read_status(model)
    plan = status.plan
    spec = model.get("spec") or {}
    env = {
        e.get("name"): str(e.get("value", ""))
        for e in container.get("env", []) or []
        if isinstance(e, Mapping)
    }
    alloc = env.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + env.get("PYTORCH_ALLOC_CONF", "")
    limits = (container.get("resources") or {}).get("limits") or {}
    offload = None if status.remediation is None else status.remediation.overrides.kv_offload_cpu_gi_b
    if offload is None:
        offload = (spec.get("kvOffload") or {}).get("cpuGiB")
    uptime = (finished - started).total_seconds() if started and finished else None
    ever_ready, since_ready = _readiness(container, status, started, finished, uptime)
    incident: dict[str, Any] = {
        "reason": str(term.get("reason") or "Error"),
        "exit_code": term.get("exitCode"),
        "message": str(term.get("message") or ""),
        "log_tail": log_tail,
        "uptime_seconds": uptime,
        "ever_ready": ever_ready,
        "seconds_since_ready": since_ready,
        "engine_version": (plan.engine_version or None) if plan else None,
        "model": str((spec.get("model") or {}).get("name") or "") or None,
        "config": {
            "max_model_len": plan.max_model_len if plan else None,
            "max_num_seqs": plan.max_num_seqs if plan else None,
            "max_num_batched_tokens": plan.max_num_batched_tokens if plan else None,
            "gpu_memory_utilization": plan.gpu_memory_utilization if plan else None,
            "tensor_parallel_size": plan.tensor_parallel_size if plan else None,
            # "none" is vLLM's default: the checkpoint's own quantization_config, which the plan knows.
            "quantization": None if spec.get("quantization") in {None, "", "none"} else spec["quantization"],
            "memory_limit_bytes": quantity_bytes(limits.get("memory")),
            "kv_offload_cpu_gib": offload,
            "expandable_segments": "expandable_segments:true" in alloc.lower(),
        },
        "plan": {
            "weights_gib": round(plan.memory.weights_gi_b * plan.gpus_per_replica, 3) if plan else None,
            "gpu_memory_gib": plan.memory.total_gi_b if plan else None,
            "kv_cache_tokens": plan.kv_cache_tokens if plan else None,
            "quantization_allowed": False,
        },
    }
    cleaned: dict[str, Any] = _drop_none(incident)
    return cleaned


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value
