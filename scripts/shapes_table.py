"""Print, or write into ``docs/sizing.md``, the node-shape table generated from ``node_shapes.json``.

Why: the table in the docs is the data's, so it is made from the data rather than typed. One row per
shape in the file's order: name, provider, GPUs, host memory, vCPUs, price (``:g``, "—" when null), GPU
link, fabric and the price's standing: ``verified (price_as_of)``, ``**unverified**`` (a figure with no
dated source) or ``null``. The counts line above the table is checked by ``tests/test_shapes.py``.

Usage: ``python scripts/shapes_table.py`` prints the table; ``--write`` replaces the table in
``docs/sizing.md`` (the lines from its header row to the first line that is not a table row).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "operator/loadline/sizing/data/node_shapes.json"
DOC = REPO / "docs/sizing.md"
HEADER = "| shape | provider | GPUs | host memory | vCPU | $/h | GPU link | fabric | price |"


def standing(row: dict[str, Any]) -> str:
    if row["price_verified"]:
        return f"verified ({row['price_as_of']})"
    return "null" if row["price_per_hour"] is None else "**unverified**"


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [HEADER, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        price = "—" if r["price_per_hour"] is None else f"{r['price_per_hour']:g}"
        lines.append(
            f"| {r['name']} | {r['provider']} | {r['gpus']}×{r['gpu']} | {r['memory']} | {r['vcpus']} | "
            f"{price} | {r['interconnect']} | {r['rdma']} | {standing(r)} |"
        )
    return lines


def main(argv: list[str]) -> int:
    rows = json.loads(DATA.read_text())["shapes"]
    lines = table(rows)
    if "--write" not in argv:
        print("\n".join(lines))
        return 0
    doc = DOC.read_text().split("\n")
    start = doc.index(HEADER)
    end = start
    while end < len(doc) and doc[end].startswith("|"):
        end += 1
    DOC.write_text("\n".join([*doc[:start], *lines, *doc[end:]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
