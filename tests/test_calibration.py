"""The sizer against real vLLM 0.19 start-up logs on H100 (../shared/calibration).

The table is printed on every run (it is what docs/sizing.md quotes); the assertions are the
accuracy targets users rely on when they trust a plan.
"""

from __future__ import annotations

import pytest

from loadline.sizing._calibration import CalibrationRow, calibrate, format_table, median_abs_error
from tests.conftest import CALIBRATION

CSV = CALIBRATION / "vllm_0.19_h100_80gb.csv"


@pytest.fixture(scope="module")
def rows() -> list[CalibrationRow]:
    if not CSV.exists():
        pytest.fail(f"calibration data missing: {CSV} (CI clones shared/ beside the repo)")
    return calibrate(CSV)


def test_prints_the_calibration_table(rows: list[CalibrationRow], capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print("\n\nCalibration against", CSV.name)
        print(format_table(rows))
    assert len(rows) == 38


def test_median_weights_error_within_3_percent(rows: list[CalibrationRow]) -> None:
    assert median_abs_error(rows, "weights") <= 0.03


def test_median_kv_cache_error_within_5_percent(rows: list[CalibrationRow]) -> None:
    assert median_abs_error(rows, "kv_cache") <= 0.05


def test_configs_vllm_refused_are_never_planned_as_fitting(rows: list[CalibrationRow]) -> None:
    failed = [row for row in rows if row.vllm_failed]
    assert failed, "the calibration data holds start-up failures (P26, P27)"
    for row in failed:
        assert not row.predicted.fits, f"{row.record_id} failed in vLLM but we say it fits"


def test_configs_vllm_started_are_planned_as_fitting(rows: list[CalibrationRow]) -> None:
    wrong = [row.record_id for row in rows if not row.vllm_failed and not row.predicted.fits]
    assert wrong == []
