"""An API server that has just started, for one client: ``python e2e/discovery_gap.py PORT UPSTREAM FLAG``.

For a moment after it starts, the kube-apiserver serves the CRDs' objects while its discovery does not
list them yet. A client that reads discovery then sees no loadline.dev. This stands between one client
and ``UPSTREAM`` (a ``kubectl proxy`` of the real API server, which adds the credentials) and, while the
file ``FLAG`` exists, answers discovery as such a server does: ``/apis`` without the group, 404 for the
group's own documents. Everything else (reads, watches, writes, the objects themselves) passes through
unchanged, streamed. Plain HTTP on 127.0.0.1: the client's kubeconfig points at ``http://127.0.0.1:PORT``.

Each discovery answer given while hidden is counted in ``FLAG.hidden`` (one line per answer), so that a
test knows its client looked.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from loadline.api import GROUP, VERSION

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


def without_group(document: dict[str, Any]) -> dict[str, Any]:
    """``/apis`` without our group, in the legacy (APIGroupList) and the aggregated shape."""
    if isinstance(document.get("groups"), list):
        document["groups"] = [g for g in document["groups"] if g.get("name") != GROUP]
    if isinstance(document.get("items"), list):
        document["items"] = [g for g in document["items"] if (g.get("metadata") or {}).get("name") != GROUP]
    return document


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: discovery_gap.py PORT UPSTREAM FLAG", file=sys.stderr)
        return 2
    port, upstream, flag = int(argv[0]), argv[1].rstrip("/"), Path(argv[2])
    counter = flag.with_name(flag.name + ".hidden")

    def hidden(path: str) -> bool:
        group_documents = (f"/apis/{GROUP}", f"/apis/{GROUP}/{VERSION}")
        return flag.exists() and (path == "/apis" or path.rstrip("/") in group_documents)

    async def handle(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        if hidden(request.path):
            with counter.open("a") as out:
                out.write(f"{request.path}\n")
            if request.path != "/apis":
                return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                          "reason": "NotFound", "code": 404}, status=404)  # fmt: skip
            async with session.get(upstream + request.path_qs, headers=headers) as answer:
                document = without_group(await answer.json(content_type=None))
            return web.json_response(document, status=answer.status)
        async with session.request(
            request.method, upstream + request.path_qs, headers=headers, data=body or None
        ) as answer:
            response = web.StreamResponse(status=answer.status)
            for key, value in answer.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers[key] = value
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def session_context(app: web.Application) -> Any:
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        yield
        await app["session"].close()

    app = web.Application()
    app.cleanup_ctx.append(session_context)
    app.router.add_route("*", "/{tail:.*}", handle)
    # Open watches end at once on SIGTERM (aiohttp would wait a minute for them).
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, shutdown_timeout=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
