"""``loadline observe LOGFILE``: what a vLLM server reported at start-up, as an observation.

The same reading the operator makes of a running model's log, offline: a GitOps user keeps the output
(``--output json``) in a file of observations that ``loadline plan --observations FILE`` plans with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadline.errors import SpecError
from loadline.observe import (
    CorrectionStore,
    Observation,
    ObserveError,
    load_store,
    mismatches,
    parse_startup_log,
    record_of,
)

if TYPE_CHECKING:
    from loadline.sizing import Plan

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


def read_store(path: str, field: str) -> CorrectionStore:
    """The observation store in ``path`` (absent: an empty store, for ``--add-to`` to start one)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        if field == "--add-to":
            return CorrectionStore()
        raise SpecError(field, f"cannot read {path}: no such file", "pass an existing file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(field, f"cannot read {path}: {exc}", "pass a readable UTF-8 text file") from None
    return load_store(text, f"{field} {path}")


def _record(args: argparse.Namespace, obs: Observation) -> CorrectionStore:
    """``--plan MODEL.yaml --add-to STORE``: the observation beside the uncorrected plan of the model it
    ran, added to the store file (written back)."""
    from loadline.api import load_manifests
    from loadline.sizing import plan_inference_model

    manifests = load_manifests([args.plan])
    if len(manifests.models) != 1:
        raise SpecError("--plan", f"{args.plan} holds {len(manifests.models)} InferenceModels", "pass one")
    _, obj = manifests.models[0]
    spec = obj.spec
    if obs.gpu_type:
        spec = spec.model_copy(update={"gpu": spec.gpu.model_copy(update={"types": [obs.gpu_type]})})
    plan = plan_inference_model(spec)
    differ = mismatches(obs, planned_settings(plan))
    if differ:
        raise SpecError(
            "--plan",
            f"the server in the log ran {', '.join(differ)}",
            "pass the InferenceModel the server was rendered from (its plan's settings are what vLLM is "
            "compared with)",
        )
    record = record_of(
        obs,
        family=plan.model.architecture.model_type,
        gpu_type=plan.chosen.gpu.name,
        quantization=plan.settings.quantization,
        version=plan.inputs.version,
        planned_kv_gib=plan.budget.kv_cache_gib,
        model=plan.model.model_id,
        source=f"file {Path(args.logfile).name}",
    )
    store = read_store(args.add_to, "--add-to").add(record)
    Path(args.add_to).write_text(store.to_json(), encoding="utf-8")
    return store


def planned_settings(plan: Plan) -> dict[str, Any]:
    """The plan's settings under the names vLLM logs them by (:func:`loadline.observe.mismatches`)."""
    s = plan.settings
    return {
        "tensor_parallel_size": plan.chosen.tensor_parallel_size,
        "pipeline_parallel_size": plan.chosen.pipeline_parallel_size,
        "max_model_len": s.max_model_len,
        "gpu_memory_utilization": s.gpu_memory_utilization,
        "kv_cache_dtype": s.kv_cache_dtype,
        "quantization": s.quantization,
        "enforce_eager": s.enforce_eager,
        "version": plan.inputs.version,
    }


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
    if bool(args.plan) != bool(args.add_to):
        raise SpecError("--add-to", "and --plan go together", "pass both, or neither")
    if args.add_to:
        _record(args, obs)
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
    p.add_argument(
        "--plan",
        metavar="MODEL.yaml",
        help="the InferenceModel the server ran: the observation is compared with its uncorrected plan",
    )
    p.add_argument(
        "--add-to",
        metavar="STORE",
        help="add the observation to this ObservationStore file (created if absent; kept bounded), for "
        "'loadline plan --observations STORE'",
    )
    p.add_argument("--output", "-o", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(func=_cmd_observe)
