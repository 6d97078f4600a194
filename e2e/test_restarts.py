"""Restarts in low-traffic windows on the real control plane, with the real Prometheus holding the history.

A fragmentation crash asks for a restart of the model's pods; loadline learns the model's quiet window
from its request history (backfilled: six days of `vllm:num_requests_running` with a four-minute lull at
the same time each day, a few minutes from now), schedules the restart into it, and restarts the pods
one at a time inside it, a surge pod first so that every replica serves throughout. A predicted out-of-memory crash before the window moves the restart earlier;
FleetPolicy restart windows and `maxConcurrent` hold restarts of several models.

The session installs the chart with 4-minute windows, 6 days of history and a 2-second maintenance
interval (conftest.operator_values); a platform team's defaults are 2 hours, 28 days and 30 seconds.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from chart import ChartOperator
from conftest import RESTART_HISTORY_DAYS, RESTART_WINDOW_MINUTES
from crash import crash_container
from kube import E2E_DIR, REPO, STATE_DIR, Kubectl, wait_for
from operator_helpers import example, model, models, pods_of, wait_phase
from test_oom import FRAGMENTED, age_container, age_readiness, climbing_gpu_memory
from test_prometheus import HISTORY, STEP, openmetrics

WINDOW = RESTART_WINDOW_MINUTES * 60
OLD_POD = "{name}-5c8d7b9f4-h2x7q"  # a pod the model had days ago: history outlives pods


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def traffic(namespace: str, name: str, quiet_start: int, end: int) -> list[str]:
    """Six days of requests in the running batch, every 15 s until ``end``: busy (10 to 16) but for a
    lull of one window's length at ``quiet_start``'s time of day, every day."""
    pod = OLD_POD.format(name=name)
    sel = f'{{engine="0",model_name="llama",namespace="{namespace}",pod="{pod}"}}'
    lines = []
    first = (end - RESTART_HISTORY_DAYS * 86400) // 60 * 60
    for t in range(first, end + 1, 15):  # scraped every 15 s, on the minute
        quiet = (t - quiet_start) % 86400 < WINDOW
        value = 0.5 if quiet else 10 + (t // 60) % 7
        lines.append(f"vllm:num_requests_running{sel} {value} {t}")
    return lines


def backfill(name: str, text: str, prometheus_url: str) -> None:
    source = STATE_DIR / "prometheus" / f"{name}.om"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(text)
    done = subprocess.run(["bash", str(E2E_DIR / "prometheus.sh"), "backfill", str(source)],
                          capture_output=True, text=True, timeout=180, check=True)  # fmt: skip
    # The restarted server must answer where the operator asks (the chart's prometheusUrl).
    assert done.stdout.strip().splitlines()[-1] == prometheus_url, done.stdout


def only_traffic(lines: list[str]) -> str:
    return "\n".join(["# TYPE vllm:num_requests_running gauge", *lines, "# EOF"]) + "\n"


def deploy(kubectl: Kubectl, namespace: str, name: str = "chat", replicas: int = 1) -> list[dict[str, Any]]:
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["metadata"]["name"] = name
    doc["spec"].update(gpu={"types": ["L4"]}, replicas=replicas)
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, name, "Ready")

    def running() -> list[dict[str, Any]] | None:
        pods = pods_of(kubectl, namespace, name)
        return pods if len(pods) == replicas else None

    return wait_for(running, timeout=30, what=f"{replicas} pod(s) of {name}")


def fragment(kubectl: Kubectl, namespace: str, name: str, pod: dict[str, Any]) -> None:
    """A fragmentation crash of a pod that served for three days (the class needs the long uptime)."""
    age_container(kubectl, namespace, pod, 72)
    age_readiness(kubectl, namespace, 71, name)
    crash_container(kubectl, pod["metadata"]["name"], namespace, "cuda-oom", message=FRAGMENTED)


def maintenance(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return dict((model(kubectl, namespace, name).get("status") or {}).get("maintenance") or {})


def decided(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """``status.maintenance`` once the timer chose a time (the OOM handler only marks it pending)."""
    return wait_for(
        lambda: (m := maintenance(kubectl, namespace, name)).get("scheduledAt") and m,
        timeout=30,
        what=f"{name}'s restart scheduled",
    )


def reasons(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    items = kubectl.json("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")[
        "items"
    ]
    return [
        e["reason"] for e in sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    ]


def test_a_fragmentation_restart_waits_for_the_learned_window_and_restarts_one_pod_at_a_time(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, prometheus_url: str
) -> None:
    now = int(time.time())
    quiet = (now + 270) // 60 * 60  # the lull starts on a minute, four to five minutes from now
    backfill("restart-window", only_traffic(traffic(namespace, "chat", quiet, now - 60)), prometheus_url)
    pods = deploy(kubectl, namespace, replicas=2)
    before = sorted(p["metadata"]["name"] for p in pods)
    template = kubectl.json("get", "deployment", "chat", "-n", namespace)["spec"]["template"]
    fragment(kubectl, namespace, "chat", pods[0])
    plan = decided(kubectl, namespace, "chat")
    assert time.time() < quiet - 10, "the set-up took too long to see the window from before it"
    assert (plan["state"], plan["action"], plan["trigger"]) == ("Scheduled", "restart", "window"), plan
    assert at(plan["scheduledAt"]).timestamp() == quiet, plan  # the learned lull, to the minute
    assert at(plan["nextWindowEnd"]).timestamp() == quiet + WINDOW
    assert "learned low-traffic window" in plan["reason"]
    assert "RestartScheduled" in reasons(kubectl, namespace, "chat")

    # Until the window nothing restarts.
    while time.time() < quiet - 3:
        assert sorted(p["metadata"]["name"] for p in pods_of(kubectl, namespace, "chat")) == before
        time.sleep(2)

    # Inside it, the pods restart one at a time, a third pod surged first (the cluster has free L4s):
    # at every look both replicas serve, and the model stays Ready.
    fewest_ready, most_pods, phases = 2, 2, set()
    deadline = quiet + WINDOW + 60
    while time.time() < deadline:
        current = pods_of(kubectl, namespace, "chat")
        ready = [
            p for p in current
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]  # fmt: skip
        fewest_ready, most_pods = min(fewest_ready, len(ready)), max(most_pods, len(current))
        status = model(kubectl, namespace, "chat").get("status") or {}
        phases.add(status.get("phase"))
        if (status.get("maintenance") or {}).get("state") == "Done":
            break
        time.sleep(0.5)
    done = maintenance(kubectl, namespace, "chat")
    assert done.get("state") == "Done", done
    assert fewest_ready == 2, "a replica was down during the restart"
    assert phases == {"Ready"}, phases
    assert most_pods == 3, "no surge pod"
    started = at(done["startedAt"]).timestamp()
    assert quiet <= started < quiet + WINDOW, done
    assert at(done["lastRestartAt"]).timestamp() <= quiet + WINDOW, done
    after = pods_of(kubectl, namespace, "chat")
    assert len(after) == 2 and not set(before) & {p["metadata"]["name"] for p in after}
    for pod in after:
        assert quiet <= at(pod["metadata"]["creationTimestamp"]).timestamp() < quiet + WINDOW
    said = reasons(kubectl, namespace, "chat")
    assert said.count("Restarting") >= 2 and "RestartStarted" in said and "RestartDone" in said
    after_deployment = kubectl.json("get", "deployment", "chat", "-n", namespace)
    assert after_deployment["spec"]["replicas"] == 2, "the surge pod stays"
    assert after_deployment["spec"]["template"] == template, "the restart changed what runs"


def test_a_predicted_oom_moves_the_restart_before_the_window(
    operator: ChartOperator, kubectl: Kubectl, namespace: str, prometheus_url: str
) -> None:
    """The lull is six hours away, but the GPU memory climbs to the L4's limit within the hour: the
    restart is scheduled before the predicted crash, not in the window."""
    [pod] = deploy(kubectl, namespace)
    now = int(time.time())
    quiet = (now + 6 * 3600) // 60 * 60
    end = (now - 60) // STEP * STEP
    climbing = climbing_gpu_memory(namespace, pod["metadata"]["name"])
    # One file, one Prometheus restart: the lull's history goes into the family openmetrics() opens.
    family = "# TYPE vllm:num_requests_running gauge\n"
    lull = "\n".join(traffic(namespace, "chat", quiet, end - HISTORY - 60)) + "\n"
    backfill("restart-risk", openmetrics([climbing], end).replace(family, family + lull, 1), prometheus_url)

    def predicted() -> dict[str, Any] | None:
        status = model(kubectl, namespace, "chat").get("status") or {}
        return status if (status.get("oomRisk") or {}).get("predictedAt") else None

    risk = wait_for(predicted, timeout=90, what="an OOM-risk prediction")["oomRisk"]
    crash_at = at(risk["predictedAt"]).timestamp()
    assert crash_at < quiet
    fragment(kubectl, namespace, "chat", pod)
    plan = decided(kubectl, namespace, "chat")
    assert plan["trigger"] == "oomRisk", plan
    assert at(plan["scheduledAt"]).timestamp() + WINDOW <= crash_at + 60, plan
    assert "out-of-memory crash is predicted" in plan["reason"], plan


def test_policy_windows_and_max_concurrent_hold_restarts_of_several_models(
    operator: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    """A FleetPolicy allows restarts from a few minutes from now, one model at a time. Two models with
    no history crash: both wait for the policy's window, then restart one after the other inside it; a
    single replica surges a second pod first, so it keeps serving."""
    hold_restarts_one_at_a_time(
        kubectl, namespace, lambda: {m: deploy(kubectl, namespace, m)[0] for m in ("alpha", "beta")}
    )


def hold_restarts_one_at_a_time(
    kubectl: Kubectl, namespace: str, deploy_models: Callable[[], dict[str, dict[str, Any]]]
) -> None:
    """The FleetPolicy of the test above, over the models ``deploy_models`` deploys (name → its pod):
    they crash, wait for the policy's window, and never restart two at once inside it."""
    start = datetime.fromtimestamp((int(time.time()) + 200) // 60 * 60, UTC)
    end = start + timedelta(minutes=12)
    name = f"restarts-{namespace}"
    policy = {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "FleetPolicy",
        "metadata": {"name": name},
        "spec": {
            "enforcement": "deny",
            "selector": {"namespaces": [namespace]},
            "restarts": {
                "windows": [{"start": f"{start:%H:%M}", "end": f"{end:%H:%M}", "timezone": "UTC"}],
                "maxConcurrent": 1,
            },
        },
    }
    kubectl.apply(policy)
    try:
        first = deploy_models()
        for m, pod in first.items():
            fragment(kubectl, namespace, m, pod)
        for m in first:
            plan = decided(kubectl, namespace, m)
            assert (plan["state"], plan["trigger"]) == ("Scheduled", "policyWindow"), plan
            assert at(plan["scheduledAt"]) == start, plan
        assert time.time() < start.timestamp() - 5, (
            "the set-up took too long to see the window from before it"
        )
        states: set[tuple[str, str]] = set()
        while time.time() < end.timestamp() + 30:
            now = {
                m: ((obj.get("status") or {}).get("maintenance") or {}).get("state", "")
                for m, obj in models(kubectl, namespace, first).items()
            }
            states.add(tuple(sorted(now.values())))
            if time.time() < start.timestamp() - 2:
                assert set(now.values()) == {"Scheduled"}, now
            assert list(now.values()).count("Running") <= 1, f"two restarts at once: {now}"
            if set(now.values()) == {"Done"}:
                break
            time.sleep(0.5)
        assert ("Running", "WaitingForLock") in states, states
        for m, pod in first.items():
            done = maintenance(kubectl, namespace, m)
            assert done.get("state") == "Done", done
            assert start.timestamp() <= at(done["startedAt"]).timestamp() < end.timestamp()
            [new] = pods_of(kubectl, namespace, m)
            assert new["metadata"]["name"] != pod["metadata"]["name"]
            said = reasons(kubectl, namespace, m)
            assert "Restarting" in said, said
        waited = [m for m in first if "RestartWaiting" in reasons(kubectl, namespace, m)]
        assert len(waited) == 1, waited
        for m in first:
            deployment = kubectl.json("get", "deployment", m, "-n", namespace)
            assert deployment["spec"]["replicas"] == 1  # the surge is over
    finally:
        kubectl.run("delete", "fleetpolicy", name, "--ignore-not-found", check=False)
