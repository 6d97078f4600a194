"""Replay the calibration runs as a fleet that teaches the planner (issue 37).

Run: `.venv/bin/python benchmarks/observe.py [CSV ...]`; default: ../shared/calibration's H100 file and
benchmarks/data/vllm_public_runs.csv.

Each CSV row is one vLLM start-up, taken in arrival order (the file's order). Before a run starts, the
planner sizes it twice: uncorrected, and with the learned corrections of every earlier run
(``loadline.observe.CorrectionStore``, keyed by architecture family × GPU type × vLLM minor ×
quantization, bounded as the operator keeps it). The corrected budget is the planner's own: the
correction enters as memory held back on that GPU type (``ModelTerms`` reserves), not as an
adjustment of the printed figure. After the run, its logged KV cache joins the store as an
observation beside the uncorrected plan. Runs vLLM refused to start, or that logged no KV cache, are
sized but teach nothing; so are runs whose vLLM release is unknown (no key).

Printed: the median |KV GiB error| of the corrected and uncorrected plans over the runs that had at
least 1, 3 and 5 earlier observations of their key, per file, and the same per held-out split where
the file has one.
"""

from __future__ import annotations

import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from loadline.api._observed import ObservationRecord
from loadline.observe import CorrectionStore, minor_of
from loadline.sizing._budget import MemoryBudget, compute_budget
from loadline.sizing._calibration import CalibrationRow, calibrate

ROOT = Path(__file__).resolve().parent
DEFAULTS = [
    ROOT.parents[1] / "shared" / "calibration" / "vllm_0.19_h100_80gb.csv",
    ROOT / "data" / "vllm_public_runs.csv",
]
THRESHOLDS = (1, 3, 5)


@dataclass(frozen=True)
class Replayed:
    row: CalibrationRow
    key: tuple[str, str, str, str]
    prior: int  # earlier observations of the same key
    error_none: float
    error_corrected: float


def _gpu_of(row: CalibrationRow, raw_gpu: str) -> str:
    """The GPU type a run keys by. The public runs name their GPUs in free text, often not at all; the
    total memory vLLM logged tells the device classes apart as well as a name would, so it is the key
    there (the operator keys by the catalog type it scheduled on)."""
    return f"{row.total_gpu_memory_gib:.2f}GiB" if raw_gpu else "H100-80GB"


def _corrected(row: CalibrationRow, gpu: str, store: CorrectionStore) -> MemoryBudget:
    s, arch = row.settings, row.architecture
    assert s is not None and arch is not None
    found = store.reserves(arch.model_type, s.quantization, row.vllm_version)
    reserves = tuple((g, gib) for g, gib, _ in found if g == gpu)
    return compute_budget(
        arch, s, row.total_gpu_memory_gib, exact_parameters=row.exact_parameters, reserves=reserves, gpu=gpu
    )


def replay(csv_path: Path) -> list[Replayed]:
    import csv

    gpus = {raw["record_id"]: raw.get("gpu", "") for raw in csv.DictReader(csv_path.open(newline=""))}
    store = CorrectionStore()
    out: list[Replayed] = []
    for row in calibrate(csv_path):
        logged = row.logged.get("kv_cache")
        assert row.settings is not None and row.architecture is not None
        gpu = _gpu_of(row, gpus[row.record_id])
        release = re.match(r"\d+\.\d+", row.vllm_version)
        minor = minor_of(release.group(0)) if release else ""
        key = (row.architecture.model_type, gpu, minor, row.settings.quantization)
        if row.vllm_failed or not logged or not re.fullmatch(r"\d+\.\d+", minor):
            continue  # nothing to learn from, or no release to key it by
        prior = len(store.matching(*key))
        corrected = _corrected(row, gpu, store).kv_cache_gib
        out.append(
            Replayed(
                row,
                key,
                prior,
                abs(row.predicted.kv_cache_gib - logged) / logged,
                abs(corrected - logged) / logged,
            )
        )
        store = store.add(
            ObservationRecord(
                family=key[0],
                gpu_type=gpu,
                vllm_minor=minor,
                quantization=key[3],
                model=row.model_id,
                tensor_parallel_size=row.tensor_parallel_size,
                planned_kv_cache_gi_b=row.predicted.kv_cache_gib,
                observed_kv_cache_gi_b=logged,
                source=f"{csv_path.name} {row.record_id}",
            )
        )
    return out


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2%}" if values else "-"


def report(name: str, runs: list[Replayed]) -> list[str]:
    lines = [
        f"### {name}",
        "",
        "| runs with ≥ N earlier observations of their key | runs | median KV error, no corrections | "
        "median KV error, corrected |",
        "|---|---|---|---|",
        f"| all runs (N = 0) | {len(runs)} | {_median([r.error_none for r in runs])} | "
        f"{_median([r.error_corrected for r in runs])} |",
    ]
    for n in THRESHOLDS:
        chosen = [r for r in runs if r.prior >= n]
        lines.append(
            f"| N = {n} | {len(chosen)} | {_median([r.error_none for r in chosen])} | "
            f"{_median([r.error_corrected for r in chosen])} |"
        )
    splits = sorted({r.row.split for r in runs})
    if len(splits) > 1:
        for split in splits:
            part = [r for r in runs if r.row.split == split and r.prior >= 1]
            lines.append(
                f"| {split} split, N = 1 | {len(part)} | {_median([r.error_none for r in part])} | "
                f"{_median([r.error_corrected for r in part])} |"
            )
    keys = sorted({r.key for r in runs if r.prior >= 1})
    lines += ["", "Keys that had observations: " + "; ".join(" × ".join(k) for k in keys), ""]
    return lines


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or DEFAULTS
    for path in paths:
        print("\n".join(report(path.name, replay(path))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
