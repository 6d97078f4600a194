"""Print how long loadline takes to plan 1,000 InferenceModels (goal: under 1 s in total).

The specs cycle through the bundled model catalog with varied max-model-len, concurrency, dtype and
GPU allow-lists, so the planner walks its real candidate lists. Run: `make bench`.
"""

from __future__ import annotations

import itertools
import statistics
import time

from loadline.api import parse_spec
from loadline.errors import LoadlineError
from loadline.sizing import model_catalog, plan_inference_model
from loadline.sizing._arch import parse_hf_config

GPU_SETS = ([], ["L4", "L40S"], ["A100-80GB", "H100-80GB"], ["L4", "L40S", "A100-80GB", "H100-80GB", "H200"])
LENGTHS = (2048, 8192, 32768)
CONCURRENCY = (1, 4, 16, 64)


def build_specs(count: int) -> list[dict[str, object]]:
    models = sorted({m.id for m in model_catalog().values()})
    specs = []
    combos = itertools.cycle(itertools.product(LENGTHS, CONCURRENCY, GPU_SETS, models))
    for length, concurrency, gpus, model in itertools.islice(combos, count):
        arch = parse_hf_config(model_catalog()[model.lower()].config)
        limit = arch.max_position_embeddings or length
        specs.append(
            {
                "model": {"name": model},
                "maxModelLen": min(length, limit),
                "concurrency": concurrency,
                "gpu": {"types": gpus},
            }
        )
    return specs


def main() -> None:
    specs = [parse_spec(s) for s in build_specs(1000)]
    runs = []
    outcomes: dict[str, int] = {}
    for _ in range(5):
        outcomes = {"planned": 0, "no feasible plan": 0}
        start = time.perf_counter()
        for spec in specs:
            try:
                plan_inference_model(spec)
                outcomes["planned"] += 1
            except LoadlineError:
                outcomes["no feasible plan"] += 1
        runs.append(time.perf_counter() - start)
    models = len({s.model.name for s in specs})
    print(f"planned 1,000 InferenceModels ({outcomes}) over {models} catalog models")
    median = statistics.median(runs)
    print(f"total per 1,000: best {min(runs):.3f} s, median {median:.3f} s (5 runs; goal < 1 s)")
    # The planner memoises budgets and layouts (as an operator re-planning unchanged models does), so
    # runs after the first are warm; the first is what a thousand new models cost.
    print(f"first run (memo caches cold): {runs[0]:.3f} s")
    print(f"per model: median {statistics.median(runs) / len(specs) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
