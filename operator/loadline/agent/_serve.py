"""``loadline agent``: serve the node's GPU metrics until SIGTERM.

It only reads: NVML, ``/proc/<pid>/cgroup`` and the names in ``/var/log/containers``. It never blocks
or fails the node's workloads: every NVML failure becomes a metric and a log line, and the HTTP server
keeps answering with whatever could be read (``loadline_agent_nvml_up 0`` on a node without a driver).
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from loadline.agent._metrics import AgentCollector
from loadline.agent._nvml import NvmlSession
from loadline.agent._pods import PodResolver
from loadline.errors import SpecError

__all__ = ["AgentConfig", "serve"]

log = logging.getLogger("loadline.agent")


@dataclass(frozen=True)
class AgentConfig:
    port: int = 9402
    address: str = "0.0.0.0"
    node: str = ""
    proc_root: Path = Path("/proc")
    containers_dir: Path = Path("/var/log/containers")
    min_interval: float = 1.0


def serve(config: AgentConfig, stop: threading.Event | None = None) -> int:
    """Serve ``/metrics`` on ``config.port`` until SIGTERM/SIGINT (or ``stop`` is set); returns 0."""
    stop = stop or threading.Event()
    session = NvmlSession()
    collector = AgentCollector(
        session,
        PodResolver(config.proc_root, config.containers_dir),
        node=config.node,
        min_interval=config.min_interval,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    collector.snapshot()  # the first read logs what is missing before anyone scrapes
    try:
        server, thread = start_http_server(config.port, addr=config.address, registry=registry)
    except OSError as exc:
        session.shutdown()
        where = f"{config.address}:{config.port}"
        raise SpecError("--port", f"cannot listen on {where}: {exc.strerror}", "pick a free port") from None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    log.info(
        "serving GPU metrics on %s:%d/metrics (node %r)", config.address, server.server_port, config.node
    )
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        session.shutdown()
    return 0
