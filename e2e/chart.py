"""The Helm chart as a cluster runs it, on the local control plane.

``helm template`` renders ``charts/loadline`` with the values a platform team would set; every object is
applied to the real API server (CRDs, ServiceAccount, RBAC, Deployment). KWOK runs no containers, so each
replica of the chart's Deployment runs here as a process: with exactly the env the chart gives the pod's
container (``valueFrom.fieldRef`` resolved as the kubelet resolves it, for a pod name of its own) and
a token of the chart's ServiceAccount, issued by the API server's TokenRequest API, in a kubeconfig of
its own. The process never sees the cluster-admin kubeconfig.

What differs from a pod, and stands in for what the kubelet and the Service network do:

* two pods have two network namespaces, two processes on one machine share one, so each replica gets
  its own free ports for ``LOADLINE_LIVENESS_PORT``, ``LOADLINE_METRICS_PORT`` and
  ``LOADLINE_WEBHOOK_PORT`` (the chart's ports, moved like a hostPort would be);
* the chart's Secret and ConfigMap volumes are written, as the kubelet writes them (files behind a
  ``..data`` symlink swapped at once), to a directory per replica, and env values naming the mount path
  name that directory; while supervised they follow the object's changes within seconds;
* the API server reaches the webhooks through e2e/forwarder.py on 127.0.0.1 (``webhook.url``), which
  stands in for the webhook Service and kube-proxy: each connection to the next replica that accepts.

Nothing else is changed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import ssl
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

from kube import E2E_DIR, KUBECONFIG, REPO, STATE_DIR, Kubectl, lib_var, wait_for

CHART = REPO / "charts" / "loadline"
LOADLINE = Path(sys.executable).parent / "loadline"
PORT_ENV = ("LOADLINE_LIVENESS_PORT", "LOADLINE_METRICS_PORT", "LOADLINE_WEBHOOK_PORT")
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
    # --dry-run=server: the chart's `lookup` reads the cluster as on `helm upgrade` (the webhook's
    # certificate is kept, or rotated with the old CA still trusted).
    cmd = [str(helm()), "template", release, str(CHART), "--namespace", namespace, "--kube-version", "1.36.3",
           "-f", str(values_file), "--dry-run=server", "--kubeconfig", str(KUBECONFIG)]  # fmt: skip
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


def _mounted_sources(deployment: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The container's Secret and ConfigMap volumes: mount path -> (kind, object name)."""
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    out: dict[str, tuple[str, str]] = {}
    for mount in pod["containers"][0].get("volumeMounts") or []:
        volume = volumes.get(mount["name"]) or {}
        if "secret" in volume:
            out[mount["mountPath"]] = ("secret", volume["secret"]["secretName"])
        elif "configMap" in volume:
            out[mount["mountPath"]] = ("configmap", volume["configMap"]["name"])
    return out


def _object_files(kubectl: Kubectl, kind: str, name: str, namespace: str) -> dict[str, bytes] | None:
    proc = kubectl.run("get", kind, name, "-n", namespace, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    obj = json.loads(proc.stdout)
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    return {k: v.encode() for k, v in (obj.get("data") or {}).items()}


def write_volume(directory: Path, files: dict[str, bytes]) -> bool:
    """Write ``files`` as the kubelet writes a Secret volume: into a fresh directory, then one rename of
    the ``..data`` symlink, so a reader never sees a new certificate beside an old key. False: unchanged."""
    directory.mkdir(parents=True, exist_ok=True)
    current = directory / "..data"
    if current.exists() and all(
        (current / k).exists() and (current / k).read_bytes() == v for k, v in files.items()
    ):
        return False
    version = directory / f"..{time.time_ns()}"
    version.mkdir()
    for key, value in files.items():
        (version / key).write_bytes(value)
    link = directory / "..data_tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(version.name)
    link.replace(current)
    for key in files:
        entry = directory / key
        if not entry.is_symlink():
            entry.unlink(missing_ok=True)
            entry.symlink_to(f"..data/{key}")
    return True


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
    values: dict[str, Any] = field(default_factory=dict)
    forwarder: subprocess.Popen[bytes] | None = None  # the webhook Service's stand-in (e2e/forwarder.py)
    webhook_targets: Path | None = None  # the ports the forwarder sends to, one per replica

    @property
    def webhook_url(self) -> str:
        return str((self.values.get("webhook") or {}).get("url") or "")

    def volume_dir(self, replica: Replica) -> Path:
        return STATE_DIR / f"volumes-{self.release}-{replica.pod_name}"

    def sync_volumes(self, replicas: list[Replica] | None = None) -> None:
        """Write each replica's Secret and ConfigMap volumes where they changed (the kubelet's sync)."""
        for mount_path, (kind, name) in _mounted_sources(self.deployment).items():
            files = _object_files(self.kubectl, kind, name, self.namespace)
            if files is None:
                continue
            for replica in replicas if replicas is not None else self.replicas:
                write_volume(self.volume_dir(replica) / mount_path.strip("/").replace("/", "_"), files)

    def _write_targets(self) -> None:
        if self.webhook_targets is not None:
            ports = [r.env["LOADLINE_WEBHOOK_PORT"] for r in self.replicas
                     if r.keep_running and "LOADLINE_WEBHOOK_PORT" in r.env]  # fmt: skip
            self.webhook_targets.write_text("".join(f"{p}\n" for p in ports))

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

    @property
    def retry_period(self) -> float:
        """Seconds between a replica's rounds on its Leases, as the chart sets them."""
        env = {e["name"]: e.get("value") for e in self.container.get("env") or []}
        return float(env.get("LOADLINE_RETRY_PERIOD_SECONDS") or 2)

    def new_replica(self) -> Replica:
        """A replica like the ReplicaSet would create: a fresh pod name, the chart's env, its own ports."""
        suffix = os.urandom(3).hex()
        pod_name = f"{self.deployment['metadata']['name']}-{suffix[:5]}"
        env = pod_env(self.container, pod_name, self.namespace)
        for name in PORT_ENV:
            if name in env:
                env[name] = str(free_port())
        log = STATE_DIR / f"operator-{self.release}-{pod_name}.log"
        replica = Replica(pod_name, env, log)
        for mount_path in _mounted_sources(self.deployment):
            host_dir = str(self.volume_dir(replica) / mount_path.strip("/").replace("/", "_"))
            for key, value in env.items():
                if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                    env[key] = host_dir + value[len(mount_path.rstrip("/")) :]
        self.sync_volumes([replica])
        self.replicas.append(replica)
        self._write_targets()
        return replica

    def start(self, replica: Replica, kubeconfig: Path | None = None) -> Replica:
        image_args = [str(a) for a in self.container.get("args") or ["run"]]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
               **replica.env, "KUBECONFIG": str(kubeconfig or self.kubeconfig)}  # fmt: skip
        out = replica.log.open("ab")
        replica.log_offset = out.tell()
        # The image's ENTRYPOINT is `loadline` (Dockerfile); the chart gives its args.
        replica.process = subprocess.Popen([str(LOADLINE), *image_args], stdout=out, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=self.detach)  # fmt: skip
        return replica

    def side_replica(self, kubeconfig: Path) -> Replica:
        """One more replica like the chart's, run against ``kubeconfig``, that the webhook Service does
        not send to and the harness does not restart: a test talks to its ports itself."""
        replica = self.new_replica()
        self.replicas.remove(replica)
        self._write_targets()
        replica.keep_running = False
        return self.start(replica, kubeconfig)

    def scale_to(self, count: int) -> None:
        while len([r for r in self.replicas if r.alive()]) < count:
            self.start(self.new_replica())

    def kill(self, replica: Replica, sig: int = signal.SIGKILL, *, restart: bool = True) -> None:
        """Signal a replica and wait for it to exit: SIGKILL is a crash, SIGTERM the kubelet stopping
        it. With ``restart`` the supervisor starts it again (a container restart in the same pod)."""
        assert replica.process is not None
        replica.keep_running = restart
        self._write_targets()
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
        if self.forwarder is not None and self.forwarder.poll() is None:
            self.forwarder.terminate()
            self.forwarder.wait(timeout=10)

    def upgrade(self, values: dict[str, Any]) -> None:
        """``helm upgrade`` with ``values`` merged over the installed ones: the chart rendered again
        (its lookups reading the cluster) and every object but the CRDs applied."""
        merged = _merge(self.values, values)
        self.docs = render(self.release, self.namespace, merged, include_crds=False)
        stream = "".join("---\n" + yaml.safe_dump(d) for d in self.docs)
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=stream)

    def lease(self) -> dict[str, Any]:
        result: dict[str, Any] = self.kubectl.json("get", "lease", self.lease_name, "-n", self.namespace)
        return result

    def wait_webhooks(self, timeout: float = 60) -> None:
        """Until the webhook URL answers TLS (a replica serves admission requests behind it)."""
        wait_for(lambda: served_certificate(self.webhook_url) is not None or None, timeout=timeout,
                 what=f"the admission webhooks of {self.release} at {self.webhook_url}")  # fmt: skip

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
            synced = time.monotonic()
            while not self._stopping.wait(0.5):
                if time.monotonic() - synced > 3:
                    self.sync_volumes([r for r in self.replicas if r.keep_running])
                    synced = time.monotonic()
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
    kubectl.run("create", "namespace", namespace, check=False)
    forward_port = 0
    if (values.get("webhook") or {}).get("enabled", True) and not (values.get("webhook") or {}).get("url"):
        # No Service network here: the API server calls the forwarder (the Service's stand-in).
        forward_port = free_port()
        values = _merge(values, {"webhook": {"url": f"https://127.0.0.1:{forward_port}",
                                             "extraIPSANs": ["127.0.0.1"]}})  # fmt: skip
    docs = render(release, namespace, values)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    stream = "".join("---\n" + yaml.safe_dump(d) for d in crds)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=stream)
    for crd in crds:
        kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")
    stream = "".join("---\n" + yaml.safe_dump(d) for d in rest)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=stream)
    chart = ChartOperator(kubectl, release, namespace, docs, STATE_DIR / f"kubeconfig-{release}-{namespace}")
    chart.values = values
    if forward_port:
        chart.webhook_targets = STATE_DIR / f"webhook-targets-{release}-{namespace}"
        chart.webhook_targets.write_text("")
        chart.forwarder = subprocess.Popen(
            [sys.executable, str(E2E_DIR / "forwarder.py"), str(forward_port), str(chart.webhook_targets)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=detach,
        )  # fmt: skip
    try:
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
        if chart.webhook_url:
            chart.wait_webhooks()
    except BaseException:
        # No fixture tears down what failed to install: its replicas would hold the Lease (and the
        # forwarder its port) into the next run.
        chart.stop()
        raise
    return chart


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` merged into a copy of ``base``, key by key, as Helm merges values files."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def served_certificate(url: str) -> bytes | None:
    """The DER certificate served at ``url`` (https://host:port), or None when nothing answers there."""
    host, port = url.removeprefix("https://").split("/")[0].rsplit(":", 1)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, int(port)), timeout=3) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            return tls.getpeercert(binary_form=True)
    except OSError:
        return None


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
    pids = [r.process.pid for r in chart.replicas if r.process]
    if chart.forwarder is not None:
        pids.append(chart.forwarder.pid)
    DEMO_PIDS.write_text("\n".join(str(pid) for pid in pids) + "\n")
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
