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

With ``--direct`` the operator stops once the pods run, and the yardstick answers the crashes instead:
a process that watches the pods and, for each OOM kill, patches the model's Deployment with a raised
memory limit from ``--injectors`` threads (the one write "rolled" waits for; no incident, no status, no
Event). Its crash → rolled is the floor this machine sets with the same crashes and the same
roll-outs (the Deployment controller, the scheduler and KWOK share the cores), as fleet.py's direct
writes are for creation.

Run: `.venv/bin/python benchmarks/oom_latency.py [COUNT] [--injectors 8] [--over SECONDS] [--direct]`
(COUNT default 100).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import re
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
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
    samples,
    start_operator,
    stop_operator,
    summary,
)
from kubernetes import client, config, watch

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


def watch_models(namespace: str, baseline: dict[str, str], seen: Any) -> None:
    """In a process of its own (the injecting threads of the main one would hold up its reads): when
    each model's decision first shows in its status, and what each write to a model changed."""
    last: dict[str, dict[str, Any]] = {}
    deploying: set[str] = set()  # decided, and Deploying since (the roll-out of the fix)
    group = ("loadline.dev", "v1alpha1", namespace, "inferencemodels")
    for event in watch_events("list_namespaced_custom_object", *group):
        obj, now = event["object"], time.time()
        name = obj["metadata"]["name"]
        if name in last and event["type"] == "MODIFIED":
            seen.put(("write", " + ".join(changed_paths(last[name], obj)), now))
        last[name] = obj
        status = obj.get("status") or {}
        if (status.get("remediation") or {}).get("handledCrashes"):
            seen.put(("decided", name, now))
            if status.get("phase") == "Deploying":
                deploying.add(name)
            elif status.get("phase") == "Ready" and name in deploying:
                deploying.discard(name)
                seen.put(("ready", name, now))


def watch_deployments(namespace: str, baseline: dict[str, str], seen: Any) -> None:
    """In a process of its own: when each Deployment's pod template first carries a memory limit other
    than the one it had before the crashes."""
    for event in watch_events("list_namespaced_deployment", namespace):
        dep, now = event["object"], time.time()
        limits = dep.spec.template.spec.containers[0].resources.limits or {}
        if limits.get("memory") not in {None, baseline.get(dep.metadata.name)}:
            seen.put(("rolled", dep.metadata.name, now))


def respond_directly(namespace: str, threads: int) -> None:
    """In a process of its own (``--direct``): the least any responder does for a host OOM kill, one
    patch of the model's Deployment raising its container's memory limit by a quarter, once per pod."""
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
        "--direct",
        action="store_true",
        help="stop the operator once the pods run; answer each crash with one Deployment patch (the floor)",
    )
    args = parser.parse_args()
    count = args.count
    if not KUBECONFIG.exists():
        print(
            f"no cluster: {KUBECONFIG} is missing (run `LOADLINE_FLEET_SCALE=10 make cluster-up`)",
            file=sys.stderr,
        )
        return 1
    config.load_kube_config(str(KUBECONFIG))  # type: ignore[no-untyped-call]
    ensure_crds()
    core, custom, apps = client.CoreV1Api(), client.CustomObjectsApi(), client.AppsV1Api()
    namespace = f"oombench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    settings = {"remediation_max_actions_per_day": "10", "metrics_port": str(metrics_port)}
    operator = start_operator(namespace, "operator-oombench.log", **settings)
    crashed: dict[str, float] = {}  # wall clock: the watches run in processes of their own
    decided: dict[str, float] = {}
    rolled: dict[str, float] = {}
    ready: dict[str, float] = {}  # when the model was first Ready again after Deploying its fix
    model_writes: Counter[str] = Counter()  # from 5 s before the first crash: what each model write changed
    seen: multiprocessing.Queue[tuple[str, str, float]] = multiprocessing.get_context("spawn").Queue()
    watchers: list[multiprocessing.process.BaseProcess] = []

    baseline: dict[str, str] = {}
    try:
        time.sleep(3)
        names = [f"m{i:03d}" for i in range(count)]
        for name in names:
            custom.create_namespaced_custom_object(
                "loadline.dev",
                "v1alpha1",
                namespace,
                "inferencemodels",
                chat_model(name, ["L4"], resources={"memoryGiB": 12}),
            )
        deadline = time.monotonic() + 240 + count * 0.5  # a fleet takes minutes to come up
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(namespace).items
            running = [p for p in pods if p.status.phase == "Running" and p.status.container_statuses]
            if len(running) >= count:
                break
            time.sleep(2)
        print(f"{len(running)} of {count} models running")
        for dep in apps.list_namespaced_deployment(namespace).items:
            baseline[dep.metadata.name] = (dep.spec.template.spec.containers[0].resources.limits or {}).get(
                "memory"
            )
        spawn = multiprocessing.get_context("spawn")
        if args.direct:
            stop_operator(operator)
            watchers.append(
                spawn.Process(target=respond_directly, args=(namespace, args.injectors), daemon=True)
            )
        watchers.extend(
            spawn.Process(target=target, args=(namespace, baseline, seen), daemon=True)
            for target in (watch_models, watch_deployments)
        )
        for watcher in watchers:
            watcher.start()
        time.sleep(5)  # both watches listed and watching (a spawned process imports the client first)
        termination = termination_for("oomkilled")
        api = client.ApiClient()
        own_before, writes_before = own_requests(metrics_url), apiserver_writes()
        waits_before = lane_waits(metrics_url)

        def crash(slot: tuple[int, Any]) -> None:
            index, pod = slot
            time.sleep(max(0.0, start + index * args.over / len(running) - time.monotonic()))
            raw: dict[str, Any] = api.sanitize_for_serialization(pod)
            status = crashed_status(raw, raw["spec"]["containers"][0]["name"], termination)
            body = {"metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]}, "status": status}
            # From the moment the write is sent (no model had a crash or a raised limit before), so
            # a decision the watch shows before the write's answer still counts.
            crashed[raw["metadata"]["labels"]["loadline.dev/inferencemodel"]] = time.time()
            core.patch_namespaced_pod_status(raw["metadata"]["name"], namespace, json.loads(json.dumps(body)))

        def note(what: str, key: str, when: float) -> None:
            if what == "decided":
                decided.setdefault(key, when)
            elif what == "rolled":
                rolled.setdefault(key, when)
            elif what == "ready":
                ready.setdefault(key, when)
            else:
                model_writes[key] += 1

        cpu_before = cpu_seconds()
        start, wall_start = time.monotonic(), time.time()
        with ThreadPoolExecutor(args.injectors) as pool:
            list(pool.map(crash, enumerate(running)))
        injected = time.monotonic() - start
        last_crash = time.monotonic()
        deadline = last_crash + 120
        to_decide = 0 if args.direct else len(crashed)  # the yardstick decides nothing
        while time.monotonic() < deadline and (len(decided) < to_decide or len(rolled) < len(crashed)):
            try:
                what, key, when = seen.get(timeout=0.5)
            except queue.Empty:
                continue
            note(what, key, when)
        cpu = cpu_used(cpu_before, cpu_seconds())
        own = own_requests(metrics_url) - own_before
        waits = lane_waits(metrics_url) - waits_before
        writes = apiserver_writes() - writes_before
        # Then until every remediated model is Ready again (its model writes counted to the end): the
        # control plane replaces a pod per crash, 1,000 of them in a minute or two on this machine.
        ready_deadline = last_crash + READY_WITHIN_SECONDS
        while not args.direct and time.monotonic() < ready_deadline and len(ready) < len(rolled):
            try:
                note(*seen.get(timeout=0.5))
            except queue.Empty:
                continue
        for watcher in watchers:
            watcher.terminate()
        paced = f", spread over {args.over:g} s" if args.over else ", as fast as they write"
        print(f"{len(crashed)} crashes injected in {injected:.2f} s ({args.injectors} threads{paced})")
        if args.direct:
            print("answered by the yardstick: one Deployment patch per crash, no operator (--direct)")
        print(
            f"handled: {len(decided)} of {len(crashed)} decided, {len(rolled)} of {len(crashed)} rolled "
            "(within 120 s of the last crash)"
        )
        print(
            summary(
                "detect → decided (incident and remediation in status)",
                [decided[n] - crashed[n] for n in decided],
            )
        )
        print(
            summary(
                "detect → rolled (raised memory in the pod template)",
                [rolled[n] - crashed[n] for n in rolled],
            )
        )
        if not args.direct:
            print(
                summary(
                    f"detect → Ready again after the roll-out ({len(ready)} of {len(rolled)} within "
                    f"{READY_WITHIN_SECONDS:.0f} s of the last crash)",
                    [ready[n] - crashed[n] for n in ready],
                )
            )
            phases = Counter(
                (model.get("status") or {}).get("phase")
                for model in custom.list_namespaced_custom_object(
                    "loadline.dev", "v1alpha1", namespace, "inferencemodels"
                )["items"]
            )
            said = ", ".join(f"{phase} {n}" for phase, n in phases.items())
            print(f"phases at the end (from the API server): {said}")
        print(f"CPU from the first crash until all were handled, by process: {cpu}")
        crashes = max(1, len(crashed))
        print(
            "waited for a thread of its lane, mean per call: "
            + (
                ", ".join(
                    f"{lane} {waits[f'{lane} s'] / waits[f'{lane} n']:.2f} s (n={waits[f'{lane} n']:.0f})"
                    for lane in ("crashes", "models", "checks")
                    if waits[f"{lane} n"]
                )
                or "no lanes (no operator)"
            )
        )
        print(f"loadline's own requests per crash: {per_crash(own, crashes)}")
        print(f"API server writes per crash (everyone's, by resource): {per_crash(writes, crashes)}")
        print(
            "InferenceModel writes per crash (by what changed, until Ready again): "
            f"{per_crash(model_writes, crashes)}"
        )
        events = events_since(core, namespace, wall_start)
        print(f"Events per crash (by who, reason): {per_crash(events, crashes)}")
    finally:
        for watcher in watchers:
            watcher.terminate()
        stop_operator(operator)
        if args.direct:  # kopf's finalizers, which no operator is left to remove
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
