"""Traffic before a crash, from Prometheus: the ``metrics`` of an out-of-memory INCIDENT.

``incident_metrics(base_url, namespace, pod, crash_time, engine_version)`` asks a Prometheus for the
minutes before a vLLM pod crashed (KV-cache usage, running requests, preemptions, the longest prompts
and their trend, GPU memory growth from loadline's node agent or dcgm-exporter) and returns the
dict :func:`loadline.oom.parse_incident` reads under ``"metrics"``. It never raises and never waits
long: what Prometheus cannot tell is left out.

``query_range`` / ``query_range_async`` fetch request-rate history (through prometheus-api-client) for
:mod:`loadline.windows`, under the same never-block, never-raise promise.

The PromQL builders and the answer parsers are pure and public, for tests and for people who want to
paste the same queries into Grafana. See docs/traffic.md.
"""

from loadline.traffic._client import PrometheusClient
from loadline.traffic._incident import Windows, crash_timestamp, incident_metrics, trend_times
from loadline.traffic._measured import measured_gpu_memory
from loadline.traffic._names import (
    AGENT_CONTAINER_MEMORY_USED,
    CACHE_CONFIG_INFO,
    DCGM_FB_USED,
    KV_CACHE_USAGE_NAMES,
    PREEMPTIONS,
    PROMPT_TOKENS_HISTOGRAM,
    REQUESTS_RUNNING,
    MetricName,
    kv_cache_usage_names,
    parse_version,
    signal_names,
)
from loadline.traffic._parse import bucket_increases, samples, scalar, top_bucket
from loadline.traffic._promql import (
    agent_gpu_memory_growth_query,
    busiest_gpu_memory_query,
    cache_config_query,
    duration,
    gpu_memory_growth_query,
    gpu_memory_trend_query,
    gpu_memory_used_query,
    kv_cache_usage_now_query,
    kv_cache_usage_query,
    label_value,
    longest_prompt_query,
    model_load_query,
    model_signal_query,
    preemptions_counter_query,
    preemptions_query,
    prompt_buckets_query,
    requests_running_query,
    selector,
)
from loadline.traffic._range import query_range, query_range_async
from loadline.traffic._risk_signals import risk_signals

__all__ = [
    "AGENT_CONTAINER_MEMORY_USED",
    "CACHE_CONFIG_INFO",
    "DCGM_FB_USED",
    "KV_CACHE_USAGE_NAMES",
    "PREEMPTIONS",
    "PROMPT_TOKENS_HISTOGRAM",
    "REQUESTS_RUNNING",
    "MetricName",
    "PrometheusClient",
    "Windows",
    "agent_gpu_memory_growth_query",
    "bucket_increases",
    "busiest_gpu_memory_query",
    "cache_config_query",
    "crash_timestamp",
    "duration",
    "gpu_memory_growth_query",
    "gpu_memory_trend_query",
    "gpu_memory_used_query",
    "incident_metrics",
    "kv_cache_usage_names",
    "kv_cache_usage_now_query",
    "kv_cache_usage_query",
    "label_value",
    "longest_prompt_query",
    "measured_gpu_memory",
    "model_load_query",
    "model_signal_query",
    "parse_version",
    "preemptions_counter_query",
    "preemptions_query",
    "prompt_buckets_query",
    "query_range",
    "query_range_async",
    "requests_running_query",
    "risk_signals",
    "samples",
    "scalar",
    "selector",
    "signal_names",
    "top_bucket",
    "trend_times",
]
