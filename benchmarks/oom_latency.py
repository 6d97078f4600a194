"""Print loadline's out-of-memory detection → remediation latency with COUNT models running (not a test).

Needs the local control plane with room for COUNT single-GPU pods, e.g.
`LOADLINE_FLEET_SCALE=10 make cluster-up` (100 L4 GPUs). It starts its own `loadline run`, creates COUNT
InferenceModels (Llama-3.1-8B on one L4 each), waits until their pods run, then crashes every pod's
vLLM container the way a host OOM kill looks (exit 137, OOMKilled; written to the pod status as a kubelet
would) from ``--injectors`` threads, as fast as they write or spread evenly over ``--over`` seconds
(issue 14: all of them crashing within a minute), and records for each model:

- detect → decided: from the crash being written to the incident and decision appearing in
  `status.remediation` (what the operator commits to before touching the children);
- detect → rolled: until the Deployment's pod template carries the raised memory limit;
- detect → Ready again: until the model's phase is Ready after its roll-out (what its users wait for;
  its model writes are counted until then).

It prints how many crashes were decided and rolled (every crash must be), the CPU each process used
from the first crash until all were handled (``/proc``, by command name), and what the crashes cost the
API server: loadline's own requests per crash by verb and resource (its ``loadline_api_requests_total``),
and the API server's writes per crash by resource, whoever made them (``apiserver_request_total``: kopf's
patches, the Deployment controller's roll-out, the scheduler, KWOK).

The floor (``--mode both``, the default: measured in the same run, on the same cluster and fleet, right
after the operator's storm): the operator stops, and the yardstick answers a second storm of the same
crashes instead: a process that watches the pods and, for each OOM kill, patches the model's Deployment
with a raised memory limit from ``--injectors`` threads (the one write "rolled" waits for; no incident,
no status, no Event). Its crash → pod Ready again is what this machine's control plane takes for the same
roll-outs (the Deployment controller, the scheduler and KWOK share the cores), as fleet.py's direct
writes are for creation; the benchmark prints the operator's figures over it as ratios. For each storm
it also says where the time went: per crash, the stages crash → decided (the operator) → rolled (the pod
template) → unpaused (its turn, when the operator paces a storm's roll-outs) → the new pod created (the
Deployment controller) → scheduled (the scheduler) → started (Ready, KWOK) → the model Ready in status
(the operator's readiness write). ``--mode operator`` or
``--mode direct`` (``--direct``) run one storm alone.

Run: `.venv/bin/python benchmarks/oom_latency.py [COUNT] [--injectors 8] [--over SECONDS] [--mode both]`
(COUNT default 100).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import re
import ssl
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _bench import (
    KUBECONFIG,
    REPO,
    changed_paths,
    chat_model,
    cpu_seconds,
    cpu_used,
    ensure_crds,
    free_port,
    own_requests,
    percentile,
    samples,
    start_operator,
    stop_operator,
    summary,
)
from kubernetes import client, config, watch
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(REPO / "e2e"))
from crash import crashed_status, termination_for

WRITES = {"POST", "PUT", "PATCH", "APPLY", "DELETE"}


def apiserver_writes() -> Counter[str]:
    """The API server's count of write requests so far, by resource (``apiserver_request_total``)."""
    api = client.ApiClient()
    method, url, headers, body, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers, body=body)
    response.read()
    totals: Counter[str] = Counter()
    pattern = re.compile(r"^apiserver_request_total\{([^}]*)\} (\S+)$")
    for line in response.data.decode().splitlines():
        match = pattern.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if labels.get("verb") in WRITES:
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            totals[resource] += float(match.group(2))
    return totals


def events_since(core: client.CoreV1Api, namespace: str, since: float) -> Counter[str]:
    """The namespace's Events last seen after ``since`` (epoch seconds), by reporting component and
    reason (an Event's count included: a repeat is a write too)."""
    counts: Counter[str] = Counter()
    for event in core.list_namespaced_event(namespace).items:
        when = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
        if when is not None and when.timestamp() >= since:
            who = event.reporting_component or (event.source.component if event.source else "") or "?"
            counts[f"{who} {event.reason}"] += event.count or 1
    return counts


def lane_waits(metrics_url: str) -> Counter[str]:
    """``loadline_lane_wait_seconds`` so far: per lane, its calls (``<lane> n``) and seconds waited for a
    thread (``<lane> s``)."""
    totals: Counter[str] = Counter()
    for sample in samples(metrics_url):
        if sample.name == "loadline_lane_wait_seconds_count":
            totals[f"{sample.labels['lane']} n"] += sample.value
        elif sample.name == "loadline_lane_wait_seconds_sum":
            totals[f"{sample.labels['lane']} s"] += sample.value
    return totals


KCM_PIDFILE = REPO / ".e2e" / "kwok" / "clusters" / "loadline-e2e" / "pids" / "kube-controller-manager.pid"
"""The local control plane's kube-controller-manager (``make cluster-up``): its /metrics say how much
work the storm gave the workload controllers, the roll-outs' bottleneck on this machine."""
CONTROLLERS = ("deployment", "replicaset")


class ControllerManager:
    """The kube-controller-manager's own figures over a storm: each controller's syncs (its work queue's
    adds; events of one object that arrive while it waits in the queue make one sync), the deepest its
    queue got, and the requests it sent and how long its client's rate limit held them. Sampled every
    second by a thread; nothing when the controller-manager cannot be found or read."""

    def __init__(self) -> None:
        self.url = self._url()
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.deepest: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _url() -> str | None:
        try:
            pid = KCM_PIDFILE.read_text().strip()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            return None
        port = next((a.split("=", 1)[1] for a in argv if a.startswith("--secure-port=")), None)
        return f"https://127.0.0.1:{port}/metrics" if port else None

    def read(self) -> dict[str, float]:
        """The counters now: ``adds <controller>``, ``depth <controller>``, ``requests``, ``throttled s``."""
        figures: dict[str, float] = {}
        if self.url is None:
            return figures
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the local cluster's own CA
        try:
            with urllib.request.urlopen(self.url, timeout=5, context=context) as answer:
                text = answer.read().decode(errors="replace")
        except OSError:
            return figures
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.labels.get("name")
                if sample.name == "workqueue_adds_total" and name in CONTROLLERS:
                    key = f"adds {name}"
                elif sample.name == "workqueue_depth" and name in CONTROLLERS:
                    key = f"depth {name}"
                elif sample.name == "rest_client_requests_total":
                    key = "requests"
                elif sample.name == "rest_client_rate_limiter_duration_seconds_sum":
                    key = "throttled s"
                else:
                    continue
                figures[key] = figures.get(key, 0.0) + sample.value
        return figures

    def begin(self) -> None:
        self.start = self.read()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            for key, value in self.read().items():
                if key.startswith("depth "):
                    self.deepest[key] = max(self.deepest.get(key, 0.0), value)

    def finish(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.end = self.read()

    def summary(self, crashes: int) -> str:
        if not self.end:
            return "not read (no local kube-controller-manager found)"
        moved = {k: v - self.start.get(k, 0.0) for k, v in self.end.items() if not k.startswith("depth ")}
        parts = [
            f"{name} controller {moved[f'adds {name}'] / crashes:.1f} syncs per crash "
            f"(its queue at most {self.deepest.get(f'depth {name}', 0.0):.0f} deep)"
            for name in CONTROLLERS
            if f"adds {name}" in moved
        ]
        parts.append(
            f"{moved.get('requests', 0) / crashes:.1f} requests per crash, "
            f"held {moved.get('throttled s', 0):.1f} s in all by its client's rate limit"
        )
        return "; ".join(parts)


def per_crash(counts: Counter[str], crashes: int) -> str:
    shown = [f"{key} {value / crashes:.2f}" for key, value in counts.most_common() if value > 0]
    return ", ".join(shown) or "none"


READY_WITHIN_SECONDS = 360.0
"""How long after the last crash the benchmark waits for every remediated model to be Ready again."""


def watch_events(lister_name: str, *args: Any) -> Any:
    """The events of a watch, forever (its process is terminated). Without a timeout the client
    watches on from the last resourceVersion when the API server ends a watch (a new LIST, which a
    watch with a timeout makes, would show a fleet's changes late, as ADDED); it lists again only after
    an error."""
    config.load_kube_config(str(KUBECONFIG))  # type: ignore[no-untyped-call]
    apis = {"custom_object": client.CustomObjectsApi, "pod": client.CoreV1Api, "deployment": client.AppsV1Api}
    api: Any = apis[lister_name.rsplit("namespaced_", 1)[1]]()
    while True:
        try:
            yield from watch.Watch().stream(getattr(api, lister_name), *args)  # type: ignore[no-untyped-call]
        except Exception as exc:  # a dropped connection: watch again (it lists first)
            print(f"watch ended ({type(exc).__name__}: {exc}); watching again", file=sys.stderr)


def handled_crashes(model: dict[str, Any]) -> list[Any]:
    """The crashes a model's status says were handled (its decisions so far)."""
    return list(((model.get("status") or {}).get("remediation") or {}).get("handledCrashes") or [])


def exit_with_parent() -> None:
    """Stop this spawned helper once the benchmark that started it is gone. A benchmark killed by a
    signal does not stop its daemon children: the watchers and the floor's responder of one killed here
    ran on for 22 minutes, into the next run (same namespace and kubeconfig path)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def watch_models(namespace: str, baseline: dict[str, str], seen: Any) -> None:
    """In a process of its own (the injecting threads of the main one would hold up its reads): when
    each model's decision first shows in its status, when it is Ready again after Deploying its fix,
    and what each write to a model changed."""
    exit_with_parent()
    last: dict[str, dict[str, Any]] = {}
    deploying: set[str] = set()  # decided, and Deploying since (the roll-out of the fix)
    handled: dict[str, int] = json.loads(baseline.get("", "{}"))  # crashes handled before this storm
    group = ("loadline.dev", "v1alpha1", namespace, "inferencemodels")
    for event in watch_events("list_namespaced_custom_object", *group):
        obj, now = event["object"], time.time()
        name = obj["metadata"]["name"]
        if name in last and event["type"] == "MODIFIED":
            seen.put(("write", " + ".join(changed_paths(last[name], obj)), now))
        last[name] = obj
        status = obj.get("status") or {}
        if len(handled_crashes(obj)) > handled.get(
            name, 0
        ):  # a decision of this storm (not of an earlier one)
            seen.put(("decided", name, now))
            if status.get("phase") == "Deploying":
                deploying.add(name)
            elif status.get("phase") == "Ready" and name in deploying:
                deploying.discard(name)
                seen.put(("ready", name, now))


def watch_deployments(namespace: str, baseline: dict[str, str], seen: Any) -> None:
    """In a process of its own: when each Deployment's pod template first carries a memory limit other
    than the one it had before the crashes."""
    exit_with_parent()
    for event in watch_events("list_namespaced_deployment", namespace):
        dep, now = event["object"], time.time()
        limits = dep.spec.template.spec.containers[0].resources.limits or {}
        if limits.get("memory") not in {None, baseline.get(dep.metadata.name)}:
            seen.put(("rolled", dep.metadata.name, now))
            if not dep.spec.paused:  # a fix that waited for its roll-out slot was applied paused
                seen.put(("unpaused", dep.metadata.name, now))


def watch_pods(namespace: str, baseline: dict[str, str], seen: Any) -> None:
    """In a process of its own: for each model's pods that were not there before the crashes (the
    roll-out's), when one was first seen (created by the Deployment controller), bound to a node (the
    scheduler) and Ready (started: KWOK stands in for the kubelet). ``baseline``: the uids before."""
    exit_with_parent()
    for event in watch_events("list_namespaced_pod", namespace):
        pod, now = event["object"], time.time()
        model = (pod.metadata.labels or {}).get("loadline.dev/inferencemodel")
        if not model or pod.metadata.uid in baseline or event["type"] == "DELETED":
            continue
        seen.put(("created", model, now))
        if pod.spec.node_name:
            seen.put(("scheduled", model, now))
        if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
            seen.put(("started", model, now))


def respond_directly(namespace: str, threads: int) -> None:
    """In a process of its own (the floor): the least any responder does for a host OOM kill, one
    patch of the model's Deployment raising its container's memory limit by a quarter, once per pod."""
    exit_with_parent()
    from kubernetes.utils import parse_quantity

    Path("/proc/self/comm").write_text("responder")  # its own line in the CPU table
    config.load_kube_config(str(KUBECONFIG))  # type: ignore[no-untyped-call]
    apps = client.AppsV1Api()
    answered: set[str] = set()

    def raise_limit(deployment: str, container: str, limit: str) -> None:
        raised = f"{int(parse_quantity(limit) * 5 / 4 / 2**20)}Mi"
        body = {"spec": {"template": {"spec": {"containers": [
            {"name": container, "resources": {"limits": {"memory": raised}}}
        ]}}}}  # fmt: skip
        apps.patch_namespaced_deployment(deployment, namespace, body)

    with ThreadPoolExecutor(threads) as pool:
        for event in watch_events("list_namespaced_pod", namespace):
            pod = event["object"]
            model = (pod.metadata.labels or {}).get("loadline.dev/inferencemodel")
            if not model or pod.metadata.uid in answered:
                continue
            for status in pod.status.container_statuses or []:
                last = status.last_state.terminated if status.last_state else None
                if last is not None and last.reason == "OOMKilled":
                    answered.add(pod.metadata.uid)
                    spec = next(c for c in pod.spec.containers if c.name == status.name)
                    limit = (spec.resources.limits or {}).get("memory")
                    if limit:
                        pool.submit(raise_limit, model, status.name, limit)
                    break


#: The stages of one crash's recovery, in order, as the watches see them (first sight of each per model).
STAGES = ("decided", "rolled", "unpaused", "created", "scheduled", "started", "ready")
STAGE_NAMES = {
    "decided": "the operator's decision in status",
    "rolled": "the raised memory in the pod template",
    "unpaused": "its roll-out's turn (the Deployment not paused: the operator paces a storm)",
    "created": "the new pod created (Deployment controller)",
    "scheduled": "the new pod bound to a node (scheduler)",
    "started": "the new pod Ready (KWOK for the kubelet)",
    "ready": "the model Ready in status (the operator)",
}


@dataclass
class Storm:
    """What one storm of crashes gave: when each model crashed, and when each stage of its recovery
    was first seen (wall clock: the watches run in processes of their own)."""

    operator: bool
    crashed: dict[str, float] = field(default_factory=dict)
    marks: dict[str, dict[str, float]] = field(default_factory=lambda: {stage: {} for stage in STAGES})
    model_writes: Counter[str] = field(default_factory=Counter)
    injected: float = 0.0
    cpu: str = ""
    own: Counter[str] = field(default_factory=Counter)
    writes: Counter[str] = field(default_factory=Counter)
    waits: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    phases: str = ""
    controllers: str = ""

    def note(self, what: str, key: str, when: float) -> None:
        if what in self.marks:
            self.marks[what].setdefault(key, when)
        else:
            self.model_writes[key] += 1

    def since_crash(self, stage: str) -> list[float]:
        return [when - self.crashed[name] for name, when in self.marks[stage].items() if name in self.crashed]

    def serving_again(self) -> dict[str, float]:
        """When each model served again: Ready in status through the operator (what its users see),
        its new pod Ready for the floor (which keeps no status)."""
        return self.marks["ready" if self.operator else "started"]

    def recovered(self) -> list[float]:
        return [
            when - self.crashed[name] for name, when in self.serving_again().items() if name in self.crashed
        ]

    def stage_times(self) -> list[tuple[str, list[float]]]:
        """Per stage that this storm has, the time from the stage before it (the crash for the first)."""
        out = []
        stages = [s for s in STAGES if self.operator or s not in {"decided", "ready"}]
        for before, stage in zip(("crashed", *stages), stages, strict=False):
            start = self.crashed if before == "crashed" else self.marks[before]
            gaps = [
                when - start[name]
                for name, when in self.marks[stage].items()
                if name in start and when >= start[name]
            ]
            out.append((f"{before} → {stage}", gaps))
        return out


def serving_pod(pod: Any) -> bool:
    """A pod running its container, not on its way out (a roll-out's old pod is terminating)."""
    return (
        bool(pod.status.phase == "Running" and pod.status.container_statuses)
        and not pod.metadata.deletion_timestamp
    )


def running_pods(core: client.CoreV1Api, namespace: str, count: int, wait: float) -> list[Any]:
    """The namespace's running model pods, once ``count`` run or ``wait`` seconds passed."""
    deadline = time.monotonic() + wait
    while True:
        pods = core.list_namespaced_pod(namespace).items
        running = [p for p in pods if serving_pod(p)]
        if len(running) >= count or time.monotonic() >= deadline:
            return running
        time.sleep(2)


def run_storm(
    args: argparse.Namespace,
    namespace: str,
    running: list[Any],
    metrics_url: str | None,
) -> Storm:
    """Crash every pod of ``running`` (the operator, when ``metrics_url`` is given, answers; else the
    yardstick does) and follow each model until it serves again or :data:`READY_WITHIN_SECONDS` pass."""
    core, apps, custom = client.CoreV1Api(), client.AppsV1Api(), client.CustomObjectsApi()
    storm = Storm(operator=metrics_url is not None)
    limits = {
        dep.metadata.name: (dep.spec.template.spec.containers[0].resources.limits or {}).get("memory")
        for dep in apps.list_namespaced_deployment(namespace).items
    }
    models = custom.list_namespaced_custom_object("loadline.dev", "v1alpha1", namespace, "inferencemodels")
    handled = {m["metadata"]["name"]: len(handled_crashes(m)) for m in models["items"]}
    pods_before = {p.metadata.uid: "" for p in core.list_namespaced_pod(namespace).items}
    seen: multiprocessing.Queue[tuple[str, str, float]] = multiprocessing.get_context("spawn").Queue()
    spawn = multiprocessing.get_context("spawn")
    watchers = [
        spawn.Process(target=watch_models, args=(namespace, {"": json.dumps(handled)}, seen), daemon=True),
        spawn.Process(target=watch_deployments, args=(namespace, limits, seen), daemon=True),
        spawn.Process(target=watch_pods, args=(namespace, pods_before, seen), daemon=True),
    ]
    if not storm.operator:
        watchers.append(spawn.Process(target=respond_directly, args=(namespace, args.injectors), daemon=True))
    for watcher in watchers:
        watcher.start()
    try:
        time.sleep(5)  # the watches listed and watching (a spawned process imports the client first)
        termination = termination_for("oomkilled")
        api = client.ApiClient()
        own_before = own_requests(metrics_url) if metrics_url else Counter()
        waits_before = lane_waits(metrics_url) if metrics_url else Counter()
        writes_before = apiserver_writes()

        def crash(slot: tuple[int, Any]) -> None:
            index, pod = slot
            time.sleep(max(0.0, start + index * args.over / len(running) - time.monotonic()))
            raw: dict[str, Any] = api.sanitize_for_serialization(pod)
            status = crashed_status(raw, raw["spec"]["containers"][0]["name"], termination)
            body = {"metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]}, "status": status}
            # From the moment the write is sent, so a decision the watch shows before the write's
            # answer still counts.
            storm.crashed[raw["metadata"]["labels"]["loadline.dev/inferencemodel"]] = time.time()
            core.patch_namespaced_pod_status(raw["metadata"]["name"], namespace, json.loads(json.dumps(body)))

        controllers = ControllerManager()
        controllers.begin()
        cpu_before = cpu_seconds()
        start, wall_start = time.monotonic(), time.time()
        with ThreadPoolExecutor(args.injectors) as pool:
            list(pool.map(crash, enumerate(running)))
        storm.injected = time.monotonic() - start
        last_crash = time.monotonic()

        def drain_until(deadline: float, done: Any) -> None:
            while time.monotonic() < deadline and not done():
                try:
                    storm.note(*seen.get(timeout=0.5))
                except queue.Empty:
                    continue

        to_decide = len(storm.crashed) if storm.operator else 0  # the yardstick decides nothing
        drain_until(
            last_crash + 120,
            lambda: (
                len(storm.marks["decided"]) >= to_decide and len(storm.marks["rolled"]) >= len(storm.crashed)
            ),
        )
        storm.cpu = cpu_used(cpu_before, cpu_seconds())
        storm.writes = apiserver_writes() - writes_before
        if metrics_url:
            storm.own = own_requests(metrics_url) - own_before
            storm.waits = lane_waits(metrics_url) - waits_before
        # Then until every model serves again (its model writes counted to the end): the control
        # plane replaces a pod per crash, 1,000 of them in a minute or two on this machine.
        drain_until(
            last_crash + READY_WITHIN_SECONDS,
            lambda: len(storm.serving_again()) >= len(storm.marks["rolled"]),
        )
        controllers.finish()
        storm.controllers = controllers.summary(max(1, len(storm.crashed)))
        storm.events = events_since(core, namespace, wall_start)
        if storm.operator:
            phases = Counter(
                (model.get("status") or {}).get("phase")
                for model in custom.list_namespaced_custom_object(
                    "loadline.dev", "v1alpha1", namespace, "inferencemodels"
                )["items"]
            )
            storm.phases = ", ".join(f"{phase} {n}" for phase, n in phases.items())
    finally:
        for watcher in watchers:
            watcher.terminate()
    return storm


def report(storm: Storm, args: argparse.Namespace) -> None:
    """Print one storm's figures."""
    who = "loadline" if storm.operator else "the floor: one Deployment patch per crash, no operator"
    paced = f", spread over {args.over:g} s" if args.over else ", as fast as they write"
    print(f"\n== {who}")
    print(
        f"{len(storm.crashed)} crashes injected in {storm.injected:.2f} s ({args.injectors} threads{paced})"
    )
    rolled = len(storm.marks["rolled"])
    if storm.operator:
        print(f"handled: {len(storm.marks['decided'])} of {len(storm.crashed)} decided, {rolled} rolled "
              "(within 120 s of the last crash)")  # fmt: skip
        print(summary("detect → decided (incident and remediation in status)", storm.since_crash("decided")))
    else:
        print(f"handled: {rolled} of {len(storm.crashed)} rolled (within 120 s of the last crash)")
    print(summary("detect → rolled (raised memory in the pod template)", storm.since_crash("rolled")))
    serving = len(storm.serving_again())
    print(
        summary(
            f"detect → serving again ({'Ready in status' if storm.operator else 'new pod Ready'}; "
            f"{serving} of {rolled} within {READY_WITHIN_SECONDS:.0f} s of the last crash)",
            storm.recovered(),
        )
    )
    print("where the time went, per crash (each stage from the one before it):")
    for label, gaps in storm.stage_times():
        print("  " + summary(label, gaps))
    if storm.phases:
        print(f"phases at the end (from the API server): {storm.phases}")
    print(f"CPU from the first crash until all were rolled, by process: {storm.cpu}")
    crashes = max(1, len(storm.crashed))
    if storm.operator:
        print(
            "waited for a thread of its lane, mean per call: "
            + (
                ", ".join(
                    f"{lane} {storm.waits[f'{lane} s'] / storm.waits[f'{lane} n']:.2f} s "
                    f"(n={storm.waits[f'{lane} n']:.0f})"
                    for lane in ("crashes", "models", "checks")
                    if storm.waits[f"{lane} n"]
                )
                or "no lane was used"
            )
        )
        print(f"loadline's own requests per crash: {per_crash(storm.own, crashes)}")
        print(
            "InferenceModel writes per crash (by what changed, until Ready again): "
            f"{per_crash(storm.model_writes, crashes)}"
        )
    print(f"API server writes per crash (everyone's, by resource): {per_crash(storm.writes, crashes)}")
    print(f"kube-controller-manager, from the first crash until all served again: {storm.controllers}")
    print(f"Events per crash (by who, reason): {per_crash(storm.events, crashes)}")


def percentile_of_all(values: list[float], total: int, q: float) -> float | None:
    """The ``q`` percentile over ``total`` crashes of which ``values`` are those that came back (the
    rest later than any of them); None when it falls on one that did not come back."""
    ordered = sorted(values)
    index = min(total - 1, max(0, round(q * (total - 1))))
    return ordered[index] if index < len(ordered) else None


def compare(operator: Storm, floor: Storm) -> None:
    """The operator's figures over the floor's, measured in the same run."""

    def ratio(label: str, ours: list[float], theirs: list[float], of: tuple[int, int] | None = None) -> str:
        """p50 and p99 of each over the floor's. ``of``: how many crashed in each storm, when some models
        did not come back in time: the percentiles are then over every crash, a model not back counted
        as later than any that is, and one that falls on such a model is "not back" (the percentiles
        of the models that are back would compare two different sets of models)."""
        if not ours or not theirs:
            return f"{label}: no samples"
        parts = []
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            a = percentile(ours, q) if of is None else percentile_of_all(ours, of[0], q)
            b = percentile(theirs, q) if of is None else percentile_of_all(theirs, of[1], q)
            if a is None or b is None:
                said = ["not back" if x is None else f"{x:.2f} s" for x in (a, b)]
                parts.append(f"{name} {said[0]} / {said[1]}")
            elif b > 0:
                parts.append(f"{name} {a:.2f} s / {b:.2f} s = {a / b:.2f}")
            else:
                parts.append(f"{name} {a:.2f} s / 0")
        return f"{label}: " + ", ".join(parts)

    print("\n== loadline over the floor, same run, same cluster")
    print(ratio("crash → rolled", operator.since_crash("rolled"), floor.since_crash("rolled")))
    everyone = (len(operator.crashed), len(floor.crashed))
    print(ratio("crash → serving again (of every crash)", operator.recovered(), floor.recovered(), everyone))
    # What the pods did, whatever the model's status says: a model is Ready in status once its
    # Deployment's controller reports the new pod available, which lags the pod itself while that
    # controller's queue is deep.
    started = operator.since_crash("started")
    print(ratio("crash → the new pod Ready (both, of every crash)", started, floor.recovered(), everyone))
    print(
        f"serving again within {READY_WITHIN_SECONDS:.0f} s: loadline {len(operator.recovered())} of "
        f"{len(operator.crashed)}, the floor {len(floor.recovered())} of {len(floor.crashed)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("count", nargs="?", type=int, default=100)
    parser.add_argument("--injectors", type=int, default=8, help="threads writing the crashes")
    parser.add_argument(
        "--over",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="spread the crashes evenly over this many seconds (issue 14: within a minute, 60); "
        "0, the default: as fast as the injectors write them",
    )
    parser.add_argument(
        "--mode",
        choices=("both", "operator", "direct"),
        default="both",
        help="both (default): the operator's storm, then the floor's on the same fleet; or one alone",
    )
    parser.add_argument("--direct", action="store_true", help="the same as --mode direct")
    args = parser.parse_args()
    mode = "direct" if args.direct else args.mode
    count = args.count
    if not KUBECONFIG.exists():
        print(
            f"no cluster: {KUBECONFIG} is missing (run `LOADLINE_FLEET_SCALE=10 make cluster-up`)",
            file=sys.stderr,
        )
        return 1
    config.load_kube_config(str(KUBECONFIG))  # type: ignore[no-untyped-call]
    ensure_crds()
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    namespace = f"oombench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    settings = {"remediation_max_actions_per_day": "10", "metrics_port": str(metrics_port)}
    operator = start_operator(namespace, "operator-oombench.log", **settings)
    storms: dict[str, Storm] = {}
    try:
        time.sleep(3)
        for i in range(count):
            custom.create_namespaced_custom_object(
                "loadline.dev",
                "v1alpha1",
                namespace,
                "inferencemodels",
                chat_model(f"m{i:03d}", ["L4"], resources={"memoryGiB": 12}),
            )
        running = running_pods(core, namespace, count, 240 + count * 0.5)  # a fleet takes minutes
        print(f"{len(running)} of {count} models running")
        if mode in {"both", "operator"}:
            storms["operator"] = run_storm(args, namespace, running, metrics_url)
            report(storms["operator"], args)
        if mode in {"both", "direct"}:
            stop_operator(operator)
            if mode == "both":  # the floor crashes the pods the operator's storm left running
                running = running_pods(core, namespace, count, READY_WITHIN_SECONDS)
                print(f"\n{len(running)} of {count} models running again for the floor's storm")
            storms["floor"] = run_storm(args, namespace, running, None)
            report(storms["floor"], args)
        if len(storms) == 2:
            compare(storms["operator"], storms["floor"])
    finally:
        stop_operator(operator)
        if mode != "operator":  # kopf's finalizers, which no operator is left to remove
            for model in custom.list_namespaced_custom_object(
                "loadline.dev", "v1alpha1", namespace, "inferencemodels"
            )["items"]:
                custom.patch_namespaced_custom_object(
                    "loadline.dev",
                    "v1alpha1",
                    namespace,
                    "inferencemodels",
                    model["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )
        core.delete_namespace(namespace)
        # Gone before this returns: the namespace controller's deletions would land in the next run.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and namespace in {
            ns.metadata.name for ns in core.list_namespace().items
        }:
            time.sleep(2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
