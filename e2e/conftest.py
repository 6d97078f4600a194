"""Fixtures for the e2e tests against the local control plane (see docs/control-plane.md).

The session brings the cluster up with e2e/cluster-up.sh when it is not
already serving. If that fails the tests FAIL with the reason (a missing tool,
a build error, a timeout): an e2e run never turns into a silent skip.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from tests.hubserver import HubServer

from chart import HUB_TOKEN_SECRET, OPERATOR_NAMESPACE, ChartOperator, install, uninstall
from kube import E2E_DIR, KUBECONFIG, STATE_DIR, Kubectl, KubectlError, wait_for

CLUSTER_UP_TIMEOUT = float(os.environ.get("LOADLINE_CLUSTER_UP_TIMEOUT", "3600"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_upgrade first: it installs an earlier loadline, which must be the only operator that sees
    its models, and the session's operator (started by the first test that needs it) watches all."""
    items.sort(key=lambda item: item.path.name != "test_upgrade.py")


OPERATOR_LOG_LINES = 80
"""How many of the operator's log lines about a failed test's namespace its report shows."""
OPERATOR_TAIL_LINES = 15
"""How many last lines of a replica's log it shows when none is about the test's namespace."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report shows what the operator's replicas logged about its namespace: CI keeps
    the report, not the replicas' log files."""
    report: pytest.TestReport = yield
    if report.when != "call" or not report.failed:
        return report
    funcargs = getattr(item, "funcargs", {})
    namespace = funcargs.get("namespace")
    for value in funcargs.values():
        if not isinstance(value, ChartOperator):
            continue
        for replica, text in value.logs():
            lines = text.splitlines()
            about = [line for line in lines if namespace and namespace in line]
            if about:
                report.sections.append(
                    (f"{replica.pod_name} log, its namespace", "\n".join(about[-OPERATOR_LOG_LINES:]))
                )
            elif lines:
                report.sections.append(
                    (f"{replica.pod_name} log, its end", "\n".join(lines[-OPERATOR_TAIL_LINES:]))
                )
    return report


def _bring_cluster_up() -> None:
    STATE_DIR.mkdir(exist_ok=True)
    log = STATE_DIR / "cluster-up.log"
    env = {**os.environ, "PYTHON": sys.executable}
    try:
        with log.open("w") as out:
            proc = subprocess.run(
                ["bash", str(E2E_DIR / "cluster-up.sh")],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=CLUSTER_UP_TIMEOUT,
                check=False,
            )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"e2e/cluster-up.sh did not finish in {CLUSTER_UP_TIMEOUT:.0f}s; see {log}", pytrace=False
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        pytest.fail(
            f"the local control plane could not be brought up (e2e/cluster-up.sh exited {proc.returncode}).\n"
            f"Last lines of {log}:\n{tail}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def kubeconfig() -> Path:
    """Path of a kubeconfig for a serving local cluster (brought up when needed)."""
    if not Kubectl(KUBECONFIG).ready():
        _bring_cluster_up()
    if not Kubectl(KUBECONFIG).ready():
        pytest.fail(
            f"cluster-up finished but the API server does not answer /readyz via {KUBECONFIG}", pytrace=False
        )
    return KUBECONFIG


@pytest.fixture(scope="session")
def kubectl(kubeconfig: Path) -> Kubectl:
    """kubectl bound to the e2e cluster: ``kubectl("get", "nodes")`` returns stdout; ``.json()`` decodes.

    Admission webhooks of an earlier run whose replicas are gone (a killed session, `make demo-down`)
    would refuse every InferenceModel (failurePolicy Fail): they go first."""
    kubectl = Kubectl(kubeconfig)
    kubectl.run("delete", "validatingwebhookconfigurations,mutatingwebhookconfigurations",
                "-l", "app.kubernetes.io/name=loadline", "--ignore-not-found", check=False)  # fmt: skip
    return kubectl


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"e2e-{slug}-{uuid.uuid4().hex[:6]}"


def _delete_inference_models(kubectl: Kubectl, namespace: str) -> None:
    proc = kubectl.run(
        "delete", "inferencemodels.loadline.dev", "--all", "-n", namespace, "--ignore-not-found",
        "--wait=true", "--timeout=60s", check=False, timeout=90,
    )  # fmt: skip
    if proc.returncode != 0 and "the server doesn't have a resource type" not in proc.stderr:
        raise KubectlError(
            ["delete", "inferencemodels.loadline.dev"], proc.returncode, proc.stdout, proc.stderr
        )


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test; afterwards its InferenceModels are deleted first
    (so finalizers run while their children still exist), then the namespace."""
    name = _namespace_name(request.node.name)
    kubectl("create", "namespace", name)
    try:
        # Pods can only be created once the serviceaccount controller made "default".
        wait_for(
            lambda: kubectl.run("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
            timeout=30,
            what=f"serviceaccount default in namespace {name}",
        )
        yield name
    finally:
        _delete_inference_models(kubectl, name)
        kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture(scope="session")
def hub() -> Iterator[HubServer]:
    """A local stand-in for the Hugging Face hub's file endpoint (loopback), for config.json fetches."""
    with HubServer(STATE_DIR / "hub") as server:
        yield server


@pytest.fixture(scope="session")
def prometheus_url() -> Iterator[str]:
    """A real Prometheus on loopback (e2e/prometheus.sh) that the operator reads crash-time metrics from."""
    script = E2E_DIR / "prometheus.sh"
    subprocess.run(["bash", str(script), "reset"], check=True, capture_output=True, timeout=120)
    proc = subprocess.run(
        ["bash", str(script), "up"], check=True, capture_output=True, text=True, timeout=120
    )
    url = proc.stdout.strip().splitlines()[-1]
    try:
        yield url
    finally:
        subprocess.run(["bash", str(script), "down"], check=False, capture_output=True, timeout=60)


RESTART_WINDOW_MINUTES = 4
OUTCOME_HORIZON_MINUTES = 5
RESTART_HISTORY_DAYS = 6


def operator_values(hub_url: str, prometheus_url: str) -> dict[str, object]:
    """The chart values the e2e session installs with, as a platform team would set them."""
    return {
        "settings": {
            "hfFetch": True,
            "hfEndpoint": hub_url,
            "hubTokenSecretNames": [HUB_TOKEN_SECRET],
            "prometheusUrl": prometheus_url,
            "retryDelaySeconds": 3,
            # Short enough for a test to see the OOM-risk estimate from backfilled history.
            "measureIntervalSeconds": 10,
            "riskIntervalSeconds": 20,
            # A fix's outcome judged on the clock within a test (its timer looks every 25 s); a crash
            # that recurs in a test comes well within it (test_oom).
            "remediation": {"outcomeHorizonMinutes": OUTCOME_HORIZON_MINUTES},
            # Windows short enough to wait for, learned from minute-resolution history (test_restarts).
            "restarts": {
                "windowMinutes": RESTART_WINDOW_MINUTES,
                "historyDays": RESTART_HISTORY_DAYS,
                "intervalSeconds": 2,
            },
        }
    }


@pytest.fixture(scope="session")
def operator(
    kubeconfig: Path, kubectl: Kubectl, hub: HubServer, prometheus_url: str
) -> Iterator[ChartOperator]:
    """loadline as the Helm chart installs it: its CRDs, ServiceAccount, RBAC and Deployment applied to
    the local control plane, the Deployment's two replicas run as processes under the chart's own
    ServiceAccount token (e2e/chart.py); one holds the Lease and reconciles.

    Hub fetching is on and points at the local `hub` fixture; crash-time metrics come from the
    `prometheus_url` fixture's Prometheus."""
    chart = install(kubectl, "loadline", OPERATOR_NAMESPACE, operator_values(hub.url, prometheus_url))
    try:
        chart.active(timeout=60)
        yield chart
    finally:
        uninstall(chart)  # its webhooks too: they would refuse every apply once the replicas are gone
