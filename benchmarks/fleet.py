"""Fleet scale on the local control plane: N GPU nodes, M InferenceModels, the operator as the chart runs it.

    .venv/bin/python benchmarks/fleet.py [--nodes 2000] [--models 1000] [--replicas 1,2,4] [--more 20]
                                         [--rest-seconds 60] [--ready-timeout 900]

Not a test: it prints figures (issue 14's goals beside them). It brings the local control plane up (or
re-applies its simulated fleet) with ``--nodes`` KWOK GPU nodes (e2e/fleet.yaml scaled), then:

1. **Direct writes** (the yardstick): the M InferenceModels and the children ``loadline render`` gives
   them, applied with ``kubectl apply --server-side`` into a namespace no operator watches yet; the time
   until the last write returned. The namespace is deleted again.
2. **The operator**: the chart installed as e2e/chart.py does (its ServiceAccount token, its env, its
   replicas as processes); the M InferenceModels applied the same way into a fresh namespace; the time
   until every one has its Deployment (a watch sees it). Ratio = this ÷ the direct writes.
   Both runs also note when every model's pod is Running (the controller-manager, the scheduler and
   KWOK do that work after the direct writes return, and during the operator's run): the end-to-end
   ratio of the same two runs.
   For both windows, the CPU each process used in it (``/proc``, by command name): who had the
   machine's cores while the writes were timed.
3. **One more model** at that scale, ``--more`` times, one a second: create → its Deployment seen.
4. Every model Ready (or the timeout); then the RSS (``/proc``) of each reconciling replica: its own
   process and the admission process it starts.
5. **At rest** for ``--rest-seconds``: writes seen by watches on InferenceModels, Events and children in
   the namespace, and the operator's API requests (the API server's own count for the chart's
   FlowSchema, which matches only the operator's ServiceAccount).

API requests per model: the operator's requests during step 2 divided by M (watches and lists included),
and the share of them that loadline's own client made, by verb and resource (its
``loadline_api_requests_total`` on each replica's /metrics); the rest are kopf's (watches, lists, the
patches of handler progress and status) and the admission process's.

Steps 2 to 5 run once per ``--replicas`` count on the same fleet; more than one replica shards the
models (``sharding.shards`` = replicas; the local control plane has the ShardedListAndWatch gate).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from _bench import changed_paths, chat_model, cpu_seconds, cpu_used, own_requests, percentile

from chart import OPERATOR_NAMESPACE, ChartOperator, install, uninstall
from kube import E2E_DIR, REPO, Kubectl, kubectl_binary, wait_for
from loadline import sharding

BASE_NODES = 12  # e2e/fleet.yaml's node count at scale 1
GPU_TYPES = ["L4", "L40S", "A100-80GB", "H100-80GB"]
GOALS = {
    "ratio": 1.5,
    "more_p99": 1.0,
    "rss_mib": 250.0,
    "writes_at_rest": 0,
}


def model(name: str) -> dict[str, Any]:
    """The benchmarks' Llama-3.1-8B chat model, allowed on every GPU type of the fleet: capacity-aware
    planning spreads the models over the types as the cheapest fill up."""
    return chat_model(name, GPU_TYPES)


def stream(docs: list[dict[str, Any]]) -> str:
    return "".join("---\n" + yaml.safe_dump(d) for d in docs)


def apply_server_side(kubectl: Kubectl, namespace: str, docs: list[dict[str, Any]]) -> tuple[float, int]:
    """Seconds ``kubectl apply --server-side`` takes for ``docs`` (one object after another), and how
    many objects the API server refused on the way (an admission webhook that timed out, say): the
    stream is applied again until every object is in (server-side apply is idempotent), as a GitOps
    tool would retry; the time includes the retries."""
    start = time.monotonic()
    refused = 0
    for _attempt in range(5):
        proc = kubectl.run("apply", "--server-side", "-n", namespace, "-f", "-", input=stream(docs),
                           check=False, timeout=3600)  # fmt: skip
        if proc.returncode == 0:
            return time.monotonic() - start, refused
        errors = [line for line in proc.stderr.splitlines() if line.startswith("Error from server")]
        refused += len(errors)
        print(
            f"apply: {len(errors)} refused ({errors[0] if errors else proc.stderr[-300:]}); again", flush=True
        )
    raise SystemExit("kubectl apply kept failing; see above")


def bring_up(nodes: int) -> int:
    scale = max(nodes / BASE_NODES, 0.1)
    env = {"LOADLINE_FLEET_SCALE": f"{scale:.4f}", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(E2E_DIR / "cluster-up.sh")], env={**_environ(), **env},
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"cluster-up failed:\n{proc.stderr[-2000:]}")
    return len(Kubectl().json("get", "nodes", "-l", "nvidia.com/gpu.product", timeout=120)["items"])


def _environ() -> dict[str, str]:
    return dict(os.environ)


def kubectl_args() -> list[str]:
    kubectl = Kubectl()
    return [str(kubectl.binary or kubectl_binary()), "--kubeconfig", str(kubectl.kubeconfig)]


def operator_requests(kubectl: Kubectl, flow_schemas: set[str]) -> float:
    """Requests the API server dispatched for the operator's flow schemas (the chart's FlowSchemas, which
    match its ServiceAccount only: its Leases and everything else), all verbs."""
    text = kubectl("get", "--raw", "/metrics", timeout=60)
    total = 0.0
    pattern = re.compile(r"^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\} (\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        schema = re.search(r'flow_schema="([^"]*)"', m.group(1)) if m else None
        if m and schema and schema.group(1) in flow_schemas:
            total += float(m.group(2))
    return total


def client_requests(replicas: list[Any]) -> Counter[str]:
    """loadline's own requests so far (``loadline_api_requests_total`` on each live replica's /metrics),
    summed over the replicas, by "verb resource"."""
    totals: Counter[str] = Counter()
    for replica in replicas:
        if replica.alive():
            totals += own_requests(f"http://127.0.0.1:{replica.env['LOADLINE_METRICS_PORT']}/metrics")
    return totals


class FirstSeen:
    """First time each model's ``resource`` (its label ``loadline.dev/inferencemodel``) is seen in
    ``namespace`` and, when ``running``, seen with ``status.phase: Running`` (a watch, from now on)."""

    def __init__(self, namespace: str, resource: str = "deployments", running: bool = False) -> None:
        self.namespace = namespace
        self.running = running
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [*kubectl_args(), "get", resource, "-n", namespace, "--watch", "--output-watch-events",
             "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for chunk in self.proc.stdout:
            buffer += chunk
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    break
                buffer = buffer.lstrip()[end:]
                obj = event.get("object") or {}
                labels = (obj.get("metadata") or {}).get("labels") or {}
                name = labels.get("loadline.dev/inferencemodel")
                if self.running and (obj.get("status") or {}).get("phase") != "Running":
                    continue
                if name:
                    with self.lock:
                        self.seen.setdefault(name, time.monotonic())

    def count(self) -> int:
        with self.lock:
            return len(self.seen)

    def when(self, name: str) -> float | None:
        with self.lock:
            return self.seen.get(name)

    def stop(self) -> None:
        self.proc.terminate()


class WriteCounter:
    """Watch events (ADDED/MODIFIED/DELETED) on the namespace's InferenceModels, Events and children,
    and what each InferenceModel write changed (against the version seen before it), so a write at
    rest comes with its cause: ``status.phase``, ``metadata.annotations[...]``, and so on."""

    KINDS = ("events", "deployments", "services", "leaderworkersets")

    def __init__(self, namespace: str) -> None:
        self.counts: dict[str, int] = {}
        self.changed: dict[str, int] = {}
        self.procs = []
        listed = json.loads(subprocess.run(
            [*kubectl_args(), "get", "inferencemodels.loadline.dev", "-n", namespace, "-o", "json"],
            capture_output=True, text=True, timeout=300, check=True,
        ).stdout)  # fmt: skip
        self.seen = {item["metadata"]["name"]: item for item in listed["items"]}
        models = subprocess.Popen(
            [*kubectl_args(), "get", "inferencemodels.loadline.dev", "-n", namespace, "--watch-only",
             "--output-watch-events", "--resource-version", listed["metadata"]["resourceVersion"],
             "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.procs.append(models)
        threading.Thread(target=self._read_models, args=(models,), daemon=True).start()
        for kind in self.KINDS:
            proc = subprocess.Popen(
                [*kubectl_args(), "get", kind, "-n", namespace, "--watch-only", "--output-watch-events",
                 # An Event also says who reported it and why (the other kinds print nothing there).
                 "-o", "jsonpath={.type} {.object.kind} "
                 "{.object.source.component}/{.object.reason}{\"\\n\"}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            if len(parts) >= 2:
                why = f" {parts[2]}" if len(parts) > 2 and parts[2] != "/" else ""
                self._count(f"{parts[1]} {parts[0]}{why}")

    def _read_models(self, proc: subprocess.Popen[str]) -> None:
        """kubectl's ``-o json`` watch prints one indented JSON document per event."""
        assert proc.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for line in proc.stdout:
            buffer += line
            try:
                event, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                continue
            buffer = buffer.lstrip()[end:]
            obj = event.get("object") or {}
            self._count(f"{obj.get('kind', '?')} {event.get('type', '?')}")
            name = (obj.get("metadata") or {}).get("name", "")
            before = self.seen.get(name)
            if before is not None and event.get("type") == "MODIFIED":
                for path in changed_paths(before, obj):
                    self.changed[path] = self.changed.get(path, 0) + 1
            self.seen[name] = obj

    def stop(self) -> tuple[dict[str, int], dict[str, int]]:
        for proc in self.procs:
            proc.terminate()
        return dict(self.counts), dict(self.changed)


def rendered_children(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What ``loadline render`` gives the models (their children), offline."""
    loadline = str(Path(sys.executable).parent / "loadline")
    proc = subprocess.run([loadline, "render", "-"], input=stream(models), capture_output=True,
                          text=True, timeout=3600, check=True)  # fmt: skip
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def phases(kubectl: Kubectl, namespace: str) -> dict[str, int]:
    items = kubectl.json("get", "inferencemodels", "-n", namespace, timeout=300)["items"]
    out: dict[str, int] = {}
    for item in items:
        phase = (item.get("status") or {}).get("phase") or "none"
        out[phase] = out.get(phase, 0) + 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument(
        "--replicas", type=lambda text: [int(n) for n in text.split(",")], default=[1],
        help="operator replicas, comma-separated (1,2,4): one run each on the same fleet; more than one "
        "replica shards the models (as many shards as replicas)",
    )  # fmt: skip
    parser.add_argument("--more", type=int, default=20)
    parser.add_argument("--rest-seconds", type=float, default=60)
    parser.add_argument("--ready-timeout", type=float, default=900)
    args = parser.parse_args()
    kubectl = Kubectl()
    figures: dict[str, Any] = {}

    t0 = time.monotonic()
    figures["gpu_nodes"] = bring_up(args.nodes)
    print(f"cluster: {figures['gpu_nodes']} GPU nodes ({time.monotonic() - t0:.0f} s)", flush=True)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    clean_up(kubectl)
    names = [f"m{i:05d}" for i in range(args.models)]
    models = [model(n) for n in names]

    # 1. The same writes applied directly.
    direct_ns = f"fleet-direct-{uuid.uuid4().hex[:5]}"
    kubectl("create", "namespace", direct_ns)
    children = rendered_children(models)
    running = FirstSeen(direct_ns, "pods", running=True)
    cpu_before = cpu_seconds()
    start = time.monotonic()
    direct, figures["direct_refused"] = apply_server_side(kubectl, direct_ns, models + children)
    figures["direct_seconds"] = direct
    figures["direct_cpu"] = cpu_used(cpu_before, cpu_seconds())
    print(
        f"direct: {len(models)} InferenceModels + {len(children)} children applied in {direct:.1f} s",
        flush=True,
    )
    wait_for(
        lambda: running.count() >= len(models), timeout=3600, interval=1, what="every direct pod Running"
    )
    figures["direct_running_seconds"] = max(running.seen.values()) - start
    running.stop()
    print(f"direct: every model's pod Running after {figures['direct_running_seconds']:.1f} s", flush=True)
    kubectl("delete", "namespace", direct_ns, "--wait=true", timeout=1800)

    runs = []
    for replicas in args.replicas:
        runs.append(through_operator(kubectl, args, models, direct, replicas))
        report(args, figures, runs[-1])
    if len(runs) > 1:
        print(
            "\nreplicas  shards  all children  ratio  requests/model  RSS per replica (reconcile + admission)"
        )
        for run in runs:
            print(
                f"{run['replicas']:>8}  {run['shards']:>6}  {run['operator_seconds']:>10.1f} s"
                f"  {run['ratio']:>5.2f}  {run['requests_per_model']:>14.1f}  {run['rss']}"
            )
    return 0


def clean_up(kubectl: Kubectl) -> None:
    """What an interrupted run left: webhooks whose replicas are gone (they would refuse every apply)
    and its namespaces (their models would be reconciled too, and skew every figure)."""
    kubectl.run("delete", "validatingwebhookconfigurations,mutatingwebhookconfigurations",
                "-l", "app.kubernetes.io/name=loadline", "--ignore-not-found", check=False)  # fmt: skip
    stale = [
        n for n in kubectl("get", "namespaces", "-o", "name").split() if n.startswith("namespace/fleet-")
    ]
    for ns in stale:  # no operator runs now to remove its finalizer (timers put one on every model)
        names = kubectl("get", "inferencemodels", "-n", ns.split("/")[1], "-o", "name", timeout=300).split()
        for start in range(0, len(names), 200):
            kubectl.run("patch", *names[start : start + 200], "-n", ns.split("/")[1], "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}', check=False, timeout=600)  # fmt: skip
    if stale:
        kubectl("delete", *stale, "--wait=true", timeout=1800)


def processes(pid: int) -> list[int]:
    """``pid`` and its children (the admission process ``loadline run`` starts)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return [pid, *children]


def rss_of(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def reconciling(chart: ChartOperator, shards: int, timeout: float = 120) -> list[Any]:
    """The replicas that reconcile: the Lease holder, or (sharded) the holders of every shard Lease."""
    if shards == 1:
        return [chart.active(timeout=timeout)]

    def holders() -> list[Any] | None:
        names = [sharding.lease_name(chart.lease_name, i, shards) for i in range(shards)]
        held = set()
        for name in names:
            proc = chart.kubectl.run("get", "lease", name, "-n", chart.namespace, "-o", "json", check=False)
            if proc.returncode != 0:
                return None
            held.add(json.loads(proc.stdout)["spec"].get("holderIdentity") or "")
        live = [r for r in chart.replicas if r.alive() and r.identity() in held]
        return live if "" not in held and len({r.identity() for r in live}) == len(held) else None

    result: list[Any] = wait_for(holders, timeout=timeout, what=f"every one of {shards} shard Leases held")
    return result


def through_operator(
    kubectl: Kubectl, args: argparse.Namespace, models: list[dict[str, Any]], direct: float, replicas: int
) -> dict[str, Any]:
    """Steps 2 to 5 with ``replicas`` operator replicas (more than one: as many shards)."""
    shards = replicas if replicas > 1 else 1
    run: dict[str, Any] = {"replicas": replicas, "shards": shards}
    values = {"replicas": replicas, "sharding": {"shards": shards}}
    chart = install(kubectl, "loadline", OPERATOR_NAMESPACE, values, replicas=replicas)
    flow_schemas = {d["metadata"]["name"] for d in chart.docs if d["kind"] == "FlowSchema"}
    namespace = f"fleet-{uuid.uuid4().hex[:5]}"
    try:
        reconciling(chart, shards)
        kubectl("create", "namespace", namespace)
        watch = FirstSeen(namespace)
        running = FirstSeen(namespace, "pods", running=True)
        time.sleep(2)
        before = operator_requests(kubectl, flow_schemas)
        own_before = client_requests(chart.replicas)
        cpu_before = cpu_seconds()
        start = time.monotonic()
        _, run["operator_refused"] = apply_server_side(kubectl, namespace, models)
        wait_for(
            lambda: watch.count() >= args.models, timeout=3600, interval=0.5, what="every model's Deployment"
        )
        run["operator_cpu"] = cpu_used(cpu_before, cpu_seconds())
        through = max(watch.seen.values()) - start
        run["operator_seconds"] = through
        run["ratio"] = through / direct
        wait_for(
            lambda: running.count() >= args.models, timeout=3600, interval=1, what="every model's pod Running"
        )
        names = {m["metadata"]["name"] for m in models}
        run["running_seconds"] = max(t for n, t in running.seen.items() if n in names) - start
        running.stop()
        run["requests_per_model"] = (operator_requests(kubectl, flow_schemas) - before) / args.models
        own = client_requests(chart.replicas)
        own.subtract(own_before)
        run["own_requests_per_model"] = {k: v / args.models for k, v in own.most_common() if v > 0}
        print(
            f"operator ({replicas} replica(s), {shards} shard(s)): every model's Deployment after "
            f"{through:.1f} s (ratio {run['ratio']:.2f})",
            flush=True,
        )

        # 3. One more model at that scale.
        latencies = []
        for i in range(args.more):
            name = f"more{i:03d}"
            created = time.monotonic()
            kubectl.apply(model(name), namespace)
            try:
                wait_for(lambda n=name: watch.when(n) is not None, timeout=60, interval=0.02, what=name)
            except TimeoutError:
                print(f"{name}: no Deployment within 60 s", flush=True)
            latencies.append((watch.when(name) or time.monotonic()) - created)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - created)))
        run["more_p50"] = percentile(latencies, 0.5)
        run["more_p99"] = percentile(latencies, 0.99)
        watch.stop()

        # 4. Ready, RSS of every reconciling replica (its process and its admission process).
        total = args.models + args.more
        deadline = time.monotonic() + args.ready_timeout
        while time.monotonic() < deadline and phases(kubectl, namespace).get("Ready", 0) < total:
            time.sleep(10)
        run["phases"] = phases(kubectl, namespace)
        rss = []
        for replica in reconciling(chart, shards):
            assert replica.process is not None
            pids = processes(replica.process.pid)
            rss.append([rss_of(pids[0]), sum(rss_of(p) for p in pids[1:])])
        run["rss_mib"] = max(r[0] for r in rss)
        run["rss"] = " ".join(f"{a:.0f}+{b:.0f}" for a, b in rss) + " MiB"

        # 5. At rest.
        counter = WriteCounter(namespace)
        time.sleep(2)
        before = operator_requests(kubectl, flow_schemas)
        own_before = client_requests(chart.replicas)
        time.sleep(args.rest_seconds)
        rest_requests = operator_requests(kubectl, flow_schemas) - before
        own = client_requests(chart.replicas)
        own.subtract(own_before)
        run["writes_at_rest"], run["model_changes_at_rest"] = counter.stop()
        run["requests_per_minute_at_rest"] = rest_requests * 60 / args.rest_seconds
        run["own_requests_per_minute_at_rest"] = {
            k: v * 60 / args.rest_seconds for k, v in own.most_common() if v > 0
        }
    finally:
        uninstall(chart)
        clean_up(kubectl)
    return run


def report(args: argparse.Namespace, fleet: dict[str, Any], run: dict[str, Any]) -> None:
    f = {**fleet, **run}
    writes = sum(f["writes_at_rest"].values())
    rows = [
        ("GPU nodes", f"{f['gpu_nodes']}", ""),
        ("InferenceModels", f"{args.models} (+{args.more} one a second)", ""),
        ("operator replicas / shards", f"{f['replicas']} / {f['shards']}", ""),
        ("direct writes", f"{f['direct_seconds']:.1f} s", ""),
        ("all children via the operator", f"{f['operator_seconds']:.1f} s", ""),
        ("ratio", f"{f['ratio']:.2f}", f"<= {GOALS['ratio']}"),
        ("  CPU in the direct window, by process", f["direct_cpu"], ""),
        ("  CPU in the operator's window, by process", f["operator_cpu"], ""),
        (
            "every pod Running: direct / via the operator (ratio)",
            f"{f['direct_running_seconds']:.1f} s / {f['running_seconds']:.1f} s "
            f"({f['running_seconds'] / f['direct_running_seconds']:.2f})",
            "",
        ),
        (
            "applies refused (direct / with the operator)",
            f"{f['direct_refused']} / {f['operator_refused']}",
            "0",
        ),
        (
            "one more model p50 / p99",
            f"{f['more_p50']:.2f} s / {f['more_p99']:.2f} s",
            f"p99 <= {GOALS['more_p99']} s",
        ),
        ("phases", json.dumps(f["phases"], sort_keys=True), "all Ready"),
        ("operator RSS, largest replica", f"{f['rss_mib']:.0f} MiB", f"<= {GOALS['rss_mib']:.0f} MiB"),
        ("RSS per replica (reconcile + admission)", f["rss"], ""),
        (
            "writes at rest",
            f"{writes} in {args.rest_seconds:.0f} s {json.dumps(f['writes_at_rest'], sort_keys=True)}",
            "0",
        ),
        (
            "InferenceModel changes at rest, by field",
            json.dumps(f["model_changes_at_rest"], sort_keys=True) if f["model_changes_at_rest"] else "none",
            "",
        ),
        ("operator API requests per model (creation)", f"{f['requests_per_model']:.1f}", ""),
        (
            "  of them loadline's own client, by verb and resource",
            ", ".join(f"{k} {v:.2f}" for k, v in f["own_requests_per_model"].items()) or "none",
            "",
        ),
        (
            "  the rest (kopf's watches, lists and patches; the admission process)",
            f"{f['requests_per_model'] - sum(f['own_requests_per_model'].values()):.1f}",
            "",
        ),
        ("operator API requests per minute at rest", f"{f['requests_per_minute_at_rest']:.1f}", ""),
        (
            "  of them loadline's own client, by verb and resource",
            ", ".join(f"{k} {v:.1f}" for k, v in f["own_requests_per_minute_at_rest"].items()) or "none",
            "",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    for label, value, goal in rows:
        print(f"{label:<{width}}  {value}" + (f"   (goal {goal})" if goal else ""))


if __name__ == "__main__":
    raise SystemExit(main())
