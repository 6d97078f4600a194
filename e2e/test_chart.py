"""The Helm chart as a cluster runs it: rendered, applied, its replicas elect one leader, its identity
is held to least privilege (e2e/chart.py runs the Deployment's replicas as processes)."""

from __future__ import annotations

import re
import signal
import time

import pytest
import yaml

from chart import HUB_TOKEN_SECRET, OPERATOR_NAMESPACE, ChartOperator, render
from kube import REPO, Kubectl, wait_for
from operator_helpers import example, wait_phase

SA = f"system:serviceaccount:{OPERATOR_NAMESPACE}:loadline-loadline"


def can_i(kubectl: Kubectl, *args: str, user: str = SA) -> bool:
    """`kubectl auth can-i` as the chart's ServiceAccount (the API server's own authorizer answers)."""
    proc = kubectl.run("auth", "can-i", *args, "--as", user, check=False)
    return proc.stdout.strip() == "yes"


def test_chart_renders_and_the_api_server_accepts_every_object(kubectl: Kubectl, namespace: str) -> None:
    docs = render("loadline", namespace, {})
    kinds = sorted(d["kind"] for d in docs)
    crds = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition")
    assert crds == ["fleetpolicies.loadline.dev", "inferencemodels.loadline.dev"]
    assert {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    } <= set(kinds)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LOADLINE_LEADER_ELECTION"]["value"] == "true" and deployment["spec"]["replicas"] == 2
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    stream = "".join("---\n" + yaml.safe_dump(d) for d in docs)
    out = kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=stream)
    assert "serverside-applied (server dry run)" in out


def test_one_replica_is_active_and_models_are_reconciled(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    active = operator.active()
    alive = [r for r in operator.replicas if r.alive()]
    assert len(alive) == 2
    # The standby answers the kubelet's liveness probe too (else the kubelet would kill it).
    standby = next(r for r in alive if r is not active)
    # (The leader's /healthz moves from the standby server to kopf's as it starts: one probe period,
    # 20 s, is far less than the 3 failed probes the kubelet waits for.)
    assert standby.healthz() == "standby"
    wait_for(active.healthz, timeout=20, what="the leader to answer /healthz")
    kubectl.apply(example(REPO / "examples" / "chat-llama-8b.yaml", namespace), namespace)
    wait_phase(kubectl, namespace, "chat", "Ready")
    # Only the leader reconciled it (the standby may have answered its admission, nothing more).
    assert namespace in active.log.read_text()
    standby_lines = [line for line in standby.log.read_text().splitlines() if namespace in line]
    assert [line for line in standby_lines if "Webhook '" not in line] == []


@pytest.mark.parametrize("which", ["active", "standby"])
def test_losing_either_replica_leaves_one_active(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, which: str
) -> None:
    """SIGKILL and no restart (a node lost: no chance to release the Lease): the other replica takes
    over once the Lease expires; losing the standby changes nothing. A model applied afterwards is
    reconciled, and the pod the ReplicaSet creates in the lost one's place stands by."""
    active = operator.active()
    standby = next(r for r in operator.replicas if r.alive() and r is not active)
    victim, survivor = (active, standby) if which == "active" else (standby, active)
    holder = operator.holder()
    start = time.monotonic()
    operator.kill(victim, signal.SIGKILL, restart=False)
    assert operator.active(timeout=60) is survivor
    handover = time.monotonic() - start
    print(f"\nkill -9 of the {which} replica: {survivor.pod_name} active after {handover:.1f}s")
    lease_duration = int(operator.lease()["spec"]["leaseDurationSeconds"])
    if which == "standby":
        assert operator.holder() == holder  # nothing changed hands: the same process still leads
    else:
        assert handover >= lease_duration - 3  # it waited for the Lease to expire (renewed every 2 s)
    kubectl.apply(example(REPO / "examples" / "chat-llama-8b.yaml", namespace), namespace)
    wait_phase(kubectl, namespace, "chat", "Ready", timeout=90)
    operator.scale_to(2)  # the ReplicaSet's replacement pod
    operator.wait_replicas(2)
    assert operator.active() is survivor


def test_a_crashed_container_restarted_in_its_pod_competes_fairly(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """SIGKILL of the active replica's process, restarted by the kubelet in the same pod: the new
    process is a new candidate (it does not resume the Lease its predecessor held), so for a whole
    Lease duration nobody leads, then exactly one replica does and reconciles."""
    active = operator.active()
    old_identity = active.identity()
    start = time.monotonic()
    operator.kill(active, signal.SIGKILL, restart=True)
    operator.wait_replicas(2)
    leader = operator.active(timeout=60)
    handover = time.monotonic() - start
    print(
        f"\nkill -9 of the active process, restarted in its pod: {leader.pod_name} active after {handover:.1f}s"
    )
    assert operator.holder() != old_identity
    lease_duration = int(operator.lease()["spec"]["leaseDurationSeconds"])
    assert handover >= lease_duration - 3
    kubectl.apply(example(REPO / "examples" / "chat-llama-8b.yaml", namespace), namespace)
    wait_phase(kubectl, namespace, "chat", "Ready", timeout=90)


def test_sigterm_hands_over_at_once(operator: ChartOperator, kubectl: Kubectl) -> None:
    """The kubelet stopping a pod (SIGTERM, as in a rolling update) releases the Lease: no wait."""
    active = operator.active()
    standby = next(r for r in operator.replicas if r.alive() and r is not active)
    start = time.monotonic()
    operator.kill(active, signal.SIGTERM, restart=False)
    assert operator.active(timeout=30) is standby
    handover = time.monotonic() - start
    print(f"\nSIGTERM of the active replica: {standby.pod_name} active after {handover:.1f}s")
    lease_duration = int(operator.lease()["spec"]["leaseDurationSeconds"])
    assert handover < lease_duration
    operator.scale_to(2)
    operator.wait_replicas(2)


def test_the_identity_is_refused_what_it_does_not_need(operator: ChartOperator, kubectl: Kubectl) -> None:
    refused = [
        ("get", "secrets", "-n", "kube-system"),
        ("get", "secrets/other", "-n", "default"),
        ("list", "secrets", "-n", "default"),
        ("get", "secrets/kube-root-ca", "-n", OPERATOR_NAMESPACE),
        ("create", "clusterrolebindings"),
        ("create", "rolebindings", "-n", "default"),
        ("escalate", "clusterroles"),
        ("bind", "clusterroles"),
        ("delete", "nodes"),
        ("patch", "nodes"),
        ("create", "pods", "--subresource=exec", "-n", "default"),
        ("delete", "pods", "-n", "default"),
        ("create", "pods", "-n", "default"),
        ("update", "inferencemodels.loadline.dev", "-n", "default"),
        ("update", "leases/other-lease", "-n", OPERATOR_NAMESPACE),
        ("get", "leases/loadline", "-n", "kube-system"),
        ("list", "events", "-n", "default"),  # it posts Events; it reads none
        ("patch", "configmaps/other", "-n", OPERATOR_NAMESPACE),  # of its own, only the observation store
    ]
    allowed = [
        ("create", "pods", "--subresource=eviction", "-n", "default"),
        ("update", "inferencemodels.loadline.dev", "--subresource=finalizers", "-n", "default"),
        ("patch", "inferencemodels.loadline.dev", "--subresource=status", "-n", "default"),
        ("get", f"secrets/{HUB_TOKEN_SECRET}", "-n", "default"),
        ("update", "leases/loadline", "-n", OPERATOR_NAMESPACE),
        ("patch", "configmaps/loadline-observations", "-n", OPERATOR_NAMESPACE),
        ("list", "nodes"),
    ]
    assert [args for args in refused if can_i(kubectl, *args)] == []
    assert [args for args in allowed if not can_i(kubectl, *args)] == []


def test_namespace_scoped_install_grants_only_its_namespaces(kubectl: Kubectl, namespace: str) -> None:
    """settings.namespaces: Roles and RoleBindings in exactly those namespaces; nothing namespaced is
    granted cluster-wide; the Lease Role stays in the release namespace."""
    release_ns = f"{namespace}-op"
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "charts" / "loadline" / "crds"))
    kubectl("create", "namespace", release_ns)
    try:
        docs = render("scoped", release_ns, {"settings": {"namespaces": namespace}}, include_crds=False)
        roles = {
            (d["kind"], d["metadata"].get("namespace")) for d in docs if d["kind"] in {"Role", "RoleBinding"}
        }
        assert ("Role", namespace) in roles and ("RoleBinding", namespace) in roles
        assert ("Role", release_ns) in roles  # leader election
        # The webhooks of a scoped install look at its namespaces only.
        hooks = [h for d in docs if d["kind"].endswith("WebhookConfiguration") for h in d["webhooks"]]
        scoped = [h["namespaceSelector"]["matchExpressions"][0]["values"] for h in hooks
                  if h["rules"][0]["resources"] == ["inferencemodels"]]  # fmt: skip
        assert scoped == [[namespace], [namespace]]
        # Its identity and RBAC only: no replica runs here to answer webhooks.
        rbac = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
        stream = "".join("---\n" + yaml.safe_dump(d) for d in docs if d["kind"] in rbac)
        kubectl("apply", "--server-side", "-f", "-", input=stream)
        user = f"system:serviceaccount:{release_ns}:scoped-loadline"
        assert can_i(kubectl, "patch", "deployments", "-n", namespace, user=user)
        assert can_i(kubectl, "get", "replicasets", "-n", namespace, user=user)
        assert not can_i(kubectl, "list", "replicasets", "-n", namespace, user=user)
        assert can_i(kubectl, "watch", "inferencemodels.loadline.dev", "-n", namespace, user=user)
        assert can_i(kubectl, "update", "leases/loadline", "-n", release_ns, user=user)
        assert not can_i(kubectl, "patch", "deployments", "-n", "default", user=user)
        assert not can_i(kubectl, "list", "inferencemodels.loadline.dev", "--all-namespaces", user=user)
        assert not can_i(kubectl, "get", "secrets", "-n", namespace, user=user)
        assert can_i(kubectl, "list", "nodes", user=user)  # capacity needs the GPU nodes
    finally:
        for doc in docs:
            if doc["kind"] in {"ClusterRole", "ClusterRoleBinding"}:
                kubectl.run("delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False)
        kubectl("delete", "namespace", release_ns, "--wait=false")


def _priority_headers(as_operator: Kubectl, *args: str) -> dict[str, str]:
    """The flow schema and priority level uids the API server names in the answer to one request."""
    proc = as_operator.run(*args, "-v=8", check=False)
    return {
        m.group(1).lower(): m.group(2)
        for m in re.finditer(
            r'"?(X-Kubernetes-Pf-\w+-Uid)"?[:=]\s*"?([0-9a-f-]{36})', proc.stderr, re.IGNORECASE
        )
    }


def test_the_operators_requests_get_its_own_priority_level(operator: ChartOperator, kubectl: Kubectl) -> None:
    """The chart's FlowSchemas classify every request of the operator's ServiceAccount at
    workload-high (the API server names the flow schema and priority level it used in each answer's
    X-Kubernetes-PF-* headers), not at the service-accounts schema's workload-low, and its Lease
    renewals at leader-election, so a burst of its own work cannot starve them."""
    schemas = {d["metadata"]["name"]: d for d in operator.docs if d["kind"] == "FlowSchema"}
    main_name = next(n for n in schemas if not n.endswith("-leases"))
    uid = kubectl.json("get", "flowschema", main_name)["metadata"]["uid"]
    lease_uid = kubectl.json("get", "flowschema", f"{main_name}-leases")["metadata"]["uid"]
    level = kubectl.json("get", "prioritylevelconfiguration", "workload-high")["metadata"]["uid"]
    election = kubectl.json("get", "prioritylevelconfiguration", "leader-election")["metadata"]["uid"]
    as_operator = Kubectl(operator.kubeconfig)
    headers = _priority_headers(as_operator, "get", "inferencemodels", "-A")
    assert headers.get("x-kubernetes-pf-flowschema-uid") == uid, headers
    assert headers.get("x-kubernetes-pf-prioritylevel-uid") == level
    lease = str((operator.values.get("leaderElection") or {}).get("leaseName") or "loadline")
    headers = _priority_headers(as_operator, "get", "lease", lease, "-n", operator.namespace)
    assert headers.get("x-kubernetes-pf-flowschema-uid") == lease_uid, headers
    assert headers.get("x-kubernetes-pf-prioritylevel-uid") == election
