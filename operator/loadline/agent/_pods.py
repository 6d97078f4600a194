"""Which pod and container a GPU process belongs to, from the node's own files; no API server, no RBAC.

Two facts the node already keeps:

1. ``/proc/<pid>/cgroup`` names the process's pod UID and container ID: the kubelet puts each
   container in a cgroup under ``kubepods`` whose path carries ``pod<uid>`` and, as the last part, the
   container ID (``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``docker-<id>.scope`` with the
   systemd cgroup driver; the bare ID with cgroupfs; cgroup v1 and v2 alike).
2. ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log`` is the symlink the kubelet makes for
   every container's log; its *name* maps the container ID to namespace, pod and container. Only the
   directory is listed; no log is read.

NVML reports host PIDs, so the agent must see the host's processes (``hostPID``; see docs/agent.md).
A process that exits between NVML's answer and the ``/proc`` read is simply gone ("exited").
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ContainerRef",
    "Owner",
    "PodResolver",
    "parse_cgroup",
    "parse_container_log_name",
]

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$")
_LOG_NAME = re.compile(r"^([^_]+)_([^_]+)_(.+)-([0-9a-f]{64})\.log$")


@dataclass(frozen=True)
class ContainerRef:
    """A container as its cgroup names it."""

    pod_uid: str
    container_id: str


@dataclass(frozen=True)
class Owner:
    """The pod and container a process runs in (empty strings: on the node but not in a known pod)."""

    namespace: str = ""
    pod: str = ""
    container: str = ""


def parse_cgroup(text: str) -> ContainerRef | None:
    """The pod UID and container ID in the text of ``/proc/<pid>/cgroup``, or None outside a pod.

    Every line is ``hierarchy:controllers:path``; a path seen from another cgroup namespace starts with
    ``/..``, which does not matter here. The systemd driver writes the UID with ``_`` for ``-``.
    """
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        if "kubepods" not in path:
            continue
        uid = _POD_UID.search(path)
        cid = _CONTAINER_ID.search(path)
        if uid and cid:
            return ContainerRef(uid.group(1).replace("_", "-"), cid.group(1))
    return None


def parse_container_log_name(name: str) -> tuple[str, Owner] | None:
    """``"vllm-0_team-a_vllm-<64 hex>.log"`` → (container ID, Owner); None for other names.

    Pod names, namespaces and container names cannot hold ``_``, so the three fields split cleanly;
    a container name may hold ``-``, hence the ID is taken from the end.
    """
    match = _LOG_NAME.match(name)
    if not match:
        return None
    pod, namespace, container, cid = match.groups()
    return cid, Owner(namespace, pod, container)


@dataclass
class PodResolver:
    """Maps host PIDs to their pod and container, per read.

    ``proc_root`` is where the host's ``/proc`` is seen (``/proc`` with ``hostPID``),
    ``containers_dir`` the kubelet's ``/var/log/containers``.
    """

    proc_root: Path = Path("/proc")
    containers_dir: Path = Path("/var/log/containers")

    def containers(self) -> dict[str, Owner]:
        """Container ID → owner, from the log symlinks' names (empty when the directory is absent)."""
        try:
            names = os.listdir(self.containers_dir)
        except OSError:
            return {}
        out: dict[str, Owner] = {}
        for name in names:
            parsed = parse_container_log_name(name)
            if parsed:
                out[parsed[0]] = parsed[1]
        return out

    def resolve(self, pids: Iterable[int]) -> tuple[dict[int, Owner], list[str]]:
        """Owners of the PIDs still alive, and one reason per PID that could not be placed in a pod.

        Reasons: ``exited`` (the process is gone; it is left out of the answer), ``unreadable`` (its
        cgroup file cannot be read), ``not_in_a_pod`` (a process outside Kubernetes: a host daemon, a
        container started by hand), ``unknown_container`` (a pod's container whose log symlink is not
        there: just started, or ``/var/log/containers`` not mounted). Only exited processes are left
        out; the others are answered with an empty :class:`Owner`.
        """
        containers: dict[str, Owner] | None = None
        owners: dict[int, Owner] = {}
        problems: list[str] = []
        for pid in pids:
            try:
                text = (self.proc_root / str(pid) / "cgroup").read_text()
            except (FileNotFoundError, ProcessLookupError):
                problems.append("exited")
                continue
            except OSError:
                problems.append("unreadable")
                owners[pid] = Owner()
                continue
            ref = parse_cgroup(text)
            if ref is None:
                problems.append("not_in_a_pod")
                owners[pid] = Owner()
                continue
            if containers is None:
                containers = self.containers()
            owner = containers.get(ref.container_id)
            if owner is None:
                problems.append("unknown_container")
                owner = Owner()
            owners[pid] = owner
        return owners, problems
