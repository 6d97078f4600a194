"""The Helm chart as a cluster runs it, on the local control plane.

``helm template`` renders ``charts/loadline`` with the values a platform team would set; every object is
applied to the real API server (CRDs, ServiceAccount, RBAC, Deployment). KWOK runs no containers, so each
replica of the chart's Deployment runs here as a process: with exactly the env the chart gives the pod's
container (``valueFrom.fieldRef`` resolved as the kubelet resolves it, for a pod name of its own) and
a token of the chart's ServiceAccount, issued by the API server's TokenRequest API, in a kubeconfig of
its own. The process never sees the cluster-admin kubeconfig.

The one thing that differs from a pod: two pods have two network namespaces, two processes on one
machine share one, so each replica gets its own free ports for ``LOADLINE_LIVENESS_PORT`` and
``LOADLINE_METRICS_PORT`` (the chart's ports, moved like a hostPort would be). Nothing else is changed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kube import E2E_DIR, REPO, STATE_DIR, Kubectl, lib_var, wait_for

CHART = REPO / "charts" / "loadline"
LOADLINE = Path(sys.executable).parent / "loadline"
PORT_ENV = ("LOADLINE_LIVENESS_PORT", "LOADLINE_METRICS_PORT")
OPERATOR_NAMESPACE = "loadline-system"  # the e2e session's release namespace
HUB_TOKEN_SECRET = "hf"  # the Secret name the session's values let the operator read (hub tokens)


def helm() -> Path:
    """Helm from the cache (``make tools`` builds it; built here on demand when it is missing)."""
    binary = Path(lib_var("HELM_BIN")) / "helm"
    if not binary.exists():
        subprocess.run(["bash", str(E2E_DIR / "install-tools.sh"), "helm"], check=True, timeout=1800)
    return binary


def render(
    release: str, namespace: str, values: dict[str, Any], *, include_crds: bool = True
) -> list[dict[str, Any]]:
    """``helm template`` of the chart with ``values`` (as a values file), parsed."""
    STATE_DIR.mkdir(exist_ok=True)
    values_file = STATE_DIR / f"values-{release}-{namespace}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    cmd = [str(helm()), "template", release, str(CHART), "--namespace", namespace, "--kube-version", "1.36.3",
           "-f", str(values_file)]  # fmt: skip
    if include_crds:
        cmd.append("--include-crds")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pod_env(container: dict[str, Any], pod_name: str, namespace: str) -> dict[str, str]:
    """The container's env as the kubelet gives it to a pod named ``pod_name``."""
    fields = {"metadata.name": pod_name, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = (item.get("valueFrom") or {}).get("fieldRef") or {}
        if ref.get("fieldPath") not in fields:
            raise ValueError(f"env {item['name']}: the harness cannot resolve {item.get('valueFrom')}")
        env[item["name"]] = fields[ref["fieldPath"]]
    return env


def token_kubeconfig(kubectl: Kubectl, service_account: str, namespace: str, path: Path) -> Path:
    """A kubeconfig that authenticates as ``service_account`` with a TokenRequest token (24 h)."""
    token = kubectl("create", "token", service_account, "-n", namespace, "--duration=24h").strip()
    admin = yaml.safe_load(kubectl.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": service_account}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class Replica:
    """One replica of the chart's Deployment, run as a process. While ``keep_running`` is set, the
    harness restarts it when it exits, as the kubelet restarts a pod's container (restartPolicy Always)."""

    pod_name: str
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    keep_running: bool = True
    restarts: int = 0
    log_offset: int = 0  # where the running process's output starts in ``log``

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.env['LOADLINE_LIVENESS_PORT']}/healthz"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def identity(self) -> str:
        """The Lease identity of the running process, as it logged it: the pod name and a suffix
        drawn per process, so a restarted container is not mistaken for its crashed predecessor."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as f:
            f.seek(self.log_offset)
            text = f.read().decode(errors="replace")
        found = re.findall(r"candidate: for lease \S+ as (\S+)", text)
        return found[-1] if found else ""

    def healthz(self) -> str | None:
        """What /healthz answers (as the kubelet's liveness probe sees it), None when it does not."""
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as response:
                return str(response.read().decode() or response.status)
        except OSError:
            return None


@dataclass
class ChartOperator:
    """The chart installed on the local control plane, its replicas run as processes."""

    kubectl: Kubectl
    release: str
    namespace: str
    docs: list[dict[str, Any]]
    kubeconfig: Path
    replicas: list[Replica] = field(default_factory=list)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _supervisor: threading.Thread | None = None
    detach: bool = False  # replicas outlive this process (make demo)

    @property
    def deployment(self) -> dict[str, Any]:
        return next(d for d in self.docs if d["kind"] == "Deployment")

    @property
    def container(self) -> dict[str, Any]:
        containers: list[dict[str, Any]] = self.deployment["spec"]["template"]["spec"]["containers"]
        return containers[0]

    @property
    def service_account(self) -> str:
        return str(self.deployment["spec"]["template"]["spec"]["serviceAccountName"])

    @property
    def lease_name(self) -> str:
        env = {e["name"]: e.get("value") for e in self.container.get("env") or []}
        return str(env.get("LOADLINE_LEASE_NAME") or "loadline")

    def new_replica(self) -> Replica:
        """A replica like the ReplicaSet would create: a fresh pod name, the chart's env, its own ports."""
        suffix = os.urandom(3).hex()
        pod_name = f"{self.deployment['metadata']['name']}-{suffix[:5]}"
        env = pod_env(self.container, pod_name, self.namespace)
        for name in PORT_ENV:
            env[name] = str(free_port())
        log = STATE_DIR / f"operator-{self.release}-{pod_name}.log"
        replica = Replica(pod_name, env, log)
        self.replicas.append(replica)
        return replica

    def start(self, replica: Replica) -> Replica:
        image_args = [str(a) for a in self.container.get("args") or ["run"]]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
               **replica.env, "KUBECONFIG": str(self.kubeconfig)}  # fmt: skip
        out = replica.log.open("ab")
        replica.log_offset = out.tell()
        # The image's ENTRYPOINT is `loadline` (Dockerfile); the chart gives its args.
        replica.process = subprocess.Popen([str(LOADLINE), *image_args], stdout=out, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=self.detach)  # fmt: skip
        return replica

    def scale_to(self, count: int) -> None:
        while len([r for r in self.replicas if r.alive()]) < count:
            self.start(self.new_replica())

    def kill(self, replica: Replica, sig: int = signal.SIGKILL, *, restart: bool = True) -> None:
        """Signal a replica and wait for it to exit: SIGKILL is a crash, SIGTERM the kubelet stopping
        it. With ``restart`` the supervisor starts it again (a container restart in the same pod)."""
        assert replica.process is not None
        replica.keep_running = restart
        replica.process.send_signal(sig)
        try:
            replica.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            replica.process.kill()
            replica.process.wait()

    def stop(self) -> None:
        self._stopping.set()
        for replica in self.replicas:
            replica.keep_running = False
            if replica.alive():
                self.kill(replica, signal.SIGTERM)

    def lease(self) -> dict[str, Any]:
        result: dict[str, Any] = self.kubectl.json("get", "lease", self.lease_name, "-n", self.namespace)
        return result

    def wait_replicas(self, count: int = 2, timeout: float = 60) -> None:
        """Until ``count`` replicas run and answer /healthz (after a restart, say)."""
        wait_for(
            lambda: len([r for r in self.replicas if r.alive() and r.healthz() is not None]) >= count or None,
            timeout=timeout,
            what=f"{count} replicas of {self.release} answering /healthz",
        )

    def supervise(self) -> None:
        """Restart exited replicas (1 s back-off), as the kubelet would, until :meth:`stop`."""

        def loop() -> None:
            while not self._stopping.wait(0.5):
                for replica in list(self.replicas):
                    if (
                        replica.keep_running
                        and replica.process is not None
                        and replica.process.poll() is not None
                    ):
                        time.sleep(1)
                        if not self._stopping.is_set() and replica.keep_running:
                            replica.restarts += 1
                            self.start(replica)

        self._supervisor = threading.Thread(target=loop, name=f"kubelet-{self.release}", daemon=True)
        self._supervisor.start()

    def holder(self) -> str:
        proc = self.kubectl.run(
            "get", "lease", self.lease_name, "-n", self.namespace, "-o", "json", check=False
        )
        if proc.returncode != 0:
            return ""
        return str(json.loads(proc.stdout).get("spec", {}).get("holderIdentity") or "")

    def active(self, timeout: float = 60) -> Replica:
        """The replica holding the Lease, once one of the living replicas holds it."""

        def check() -> Replica | None:
            holder = self.holder()
            return next((r for r in self.replicas if holder and r.alive() and r.identity() == holder), None)

        return wait_for(check, timeout=timeout, what=f"a living replica of {self.release} to hold the Lease")

    def logs(self) -> Iterator[tuple[Replica, str]]:
        for replica in self.replicas:
            yield replica, replica.log.read_text(errors="replace") if replica.log.exists() else ""

    def log_text(self) -> str:
        return "\n".join(text for _replica, text in self.logs())


def install(
    kubectl: Kubectl,
    release: str,
    namespace: str,
    values: dict[str, Any],
    *,
    replicas: int | None = None,
    supervise: bool = True,
    detach: bool = False,
) -> ChartOperator:
    """Render the chart, apply every object, and start its Deployment's replicas as processes."""
    docs = render(release, namespace, values)
    kubectl.run("create", "namespace", namespace, check=False)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    stream = "".join("---\n" + yaml.safe_dump(d) for d in crds)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=stream)
    for crd in crds:
        kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")
    stream = "".join("---\n" + yaml.safe_dump(d) for d in rest)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=stream)
    chart = ChartOperator(kubectl, release, namespace, docs, STATE_DIR / f"kubeconfig-{release}-{namespace}")
    # The ServiceAccount's token exists as soon as the ServiceAccount does (TokenRequest).
    wait_for(
        lambda: (
            kubectl.run(
                "get", "serviceaccount", chart.service_account, "-n", namespace, check=False
            ).returncode
            == 0
        ),
        timeout=30,
        what="the chart's ServiceAccount",
    )
    token_kubeconfig(kubectl, chart.service_account, namespace, chart.kubeconfig)
    wanted = replicas if replicas is not None else int(chart.deployment["spec"].get("replicas", 1))
    chart.detach = detach
    chart.scale_to(wanted)
    if supervise:
        chart.supervise()
    return chart


def uninstall(chart: ChartOperator) -> None:
    """Stop the replicas and delete the chart's objects (not its CRDs, which other tests still use)."""
    chart.stop()
    for doc in chart.docs:
        if doc["kind"] in {"CustomResourceDefinition", "Namespace"}:
            continue
        args = ["delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", "--wait=false"]
        if doc["metadata"].get("namespace"):
            args += ["-n", doc["metadata"]["namespace"]]
        chart.kubectl.run(*args, check=False)


DEMO_PIDS = STATE_DIR / "demo-operator.pids"


def main(argv: list[str] | None = None) -> int:
    """``python e2e/chart.py up|down``: the chart on the local control plane for ``make demo``.

    ``up`` installs release ``loadline`` in ``loadline-system`` and starts its replicas detached (their
    pids in .e2e/demo-operator.pids, logs in .e2e/operator-loadline-*.log); ``down`` stops them."""
    import argparse

    parser = argparse.ArgumentParser(prog="e2e/chart.py")
    parser.add_argument("action", choices=["up", "down"])
    args = parser.parse_args(argv)
    if args.action == "down":
        if DEMO_PIDS.exists():
            for line in DEMO_PIDS.read_text().split():
                try:
                    os.kill(int(line), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    continue
            DEMO_PIDS.unlink()
        return 0
    if DEMO_PIDS.exists() and any(_alive(int(p)) for p in DEMO_PIDS.read_text().split()):
        print(f"the chart's replicas already run (pids in {DEMO_PIDS})")
        return 0
    chart = install(Kubectl(), "loadline", OPERATOR_NAMESPACE, {}, supervise=False, detach=True)
    DEMO_PIDS.write_text("\n".join(str(r.process.pid) for r in chart.replicas if r.process) + "\n")
    active = chart.active(timeout=60)
    print(f"loadline chart installed in {OPERATOR_NAMESPACE}: {len(chart.replicas)} replicas under "
          f"ServiceAccount {chart.service_account}; {active.pod_name} holds the Lease; logs: "
          f"{STATE_DIR}/operator-loadline-*.log")  # fmt: skip
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
