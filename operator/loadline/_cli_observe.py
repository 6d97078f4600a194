"""``loadline observe LOGFILE``: what a vLLM server reported at start-up, as an observation.

The same reading the operator makes of a running model's log, offline: a GitOps user keeps the output
(``--output json``) in a file of observations that ``loadline plan --observations FILE`` plans with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loadline.observe import Observation, ObserveError, parse_startup_log

__all__ = ["register"]

_FIX = "pass a readable text file holding a vLLM server's log (kubectl logs POD > LOGFILE)"


def read_log(path: str) -> str:
    """The text of a log file (``-``: standard input), read with one-line errors."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read()
        else:
            with Path(path).open("rb") as handle:
                raw = handle.read(_max_bytes() + 1)
    except IsADirectoryError:
        raise ObserveError("LOGFILE", f"{path} is a directory", _FIX) from None
    except OSError as exc:
        raise ObserveError("LOGFILE", f"cannot read {path}: {exc.strerror}", _FIX) from None
    if len(raw) > _max_bytes():
        raise ObserveError(
            "LOGFILE",
            f"{path} is larger than {_max_bytes() // 2**20} MiB, more than any start-up log",
            "pass the first part of the log (head -c 32M LOGFILE)",
        )
    if b"\x00" in raw[:4096]:
        raise ObserveError("LOGFILE", f"{path} is binary, not a log (compressed?)", _FIX)
    return raw.decode("utf-8", errors="replace")


def _max_bytes() -> int:
    from loadline.observe._parse import MAX_LOG_BYTES

    return MAX_LOG_BYTES


def _text(obs: Observation) -> str:
    rows = obs.to_dict()
    settings = rows.pop("settings", {})
    width = max(len(k) for k in [*rows, *settings]) if rows or settings else 0
    lines = [f"{k:<{width}}  {v}" for k, v in rows.items()]
    lines += [f"{k:<{width}}  {v}" for k, v in settings.items()]
    return "\n".join(lines) + "\n"


def _cmd_observe(args: argparse.Namespace) -> int:
    obs = parse_startup_log(read_log(args.logfile), source=f"LOGFILE {args.logfile}")
    if args.gpu:
        from loadline.sizing import find_gpu

        # An unknown type is refused with the catalog's names; a product label is named as the catalog.
        obs = obs.with_gpu(find_gpu(args.gpu, "--gpu").name)
    if args.output == "json":
        sys.stdout.write(json.dumps(obs.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(_text(obs))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``observe`` to the ``loadline`` command line."""
    p = sub.add_parser(
        "observe",
        help="read what vLLM reported at start-up (weights, KV cache, max concurrency) from its log",
        description="Read a vLLM start-up log (any version's wording, worker-prefixed lines of every "
        "rank) into an observation: weights and KV cache GiB per GPU, KV tokens, the concurrency that "
        "fits, the version and settings the server ran with.",
    )
    p.add_argument("logfile", metavar="LOGFILE", help="the server's log, or - for standard input")
    p.add_argument(
        "--gpu",
        help="the GPU type the server ran on (catalog name, e.g. H100-80GB), when the log does not say it",
    )
    p.add_argument("--output", "-o", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(func=_cmd_observe)
