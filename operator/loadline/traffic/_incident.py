"""The ``metrics`` part of an INCIDENT for one crashed pod, from Prometheus.

One call, bounded in time, that never raises: whatever Prometheus cannot tell is simply left out,
and an unreachable Prometheus gives ``{}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from loadline.traffic._client import PrometheusClient
from loadline.traffic._parse import bucket_increases, scalar, top_bucket
from loadline.traffic._promql import (
    gpu_memory_trend_query,
    kv_cache_usage_query,
    preemptions_query,
    prompt_buckets_query,
    requests_running_query,
)

__all__ = ["Windows", "crash_timestamp", "incident_metrics", "trend_times"]

log = logging.getLogger("loadline.traffic")

MetricsDict = dict[str, int | float | list[int]]


@dataclass(frozen=True)
class Windows:
    """How far back each figure looks from the crash, in seconds.

    ``recent`` is the window of KV usage, running requests, preemptions and the longest prompt; the
    prompt trend splits the same span into ``trend_intervals`` intervals (5 × 2 minutes by default).
    Each trend query reaches ``overlap`` seconds further back than its interval: ``increase`` only
    sees samples inside its range, so without the overlap a request finished between the last scrape
    of one interval and the first of the next would be in neither (with 15-second scrapes that is one
    request in eight). 60 seconds covers scrape intervals up to a minute; the price is that a long
    prompt may also show in the interval before its own, which can only flatten the trend a little.
    GPU memory growth needs a longer view: ``deriv`` over ``growth`` (1 hour), of loadline's node agent's
    series where it runs, else of dcgm-exporter's.
    """

    recent: int = 600
    trend_intervals: int = 5
    overlap: int = 60
    growth: int = 3600

    @property
    def trend_step(self) -> int:
        return max(1, self.recent // max(1, self.trend_intervals))

    @property
    def trend_window(self) -> int:
        return self.trend_step + max(0, self.overlap)


def crash_timestamp(crash_time: datetime | float | str) -> float:
    """Unix seconds of a datetime (naive means UTC), a number, or an RFC 3339 string ("…Z")."""
    if isinstance(crash_time, datetime):
        moment = crash_time if crash_time.tzinfo else crash_time.replace(tzinfo=UTC)
        return moment.timestamp()
    if isinstance(crash_time, str):
        return crash_timestamp(datetime.fromisoformat(crash_time.strip().replace("Z", "+00:00")))
    return float(crash_time)


def trend_times(crash: float, windows: Windows) -> list[float]:
    """End times of the trend intervals, oldest first; the last one is the crash."""
    step = windows.trend_step
    n = max(1, windows.trend_intervals)
    return [crash - (n - 1 - i) * step for i in range(n)]


def incident_metrics(
    base_url: str,
    namespace: str,
    pod: str,
    crash_time: datetime | float | str,
    engine_version: str | None = None,
    *,
    max_model_len: int | None = None,
    node: str | None = None,
    windows: Windows = Windows(),  # frozen, so a shared default is safe
    timeout: float = 2.0,
    deadline: float = 10.0,
    headers: dict[str, str] | None = None,
) -> MetricsDict:
    """``incident["metrics"]`` for a pod that crashed at ``crash_time``: only the keys Prometheus had.

    Keys: ``kv_cache_usage`` (fraction), ``requests_running``, ``preemptions``, ``prompt_tokens_max``,
    ``prompt_tokens_recent`` (per-interval maxima, oldest first, intervals without finished requests
    left out), ``gpu_memory_growth_gib_per_hour``. Prompt figures are upper bounds of histogram
    buckets; pass ``max_model_len`` (the plan's) so the open ``+Inf`` bucket reads as max_model_len.
    ``node`` enables the per-node fallback for GPU memory. Never raises; ``{}`` when Prometheus is
    unreachable; at most about ``deadline`` seconds (each request at most ``timeout``).
    """
    try:
        crash = crash_timestamp(crash_time)
        with PrometheusClient(base_url, timeout=timeout, deadline=deadline, headers=headers) as client:
            return _collect(client, namespace, pod, crash, engine_version, max_model_len, node, windows)
    except Exception:  # the operator must never fail because of metrics
        log.exception("collecting Prometheus metrics for %s/%s failed", namespace, pod)
        return {}


def _collect(
    client: PrometheusClient,
    namespace: str,
    pod: str,
    crash: float,
    engine_version: str | None,
    max_model_len: int | None,
    node: str | None,
    windows: Windows,
) -> MetricsDict:
    out: MetricsDict = {}

    def ask(promql: str, at: float = crash) -> Any | None:
        return client.query(promql, at)

    kv = scalar(ask(kv_cache_usage_query(namespace, pod, engine_version, windows.recent)))
    if kv is not None:
        out["kv_cache_usage"] = round(min(1.0, max(0.0, kv)), 4)
    running = scalar(ask(requests_running_query(namespace, pod, windows.recent)))
    if running is not None:
        out["requests_running"] = max(0, round(running))
    preempted = scalar(ask(preemptions_query(namespace, pod, windows.recent)))
    if preempted is not None:
        out["preemptions"] = max(0, round(preempted))
    longest = top_bucket(
        bucket_increases(ask(prompt_buckets_query(namespace, pod, windows.recent))), max_model_len
    )
    if longest is not None:
        out["prompt_tokens_max"] = longest
    if longest is not None and client.failure is None:
        recent: list[int] = []
        for end in trend_times(crash, windows):
            payload = ask(prompt_buckets_query(namespace, pod, windows.trend_window), end)
            value = top_bucket(bucket_increases(payload), max_model_len)
            if value is not None:
                recent.append(value)
        if recent:
            out["prompt_tokens_recent"] = recent
    growth = scalar(ask(gpu_memory_trend_query(namespace, pod, windows.growth, node)))
    if growth is not None:
        out["gpu_memory_growth_gib_per_hour"] = round(growth, 4)
    if client.failure is not None:
        log.info("Prometheus metrics for %s/%s incomplete: %s", namespace, pod, client.failure)
    return out
