"""FleetPolicies on the real control plane, judged by the chart's operator: a policy added after the
models it governs exist marks them non-compliant, naming the policy, and changes nothing that runs."""

from __future__ import annotations

from typing import Any

from chart import ChartOperator
from kube import REPO, Kubectl, wait_for
from operator_helpers import example, model, wait_phase


def fleet_policy(name: str, namespace: str, **limits: Any) -> dict[str, Any]:
    return {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "FleetPolicy",
        "metadata": {"name": name},
        "spec": {"enforcement": "deny", "selector": {"namespaces": [namespace]}, "limits": limits},
    }


def compliant(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    conditions = (model(kubectl, namespace, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PolicyCompliant"), {})


def test_a_policy_added_later_marks_the_model_and_leaves_it_running(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(example(REPO / "examples" / "chat-llama-8b.yaml", namespace), namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    assert compliant(kubectl, namespace, "chat")["reason"] == "NoPolicy"
    before = kubectl.json("get", "deployment", "chat", "-n", namespace)["metadata"]
    policy = f"short-{namespace}"[:63]
    kubectl.apply(fleet_policy(policy, namespace, maxModelLen=4096))
    try:
        said = wait_for(
            lambda: compliant(kubectl, namespace, "chat") if compliant(kubectl, namespace, "chat").get(
                "status") == "False" else None,
            timeout=30,
            what="PolicyCompliant=False",
        )  # fmt: skip
        assert f"FleetPolicy {policy}: spec.maxModelLen" in said["message"]
        status = model(kubectl, namespace, "chat")["status"]
        assert status["violatedPolicies"] == [policy] and status["phase"] == "Ready"
        counts = wait_for(
            lambda: (
                (kubectl.json("get", "fleetpolicy", policy).get("status") or {}).get("violations") == 1
                or None
            ),
            timeout=90,
            what="the policy's counts",
        )
        assert counts
        after = kubectl.json("get", "deployment", "chat", "-n", namespace)["metadata"]
        assert after["generation"] == before["generation"]  # nothing rolled
        events = kubectl.json("get", "events", "-n", namespace, "--field-selector", "reason=PolicyViolation")
        assert any(policy in e["message"] for e in events["items"])
    finally:
        kubectl.run("delete", "fleetpolicy", policy, "--ignore-not-found", check=False)
    wait_for(
        lambda: compliant(kubectl, namespace, "chat").get("reason") == "NoPolicy" or None,
        timeout=30,
        what="compliance once the policy is gone",
    )
