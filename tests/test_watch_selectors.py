"""What the API server sends the operator: server-side selectors narrow the watches of nodes, pods and
Deployments, and must still admit every object the capacity indexes and the OOM handler keep.

Each selector is checked two ways: through kopf's own settings (what its watch and list requests
carry), and against objects, with the selector evaluated the way the API server does."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from kopf._cogs.structs.references import Resource

from loadline.handlers import _registry
from loadline.render import LABEL_MANAGED_BY, LABEL_MODEL, MANAGED_BY
from loadline.state import _index

NODES = Resource("", "v1", "nodes", namespaced=False)
PODS = Resource("", "v1", "pods", namespaced=True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", namespaced=True)
MODELS = Resource("loadline.dev", "v1alpha1", "inferencemodels", namespaced=True)
POLICIES = Resource("loadline.dev", "v1alpha1", "fleetpolicies", namespaced=False)


def configured() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    _registry.select_watches(settings)
    return settings


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = (value or {}).get(part)
    return "" if value is None else str(value)


def matches(obj: dict[str, Any], labels: str | None, fields: str | None) -> bool:
    """The API server's reading of the selector forms loadline uses: ``key``, ``key=value`` (labels) and
    ``path!=value`` / ``path=value`` (fields), joined by commas (all must hold)."""
    have = (obj.get("metadata") or {}).get("labels") or {}
    for term in (labels or "").split(","):
        if not term:
            continue
        key, _, value = term.partition("=")
        if key not in have or ("=" in term and have[key] != value):
            return False
    for term in (fields or "").split(","):
        if not term:
            continue
        if "!=" in term:
            path, value = term.split("!=")
            if _field(obj, path) == value:
                return False
        else:
            path, value = term.split("=")
            if _field(obj, path) != value:
                return False
    return True


def selectors(resource: Resource) -> tuple[str | None, str | None]:
    settings = configured()
    labels = ",".join(sorted(set(settings.watching.label_selectors.collect(resource)))) or None
    fields = ",".join(sorted(set(settings.watching.field_selectors.collect(resource)))) or None
    return labels, fields


def test_kopf_requests_carry_the_selectors() -> None:
    assert selectors(NODES) == ("nvidia.com/gpu.product", None)
    assert selectors(PODS) == (None, "spec.nodeName!=,status.phase!=Succeeded")
    assert selectors(DEPLOYMENTS) == (f"{LABEL_MANAGED_BY}={MANAGED_BY}", None)


def test_the_models_and_policies_are_never_filtered() -> None:
    # A selector here would hide InferenceModels or FleetPolicies from the operator.
    assert selectors(MODELS) == (None, None)
    assert selectors(POLICIES) == (None, None)


def node(labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


@pytest.mark.parametrize(
    "labels",
    [
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        {"nvidia.com/gpu.product": "NVIDIA-L4", "node.kubernetes.io/instance-type": "g6.xlarge"},
        {},
        {"node.kubernetes.io/instance-type": "m7i.large"},
    ],
)
def test_every_node_the_capacity_index_keeps_is_sent(labels: dict[str, str]) -> None:
    body = node(labels)
    kept = bool(_index.node_entry(body, "n1"))
    assert matches(body, *selectors(NODES)) == kept  # exactly the GPU nodes: nothing kept is missed


def pod(node_name: str | None, phase: str, gpus: str | None, labels: dict[str, str]) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {"namespace": "a", "name": "p", "labels": labels},
        "spec": spec,
        "status": {"phase": phase},
    }


OURS = {LABEL_MODEL: "chat"}
PODS_SEEN = [
    (pod("n1", "Running", "1", OURS), True),  # our GPU pod: capacity and OOM
    (pod("n1", "Running", "2", {}), True),  # someone else's GPU pod: capacity
    (pod("n1", "Running", None, {}), True),  # a CPU pod: sent (no field says "GPUs"), then dropped
    (pod("n1", "Failed", "1", OURS), True),  # evicted: still sent
    (pod(None, "Pending", "1", OURS), False),  # not scheduled yet: no capacity held, nothing crashed
    (pod("n1", "Succeeded", "1", {}), False),  # finished: holds nothing
]


@pytest.mark.parametrize(("body", "sent"), PODS_SEEN)
def test_pods_sent_are_the_bound_unfinished_ones(body: dict[str, Any], sent: bool) -> None:
    assert matches(body, *selectors(PODS)) == sent
    if _index.pod_entry(body):
        assert sent, "a pod the capacity index keeps must be sent"


def test_only_our_deployments_are_sent() -> None:
    ours = {"metadata": {"labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_MODEL: "chat"}}}
    theirs = {"metadata": {"labels": {LABEL_MANAGED_BY: "Helm"}}}
    assert matches(ours, *selectors(DEPLOYMENTS))
    assert not matches(theirs, *selectors(DEPLOYMENTS))
