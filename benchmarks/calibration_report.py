"""Print the sizer-vs-vLLM calibration table (Markdown) that docs/sizing.md quotes.

Run: `.venv/bin/python benchmarks/calibration_report.py [CSV]`; default: ../shared/calibration's H100 file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from loadline.sizing._calibration import calibrate, format_table

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "vllm_0.19_h100_80gb.csv"


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    print(format_table(calibrate(path)))


if __name__ == "__main__":
    main()
