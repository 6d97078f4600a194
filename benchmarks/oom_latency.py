"""Print loadline's out-of-memory detection → remediation latency with COUNT models running (not a test).

Needs the local control plane with room for COUNT single-GPU pods, e.g.
`LOADLINE_FLEET_SCALE=10 make cluster-up` (100 L4 GPUs). It starts its own `loadline run`, creates COUNT
InferenceModels (Llama-3.1-8B on one L4 each), waits until their pods run, then crashes every pod's
vLLM container the way a host OOM kill looks (exit 137, OOMKilled; written to the pod status as a kubelet
would) as fast as the API server takes it, and records for each model:

- detect → decided: from the crash being written to the incident and decision appearing in
  `status.remediation` (what the operator commits to before touching the children);
- detect → rolled: until the Deployment's pod template carries the raised memory limit.

Run: `.venv/bin/python benchmarks/oom_latency.py [COUNT]` (default 100).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from typing import Any

from _bench import KUBECONFIG, REPO, chat_model, ensure_crds, start_operator, stop_operator, summary
from kubernetes import client, config, watch

sys.path.insert(0, str(REPO / "e2e"))
from crash import crashed_status, termination_for


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
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
    operator = start_operator(namespace, "operator-oombench.log", remediation_max_actions_per_day="10")
    crashed: dict[str, float] = {}
    decided: dict[str, float] = {}
    rolled: dict[str, float] = {}
    stop = threading.Event()

    def watch_models() -> None:
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        lister = custom.list_namespaced_custom_object
        group = ("loadline.dev", "v1alpha1", namespace, "inferencemodels")
        for event in stream.stream(lister, *group, timeout_seconds=600):
            obj = event["object"]
            name = obj["metadata"]["name"]
            remediation = (obj.get("status") or {}).get("remediation") or {}
            if name in crashed and name not in decided and remediation.get("handledCrashes"):
                decided[name] = time.monotonic()
            if stop.is_set():
                stream.stop()  # type: ignore[no-untyped-call]

    def watch_deployments() -> None:
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(apps.list_namespaced_deployment, namespace, timeout_seconds=600):
            dep = event["object"]
            name = dep.metadata.name
            limits = dep.spec.template.spec.containers[0].resources.limits or {}
            if (
                name in crashed
                and name not in rolled
                and limits.get("memory") not in {None, baseline.get(name)}
            ):
                rolled[name] = time.monotonic()
            if stop.is_set():
                stream.stop()  # type: ignore[no-untyped-call]

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
        threads = [threading.Thread(target=f, daemon=True) for f in (watch_models, watch_deployments)]
        for thread in threads:
            thread.start()
        time.sleep(1)
        termination = termination_for("oomkilled")
        api = client.ApiClient()
        start = time.monotonic()
        for pod in running:
            raw: dict[str, Any] = api.sanitize_for_serialization(pod)
            status = crashed_status(raw, raw["spec"]["containers"][0]["name"], termination)
            body = {"metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]}, "status": status}
            core.patch_namespaced_pod_status(raw["metadata"]["name"], namespace, json.loads(json.dumps(body)))
            crashed[raw["metadata"]["labels"]["loadline.dev/inferencemodel"]] = time.monotonic()
        injected = time.monotonic() - start
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (len(decided) < len(crashed) or len(rolled) < len(crashed)):
            time.sleep(0.5)
        stop.set()
        print(f"{len(crashed)} crashes injected in {injected:.2f} s")
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
    finally:
        stop_operator(operator)
        core.delete_namespace(namespace)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
