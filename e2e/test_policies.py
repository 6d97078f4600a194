"""FleetPolicies on the real control plane, judged by the chart's operator: refused or warned at
`kubectl apply` time by its admission webhooks (defaults filled in), and a policy added after the
models it governs exist marks them non-compliant, naming the policy, and changes nothing that runs."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
from typing import Any

from chart import ChartOperator, served_certificate
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


# --- at `kubectl apply` time: the admission webhooks every replica of the chart serves ---


def _policy(name: str, namespace: str, enforcement: str = "deny", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "FleetPolicy",
        "metadata": {"name": name},
        "spec": {"enforcement": enforcement, "selector": {"namespaces": [namespace]}, **spec},
    }


def _chat(namespace: str, name: str = "chat", **spec: Any) -> dict[str, Any]:
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["metadata"]["name"] = name
    doc["spec"].update(spec)
    return doc


def test_kubectl_apply_is_refused_naming_the_policy_and_a_compliant_model_gets_its_defaults(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    name = f"budget-{namespace}"[:63]
    kubectl.apply(_policy(name, namespace, limits={"maxModelLen": 4096, "gpuTypes": ["L4", "L40S"]},
                          defaults={"engine": {"version": "0.17.0"}}))  # fmt: skip
    try:
        refused = kubectl.run(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(_chat(namespace)), check=False
        )
        assert refused.returncode != 0
        assert f"FleetPolicy {name}: spec.maxModelLen: 8192 exceeds maxModelLen 4096" in refused.stderr
        assert f"FleetPolicy {name}: spec.gpu.types" in refused.stderr and "fix:" in refused.stderr
        assert kubectl.run("get", "inferencemodel", "chat", "-n", namespace, check=False).returncode != 0

        fitting = _chat(namespace, maxModelLen=4096, gpu={"types": ["L4"]})
        del fitting["spec"]["engine"]  # left to the policy's default
        kubectl.apply(fitting, namespace)
        obj = wait_phase(kubectl, namespace, "chat", "Ready")
        assert obj["spec"]["engine"]["version"] == "0.17.0"  # filled in by the mutating webhook
        assert compliant(kubectl, namespace, "chat")["reason"] == "Compliant"
        args = kubectl.json("get", "deployment", "chat", "-n", namespace)["spec"]["template"]["spec"]
        assert "0.17.0" in json.dumps(args["containers"][0])  # the defaulted version is what runs

        # The operator's own writes to it (status, annotations) go on; so does its deletion.
        kubectl("label", "inferencemodel", "chat", "-n", namespace, "team=a")
    finally:
        kubectl.run("delete", "fleetpolicy", name, "--ignore-not-found", check=False)


def test_warn_and_dryrun_admit_with_a_warning_kubectl_prints(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    warn, dry = f"warn-{namespace}"[:63], f"dry-{namespace}"[:63]
    kubectl.apply(_policy(warn, namespace, "warn", limits={"maxModelLen": 4096}))
    kubectl.apply(_policy(dry, namespace, "dryrun", limits={"maxReplicas": 0}))
    try:
        proc = kubectl.run(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(_chat(namespace)), check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert f"Warning: FleetPolicy {warn}: spec.maxModelLen" in proc.stderr
        assert f"Warning: dryrun: would refuse: FleetPolicy {dry}: spec.replicas" in proc.stderr
        wait_phase(kubectl, namespace, "chat", "Ready")
        status = wait_for(
            lambda: (model(kubectl, namespace, "chat").get("status") or {}).get("violatedPolicies") or None,
            timeout=30, what="the violations in status",
        )  # fmt: skip
        assert sorted(status) == sorted([warn, dry])
        events = kubectl.json("get", "events", "-n", namespace, "--field-selector", "reason=PolicyViolation")
        assert any(warn in e["message"] for e in events["items"])
    finally:
        kubectl.run("delete", "fleetpolicy", warn, dry, "--ignore-not-found", check=False)


def test_a_policy_the_operator_cannot_apply_is_refused(operator: ChartOperator, kubectl: Kubectl) -> None:
    bad = _policy("bad-versions", "nowhere", limits={"vllmVersions": ">=0.17,,<"})
    proc = kubectl.run("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert proc.returncode != 0 and "spec.limits.vllmVersions" in proc.stderr


def _dry_run_apply(kubectl: Kubectl, namespace: str) -> subprocess.CompletedProcess[str]:
    """A server-side dry run: the API server calls the webhooks, nothing is stored."""
    return kubectl.run("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                       input=json.dumps(_chat(namespace, name="probe")), check=False)  # fmt: skip


def test_admission_answers_through_a_hand_over_and_a_certificate_rotation_without_a_restart(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    name = f"short-{namespace}"[:63]
    kubectl.apply(_policy(name, namespace, limits={"maxModelLen": 4096}))
    try:
        # Every replica serves: with the leader killed, the standby answers at once.
        leader = operator.active()
        operator.kill(leader, signal.SIGKILL)
        proc = _dry_run_apply(kubectl, namespace)
        assert proc.returncode != 0 and f"FleetPolicy {name}" in proc.stderr, proc.stderr
        operator.wait_replicas(2)

        # Rotation, as `helm upgrade --set webhook.rotate=true`: a new CA and certificate, the old CA
        # still trusted until the files on every replica are renewed.
        running = {r.pod_name: (r.process.pid if r.process else 0) for r in operator.replicas if r.alive()}
        served = {p: served_certificate(f"https://127.0.0.1:{r.env['LOADLINE_WEBHOOK_PORT']}")
                  for p, r in ((r.pod_name, r) for r in operator.replicas if r.alive())}  # fmt: skip
        operator.upgrade({"webhook": {"rotate": True}})
        secret = kubectl.json(
            "get", "secret", f"{operator.release}-loadline-webhook-tls", "-n", operator.namespace
        )
        assert "ca-previous.crt" in secret["data"]
        config = kubectl.json(
            "get", "validatingwebhookconfiguration", f"{operator.release}-loadline-validating"
        )
        bundle = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]).decode()
        assert bundle.count("BEGIN CERTIFICATE") == 2

        def renewed() -> bool | None:
            proc = _dry_run_apply(kubectl, namespace)  # answered all along
            assert f"FleetPolicy {name}" in proc.stderr, proc.stderr
            now = {p: served_certificate(f"https://127.0.0.1:{r.env['LOADLINE_WEBHOOK_PORT']}")
                   for p, r in ((r.pod_name, r) for r in operator.replicas if r.pod_name in served)}  # fmt: skip
            return all(now[p] not in (None, served[p]) for p in served) or None

        wait_for(renewed, timeout=90, what="every replica serving the renewed certificate")
        assert {
            r.pod_name: (r.process.pid if r.process else 0) for r in operator.replicas if r.alive()
        } == running
    finally:
        kubectl.run("delete", "fleetpolicy", name, "--ignore-not-found", check=False)
