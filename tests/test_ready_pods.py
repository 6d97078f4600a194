"""A model is Ready once its current template's pods are, before the Deployment's controller counts them.

During a storm of roll-outs the Deployment controller's queue is hundreds deep, and it writes a
Deployment's ready count one sync after the pods turned Ready: tens of seconds in which the model's
pods serve and its status said Deploying. The pods' own watch events say it at once, for the pods of
the ReplicaSet whose revision is the Deployment's current one (and only once its controller observed
the spec that made that ReplicaSet)."""

from __future__ import annotations

import copy
import logging
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from loadline.handlers import _events, _kube, _readiness
from loadline.handlers._state import OperatorState, ReadyPods
from loadline.state import _index
from loadline.status import build as _build
from tests.test_reconcile_requests import FakeParent

LOG = logging.getLogger("test")
REVISION = _build.REVISION_ANNOTATION


def rolled_deployment(model: dict[str, Any], observed: int = 2, revision: str = "2") -> dict[str, Any]:
    """The model's Deployment one sync into a crash's roll-out (generation 2): its controller made the
    new ReplicaSet (revision 2) and observed the spec, and has not counted a ready pod yet."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "chat",
            "namespace": model["metadata"]["namespace"],
            "uid": "dep-uid",
            "generation": 2,
            "resourceVersion": "20",
            "annotations": {REVISION: revision},
            "ownerReferences": [{"kind": "InferenceModel", "name": "chat", "uid": model["metadata"]["uid"]}],
        },
        "spec": {"replicas": 1},
        "status": {"observedGeneration": observed, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 0},
    }


def ready_pod(namespace: str, replica_set: str, ready: bool = True, name: str = "chat-1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {_index.INSTANCE_LABEL: "chat"},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": f"chat-{replica_set}", "uid": f"rs-{replica_set}"}
            ],
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class Cluster(FakeParent):
    """The Deploying model, and the ReplicaSets a GET answers: ``new`` of revision 2, ``old`` of 1."""

    def __init__(self) -> None:
        super().__init__({"phase": "Deploying", "observedGeneration": 1})
        self.replica_sets = {
            "chat-new": {"metadata": {"name": "chat-new", "uid": "rs-new", "annotations": {REVISION: "2"}}},
            "chat-old": {"metadata": {"name": "chat-old", "uid": "rs-old", "annotations": {REVISION: "1"}}},
        }
        self.refuse_replica_sets = False

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        if kind != "ReplicaSet":
            return super().get(api_version, kind, namespace, name)
        self.calls.append(f"get {name}")
        if self.refuse_replica_sets:
            raise ApiException(status=403, reason="Forbidden")
        return copy.deepcopy(self.replica_sets.get(name))


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    fake = Cluster()
    monkeypatch.setattr(_kube, "get", fake.get)
    monkeypatch.setattr(_kube, "patch_status", fake.patch_status)
    monkeypatch.setattr(_kube, "patch_status_tested", fake.patch_status_tested)
    monkeypatch.setattr(_events, "event", lambda *a, **k: None)
    return fake


def pod_turns_ready(state: OperatorState, pod: dict[str, Any]) -> None:
    """What the pod watch does: note the pod on the event loop; a pod that just turned Ready of a model
    that needs it is looked at (known=None: the model is read, as when the index has no entry)."""
    if state.ready_pods.note(pod):
        _readiness.on_pod_ready(state, pod, LOG)


def test_the_current_templates_pod_turning_ready_makes_the_model_ready_before_its_deployment_counts_it(
    state: OperatorState, cluster: Cluster
) -> None:
    namespace = cluster.model["metadata"]["namespace"]
    state.workloads.note(rolled_deployment(cluster.model))
    pod_turns_ready(state, ready_pod(namespace, "new"))
    assert cluster.model["status"]["phase"] == "Ready"
    ready = next(c for c in cluster.model["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["message"] == "1/1 replicas available"
    # The Deployment's own lagging events (its ready count still 0) do not turn it back.
    writes = cluster.calls.count("patch")
    _readiness.on_workload_event(state, kopf.Body(rolled_deployment(cluster.model)), LOG)
    assert cluster.model["status"]["phase"] == "Ready" and cluster.calls.count("patch") == writes
    # The ReplicaSet's revision was read once.
    assert cluster.calls.count("get chat-new") == 1


def test_an_old_templates_pod_or_an_unobserved_spec_leaves_the_model_deploying(
    state: OperatorState, cluster: Cluster
) -> None:
    namespace = cluster.model["metadata"]["namespace"]
    state.workloads.note(rolled_deployment(cluster.model))
    pod_turns_ready(state, ready_pod(namespace, "old", name="chat-0"))  # the crashed pod, restarted
    assert cluster.model["status"]["phase"] == "Deploying"
    # The controller has not observed generation 2: the revision annotation is the old template's.
    state.workloads.note(rolled_deployment(cluster.model, observed=1, revision="1"))
    pod_turns_ready(state, ready_pod(namespace, "new"))
    assert cluster.model["status"]["phase"] == "Deploying"
    assert "get chat-new" not in cluster.calls  # no revision to compare with: nothing read


def test_a_pod_that_stops_being_ready_no_longer_counts(state: OperatorState, cluster: Cluster) -> None:
    namespace = cluster.model["metadata"]["namespace"]
    state.workloads.note(rolled_deployment(cluster.model))
    pod_turns_ready(state, ready_pod(namespace, "new"))
    assert cluster.model["status"]["phase"] == "Ready"
    state.ready_pods.note(ready_pod(namespace, "new", ready=False))
    _readiness.on_workload_event(state, kopf.Body(rolled_deployment(cluster.model)), LOG)
    assert cluster.model["status"]["phase"] == "Deploying"


def test_without_leave_to_read_replica_sets_readiness_waits_for_the_deployment(
    state: OperatorState, cluster: Cluster
) -> None:
    """A chart from before the ``get replicasets`` rule: the pods are not counted, nothing fails, and
    the Deployment's own count still makes the model Ready."""
    cluster.refuse_replica_sets = True
    namespace = cluster.model["metadata"]["namespace"]
    state.workloads.note(rolled_deployment(cluster.model))
    pod_turns_ready(state, ready_pod(namespace, "new"))
    assert cluster.model["status"]["phase"] == "Deploying"
    counted = rolled_deployment(cluster.model)
    counted["status"].update(readyReplicas=1, availableReplicas=1)
    _readiness.on_workload_event(state, kopf.Body(counted), LOG)
    assert cluster.model["status"]["phase"] == "Ready"


def test_ready_pods_notes_each_pods_turn_to_ready_once() -> None:
    pods = ReadyPods()
    assert pods.note(ready_pod("ns", "new")) is True
    assert pods.note(ready_pod("ns", "new")) is False  # still Ready: no new look
    assert pods.of_model("ns", "chat") == {("rs-new", "chat-new"): 1}
    assert pods.note(ready_pod("ns", "new", name="chat-2")) is True
    assert pods.of_model("ns", "chat") == {("rs-new", "chat-new"): 2}
    assert pods.note(ready_pod("ns", "new"), deleted=True) is False
    assert pods.note(ready_pod("ns", "new", ready=False, name="chat-2")) is False
    assert pods.of_model("ns", "chat") == {}
    orphan = ready_pod("ns", "new")
    orphan["metadata"]["ownerReferences"] = []  # a LeaderWorkerSet's pod (a StatefulSet owns it)
    assert pods.note(orphan) is False and pods.of_model("ns", "chat") == {}


def test_current_revision_is_the_deployments_only_once_its_spec_is_observed() -> None:
    model = {"metadata": {"namespace": "ns", "uid": "u"}}
    assert _build.current_revision(rolled_deployment(model)) == "2"
    assert _build.current_revision(rolled_deployment(model, observed=1)) is None
    paused = rolled_deployment(model)
    paused["spec"]["paused"] = True
    assert _build.current_revision(paused) is None
    fresh = rolled_deployment(model)
    del fresh["status"]["observedGeneration"]  # never synced by its controller
    assert _build.current_revision(fresh) is None


def test_readiness_counts_the_current_templates_pods_against_the_wanted_replicas() -> None:
    workload = rolled_deployment({"metadata": {"namespace": "ns", "uid": "u"}})
    workload["spec"]["replicas"] = 2
    assert _build.readiness_from_workload(workload, 2, current_ready=1)[0] is False
    assert _build.readiness_from_workload(workload, 2, current_ready=2) == (True, "2/2 replicas available")
    assert _build.readiness_from_workload(workload, 1, current_ready=1)[0] is True  # a restart's surge
