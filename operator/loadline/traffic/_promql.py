"""PromQL for the minutes before a crash, for one pod. Pure: every function returns a query string.

Each query is an *instant* query meant to be evaluated at the crash time (``time=`` of
``/api/v1/query``), so range selectors such as ``[10m]`` cover the window that ends at the crash and
nothing of the restarted container after it. Series are selected by the ``namespace`` and ``pod``
labels, as Prometheus' Kubernetes pod and service-monitor scrape configs attach them. vLLM adds
``model_name`` and, in V1, ``engine`` (one per data-parallel engine); the queries aggregate over those.
"""

from __future__ import annotations

import re

from loadline.traffic._names import (
    AGENT_CONTAINER_MEMORY_USED,
    CACHE_CONFIG_INFO,
    DCGM_FB_USED,
    PREEMPTIONS,
    PROMPT_TOKENS_HISTOGRAM,
    REQUESTS_RUNNING,
    kv_cache_usage_names,
)

__all__ = [
    "agent_gpu_memory_growth_query",
    "duration",
    "gpu_memory_growth_query",
    "gpu_memory_trend_query",
    "gpu_memory_used_query",
    "kv_cache_usage_query",
    "label_value",
    "longest_prompt_query",
    "model_load_query",
    "model_pods",
    "model_signal_query",
    "preemptions_query",
    "prompt_buckets_query",
    "requests_running_query",
    "selector",
]

#: MiB per second (deriv of DCGM_FI_DEV_FB_USED) → GiB per hour.
_MIB_PER_S_TO_GIB_PER_H = "3600 / 1024"
#: Bytes per second (deriv of the agent's series) → GiB per hour.
_B_PER_S_TO_GIB_PER_H = "3600 / 1073741824"


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


def _owner_selectors(namespace: str, pod: str) -> list[str]:
    """The pod as the series' own labels, and as ``exported_*`` when scraped without honorLabels."""
    return [_pod(namespace, pod), selector(exported_namespace=namespace, exported_pod=pod)]


def agent_gpu_memory_growth_query(namespace: str, pod: str, window: int = 3600) -> str:
    """GPU memory growth in GiB per hour from loadline's node agent, for the pod's fastest-growing GPU.

    The agent's series is per GPU and container, in bytes and owned by the pod itself (its processes'
    memory, not the whole GPU's), so a neighbour on a shared GPU does not count. ``sum by (uuid)``
    adds the pod's containers on one GPU (deriv is linear, so the sum of derivatives is the
    derivative of the sum); ``max`` picks the GPU that grows fastest.
    """
    win = duration(window)
    parts = [
        f"max(sum by (uuid) (deriv({AGENT_CONTAINER_MEMORY_USED}{sel}[{win}])))"
        for sel in _owner_selectors(namespace, pod)
    ]
    return f"({' or '.join(parts)}) * {_B_PER_S_TO_GIB_PER_H}"


def gpu_memory_trend_query(namespace: str, pod: str, window: int = 3600, node: str | None = None) -> str:
    """GPU memory growth in GiB per hour from whichever source the cluster has: loadline's agent first
    (per pod, exact), then dcgm-exporter (:func:`gpu_memory_growth_query`). One query, so a cluster
    with either costs one round trip; PromQL ``or`` answers with the first source that has the pod.
    """
    return (
        f"{agent_gpu_memory_growth_query(namespace, pod, window)} or "
        f"{gpu_memory_growth_query(namespace, pod, window, node)}"
    )


def gpu_memory_used_query(namespace: str, pod: str) -> str:
    """GiB of each GPU the pod's processes hold now, one sample per GPU with label ``uuid``.

    From the agent (bytes, per container: summed per GPU), else from dcgm-exporter (MiB, per GPU,
    label ``UUID`` copied to ``uuid``); each sample's label ``source`` says which (``loadline-agent``
    or ``dcgm``), and ``or on (uuid)`` keeps DCGM's figure only for a GPU the agent does not report.
    For status: measured use beside the plan's per-GPU budget.
    """
    owners = _owner_selectors(namespace, pod)
    agent = " or ".join(f"sum by (uuid) ({AGENT_CONTAINER_MEMORY_USED}{sel})" for sel in owners)
    dcgm = " or ".join(
        f'max by (uuid) (label_replace({DCGM_FB_USED}{sel}, "uuid", "$1", "UUID", "(.*)")) * 1048576'
        for sel in owners
    )
    return (
        f'(label_replace({agent}, "source", "loadline-agent", "", "") or on (uuid) '
        f'label_replace({dcgm}, "source", "dcgm", "", "")) / 1073741824'
    )


def kv_cache_usage_now_query(namespace: str, pod: str, engine_version: str | None) -> str:
    """KV-cache usage (fraction 0..1) of the pod's fullest engine at each instant: for a range query
    (the OOM-risk trend), where :func:`kv_cache_usage_query`'s window maximum would smear the trend."""
    sel = _pod(namespace, pod)
    return " or ".join(f"max({name}{sel})" for name in kv_cache_usage_names(engine_version))


def cache_config_query(namespace: str, pod: str) -> str:
    """vLLM's cache configuration of each of the pod's engines, as labels (:data:`CACHE_CONFIG_INFO`)."""
    return f"{CACHE_CONFIG_INFO}{_pod(namespace, pod)}"


def preemptions_counter_query(namespace: str, pod: str) -> str:
    """vLLM's cumulative preemption counter summed over the pod's engines (a range query's input; the
    OOM-risk estimator takes the increase itself, counter resets included)."""
    return f"sum({PREEMPTIONS}{_pod(namespace, pod)})"


def busiest_gpu_memory_query(namespace: str, pod: str) -> str:
    """GiB the pod's processes hold on its busiest GPU (agent, else dcgm-exporter): the OOM-risk trend
    of :func:`gpu_memory_used_query`."""
    return f"max({gpu_memory_used_query(namespace, pod)})"


def model_pods(model: str) -> str:
    """A regular expression for the pod names of ``model`` across its history: a Deployment's
    ``<model>-<hash>-<id>`` and a LeaderWorkerSet leader's ``<model>-<n>``; ``chat`` never matches
    ``chat-big``'s pods."""
    return f"{re.escape(model)}-([a-z0-9]+-[a-z0-9]{{5}}|[0-9]+)"


def model_signal_query(namespace: str, model: str, names: tuple[str, ...], per_pod: str = "sum") -> str:
    """The model's total of a vLLM gauge exported under ``names`` (its version's, preferred first; a
    pod that exports two names is counted once: PromQL ``or`` keeps the first name's series), summed
    over its pods after ``per_pod`` over each pod's engines (``max`` for a fraction such as KV-cache
    usage, ``sum`` for a count such as waiting requests). What a KEDA trigger divides by the target
    per replica."""
    match = "{" + f"namespace={label_value(namespace)},pod=~{label_value(model_pods(model))}" + "}"
    series = " or ".join(f"{name}{match}" for name in names)
    return f"sum({per_pod} by (pod) ({series}))"


def model_load_query(namespace: str, model: str) -> str:
    """Requests in the running batch summed over every pod the model has had: the load whose quiet
    hours the restart window is learned from (a range query). Pods come and go across weeks of
    history, so they are matched by name pattern: a Deployment's ``<model>-<hash>-<id>`` and a
    LeaderWorkerSet leader's ``<model>-<n>``; a model named ``chat`` never matches ``chat-big``'s."""
    return (
        f"sum({REQUESTS_RUNNING}{{namespace={label_value(namespace)},pod=~{label_value(model_pods(model))}}})"
    )


def longest_prompt_query(namespace: str, pod: str, window: int = 300) -> str:
    """The longest prompt the pod received in each ``window`` (a range query: the OOM-risk trend of
    prompts growing toward the KV cache's size). ``histogram_quantile(1, ...)`` is the upper bound of the
    highest bucket that gained observations, what :func:`loadline.traffic.top_bucket` reads from an
    instant answer (any lower quantile would hide one long prompt among many short ones); a window
    without requests has no value."""
    return f"histogram_quantile(1, {prompt_buckets_query(namespace, pod, window)})"
