"""The webhook Service's stand-in on the local control plane: ``python e2e/forwarder.py PORT TARGETS``.

In a cluster the API server calls the chart's webhook Service, and kube-proxy sends each connection to
one of the ready pods behind it. The local control plane has no Service network (KWOK runs no pods,
nor kube-proxy), and the chart's replicas run as processes here, each on a port of its own (e2e/chart.py).
So the chart is installed with ``webhook.url`` pointing at this forwarder on 127.0.0.1, and it does what
kube-proxy does: each incoming connection goes, bytes unchanged (TLS end to end), to the next replica
that accepts one, round robin. ``TARGETS`` is a file with one replica port per line, re-read for each
connection (the harness rewrites it when replicas come and go); a replica that refuses (not ready,
restarting) is skipped, as kube-proxy skips a pod that is not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
from pathlib import Path

_turn = itertools.count()


def _ports(targets: Path) -> list[int]:
    try:
        return [int(line) for line in targets.read_text().split() if line.strip()]
    except (OSError, ValueError):
        return []


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()


async def _connect(targets: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    ports = _ports(targets)
    if not ports:
        return None
    start = next(_turn)
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        try:
            return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout=1)
        except (OSError, TimeoutError):
            continue
    return None


async def _serve(port: int, targets: Path) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream = await _connect(targets)
        if upstream is None:  # no ready replica: the API server sees a refused call, as with no endpoints
            client_writer.close()
            return
        up_reader, up_writer = upstream
        await asyncio.gather(_pipe(client_reader, up_writer), _pipe(up_reader, client_writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: forwarder.py PORT TARGETS_FILE", file=sys.stderr)
        return 2
    asyncio.run(_serve(int(argv[0]), Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
