"""``loadline agent`` (the GPU node agent) and ``loadline gpus`` (the GPU catalog, and a probe for it).

``agent`` serves this node's GPU memory per GPU, per container and per process as Prometheus metrics
(docs/agent.md). ``gpus --probe`` prints a catalog entry for this machine's GPUs; ``gpus`` lists the
catalog as the planner sees it, including the entries of ``--catalog`` / ``LOADLINE_GPU_CATALOG``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from loadline.errors import SpecError

__all__ = ["register"]


def _cmd_agent(args: argparse.Namespace) -> int:
    from loadline.agent import AgentConfig, serve

    if not 0 <= args.port <= 65535:
        raise SpecError("--port", f"{args.port} is not a TCP port", "use e.g. 9402")
    if args.min_interval < 0:
        raise SpecError("--min-interval", "must not be negative", "use e.g. 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = AgentConfig(
        port=args.port,
        address=args.address,
        node=args.node,
        proc_root=Path(args.proc_root),
        containers_dir=Path(args.containers_dir),
        min_interval=args.min_interval,
    )
    return serve(config)


def _cmd_gpus(args: argparse.Namespace) -> int:
    if args.probe:
        from loadline.agent import NvmlSession, catalog_entries, require_gpus

        session = NvmlSession()
        try:
            reading = require_gpus(session.read(nvlink=True))
        finally:
            session.shutdown()
        print(json.dumps({"gpus": catalog_entries(reading)}, indent=2))
        return 0
    from loadline.sizing._data import GPU_CATALOG_ENV, gpu_catalog

    if args.catalog is not None:
        os.environ[GPU_CATALOG_ENV] = args.catalog
        gpu_catalog.cache_clear()
    for gpu in gpu_catalog().values():
        counts = "/".join(str(n) for n in gpu.gpus_per_node)
        print(f"{gpu.name:<16} {gpu.product:<28} {gpu.memory_gib:>7.2f} GiB  {counts} per node")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = sub.add_parser("agent", help="serve this GPU node's memory per GPU, pod and process as metrics")
    agent.add_argument("--port", type=int, default=int(os.environ.get("LOADLINE_AGENT_PORT", "9402")))
    agent.add_argument("--address", default="0.0.0.0", help="address to listen on")
    agent.add_argument(
        "--node", default=os.environ.get("NODE_NAME", ""), help="node name for the node label (env NODE_NAME)"
    )
    agent.add_argument("--proc-root", default="/proc", help="where the host's /proc is seen (hostPID: /proc)")
    agent.add_argument(
        "--containers-dir", default="/var/log/containers", help="the kubelet's container log symlinks"
    )
    agent.add_argument(
        "--min-interval", type=float, default=1.0, help="seconds a reading is reused for concurrent scrapes"
    )
    agent.set_defaults(func=_cmd_agent)

    gpus = sub.add_parser("gpus", help="list the GPU catalog, or print a catalog entry for this machine")
    gpus.add_argument(
        "--probe", action="store_true", help="describe this machine's GPUs (NVML) as catalog JSON"
    )
    gpus.add_argument(
        "--catalog", metavar="FILE", help="extra catalog entries (JSON/YAML; env LOADLINE_GPU_CATALOG)"
    )
    gpus.set_defaults(func=_cmd_gpus)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
