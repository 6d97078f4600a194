"""What reconcile asks the API server for (through loadline.handlers._kube, faked here): every child is
applied; the child kinds are listed, to find a former layout's leftovers, only after a re-plan."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import kopf
import pytest
import yaml

from loadline.handlers import _events, _kube, _plan, _readiness, _reconcile, _rollout
from loadline.handlers._state import OperatorState
from loadline.settings import OperatorSettings
from loadline.state import INSTANCE_LABEL, AppliedVersions, RecentReads, _index, applied_now
from loadline.status import build as _build
from loadline.status import patch as tested_patch
from tests.conftest import typed_status
from tests.test_capacity import node, pod

REPO_EXAMPLE = "examples/chat-llama-8b.yaml"


class FakeKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        #: What was applied, by (kind, namespace, name): what a GET answers.
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}

    def apply(
        self, manifest: dict[str, Any], field_manager: str, versions: Any
    ) -> tuple[dict[str, Any], bool]:
        self.calls.append(("apply", manifest["kind"]))
        meta = manifest["metadata"]
        self.objects[manifest["kind"], meta.get("namespace", ""), meta["name"]] = copy.deepcopy(manifest)
        return {**manifest, "status": {}}, True

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, namespace or "", name)))

    def list_objects(self, api_version: str, kind: str, namespace: str | None = None, **_: str) -> list[Any]:
        self.calls.append(("list", kind))
        return []

    def has_kind(self, api_version: str, kind: str) -> bool:
        return True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    fake = FakeKube()
    for name in ("apply", "get", "list_objects", "has_kind"):
        monkeypatch.setattr(_kube, name, getattr(fake, name))
    monkeypatch.setattr(_events, "event", lambda *a, **k: None)
    return fake


def body(status: dict[str, Any] | None = None) -> dict[str, Any]:
    with open(REPO_EXAMPLE) as f:
        doc: dict[str, Any] = yaml.safe_load(f)
    doc["metadata"].update(uid="0b6c1d2e-0000-4000-8000-000000000001", generation=1, resourceVersion="1")
    if status is not None:
        doc["status"] = status
    return doc


def run(state: OperatorState, model: dict[str, Any]) -> dict[str, Any]:
    patch = kopf.Patch()
    view = ([node("l4", "NVIDIA-L4", 4), node("a100", "NVIDIA-A100-SXM4-80GB", 8)], [])
    settings = OperatorSettings()
    _reconcile.reconcile(state, kopf.Body(model), patch, logging.getLogger("test"), settings, view, [])
    return dict(patch.status)


def test_a_new_model_and_a_resync_list_no_child_kinds(state: OperatorState, fake: FakeKube) -> None:
    status = run(state, body())
    assert ("apply", "Deployment") in fake.calls
    assert not [c for c in fake.calls if c[0] == "list"]
    fake.calls.clear()
    run(state, body(status))  # a resync (resume after a restart): the same plan
    assert not [c for c in fake.calls if c[0] == "list"]


def test_only_a_replan_across_layouts_lists_every_child_kind_for_leftovers(
    state: OperatorState, fake: FakeKube
) -> None:
    status = run(state, body())
    resized = copy.deepcopy(status)
    resized["plan"]["gpu"] = "A100-80GBx2"  # another GPU, still one node per replica: a Deployment
    fake.calls.clear()
    run(state, body(resized))
    assert not [c for c in fake.calls if c[0] == "list"]
    moved = copy.deepcopy(status)
    moved["plan"]["nodesPerReplica"] = 2  # as if a LeaderWorkerSet served it before
    fake.calls.clear()
    run(state, body(moved))
    listed = {kind for verb, kind in fake.calls if verb == "list"}
    assert {"Deployment", "LeaderWorkerSet", "Service"} <= listed


def test_a_new_plan_is_one_event_naming_what_it_applied(
    state: OperatorState, fake: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events are writes too: a plan and its children are one decision, so one Event (a remediation's
    re-plan posted Planned and Applied, two of a crash's seven Events); a re-apply under the same plan
    (a child put back) is Applied alone."""
    said: list[tuple[str, str]] = []
    monkeypatch.setattr(_events, "event", lambda obj, **k: said.append((k["reason"], k["message"])))
    status = run(state, body())
    assert [reason for reason, _ in said] == ["Planned"]
    assert said[0][1].startswith("L4x1 per replica") and "applied Deployment/chat, Service/chat" in said[0][1]
    said.clear()
    run(state, body(status))  # the same plan; the fake answers every apply as a change (a child put back)
    assert [reason for reason, _ in said] == ["Applied"]


def test_a_replan_in_the_same_generation_applies_only_what_changed(
    state: OperatorState, fake: FakeKube
) -> None:
    """An out-of-memory remediation re-plans without a spec change: the workload is applied (its
    template changed), the Service and PodDisruptionBudget are not applied again (two of a crash's
    requests at 1,000 crashes). A spec change (a new generation) applies every child again, which
    also puts back one deleted or edited by hand; so does a new operator process."""
    status = run(state, body())
    fake.calls.clear()
    run(state, body(status))  # a remediation: same generation, the plan's memory raised
    assert [kind for verb, kind in fake.calls if verb == "apply"] == ["Deployment"]
    changed = body(status)
    changed["metadata"]["generation"] = 2
    fake.calls.clear()
    run(state, changed)
    assert [kind for verb, kind in fake.calls if verb == "apply"] == [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]
    state.applied.forget("team-a", "chat")  # as a new process (or the model's deletion) would
    fake.calls.clear()
    run(state, changed)
    assert len([kind for verb, kind in fake.calls if verb == "apply"]) == 3


class FakeParent:
    """get and the status writes of one InferenceModel, as the API server answers them: a merge patch
    guarded by resourceVersion (409 when stale), and a JSON patch whose ``test`` ops are checked
    against the stored model (422, :class:`_kube.Changed`, when one fails; a missing field tests as
    null, as kube-apiserver 1.36 does)."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.model = body(status)
        self.model["metadata"]["resourceVersion"] = "7"
        self.calls: list[str] = []

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        self.calls.append("get")
        return copy.deepcopy(self.model)

    def _written(self) -> dict[str, Any]:
        self.model["metadata"]["resourceVersion"] = str(int(self.model["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.model)

    def patch_status(self, obj: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("patch")
        if obj["metadata"]["resourceVersion"] != self.model["metadata"]["resourceVersion"]:
            from kubernetes.client.exceptions import ApiException

            raise ApiException(status=409, reason="Conflict")
        self.model["status"] = {**self.model["status"], **changes}
        return self._written()

    def patch_status_tested(
        self,
        obj: dict[str, Any],
        sets: dict[str, Any] | None,
        tested: tuple[str, ...],
        changes: dict[str, Any],
    ) -> dict[str, Any]:
        ops = None if sets is None else tested_patch.build_tested_status_patch(obj, sets, tested)
        if ops is None:  # a value the API server cannot test: the resourceVersion guard
            from kubernetes.client.exceptions import ApiException

            try:
                return self.patch_status(obj, changes)
            except ApiException:
                raise _kube.Changed("changed") from None
        self.calls.append("patch")
        if any(
            op["op"] == "test" and tested_patch.value_at(self.model, op["path"]) != op["value"] for op in ops
        ):
            raise _kube.Changed("changed")
        for op in ops:  # RFC 6902: "add" inserts into a list, "replace" replaces an element
            if op["op"] in ("add", "replace"):
                *parents, last = op["path"].split("/")[1:]
                node: Any = self.model
                for part in parents:
                    node = node[int(part)] if isinstance(node, list) else node[part]
                value = copy.deepcopy(op["value"])
                if isinstance(node, list) and op["op"] == "add":
                    node.insert(int(last), value)
                elif isinstance(node, list):
                    node[int(last)] = value
                else:
                    node[last] = value
        return self._written()


def available_deployment(model: dict[str, Any]) -> dict[str, Any]:
    """The model's Deployment, all its replicas available, owned by the model (as its event shows it)."""
    dep = deployment(1)
    del dep["metadata"]["resourceVersion"]
    dep["metadata"]["ownerReferences"] = [
        {"kind": "InferenceModel", "name": "chat", "uid": model["metadata"]["uid"]}
    ]
    dep["status"].update(replicas=1, readyReplicas=1)
    return dep


RISK_CONDITION = {
    "type": "OOMRisk", "status": "Unknown", "reason": "InsufficientData", "message": "Theil–Sen: 1 < 2",
    "lastTransitionTime": "2026-11-26T22:00:00Z",
}  # fmt: skip


def add_incident(status: dict[str, Any]) -> None:
    status["incidents"] = [{"loop": "chat/vllm", "count": 1}]


def add_condition(status: dict[str, Any]) -> None:
    status["conditions"] = [*status["conditions"], RISK_CONDITION]


def start_restart(status: dict[str, Any]) -> None:
    status["maintenance"] = {"action": "restart", "state": "Running", "trigger": "window"}


def replan(status: dict[str, Any]) -> None:
    status["observedGeneration"] = 2


@pytest.mark.parametrize(
    ("since_indexed", "expected"),
    [
        (None, ["patch"]),
        # Written since the index saw the model, by other hands, of what readiness does not read:
        # the write lands at once, and leaves theirs in place.
        (add_incident, ["patch"]),
        (add_condition, ["patch"]),
        (start_restart, ["patch"]),
        # What it reads changed since: refused, read again, decided again.
        (replan, ["patch", "get", "patch"]),
    ],
)
def test_a_childs_event_is_judged_on_the_index_and_read_again_only_when_what_it_read_changed(
    state: OperatorState,
    fake: FakeKube,
    monkeypatch: pytest.MonkeyPatch,
    since_indexed: Callable[[dict[str, Any]], None] | None,
    expected: list[str],
) -> None:
    status = run(state, body())  # Deploying, as reconcile leaves a new model
    parent = FakeParent(status)
    monkeypatch.setattr(_kube, "get", parent.get)
    monkeypatch.setattr(_kube, "patch_status_tested", parent.patch_status_tested)
    known = _index.model_entry(parent.model)
    if since_indexed is not None:
        since_indexed(parent.model["status"])
        parent.model["metadata"]["resourceVersion"] = "8"
    theirs = copy.deepcopy(parent.model["status"])
    _readiness.on_workload_event(
        state, kopf.Body(available_deployment(parent.model)), logging.getLogger("t"), known
    )
    assert parent.calls == expected
    assert parent.model["status"]["phase"] == "Ready"
    for key in ("incidents", "maintenance", "observedGeneration"):  # what the other hand wrote stays
        assert parent.model["status"].get(key) == theirs.get(key)
    assert [c for c in theirs["conditions"] if c["type"] != "Ready"] == [
        c for c in parent.model["status"]["conditions"] if c["type"] != "Ready"
    ]
    # Nothing changed since: the next event of the same child costs no request.
    parent.calls.clear()
    known = _index.model_entry(parent.model)
    _readiness.on_workload_event(
        state, kopf.Body(available_deployment(parent.model)), logging.getLogger("t"), known
    )
    assert parent.calls == []


def test_a_new_models_first_status_carries_its_scale_subresource(
    state: OperatorState, fake: FakeKube
) -> None:
    """What ``kubectl scale``, an HPA and KEDA read (the pods' selector, and their count: none yet) is
    in the model's first status, from the workload the apply answered; and it is noted, so the
    workload's first event (which the index's copy of the model, without that status yet, would judge)
    writes nothing. A resync of a model that already holds it writes nothing either."""
    first = run(state, body())
    assert first["selector"] == "app.kubernetes.io/instance=chat,app.kubernetes.io/name=vllm"
    assert first["replicas"] == 0
    namespace = body()["metadata"]["namespace"]
    assert state.scale_counts.written(namespace, "chat", body()["metadata"]["uid"])["replicas"] == 0
    assert "selector" not in run(state, body(first)) and "replicas" not in run(state, body(first))


def test_a_child_turning_available_writes_readiness_and_its_scale_count_in_one_request(
    state: OperatorState, fake: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new model's Deployment turning available moves both its readiness and its scale count (what
    ``kubectl scale``, an HPA and KEDA read): one status write carries both, and the scale's own sync
    then costs nothing. Two writes raced each other, and the second's refusal cost a read and another
    write: half of a fleet's creation requests per model."""
    from loadline.handlers import _registry

    parent = FakeParent(run(state, body()))  # Deploying, as reconcile leaves a new model
    for name in ("get", "patch_status", "patch_status_tested"):
        monkeypatch.setattr(_kube, name, getattr(parent, name))
    known = _index.model_entry(parent.model)
    key = f"{parent.model['metadata']['namespace']}/chat"
    _registry.workload_event(
        body=kopf.Body(available_deployment(parent.model)),
        logger=logging.getLogger("t"),
        type=None,
        memo=kopf.Memo(state=state),
        owned_models={key: [known]},
    )
    assert parent.calls == ["patch"]
    assert parent.model["status"]["phase"] == "Ready"
    assert parent.model["status"]["replicas"] == 1
    assert parent.model["status"]["selector"] == "app.kubernetes.io/instance=chat,app.kubernetes.io/name=vllm"


def test_a_readiness_write_without_a_ready_condition_to_replace_sets_the_list_guarded_as_a_whole() -> None:
    """Conditions but no Ready one: the list is set whole, and a list cannot be tested, so the write is
    guarded by resourceVersion; no conditions at all: set whole, tested as still absent."""
    ready = {"type": "Ready", "status": "True", "reason": "Available", "message": "1/1 replicas available"}
    previous = {"phase": "Deploying", "conditions": [RISK_CONDITION]}
    sets, tested = _build.build_readiness_patch(
        typed_status(previous), {"phase": "Ready", "conditions": [RISK_CONDITION, ready]}
    )
    obj = {"metadata": {}, "status": previous}
    assert (
        sets["/status/conditions"][-1] == ready
        and tested_patch.build_tested_status_patch(obj, sets, tested) is None
    )
    sets, tested = _build.build_readiness_patch(
        typed_status({"phase": "Deploying"}), {"phase": "Ready", "conditions": [ready]}
    )
    ops = tested_patch.build_tested_status_patch(
        {"metadata": {}, "status": {"phase": "Deploying"}}, sets, tested
    )
    assert ops is not None and {"op": "test", "path": "/status/conditions", "value": None} in ops


def test_only_plain_scalars_are_tested() -> None:
    """kube-apiserver compares a test's strings and numbers as the bytes its encoder wrote: a plan's
    text with "<" (escaped by Go), a float, an object or a list never match what a client sends."""
    assert all(tested_patch.testable(v) for v in (None, True, 3, "Ready", "2026-11-26T22:00:00Z", "a/b-1"))
    assert not any(tested_patch.testable(v) for v in ("16 GiB < 22 GiB", "Theil–Sen", 0.9, {}, [], 'a"b'))


# --- whether a server-side apply changed the object, without a GET (kube-apiserver's behaviour,
# checked on the local control plane: a no-op apply keeps resourceVersion and the manager's time) ---


def applied(time: str) -> dict[str, Any]:
    return {"metadata": {"managedFields": [
        {"manager": "kube-controller-manager", "operation": "Update", "time": "2026-11-23T21:08:30Z"},
        {"manager": "loadline", "operation": "Apply", "time": time},
    ]}}  # fmt: skip


@pytest.mark.parametrize(
    ("stamp", "date", "changed"),
    [
        ("2026-11-23T21:08:15Z", "Mon, 23 Nov 2026 21:08:15 GMT", True),  # stamped by this apply
        ("2026-11-23T21:08:15Z", "Mon, 23 Nov 2026 21:08:16 GMT", True),  # within the second
        ("2026-11-23T21:08:11Z", "Mon, 23 Nov 2026 21:08:15 GMT", False),  # a no-op: the old stamp
    ],
)
def test_an_apply_changed_the_object_when_its_managers_time_is_the_answers(
    stamp: str, date: str, changed: bool
) -> None:
    assert applied_now(applied(stamp), "loadline", date) is changed


def test_a_version_written_by_another_since_our_apply_is_no_change_of_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PodDisruptionBudget's status is written by the disruption controller whenever its pods change:
    the next apply answers with a new resourceVersion, yet changed nothing ("Applied" must not name it)."""

    class Answer:
        def __init__(self, version: str, stamp: str, date: str) -> None:
            self.data = json.dumps({"metadata": {"resourceVersion": version, **applied(stamp)["metadata"]}})
            self.headers = {"Date": date}

    answers: list[Answer] = []
    resource = type("Resource", (), {"server_side_apply": lambda self, **_: answers.pop(0)})()
    monkeypatch.setattr(_kube, "_resource", lambda api_version, kind: resource)
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "chat-pdb-test"}}
    versions = AppliedVersions()
    answers.append(Answer("1", "2026-11-23T21:08:15Z", "Mon, 23 Nov 2026 21:08:15 GMT"))  # created
    assert _kube.apply(pdb, "loadline", versions)[1] is True
    answers.append(Answer("1", "2026-11-23T21:08:15Z", "Mon, 23 Nov 2026 21:09:00 GMT"))  # a resync
    assert _kube.apply(pdb, "loadline", versions)[1] is False
    answers.append(Answer("7", "2026-11-23T21:08:15Z", "Mon, 23 Nov 2026 21:10:00 GMT"))  # status since
    assert _kube.apply(pdb, "loadline", versions)[1] is False
    answers.append(Answer("8", "2026-11-23T21:11:00Z", "Mon, 23 Nov 2026 21:11:00 GMT"))  # a new spec
    assert _kube.apply(pdb, "loadline", versions)[1] is True


def test_an_unreadable_answer_counts_as_changed() -> None:
    assert applied_now(applied("2026-11-23T21:08:11Z"), "loadline", None)
    assert applied_now({"metadata": {}}, "loadline", "Mon, 23 Nov 2026 21:08:15 GMT")


# --- the readiness timer's looks while Deploying ---


def pending_pod(model: str, reason: bool = True) -> dict[str, Any]:
    conditions = [
        {
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        }
    ]  # fmt: skip
    return {
        "metadata": {"name": f"{model}-0", "labels": {INSTANCE_LABEL: model}},
        "status": {"phase": "Pending", "conditions": conditions if reason else []},
    }


class ReadinessKube:
    """Counts the readiness look's reads: GET of the workload, LIST of the namespace's unbound pods."""

    def __init__(self, workload: dict[str, Any] | None, state: OperatorState) -> None:
        self.workload = workload
        self.pods = [pending_pod("chat")]
        # The operator's memory, its unbound pods' reads on this fake's clock.
        self.state = dataclasses.replace(state, unbound_pods=RecentReads(max_age=5.0, clock=lambda: self.now))
        self.calls: list[tuple[str, str]] = []
        self.selectors: list[dict[str, str]] = []
        self.now = 0.0

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", kind))
        return copy.deepcopy(self.workload)

    def list_objects(
        self, api_version: str, kind: str, namespace: str | None = None, **selectors: str
    ) -> list[Any]:
        self.calls.append(("list", kind))
        self.selectors.append(selectors)
        return copy.deepcopy(self.pods)

    def look(self, model: dict[str, Any], memo: dict[str, Any], elapsed: float) -> dict[str, Any]:
        """One look of the timer ``elapsed`` seconds into the model's Deploying (the clock moves too)."""
        self.now = elapsed
        memo["readiness_checked_at"] = elapsed  # what readiness_due notes when a look is due
        patch = kopf.Patch()
        _readiness.read_readiness(self.state, kopf.Body(model), patch, memo)
        return dict(patch.status)


def deployment(available: int, version: str = "7") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "chat",
            "namespace": "team-a",
            "generation": 1,
            "resourceVersion": version,
        },
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "availableReplicas": available, "updatedReplicas": 1},
    }


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch, state: OperatorState) -> ReadinessKube:
    kube = ReadinessKube(deployment(0), state)
    monkeypatch.setattr(_kube, "get", kube.get)
    monkeypatch.setattr(_kube, "list_objects", kube.list_objects)
    monkeypatch.setattr(_events, "event", lambda *a, **k: None)
    return kube


def deploying(state: OperatorState) -> dict[str, Any]:
    status = run(state, body())
    assert status["phase"] == "Deploying"
    return body(status)


def test_a_stuck_model_seen_through_its_deployments_events_costs_one_list_and_no_get(
    state: OperatorState, fake: FakeKube, looks: ReadinessKube
) -> None:
    model = deploying(state)
    state.workloads.note(deployment(0))  # its Deployment's watch event
    memo: dict[str, Any] = {}
    writes = [looks.look(model, memo, t) for t in (0, 5, 10)]
    assert looks.calls == []  # a burst's pods wait for the scheduler anyway: no read at all
    assert looks.look(model, memo, 20)  # the scheduler's reason, once it has been stuck a while
    assert looks.calls == [("list", "Pod")]
    assert looks.selectors == [{"label_selector": INSTANCE_LABEL, "field_selector": "spec.nodeName="}]
    later = [looks.look(model, memo, t) for t in (40, 100, 160, 220)]
    assert looks.calls == [("list", "Pod")] and later == [{}] * 4  # nothing moved: no read, no write
    assert writes[1:] == [{}, {}]


def test_a_deployments_count_that_moved_before_the_models_first_status_is_written_by_the_look(
    state: OperatorState, fake: FakeKube, looks: ReadinessKube
) -> None:
    """The workload's event that moved its count can come before the model has a status to write it
    in (the scale sync leaves it to reconcile's first status, which holds the count the apply
    answered): the readiness look writes it, once, so a model stuck Deploying shows its pending pod."""
    model = deploying(state)
    assert model["status"]["replicas"] == 0
    pending = deployment(0)
    pending["status"]["replicas"] = 1  # its pod exists, waiting for a GPU
    state.workloads.note(pending)
    memo: dict[str, Any] = {}
    first = looks.look(model, memo, 0)
    assert first["replicas"] == 1 and looks.calls == []
    model["status"].update(first)
    assert "replicas" not in looks.look(model, memo, 5)


def test_the_workload_changing_is_listed_again_and_ready_comes_from_its_events(
    state: OperatorState, fake: FakeKube, looks: ReadinessKube
) -> None:
    model = deploying(state)
    memo: dict[str, Any] = {}
    state.workloads.note(deployment(0, "7"))
    looks.look(model, memo, 20)
    state.workloads.note(deployment(0, "8"))
    looks.look(model, memo, 40)
    assert looks.calls == [("list", "Pod"), ("list", "Pod")]
    state.workloads.note(deployment(1, "9"))
    assert looks.look(model, memo, 100)["phase"] == "Ready"
    assert looks.calls == [("list", "Pod"), ("list", "Pod")]


def test_a_leaderworkerset_models_group_count_reaches_its_scale_subresource_at_each_look(
    state: OperatorState, fake: FakeKube, looks: ReadinessKube
) -> None:
    """A LeaderWorkerSet is not watched: the look that reads it writes its group count to
    status.replicas (what `kubectl scale` and KEDA read), once, when it moved."""
    model = deploying(state)
    model["status"]["plan"]["nodesPerReplica"] = 2
    model["spec"]["replicas"] = 2  # scaled to two groups
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "chat", "namespace": "team-a", "generation": 2, "resourceVersion": "5"},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": 1, "updatedReplicas": 2},
    }
    looks.workload = lws
    memo: dict[str, Any] = {}
    first = looks.look(model, memo, 0)
    assert looks.calls == [("get", "LeaderWorkerSet")]
    assert first["replicas"] == 2
    # The selector came with the model's first status (reconcile's), the count with the look.
    selector = {**model["status"], **first}["selector"]
    assert selector == "app.kubernetes.io/instance=chat,app.kubernetes.io/name=vllm"
    assert first.get("phase") != "Ready"
    model["status"].update(first)
    lws["status"].update(readyReplicas=2, availableReplicas=2)
    lws["metadata"]["resourceVersion"] = "6"
    ready = looks.look(model, memo, 5)
    assert ready["phase"] == "Ready" and "replicas" not in ready  # the count did not move: not written


def test_a_pod_still_waiting_for_the_scheduler_is_looked_at_again_at_each_look(
    state: OperatorState, fake: FakeKube, looks: ReadinessKube
) -> None:
    model = deploying(state)
    state.workloads.note(deployment(0))
    looks.pods = [pending_pod("chat", reason=False)]  # not tried by the scheduler yet
    memo: dict[str, Any] = {}
    assert "cannot be scheduled" not in str(looks.look(model, memo, 20))
    looks.pods = [pending_pod("chat")]
    assert "cannot be scheduled" in str(looks.look(model, memo, 40))  # found at the next look
    looks.look(model, memo, 100)
    assert looks.calls == [("list", "Pod")] * 2  # and then no more


def test_the_models_of_a_namespace_looking_together_share_one_list(
    state: OperatorState, fake: FakeKube, looks: ReadinessKube
) -> None:
    chat = deploying(state)
    other = deploying(state)
    other["metadata"]["name"] = "other"
    state.workloads.note(deployment(0))
    looks.pods = [pending_pod("chat"), pending_pod("other", reason=False)]
    chat_status = looks.look(chat, {}, 20)
    other_status = looks.look(other, {}, 23)  # within the timer's interval: the same LIST answers
    assert looks.calls == [("list", "Pod"), ("get", "Deployment")]  # other's Deployment: no event yet
    assert "pod chat-0 cannot be scheduled" in str(chat_status)
    assert "cannot be scheduled" not in str(other_status)  # its own pod has no reason; chat's is not its
    looks.look(other, {}, 40)  # older than the timer's interval: listed again
    assert looks.calls.count(("list", "Pod")) == 2


def test_a_workload_no_event_showed_yet_is_read(
    state: OperatorState, fake: FakeKube, looks: ReadinessKube
) -> None:
    model = deploying(state)
    memo: dict[str, Any] = {}
    looks.look(model, memo, 0)
    assert looks.calls == [("get", "Deployment")]
    state.workloads.note(deployment(0))
    state.workloads.note(deployment(0), deleted=True)  # deleted: read again
    looks.look(model, memo, 5)
    assert looks.calls == [("get", "Deployment")] * 2


# --- a crash's remediation planned with its decision and rolled out without reconcile ---


def remediated(status: dict[str, Any], memory_gib: int = 40) -> dict[str, Any]:
    """The model as a crash's decision leaves it: its overrides raise the memory limit."""
    model = body(copy.deepcopy(status))
    model["status"]["remediation"] = {
        "handledCrashes": ["c1"], "overrides": {"memoryGiB": memory_gib}, "observedGeneration": 1,
    }  # fmt: skip
    return model


def workload_memory(workload: dict[str, Any]) -> str:
    container = workload["spec"]["template"]["spec"]["containers"][0]
    return str(container["resources"]["limits"]["memory"])


L4_VIEW = ([node("l4", "NVIDIA-L4", 4)], [])


def plan_remediation(
    state: OperatorState, model: dict[str, Any], policies: Any = None
) -> _rollout.Remediation | None:
    return _rollout.plan_remediation(state, model, OperatorSettings(), L4_VIEW, policies)


def test_a_remediation_carries_its_plan_and_its_roll_out_applies_the_workload_only(
    state: OperatorState, fake: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned before the decision is written: its status (the new plan, what reconcile would write,
    less readiness, which the workload's events say) goes in the decision's patch, and the roll-out
    is one apply of the workload, which the model's readiness then follows."""
    said: list[str] = []
    monkeypatch.setattr(_events, "event", lambda obj, **k: said.append(k["reason"]))
    status = run(state, body())
    said.clear()
    fake.calls.clear()
    model = remediated(status)
    for condition in model["status"]["conditions"]:  # an apply refused earlier: only an apply says more
        if condition["type"] == "Deployed":
            condition.update(status="False", reason="ApplyFailed")
    remediation = plan_remediation(state, model)
    assert remediation is not None and fake.calls == []  # planning asks the API server nothing
    assert remediation.status["plan"] != status["plan"]
    assert "phase" not in remediation.status
    after = {**model["status"], **remediation.status}
    conditions = {c["type"]: c for c in after["conditions"]}
    assert conditions["Planned"]["message"] == after["message"]
    before = {c["type"]: c for c in model["status"]["conditions"]}
    assert conditions["Deployed"]["status"] == "False" and conditions["Ready"] == before["Ready"]
    assert workload_memory(remediation.workload) == "40Gi"
    assert remediation.workload["metadata"]["ownerReferences"][0]["uid"] == model["metadata"]["uid"]
    assert _rollout.apply_remediation(state, model, remediation, logging.getLogger("t"), OperatorSettings())
    assert fake.calls == [("apply", "Deployment")] and said == []


def test_a_remediation_that_changes_the_plans_message_is_still_the_workload_alone(
    state: OperatorState, fake: FakeKube
) -> None:
    """A lower gpu_memory_utilization changes the KV cache the plan's message (and its Planned
    condition) states: still a roll-out of the workload alone, the new message written with the
    decision, as long as what the model keeps of its FleetPolicies stays as it was."""
    status = run(state, body())
    model = body(copy.deepcopy(status))
    model["status"]["remediation"] = {
        "handledCrashes": ["c1"], "overrides": {"gpuMemoryUtilization": 0.8}, "observedGeneration": 1,
    }  # fmt: skip
    remediation = plan_remediation(state, model)
    assert remediation is not None
    assert remediation.status["message"] != status["message"]
    planned = next(c for c in remediation.status["conditions"] if c["type"] == "Planned")
    assert planned["message"] == remediation.status["message"]


def test_the_next_reconcile_of_a_remediated_model_finds_its_plan_written(
    state: OperatorState, fake: FakeKube
) -> None:
    """The model as the decision's patch left it (plan included): a later reconcile (a resync, a
    restart of the operator) plans the same, writes no plan, and applies the workload as always (which
    also repairs one edited by hand)."""
    status = run(state, body())
    model = remediated(status)
    remediation = plan_remediation(state, model)
    assert remediation is not None
    model["status"] |= remediation.status
    fake.calls.clear()
    patch = kopf.Patch()
    _reconcile.reconcile(
        state, kopf.Body(model), patch, logging.getLogger("t"), OperatorSettings(), L4_VIEW, []
    )
    assert "plan" not in patch.status
    assert fake.calls == [("apply", "Deployment")]


def test_what_the_workload_alone_cannot_carry_is_left_to_reconcile(
    state: OperatorState, fake: FakeKube
) -> None:
    """A move between layouts (reconcile removes the old one's children), a plan that fails, and a
    process that has not applied the model's other children for this generation (a restart, a shard
    handed over: reconcile applies them all) are no roll-out of the workload alone."""
    status = run(state, body())
    fake.calls.clear()
    moved = remediated(status)
    moved["status"]["plan"]["nodesPerReplica"] = 2  # a LeaderWorkerSet served it
    assert plan_remediation(state, moved) is None
    assert (
        plan_remediation(state, remediated(status, memory_gib=4096)) is None
    )  # no node has that much memory
    assert plan_remediation(state, remediated(status)) is not None
    # No room in the snapshot it plans on (which may be seconds old): reconcile plans on a fresh one.
    held = pod("l4", 1, labels={INSTANCE_LABEL: "other"})
    full = (
        [node("l4", "NVIDIA-L4", 1)],
        [held | {"metadata": {"namespace": "team-a", "labels": held["metadata"]["labels"]}}],
    )
    assert _rollout.plan_remediation(state, remediated(status), OperatorSettings(), full) is None
    state.applied.forget("team-a", "chat")
    assert plan_remediation(state, remediated(status)) is None
    assert fake.calls == []


def test_a_refused_roll_out_says_so(
    state: OperatorState, fake: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.client.exceptions import ApiException

    status = run(state, body())
    model = remediated(status)
    remediation = plan_remediation(state, model)
    assert remediation is not None

    def refuse(manifest: dict[str, Any], field_manager: str, versions: Any) -> Any:
        raise ApiException(status=403, reason="a ValidatingAdmissionPolicy refused it")

    monkeypatch.setattr(_kube, "apply", refuse)
    assert not _rollout.apply_remediation(
        state, model, remediation, logging.getLogger("t"), OperatorSettings()
    )


def test_reconcile_passes_over_a_version_older_than_a_remediation_being_rolled_out(
    state: OperatorState, fake: FakeKube
) -> None:
    """A version of the model written before a remediation's decision (a spec change whose event comes
    now) would put the memory back and roll the pods twice: reconcile passes over it, asking kopf to try
    again shortly (on the newest version by then), not counting the spec change handled. The version
    carrying the decision ends the guard."""
    status = run(state, body())
    model = body(copy.deepcopy(status))
    model["metadata"]["namespace"] = "team-a"
    state.roll_outs.expect("team-a", "chat", "c1")
    fake.calls.clear()
    patch = kopf.Patch()
    with pytest.raises(kopf.TemporaryError):
        _reconcile.reconcile(
            state, kopf.Body(model), patch, logging.getLogger("t"), OperatorSettings(), ([], []), []
        )
    assert fake.calls == [] and not patch
    model["status"]["remediation"] = {"handledCrashes": ["c0", "c1"]}
    assert not state.roll_outs.predates(model)  # the decision's own version: reconciled
    del model["status"]["remediation"]
    assert not state.roll_outs.predates(model)  # and the guard ended with it


def test_no_progressing_event_when_the_index_has_not_seen_loadlines_own_restart_yet(
    state: OperatorState, fake: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash's roll-out starts before the index shows the decision that started it (its maintenance
    record Running): the readiness write lands at once, and the roll-out posts no Progressing Event
    (RestartStarted says it), as the write's answer shows the restart."""
    said: list[str] = []
    monkeypatch.setattr(_events, "event", lambda obj, **k: said.append(k["reason"]))
    status = run(state, body())
    status["phase"] = "Ready"
    said.clear()  # the plan's own Event
    parent = FakeParent(status)
    monkeypatch.setattr(_kube, "get", parent.get)
    monkeypatch.setattr(_kube, "patch_status_tested", parent.patch_status_tested)
    known = _index.model_entry(parent.model)  # before the decision
    parent.model["status"]["maintenance"] = {
        "action": "remediation", "state": "Running", "startedAt": "2026-11-26T22:00:00Z", "trigger": "crashLoop",
    }  # fmt: skip
    parent.model["metadata"]["resourceVersion"] = "8"
    rolling = available_deployment(parent.model)
    rolling["status"].update(readyReplicas=0, availableReplicas=0, updatedReplicas=0)
    _readiness.on_workload_event(state, kopf.Body(rolling), logging.getLogger("t"), known)
    assert parent.calls == ["patch"]
    assert parent.model["status"]["phase"] == "Deploying" and said == []


def test_a_pod_the_scheduler_cannot_place_has_its_model_replanned_once_per_workload_version(
    state: OperatorState, fake: FakeKube, looks: ReadinessKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With capacity-aware planning, the scheduler's reason asks reconcile for a re-plan (an annotation
    kopf's update handler sees) with the planned GPU type counted full; not again until the workload
    changes. Without it, the model said "cannot be scheduled" and stayed Deploying for as long as no
    room was made (issue 41: 25 minutes)."""
    annotated: list[dict[str, str]] = []
    monkeypatch.setattr(_kube, "annotate", lambda obj, annotations: annotated.append(dict(annotations)))
    model = deploying(state)
    gpu_type = model["status"]["plan"]["gpuType"]
    state.workloads.note(deployment(0, "7"))
    memo: dict[str, Any] = {}
    looks.now = 20
    memo["readiness_checked_at"] = 20
    _readiness.read_readiness(state, kopf.Body(model), kopf.Patch(), memo, True)
    assert annotated == [{_plan.REPLAN_ANNOTATION: "7"}]
    assert state.capacity.refused["team-a/chat"] == (
        gpu_type,
        "pod chat-0 cannot be scheduled: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    )
    for elapsed in (40, 100):  # the same workload: its reason is known, nothing is asked again
        memo["readiness_checked_at"] = elapsed
        _readiness.read_readiness(state, kopf.Body(model), kopf.Patch(), memo, True)
    assert len(annotated) == 1
    # Capacity-blind planning would plan the same again: no re-plan is asked.
    state.capacity.refused.clear()
    state.workloads.note(deployment(0, "8"))
    memo["readiness_checked_at"] = 160
    _readiness.read_readiness(state, kopf.Body(model), kopf.Patch(), memo, False)
    assert len(annotated) == 1 and not state.capacity.refused
