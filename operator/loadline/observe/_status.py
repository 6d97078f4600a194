"""What an observation means for a running model: ``status.observed`` beside the plan, and whether
the concurrency the spec asks for fits in what vLLM really got.

Pure: the operator reads the pod's log and hands the text in; these functions say what to write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadline.observe._parse import Observation

__all__ = [
    "CAPACITY_CONDITION",
    "capacity_condition",
    "observed_concurrency",
    "observed_status",
    "plan_fingerprint",
    "uncorrected_kv_gib",
]

#: The condition that compares what vLLM got with ``spec.concurrency``.
CAPACITY_CONDITION = "KVCapacity"


def plan_fingerprint(plan: Mapping[str, Any] | None) -> str:
    """What identifies the engine a plan starts: an observation is of the plan it was made under, and a
    new plan (another layout, release or setting) is observed again."""
    if not plan:
        return ""
    keys = (
        "gpu",
        "engineVersion",
        "maxModelLen",
        "maxNumSeqs",
        "maxNumBatchedTokens",
        "gpuMemoryUtilization",
    )
    return "/".join(str(plan.get(k, "")) for k in keys)


def observed_concurrency(obs: Observation, max_model_len: int) -> float | None:
    """Sequences of ``max_model_len`` that fit in what vLLM got: its own "Maximum concurrency" figure
    when it is for that length, else its KV tokens over the length."""
    if obs.max_concurrency is not None and obs.concurrency_tokens == max_model_len:
        return obs.max_concurrency
    if obs.kv_cache_tokens is not None and max_model_len > 0:
        return round(obs.kv_cache_tokens / max_model_len, 2)
    return None


def uncorrected_kv_gib(plan: Mapping[str, Any]) -> float | None:
    """The plan's KV cache per GPU before any learned correction (what the store compares with)."""
    memory = plan.get("memory") or {}
    kv = memory.get("kvCacheGiB")
    if kv is None:
        return None
    return round(float(kv) + float(plan.get("kvReserveGiB") or 0.0), 4)


def observed_status(
    obs: Observation, plan: Mapping[str, Any], *, pod: str, source: str, now: str
) -> dict[str, Any]:
    """``status.observed`` (camelCase, as :class:`loadline.api.ObservedMemory`)."""
    memory = plan.get("memory") or {}
    planned_kv = memory.get("kvCacheGiB")
    max_model_len = int(plan.get("maxModelLen") or 0)
    out: dict[str, Any] = {
        "time": now,
        "pod": pod,
        "source": source,
        "planFingerprint": plan_fingerprint(plan),
        "vllmVersion": obs.version,
        "weightsGiB": obs.weights_gib,
        "kvCacheGiB": obs.kv_cache_gib,
        "kvCacheTokens": obs.kv_cache_tokens,
        "maxConcurrency": observed_concurrency(obs, max_model_len),
        "plannedKvCacheGiB": planned_kv,
        "plannedKvCacheTokens": plan.get("kvCacheTokens"),
        "plannedMaxConcurrency": plan.get("maxConcurrency"),
    }
    if obs.kv_cache_gib is not None and planned_kv:
        out["kvCacheErrorPercent"] = round((float(planned_kv) - obs.kv_cache_gib) / obs.kv_cache_gib * 100, 2)
    return {k: v for k, v in out.items() if v is not None}


def capacity_condition(observed: Mapping[str, Any], concurrency: int) -> tuple[bool, str, str] | None:
    """The :data:`CAPACITY_CONDITION` (ok, reason, message) for a model that must serve ``concurrency``
    sequences, or None when vLLM's figures do not say (no concurrency could be read)."""
    got = observed.get("maxConcurrency")
    if got is None:
        return None
    if float(got) >= concurrency:
        return (
            True,
            "Observed",
            f"vLLM reported room for {got} sequences of maxModelLen; the spec asks {concurrency}",
        )
    return (
        False,
        "BelowSpec",
        f"vLLM reported room for only {got} sequences of maxModelLen (KV cache {observed.get('kvCacheGiB')} "
        f"GiB per GPU, the plan counted {observed.get('plannedKvCacheGiB')}); the spec asks {concurrency}: "
        "re-planned with the observation",
    )
