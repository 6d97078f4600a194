"""INCIDENT.json at the boundary: pydantic checks it once and names the field at fault.

Unknown keys are refused (a typo such as ``kv_cache_usag`` would otherwise silently drop evidence),
except the annotation keys the test corpus carries (``source``, ``expected_class``, ``note``, ``split``,
``message_origin``, ``timing``, ``resolution``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadline.errors import SpecError
from loadline.oom._corpus import CORPUS_KEYS
from loadline.oom._model import Config, Incident, Metrics, Plan

__all__ = ["ANNOTATION_KEYS", "parse_incident"]

#: Keys a corpus file may carry besides the incident; ignored by the classifier.
ANNOTATION_KEYS = CORPUS_KEYS

_FIXES = {
    "kv_cache_usage": "give a fraction between 0 and 1 (0.97, not 97)",
    "gpu_memory_utilization": "give a fraction between 0 and 1, as vLLM's --gpu-memory-utilization takes it",
    "reason": "give the container's termination reason, e.g. OOMKilled or Error",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Metrics(_Strict):
    prompt_tokens_max: int | None = Field(default=None, ge=0)
    kv_cache_usage: float | None = Field(default=None, ge=0.0, le=1.0)
    requests_running: int | None = Field(default=None, ge=0)
    gpu_memory_growth_gib_per_hour: float | None = None
    prompt_tokens_recent: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    prompt_tokens_growing: bool | None = None
    preemptions: int | None = Field(default=None, ge=0)


class _Config(_Strict):
    max_model_len: int | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    tensor_parallel_size: int | None = Field(default=None, gt=0)
    dtype: str | None = None
    quantization: str | None = None
    memory_limit_bytes: int | None = Field(default=None, gt=0)
    kv_offload_cpu_gib: float | None = Field(default=None, ge=0.0)
    expandable_segments: bool | None = None


class _Plan(_Strict):
    weights_gib: float | None = Field(default=None, gt=0.0)
    gpu_memory_gib: float | None = Field(default=None, gt=0.0)
    kv_cache_tokens: int | None = Field(default=None, gt=0)
    quantization_allowed: bool | None = None


class _Incident(_Strict):
    reason: str = Field(min_length=1)
    exit_code: int | None = None
    message: str = ""
    log_tail: str = ""
    ever_ready: bool | None = None
    uptime_seconds: float | None = Field(default=None, ge=0.0)
    seconds_since_ready: float | None = Field(default=None, ge=0.0)
    phase: Literal["loading", "starting", "serving"] | None = None
    engine_version: str | None = None
    model: str | None = None
    metrics: _Metrics = Field(default_factory=_Metrics)
    config: _Config = Field(default_factory=_Config)
    plan: _Plan = Field(default_factory=_Plan)


def _spec_error(exc: ValidationError) -> SpecError:
    fields: list[str] = []
    problems: list[str] = []
    fixes: list[str] = []
    for err in exc.errors():
        path = "incident" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        fields.append(path)
        problem = err["msg"]
        if err["type"] == "extra_forbidden":
            problem = "is not an INCIDENT.json field"
        problems.append(f"{path} {problem}" if len(exc.errors()) > 1 else problem)
        last = str(err["loc"][-1]) if err["loc"] else ""
        if last in _FIXES:
            fixes.append(_FIXES[last])
        elif err["type"] == "extra_forbidden":
            fixes.append("remove it or check its spelling against docs/oom.md")
    fix = "; ".join(dict.fromkeys(fixes)) or "see docs/oom.md for the INCIDENT.json fields"
    return SpecError(", ".join(fields), "; ".join(problems), fix)


def parse_incident(data: Mapping[str, Any]) -> Incident:
    """Validate an INCIDENT.json mapping into an :class:`Incident`; bad input raises SpecError."""
    if not isinstance(data, Mapping):
        raise SpecError("incident", "must be a JSON object", 'write {"reason": "OOMKilled", ...}')
    payload = {k: v for k, v in data.items() if k not in ANNOTATION_KEYS}
    try:
        model = _Incident.model_validate(payload)
    except ValidationError as exc:
        raise _spec_error(exc) from None
    m, c, p = model.metrics, model.config, model.plan
    return Incident(
        reason=model.reason,
        exit_code=model.exit_code,
        message=model.message,
        log_tail=model.log_tail,
        ever_ready=model.ever_ready,
        uptime_seconds=model.uptime_seconds,
        seconds_since_ready=model.seconds_since_ready,
        phase=model.phase,
        engine_version=model.engine_version,
        model=model.model,
        metrics=Metrics(
            prompt_tokens_max=m.prompt_tokens_max,
            kv_cache_usage=m.kv_cache_usage,
            requests_running=m.requests_running,
            gpu_memory_growth_gib_per_hour=m.gpu_memory_growth_gib_per_hour,
            prompt_tokens_recent=tuple(m.prompt_tokens_recent),
            prompt_tokens_growing=m.prompt_tokens_growing,
            preemptions=m.preemptions,
        ),
        config=Config(**c.model_dump()),
        plan=Plan(**p.model_dump()),
    )
