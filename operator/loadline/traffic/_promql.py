"""PromQL for the minutes before a crash, for one pod. Pure: every function returns a query string.

Each query is an *instant* query meant to be evaluated at the crash time (``time=`` of
``/api/v1/query``), so range selectors such as ``[10m]`` cover the window that ends at the crash and
nothing of the restarted container after it. Series are selected by the ``namespace`` and ``pod``
labels, as Prometheus' Kubernetes pod and service-monitor scrape configs attach them. vLLM adds
``model_name`` and, in V1, ``engine`` (one per data-parallel engine); the queries aggregate over those.
"""

from __future__ import annotations

from loadline.traffic._names import (
    DCGM_FB_USED,
    PREEMPTIONS,
    PROMPT_TOKENS_HISTOGRAM,
    REQUESTS_RUNNING,
    kv_cache_usage_names,
)

__all__ = [
    "duration",
    "gpu_memory_growth_query",
    "kv_cache_usage_query",
    "label_value",
    "preemptions_query",
    "prompt_buckets_query",
    "requests_running_query",
    "selector",
]

#: MiB per second (deriv of DCGM_FI_DEV_FB_USED) → GiB per hour.
_MIB_PER_S_TO_GIB_PER_H = "3600 / 1024"


def label_value(value: str) -> str:
    """A PromQL double-quoted string literal for ``value``."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def selector(**labels: str) -> str:
    """``{namespace="ns",pod="p"}`` for equality matchers, in the order given."""
    return "{" + ",".join(f"{name}={label_value(value)}" for name, value in labels.items()) + "}"


def duration(seconds: int) -> str:
    """A PromQL duration: 600 → ``10m``, 3600 → ``1h``, 90 → ``90s``."""
    if seconds <= 0:
        raise ValueError(f"a PromQL window must be positive, not {seconds}s")
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _pod(namespace: str, pod: str) -> str:
    return selector(namespace=namespace, pod=pod)


def kv_cache_usage_query(namespace: str, pod: str, engine_version: str | None, window: int = 600) -> str:
    """Highest KV-cache usage (fraction 0..1) of any engine of the pod during the window.

    The maximum, not the last value: the last scrape may come seconds before the crash or, with a
    long scrape interval, well before the cache filled up. The name follows the engine version; where
    both names may exist the preferred one is asked first and the other one is the ``or`` fallback.
    """
    sel, win = _pod(namespace, pod), duration(window)
    parts = [f"max(max_over_time({name}{sel}[{win}]))" for name in kv_cache_usage_names(engine_version)]
    return " or ".join(parts)


def requests_running_query(namespace: str, pod: str, window: int = 600) -> str:
    """Requests in the running batch at the last scrape before the crash, summed over engines."""
    return f"sum(last_over_time({REQUESTS_RUNNING}{_pod(namespace, pod)}[{duration(window)}]))"


def preemptions_query(namespace: str, pod: str, window: int = 600) -> str:
    """Requests preempted for lack of KV-cache blocks during the window (counter increase, all engines).

    ``increase`` copes with counter resets (an earlier restart of the same pod) and extrapolates to the
    window's edges, so the answer is fractional; the caller rounds it.
    """
    return f"sum(increase({PREEMPTIONS}{_pod(namespace, pod)}[{duration(window)}]))"


def prompt_buckets_query(namespace: str, pod: str, window: int = 600) -> str:
    """Per-bucket increase of the prompt-length histogram during the window, summed over engines.

    The answer is one sample per ``le``; :func:`loadline.traffic.top_bucket` turns it into the
    longest prompt: the upper bound of the highest bucket that gained observations. Not
    ``histogram_quantile(0.99, ...)``: a single long prompt among a hundred short ones is enough to
    exhaust the KV cache, and a quantile would hide it (and interpolate inside a 1-2-5 bucket).
    """
    return (
        f"sum by (le) (increase({PROMPT_TOKENS_HISTOGRAM}_bucket{_pod(namespace, pod)}[{duration(window)}]))"
    )


def gpu_memory_growth_query(namespace: str, pod: str, window: int = 3600, node: str | None = None) -> str:
    """GPU memory growth in GiB per hour: ``deriv`` of DCGM's ``DCGM_FI_DEV_FB_USED`` (MiB).

    The fastest-growing GPU of the pod (``max``: with tensor parallelism one GPU running out is
    enough). DCGM's exporter labels each GPU with the pod using it (``pod``/``namespace``, from the
    kubelet's pod-resources API); scraped without ``honorLabels`` those arrive as ``exported_pod``/
    ``exported_namespace``, so both are asked for. With ``node`` the last fallback is every GPU of that
    node (label ``Hostname``, the node name under the GPU operator), which blames the pod for any
    neighbour's growth: only use it when the exporter cannot label pods.
    """
    win = duration(window)
    selectors = [
        _pod(namespace, pod),
        selector(exported_namespace=namespace, exported_pod=pod),
    ]
    if node:
        selectors.append(selector(Hostname=node))
    parts = [f"max(deriv({DCGM_FB_USED}{sel}[{win}]))" for sel in selectors]
    return f"({' or '.join(parts)}) * {_MIB_PER_S_TO_GIB_PER_H}"
