"""What `kubectl apply` refuses through the chart's webhooks whatever the FleetPolicies say: each spec
that can never run, and each thing the operator's safe defaults refuse (an image from elsewhere than
vLLM's registries, an environment variable that changes how code is loaded, an extraArgs flag that runs
code from outside the image), one line per problem and nothing stored; then each default widened, by a
chart value (`helm upgrade`, the Deployment rolled) or a FleetPolicy, and the same model admitted and
run. What depends on an object not applied yet is admitted with a warning and reported in status."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from chart import ChartOperator
from kube import REPO, Kubectl, wait_for
from operator_helpers import example, model, wait_phase

MIRROR = "registry.e2e.example/vllm-openai:v0.19.0"  # a platform team's mirror: no such registry exists


def _chat(namespace: str, name: str = "chat", **engine: Any) -> dict[str, Any]:
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["metadata"]["name"] = name
    doc["spec"]["engine"].update(engine)
    return doc


def _apply(kubectl: Kubectl, namespace: str, doc: dict[str, Any]) -> Any:
    return kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False)


def _stored(kubectl: Kubectl, namespace: str, name: str) -> bool:
    return kubectl.run("get", "inferencemodel", name, "-n", namespace, check=False).returncode == 0


#: Each refusal class: the spec's engine (and GPU types), the line kubectl must print.
REFUSALS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "unknown GPU type": ({}, {"types": ["B900"]}, "spec.gpu.types[0]: unknown GPU type 'B900' (fix: use one of"),
    "a flag loadline sets": (
        {"extraArgs": ["--model=other/model"]}, {}, "spec.engine.extraArgs[0]: --model is set by loadline"
    ),
    "a flag the version lacks": (
        {"version": "0.9.0", "extraArgs": ["--enable-log-requests"]}, {},
        "spec.engine.extraArgs[0]: vLLM 0.9.0 has no --enable-log-requests",
    ),
    "a flag that undoes the plan": (
        {"extraArgs": ["--num-gpu-blocks-override", "100"]}, {},
        "spec.engine.extraArgs[0]: --num-gpu-blocks-override",
    ),
    "an image from elsewhere": (
        {"image": MIRROR}, {}, f"spec.engine.image: {MIRROR} is not from vLLM's own registries",
    ),
    "a code-loading environment variable": (
        {"env": [{"name": "LD_PRELOAD", "value": "/tmp/hook.so"}]}, {},
        "spec.engine.env[0].name: LD_PRELOAD changes how code is loaded",
    ),
    "a flag that runs the repository's code": (
        {"extraArgs": ["--trust-remote-code"]}, {},
        "spec.engine.extraArgs[0]: --trust-remote-code makes vLLM run code from outside its image",
    ),
}  # fmt: skip

#: What each safe-default refusal names as the setting that would allow it.
SETTING = {
    "an image from elsewhere": "chart value settings.imageRegistries",
    "a code-loading environment variable": "chart value settings.allowedEnv",
    "a flag that runs the repository's code": "spec.allow.extraArgs",
}


def test_each_class_is_refused_at_kubectl_apply_and_nothing_is_stored(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    for what, (engine, gpu, line) in REFUSALS.items():
        doc = _chat(namespace, **engine)
        doc["spec"]["gpu"].update(gpu)
        proc = _apply(kubectl, namespace, doc)
        assert proc.returncode != 0, what
        assert line in proc.stderr and "(fix: " in proc.stderr, (what, proc.stderr)
        if what in SETTING:
            assert SETTING[what] in proc.stderr, (what, proc.stderr)
        assert not _stored(kubectl, namespace, "chat"), what

    # All at once: one apply names every problem, one line each.
    doc = _chat(namespace, image=MIRROR, extraArgs=["--model=x", "--trust-remote-code"],
                env=[{"name": "PYTHONPATH", "value": "/models/hooks"}])  # fmt: skip
    doc["spec"]["gpu"]["types"] = ["B900"]
    proc = _apply(kubectl, namespace, doc)
    assert proc.returncode != 0
    for field in ("spec.gpu.types[0]", "spec.engine.image", "spec.engine.extraArgs[0]",
                  "spec.engine.extraArgs[1]", "spec.engine.env[0].name: PYTHONPATH"):  # fmt: skip
        assert field in proc.stderr, (field, proc.stderr)
    assert not _stored(kubectl, namespace, "chat")


def test_what_depends_on_an_object_not_applied_yet_is_admitted_with_a_warning(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    doc = _chat(namespace, name="later")
    doc["spec"]["model"] = {"name": "example-org/private-model", "configMapRef": {"name": "later-config"}}
    proc = _apply(kubectl, namespace, doc)
    assert proc.returncode == 0, proc.stderr
    assert "Warning: loadline: not fully checked now (ConfigMap later-config not found)" in proc.stderr
    obj = wait_phase(kubectl, namespace, "later", "Pending")
    assert any("later-config" in c.get("message", "") for c in obj["status"]["conditions"])


def _roll_out(operator: ChartOperator) -> None:
    """What the Deployment controller does for a changed pod template (new env): new replicas from the
    upgraded chart, then the old ones stopped."""
    old = [r for r in operator.replicas if r.keep_running]
    count = len([r for r in old if r.alive()])
    for _ in range(count):
        operator.start(operator.new_replica())
    operator.wait_replicas(2 * count)  # the new ones answer before the old ones go
    for replica in old:
        replica.keep_running = False
    for replica in old:
        if replica.alive():
            operator.kill(replica, signal.SIGTERM, restart=False)  # also takes them out of the Service
    operator.wait_replicas(count)
    operator.wait_webhooks()
    operator.active()


@pytest.fixture
def widened(operator: ChartOperator) -> Iterator[ChartOperator]:
    """The chart upgraded with the two chart values that widen the safe defaults, as a platform team
    would write them; the session's values (the chart's defaults) put back afterwards."""
    operator.upgrade(
        {"settings": {"imageRegistries": ["registry.e2e.example/"], "allowedEnv": ["PYTHONPATH"]}}
    )
    _roll_out(operator)
    try:
        yield operator
    finally:
        operator.upgrade({})
        _roll_out(operator)


def test_each_default_widened_by_a_chart_value_or_a_fleetpolicy_is_admitted_and_runs(
    widened: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    env = [{"name": "PYTHONPATH", "value": "/models/hooks"}]
    doc = _chat(namespace, image=MIRROR, env=env, extraArgs=["--trust-remote-code"])
    proc = _apply(kubectl, namespace, doc)
    assert proc.returncode != 0  # the chart values allow image and env; the flag needs a FleetPolicy
    assert "spec.allow.extraArgs" in proc.stderr and "spec.engine.image" not in proc.stderr, proc.stderr
    assert "PYTHONPATH" not in proc.stderr

    policy = f"trust-{namespace}"[:63]
    kubectl.apply({
        "apiVersion": "loadline.dev/v1alpha1", "kind": "FleetPolicy", "metadata": {"name": policy},
        "spec": {"selector": {"namespaces": [namespace]}, "allow": {"extraArgs": ["--trust-remote-code"]}},
    })  # fmt: skip
    try:
        # Every replica's index of FleetPolicies sees the new one within moments (a watch event).
        wait_for(lambda: _apply(kubectl, namespace, doc).returncode == 0 or None, timeout=20,
                 what="the model admitted once the policy allows the flag")  # fmt: skip
        wait_phase(kubectl, namespace, "chat", "Ready")
        container = kubectl.json("get", "deployment", "chat", "-n", namespace)["spec"]["template"]["spec"][
            "containers"
        ][0]
        assert container["image"] == MIRROR
        assert "--trust-remote-code" in container["args"]
        assert {"name": "PYTHONPATH", "value": "/models/hooks"} in container["env"]
        assert model(kubectl, namespace, "chat")["spec"]["engine"]["image"] == MIRROR
    finally:
        kubectl.run("delete", "fleetpolicy", policy, "--ignore-not-found", check=False)
