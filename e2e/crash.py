"""Make a container of a running (KWOK-simulated) pod crash the way vLLM does.

    python e2e/crash.py POD --namespace NS --kind cuda-oom|oomkilled [--container C] [--crashloop]

There is no kubelet behind KWOK's nodes, so the crash is written straight into
the pod's status subresource, exactly as a kubelet reports a restarted
container: ``lastState.terminated`` (exit code, reason, termination message),
``restartCount`` + 1, and a fresh ``state`` (running again, or waiting in
CrashLoopBackOff with ``--crashloop``). KWOK's pod stages only act on Pending
pods and on deletions, so it leaves the patched status alone. Matching Events
are recorded too: the kubelet's ``BackOff`` on the pod and, for a host OOM
kill, the kernel monitor's ``OOMKilling`` on the node.

The kinds:

* ``cuda-oom``: the engine ran out of GPU memory: exit code 1, reason ``Error``,
  the termination message holding torch's OOM text (as a container with
  ``terminationMessagePolicy: FallbackToLogsOnError`` shows the log tail).
* ``oomkilled``: the kernel killed the process for exceeding its memory limit
  on the host: exit code 137, reason ``OOMKilled``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from kube import Kubectl, KubectlError

CrashKind = Literal["cuda-oom", "oomkilled"]
KINDS: tuple[CrashKind, ...] = ("cuda-oom", "oomkilled")


def cuda_oom_message(
    tried_mib: float = 786.0,
    total_gib: float = 79.19,
    free_mib: float = 552.50,
    in_use_gib: float = 78.64,
    allocated_gib: float = 76.92,
    reserved_gib: float = 1.05,
    gpu: int = 0,
) -> str:
    """The tail of a vLLM log whose engine died of a CUDA OOM (torch >= 2.5 wording)."""
    return (
        "ERROR [core.py] EngineCore failed to start.\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", '
        "line 273, in determine_available_memory\n"
        "    self.model_runner.profile_run()\n"
        '  File "/usr/local/lib/python3.12/dist-packages/torch/nn/modules/module.py", '
        "line 1773, in _wrapped_call_impl\n"
        "    return self._call_impl(*args, **kwargs)\n"
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_mib:.2f} MiB. "
        f"GPU {gpu} has a total capacity of {total_gib:.2f} GiB of which {free_mib:.2f} MiB is free. "
        f"Including non-PyTorch memory, this process has {in_use_gib:.2f} GiB memory in use. "
        f"Of the allocated memory {allocated_gib:.2f} GiB is allocated by PyTorch, and "
        f"{reserved_gib:.2f} GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )


@dataclass(frozen=True)
class Termination:
    exit_code: int
    reason: str
    message: str | None


def termination_for(kind: CrashKind, message: str | None = None) -> Termination:
    if kind == "cuda-oom":
        return Termination(1, "Error", message if message is not None else cuda_oom_message())
    if kind == "oomkilled":
        return Termination(137, "OOMKilled", message)
    raise ValueError(f"unknown crash kind {kind!r}; expected one of {', '.join(KINDS)}")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set_condition(conditions: list[dict[str, Any]], ctype: str, status: str, now: str, reason: str) -> None:
    for cond in conditions:
        if cond.get("type") == ctype:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now
            cond["status"] = status
            if status == "True":
                cond.pop("reason", None)
            else:
                cond["reason"] = reason
            return
    conditions.append({"type": ctype, "status": status, "lastTransitionTime": now, "reason": reason})


def crashed_status(
    pod: dict[str, Any],
    container: str,
    termination: Termination,
    *,
    crashloop: bool = False,
    now: str | None = None,
) -> dict[str, Any]:
    """The pod status after ``container`` crashed with ``termination`` and the kubelet restarted it."""
    now = now or _now()
    status: dict[str, Any] = copy.deepcopy(pod.get("status", {}))
    statuses: list[dict[str, Any]] = status.get("containerStatuses") or []
    entry = next((s for s in statuses if s.get("name") == container), None)
    if entry is None:
        names = [s.get("name") for s in statuses]
        raise ValueError(
            f"pod {pod['metadata']['name']} has no status for container {container!r} "
            f"(statuses: {names}); is it Running yet?"
        )
    previous = entry.get("state", {}).get("running", {})
    terminated: dict[str, Any] = {
        "exitCode": termination.exit_code,
        "reason": termination.reason,
        "startedAt": previous.get("startedAt", now),
        "finishedAt": now,
    }
    if entry.get("containerID"):
        terminated["containerID"] = entry["containerID"]
    if termination.message:
        terminated["message"] = termination.message
    entry["lastState"] = {"terminated": terminated}
    entry["restartCount"] = int(entry.get("restartCount", 0)) + 1
    if crashloop:
        back_off = min(10 * 2 ** (entry["restartCount"] - 1), 300)
        entry["state"] = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {back_off}s restarting failed container={container} "
                f"pod={pod['metadata']['name']}_{pod['metadata']['namespace']}({pod['metadata']['uid']})",
            }
        }
        entry["ready"] = False
        entry["started"] = False
        conditions = status.setdefault("conditions", [])
        _set_condition(conditions, "ContainersReady", "False", now, "ContainersNotReady")
        _set_condition(conditions, "Ready", "False", now, "ContainersNotReady")
    else:
        entry["state"] = {"running": {"startedAt": now}}
        entry["ready"] = True
        entry["started"] = True
    return status


def _event(
    *,
    namespace: str,
    involved: dict[str, Any],
    reason: str,
    message: str,
    component: str,
    host: str,
    now: str,
    type_: str = "Warning",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component, "host": host},
        "reportingComponent": component,
        "reportingInstance": host,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def crash_events(
    pod: dict[str, Any], container: str, kind: CrashKind, now: str | None = None
) -> list[dict[str, Any]]:
    """Events a real cluster records for this crash."""
    now = now or _now()
    meta = pod["metadata"]
    node = pod.get("spec", {}).get("nodeName", "")
    events = [
        _event(
            namespace=meta["namespace"],
            involved={
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "fieldPath": f"spec.containers{{{container}}}",
            },
            reason="BackOff",
            message=f"Back-off restarting failed container {container} in pod "
            f"{meta['name']}_{meta['namespace']}({meta['uid']})",
            component="kubelet",
            host=node,
            now=now,
        )
    ]
    if kind == "oomkilled" and node:
        events.append(
            _event(
                namespace="default",
                involved={"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
                reason="OOMKilling",
                message="Memory cgroup out of memory: Killed process 4242 (python3) total-vm:98765432kB, "
                "anon-rss:67108864kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:131072kB oom_score_adj:999",
                component="kernel-monitor",
                host=node,
                now=now,
            )
        )
    return events


def crash_container(
    kubectl: Kubectl,
    pod_name: str,
    namespace: str,
    kind: CrashKind,
    *,
    container: str | None = None,
    message: str | None = None,
    crashloop: bool = False,
    events: bool = True,
    attempts: int = 5,
) -> dict[str, Any]:
    """Crash ``container`` (default: the pod's first) of a running pod; return the pod's new status.

    The status patch carries the pod's resourceVersion, so a concurrent writer
    (KWOK, the scheduler) makes it fail and it is retried on the fresh object.
    """
    termination = termination_for(kind, message)
    for attempt in range(attempts):
        pod = kubectl.json("get", "pod", pod_name, "-n", namespace)
        name = container or pod["spec"]["containers"][0]["name"]
        if pod.get("status", {}).get("phase") != "Running":
            raise ValueError(
                f"pod {namespace}/{pod_name} is {pod.get('status', {}).get('phase')}, not Running"
            )
        now = _now()
        status = crashed_status(pod, name, termination, crashloop=crashloop, now=now)
        patch = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]}, "status": status}
        try:
            out = kubectl(
                "patch", "pod", pod_name, "-n", namespace, "--subresource=status",
                "--type=merge", "-p", json.dumps(patch), "-o", "json",
            )  # fmt: skip
        except KubectlError as exc:
            if "the object has been modified" in exc.stderr and attempt + 1 < attempts:
                continue
            raise
        if events:
            for event in crash_events(pod, name, kind, now=now):
                kubectl("create", "-f", "-", input=json.dumps(event))
        patched: dict[str, Any] = json.loads(out)["status"]
        return patched
    raise RuntimeError(f"could not patch pod {namespace}/{pod_name}: kept conflicting")  # pragma: no cover


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pod")
    parser.add_argument("--namespace", "-n", default="default")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--container", "-c", help="container name (default: the pod's first container)")
    parser.add_argument("--message", help="termination message (default for cuda-oom: torch's OOM text)")
    parser.add_argument(
        "--crashloop", action="store_true", help="leave the container waiting in CrashLoopBackOff"
    )
    parser.add_argument("--no-events", action="store_true", help="do not record Events")
    parser.add_argument("--kubeconfig", help="default: .e2e/kubeconfig")
    args = parser.parse_args(argv)
    kubectl = Kubectl(Path(args.kubeconfig)) if args.kubeconfig else Kubectl()
    try:
        status = crash_container(
            kubectl,
            args.pod,
            args.namespace,
            args.kind,
            container=args.container,
            message=args.message,
            crashloop=args.crashloop,
            events=not args.no_events,
        )
    except (KubectlError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for cs in status.get("containerStatuses", []):
        term = cs.get("lastState", {}).get("terminated", {})
        print(
            f"{args.namespace}/{args.pod} {cs['name']}: restartCount={cs.get('restartCount')} "
            f"lastState.terminated.reason={term.get('reason')} exitCode={term.get('exitCode')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
