"""Learned corrections: what the fleet's vLLM engines reported, turned into a bounded correction of the
planner's KV budget for later models of the same kind.

Observations are kept per architecture family × GPU type × vLLM minor × quantization (the things that
decide what the planner's model misses: the family's kernels and activation shapes, the GPU's driver
and runtime overhead, the release's profiler, the quantization kernels), at most ``MAX_PER_KEY``
newest per key. The correction of a key is the median shortfall, planned minus observed KV GiB per
GPU, over its records: vLLM sizes the KV pool last, from what is left after weights, activations,
non-torch memory and CUDA graphs, so a shortfall is memory the budget did not count, and it is held
back as such (beside non-torch memory) in every budget the planner tries on that GPU type. The median
keeps one odd record (a pod started with other settings) from steering it.

Bound: a correction may make the KV pool smaller without limit (a plan only gets safer, if dearer),
but larger than the uncorrected plan's by at most ``MAX_CREDIT`` (2 %) of the observed pools. Why 2 %:
it is the planner's accuracy goal, the error the uncorrected plan is already taken to carry; an
engine that finds 2 % fewer KV blocks than the plan counted preempts and recomputes sequences at peak
concurrency, it does not crash (KV blocks are allocated up front, at start-up). A larger credit would
rest on the observations alone, and one engine started with more memory free than the next will have
is not evidence enough to promise more concurrency.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import yaml
from pydantic import ValidationError

from loadline.api._load import validate_known
from loadline.api._observed import (
    MAX_RECORDS,
    OBSERVATIONS_KEY,
    ObservationRecord,
    ObservationStore,
)
from loadline.errors import SpecError
from loadline.observe._parse import Observation

__all__ = [
    "MAX_CREDIT",
    "MAX_PER_KEY",
    "CorrectionStore",
    "load_store",
    "minor_of",
    "mismatches",
    "record_of",
]

#: Newest records kept per key: enough for a stable median, few enough that a driver or image upgrade
#: (same vLLM minor) replaces the old figures within a few restarts.
MAX_PER_KEY = 10
#: The most a correction may add to the KV pool, as a share of the observed pools (see the docstring).
MAX_CREDIT = 0.02


def minor_of(version: str) -> str:
    """``"0.19"`` of ``"0.19.0"`` (or of ``"0.19.1rc1"``)."""
    parts = version.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else version


def record_of(
    obs: Observation,
    *,
    family: str,
    gpu_type: str,
    quantization: str,
    version: str,
    planned_kv_gib: float,
    model: str = "",
    source: str,
    time: datetime | None = None,
) -> ObservationRecord:
    """A store record of what vLLM reported (``obs``) beside what the plan it ran expected. Raises
    :class:`SpecError` when the log gave no KV figure to learn from."""
    if obs.kv_cache_gib is None:
        raise SpecError(
            "observation",
            "vLLM's log holds no KV cache GiB ('Available KV cache memory' or its V0 wording) to learn from",
            "pass the log from the server's start, through its KV cache lines",
        )
    return ObservationRecord(
        family=family,
        gpu_type=gpu_type,
        vllm_minor=minor_of(obs.version or version),
        quantization=quantization,
        model=model or obs.model or "",
        tensor_parallel_size=obs.tensor_parallel_size,
        planned_kv_cache_gi_b=round(planned_kv_gib, 4),
        observed_kv_cache_gi_b=obs.kv_cache_gib,
        observed_kv_cache_tokens=obs.kv_cache_tokens,
        observed_max_concurrency=obs.max_concurrency,
        source=source,
        time=time,
    )


def mismatches(obs: Observation, planned: Mapping[str, Any]) -> list[str]:
    """The settings the server logged that differ from those of the plan it is compared with
    (``planned``: vLLM's names → the plan's values, and ``version``). A KV figure is only comparable
    with a budget of the same settings: another utilization, layout or release sizes another pool."""
    logged: dict[str, Any] = dict(obs.settings)
    if obs.version:
        logged["version"] = minor_of(obs.version)
        planned = {**planned, "version": minor_of(str(planned.get("version", "")))}
    found = []
    for name, value in logged.items():
        want = planned.get(name)
        if want is None:
            continue
        same = abs(float(value) - float(want)) < 1e-6 if isinstance(value, float) else value == want
        if not same:
            found.append(f"{name} {value} (the plan: {want})")
    return found


@dataclass(frozen=True)
class CorrectionStore:
    """The bounded record of observations and the corrections they give (a :class:`KvCorrections` for
    :func:`loadline.sizing.plan_inference_model`)."""

    records: tuple[ObservationRecord, ...] = ()

    @classmethod
    def of(cls, records: Iterable[ObservationRecord]) -> CorrectionStore:
        """The store of ``records`` (oldest first), trimmed to its bounds: the newest ``MAX_PER_KEY``
        per key and ``MAX_RECORDS`` in all."""
        kept: list[ObservationRecord] = []
        per_key: dict[tuple[str, str, str, str], int] = {}
        for record in reversed(list(records)):
            if per_key.get(record.key, 0) >= MAX_PER_KEY or len(kept) >= MAX_RECORDS:
                continue
            per_key[record.key] = per_key.get(record.key, 0) + 1
            kept.append(record)
        return cls(tuple(reversed(kept)))

    def add(self, record: ObservationRecord) -> CorrectionStore:
        return CorrectionStore.of([*self.records, record])

    def matching(self, family: str, gpu_type: str, minor: str, quantization: str) -> list[ObservationRecord]:
        key = (family, gpu_type, minor, quantization)
        return [r for r in self.records if r.key == key]

    def reserve(self, records: Sequence[ObservationRecord]) -> float:
        """GiB per GPU to hold back from the KV cache for ``records`` of one key (negative: to give it,
        at most ``MAX_CREDIT`` of the observed pools)."""
        shortfall = statistics.median(r.shortfall_gi_b for r in records)
        floor = -MAX_CREDIT * statistics.median(r.observed_kv_cache_gi_b for r in records)
        return max(shortfall, floor)

    def reserves(self, family: str, quantization: str, version: str) -> list[tuple[str, float, str]]:
        """Per GPU type with records of this family, quantization and vLLM minor: (type, GiB per GPU
        held back, the plan's note)."""
        minor = minor_of(version)
        by_gpu: dict[str, list[ObservationRecord]] = {}
        for record in self.records:
            if record.key[0] == family and record.key[2] == minor and record.key[3] == quantization:
                by_gpu.setdefault(record.gpu_type, []).append(record)
        found = []
        for gpu, records in sorted(by_gpu.items()):
            gib = self.reserve(records)
            found.append((gpu, gib, _note(records, gib)))
        return found

    def to_store(self) -> ObservationStore:
        return ObservationStore(observations=list(self.records))

    def to_json(self) -> str:
        return self.to_store().model_dump_json(by_alias=True, exclude_none=True, indent=2) + "\n"


def _note(records: Sequence[ObservationRecord], gib: float) -> str:
    first = records[0]
    planned = statistics.median(r.planned_kv_cache_gi_b for r in records)
    share = gib / planned if planned else 0.0
    what = (
        f"{abs(gib):.2f} GiB per GPU held back ({share:.1%} of the KV cache)"
        if gib >= 0
        else f"{abs(gib):.2f} GiB per GPU added ({-share:.1%}; at most {MAX_CREDIT:.0%} of vLLM's figure)"
    )
    models = sorted({r.model for r in records if r.model})
    seen = f" ({', '.join(models[:3])}{', …' if len(models) > 3 else ''})" if models else ""
    return (
        f"KV budget corrected by {len(records)} observation{'s' if len(records) != 1 else ''} of "
        f"{first.family} on {first.gpu_type}, vLLM {first.vllm_minor}, quantization {first.quantization}"
        f"{seen}: {what}"
    )


def load_store(text: str, source: str) -> CorrectionStore:
    """A store from its JSON, or from the YAML of the ConfigMap that holds it. Raises
    :class:`SpecError` naming ``source`` and the problem."""
    fix = (
        f"pass an ObservationStore (JSON, as 'loadline observe --add-to' writes it) or the ConfigMap "
        f"that holds one under {OBSERVATIONS_KEY}"
    )
    try:
        doc: Any = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise SpecError(source, f"is not JSON or YAML ({str(exc).splitlines()[0]})", fix) from None
    if isinstance(doc, Mapping) and doc.get("kind") == "ConfigMap":
        inner = (doc.get("data") or {}).get(OBSERVATIONS_KEY)
        if inner is None:
            raise SpecError(source, f"is a ConfigMap without the key {OBSERVATIONS_KEY}", fix)
        try:
            doc = json.loads(inner)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{source}: data.{OBSERVATIONS_KEY}", f"is not JSON ({exc.msg})", fix) from None
    if doc == {}:
        return CorrectionStore()
    try:
        store = validate_known(ObservationStore, doc)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise SpecError(f"{source}: {where}" if where else source, error["msg"], fix) from None
    return CorrectionStore.of(store.observations)
