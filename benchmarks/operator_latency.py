"""Print the operator's apply → children-created latency for 100 InferenceModels (not a test).

Needs the local control plane (`make cluster-up`). It starts its own `loadline run` (capacity
awareness off, so that 100 models are all planned even though the simulated fleet cannot run them
all), creates 100 InferenceModels in a fresh namespace as fast as the API server takes them, and
records, for each, the time from its create call returning to the watch event that shows its
Deployment. Run: `.venv/bin/python benchmarks/operator_latency.py [COUNT]`.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

from _bench import KUBECONFIG, chat_model, ensure_crds, start_operator, stop_operator, summary
from kubernetes import client, config, watch


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    if not KUBECONFIG.exists():
        print(f"no cluster: {KUBECONFIG} is missing (run `make cluster-up`)", file=sys.stderr)
        return 1
    config.load_kube_config(str(KUBECONFIG))  # type: ignore[no-untyped-call]
    ensure_crds()
    core, custom, apps = client.CoreV1Api(), client.CustomObjectsApi(), client.AppsV1Api()
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    operator = start_operator(namespace, "operator-bench.log", capacity_aware="false")
    created: dict[str, float] = {}
    seen: dict[str, float] = {}
    done = threading.Event()

    def watch_deployments() -> None:
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(apps.list_namespaced_deployment, namespace, timeout_seconds=300):
            name = event["object"].metadata.name
            seen.setdefault(name, time.monotonic())
            if len(seen) >= count:
                stream.stop()  # type: ignore[no-untyped-call]
                break
        done.set()

    try:
        time.sleep(3)  # let the operator start its watches
        watcher = threading.Thread(target=watch_deployments, daemon=True)
        watcher.start()
        start = time.monotonic()
        for i in range(count):
            name = f"m{i:03d}"
            custom.create_namespaced_custom_object(
                "loadline.dev", "v1alpha1", namespace, "inferencemodels", chat_model(name, ["L4", "L40S"])
            )
            created[name] = time.monotonic()
        applied = time.monotonic() - start
        done.wait(timeout=300)
        latencies = [seen[n] - created[n] for n in created if n in seen]
        print(f"{count} InferenceModels created in {applied:.2f} s; Deployments seen for {len(latencies)}")
        if latencies:
            print(summary("apply → Deployment created", latencies))
            last = max(seen.values()) - start
            print(f"all {len(latencies)} children created {last:.2f} s after the first apply")
    finally:
        stop_operator(operator)
        core.delete_namespace(namespace)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
