"""The sizer against public vLLM start-up logs beyond 0.19 on H100 (benchmarks/data/vllm_public_runs.csv).

The split is the hash rule, not a choice; the held-out floors are what was measured on 2026-11-23
with 26 rows, 4 of them held out (docs/sizing.md), so a change that makes held-out sizing worse fails
here. They are floors, not the issue's goal (KV budget <= 5 %), which the held-out rows do not meet yet.
"""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest

from loadline.sizing._arch import parse_hf_config
from loadline.sizing._budget import EngineSettings, compute_budget
from loadline.sizing._calibration import CalibrationRow, calibrate, median_abs_error, split_for
from loadline.sizing._data import coefficients, find_catalog_model
from tests.conftest import REPO

CSV = REPO / "benchmarks" / "data" / "vllm_public_runs.csv"

#: Held-out medians measured 2026-11-23 over H08, H09, H10, H20 (weights 0.19 %, KV budget 7.78 %), with
#: a little room for rounding in the logs; the issue's goals are 3 % and 5 %. (With H08-H10 alone they
#: were 0.22 % and 12.6 %; H20, the fourth held-out row, moved the median.)
HELDOUT_WEIGHTS_FLOOR = 0.005
HELDOUT_KV_FLOOR = 0.08


@pytest.fixture(scope="module")
def rows() -> list[CalibrationRow]:
    return calibrate(CSV)


def test_every_row_names_its_source_and_quotes_its_memory_lines() -> None:
    with CSV.open(newline="") as handle:
        raws = list(csv.DictReader(handle))
    assert len(raws) >= 26
    for raw in raws:
        assert raw["source_url"] and raw["source_group"], raw["record_id"]
        assert raw["engine"] in {"v0", "v1"}, raw["record_id"]
        # every logged figure appears in the quoted log text, rounded to the 2 decimals vLLM's profiling
        # lines print or verbatim (V1's "Model loading took 14.2488 GiB" is the only weights line it prints)
        for column in ("weights_gib", "kv_cache_gib", "activation_peak_gib"):
            if raw[column]:
                shown = (f"{float(raw[column]):.2f}", raw[column])
                assert any(text in raw["quote"] for text in shown), (raw["record_id"], column)


def test_split_is_the_hash_rule(rows: list[CalibrationRow]) -> None:
    with CSV.open(newline="") as handle:
        groups = {raw["record_id"]: raw["source_group"] for raw in csv.DictReader(handle)}
    for row in rows:
        assert row.split == split_for(groups[row.record_id])
    assert {row.split for row in rows} == {"calibrate", "heldout"}


def test_heldout_weights_median_within_floor(rows: list[CalibrationRow]) -> None:
    held = [row for row in rows if row.split == "heldout"]
    assert median_abs_error(held, "weights") <= HELDOUT_WEIGHTS_FLOOR


def test_heldout_kv_budget_median_within_measured_floor(rows: list[CalibrationRow]) -> None:
    held = [row for row in rows if row.split == "heldout"]
    assert median_abs_error(held, "kv_cache") <= HELDOUT_KV_FLOOR


def test_runs_vllm_refused_are_not_planned_as_fitting(rows: list[CalibrationRow]) -> None:
    # H08: Llama-3.1-8B at 131072 tokens on a 24 GB card, "larger than the maximum number of tokens"
    refused = [row for row in rows if row.vllm_failed]
    assert refused
    assert all(not row.predicted.fits for row in refused)


def test_v0_accounting_differs_from_v1_where_vllm_does() -> None:
    """V0's profile (no chunked-prefill budget, sampler over max_num_seqs) and non-torch differ."""
    v0, v1 = coefficients("v0"), coefficients("v1")
    assert v0 != v1
    entry = find_catalog_model("Qwen/Qwen2.5-1.5B-Instruct")
    assert entry is not None
    arch = parse_hf_config(entry.config)
    settings = EngineSettings(
        dtype="float16",
        quantization="none",
        kv_cache_dtype="auto",
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        gpu_memory_utilization=0.5,
        max_model_len=32768,
        max_num_seqs=256,
        max_num_batched_tokens=32768,
        enforce_eager=False,
        cuda_graph_in_kv_budget=False,
        block_size=16,
    )
    as_v1 = compute_budget(arch, settings, 14.56)
    as_v0 = compute_budget(arch, replace(settings, engine="v0"), 14.56)
    assert as_v0.weights_gib == as_v1.weights_gib  # the weights are the same tensors
    assert as_v0.activation_gib != as_v1.activation_gib
    assert as_v0.kv_cache_gib != as_v1.kv_cache_gib


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown vLLM engine"):
        coefficients("v2")


def test_tensor_parallel_splits_the_weights(rows: list[CalibrationRow]) -> None:
    by_id = {row.record_id: row for row in rows}
    tp1, tp2 = by_id["H01"], by_id["H02"]  # the same model and GPU, TP 1 and 2 (vLLM PR #10511)
    assert tp2.predicted.weights_gib == pytest.approx(tp1.predicted.weights_gib / 2, rel=0.01)
    assert tp2.logged["weights"] == pytest.approx(tp1.logged["weights"] / 2, rel=0.01)
