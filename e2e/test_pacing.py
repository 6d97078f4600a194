"""A storm's roll-outs paced on the real control plane: with one roll-out at a time (the chart's
`settings.remediation.rolloutsAtOnce: 1`), two models OOM-killed together both get their fix, the second
one's Deployment paused with the fix in its template while the first rolls, its status saying that it
waits and why; then both serve with the fix, nothing left paused."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chart import ChartOperator
from crash import crash_container
from kube import REPO, Kubectl, kubectl_binary, wait_for
from loadline.sizing._shapes import parse_quantity
from operator_helpers import example, pods_of, wait_phase

MODELS = ("chat-a", "chat-b")


class Versions:
    """Every version of the namespace's objects of ``kind`` from now on, as ``kubectl get -w`` shows
    them (a watch delivers each write: none is coalesced away, however short it lasted)."""

    def __init__(self, kubectl: Kubectl, namespace: str, kind: str) -> None:
        binary = kubectl.binary or kubectl_binary()
        self._proc = subprocess.Popen(
            [str(binary), "--kubeconfig", str(kubectl.kubeconfig), "get", kind, "-n", namespace,
             "-w", "--watch-only", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self._chunks: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._chunks.append(line)

    def seen(self) -> list[dict[str, Any]]:
        """The versions delivered so far (an object still being written is left for later)."""
        text = "".join(self._chunks)
        decoder, at = json.JSONDecoder(), 0
        found: list[dict[str, Any]] = []
        while (at := len(text) - len(text[at:].lstrip())) < len(text):
            try:
                obj, at = decoder.raw_decode(text, at)
            except json.JSONDecodeError:
                break
            found.append(obj)
        return found

    def until(self, done: Callable[[list[dict[str, Any]]], bool], what: str) -> list[dict[str, Any]]:
        """The versions once ``done`` holds for them (the watch then stops)."""
        try:
            return wait_for(
                lambda: (lambda now: now if done(now) else None)(self.seen()), timeout=30, what=what
            )
        finally:
            self._proc.terminate()
            self._proc.wait(timeout=10)


def _ready_after_the_fix(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    return status.get("phase") == "Ready" and bool((status.get("remediation") or {}).get("handledCrashes"))


def _ready_message(obj: dict[str, Any]) -> str:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return str(next((c.get("message", "") for c in conditions if c["type"] == "Ready"), ""))


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
        _restart_with(operator, {"settings": {"remediation": {"rolloutsAtOnce": 0}}})


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
    deployments, models = (
        Versions(kubectl, namespace, "deployments"),
        Versions(kubectl, namespace, "inferencemodels"),
    )
    # The first fix's new pod is held by a quota of exactly the memory the pods have now (its raised
    # limit does not fit), so that its roll-out holds the one slot until the quota goes: on an idle
    # control plane a roll-out's controller part takes a fraction of a second, less than the time
    # between the two crashes' decisions.
    held = sum(int(parse_quantity(memory[name])) for name in MODELS)
    kubectl.apply(
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "hold", "namespace": namespace},
         "spec": {"hard": {"limits.memory": str(held)}}},
        namespace,
    )  # fmt: skip
    wait_for(
        lambda: (
            kubectl.json("get", "resourcequota", "hold", "-n", namespace).get("status", {}).get("used")
            or None
        ),
        timeout=30,
        what="the quota's usage counted",
    )
    time.sleep(1)  # watching before the crashes are written
    for name in MODELS:  # a host OOM kill of both, back to back: the fix raises the pod's memory
        crash_container(kubectl, pods[name]["metadata"]["name"], namespace, "oomkilled")
    wait_for(
        lambda: any("waits to roll out" in _ready_message(o) for o in models.seen()) or None,
        timeout=60,
        what="a model's status saying its fix waits",
    )
    kubectl("delete", "resourcequota", "hold", "-n", namespace)

    for name in MODELS:  # each serves with its fix: a new pod with the raised memory, Ready again

        def replaced(name: str = name) -> dict[str, Any] | None:
            now = pods_of(kubectl, namespace, name)
            new = len(now) == 1 and now[0]["metadata"]["uid"] != pods[name]["metadata"]["uid"]
            return now[0] if new else None

        pod = wait_for(replaced, timeout=150, what=f"{name}'s pod replaced")
        assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] != memory[name]
        final = wait_phase(kubectl, namespace, name, "Ready", timeout=120)
        assert final["status"]["remediation"]["actionsToday"] == 1

    def both_rolled() -> bool | None:
        deps = kubectl.json("get", "deployments", "-n", namespace)["items"]
        return all(not d["spec"].get("paused") for d in deps) or None

    wait_for(both_rolled, timeout=30, what="no Deployment left paused")
    # One waited, and its status said so and why: the other took the one slot.
    ready_again = models.until(
        lambda seen: {o["metadata"]["name"] for o in seen if _ready_after_the_fix(o)} >= set(MODELS),
        "both models Ready again in the watch",
    )
    said_waiting = {
        obj["metadata"]["name"]: _ready_message(obj)
        for obj in ready_again
        if "waits to roll out" in _ready_message(obj)
    }
    assert len(said_waiting) == 1, said_waiting
    [(waited, message)] = said_waiting.items()
    assert "1 ahead of it; 1 roll-out runs fleet-wide (at most 1 at once)" in message, message

    # Every version of the Deployments: the one that waited carried the fix paused first, then unpaused;
    # the other's fix was never paused.
    def fix(dep: dict[str, Any]) -> tuple[str, bool] | None:
        """(model, paused) of a Deployment version that carries its model's fix."""
        owner = dep["metadata"]["ownerReferences"][0]["name"]
        limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        return (owner, bool(dep["spec"].get("paused"))) if limits["memory"] != memory[owner] else None

    versions = deployments.until(
        lambda seen: (waited, False) in [fix(d) for d in seen], "the waiting fix unpaused in the watch"
    )
    fixed = [found for found in map(fix, versions) if found is not None]
    assert (waited, True) in fixed and (waited, False) in fixed, fixed
    assert fixed.index((waited, True)) < fixed.index((waited, False)), fixed
    assert all(not paused for owner, paused in fixed if owner != waited), fixed
