"""Print the sizer-vs-vLLM calibration tables (Markdown) that docs/sizing.md quotes.

Run: `.venv/bin/python benchmarks/calibration_report.py [CSV]`; default: ../shared/calibration's H100 file.
`--public` prints the public runs beyond 0.19/H100 (benchmarks/data/vllm_public_runs.csv) per row and
the median errors per split and group; the held-out rows are the honest figure, the calibrate rows
are what the V0 coefficients were fitted to. `--fit-v0` prints the V0 coefficients a least-squares
fit to the *calibrate* rows' logged activation and non-torch figures gives (never the held-out ones).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from loadline.sizing._arch import parse_hf_config
from loadline.sizing._calibration import (
    CalibrationRow,
    calibrate,
    format_group_table,
    format_table,
)
from loadline.sizing._data import find_catalog_model

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "vllm_0.19_h100_80gb.csv"
PUBLIC = Path(__file__).resolve().parent / "data" / "vllm_public_runs.csv"
GIB = 1024**3


def fit_v0(path: Path) -> str:
    """Least-squares V0 activation coefficients and median non-torch figures, from calibrate rows only.

    The activation peak is modelled as ``copies x max_num_seqs x vocab x 4`` (the sampler's float32
    logits) ``+ tokens x dtype bytes x (a x hidden + b x intermediate / TP)``; the three unknowns are
    solved from the calibrate rows' logged peaks (normal equations, no numpy needed).
    """
    import csv

    rows = [row for row in calibrate(path) if row.split == "calibrate" and row.engine == "v0"]
    raws = {raw["record_id"]: raw for raw in csv.DictReader(path.open(newline=""))}
    xs: list[list[float]] = []
    ys: list[float] = []
    for row in rows:
        raw = raws[row.record_id]
        entry = find_catalog_model(raw["config_key"])
        assert entry is not None
        arch = parse_hf_config(entry.config)
        if arch.is_moe:
            continue  # the routed-expert term is V1's; too few V0 MoE rows to fit it
        tokens = float(raw["max_num_batched_tokens"])
        elem = 4.0 if raw["dtype"] == "float32" else 2.0
        tp = float(raw["tensor_parallel_size"])
        xs.append(
            [
                float(raw["max_num_seqs"]) * arch.vocab_size * 4.0 / GIB,
                tokens * elem * arch.hidden_size / GIB,
                tokens * elem * arch.intermediate_size / tp / GIB,
            ]
        )
        ys.append(row.logged["activation"])
    n = len(xs[0])
    ata = [[sum(x[i] * x[j] for x in xs) for j in range(n)] for i in range(n)]
    aty = [sum(x[i] * y for x, y in zip(xs, ys, strict=True)) for i in range(n)]
    # Gaussian elimination on the 3x3 normal equations.
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(ata[r][col]))
        ata[col], ata[pivot] = ata[pivot], ata[col]
        aty[col], aty[pivot] = aty[pivot], aty[col]
        for r in range(n):
            if r != col and ata[col][col]:
                f = ata[r][col] / ata[col][col]
                ata[r] = [a - f * b for a, b in zip(ata[r], ata[col], strict=True)]
                aty[r] -= f * aty[col]
    coef = [aty[i] / ata[i][i] for i in range(n)]
    tp1 = [r.logged["non_torch"] for r in rows if r.tensor_parallel_size == 1 and r.logged["non_torch"]]
    tpn = [r for r in rows if r.tensor_parallel_size > 1 and r.logged["non_torch"]]
    return "\n".join(
        [
            f"V0 calibrate rows used: {len(xs)} for the activation fit, {len(rows)} in all",
            f"sampler_logit_copies {coef[0]:.3f}",
            f"forward_bytes_per_token_hidden {coef[1]:.3f}",
            f"forward_bytes_per_token_intermediate {coef[2]:.3f}",
            f"non-torch TP=1 median {statistics.median(tp1):.3f} GiB over {len(tp1)} rows",
            "non-torch TP>1: "
            + ", ".join(f"{r.record_id} TP{r.tensor_parallel_size} {r.logged['non_torch']:.2f}" for r in tpn),
        ]
    )


#: The public rows the V0 coefficients in engine.json (``model_v0``) were fitted to (``--fit-v0`` on
#: 2026-11-23, before H11 on existed). The V1 coefficients were fitted to the H100 0.19 set alone, so no
#: public row entered any fit except these; the rest of the calibrate side is out of sample too.
FITTED_V0_ROWS = frozenset({"H01", "H02", "H03", "H04", "H05", "H06", "H07"})
#: The public rows the non-torch figures by interconnect (engine.json ``non_torch_gib_tp_base_pcie``
#: and ``model_v0``'s NVLink figure) were fitted to: V1 PCIe H13/H14, V0 NVLink H02/H21.
FITTED_INTERCONNECT_ROWS = frozenset({"H02", "H13", "H14", "H21"})


def public_report(rows: list[CalibrationRow]) -> str:
    parts = []
    for split in ("calibrate", "heldout"):
        chosen = [row for row in rows if row.split == split]
        parts.append(f"### {split} ({len(chosen)} rows)\n\n{format_table(chosen)}\n")
    parts.append(format_group_table(rows))
    fitted = FITTED_V0_ROWS | FITTED_INTERCONNECT_ROWS
    unfitted = [row for row in rows if row.split == "calibrate" and row.record_id not in fitted]
    if unfitted:
        parts.append(
            f"\n### calibrate rows no coefficient was fitted to ({len(unfitted)} rows; "
            f"not held out by the hash rule)\n\n{format_group_table(unfitted)}"
        )
    return "\n".join(parts)


def main() -> None:
    args = sys.argv[1:]
    if "--fit-v0" in args:
        print(fit_v0(PUBLIC))
        return
    if "--public" in args:
        print(public_report(calibrate(PUBLIC)))
        return
    path = Path(args[0]) if args else DEFAULT
    print(format_table(calibrate(path)))


if __name__ == "__main__":
    main()
