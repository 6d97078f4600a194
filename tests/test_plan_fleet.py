"""Making the planner fast changed no plan: 300 specs of the benchmark fleet (``benchmarks/_fleet.py``), each
planned from the catalog and as the operator plans it in a known cluster (its shapes and free GPUs), give
plans identical to those saved from the planner before it was optimised (main's at 6879030, with its
verified-prices-first rule and price data; saved again when prices became each pod's share of its node,
and when the summary gained modelFamily, quantization and kvReserveGiB, every digest first checked equal
with those three keys left out;
``tests/golden/plans/fleet.json``
holds the digest of every candidate, budget, setting, shape, note, refusal and fix of 3,000 specs;
``benchmarks/plan_fleet.py --check-golden tests/golden/plans/fleet.json`` checks all of them)."""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections.abc import Iterator
from pathlib import Path

from benchmarks import _fleet

from loadline.sizing import (
    GPUType,
    SpecInputs,
    gpu_catalog,
    plan_inference_model,
    resolve_inputs,
    resolve_model,
    tune,
)
from loadline.sizing._plan import _cheapest, _layouts_for, _verdicts, plan_candidates
from loadline.sizing._tune import (
    concurrency_ceiling,
    largest_int,
    longest_serving,
    serves_at,
    serves_concurrencies,
    serves_lengths,
    terms_for,
)

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


def test_plans_are_the_same_from_empty_memos_and_from_full_ones() -> None:
    specs = _fleet.planning_specs(_fleet.build_specs(150, seed=7))
    _fleet.clear_caches()
    cold = [_fleet.digest(_fleet.plan_record(spec)) for spec in specs]
    warm = [_fleet.digest(_fleet.plan_record(spec)) for spec in specs]
    in_cluster = [_fleet.digest(_fleet.plan_record(spec, True)) for spec in specs[:40]]
    assert warm == cold
    _fleet.clear_caches()
    assert [_fleet.digest(_fleet.plan_record(spec, True)) for spec in specs[:40]] == in_cluster


def test_a_plans_candidates_are_built_when_read_and_are_those_of_plan_candidates() -> None:
    spec = _fleet.planning_specs(
        [
            {
                "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
                "maxModelLen": 32768,
                "concurrency": 16,
                "engine": {"version": "0.19.0"},
            }
        ]
    )[0]
    plan = plan_inference_model(spec)
    assert "candidates" in plan.__dict__ and not isinstance(
        plan.__dict__["candidates"], tuple
    )  # not built yet
    candidates = plan.candidates
    assert plan.candidates is candidates and isinstance(candidates, tuple)  # built once, kept
    assert plan.chosen in candidates and plan.rejected
    eager = plan_candidates(plan.inputs, list(gpu_catalog()), 64, spec.gpu.allow_multi_node)
    assert [(c.label, c.settings, c.budget, c.shape) for c in candidates] == [
        (c.label, c.settings, c.budget, c.shape) for c in eager
    ]
    again = pickle.loads(pickle.dumps(plan_inference_model(spec)))
    assert again == plan and dataclasses.replace(plan, replicas=3).candidates == candidates


def test_with_rejection_keeps_every_other_field() -> None:
    plan = plan_inference_model(
        _fleet.planning_specs(
            [
                {
                    "model": {"name": "Qwen/Qwen3-8B"},
                    "maxModelLen": 8192,
                    "concurrency": 8,
                    "engine": {"version": "0.19.0"},
                }
            ]
        )[0]
    )
    chosen = plan.chosen
    assert chosen.shape is not None and chosen.pod is not None and chosen.tuning
    assert chosen.with_rejection("no") == dataclasses.replace(chosen, rejection="no")


def every_layout(count: int, seed: int) -> Iterator[tuple[SpecInputs, GPUType, int, int]]:
    """Every layout of every GPU type of the catalog, for ``count`` specs of the fleet (``seed``)."""
    for spec in _fleet.planning_specs(_fleet.build_specs(count, seed=seed)):
        inputs = resolve_inputs(spec, resolve_model(spec))
        arch = inputs.model.architecture
        for gpu in gpu_catalog().values():
            for tp, pp, _ in _layouts_for(
                gpu.max_gpus_per_node, arch.num_attention_heads, arch.num_kv_heads, arch.num_layers, 64, True
            ):
                yield inputs, gpu, tp, pp


def test_feasibility_on_figures_agrees_with_the_full_tuning_ladder() -> None:
    """The planner judges layouts (and refusal fixes probe lengths and concurrencies) without walking
    the ladder: vLLM's defaults or its last rung decide. Here every layout of every GPU type, for a
    sample of the fleet and shorter lengths and lower concurrencies, against :func:`tune`."""
    checked = 0
    for inputs, gpu, tp, pp in every_layout(60, seed=11):
        assert serves_at(inputs, gpu, tp, pp) == tune(inputs, gpu, tp, pp).serves
        lengths = serves_lengths(inputs, gpu, tp, pp)
        concurrencies = serves_concurrencies(inputs, gpu, tp, pp)
        for length in {1, 512, inputs.max_model_len // 3, inputs.max_model_len}:
            shorter = dataclasses.replace(inputs, max_model_len=length)
            assert lengths(length) == tune(shorter, gpu, tp, pp).serves
        for concurrency in {1, 7, inputs.concurrency // 2 or 1, inputs.concurrency}:
            fewer = dataclasses.replace(inputs, concurrency=concurrency)
            assert concurrencies(concurrency) == tune(fewer, gpu, tp, pp).serves
        checked += 1
    assert checked > 1000


def test_the_longest_length_worked_out_is_the_one_searched() -> None:
    """Refusal fixes work the longest max-model-len a layout serves out (no sliding window) instead of
    searching it: the same answer as the binary search over every length, for every layout of every
    GPU type of a sample of the fleet and several upper bounds."""
    checked = 0
    for inputs, gpu, tp, pp in every_layout(80, seed=12):
        works = serves_lengths(inputs, gpu, tp, pp)
        for high in {0, 1, 17, 512, inputs.max_model_len - 1, inputs.max_model_len * 4}:
            assert longest_serving(inputs, gpu, tp, pp, high) == largest_int(1, high, works)
            checked += 1
    assert checked > 5000


def test_feasibility_falls_as_concurrency_rises_and_stops_at_its_ceiling() -> None:
    """Refusal fixes search the concurrencies a layout serves only above the best found yet and up to
    :func:`concurrency_ceiling`, which gives the same largest only if feasibility is true, then false,
    as the concurrency rises, and false above the ceiling: every concurrency up to the spec's, and the
    two past the ceiling, for every layout of every GPU type of a sample of the fleet."""
    checked = 0
    for inputs, gpu, tp, pp in every_layout(40, seed=14):
        works = serves_concurrencies(inputs, gpu, tp, pp)
        ceiling = concurrency_ceiling(inputs, gpu, tp, pp)
        served = [works(n) for n in range(1, inputs.concurrency + 2)]
        assert served == sorted(served, reverse=True)  # true, then false
        assert not any(served[ceiling:]) and not works(ceiling + 1) and not works(ceiling + 2)
        checked += 1
    assert checked > 1000


def test_the_cheapest_layout_searched_is_the_first_feasible_of_all() -> None:
    """A plan judges only the layouts that might beat the cheapest feasible one found (branch and
    bound over GPU types): the verdict it picks is the first feasible of every layout judged and sorted,
    from the catalog's shapes, from a known cluster's (no free GPUs given), and over the whole catalog
    up to 64 GPUs across nodes as refusal fixes search it."""
    shapes, _ = _fleet.cluster()
    checked = 0
    for spec in _fleet.planning_specs(_fleet.build_specs(400, seed=13)):
        base = resolve_inputs(spec, resolve_model(spec))
        names = list(spec.gpu.types) or list(gpu_catalog())
        limit = spec.gpu.max_gpus_per_replica or 64
        for inputs in (base, dataclasses.replace(base, cluster=shapes)):
            terms = terms_for(inputs)
            for gpus, limit_, multi_node in (
                (names, limit, spec.gpu.allow_multi_node),
                (list(gpu_catalog()), 64, True),
            ):
                every = _verdicts(inputs, gpus, limit_, multi_node, 1, 0.0, "", terms)
                first = next((v for v in every if v[4]), None)
                found = _cheapest(inputs, gpus, limit_, multi_node, 0.0, "", terms)
                assert (found is None) == (first is None)
                if found is not None and first is not None:
                    assert found[:6] == first[:6] and found[6] == first[6]
                checked += 1
    assert checked == 1600
