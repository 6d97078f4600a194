"""loadline.traffic against a real Prometheus (Debian's 2.42) holding backfilled vLLM and DCGM history.

No cluster is needed: e2e/prometheus.sh starts a Prometheus on loopback that scrapes nothing, and the
history of a few fake pods is written as OpenMetrics and turned into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics``. The pods:

* ``team-a/vllm-llama-0`` (vLLM 0.10, both KV names, like the real engine between 0.9.2 and 0.11):
  two quiet hours (one earlier restart, so counters reset once), then in the last 10 minutes before the
  crash prompts grow from 2k to 30k tokens, KV usage climbs to 0.98, 12 requests are preempted, 14 run.
  After the crash the restarted container reports an empty cache: the window must end at the crash.
* ``team-a/vllm-llama-1``: a quiet neighbour with the same model (must not leak into llama-0's figures).
* ``team-b/vllm-old-0``: vLLM 0.8.5, only ``vllm:gpu_cache_usage_perc``; its GPU memory grows 0.5 GiB/h
  and DCGM was scraped without honorLabels (``exported_pod``).
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kube import E2E_DIR, STATE_DIR
from loadline.oom import OomClass, classify, parse_incident
from loadline.traffic import incident_metrics

SCRIPT = E2E_DIR / "prometheus.sh"
STEP = 15  # seconds between samples, a common scrape interval
MAX_MODEL_LEN = 32768
HISTORY = 2 * 3600


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's prompt-length buckets: 1, 2, 5, 10, 20, 50, ... up to max_value (as vLLM builds them)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


BUCKETS = build_1_2_5_buckets(MAX_MODEL_LEN)


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    return repr(float(value))


@dataclass
class Pod:
    """A fake vLLM pod's history: functions of time (seconds relative to the crash, <= 0 before it)."""

    namespace: str
    name: str
    kv_names: tuple[str, ...]
    kv: Callable[[int], float]
    running: Callable[[int], float]
    prompt: Callable[[int], int]
    preempted_by: Callable[[int], int]  # cumulative preemptions since the container started
    fb_used_mib: Callable[[int], float]
    restarts_at: tuple[int, ...] = ()  # container (re)starts, relative seconds; counters reset there
    dcgm_exported: bool = False
    after_crash: int = 120  # the restarted container keeps reporting this long after the crash

    def times(self) -> list[int]:
        return list(range(-HISTORY, self.after_crash + 1, STEP))

    def started(self, t: int) -> int:
        starts = [s for s in (-HISTORY, *self.restarts_at, 1) if s <= t]
        return max(starts)


def openmetrics(pods: list[Pod], crash: int) -> str:
    """The pods' history as OpenMetrics text; one family at a time, each series in time order."""
    lines: list[str] = []

    def family(name: str, kind: str) -> None:
        lines.append(f"# TYPE {name} {kind}")

    def pod_labels(pod: Pod) -> dict[str, str]:
        return {"engine": "0", "model_name": "llama", "namespace": pod.namespace, "pod": pod.name}

    for kv_name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        family(kv_name, "gauge")
        for pod in pods:
            if kv_name in pod.kv_names:
                sel = _labels(**pod_labels(pod))
                lines += [f"{kv_name}{sel} {_num(pod.kv(t))} {crash + t}" for t in pod.times()]
    family("vllm:num_requests_running", "gauge")
    for pod in pods:
        sel = _labels(**pod_labels(pod))
        lines += [f"vllm:num_requests_running{sel} {_num(pod.running(t))} {crash + t}" for t in pod.times()]
    family("vllm:num_preemptions", "counter")
    for pod in pods:
        sel = _labels(**pod_labels(pod))
        lines += [
            f"vllm:num_preemptions_total{sel} {_num(pod.preempted_by(t))} {crash + t}" for t in pod.times()
        ]
    # One request finishes per scrape interval; the histogram is cumulative since the container started.
    family("vllm:request_prompt_tokens", "histogram")
    for pod in pods:
        counts = [0] * (len(BUCKETS) + 1)
        total = 0
        start = pod.started(pod.times()[0])
        for t in pod.times():
            if pod.started(t) != start:
                start = pod.started(t)
                counts, total = [0] * (len(BUCKETS) + 1), 0
            if t > pod.started(t):
                prompt = pod.prompt(t)
                total += prompt
                for i, bound in enumerate(BUCKETS):
                    if prompt <= bound:
                        counts[i] += 1
                counts[-1] += 1
            base = pod_labels(pod)
            for upper, count in zip([*map(float, BUCKETS), math.inf], counts, strict=True):
                le = "+Inf" if math.isinf(upper) else repr(upper)
                lines.append(f"vllm:request_prompt_tokens_bucket{_labels(**base, le=le)} {count} {crash + t}")
            lines.append(f"vllm:request_prompt_tokens_count{_labels(**base)} {counts[-1]} {crash + t}")
            lines.append(f"vllm:request_prompt_tokens_sum{_labels(**base)} {total} {crash + t}")
    family("DCGM_FI_DEV_FB_USED", "gauge")
    for i, pod in enumerate(pods):
        who = (
            {
                "exported_namespace": pod.namespace,
                "exported_pod": pod.name,
                "namespace": "gpu-operator",
                "pod": "nvidia-dcgm-exporter-x7k2p",
            }
            if pod.dcgm_exported
            else {"namespace": pod.namespace, "pod": pod.name}
        )
        sel = _labels(gpu="0", UUID=f"GPU-{i:08d}", Hostname=f"gpu-node-{i}", container="vllm", **who)
        lines += [f"DCGM_FI_DEV_FB_USED{sel} {_num(pod.fb_used_mib(t))} {crash + t}" for t in pod.times()]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _ramp(t: int, start: int, a: float, b: float) -> float:
    """a before ``start`` (seconds before the crash, negative), then linear to b at the crash."""
    if t <= start:
        return a
    return a + (b - a) * min(1.0, (t - start) / -start)


def llama_0() -> Pod:
    def kv(t: int) -> float:
        if t > 0:
            return 0.02  # restarted container, empty cache
        return _ramp(t, -600, 0.30 + 0.05 * math.sin(t / 300), 0.98)

    def running(t: int) -> float:
        return 0.0 if t > 0 else round(_ramp(t, -600, 6 + 2 * math.sin(t / 400), 14))

    def prompt(t: int) -> int:
        if t <= -600:
            return 800 + (t // STEP) % 7 * 150  # 800..1700 tokens
        return int(_ramp(t, -600, 2000, 30000)) if t <= 0 else 500

    def preempted(t: int) -> int:
        if t > 0:
            return 0
        if t < -4500:  # the container before the restart at -4500 s preempted 5 requests
            return 5 if t > -6000 else 0
        return max(0, min(12, math.floor(12 * (t + 570) / 560)))

    def fb(t: int) -> float:
        return 71000.0 + (3.0 if (t // STEP) % 2 else 0.0)  # vLLM preallocates: flat

    return Pod(
        "team-a", "vllm-llama-0", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        kv, running, prompt, preempted, fb, restarts_at=(-4500,),
    )  # fmt: skip


def llama_1() -> Pod:
    return Pod(
        "team-a", "vllm-llama-1", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        lambda t: 0.5, lambda t: 3.0, lambda t: 40000, lambda t: 300, lambda t: 50000.0,
    )  # fmt: skip


def old_0() -> Pod:
    return Pod(
        "team-b", "vllm-old-0", ("vllm:gpu_cache_usage_perc",),
        lambda t: 0.91, lambda t: 2.0, lambda t: 1200, lambda t: 0,
        lambda t: 40000.0 + 512.0 * (t + HISTORY) / 3600,  # +0.5 GiB per hour
        dcgm_exported=True,
    )  # fmt: skip


@dataclass(frozen=True)
class Backfilled:
    url: str
    crash: int  # unix seconds of llama-0's crash (all pods share the time axis)


#: This module's own Prometheus: its reset and teardown must not take the session's (which the operator
#: reads, and later tests backfill) away.
INSTANCE = {**os.environ, "LOADLINE_PROMETHEUS_INSTANCE": "prometheus-offline"}


def _script(*args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=INSTANCE,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"e2e/prometheus.sh {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}", pytrace=False
        )
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def prometheus() -> Iterator[Backfilled]:
    """A fresh Prometheus on loopback holding the three pods' backfilled history."""
    _script("reset")
    # The crash a few minutes ago, on the scrape grid; history back to two hours before it.
    crash = (int(time.time()) - 300) // STEP * STEP
    source = STATE_DIR / "prometheus" / "backfill.om"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(openmetrics([llama_0(), llama_1(), old_0()], crash))
    url = _script("backfill", str(source)).splitlines()[-1]
    try:
        yield Backfilled(url, crash)
    finally:
        _script("down")


def test_incident_metrics_read_the_minutes_before_the_crash(prometheus: Backfilled) -> None:
    m = incident_metrics(
        prometheus.url, "team-a", "vllm-llama-0", prometheus.crash, "v0.10.1", max_model_len=MAX_MODEL_LEN
    )
    assert set(m) == {
        "kv_cache_usage", "requests_running", "preemptions", "prompt_tokens_max", "prompt_tokens_recent",
        "gpu_memory_growth_gib_per_hour",
    }  # fmt: skip
    assert m["kv_cache_usage"] == pytest.approx(0.98, abs=0.005)
    assert m["requests_running"] == 14
    assert isinstance(m["preemptions"], int) and abs(m["preemptions"] - 12) <= 1
    # 30k tokens fall in vLLM's open bucket above 20000, read as max_model_len.
    longest = m["prompt_tokens_max"]
    assert isinstance(longest, int) and 30000 <= longest <= MAX_MODEL_LEN
    recent = m["prompt_tokens_recent"]
    assert isinstance(recent, list) and len(recent) == 5
    # Each 2-minute maximum is the upper bound of its 1-2-5 bucket: at least the true maximum.
    true_max = [int(2000 + 28000 * (i + 1) / 5) for i in range(5)]  # 7600, 13200, ... 30000
    for got, true in zip(recent, true_max, strict=True):
        assert true <= got <= max(MAX_MODEL_LEN, true), (recent, true_max)
    assert recent == sorted(recent) and recent[-1] >= 2 * recent[0]
    growth = m["gpu_memory_growth_gib_per_hour"]
    assert isinstance(growth, int | float) and abs(growth) < 0.01  # preallocated: flat


def test_unknown_engine_version_asks_for_both_kv_names(prometheus: Backfilled) -> None:
    m = incident_metrics(
        prometheus.url, "team-a", "vllm-llama-0", prometheus.crash, None, max_model_len=MAX_MODEL_LEN
    )
    assert m["kv_cache_usage"] == pytest.approx(0.98, abs=0.005)


def test_old_engine_uses_gpu_cache_usage_and_exported_dcgm_labels(prometheus: Backfilled) -> None:
    m = incident_metrics(prometheus.url, "team-b", "vllm-old-0", prometheus.crash, "0.8.5")
    assert m["kv_cache_usage"] == pytest.approx(0.91)
    assert m["requests_running"] == 2
    assert m["preemptions"] == 0
    assert m["prompt_tokens_max"] == 2000  # 1200 tokens: the (1000, 2000] bucket
    assert m["gpu_memory_growth_gib_per_hour"] == pytest.approx(0.5, rel=0.02)
    # A newer engine's name alone would find nothing for this pod.
    newer = incident_metrics(prometheus.url, "team-b", "vllm-old-0", prometheus.crash, "0.12.0")
    assert "kv_cache_usage" not in newer


def test_a_pod_without_history_gets_nothing(prometheus: Backfilled) -> None:
    assert incident_metrics(prometheus.url, "team-a", "vllm-llama-9", prometheus.crash, "0.10.1") == {}


def test_the_classifier_blames_the_callers_prompts(prometheus: Backfilled) -> None:
    metrics = incident_metrics(
        prometheus.url, "team-a", "vllm-llama-0", prometheus.crash, "0.10.1", max_model_len=MAX_MODEL_LEN
    )
    incident = parse_incident(
        {
            "reason": "Error",
            "exit_code": 1,
            "message": (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                "capacity of 79.19 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has "
                "78.16 GiB memory in use. Of the allocated memory 75.30 GiB is allocated by PyTorch, and 1.10 GiB "
                "is reserved by PyTorch but unallocated."
            ),
            "ever_ready": True,
            "uptime_seconds": 4600,
            "seconds_since_ready": 4400,
            "engine_version": "0.10.1",
            "config": {"max_model_len": MAX_MODEL_LEN, "gpu_memory_utilization": 0.9},
            "metrics": metrics,
        }
    )
    d = classify(incident)
    assert d.oom_class is OomClass.KV_CACHE_OVERFLOW, d.evidence
    assert d.caller_side is True
    assert d.caller_note is not None
    assert any("preempted 12" in e or "preempted 11" in e or "preempted 13" in e for e in d.evidence), (
        d.evidence
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_prometheus_gives_nothing_quickly() -> None:
    started = time.monotonic()
    assert (
        incident_metrics(
            f"http://127.0.0.1:{_closed_port()}", "team-a", "vllm-llama-0", time.time(), "0.10.1"
        )
        == {}
    )
    assert time.monotonic() - started < 1.0


def test_blackholed_prometheus_gives_nothing_within_the_timeout() -> None:
    # A listener that never answers: the first request times out and the rest are not even sent.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        started = time.monotonic()
        m = incident_metrics(
            f"http://127.0.0.1:{port}", "team-a", "vllm-llama-0", time.time(), None, timeout=0.5
        )
        assert m == {}
        assert time.monotonic() - started < 2.0


def test_the_script_keeps_to_loopback(prometheus: Backfilled) -> None:
    assert prometheus.url.startswith("http://127.0.0.1:")
    lines = [
        line for line in (STATE_DIR / "prometheus.log").read_text().splitlines() if "Start listening" in line
    ]
    assert lines and all("address=127.0.0.1:" in line for line in lines), lines


def test_script_file_is_executable() -> None:
    assert Path(SCRIPT).stat().st_mode & 0o111
