"""Reading a vLLM start-up log into an :class:`Observation`: what vLLM itself found it could hold.

vLLM prints the figures the planner estimates (weights, the KV cache's GiB and tokens, the concurrency
that fits) once at start-up, worded differently by version and engine (``data/startup.json`` lists the
wordings and the vLLM source that prints each). Multi-process engines prefix each line with the process
that wrote it (``(VllmWorker rank=1 pid=…)``, ``(Worker_TP1 pid=…)``, ``(EngineCore_DP0 pid=…)``); the
prefix is removed before reading, and kept to tell tensor/pipeline-parallel ranks apart.

With several ranks, the KV pool is sized by the rank with the least room (vLLM takes the minimum over
the workers), so the smallest KV figure is kept; the weights of the busiest rank are kept (the one that
runs out first). Pure: text in, a record out.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

from loadline.errors import SpecError

__all__ = ["Observation", "ObserveError", "observation_from_cache_config", "parse_startup_log"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: A start-up log's figures are in its first few thousand lines; more than this is not a start-up log.
MAX_LOG_BYTES = 64 * 1024 * 1024


class ObserveError(SpecError):
    """The text is not a vLLM start-up log loadline can read figures from."""


@dataclass(frozen=True)
class Observation:
    """What one vLLM engine reported at start-up. GiB figures are per GPU (of the rank that decides:
    least KV room, most weights); tokens and concurrency are the whole engine's."""

    version: str | None = None
    engine: str | None = None  # "v0" or "v1"
    model: str | None = None
    weights_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    kv_tokens_source: str | None = None  # "logged", or how they were worked out
    gpu_blocks: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens: int | None = None  # the tokens per request max_concurrency is for
    gpu_total_gib: float | None = None
    gpu_name: str | None = None  # as logged ("NVIDIA H100 80GB HBM3"), rarely
    gpu_type: str | None = None  # the catalog's name for it, or as the caller says (--gpu)
    ranks: int = 1
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != {}}

    def with_gpu(self, gpu_type: str) -> Observation:
        return replace(self, gpu_type=gpu_type)

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.settings.get("tensor_parallel_size", 1))

    @property
    def minor(self) -> str | None:
        """``"0.19"`` for ``"0.19.0"``: corrections are kept per vLLM minor release."""
        if not self.version:
            return None
        parts = re.match(r"(\d+)\.(\d+)", self.version)
        return f"{parts.group(1)}.{parts.group(2)}" if parts else None


@dataclass(frozen=True)
class _Tables:
    prefix: re.Pattern[str]
    rank: re.Pattern[str]
    figures: dict[str, tuple[tuple[re.Pattern[str], bool], ...]]
    settings: dict[str, tuple[re.Pattern[str], ...]]
    default_block_size: int


@cache
def _tables() -> _Tables:
    text = resources.files("loadline.observe").joinpath("data/startup.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    return _Tables(
        prefix=re.compile(raw["prefix"]),
        rank=re.compile(raw["rank"]),
        figures={
            name: tuple((re.compile(rx), unit == "unit") for rx, unit in rows)
            for name, rows in raw["figures"].items()
        },
        settings={
            name: tuple(re.compile(rx) for rx in rows)
            for name, rows in raw["settings"].items()
            if not name.startswith("_")
        },
        default_block_size=int(raw["default_block_size"]),
    )


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _setting(name: str, text: str) -> Any:
    if name in {"enforce_eager"}:
        return text == "True"
    if name == "gpu_memory_utilization":
        return float(text)
    if re.fullmatch(r"\d+", text):
        return int(text)
    return text


@dataclass
class _Reading:
    """Figures as lines give them; ``per_rank`` holds the per-GPU ones by the rank that logged them."""

    found: dict[str, tuple[str, ...]] = field(default_factory=dict)
    per_rank: dict[str, dict[str, float]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    ranks: set[str] = field(default_factory=set)


_PER_GPU = ("weights", "kv_cache")


def _read_line(line: str, tables: _Tables, reading: _Reading) -> None:
    who = ""
    m = tables.prefix.match(line)
    if m:
        who = m.group("who")
        line = line[m.end() :]
        r = tables.rank.search(who)
        if r:
            reading.ranks.add(next(g for g in r.groups() if g is not None))
    for name, readings in tables.figures.items():
        for pattern, unit in readings:
            found = pattern.search(line)
            if found is None:
                continue
            groups = tuple(g for g in found.groups())
            if unit:  # GB as vLLM prints it is GiB (see data/startup.json); only the number is kept
                groups = groups[:1]
            if name in _PER_GPU:
                reading.per_rank.setdefault(name, {})[who] = _number(groups[0])
            reading.found[name] = groups
            break
    for name, patterns in tables.settings.items():
        for pattern in patterns:
            found = pattern.search(line)
            if found:
                reading.settings[name] = _setting(name, found.group(1))
                break


def parse_startup_log(text: str, *, source: str = "LOGFILE") -> Observation:
    """The :class:`Observation` of a vLLM start-up log. Raises :class:`ObserveError` (one line naming
    the problem and the fix) when the text holds none of vLLM's start-up figures."""
    if "\x00" in text[:4096]:
        raise ObserveError(
            source, "is binary, not a log", "pass the text of the vLLM server's log (kubectl logs POD)"
        )
    tables = _tables()
    reading = _Reading()
    for raw_line in _ANSI.sub("", text).splitlines():
        if len(raw_line) > 20000:  # a config dump, never a figure line; spare the regexes
            raw_line = raw_line[:20000]
        _read_line(raw_line, tables, reading)
    found = reading.found
    if not any(
        name in found for name in ("weights", "kv_cache", "kv_tokens", "gpu_blocks", "max_concurrency")
    ):
        raise ObserveError(
            source,
            "holds none of vLLM's start-up figures (no 'Model loading took', 'Available KV cache memory', "
            "'GPU KV cache size' or 'Maximum concurrency' line)",
            "pass the log of a vLLM server from its start, through the line 'Maximum concurrency for …' "
            "(kubectl logs POD, or --previous for a container that restarted)",
        )
    return _observation(reading, tables)


def logged_weights_gib(text: str) -> float | None:
    """The weights one GPU held, as vLLM logged them ("Model loading took 13.31 GiB"; the busiest rank
    when several logged), or None when the text has no such line. Unlike :func:`parse_startup_log`, a
    text without it is no error: a crash report quotes what it quotes."""
    tables = _tables()
    reading = _Reading()
    for raw_line in _ANSI.sub("", text).splitlines():
        if "weight" in raw_line.lower() or "loading took" in raw_line.lower():
            _read_line(raw_line[:20000], tables, reading)
    ranks = reading.per_rank.get("weights")
    return max(ranks.values()) if ranks else None


def _observation(reading: _Reading, tables: _Tables) -> Observation:
    found, settings = reading.found, dict(reading.settings)
    weights = max(reading.per_rank["weights"].values()) if "weights" in reading.per_rank else None
    kv_gib = min(reading.per_rank["kv_cache"].values()) if "kv_cache" in reading.per_rank else None
    blocks = int(_number(found["gpu_blocks"][0])) if "gpu_blocks" in found else None
    concurrency = tokens_per_request = None
    if "max_concurrency" in found:
        tokens_per_request = int(_number(found["max_concurrency"][0]))
        concurrency = _number(found["max_concurrency"][1])
    kv_tokens: int | None = None
    kv_source: str | None = None
    if "kv_tokens" in found:
        kv_tokens, kv_source = int(_number(found["kv_tokens"][0])), "logged"
    elif blocks is not None:
        size = int(settings.get("block_size") or tables.default_block_size)
        kv_tokens, kv_source = blocks * size, f"{blocks} GPU blocks x block size {size}"
    engine = found["engine"][0].lower() if "engine" in found else None
    if engine is None:
        # "GPU KV cache size: N tokens" is V1's wording only (vLLM PR #13596).
        engine = "v1" if "kv_tokens" in found else None
    if "max_model_len" not in settings and tokens_per_request is not None:
        settings["max_model_len"] = tokens_per_request
    ranks = max(len(reading.ranks), 1)
    gpu_name = found["gpu_name"][0].strip() if "gpu_name" in found else None
    return Observation(
        version=found["version"][0] if "version" in found else None,
        engine=engine,
        model=settings.pop("model", None),
        weights_gib=weights,
        kv_cache_gib=kv_gib,
        kv_cache_tokens=kv_tokens,
        kv_tokens_source=kv_source,
        gpu_blocks=blocks,
        max_concurrency=concurrency,
        concurrency_tokens=tokens_per_request,
        gpu_total_gib=_number(found["total_gpu_memory"][0]) if "total_gpu_memory" in found else None,
        gpu_name=gpu_name,
        gpu_type=_catalog_gpu(gpu_name),
        ranks=ranks,
        settings=settings,
    )


def _catalog_gpu(logged: str | None) -> str | None:
    """The catalog name of a GPU as torch or nvidia-smi names it ("NVIDIA H100 80GB HBM3" is the node
    label product "NVIDIA-H100-80GB-HBM3"), or None when the catalog does not know it."""
    if not logged:
        return None
    from loadline.sizing import find_gpu

    try:
        return find_gpu(logged.replace(" ", "-")).name
    except SpecError:
        return None


def observation_from_cache_config(engines: Sequence[Mapping[str, str]]) -> Observation | None:
    """An :class:`Observation` of vLLM's ``vllm:cache_config_info`` labels (one mapping per engine of
    the pod), or None when no engine has sized its KV cache yet. The metric gives blocks, not GiB:
    tokens are ``num_gpu_blocks x block_size`` of the engine with the fewest (the pool that fills first)."""
    sized = []
    for labels in engines:
        try:
            blocks, size = int(labels.get("num_gpu_blocks", "")), int(labels.get("block_size", ""))
        except ValueError:
            continue  # "None" until the engine has sized its cache
        if blocks > 0 and size > 0:
            sized.append((blocks * size, blocks, labels))
    if not sized:
        return None
    tokens, blocks, labels = min(sized, key=lambda s: s[0])
    settings: dict[str, Any] = {"block_size": int(labels["block_size"])}
    if labels.get("cache_dtype"):
        settings["kv_cache_dtype"] = labels["cache_dtype"]
    with contextlib.suppress(ValueError):  # absent or not a number: not said
        settings["gpu_memory_utilization"] = float(labels.get("gpu_memory_utilization", ""))
    return Observation(
        kv_cache_tokens=tokens,
        kv_tokens_source=f"vllm:cache_config_info: {blocks} GPU blocks x block size {settings['block_size']}",
        gpu_blocks=blocks,
        settings=settings,
    )
