"""Compare the sizer with real vLLM start-up logs (``shared/calibration/*.csv``).

Each CSV row is one vLLM run with its inputs and the memory figures vLLM logged. We rebuild the same
engine settings, size them with the bundled model config, and report the error per figure. The test
suite asserts the medians; ``benchmarks/calibration_report.py`` prints the table for docs/sizing.md.
"""

from __future__ import annotations

import csv
import hashlib
import statistics
from dataclasses import dataclass
from pathlib import Path

from loadline.sizing._arch import Architecture, parse_hf_config
from loadline.sizing._budget import EngineSettings, MemoryBudget, compute_budget
from loadline.sizing._data import find_catalog_model
from loadline.sizing._resolve import resolve_quantization

#: A public run is held out of calibration when the first 8 hex digits of sha256(its source group),
#: as an integer, are divisible by this: the rule of the OOM corpus (``oom/_corpus.py``), fixed before
#: any error was computed. Runs from one thread or notebook share a group, so they fall on one side.
HELDOUT_MODULUS = 3


def split_for(source_group: str) -> str:
    """``"heldout"`` or ``"calibrate"`` for a public run, from its source group alone."""
    digest = hashlib.sha256(source_group.encode("utf-8")).hexdigest()
    return "heldout" if int(digest[:8], 16) % HELDOUT_MODULUS == 0 else "calibrate"


@dataclass(frozen=True)
class CalibrationRow:
    record_id: str
    model_id: str
    layout: str
    logged: dict[str, float]
    predicted: MemoryBudget
    vllm_failed: bool
    note: str
    engine: str = "v1"
    tensor_parallel_size: int = 1
    total_gpu_memory_gib: float = 0.0
    interconnect: str = "nvlink"
    split: str = "calibrate"  # the H100 0.19 set is calibration; public runs by split_for
    #: What the row was sized from, for replays that size it again (benchmarks/observe.py).
    settings: EngineSettings | None = None
    architecture: Architecture | None = None
    exact_parameters: int | None = None
    vllm_version: str = ""

    @property
    def groups(self) -> tuple[str, ...]:
        """The groups the held-out report medians are taken over (a row is in several)."""
        names = ["all", f"engine {self.engine.upper()}"]
        names.append("GPU <= 24 GB" if self.total_gpu_memory_gib < 30 else "GPU >= 40 GB")
        if self.tensor_parallel_size > 1:
            names.append("TP > 1")
            names.append(f"TP > 1 {self.interconnect}")
        return tuple(names)

    def error(self, name: str) -> float | None:
        """Relative error of one figure (``weights``, ``kv_cache``, ``kv_tokens``), or None if not logged."""
        logged = self.logged.get(name)
        if not logged:
            return None
        predicted = {
            "weights": self.predicted.weights_gib,
            "kv_cache": self.predicted.kv_cache_gib,
            "kv_tokens": float(self.predicted.kv_cache_tokens),
            "activation": self.predicted.activation_gib,
            "cuda_graph": self.predicted.cuda_graph_gib,
            "non_torch": self.predicted.non_torch_gib,
        }[name]
        return (predicted - logged) / logged


def _float(text: str) -> float:
    return float(text) if text.strip() else 0.0


def calibrate(csv_path: Path) -> list[CalibrationRow]:
    """Size every row of a calibration CSV. Raises KeyError naming a model missing from the catalog."""
    rows = []
    with csv_path.open(newline="") as handle:
        for raw in csv.DictReader(handle):
            entry = find_catalog_model(raw["config_key"])
            if entry is None:
                raise KeyError(f"{raw['record_id']}: {raw['config_key']} is not in the model catalog")
            arch = parse_hf_config(entry.config)
            method = raw["quantization"]
            # vLLM prints the kernel it picked (gptq_marlin for a compressed-tensors w4a16 checkpoint);
            # the checkpoint's own quantization_config says what the weights are.
            quantization = resolve_quantization("none", arch) if arch.quantization else method
            if quantization == "none" and method not in {"none", ""}:
                quantization = method
            engine = (raw.get("engine") or "v1").strip().lower()
            # Between the TP ranks: the H100 set is SXM (NVLink); "network" (a TP group across nodes,
            # which the planner never makes) keeps NVLink's figures.
            interconnect = (raw.get("interconnect") or "nvlink").strip().lower()
            settings = EngineSettings(
                dtype=raw["dtype"],
                quantization=quantization,
                kv_cache_dtype=raw["kv_cache_dtype"],
                tensor_parallel_size=int(raw["tensor_parallel_size"]),
                pipeline_parallel_size=int(raw["pipeline_parallel_size"]),
                gpu_memory_utilization=float(raw["gpu_memory_utilization"]),
                max_model_len=int(raw["max_model_len"]),
                max_num_seqs=int(raw["max_num_seqs"]),
                max_num_batched_tokens=int(raw["max_num_batched_tokens"]),
                enforce_eager=raw["enforce_eager"].strip().lower() == "true",
                cuda_graph_in_kv_budget=False,
                block_size=int(raw.get("block_size") or 16),
                engine=engine,
                interconnect="pcie" if interconnect == "pcie" else "nvlink",
            )
            budget = compute_budget(
                arch, settings, float(raw["total_gpu_memory_gib"]), exact_parameters=entry.parameters
            )
            logged = {
                "weights": _float(raw["weights_gib"]),
                "kv_cache": _float(raw["kv_cache_gib"]),
                "kv_tokens": _float(raw["kv_cache_tokens"]),
                "activation": _float(raw["activation_peak_gib"]),
                "cuda_graph": _float(raw["cuda_graph_gib"]),
                "non_torch": _float(raw["non_torch_gib"]),
            }
            layout = f"TP{settings.tensor_parallel_size}PP{settings.pipeline_parallel_size}"
            if raw.get("engine"):
                layout = f"{engine.upper()} {float(raw['total_gpu_memory_gib']):.2f}GiB {layout}"
            rows.append(
                CalibrationRow(
                    record_id=raw["record_id"],
                    model_id=raw["model_id"],
                    layout=f"{layout} {settings.dtype} q={method} kv={settings.kv_cache_dtype} "
                    f"u={settings.gpu_memory_utilization}",
                    logged=logged,
                    predicted=budget,
                    vllm_failed=raw["oom"].strip().lower() == "yes" or bool(raw["other_failure"].strip()),
                    note=raw["oom_message"][:80],
                    engine=engine,
                    tensor_parallel_size=settings.tensor_parallel_size,
                    total_gpu_memory_gib=float(raw["total_gpu_memory_gib"]),
                    interconnect=interconnect,
                    split=split_for(raw["source_group"]) if raw.get("source_group") else "calibrate",
                    settings=settings,
                    architecture=arch,
                    exact_parameters=entry.parameters,
                    vllm_version=raw.get("vllm_version", ""),
                )
            )
    return rows


def median_abs_error(rows: list[CalibrationRow], name: str) -> float:
    errors = [abs(e) for row in rows if (e := row.error(name)) is not None]
    return statistics.median(errors)


def _median_or_none(rows: list[CalibrationRow], name: str) -> float | None:
    errors = [abs(e) for row in rows if (e := row.error(name)) is not None]
    return statistics.median(errors) if errors else None


def group_medians(rows: list[CalibrationRow]) -> dict[tuple[str, str], dict[str, float | None]]:
    """Median absolute error per (split, group) of weights, KV budget and KV tokens, and the count."""
    out: dict[tuple[str, str], dict[str, float | None]] = {}
    for split in ("calibrate", "heldout"):
        in_split = [row for row in rows if row.split == split]
        names = sorted({g for row in in_split for g in row.groups}, key=lambda g: (g != "all", g))
        for group in names:
            members = [row for row in in_split if group in row.groups]
            out[(split, group)] = {
                "rows": float(len(members)),
                "weights": _median_or_none(members, "weights"),
                "kv_cache": _median_or_none(members, "kv_cache"),
                "kv_tokens": _median_or_none(members, "kv_tokens"),
            }
    return out


def format_group_table(rows: list[CalibrationRow]) -> str:
    """A Markdown table of :func:`group_medians` (``-`` where a group logs no such figure)."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value * 100:.1f}%"

    lines = [
        "| split | group | rows | weights | KV budget GiB | KV tokens |",
        "|---|---|---|---|---|---|",
    ]
    for (split, group), m in group_medians(rows).items():
        lines.append(
            f"| {split} | {group} | {int(m['rows'] or 0)} | {pct(m['weights'])} | {pct(m['kv_cache'])} "
            f"| {pct(m['kv_tokens'])} |"
        )
    return "\n".join(lines)


def format_table(rows: list[CalibrationRow]) -> str:
    """A Markdown table: logged vs predicted per row, and the medians."""
    head = (
        "| row | model | layout | weights GiB (logged / ours) | KV GiB (logged / ours) | KV tokens err "
        "| vLLM started | we say fits |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for row in rows:
        weights_err = (row.error("weights") or 0) * 100
        kv_err = (row.error("kv_cache") or 0) * 100
        tokens_err = (row.error("kv_tokens") or 0) * 100
        kv_logged = f"{row.logged['kv_cache']:.2f}" if row.logged["kv_cache"] else "-"
        lines.append(
            f"| {row.record_id} | {row.model_id} | {row.layout} "
            f"| {row.logged['weights']:.2f} / {row.predicted.weights_gib:.2f} ({weights_err:+.1f}%) "
            f"| {kv_logged} / {row.predicted.kv_cache_gib:.2f} ({kv_err:+.1f}%) "
            f"| {tokens_err:+.1f}% | {'no' if row.vllm_failed else 'yes'} "
            f"| {'yes' if row.predicted.fits else 'no'} |"
        )
    lines.append("")
    lines.append(
        f"Median absolute error: weights {median_abs_error(rows, 'weights') * 100:.2f}%, "
        f"KV cache {median_abs_error(rows, 'kv_cache') * 100:.2f}%, "
        f"KV tokens {median_abs_error(rows, 'kv_tokens') * 100:.2f}% over {len(rows)} rows."
    )
    return "\n".join(lines)
