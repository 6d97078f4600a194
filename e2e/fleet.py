"""Render the simulated GPU fleet (e2e/fleet.yaml) as KWOK fake Node objects.

    python e2e/fleet.py [--fleet e2e/fleet.yaml] [--scale 1.0] [--names]

Prints a JSON ``v1/List`` of Nodes for ``kubectl apply -f -`` (or, with
``--names``, one node name a line). Labels mirror NVIDIA GPU feature discovery
and the cloud provider's well-known labels; capacity and allocatable mirror a
managed node group's reservations so the scheduler sees realistic numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_FLEET = Path(__file__).resolve().parent / "fleet.yaml"
FLEET_LABEL = "loadline.dev/e2e-fleet"
POOL_LABEL = "loadline.dev/e2e-pool"
MAX_PODS = 110
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")

_QUANTITY = re.compile(r"^(\d+)(Mi|Gi|Ti)$")
_UNIT_MIB = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}


@dataclass(frozen=True)
class Product:
    name: str
    memory_mib: int
    family: str
    compute_major: int
    compute_minor: int


@dataclass(frozen=True)
class Pool:
    name: str
    product: Product
    instance_type: str
    gpus_per_node: int
    nodes: int
    cpu: int
    memory_mib: int
    taints: list[dict[str, str]] = field(default_factory=list)
    ephemeral_storage_gib: int = 500


class FleetError(ValueError):
    """The fleet file is malformed; the message names the bad entry."""


def _mib(quantity: str, where: str) -> int:
    match = _QUANTITY.match(str(quantity))
    if match is None:
        raise FleetError(f"{where}: memory must look like 16Gi, 512Mi or 2Ti, got {quantity!r}")
    return int(match.group(1)) * _UNIT_MIB[match.group(2)]


def load_fleet(path: Path = DEFAULT_FLEET, scale: float = 1.0) -> list[Pool]:
    """Read a fleet file; ``scale`` multiplies every pool's node count (at least 1 node stays)."""
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - depends on the interpreter
        raise SystemExit(
            f"e2e/fleet.py needs PyYAML; run it with the project venv (.venv/bin/python) ({exc})"
        ) from exc
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or "pools" not in doc or "products" not in doc:
        raise FleetError(f"{path}: expected top-level 'products' and 'pools'")
    products = {
        name: Product(
            name=name,
            memory_mib=int(spec["memoryMiB"]),
            family=str(spec["family"]),
            compute_major=int(spec["computeMajor"]),
            compute_minor=int(spec["computeMinor"]),
        )
        for name, spec in doc["products"].items()
    }
    pools: list[Pool] = []
    for i, raw in enumerate(doc["pools"]):
        where = f"{path}: pools[{i}]"
        missing = {"name", "product", "instanceType", "gpusPerNode", "nodes", "cpu", "memory"} - set(raw)
        if missing:
            raise FleetError(f"{where}: missing {', '.join(sorted(missing))}")
        if raw["product"] not in products:
            raise FleetError(f"{where}: unknown product {raw['product']!r} (known: {', '.join(products)})")
        nodes = int(raw["nodes"])
        if scale != 1.0 and nodes > 0:
            nodes = max(1, math.ceil(nodes * scale))
        pools.append(
            Pool(
                name=str(raw["name"]),
                product=products[raw["product"]],
                instance_type=str(raw["instanceType"]),
                gpus_per_node=int(raw["gpusPerNode"]),
                nodes=nodes,
                cpu=int(raw["cpu"]),
                memory_mib=_mib(raw["memory"], where),
                taints=list(raw.get("taints", [])),
                ephemeral_storage_gib=_mib(raw.get("ephemeralStorage", "500Gi"), where) // 1024,
            )
        )
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise FleetError(f"{path}: pool names must be unique, got {names}")
    return pools


def reserved_cpu_millicores(cores: int) -> int:
    """CPU a managed node group keeps for the system: 6% of the first core, 1% of the
    second, 0.5% of the next two and 0.25% of every core above four."""
    steps = ((1, 60.0), (1, 10.0), (2, 5.0))
    left, total = cores, 0.0
    for count, per_core in steps:
        used = min(left, count)
        total += used * per_core
        left -= used
    total += left * 2.5
    return round(total)


def reserved_memory_mib(max_pods: int = MAX_PODS) -> int:
    """kube-reserved memory (255 MiB + 11 MiB a pod) plus the 100 MiB hard eviction threshold."""
    return 255 + 11 * max_pods + 100


def node_name(pool: Pool, index: int) -> str:
    return f"gpu-{pool.name}-{index}"


def render_node(pool: Pool, index: int) -> dict[str, Any]:
    name = node_name(pool, index)
    gpus = str(pool.gpus_per_node)
    capacity = {
        "cpu": str(pool.cpu),
        "memory": f"{pool.memory_mib}Mi",
        "ephemeral-storage": f"{pool.ephemeral_storage_gib}Gi",
        "pods": str(MAX_PODS),
        "nvidia.com/gpu": gpus,
    }
    allocatable = {
        "cpu": f"{pool.cpu * 1000 - reserved_cpu_millicores(pool.cpu)}m",
        "memory": f"{pool.memory_mib - reserved_memory_mib()}Mi",
        "ephemeral-storage": f"{pool.ephemeral_storage_gib * 9 // 10}Gi",
        "pods": str(MAX_PODS),
        "nvidia.com/gpu": gpus,
    }
    product = pool.product
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": pool.instance_type,
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": ZONES[index % len(ZONES)],
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product.name,
        "nvidia.com/gpu.memory": str(product.memory_mib),
        "nvidia.com/gpu.count": gpus,
        "nvidia.com/gpu.family": product.family,
        "nvidia.com/gpu.compute.major": str(product.compute_major),
        "nvidia.com/gpu.compute.minor": str(product.compute_minor),
        "nvidia.com/gpu.machine": pool.instance_type,
        "type": "kwok",
        FLEET_LABEL: "true",
        POOL_LABEL: pool.name,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            # KWOK manages nodes carrying this annotation (kwokctl's binary runtime manages all nodes).
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": pool.taints} if pool.taints else {},
        # The API server keeps status on create (a kubelet registers the same way);
        # KWOK's node-initialize stage keeps capacity/allocatable and fills in the rest.
        "status": {"capacity": capacity, "allocatable": allocatable},
    }


def render_fleet(pools: list[Pool]) -> dict[str, Any]:
    items = [render_node(pool, i) for pool in pools for i in range(pool.nodes)]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fleet", type=Path, default=Path(os.environ.get("LOADLINE_FLEET", DEFAULT_FLEET)))
    parser.add_argument("--scale", type=float, default=float(os.environ.get("LOADLINE_FLEET_SCALE", "1")))
    parser.add_argument("--names", action="store_true", help="print node names only")
    args = parser.parse_args(argv)
    try:
        pools = load_fleet(args.fleet, args.scale)
    except (FleetError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.names:
        for pool in pools:
            for i in range(pool.nodes):
                print(node_name(pool, i))
    else:
        json.dump(render_fleet(pools), sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
