"""Making the planner fast changed no plan: 300 specs of the benchmark fleet (``benchmarks/_fleet.py``), each
planned from the catalog and as the operator plans it in a known cluster (its shapes and free GPUs), give
plans identical to those saved from the planner before it was optimised (``tests/golden/plans/fleet.json``
holds the digest of every candidate, budget, setting, shape, note, refusal and fix of 3,000 specs;
``benchmarks/plan_fleet.py --check-golden tests/golden/plans/fleet.json`` checks all of them)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import _fleet

GOLDEN = Path(__file__).resolve().parent / "golden" / "plans" / "fleet.json"


def test_fleet_sample_plans_are_unchanged() -> None:
    saved = json.loads(GOLDEN.read_text(encoding="utf-8"))
    raw = _fleet.build_specs(saved["fleet"], saved["seed"])
    # The specs saved with a cluster variant too: every tenth of the sample, 300 of them.
    indexes = sorted({row["index"] for row in saved["plans"] if row["cluster"]})
    rows = [row for row in saved["plans"] if row["index"] in set(indexes)]
    assert len(indexes) == 300
    specs = dict(zip(indexes, _fleet.planning_specs([raw[i] for i in indexes]), strict=True))
    changed = []
    for row in rows:
        assert _fleet.digest(raw[row["index"]]) == row["spec"], f"the fleet's spec #{row['index']} changed"
        record = _fleet.plan_record(specs[row["index"]], row["cluster"])
        if _fleet.digest(record) != row["digest"]:
            where = f"#{row['index']} ({row['model']}, cluster={row['cluster']})"
            changed.append(f"{where}: {row['brief']} → {_fleet.brief(record)}")
    assert not changed, f"{len(changed)} of {len(rows)} plans changed:\n" + "\n".join(changed[:20])
