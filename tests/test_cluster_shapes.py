"""Shapes from the cluster: when the operator knows the GPU nodes, plans assume only the instance types
the cluster has (a node of an unknown type is a shape of its own), never another cloud's machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loadline.api import parse_inference_model
from loadline.cli import main
from loadline.errors import NoFeasiblePlanError
from loadline.sizing import Plan, cluster_shapes, find_gpu, plan_inference_model, shapes_for
from loadline.sizing._capacity import _catalog_name
from loadline.sizing._shapes import ClusterShapes
from loadline.state import _index
from tests.conftest import inference_model

REPO = Path(__file__).resolve().parents[1]
CHAT = {"maxModelLen": 8192, "concurrency": 4, "gpu": {"types": ["L4", "L40S", "A100-80GB", "H100-80GB"]}}


def node(
    name: str, product: str, instance_type: str | None, gpus: int, memory: str, cpu: str
) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product, "kubernetes.io/hostname": name, "team": "ml"}
    if instance_type:
        labels["node.kubernetes.io/instance-type"] = instance_type
    body = {
        "metadata": {"name": name, "labels": labels, "annotations": {"big": "x" * 100}},
        "spec": {"taints": [{"key": "gpu"}]},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "memory": memory, "cpu": cpu, "pods": "110"},
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}],
            "images": [{"names": ["big"]}],
        },
    }
    return body


def entries(*nodes: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes as the operator's index holds them."""
    return [entry for n in nodes for entry in _index.node_entry(n, n["metadata"]["name"]).values()]


def plan(cluster: ClusterShapes | None, **spec: Any) -> Plan:
    return plan_inference_model(
        parse_inference_model(inference_model(**{**CHAT, **spec})).spec, cluster_shapes=cluster
    )


AWS = entries(
    node("l4-a", "NVIDIA-L4", "g6.xlarge", 1, "15Gi", "3920m"),
    node("l4-b", "NVIDIA-L4", "g6.12xlarge", 4, "185Gi", "47810m"),
    node("h100-a", "NVIDIA-H100-80GB-HBM3", "p5.48xlarge", 8, "2000Gi", "191450m"),
)


def test_the_node_index_keeps_only_the_instance_type_and_allocatable_cpu_memory() -> None:
    (entry,) = entries(node("n1", "NVIDIA-L4", "g6.xlarge", 1, "15Gi", "3920m"))
    assert entry["metadata"]["labels"] == {
        "nvidia.com/gpu.product": "NVIDIA-L4",
        "node.kubernetes.io/instance-type": "g6.xlarge",
    }
    assert entry["status"]["allocatable"] == {"nvidia.com/gpu": "1", "memory": "15Gi", "cpu": "3920m"}
    assert "annotations" not in entry["metadata"] and "images" not in entry["status"]
    assert [c["type"] for c in entry["status"]["conditions"]] == ["Ready"]


def test_an_aws_cluster_is_never_planned_on_another_clouds_shape() -> None:
    cluster = cluster_shapes(AWS)
    assert cluster is not None and cluster.providers == ("aws",)
    result = plan(cluster)
    for candidate in result.candidates:
        assert candidate.shape is None or candidate.shape.provider == "aws", candidate.label
    # L4 has nodes: only their two instance types. The 22 GiB pod does not fit the g6.xlarge's
    # allocatable memory, so the 4-GPU g6.12xlarge it can run on is priced, not a g6.2xlarge it lacks.
    l4 = next(c for c in result.candidates if c.gpu.name == "L4" and c.shape is not None)
    assert l4.shape is not None and l4.shape.name == "g6.12xlarge"
    # L40S has no nodes: the catalog's shapes of the cluster's provider (AWS), not GCP's or Azure's.
    l40s = next(c for c in result.candidates if c.gpu.name == "L40S" and c.shape is not None)
    assert l40s.shape is not None and l40s.shape.name.startswith("g6e.")


def test_without_cluster_knowledge_every_provider_competes() -> None:
    providers = {c.shape.provider for c in plan(None).candidates if c.shape is not None}
    assert len(providers) > 1  # what `loadline plan` without --provider does, and says it does


def test_a_node_of_an_unknown_instance_type_is_a_shape_of_its_own() -> None:
    cluster = cluster_shapes(entries(node("box", "NVIDIA-L4", "custom-l4-2x", 2, "60Gi", "16")))
    assert cluster is not None
    (shape,) = cluster.shapes("L4") or ()
    assert shape.gpus == 2 and shape.instance_type == "custom-l4-2x"
    assert shape.memory_gib == pytest.approx(60)  # allocatable: the kubelet's reserve is already out
    assert shape.allocatable_memory_gib < 60 and shape.allocatable_cpu < 16  # DaemonSets' allowance
    assert not shape.price_verified and "UNVERIFIED" in shape.price_source
    result = plan(cluster, gpu={"types": ["L4"]})
    assert result.chosen.shape == shape and result.chosen.instances == 1
    assert "unverified" in (result.summary().model_dump(by_alias=True, mode="json")["nodeShape"] or {})["why"]


def test_a_node_too_small_for_the_pod_refuses_the_plan_naming_the_node() -> None:
    cluster = cluster_shapes(entries(node("tiny", "NVIDIA-L4", None, 1, "12Gi", "4")))
    with pytest.raises(NoFeasiblePlanError) as refused:
        plan(cluster, gpu={"types": ["L4"]})
    assert any("node tiny" in line and "host memory" in line for line in refused.value.rejections)


def test_nodes_of_one_unknown_type_take_the_smallest_allocatable_seen() -> None:
    cluster = cluster_shapes(
        entries(
            node("a", "NVIDIA-L4", "custom", 1, "60Gi", "16"),
            node("b", "NVIDIA-L4", "custom", 1, "40Gi", "8"),
        )
    )
    assert cluster is not None
    (shape,) = cluster.shapes("L4") or ()
    assert shape.memory_gib == pytest.approx(40) and shape.vcpus == 8  # every node of it takes the pod


def test_shapes_follow_a_nodes_change_at_once() -> None:
    """The shapes are computed once per set of node figures (every plan at fleet scale reads 2,000
    nodes): a node resized, added or gone is still seen by the next plan."""
    nodes = [
        node("a", "NVIDIA-L4", "custom", 1, "60Gi", "16"),
        node("b", "NVIDIA-L4", "custom", 1, "60Gi", "16"),
    ]
    first = cluster_shapes(entries(*nodes))
    assert first is not None and cluster_shapes(entries(*nodes)) == first
    nodes[1]["status"]["allocatable"]["memory"] = "40Gi"
    resized = cluster_shapes(entries(*nodes))
    assert resized is not None and (resized.shapes("L4") or ())[0].memory_gib == pytest.approx(40)
    added = cluster_shapes(entries(*nodes, node("c", "NVIDIA-L40S", "custom-l40s", 4, "200Gi", "48")))
    assert added is not None and added.shapes("L40S")
    gone = cluster_shapes(entries(nodes[0]))  # the smaller node gone: 60 GiB again
    assert gone is not None and (gone.shapes("L4") or ())[0].memory_gib == pytest.approx(60)


def test_a_cluster_without_gpu_nodes_tells_nothing() -> None:
    assert cluster_shapes(entries(node("cpu", "unknown-gpu", "m5.large", 0, "8Gi", "2"))) is None
    assert cluster_shapes([]) is None


def test_the_e2e_fleets_instance_types_are_catalog_shapes() -> None:
    # e2e/fleet.py labels each simulated node node.kubernetes.io/instance-type with its pool's
    # instanceType; plans in e2e must take those catalog shapes, not derived ones.
    fleet = yaml.safe_load((REPO / "e2e/fleet.yaml").read_text())
    for pool in fleet["pools"]:
        gpu = _catalog_name(pool["product"])
        assert gpu is not None, pool["name"]
        names = {(s.instance_type, s.gpus) for s in shapes_for(find_gpu(gpu))}
        assert (pool["instanceType"], pool["gpusPerNode"]) in names, pool["name"]
        cluster = cluster_shapes(
            entries(node("n", pool["product"], pool["instanceType"], pool["gpusPerNode"], "1Gi", "1"))
        )
        assert cluster is not None
        (shape,) = cluster.shapes(gpu) or ()
        assert shape.name == pool["instanceType"] and shape.provider == "aws"


def test_plan_on_the_command_line_says_which_provider_it_assumes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump(inference_model(**CHAT)))
    assert main(["plan", str(path)]) == 0
    assert "the cheapest of all providers' shapes, verified prices first (pass --provider" in (
        capsys.readouterr().out
    )
    assert main(["plan", str(path), "--provider", "azure", "--provider", "aws"]) == 0
    out = capsys.readouterr().out
    assert "provider: aws (allowed: azure, aws)" in out and "(gcp," not in out
