"""The operator side of observed memory (loadline.handlers._observe): a running model's log read into
status.observed and the KVCapacity condition, the observation stored, a re-plan asked when vLLM got less
than the spec needs; and the re-plan holding the shortfall back (the store reaches the planner)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import kopf
import pytest

from loadline.api import parse_inference_model
from loadline.handlers import _kube, _observe
from loadline.handlers._state import ReadyPods
from loadline.observe import CorrectionStore, plan_fingerprint
from loadline.settings import OperatorSettings
from loadline.sizing import plan_inference_model
from loadline.state import INSTANCE_LABEL
from tests.conftest import stored_plan, typed_status

LOG = (Path(__file__).parent / "corpus" / "startup" / "vllm_0.19.0_llama70b_fp8_tp2_h100.log").read_text()
SPEC = {
    "model": {"name": "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic"},
    "maxModelLen": 8192,
    "concurrency": 8,
    "engine": {"version": "0.19.0", "gpuMemoryUtilization": 0.95},
    "gpu": {"types": ["H100-80GB"]},
}


def _body(spec: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "llama", "namespace": "team-b", "generation": 1, "uid": "u1"},
        "spec": spec,
        "status": {"phase": "Ready", "plan": plan, "conditions": []},
    }


def _plan_of(spec: dict[str, Any]) -> Any:
    """The plan of model ``llama`` with ``spec``, as reconcile makes it."""
    return plan_inference_model(
        parse_inference_model(
            {
                "apiVersion": "loadline.dev/v1alpha1",
                "kind": "InferenceModel",
                "metadata": {"name": "llama"},
                "spec": spec,
            }
        ).spec
    )


class FakeCluster:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, log: str) -> None:
        self.configmap: dict[str, Any] | None = None
        pod = {"metadata": {"name": "llama-abc"}, "spec": {"containers": [{"name": "vllm"}]}}
        monkeypatch.setattr(_observe, "_running_pod", lambda ns, name: pod)
        monkeypatch.setattr(_observe, "_read_log", lambda ns, pod, container: log)
        monkeypatch.setattr(_kube, "get", self.get)
        monkeypatch.setattr(_kube, "apply", self.apply)
        self.status_writes: list[dict[str, Any]] = []
        self.annotations: list[dict[str, str]] = []
        monkeypatch.setattr(
            _kube, "patch_status", lambda obj, changes: self.status_writes.append(dict(changes)) or dict(obj)
        )
        monkeypatch.setattr(
            _kube, "annotate", lambda obj, ann: self.annotations.append(dict(ann)) or dict(obj)
        )

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        assert (kind, name) == ("ConfigMap", "loadline-observations")
        return self.configmap

    def apply(
        self, manifest: dict[str, Any], field_manager: str, versions: object = None
    ) -> tuple[dict[str, Any], bool]:
        self.configmap = {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": "1"}}
        return self.configmap, True


def _observe_once(monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any]) -> tuple[kopf.Patch, FakeCluster]:
    plan = _plan_of(spec)
    cluster = FakeCluster(monkeypatch, LOG)
    patch = kopf.Patch()
    settings = OperatorSettings(lease_namespace="loadline")
    _observe.observe(
        _body(spec, plan.summary().model_dump(by_alias=True, mode="json")),
        patch,
        settings,
        _observe.Observations(),
        _logger(),
    )
    return patch, cluster


def _logger() -> Any:
    import logging

    return logging.getLogger("test")


def test_status_observed_beside_the_plan_and_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    patch, cluster = _observe_once(monkeypatch, SPEC)
    observed = patch.status["observed"]
    assert observed["kvCacheGiB"] == 37.28 and observed["kvCacheTokens"] == 244304
    assert observed["maxConcurrency"] == 29.82 and observed["vllmVersion"] == "0.19.0"
    assert observed["pod"] == "llama-abc" and observed["source"] == "pod team-b/llama-abc log"
    assert abs(observed["kvCacheErrorPercent"]) < 1.0
    [condition] = [c for c in patch.status["conditions"] if c["type"] == "KVCapacity"]
    assert condition["status"] == "True"
    assert cluster.annotations == [] and cluster.status_writes == []  # enough room: no re-plan
    assert cluster.configmap is not None
    store = cluster.configmap["data"]["observations.json"]
    assert '"family": "llama"' in store and '"observedKvCacheGiB": 37.28' in store


def test_below_the_spec_is_a_condition_and_a_replan(monkeypatch: pytest.MonkeyPatch) -> None:
    # The spec asks 31 sequences: planned on three or more H100s, vLLM's log (two GPUs' worth) says 29.82.
    spec = {**SPEC, "concurrency": 31, "gpu": {"types": ["H100-80GB"]}}
    plan = plan_inference_model(
        parse_inference_model(
            {
                "apiVersion": "loadline.dev/v1alpha1",
                "kind": "InferenceModel",
                "metadata": {"name": "llama"},
                "spec": {**spec, "concurrency": 8},
            }
        ).spec
    )
    cluster = FakeCluster(monkeypatch, LOG)
    patch = kopf.Patch()
    body = _body(spec, plan.summary().model_dump(by_alias=True, mode="json"))
    _observe.observe(
        body, patch, OperatorSettings(lease_namespace="loadline"), _observe.Observations(), _logger()
    )
    # The status is written first, then the re-plan asked (reconcile starts from the written model).
    [written] = cluster.status_writes
    [condition] = [c for c in written["conditions"] if c["type"] == "KVCapacity"]
    assert condition["status"] == "False" and condition["reason"] == "BelowSpec"
    assert "room for only 29.82 sequences" in condition["message"]
    assert [list(a) for a in cluster.annotations] == [[_observe.REPLAN_ANNOTATION]]
    assert not dict(patch)


def test_an_engine_of_other_settings_is_shown_not_learned(monkeypatch: pytest.MonkeyPatch) -> None:
    patch, cluster = _observe_once(monkeypatch, {**SPEC, "maxModelLen": 16384})
    assert patch.status["observed"]["kvCacheGiB"] == 37.28
    assert cluster.configmap is None


def test_observed_once_per_plan() -> None:
    plan = stored_plan(gpu="H100-80GBx2", engineVersion="0.19.0", maxModelLen=8192)
    status = {"phase": "Ready", "plan": plan}
    assert _observe.observing(typed_status(status))
    assert not _observe.observing(
        typed_status(
            {
                **status,
                "observed": {"time": "2026-11-28T10:00:00Z", "planFingerprint": plan_fingerprint(plan)},
            }
        )
    )
    assert _observe.observing(
        typed_status(
            {
                **status,
                "plan": {**plan, "gpu": "H100-80GBx4"},
                "observed": {"time": "2026-11-28T10:00:00Z", "planFingerprint": plan_fingerprint(plan)},
            }
        )
    )
    assert not _observe.observing(typed_status({**status, "phase": "Deploying"}))


def test_the_store_reaches_the_planner() -> None:
    spec = parse_inference_model(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": "llama"},
            "spec": SPEC,
        }
    ).spec
    base = plan_inference_model(spec)
    from loadline.api import ObservationRecord

    short = ObservationRecord.model_validate({
        "family": "llama", "gpuType": "H100-80GB", "vllmMinor": "0.19", "quantization": "compressed-tensors",
        "plannedKvCacheGiB": base.budget.kv_cache_gib, "observedKvCacheGiB": base.budget.kv_cache_gib * 0.8,
        "source": "test",
    })  # fmt: skip
    corrected = plan_inference_model(spec, corrections=CorrectionStore.of([short]))
    assert corrected.summary().model_dump(by_alias=True, mode="json")["kvReserveGiB"] == pytest.approx(
        base.budget.kv_cache_gib * 0.2, abs=0.01
    )
    assert corrected.budget.kv_cache_gib == pytest.approx(base.budget.kv_cache_gib * 0.8, abs=0.02)


def test_what_is_written_is_valid_status(monkeypatch: pytest.MonkeyPatch) -> None:
    from loadline.api import InferenceModelStatus

    patch, _ = _observe_once(monkeypatch, SPEC)
    status = InferenceModelStatus.model_validate(dict(patch.status))
    assert status.observed is not None and status.observed.kv_cache_gi_b == 37.28


def test_from_prometheus_when_the_log_does_not_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm:cache_config_info answered as Prometheus's HTTP API does (tests/promserver.py's stand-in),
    its labels as vLLM sets them, with the figures of the 0.19 log: 15269 blocks of 16 tokens."""
    from tests.promserver import FakePrometheus

    plan = _plan_of(SPEC)
    cluster = FakeCluster(monkeypatch, "no figures in this log\n")
    labels = {"__name__": "vllm:cache_config_info", "namespace": "team-b", "pod": "llama-abc", "block_size": "16",
              "num_gpu_blocks": "15269", "cache_dtype": "auto", "gpu_memory_utilization": "0.95"}  # fmt: skip
    answer = {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": labels, "value": [0, "1"]}]},
    }
    prom = FakePrometheus(lambda query: answer)
    try:
        settings = OperatorSettings(lease_namespace="loadline", prometheus_url=prom.url)
        patch = kopf.Patch()
        _observe.observe(
            _body(SPEC, plan.summary().model_dump(by_alias=True, mode="json")),
            patch,
            settings,
            _observe.Observations(),
            _logger(),
        )
    finally:
        prom.close()
    assert prom.queries == ['vllm:cache_config_info{namespace="team-b",pod="llama-abc"}']
    observed = patch.status["observed"]
    assert observed["kvCacheTokens"] == 244304 and observed["maxConcurrency"] == 29.82
    assert observed["source"] == "prometheus vllm:cache_config_info of pod team-b/llama-abc"
    assert "kvCacheGiB" not in observed and cluster.configmap is None  # no GiB: nothing learned


def _ready(plan: dict[str, Any], since: str) -> dict[str, Any]:
    body = _body(SPEC, stored_plan(**plan))
    body["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": since}]
    return body


def _looks(body: dict[str, Any], memo: dict[str, Any], start: float, seconds: int) -> list[int]:
    """The ticks (every 10 s, as the timer fires) at which the log is read, ``start`` = the episode."""
    from datetime import UTC, datetime
    from unittest import mock

    looked = []
    for tick in range(0, seconds, 10):
        now = datetime.fromtimestamp(start + tick, UTC)
        with mock.patch.object(_observe, "datetime", wraps=datetime) as clock:
            clock.now.return_value = now
            if _observe.look_due(body, memo):
                looked.append(tick)
    return looked


def test_a_log_that_never_says_is_read_on_a_back_off_not_every_tick() -> None:
    """An engine whose log never holds the figures (another image, a rotated log) is read at once,
    then less and less often, then every ten minutes: over a day, about 150 reads, not 8,640."""
    from datetime import datetime

    since = "2026-11-28T10:00:00+00:00"
    body, memo = _ready({"gpuType": "L4", "engineVersion": "0.19.0"}, since), {}
    start = datetime.fromisoformat(since).timestamp()
    looked = _looks(body, memo, start, 86_400)
    assert looked[:7] == [0, 10, 30, 70, 150, 310, 910]
    assert all(b - a == 600 for a, b in itertools.pairwise(looked[5:]))
    assert len(looked) < 150


def test_a_new_plan_or_ready_again_is_looked_at_at_once() -> None:
    """The back-off is the episode's: a new plan (a remediation's raised memory) or the model Ready
    again (its pod restarted: a new log) is read at once, whatever the last episode had come to."""
    from datetime import datetime

    since = "2026-11-28T10:00:00+00:00"
    start = datetime.fromisoformat(since).timestamp()
    memo: dict[str, Any] = {}
    _looks(_ready({"gpu": "L4", "gpuMemoryUtilization": 0.9}, since), memo, start, 3600)  # an hour
    later = start + 3600
    assert _looks(_ready({"gpu": "L4", "gpuMemoryUtilization": 0.95}, since), memo, later, 20)[:1] == [0]
    again = "2026-11-28T11:30:00+00:00"
    ready_again = _ready({"gpu": "L4", "gpuMemoryUtilization": 0.95}, again)
    assert _looks(ready_again, memo, datetime.fromisoformat(again).timestamp(), 40) == [0, 10, 30]


def test_the_pod_watch_names_the_pod_to_read_without_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a storm every model Ready again is looked at: the pod watch's Ready pods name the pod (and its
    # engine's container), so the look is one log read, not a LIST of the namespace's pods first.
    cluster = FakeCluster(monkeypatch, LOG)
    reads: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        _observe, "_read_log", lambda ns, pod, container: reads.append((ns, pod, container)) or LOG
    )

    def no_list(namespace: str, name: str) -> None:
        raise AssertionError("listed the pods although the pod watch shows a Ready one")

    monkeypatch.setattr(_observe, "_running_pod", no_list)
    ready = ReadyPods()
    for name in ("llama-b", "llama-a"):
        ready.note(
            {
                "metadata": {
                    "name": name,
                    "namespace": "team-b",
                    "labels": {INSTANCE_LABEL: "llama"},
                    "ownerReferences": [{"kind": "ReplicaSet", "name": "llama-1", "uid": "rs-1"}],
                },
                "spec": {"containers": [{"name": "engine"}, {"name": "sidecar"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
    plan = _plan_of(SPEC)
    patch = kopf.Patch()
    body = _body(SPEC, plan.summary().model_dump(by_alias=True, mode="json"))
    settings = OperatorSettings(lease_namespace="loadline")
    _observe.observe(body, patch, settings, _observe.Observations(), _logger(), ready)
    assert reads == [("team-b", "llama-a", "engine")]
    assert patch.status["observed"]["pod"] == "llama-a"
    # No Ready pod in the watch's view (a LeaderWorkerSet's pods have no ReplicaSet): the pods are listed.
    monkeypatch.setattr(
        _observe,
        "_running_pod",
        lambda ns, name: {"metadata": {"name": "llama-x"}, "spec": {"containers": [{"name": "vllm"}]}},
    )
    patch = kopf.Patch()
    _observe.observe(body, patch, settings, _observe.Observations(), _logger(), ReadyPods())
    assert reads[-1] == ("team-b", "llama-x", "vllm") and cluster.configmap is not None


@pytest.mark.parametrize(("concurrency", "below"), [(8, False), (64, True)])
def test_the_observed_status_is_decided_without_the_cluster(concurrency: int, below: bool) -> None:
    """The pure builder the handler writes from: vLLM's room (29.82 sequences in this log) against
    spec.concurrency decides the KVCapacity condition and whether the model is planned again."""
    from loadline.observe import parse_startup_log
    from loadline.status.build import build_observed_status

    spec = {**SPEC, "concurrency": concurrency}
    plan = _plan_of(spec).to_dict()["plan"]
    body = _body(spec, plan)
    changes, replan = build_observed_status(
        body, typed_status(body["status"]), parse_startup_log(LOG), pod="llama-abc", source="log",
        now="2026-11-29T00:00:00Z",
    )  # fmt: skip
    assert replan is below
    assert changes["observed"]["pod"] == "llama-abc" and changes["observed"]["maxConcurrency"] == 29.82
    [condition] = [c for c in changes["conditions"] if c["type"] == "KVCapacity"]
    assert condition["status"] == ("False" if below else "True")
