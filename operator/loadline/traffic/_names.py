"""Which vLLM and DCGM metric names to query, as data (vLLM's in ``data/vllm_metrics.json``).

vLLM renamed its KV-cache gauge once. The history, from vLLM's own pull requests:

* ``vllm:gpu_cache_usage_perc`` is the only name up to 0.9.1 (V0 engine and early V1).
* 0.9.2 (vllm-project/vllm#18354) added ``vllm:kv_cache_usage_perc`` to the V1 engine and deprecated
  the old name; the V0 engine (still selectable with ``VLLM_USE_V1=0`` until 0.10) kept only the old one.
* 0.11 hides the old name (it comes back with ``--show-hidden-metrics-for-version=0.10``,
  vllm-project/vllm#24245); 0.12 removes it (vllm-project/vllm#29330).

Both are fractions 0..1 despite the ``_perc`` suffix. Inside the overlap (0.9.2 up to 0.12) and for an
unknown version the query asks for the preferred name and falls back to the other one with PromQL
``or``, so a pod whose engine or flags differ from what its version suggests still answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from loadline.versions import parse_release, release_of_image

__all__ = [
    "AGENT_CONTAINER_MEMORY_USED",
    "CACHE_CONFIG_INFO",
    "DCGM_FB_USED",
    "KV_CACHE_USAGE_NAMES",
    "PREEMPTIONS",
    "PROMPT_TOKENS_HISTOGRAM",
    "REQUESTS_RUNNING",
    "REQUESTS_WAITING_NAMES",
    "SIGNALS",
    "MetricName",
    "kv_cache_usage_names",
    "parse_version",
    "signal_names",
]

Version = tuple[int, int, int]


@dataclass(frozen=True)
class MetricName:
    """A metric name and the engine versions that export it: ``since <= version < until``."""

    name: str
    since: Version | None = None
    until: Version | None = None

    def exported_by(self, version: Version) -> bool:
        if self.since is not None and version < self.since:
            return False
        return not (self.until is not None and version >= self.until)


_TABLE = json.loads(
    resources.files("loadline.traffic").joinpath("data", "vllm_metrics.json").read_text(encoding="utf-8")
)
#: Info gauge (value 1), per engine: the engine's cache configuration as labels, among them
#: ``num_gpu_blocks``, ``block_size``, ``cache_dtype`` and ``gpu_memory_utilization`` (V0 and V1; V1
#: sets ``num_gpu_blocks`` once the KV cache is sized: "vllm cache_config_info with initialization after
#: num_gpu_blocks is: N" in its log).
CACHE_CONFIG_INFO = "vllm:cache_config_info"


def _release(text: str | None) -> Version | None:
    if text is None:
        return None
    release = parse_release(text)
    if release is None:
        raise ValueError(f"traffic/data/vllm_metrics.json: {text!r} is no vLLM release")
    return release


def _names(signal: str) -> tuple[MetricName, ...]:
    """A signal's names from the table (data/vllm_metrics.json), in order of preference."""
    return tuple(
        MetricName(entry["name"], since=_release(entry.get("since")), until=_release(entry.get("until")))
        for entry in _TABLE["signals"][signal]["names"]
    )


#: In order of preference: the newer name first.
KV_CACHE_USAGE_NAMES: tuple[MetricName, ...] = _names("kvCacheUsage")
#: Gauge, per engine: requests queued for the running batch (the same name in V0 and V1).
REQUESTS_WAITING_NAMES: tuple[MetricName, ...] = _names("requestsWaiting")
SIGNALS: tuple[str, ...] = tuple(_TABLE["signals"])
#: Gauge, per engine (label ``engine`` in V1): requests in the running batch.
REQUESTS_RUNNING = "vllm:num_requests_running"
#: Counter ``vllm:num_preemptions``, exposed with the ``_total`` suffix (same name in V0 and V1).
PREEMPTIONS = "vllm:num_preemptions_total"
#: Histogram of prompt lengths per finished request; buckets 1, 2, 5, 10, 20, 50, ... up to max_model_len.
PROMPT_TOKENS_HISTOGRAM = "vllm:request_prompt_tokens"
#: DCGM exporter gauge: frame buffer (GPU memory) used, in MiB, per GPU.
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
#: loadline's GPU node agent (docs/agent.md): bytes of one GPU held by one container's compute processes.
AGENT_CONTAINER_MEMORY_USED = "loadline_gpu_container_memory_used_bytes"


def parse_version(text: str | None) -> Version | None:
    """``"v0.10.1.post1"``, ``"0.9.2"``, ``"vllm/vllm-openai:v0.11.0"`` → ``(0, 10, 1)``; else None
    (:func:`loadline.versions.release_of_image`: a release candidate counts as its release, since it
    already carries the release's metric changes)."""
    return release_of_image(text) if text else None


def kv_cache_usage_names(engine_version: str | None) -> tuple[str, ...]:
    """The KV-cache usage names to ask for, preferred first (both when the version is unknown)."""
    return signal_names("kvCacheUsage", engine_version)


def signal_names(signal: str, engine_version: str | None) -> tuple[str, ...]:
    """The names of load ``signal`` (a key of the table: kvCacheUsage, requestsWaiting, requestsRunning)
    that a model of ``engine_version`` exports, preferred first; every name when the version is unknown."""
    table = _names(signal)
    version = parse_version(engine_version)
    if version is None:
        return tuple(m.name for m in table)
    names = tuple(m.name for m in table if m.exported_by(version))
    return names or (table[0].name,)
