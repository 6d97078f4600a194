"""What this process applied of each model's children: fingerprints of the manifests, the resourceVersion
each apply returned, and whether an apply's answer says it changed anything."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from cachetools import LRUCache

from loadline.state._keys import ModelKey, ObjectKey

#: How many children :class:`AppliedVersions` keeps: an LRU, as children the garbage collector deletes
#: with their model never pass through the handlers' delete.
APPLIED_VERSIONS_MAX = 50_000


class AppliedChildren:
    """What this process last applied of each model's children, for the model's uid and generation:
    ``(namespace, name)`` → (uid, generation, {``kind/name``: fingerprint of the manifest})."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._applied: dict[ModelKey, tuple[str, int | None, dict[str, str]]] = {}

    def already(self, meta: Mapping[str, Any], child: Mapping[str, Any], fingerprint: str) -> bool:
        """Whether this process applied ``child`` exactly so for this generation of the model already.

        A re-plan within one generation (an out-of-memory remediation; kopf re-running a reconcile)
        changes the workload, not its Service or PodDisruptionBudget: applying those again was two of a
        crash's requests at 1,000 crashes. A new generation (someone changed the spec) or a new process
        (a restart, a shard handed over) applies every child again, which also puts back one deleted or
        edited by hand."""
        key = (str(meta.get("namespace")), str(meta.get("name")))
        with self._lock:
            known = self._applied.get(key)
        if known is None or known[0] != meta.get("uid") or known[1] != meta.get("generation"):
            return False
        return known[2].get(f"{child['kind']}/{child['metadata']['name']}") == fingerprint

    def note(self, meta: Mapping[str, Any], child: Mapping[str, Any], fingerprint: str) -> None:
        key = (str(meta.get("namespace")), str(meta.get("name")))
        uid, generation = str(meta.get("uid")), meta.get("generation")
        with self._lock:
            known = self._applied.get(key)
            children = known[2] if known is not None and known[:2] == (uid, generation) else {}
            children[f"{child['kind']}/{child['metadata']['name']}"] = fingerprint
            self._applied[key] = (uid, generation, children)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._applied.pop((namespace, name), None)


class AppliedVersions:
    """The resourceVersion of each child as this process's last apply returned it: a later apply that
    returns the same one changed nothing. One per operator process (its state)."""

    def __init__(self, max_entries: int = APPLIED_VERSIONS_MAX) -> None:
        self._lock = threading.Lock()
        self._versions: LRUCache[ObjectKey, str | None] = LRUCache(maxsize=max_entries)

    def swap(self, key: ObjectKey, version: str | None) -> str | None:
        """Note ``version`` for ``key``; the one noted before (None when none was)."""
        with self._lock:
            before = self._versions.pop(key, None)
            self._versions[key] = version
            return before

    def forget(self, key: ObjectKey) -> None:
        with self._lock:
            self._versions.pop(key, None)


def applied_now(obj: Mapping[str, Any], field_manager: str, server_date: str | None) -> bool:
    """Whether a server-side apply by ``field_manager`` changed ``obj`` (as the API server returned it).

    The API server writes nothing for an apply that changes nothing: the object keeps its
    resourceVersion and the manager's ``managedFields`` time. An apply that changed something stamps
    that time with the server's clock, the clock of the response's ``Date`` header; both are whole
    seconds, so a time within a second of the answer is this apply's. (A GET before every apply told
    the same at one request per child; an unreadable header counts as changed.)"""
    if not server_date:
        return True
    try:
        answered = parsedate_to_datetime(server_date)
    except (TypeError, ValueError):
        return True
    stamps = [
        entry.get("time")
        for entry in (obj.get("metadata") or {}).get("managedFields") or []
        if entry.get("manager") == field_manager and entry.get("operation") == "Apply"
    ]
    times = []
    for stamp in stamps:
        try:
            times.append(datetime.fromisoformat(str(stamp).replace("Z", "+00:00")))
        except ValueError:
            return True
    return not times or max(times) >= answered - timedelta(seconds=1)
