"""What the watches of workloads and pods showed this process, and the scale counts it wrote lately:
what readiness and the scale subresource decide on without asking the API server."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from cachetools import LRUCache, TTLCache

from loadline.api import InferenceModelStatus
from loadline.state._index import INSTANCE_LABEL
from loadline.state._keys import ModelKey
from loadline.status.build import REVISION_ANNOTATION

#: How many Deployments :class:`SeenWorkloads` keeps: an LRU, as Deployments deleted with their model by
#: the garbage collector may never show this process a DELETED.
SEEN_WORKLOADS_MAX = 50_000
#: How long a ReplicaSet's revision, once read, is taken as still its own (seconds).
REVISION_SECONDS = 60.0


class SeenWorkloads:
    """The last version of each Deployment that its watch events showed, trimmed to what readiness
    reads, keyed (namespace, name): the readiness timer reads it here instead of asking the API server
    (at fleet scale a GET per look was half the operator's requests while a burst was Deploying)."""

    def __init__(self, max_entries: int = SEEN_WORKLOADS_MAX) -> None:
        self._lock = threading.Lock()
        self._seen: LRUCache[ModelKey, dict[str, Any]] = LRUCache(maxsize=max_entries)

    def note(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """Keep (or, when ``deleted``, forget) a Deployment as its watch event showed it."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        with self._lock:
            if deleted:
                self._seen.pop(key, None)
                return
            spec = body.get("spec") or {}
            revision = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
            self._seen[key] = {
                "metadata": {
                    **{k: meta.get(k) for k in ("name", "namespace", "uid", "generation", "resourceVersion")},
                    "annotations": {REVISION_ANNOTATION: revision} if revision else {},
                    "ownerReferences": list(meta.get("ownerReferences") or []),
                },
                "spec": {"replicas": spec.get("replicas"), "paused": bool(spec.get("paused"))},
                "status": dict(body.get("status") or {}),
            }

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._seen.get((namespace, name))


class ReadyPods:
    """The Ready pods of each model by the ReplicaSet that owns them, as the pod watch shows them, and
    each ReplicaSet's revision once read: what makes a model Ready when its current template's pods
    are, before the Deployment's controller writes its ready count (:func:`loadline.status.build.
    readiness_from_workload`). Noted on kopf's event loop with no I/O."""

    def __init__(
        self, revision_seconds: float = REVISION_SECONDS, max_revisions: int = SEEN_WORKLOADS_MAX
    ) -> None:
        self._lock = threading.Lock()
        #: (namespace, model) -> ReplicaSet (uid, name) -> its Ready pods' names -> their first
        #: container's name (the engine's, whose log the observation reads).
        self._ready: dict[ModelKey, dict[tuple[str, str], dict[str, str]]] = {}
        #: ReplicaSet uid -> its revision annotation; kept for a while only, as a roll-back to a
        #: template an older ReplicaSet holds moves that ReplicaSet's revision up.
        self.revisions: TTLCache[str, str] = TTLCache(maxsize=max_revisions, ttl=revision_seconds)

    def note(self, pod: Mapping[str, Any], deleted: bool = False) -> bool:
        """Record the pod's readiness; True when it has just turned Ready."""
        meta = pod.get("metadata") or {}
        model = (meta.get("labels") or {}).get(INSTANCE_LABEL)
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "ReplicaSet"), None)
        if not model or owner is None:
            return False
        key = (str(meta.get("namespace") or ""), str(model))
        replica_set = (str(owner.get("uid") or ""), str(owner.get("name") or ""))
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = (
            not deleted
            and not meta.get("deletionTimestamp")
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        )
        name = str(meta.get("name"))
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        with self._lock:
            sets = self._ready.setdefault(key, {})
            pods = sets.setdefault(replica_set, {})
            was = name in pods
            if ready:
                pods[name] = str(containers[0].get("name") or "")
            else:
                pods.pop(name, None)
                if not pods:
                    del sets[replica_set]
                if not sets:
                    del self._ready[key]
            return ready and not was

    def of_model(self, namespace: str, model: str) -> dict[tuple[str, str], int]:
        """The model's ReplicaSets (uid, name) that have Ready pods, with how many."""
        with self._lock:
            return {rs: len(pods) for rs, pods in self._ready.get((namespace, model), {}).items()}

    def serving(self, namespace: str, model: str) -> tuple[str, str] | None:
        """(pod, container) of the model's Ready pod with the smallest name, whichever ReplicaSet owns
        it; None when the pod watch shows none (a LeaderWorkerSet's pods have no ReplicaSet)."""
        with self._lock:
            pods = [
                pod for by_name in self._ready.get((namespace, model), {}).values() for pod in by_name.items()
            ]
        return min(pods) if pods else None

    def forget_model(self, namespace: str, name: str) -> None:
        with self._lock:
            self._ready.pop((namespace, name), None)


#: How long a scale count this process wrote stands in for its index's copy of the model (seconds):
#: the index shows the write within a second or two; after this the index decides again, so a count
#: written meanwhile by another hand (another replica after a hand-over) is not overridden for longer.
SCALE_WRITTEN_SECONDS = 30.0


class ScaleCounts:
    """The scale subresource's ``status.replicas``/``status.selector`` this process last wrote, by
    model (namespace, name, uid), for :data:`SCALE_WRITTEN_SECONDS`. A workload's next event usually
    comes before the index shows the write: decided on the index's copy alone, it was written again
    (or read first, to find it already written), two thirds of the scale's requests at creation."""

    def __init__(self, max_entries: int = SEEN_WORKLOADS_MAX, ttl: float = SCALE_WRITTEN_SECONDS) -> None:
        self._lock = threading.Lock()
        self._written: TTLCache[tuple[str, str, str], dict[str, Any]] = TTLCache(max_entries, ttl)

    def written(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        """What this process wrote of the model's scale status lately (empty: nothing, or long ago)."""
        with self._lock:
            return dict(self._written.get((namespace, name, uid)) or {})

    def note(self, namespace: str, name: str, uid: str, changes: Mapping[str, Any]) -> None:
        """``changes`` (``replicas``, ``selector``) were written to the model's status."""
        with self._lock:
            key = (namespace, name, uid)
            self._written[key] = {**(self._written.get(key) or {}), **changes}

    def over(self, status: InferenceModelStatus, namespace: str, name: str, uid: str) -> InferenceModelStatus:
        """``status`` (the index's copy of the model's) with what this process wrote of its count lately
        laid over it: the status as the API server holds it by now, which the index shows later."""
        written = self.written(namespace, name, uid)
        return status.model_copy(update=written) if written else status
