"""Node shapes: a plan names an instance type its pod fits, and its price is the pod's share of it (or the
whole instance when the pod leaves no room for another GPU pod, or the spec asks for dedicated nodes)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadline.api import parse_inference_model
from loadline.render import render_manifests
from loadline.sizing import Plan, find_gpu, node_shapes, plan_inference_model
from loadline.sizing._data import GPU_CATALOG_ENV, gpu_catalog
from loadline.sizing._shapes import (
    ClusterShapes,
    PodRequest,
    charge_text,
    choose_shape,
    node_charge,
    reserve,
    smallest_gpu_pod,
)
from tests.conftest import inference_model

REPO = Path(__file__).resolve().parents[1]
CHAT = {"maxModelLen": 8192, "concurrency": 4, "gpu": {"types": ["L4", "L40S", "A100-80GB", "H100-80GB"]}}


def plan(**spec: Any) -> Plan:
    return plan_inference_model(parse_inference_model(inference_model(**spec)).spec)


def shape_of(result: Plan) -> dict[str, Any]:
    shape = result.summary().model_dump(by_alias=True, mode="json")["nodeShape"]
    assert shape is not None
    return dict(shape)


def test_allocatable_memory_follows_the_published_reserve_tiers() -> None:
    # 16 GiB: 25 % of 4 + 20 % of 4 + 10 % of 8 = 2.6 GiB, 100 MiB eviction, 1 GiB for DaemonSets.
    assert reserve().memory_gib(16) == pytest.approx(2.6 + 100 / 1024 + 1.0)
    g6 = next(s for s in node_shapes()["L4"] if s.name == "g6.xlarge")
    assert g6.memory_gib == 16 and g6.allocatable_memory_gib == pytest.approx(12.3, abs=0.01)
    # 4 vCPU: 6 % + 1 % + 2 × 0.5 % of a core = 0.08, plus 0.5 for DaemonSets.
    assert g6.allocatable_cpu == pytest.approx(4 - 0.08 - 0.5)


def test_every_shape_names_a_catalog_gpu_and_a_source() -> None:
    raw = json.loads((REPO / "operator/loadline/sizing/data/node_shapes.json").read_text())
    for row in raw["shapes"]:
        assert find_gpu(row["gpu"]).name == row["gpu"]
        assert row["source"] and row["price_source"], row["name"]
        if row["provider"] == "onprem":
            assert row["price_per_hour"] is None  # bought, not rented: no invented hourly figure
        if row["price_verified"]:
            # A verified price names where it was read and the date that source states.
            assert row["price_per_hour"] is not None and "https://" in row["price_source"], row["name"]
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["price_as_of"] or ""), row["name"]
        elif row["price_per_hour"] is not None:
            assert row["price_source"].startswith("UNVERIFIED"), row["name"]
            assert row["price_as_of"] is None, row["name"]
    for gpu in gpu_catalog().values():
        assert node_shapes()[gpu.name], gpu.name


def test_the_chat_example_no_longer_assumes_an_instance_its_pod_does_not_fit() -> None:
    result = plan(**{**CHAT, "gpu": {**CHAT["gpu"], "providers": ["aws"]}})
    shape = shape_of(result)
    assert result.chosen.gpu.name == "L4" and result.chosen.gpus == 1
    assert shape["podMemoryGiB"] == 22  # 15 GiB of weights + /dev/shm + engine processes
    assert shape["name"] == "g6.2xlarge" and shape["allocatableMemoryGiB"] >= shape["podMemoryGiB"]
    assert shape["allocatableCPU"] >= shape["podCPU"]
    # The 16 GiB g6.xlarge was cheaper, and the plan says why it was not taken.
    assert "g6.xlarge: 16 GiB host memory (12.3 allocatable) < 22 GiB the pod needs" in shape["why"]
    # The price is the instance's, not a per-GPU figure.
    assert (
        result.summary().model_dump(by_alias=True, mode="json")["pricePerHour"]
        == round(shape["pricePerHour"], 2)
        == 0.98
    )


def test_the_rendered_pod_asks_what_the_plan_checked_against_the_shape() -> None:
    obj = parse_inference_model(inference_model(**CHAT))
    result = plan_inference_model(obj.spec)
    shape = shape_of(result)
    deployment = next(o for o in render_manifests(obj, result) if o["kind"] == "Deployment")
    requests = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["memory"] == f"{shape['podMemoryGiB']}Gi"
    assert requests["cpu"] == str(shape["podCPU"])
    assert shape["allocatableMemoryGiB"] >= shape["podMemoryGiB"]


def test_two_l4_on_aws_pay_half_the_four_gpu_instance_and_leave_two_gpus_to_other_pods() -> None:
    result = plan(
        maxModelLen=8192, concurrency=8, gpu={"types": ["L4"], "providers": ["aws"], "maxGPUsPerReplica": 2}
    )
    shape = shape_of(result)
    assert result.chosen.gpus == 2 and shape["name"] == "g6.12xlarge" and shape["gpusPerNode"] == 4
    assert shape["pricePerHour"] == 4.6016 and result.chosen.price_per_hour == pytest.approx(4.6016 / 2)
    assert shape["chargedShare"] == 0.5 and shape["wholeNode"] is False
    assert "2 of 4 GPUs per instance left to other pods" in shape["why"]
    assert (
        result.summary().model_dump(by_alias=True, mode="json")["priceBasis"]
        == "$2.30/h: 1/2 of g6.12xlarge's $4.60/h (GPU share)"
    )


def test_every_feasible_candidate_is_priced_by_its_charge_of_its_instances() -> None:
    result = plan(model={"name": "meta-llama/Llama-3.3-70B-Instruct"}, maxModelLen=8192, concurrency=4)
    for c in result.candidates:
        if c.shape is not None and c.shape.price_per_hour is not None and c.pod is not None:
            charge = node_charge(c.shape, c.pod)
            assert c.charge == charge
            assert c.price_per_hour == pytest.approx(c.shape.price_per_hour * charge.share * c.instances)
            assert c.shape.allocatable_memory_gib >= c.pod.memory_gib


H100_CHAT = {**CHAT, "gpu": {"types": ["H100-80GB"], "providers": ["aws"]}}


def test_a_one_gpu_model_on_an_eight_gpu_instance_pays_an_eighth_of_it() -> None:
    # An 8B model on one H100: the other seven GPUs of the p5.48xlarge serve other pods.
    result = plan(**H100_CHAT)
    shape = shape_of(result)
    assert shape["name"] == "p5.48xlarge" and result.chosen.gpus == 1
    assert (
        result.summary().model_dump(by_alias=True, mode="json")["pricePerHour"] == 6.88
    )  # not the whole node's $55.04/h
    assert (
        result.summary().model_dump(by_alias=True, mode="json")["priceBasis"]
        == "$6.88/h: 1/8 of p5.48xlarge's $55.04/h (GPU share)"
    )
    assert shape["chargedShare"] == 0.125 and shape["wholeNode"] is False
    # status.plan carries the same (the operator writes it through the API model).
    status = result.summary()
    assert status.price_basis.startswith("$6.88/h: 1/8 of p5.48xlarge")
    assert status.node_shape is not None and status.node_shape.whole_node is False


def test_dedicated_nodes_pay_the_whole_node_and_say_so() -> None:
    result = plan(**{**H100_CHAT, "gpu": {**H100_CHAT["gpu"], "dedicatedNodes": True}})
    shape = shape_of(result)
    assert (
        shape["name"] == "p5.48xlarge"
        and result.summary().model_dump(by_alias=True, mode="json")["pricePerHour"] == 55.04
    )
    assert result.summary().model_dump(by_alias=True, mode="json")["priceBasis"] == (
        "$55.04/h: whole node, p5.48xlarge's $55.04/h (spec.gpu.dedicatedNodes: the node runs this pod alone)"
    )
    assert shape["wholeNode"] is True and shape["chargedShare"] == 1.0
    assert "7 of 8 GPUs per instance stay idle" in shape["why"]


P5 = "p5.48xlarge"  # 8 GPUs, 1999.18 GiB and 190.95 CPU allocatable


def p5() -> Any:
    return next(s for s in node_shapes()["H100-80GB"] if s.name == P5)


def test_the_largest_of_gpu_memory_and_cpu_shares_is_charged() -> None:
    shape = p5()
    gpu = node_charge(shape, PodRequest(gpus=2, memory_gib=100, cpu=5, shm_gib=4))
    assert (gpu.share, gpu.basis) == (0.25, "GPU")
    memory = node_charge(shape, PodRequest(gpus=1, memory_gib=1000, cpu=3, shm_gib=2))
    assert memory.basis == "host-memory"
    assert memory.share == pytest.approx(1000 / shape.allocatable_memory_gib)
    cpu = node_charge(shape, PodRequest(gpus=1, memory_gib=16, cpu=96, shm_gib=2))
    assert cpu.basis == "CPU" and cpu.share == pytest.approx(96 / shape.allocatable_cpu)
    text = charge_text(shape, PodRequest(gpus=1, memory_gib=1000, cpu=3, shm_gib=2), 1, memory)
    assert (
        text
        == "$27.53/h: 50.0% of p5.48xlarge's $55.04/h (host-memory share: 1000 of 1999.2 GiB allocatable)"
    )


def test_a_pod_that_leaves_no_room_for_another_gpu_pod_pays_the_whole_node() -> None:
    shape = p5()
    least = smallest_gpu_pod()
    assert (least.gpus, least.memory_gib, least.cpu) == (1, 16, 3)  # pod_request of one GPU, nothing else
    every_gpu = node_charge(shape, PodRequest(gpus=8, memory_gib=200, cpu=17, shm_gib=16))
    assert every_gpu.whole and every_gpu.why == "the pod takes all 8 GPUs"
    # Seven GPUs left, but 10 GiB of allocatable memory: no GPU pod fits beside it.
    memory = node_charge(shape, PodRequest(gpus=1, memory_gib=1989, cpu=3, shm_gib=2))
    assert memory.whole and "less than the 16 GiB another GPU pod asks" in memory.why
    cpu = node_charge(shape, PodRequest(gpus=1, memory_gib=16, cpu=189, shm_gib=2))
    assert cpu.whole and "less than the 3 another GPU pod asks" in cpu.why
    # Exactly room for one more: shared.
    room = shape.allocatable_memory_gib - least.memory_gib
    assert not node_charge(shape, PodRequest(gpus=1, memory_gib=math.floor(room), cpu=3, shm_gib=2)).whole


def test_the_shape_that_charges_least_wins_not_the_cheapest_instance() -> None:
    # One A100-80GB: an eighth of AWS's p4de.24xlarge ($27.45/h) costs less than GCP's one-GPU
    # a2-ultragpu-1g ($5.07/h), though that instance is cheaper.
    a100 = find_gpu("A100-80GB")
    choice = choose_shape(a100, PodRequest(gpus=1, memory_gib=60, cpu=3, shm_gib=2), 1, 1)
    assert choice.shape is not None and choice.shape.name == "p4de.24xlarge"
    assert choice.price_per_hour == pytest.approx(27.44705 / 8)
    dedicated = choose_shape(a100, PodRequest(gpus=1, memory_gib=60, cpu=3, shm_gib=2), 1, 1, dedicated=True)
    assert dedicated.shape is not None and dedicated.shape.name == "a2-ultragpu-1g"
    assert dedicated.price_per_hour == pytest.approx(5.068798)


def test_tensor_parallel_above_two_takes_nvlink_shapes_and_says_so() -> None:
    result = plan(
        model={"name": "meta-llama/Llama-3.3-70B-Instruct"},
        maxModelLen=16384,
        concurrency=16,
        gpu={"types": ["A100-80GB"]},
    )
    assert result.chosen.tensor_parallel_size > 2
    shape = shape_of(result)
    assert shape["interconnect"] == "nvlink" and "NVLink shape preferred" in shape["why"]


def test_tensor_parallel_over_pcie_is_explained_when_no_nvlink_shape_exists() -> None:
    result = plan(
        model={"name": "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic"},
        maxModelLen=32768,
        concurrency=8,
        kvCacheDtype="fp8",
        gpu={"types": ["L40S"]},
    )
    assert result.chosen.tensor_parallel_size == 4
    shape = shape_of(result)
    assert shape["interconnect"] == "pcie" and "TP 4 over PCIe" in shape["why"]


@pytest.fixture
def user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def use(doc: dict[str, Any]) -> None:
        path = tmp_path / "catalog.json"
        path.write_text(json.dumps(doc))
        monkeypatch.setenv(GPU_CATALOG_ENV, str(path))
        gpu_catalog.cache_clear()

    yield use
    monkeypatch.delenv(GPU_CATALOG_ENV, raising=False)
    gpu_catalog.cache_clear()


def test_a_cheaper_pcie_shape_loses_to_nvlink_for_tp4(user_catalog: Any) -> None:
    cheap = {
        "name": "cheap-pcie-4", "provider": "onprem", "gpu": "A100-80GB", "gpus": 4, "memory": "512Gi",
        "vcpus": 64, "price_per_hour": 1.0, "interconnect": "pcie", "rdma": "none", "source": "test",
        "price_verified": True, "price_source": "https://example.test/quote", "price_as_of": "2026-11-01",
    }  # fmt: skip
    user_catalog({"gpus": [], "shapes": [cheap]})
    a100 = find_gpu("A100-80GB")
    pod = PodRequest(gpus=4, memory_gib=150, cpu=9, shm_gib=8)
    assert choose_shape(a100, pod, 4, 1).shape.nvlink  # type: ignore[union-attr]
    # Two GPUs all-reduce fine over PCIe: there the cheapest shape wins.
    pod2 = PodRequest(gpus=2, memory_gib=80, cpu=5, shm_gib=4)
    assert choose_shape(a100, pod2, 2, 1).shape.name == "cheap-pcie-4"  # type: ignore[union-attr]


def test_multi_node_replicas_take_whole_instances_with_a_fabric() -> None:
    result = plan(
        model={"name": "meta-llama/Llama-3.1-405B"},
        maxModelLen=8192,
        concurrency=4,
        gpu={"types": ["H100-80GB"]},
    )
    shape = shape_of(result)
    assert result.chosen.nodes == 2 and shape["instancesPerReplica"] == 2
    assert shape["rdma"] != "none" and shape["gpusPerNode"] == 8
    assert result.chosen.price_per_hour == pytest.approx(2 * shape["pricePerHour"])


def test_on_prem_shapes_plan_without_a_price() -> None:
    result = plan(**{**CHAT, "gpu": {"types": ["H100-80GB"], "providers": ["onprem"]}})
    shape = shape_of(result)
    assert shape["name"] == "DGX-H100" and shape["pricePerHour"] is None
    assert result.summary().model_dump(by_alias=True, mode="json")["pricePerHour"] == 0.0


def test_a_pod_larger_than_every_shape_is_refused_naming_each_shape() -> None:
    with pytest.raises(Exception) as caught:
        plan(**{**CHAT, "gpu": {"types": ["L4"], "maxGPUsPerReplica": 1}, "resources": {"memoryGiB": 1000}})
    lines = "\n".join(getattr(caught.value, "rejections", []))
    assert "g6.4xlarge: 64 GiB host memory" in lines and "< 1000 GiB the pod needs" in lines


def test_plan_text_names_the_shape_and_the_tuning(capsys: pytest.CaptureFixture[str]) -> None:
    from loadline.cli import main

    assert main(["plan", str(REPO / "examples" / "chat-llama-8b.yaml")]) == 0
    out = capsys.readouterr().out
    assert "node shape: 1 × g2-standard-8 (gcp" in out and "pod asks 22 GiB, 3 CPU" in out
    assert "tuning: vLLM's defaults serve concurrency 4" in out
    assert "  price per replica: $0.85/h: whole node, g2-standard-8's $0.85/h" in out


def _l4_row(name: str, price: float, memory: str = "64Gi", **extra: Any) -> dict[str, Any]:
    """A user catalog L4 shape; without ``price_verified`` its price counts as unverified."""
    return {
        "name": name, "provider": "onprem", "gpu": "L4", "gpus": 1, "memory": memory, "vcpus": 16,
        "price_per_hour": price, "interconnect": "pcie", "rdma": "none", "source": "test",
        "price_source": "UNVERIFIED: a test figure", **extra,
    }  # fmt: skip


CHAT_POD = PodRequest(gpus=1, memory_gib=22, cpu=3, shm_gib=2)


def test_a_verified_price_beats_a_cheaper_unverified_one_across_providers(user_catalog: Any) -> None:
    user_catalog({"gpus": [], "shapes": [_l4_row("cheap-l4", 0.10)]})
    l4 = find_gpu("L4")
    # Every provider compared (loadline plan without --provider): the cheapest verified shape wins.
    choice = choose_shape(l4, CHAT_POD, 1, 1)
    assert choice.shape is not None and choice.shape.name == "g2-standard-8"
    assert choice.shape.price_verified and "unverified figure" not in choice.note
    assert "cheaper shapes with unverified prices passed over" in choice.note
    assert "cheap-l4 ($0.10/h unverified)" in choice.note
    # The same through the planner: status says verified, and the plan line has no warning.
    result = plan(**CHAT)
    shape = shape_of(result)
    assert shape["name"] == "g2-standard-8" and shape["priceVerified"] is True
    assert "cheap-l4" in shape["why"]
    from loadline._cli_sizing import _plan_table

    assert "UNVERIFIED" not in _plan_table("chat", result).splitlines()[0]


def test_named_providers_and_cluster_shapes_still_take_the_cheapest_fit(user_catalog: Any) -> None:
    user_catalog({"gpus": [], "shapes": [_l4_row("cheap-l4", 0.10)]})
    l4 = find_gpu("L4")
    named = choose_shape(l4, CHAT_POD, 1, 1, providers=("gcp", "onprem"))
    assert named.shape is not None and named.shape.name == "cheap-l4"
    assert "priced from an unverified figure ($0.10/h unverified)" in named.note
    assert "verified price takes the pod" not in named.note  # the user chose where; nothing was passed over
    cheap = next(s for s in node_shapes()["L4"] if s.name == "cheap-l4")
    g2 = next(s for s in node_shapes()["L4"] if s.name == "g2-standard-8")
    cluster = ClusterShapes(by_gpu=(("L4", (cheap, g2)),), providers=("gcp", "onprem"))
    in_cluster = choose_shape(l4, CHAT_POD, 1, 1, cluster=cluster)
    assert in_cluster.shape is not None and in_cluster.shape.name == "cheap-l4"


def test_an_unverified_price_is_used_when_only_it_fits_and_the_plan_says_so(user_catalog: Any) -> None:
    # 900 GiB for one L4 pod: only the user's 1 TiB shape takes it, and its price is unverified.
    user_catalog({"gpus": [], "shapes": [_l4_row("big-l4", 0.50, memory="1Ti")]})
    choice = choose_shape(find_gpu("L4"), PodRequest(gpus=1, memory_gib=900, cpu=3, shm_gib=2), 1, 1)
    assert choice.shape is not None and choice.shape.name == "big-l4"
    assert "priced from an unverified figure ($0.50/h unverified): UNVERIFIED: a test figure" in choice.note
    assert "no L4 shape with a verified price takes the pod" in choice.note
    result = plan(**{**CHAT, "gpu": {"types": ["L4"]}, "resources": {"memoryGiB": 900}})
    shape = shape_of(result)
    assert shape["name"] == "big-l4" and shape["priceVerified"] is False and shape["priceAsOf"] is None
    assert "priced from an unverified figure" in shape["why"]
    from loadline._cli_sizing import _plan_table

    assert "UNVERIFIED price" in _plan_table("chat", result).splitlines()[0]


def test_a_verified_gpu_type_beats_a_cheaper_one_priced_only_unverified(user_catalog: Any) -> None:
    # Across GPU types too: L4 fits only the unverified big-l4 ($0.50/h), H100 a verified p5.48xlarge.
    user_catalog({"gpus": [], "shapes": [_l4_row("big-l4", 0.50, memory="1Ti")]})
    spec = {**CHAT, "gpu": {"types": ["L4", "H100-80GB"]}, "resources": {"memoryGiB": 900}}
    result = plan(**spec)
    shape = shape_of(result)
    assert result.chosen.gpu.name == "H100-80GB" and shape["priceVerified"] is True
    lost = next(c for c in result.candidates if c.gpu.name == "L4" and c.shape is not None)
    assert lost.shape is not None and lost.shape.name == "big-l4"
    assert "that price is unverified" in lost.rejection and "has a verified one" in lost.rejection
    # A named provider keeps today's rule: the cheapest plan wins, unverified or not.
    named = plan(**{**spec, "gpu": {**spec["gpu"], "providers": ["aws", "onprem"]}})
    assert named.chosen.gpu.name == "L4" and shape_of(named)["name"] == "big-l4"


def test_a_plan_priced_from_a_dated_source_names_it() -> None:
    shape = shape_of(plan(**{**CHAT, "gpu": {**CHAT["gpu"], "providers": ["aws"]}}))
    assert shape["priceVerified"] is True and shape["priceAsOf"] == "2026-09-24"
    assert "https://" in shape["priceSource"] and "unverified" not in shape["why"]


def test_the_docs_table_and_counts_are_the_datas() -> None:
    # docs/sizing.md's shape table is generated (scripts/shapes_table.py --write): a data change
    # without regenerating it, or a count left stale in the text above it, fails here.
    spec = importlib.util.spec_from_file_location("shapes_table", REPO / "scripts" / "shapes_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = json.loads((REPO / "operator/loadline/sizing/data/node_shapes.json").read_text())["shapes"]
    doc = (REPO / "docs" / "sizing.md").read_text()
    assert "\n".join(module.table(rows)) in doc
    standing = [module.standing(r).split(" ")[0].strip("*") for r in rows]
    counts = (
        f"Of {len(rows)} shapes, **{standing.count('verified')} prices are verified**",
        f"**{standing.count('null')} are null**",
    )
    assert all(c in " ".join(doc.split()) for c in counts), counts
    assert standing.count("unverified") == 0 and "**none is unverified**" in doc
