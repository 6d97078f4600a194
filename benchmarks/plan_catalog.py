"""Plan the whole model catalog on every GPU type and print, per model, the shape, price and tuning.

Each model is planned alone on each GPU type of the catalog (any provider, up to 64 GPUs, multi-node
allowed) at ``maxModelLen`` min(8192, the model's window) × concurrency 8, the shape of a small chat
service; then across all GPU types together, which is the plan loadline would pick. A line per plan:

    GPU  layout  shape (provider) × instances  $/h per replica (?: unverified)  seqs/tokens/util[/eager]  KV

or the refusal's first fix. The last line times it. Run: `make bench`.
"""

from __future__ import annotations

import time

from loadline.api import parse_spec
from loadline.errors import NoFeasiblePlanError
from loadline.sizing import Plan, gpu_catalog, model_catalog, plan_inference_model
from loadline.sizing._arch import parse_hf_config

LENGTH = 8192
CONCURRENCY = 8


def _line(gpu: str, plan: Plan) -> str:
    c, s = plan.chosen, plan.settings
    shape = c.shape
    where = f"{c.instances}×{shape.name} ({shape.provider})" if shape is not None else "-"
    price = f"${c.price_per_hour:.2f}/h" if c.priced else "no price"
    if c.shape is not None and c.shape.unverified_price:
        price += "?"  # no dated source for this figure (node_shapes.json price_verified: false)
    tuned = f"seqs {s.max_num_seqs}/tokens {s.max_num_batched_tokens}/util {s.gpu_memory_utilization}"
    if s.enforce_eager:
        tuned += "/eager"
    changed = "" if plan.summary().tuning[0].startswith("vLLM's defaults serve") else " (tuned)"
    return (
        f"  {gpu:<10} {c.label:<28} {where:<34} {price:>10}  {tuned}{changed}"
        f"  KV {plan.budget.max_concurrency:.1f} seqs"
    )


def main() -> None:
    models = sorted({m.id: m for m in model_catalog().values()}.values(), key=lambda m: m.id)
    gpus = list(gpu_catalog())
    plans = refused = 0
    start = time.perf_counter()
    for model in models:
        arch = parse_hf_config(model.config)
        length = min(LENGTH, arch.max_position_embeddings or LENGTH)
        print(f"{model.id} (maxModelLen {length} × concurrency {CONCURRENCY})")
        for gpu in [*gpus, "any"]:
            spec = parse_spec(
                {
                    "model": {"name": model.id},
                    "maxModelLen": length,
                    "concurrency": CONCURRENCY,
                    "gpu": {"types": [] if gpu == "any" else [gpu]},
                }
            )
            try:
                plan = plan_inference_model(spec)
            except NoFeasiblePlanError as exc:
                refused += 1
                fix = str(exc).split("(fix: ", 1)[-1][:-1].split("; or ", 1)[0]
                print(f"  {gpu:<10} refused; fix: {fix}")
                continue
            plans += 1
            print(_line(gpu, plan))
    elapsed = time.perf_counter() - start
    total = plans + refused
    print(
        f"planned {total} (model, GPU) pairs over {len(models)} models × {len(gpus)} GPU types + any: "
        f"{plans} plans, {refused} refusals with a fix, in {elapsed:.2f} s "
        f"({elapsed / total * 1e3:.2f} ms each)"
    )


if __name__ == "__main__":
    main()
