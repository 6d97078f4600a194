"""Helpers for e2e tests of loadline's operator: apply examples, wait on status, find pods."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from kube import REPO, Kubectl, wait_for

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
LOADLINE = Path(sys.executable).parent / "loadline"


def example(path: Path, namespace: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = namespace
    return doc


def model(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kubectl.json("get", "inferencemodel", name, "-n", namespace)
    return result


def models(kubectl: Kubectl, namespace: str, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``names``' objects from one LIST: one snapshot of the namespace at a single resourceVersion.
    Reading them one GET at a time is no snapshot: a restart that ends between two GETs and the next
    one that starts at once would both look Running."""
    wanted = set(names)
    items = kubectl.json("get", "inferencemodels", "-n", namespace)["items"]
    found = {o["metadata"]["name"]: o for o in items if o["metadata"]["name"] in wanted}
    assert set(found) == wanted, f"missing from {namespace}: {sorted(wanted - set(found))}"
    return found


def wait_phase(
    kubectl: Kubectl, namespace: str, name: str, phase: str, timeout: float = 60
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = model(kubectl, namespace, name)
        return obj if (obj.get("status") or {}).get("phase") == phase else None

    try:
        return wait_for(check, timeout=timeout, what=f"{namespace}/{name} phase {phase}")
    except Exception:
        status = model(kubectl, namespace, name).get("status") or {}
        raise AssertionError(f"{name} did not reach {phase}: status {json.dumps(status)[:1500]}") from None


def pods_of(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"loadline.dev/inferencemodel={name}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def node_products(kubectl: Kubectl) -> dict[str, str]:
    nodes = kubectl.json("get", "nodes")["items"]
    return {n["metadata"]["name"]: n["metadata"]["labels"].get("nvidia.com/gpu.product", "") for n in nodes}


def api_requests(replica: Any) -> Counter[tuple[str, str]]:
    """One live replica's own requests to the API server so far (``loadline_api_requests_total``),
    by (verb, resource)."""
    url = f"http://127.0.0.1:{replica.env['LOADLINE_METRICS_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "loadline_api_requests_total":
                counts[sample.labels["verb"], sample.labels["resource"]] += int(sample.value)
    return counts


def metric_total(replica: Any, sample_name: str, **labels: str) -> float:
    """One live replica's ``sample_name`` summed over its series whose labels include ``labels``."""
    url = f"http://127.0.0.1:{replica.env['LOADLINE_METRICS_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == sample_name and labels.items() <= sample.labels.items()
    )


def api_reads(replicas: Iterable[Any]) -> Counter[str]:
    """The operator's own reads of the API server so far (verbs get and list) by resource, summed over
    the live replicas; Leases left out (the election renews them at rest)."""
    reads: Counter[str] = Counter()
    for replica in replicas:
        if replica.alive():
            for (verb, resource), count in api_requests(replica).items():
                if verb in {"get", "list"} and resource != "leases":
                    reads[resource] += count
    return reads
