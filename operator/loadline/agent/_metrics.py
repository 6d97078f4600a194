"""The agent's Prometheus metrics: read at scrape time, so every sample is as fresh as the scrape.

A collector, not gauges set by a loop: a process that exited or a GPU that fell off the bus has no
series in the next scrape instead of a stale value that looks alive. Reads are rate-limited
(``min_interval``), so several Prometheus servers scraping one agent do not multiply NVML calls.

What the agent cannot read it says in two counters, ``loadline_agent_nvml_errors_total{call,error}``
and ``loadline_agent_pod_lookup_failures_total{reason}``, plus a log line when a failure starts and
when it clears (not one per scrape).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loadline.agent._nvml import GPU, Failure, NodeReading, NvmlSession
from loadline.agent._pods import Owner, PodResolver

__all__ = ["METRIC_NAMES", "AgentCollector"]

log = logging.getLogger("loadline.agent")

GPU_LABELS = ("node", "gpu", "uuid", "product")
OWNER_LABELS = ("namespace", "pod", "container")

#: Every series name the agent exports (docs/agent.md describes each; a test keeps the two in step).
METRIC_NAMES = (
    "loadline_gpu_info",
    "loadline_gpu_memory_total_bytes",
    "loadline_gpu_memory_used_bytes",
    "loadline_gpu_memory_free_bytes",
    "loadline_gpu_memory_reserved_bytes",
    "loadline_gpu_container_memory_used_bytes",
    "loadline_gpu_process_memory_used_bytes",
    "loadline_agent_nvml_up",
    "loadline_agent_gpus",
    "loadline_agent_read_duration_seconds",
    "loadline_agent_nvml_errors_total",
    "loadline_agent_pod_lookup_failures_total",
)


@dataclass
class _Snapshot:
    reading: NodeReading
    owners: dict[int, Owner]
    duration: float


@dataclass(eq=False)  # registries keep collectors in a dict: identity, not value, makes one
class AgentCollector(Collector):
    """Collects one node's GPU figures for ``prometheus_client``'s registry.

    ``session`` reads NVML, ``resolver`` places processes in pods, ``node`` is the node's name (label
    ``node`` on every GPU series, from the downward API's ``spec.nodeName``).
    """

    session: NvmlSession
    resolver: PodResolver = field(default_factory=PodResolver)
    node: str = ""
    min_interval: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _last: _Snapshot | None = field(default=None, init=False)
    _last_at: float = field(default=0.0, init=False)
    _nvml_errors: Counter[tuple[str, str]] = field(default_factory=Counter, init=False)
    _lookup_failures: Counter[str] = field(default_factory=Counter, init=False)
    _active: set[Failure] = field(default_factory=set, init=False)

    def snapshot(self) -> _Snapshot:
        """The latest reading, taken now unless one younger than ``min_interval`` exists."""
        with self._lock:
            now = self.clock()
            if self._last is None or now - self._last_at >= self.min_interval:
                self._last = self._read()
                self._last_at = now
            return self._last

    def _read(self) -> _Snapshot:
        started = time.perf_counter()
        try:
            reading = self.session.read()
        except Exception as exc:  # a binding bug must cost one scrape, never the agent
            log.exception("reading NVML failed")
            reading = NodeReading(up=False, failures=(Failure("read", type(exc).__name__),))
        pids = {p.pid for gpu in reading.gpus for p in gpu.processes or ()}
        try:
            owners, problems = self.resolver.resolve(sorted(pids))
        except Exception:
            log.exception("mapping GPU processes to pods failed")
            owners, problems = {pid: Owner() for pid in pids}, ["error"] * len(pids)
        for failure in reading.failures:
            self._nvml_errors[(failure.call, failure.error)] += 1
        self._lookup_failures.update(problems)
        self._log_changes(set(reading.failures))
        return _Snapshot(reading, owners, time.perf_counter() - started)

    def _log_changes(self, now: set[Failure]) -> None:
        for f in sorted(now - self._active, key=repr):
            where = "" if f.gpu is None else f"GPU {f.gpu}: "
            log.warning("%s%s failed with NVML error %s; its figures are left out", where, f.call, f.error)
        for f in sorted(self._active - now, key=repr):
            where = "" if f.gpu is None else f"GPU {f.gpu}: "
            log.info("%s%s works again", where, f.call)
        self._active = now

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        reading = snap.reading
        gauges = {
            name: GaugeMetricFamily(name, doc, labels=[*GPU_LABELS, *extra])
            for name, doc, extra in (
                (
                    "loadline_gpu_info",
                    "GPU identity (value 1)",
                    ("name", "driver_version", "compute_capability"),
                ),
                ("loadline_gpu_memory_total_bytes", "GPU memory, total (NVML)", ()),
                (
                    "loadline_gpu_memory_used_bytes",
                    "GPU memory in use (v2: excludes the driver's reserve)",
                    (),
                ),
                ("loadline_gpu_memory_free_bytes", "GPU memory free", ()),
                (
                    "loadline_gpu_memory_reserved_bytes",
                    "GPU memory reserved by driver and firmware (v2 only)",
                    (),
                ),
                (
                    "loadline_gpu_container_memory_used_bytes",
                    "GPU memory held by a container's compute processes on this GPU",
                    OWNER_LABELS,
                ),
                (
                    "loadline_gpu_process_memory_used_bytes",
                    "GPU memory held by one compute process (host PID)",
                    (*OWNER_LABELS, "pid"),
                ),
            )
        }
        for gpu in reading.gpus:
            self._gpu_samples(gpu, reading.driver_version, snap.owners, gauges)
        yield from gauges.values()
        yield GaugeMetricFamily(
            "loadline_agent_nvml_up", "1 when NVML initialised and listed the GPUs", value=float(reading.up)
        )
        yield GaugeMetricFamily("loadline_agent_gpus", "GPUs NVML could read", value=len(reading.gpus))
        yield GaugeMetricFamily(
            "loadline_agent_read_duration_seconds", "how long the last NVML read took", value=snap.duration
        )
        errors = CounterMetricFamily(
            "loadline_agent_nvml_errors",
            "NVML calls that failed, by call and NVML error",
            labels=["call", "error"],
        )
        for (call, error), count in sorted(self._nvml_errors.items()):
            errors.add_metric([call, error], count)
        yield errors
        lookups = CounterMetricFamily(
            "loadline_agent_pod_lookup_failures",
            "GPU processes that could not be placed in a pod, by reason",
            labels=["reason"],
        )
        for reason, count in sorted(self._lookup_failures.items()):
            lookups.add_metric([reason], count)
        yield lookups

    def _gpu_samples(
        self, gpu: GPU, driver: str, owners: dict[int, Owner], gauges: dict[str, GaugeMetricFamily]
    ) -> None:
        base = [self.node, str(gpu.index), gpu.uuid, gpu.product]
        cc = "" if gpu.compute_capability is None else "{}.{}".format(*gpu.compute_capability)
        gauges["loadline_gpu_info"].add_metric([*base, gpu.name, driver, cc], 1.0)
        if gpu.memory is not None:
            m = gpu.memory
            gauges["loadline_gpu_memory_total_bytes"].add_metric(base, m.total)
            gauges["loadline_gpu_memory_used_bytes"].add_metric(base, m.used)
            gauges["loadline_gpu_memory_free_bytes"].add_metric(base, m.free)
            if m.reserved is not None:
                gauges["loadline_gpu_memory_reserved_bytes"].add_metric(base, m.reserved)
        per_container: Counter[Owner] = Counter()
        for process in gpu.processes or ():
            owner = owners.get(process.pid)
            if owner is None or process.used_bytes is None:
                continue  # exited since NVML listed it, or NVML cannot tell its memory
            labels = [*base, owner.namespace, owner.pod, owner.container]
            gauges["loadline_gpu_process_memory_used_bytes"].add_metric(
                [*labels, str(process.pid)], process.used_bytes
            )
            per_container[owner] += process.used_bytes
        for owner, used in sorted(per_container.items(), key=lambda kv: repr(kv[0])):
            gauges["loadline_gpu_container_memory_used_bytes"].add_metric(
                [*base, owner.namespace, owner.pod, owner.container], used
            )
