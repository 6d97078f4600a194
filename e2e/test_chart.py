"""The Helm chart renders and the real API server accepts every object it would install."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from kube import E2E_DIR, REPO, Kubectl, lib_var


def helm() -> Path:
    binary = Path(lib_var("HELM_BIN")) / "helm"
    if not binary.exists():
        subprocess.run(["bash", str(E2E_DIR / "install-tools.sh"), "helm"], check=True, timeout=1800)
    return binary


def test_chart_installs_cleanly_on_the_api_server(kubectl: Kubectl, namespace: str) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "charts" / "loadline" / "crds"))
    rendered = subprocess.run(
        [str(helm()), "template", "loadline", str(REPO / "charts" / "loadline"), "--namespace", namespace,
         "--kube-version", "1.36.3", "--include-crds"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("CustomResourceDefinition") == 3
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"} <= set(
        kinds
    )
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LOADLINE_STANDALONE"] == "false" and deployment["spec"]["replicas"] == 2
    out = kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=rendered)
    assert "serverside-applied (server dry run)" in out
