"""Faults on the real control plane: a layout change, a roll-out the API refuses, conflicting writers,
the operator killed mid-remediation, the API server and etcd restarted under the operator.

The operator runs as the Helm chart installs it (the `operator` fixture: two replicas, one Lease).
"""

from __future__ import annotations

import json
import os
import random
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from chart import ChartOperator, free_port
from crash import crash_container
from kube import E2E_DIR, REPO, STATE_DIR, Kubectl, answers, kubectl_binary, wait_for
from loadline.api import GROUP, KIND, PLURAL, VERSION
from operator_helpers import example, pods_of, wait_phase
from test_oom import deploy_chat, remediated

LWS = "leaderworkersets.leaderworkerset.x-k8s.io"


def _children(kubectl: Kubectl, namespace: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for kind in ("deployments", LWS, "services"):
        items = kubectl.json("get", kind, "-n", namespace)["items"]
        out[kind] = sorted(i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp"))
    return out


def test_layout_change_removes_the_old_children_and_keeps_the_service_name(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """405B in bf16 needs two H100 nodes (LeaderWorkerSet); in fp8 it fits one (Deployment). Moving
    between them leaves no workload of the other layout holding GPUs, and clients keep one Service."""
    doc = example(REPO / "examples" / "llama-405b-multinode.yaml", namespace)
    kubectl("create", "secret", "generic", "hf-token", "-n", namespace, "--from-literal=token=x")
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, "llama-405b", "Ready", timeout=120)
    before = _children(kubectl, namespace)
    assert before["deployments"] == [] and len(before[LWS]) == 1
    service = "llama-405b"
    assert service in before["services"]

    for quantization, layout in (("fp8", "deployments"), (None, LWS)):
        changed = json.loads(json.dumps(doc))
        if quantization:
            changed["spec"]["quantization"] = quantization
        kubectl.apply(changed, namespace)
        other = LWS if layout == "deployments" else "deployments"

        def switched(layout: str = layout, other: str = other) -> dict[str, list[str]] | None:
            now = _children(kubectl, namespace)
            return now if now[layout] and not now[other] else None

        now = wait_for(switched, timeout=90, what=f"only {layout} left")
        assert service in now["services"], now
        wait_phase(kubectl, namespace, "llama-405b", "Ready", timeout=120)
        # No pod of the old layout is left holding GPUs: every pod belongs to the new workload.
        owner = "ReplicaSet" if layout == "deployments" else "StatefulSet"

        def only_new_pods(owner: str = owner) -> bool | None:
            pods = pods_of(kubectl, namespace, "llama-405b")
            kinds = {(p["metadata"].get("ownerReferences") or [{}])[0].get("kind") for p in pods}
            return True if pods and kinds == {owner} else None

        wait_for(only_new_pods, timeout=90, what=f"only pods of the {layout} layout")
    reasons = {e["reason"] for e in kubectl.json("get", "events", "-n", namespace)["items"]}
    assert "Removed" in reasons


POLICY = "loadline-e2e-freeze-templates"


def _freeze_pod_templates(kubectl: Kubectl, namespace: str) -> None:
    """A ValidatingAdmissionPolicy that refuses any change of a Deployment's pod template in the
    namespace: the remediation's roll-out fails at the API server, as it would on a locked-down cluster."""
    kubectl("label", "namespace", namespace, f"{POLICY}=true", "--overwrite")
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"{POLICY}-{namespace}"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                     "resources": ["deployments"]}
                ]
            },
            "validations": [{"expression": "object.spec.template == oldObject.spec.template",
                             "message": "pod templates are frozen in this namespace"}],
        },
    }  # fmt: skip
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": f"{POLICY}-{namespace}"},
        "spec": {
            "policyName": f"{POLICY}-{namespace}",
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {POLICY: "true"}}},
        },
    }
    kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [policy, binding]})
    )


def _thaw(kubectl: Kubectl, namespace: str) -> None:
    kubectl.run("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", f"{POLICY}-{namespace}",
                "--ignore-not-found", check=False)  # fmt: skip


def _memory_limit(kubectl: Kubectl, namespace: str) -> str:
    deployment = kubectl.json("get", "deployment", "chat", "-n", namespace)
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"])


def test_a_remediation_whose_roll_out_fails_is_retried_until_it_lands(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    pod = deploy_chat(kubectl, namespace)
    old_memory = _memory_limit(kubectl, namespace)
    _freeze_pod_templates(kubectl, namespace)
    try:
        # The policy takes a moment to be enforced; wait until a template change is refused.
        wait_for(
            lambda: kubectl.run("patch", "deployment", "chat", "-n", namespace, "--dry-run=server", "--type=merge",
                                "-p", '{"spec":{"template":{"metadata":{"labels":{"probe":"x"}}}}}',
                                check=False).returncode != 0 or None,
            timeout=30, what="the admission policy enforced",
        )  # fmt: skip
        crash_container(kubectl, pod["metadata"]["name"], namespace, "oomkilled")
        obj = remediated(kubectl, namespace, "host_memory")
        assert obj["status"]["remediation"]["overrides"]["memoryGiB"]

        def refused() -> dict[str, Any] | None:
            status = kubectl.json("get", "inferencemodel", "chat", "-n", namespace).get("status") or {}
            planned: dict[str, Any] = next(
                (c for c in status.get("conditions", []) if c["type"] == "Deployed"), {}
            )
            return status if planned.get("status") == "False" else None

        status = wait_for(refused, timeout=30, what="the refused roll-out in status")
        assert "frozen" in status["message"], status["message"]
        time.sleep(5)  # a few retries go by (LOADLINE_RETRY_DELAY_SECONDS=3), all refused
        assert _memory_limit(kubectl, namespace) == old_memory
    finally:
        _thaw(kubectl, namespace)
    wait_for(lambda: _memory_limit(kubectl, namespace) != old_memory or None, timeout=60,
             what="the remediation landed after the policy was lifted")  # fmt: skip
    final = wait_phase(kubectl, namespace, "chat", "Ready", timeout=60)
    deployed = next(c for c in final["status"]["conditions"] if c["type"] == "Deployed")
    assert deployed["status"] == "True"
    assert final["status"]["remediation"]["actionsToday"] == 1


def test_conflicting_writers_never_make_a_crash_be_dropped(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """Another writer keeps changing the InferenceModel while crashes come in: every status write of
    the OOM handler may meet a 409; each crash is still recorded exactly once."""
    pod = deploy_chat(kubectl, namespace)
    stop = threading.Event()
    writes = [0]

    def hammer() -> None:
        while not stop.is_set():
            kubectl.run("annotate", "inferencemodel", "chat", "-n", namespace, f"e2e/tick={writes[0]}",
                        "--overwrite", check=False)  # fmt: skip
            writes[0] += 1

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    crashes = 3

    crashed: set[str] = set()

    def replaced() -> dict[str, Any] | None:
        """The remediation's new pod, Running, once it is the model's only live pod (the first crash
        raises the memory limit, so it rolls out a pod that was never crashed)."""
        pods = pods_of(kubectl, namespace, "chat")  # pods being deleted are left out
        if len(pods) == 1 and pods[0]["metadata"]["name"] not in crashed:
            return pods[0] if pods[0]["status"].get("phase") == "Running" else None
        return None

    try:
        for round_ in range(crashes):
            # The second crash comes from the pod that runs the raised limit: that fix did not work, so
            # it is not repeated (no rung left: a person is told) and nothing rolls; the third crash is
            # the same pod's next restart.
            if round_ == 0:
                current = pod
            elif round_ == 1:
                current = wait_for(replaced, timeout=60, what="the roll-out to finish")
            crashed.add(current["metadata"]["name"])
            crash_container(kubectl, current["metadata"]["name"], namespace, "oomkilled")

            def counted(expected: int = round_ + 1) -> dict[str, Any] | None:
                obj = kubectl.json("get", "inferencemodel", "chat", "-n", namespace)
                handled = ((obj.get("status") or {}).get("remediation") or {}).get("handledCrashes") or []
                return obj if len(handled) >= expected else None

            obj = wait_for(counted, timeout=60, what=f"crash {round_ + 1} recorded")
    finally:
        stop.set()
        thread.join(timeout=10)
    handled = obj["status"]["remediation"]["handledCrashes"]
    assert len(handled) == len(set(handled)) == crashes
    assert obj["status"]["remediation"]["actionsToday"] == 1
    assert [o["result"] for o in obj["status"]["remediation"]["outcomes"]] == ["recurred"]
    conflicts = operator.log_text().count("changed meanwhile; deciding again")
    print(f"\n{writes[0]} concurrent annotation writes; the OOM handler met {conflicts} conflict(s)")


def test_sigkill_at_random_points_of_remediation_acts_on_every_crash_exactly_once(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """20 rounds: crash a model's pod, SIGKILL the active replica at a random moment of the handling
    (0-3 s after the crash), let the standby or the restarted replica take over. Each crash must be
    recorded once and acted on once: one history entry, one raised memory, never two."""
    rounds = 20
    rng = random.Random(20261123)
    names = [f"chat-{i}" for i in range(rounds)]
    template = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    template["spec"]["gpu"] = {"types": ["L4", "L40S", "A100-80GB", "H100-80GB"]}
    template["spec"]["replicas"] = 1
    outcomes: list[str] = []
    for i, name in enumerate(names):
        doc = json.loads(json.dumps(template))
        doc["metadata"]["name"] = name
        kubectl.apply(doc, namespace)
        wait_phase(kubectl, namespace, name, "Ready", timeout=120)
        [pod] = pods_of(kubectl, namespace, name)
        old_memory = pod["spec"]["containers"][0]["resources"]["limits"]["memory"]
        active = operator.active(timeout=60)
        delay = rng.uniform(0, 3)
        crash_container(kubectl, pod["metadata"]["name"], namespace, "oomkilled")
        time.sleep(delay)
        operator.kill(active, signal.SIGKILL)

        def settled(name: str = name, old_memory: str = old_memory) -> dict[str, Any] | None:
            obj = kubectl.json("get", "inferencemodel", name, "-n", namespace)
            remediation = (obj.get("status") or {}).get("remediation") or {}
            deployment = kubectl.json("get", "deployment", name, "-n", namespace)
            memory = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
            return obj if remediation.get("handledCrashes") and memory != old_memory else None

        obj = wait_for(settled, timeout=90, what=f"round {i}: the crash acted on after the kill")
        remediation = obj["status"]["remediation"]
        history = remediation.get("history") or []
        ok = (
            len(remediation["handledCrashes"]) == 1
            and remediation["actionsToday"] == 1
            and len(history) == 1
            and (obj["status"].get("incidents") or [{}])[-1].get("count") == 1
        )
        outcomes.append("once" if ok else f"round {i}: {json.dumps(remediation)[:400]}")
        kubectl("delete", "inferencemodel", name, "-n", namespace, "--wait=false")
    once = outcomes.count("once")
    print(f"\nSIGKILL chaos: {rounds} rounds, {once} crashes acted on exactly once, "
          f"{rounds - once} lost or doubled; replica restarts {[r.restarts for r in operator.replicas]}")  # fmt: skip
    assert once == rounds, [o for o in outcomes if o != "once"]


def test_api_server_and_etcd_restart_under_the_operator(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """Stop etcd and the kube-apiserver, start them again: the operator recovers by itself (its
    replicas restarted by the harness as the kubelet would) and reconciles a new model within 30 s."""
    cluster_dir = STATE_DIR / "kwok" / "clusters" / "loadline-e2e"
    for component in ("kube-apiserver", "etcd"):
        pid = int((cluster_dir / "pids" / f"{component}.pid").read_text())
        subprocess.run(["kill", "-9", str(pid)], check=False)
    time.sleep(3)
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(E2E_DIR / "cluster-up.sh")], check=True, capture_output=True, timeout=300, env=env
    )
    back = time.monotonic()
    kubectl.apply(example(REPO / "examples" / "chat-llama-8b.yaml", namespace), namespace)
    wait_phase(kubectl, namespace, "chat", "Ready", timeout=30)
    print(f"\nAPI server back → new model Ready in {time.monotonic() - back:.1f}s")


def _review(url: str, namespace: str) -> str:
    """POST the AdmissionReview the API server sends for ``kubectl apply`` of a model (dry run) to a
    replica's webhook; what came back: ``allowed``, ``denied``, ``HTTP <code>``, or ``closed``."""
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": GROUP, "version": VERSION, "kind": KIND},
            "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": doc,
            "oldObject": None,
            "dryRun": True,
        },
    }
    tls = ssl.create_default_context()
    tls.check_hostname = False
    tls.verify_mode = ssl.CERT_NONE  # the answer is under test here, not the certificate
    request = urllib.request.Request(
        url, data=json.dumps(review).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5, context=tls) as answer:
            allowed = json.loads(answer.read())["response"]["allowed"]
            return "allowed" if allowed else "denied"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError):
        return "closed"


def test_a_replica_started_before_discovery_lists_the_crds_serves_admission_once_it_does(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """For a moment after it starts, the API server serves the CRDs' objects but its discovery does not
    list them. A replica (re)started then (its leader lost the Lease during a control-plane restart)
    once kept kopf's view without loadline.dev: its webhooks answered every model 404, and with
    failurePolicy Fail every ``kubectl apply`` was refused until it was restarted (CI, after the test
    above). Now the replica waits: its webhook port stays closed (the Service skips it, as a pod not
    ready) while discovery does not list the CRDs, and it answers as soon as it does.

    The replica runs against the real API server through ``e2e/discovery_gap.py``, which hides
    loadline.dev from discovery (only) while a flag file exists, behind a ``kubectl proxy`` holding the
    chart's ServiceAccount token."""
    flag = tmp_path / "hide-loadline.dev"
    flag.touch()
    hidden_answers = flag.with_name(flag.name + ".hidden")
    proxy_port, gap_port = free_port(), free_port()
    proxy = subprocess.Popen(
        [str(kubectl_binary()), "--kubeconfig", str(operator.kubeconfig), "proxy", f"--port={proxy_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    gap = subprocess.Popen(
        [sys.executable, str(E2E_DIR / "discovery_gap.py"), str(gap_port), f"http://127.0.0.1:{proxy_port}",
         str(flag)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "gap",
        "clusters": [{"name": "gap", "cluster": {"server": f"http://127.0.0.1:{gap_port}"}}],
        "users": [{"name": "gap", "user": {}}],
        "contexts": [{"name": "gap", "context": {"cluster": "gap", "user": "gap"}}],
    }))  # fmt: skip
    wait_for(lambda: answers(f"http://127.0.0.1:{gap_port}/version") or None, timeout=30,
             what="kubectl proxy and the discovery gap in front of it")  # fmt: skip
    replica = operator.side_replica(kubeconfig)
    url = f"https://127.0.0.1:{replica.env['LOADLINE_WEBHOOK_PORT']}/mutate-inferencemodel"
    try:
        # While hidden: the replica has read discovery (and again, as it waits); its webhooks never answer.
        while_hidden: list[str] = []
        wait_for(lambda: hidden_answers.exists() or None, timeout=60, what="the replica reading discovery")
        looked = time.monotonic()
        while time.monotonic() - looked < 8:
            while_hidden.append(_review(url, namespace))
            time.sleep(0.5)
        assert replica.alive(), replica.log.read_text(errors="replace")[-2000:]
        assert set(while_hidden) == {"closed"}, while_hidden
        reads_while_hidden = len(hidden_answers.read_text().split())

        flag.unlink()
        listed = time.monotonic()
        answered = wait_for(
            lambda: (outcome if (outcome := _review(url, namespace)) != "closed" else None),
            timeout=30, what="the replica's webhook answering once discovery lists the CRDs",
        )  # fmt: skip
        print(f"\nwebhook closed while discovery hid the CRDs ({reads_while_hidden} discovery reads); "
              f"answered {answered!r} {time.monotonic() - listed:.1f} s after it listed them")  # fmt: skip
        assert answered == "allowed"
        assert reads_while_hidden >= 2  # it kept looking, rather than keeping its first view
    finally:
        if replica.alive():
            operator.kill(replica, signal.SIGTERM, restart=False)
        for process in (gap, proxy):
            process.terminate()
            process.wait(timeout=10)
