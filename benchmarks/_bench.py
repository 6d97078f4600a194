"""Shared parts of the operator benchmarks: the cluster's kubeconfig, an operator process, percentiles."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KUBECONFIG = Path(os.environ.get("LOADLINE_KUBECONFIG", REPO / ".e2e" / "kubeconfig"))


def chat_model(name: str, gpu_types: list[str], **spec: object) -> dict[str, object]:
    """A Llama-3.1-8B InferenceModel (4K context, 2 sequences) on the given GPU types."""
    return {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "maxModelLen": 4096,
            "concurrency": 2,
            "gpu": {"types": gpu_types},
            **spec,
        },
    }


def start_operator(namespace: str, log_name: str, **settings: str) -> subprocess.Popen[bytes]:
    """`loadline run` (one replica, no leader election) watching only ``namespace``; ``settings``
    become LOADLINE_* env."""
    env = {
        **os.environ,
        "KUBECONFIG": str(KUBECONFIG),
        "LOADLINE_LIVENESS_PORT": "0",
        "LOADLINE_METRICS_PORT": "0",
        "LOADLINE_NAMESPACES": namespace,
        **{f"LOADLINE_{key.upper()}": value for key, value in settings.items()},
    }
    log = (REPO / ".e2e" / log_name).open("wb")
    return subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "loadline"), "run"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=_stop_with_parent,
    )


#: prctl's option that has the kernel signal a process when the thread that started it ends.
_PR_SET_PDEATHSIG = 1


def _stop_with_parent() -> None:
    """Run in the operator's process before exec: SIGTERM for it when the benchmark ends without its
    cleanup (killed by a signal), instead of an operator answering the next run's models."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    """A TCP port nothing listens on now (for a benchmark operator's /metrics)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def samples(metrics_url: str) -> list[Any]:
    """Every sample a loadline process exposes at ``metrics_url`` now; none when it does not answer."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return []
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def own_requests(metrics_url: str) -> Counter[str]:
    """loadline's own API requests so far (``loadline_api_requests_total`` at ``metrics_url``), by
    "verb resource"."""
    totals: Counter[str] = Counter()
    for sample in samples(metrics_url):
        if sample.name == "loadline_api_requests_total":
            totals[f"{sample.labels['verb']} {sample.labels['resource']}"] += sample.value
    return totals


def changed_paths(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Where two versions of an InferenceModel differ: spec, each status field (conditions by type),
    each annotation, label and finalizer; metadata the API server keeps (resourceVersion,
    managedFields) is not a cause."""
    paths = []
    if before.get("spec") != after.get("spec"):
        paths.append("spec")
    old_meta, new_meta = before.get("metadata") or {}, after.get("metadata") or {}
    for field in ("annotations", "labels"):
        old, new = old_meta.get(field) or {}, new_meta.get(field) or {}
        paths += [f"metadata.{field}[{k}]" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if old_meta.get("finalizers") != new_meta.get("finalizers"):
        paths.append("metadata.finalizers")
    old_status, new_status = before.get("status") or {}, after.get("status") or {}
    for key in sorted(set(old_status) | set(new_status)):
        if key == "conditions":
            old_c = {c.get("type"): c for c in old_status.get(key) or []}
            new_c = {c.get("type"): c for c in new_status.get(key) or []}
            paths += [f"status.conditions[{t}]" for t in sorted(set(old_c) | set(new_c), key=str)
                      if old_c.get(t) != new_c.get(t)]  # fmt: skip
        elif old_status.get(key) != new_status.get(key):
            paths.append(f"status.{key}")
    return paths or ["(nothing but server metadata)"]


def stop_operator(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(label: str, values: list[float]) -> str:
    if not values:
        return f"{label}: no samples"
    return (
        f"{label}: p50 {statistics.median(values):.2f} s, p90 {percentile(values, 0.9):.2f} s, "
        f"p99 {percentile(values, 0.99):.2f} s, max {max(values):.2f} s (n={len(values)})"
    )


def ensure_crds() -> None:
    """Install loadline's CRDs (server-side apply: idempotent) and wait until the API serves them."""
    import time

    import yaml
    from kubernetes import client
    from kubernetes.dynamic import DynamicClient

    crds = DynamicClient(client.ApiClient()).resources.get(  # type: ignore[no-untyped-call]
        api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition"
    )
    for path in sorted((REPO / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                crds.server_side_apply(body=doc, name=doc["metadata"]["name"], field_manager="loadline-bench")
    api = client.CustomObjectsApi()
    for _ in range(60):
        try:
            api.list_cluster_custom_object("loadline.dev", "v1alpha1", "inferencemodels", limit=1)
            return
        except client.exceptions.ApiException:
            time.sleep(0.5)


def cpu_seconds() -> Counter[str]:
    """CPU time (user + system, seconds) each running process has used so far, summed by command
    name (``kube-apiserver``, ``etcd``, ``loadline``, ...). Two readings around a timed window say who
    used the machine's cores in it: the control plane, KWOK, the operator and the benchmark share
    them. A process that ended inside the window is left out of the difference."""
    ticks = os.sysconf("SC_CLK_TCK")
    totals: Counter[str] = Counter()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended meanwhile
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()  # from field 3 (state): utime is 14, stime 15
        totals[name] += (int(fields[11]) + int(fields[12])) / ticks
    return totals


def cpu_used(before: Counter[str], after: Counter[str], top: int = 7) -> str:
    """Who used how many core-seconds between two :func:`cpu_seconds` readings, largest first."""
    used = after - before
    shown = [f"{name} {seconds:.0f}" for name, seconds in used.most_common(top) if seconds >= 0.5]
    return f"{sum(used.values()):.0f} core-s: " + ", ".join(shown)
