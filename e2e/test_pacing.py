"""A storm's roll-outs paced on the real control plane: with one roll-out at a time (the chart's
`settings.remediation.rolloutsAtOnce: 1`), two models OOM-killed together both get their fix, the second
one's Deployment paused with the fix in its template while the first rolls, its status saying that it
waits and why; then both serve with the fix, nothing left paused."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chart import ChartOperator
from crash import crash_container
from kube import REPO, Kubectl, wait_for
from operator_helpers import example, pods_of, wait_phase

MODELS = ("chat-a", "chat-b")


def _restart_with(operator: ChartOperator, values: dict[str, Any]) -> None:
    """`helm upgrade` with ``values``, then the replicas restarted with the upgraded env."""
    operator.upgrade(values)
    for replica in [r for r in operator.replicas if r.alive()]:
        operator.kill(replica, signal.SIGTERM, restart=False)
    operator.scale_to(2)
    operator.wait_replicas(2)
    operator.active(timeout=60)
    operator.wait_webhooks()


@pytest.fixture
def one_at_a_time(operator: ChartOperator) -> Iterator[ChartOperator]:
    _restart_with(operator, {"settings": {"remediation": {"rolloutsAtOnce": 1}}})
    try:
        yield operator
    finally:
        _restart_with(operator, {"settings": {"remediation": {"rolloutsAtOnce": 100}}})


def test_two_models_crashing_together_roll_out_one_at_a_time_and_both_serve_with_the_fix(
    one_at_a_time: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    pods, memory = {}, {}
    for name in MODELS:
        doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
        doc["metadata"]["name"] = name
        doc["spec"]["gpu"] = {"types": ["L4"]}
        kubectl.apply(doc, namespace)
    for name in MODELS:
        wait_phase(kubectl, namespace, name, "Ready")
        [pods[name]] = pods_of(kubectl, namespace, name)
        memory[name] = pods[name]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    for name in MODELS:  # a host OOM kill of both, back to back: the fix raises the pod's memory
        crash_container(kubectl, pods[name]["metadata"]["name"], namespace, "oomkilled")

    said_waiting: dict[str, str] = {}
    paused_with_fix: set[str] = set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(said_waiting) + len(paused_with_fix) < 2:
        for obj in kubectl.json("get", "inferencemodels", "-n", namespace)["items"]:
            ready: dict[str, Any] = next(
                (c for c in obj["status"].get("conditions", []) if c["type"] == "Ready"), {}
            )
            if "waits to roll out" in ready.get("message", ""):
                said_waiting.setdefault(obj["metadata"]["name"], ready["message"])
        for dep in kubectl.json("get", "deployments", "-n", namespace)["items"]:
            limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
            owner = dep["metadata"]["ownerReferences"][0]["name"]
            if dep["spec"].get("paused") and limits["memory"] != memory[owner]:
                paused_with_fix.add(owner)
        time.sleep(0.2)
    # Exactly one waited: the other took the one slot.
    assert len(said_waiting) == 1, said_waiting
    [(waited, message)] = said_waiting.items()
    assert "1 roll-out runs fleet-wide (at most 1 at once)" in message, message
    assert paused_with_fix == {waited}

    for name in MODELS:
        final = wait_phase(kubectl, namespace, name, "Ready", timeout=180)
        assert final["status"]["remediation"]["actionsToday"] == 1

    def both_rolled() -> bool | None:
        deps = kubectl.json("get", "deployments", "-n", namespace)["items"]
        return all(not d["spec"].get("paused") for d in deps) or None

    wait_for(both_rolled, timeout=30, what="no Deployment left paused")
    for name in MODELS:

        def replaced(name: str = name) -> dict[str, Any] | None:
            now = pods_of(kubectl, namespace, name)
            return (
                now[0]
                if len(now) == 1 and now[0]["metadata"]["uid"] != pods[name]["metadata"]["uid"]
                else None
            )

        pod = wait_for(replaced, timeout=30, what=f"{name}'s pod replaced")
        assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] != memory[name]
