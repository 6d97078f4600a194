"""What one crash costs the API server: the OOM handler decides on the model as the operator's index last
saw it (no GET), writes the decision once, and reads the model only when that entry was stale (409)."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from loadline.handlers import _index, _kube, _oom
from loadline.handlers._settings import OperatorSettings
from tests.conftest import inference_model
from tests.test_oom_operator_side import pod

LOG = __import__("logging").getLogger("test")


class Model:
    """The InferenceModel on a stand-in API server: every request is recorded, and a status patch
    carrying another resourceVersion than the stored one is refused with 409, as the API server does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        body = inference_model()
        body["metadata"] |= {"uid": "m-uid", "resourceVersion": "10", "generation": 1, "labels": {}}
        body["status"] = {"phase": "Ready"}
        self.body = body
        self.requests: list[str] = []
        monkeypatch.setattr(_kube, "get", self.get)
        monkeypatch.setattr(_kube, "patch_status", self.patch_status)
        monkeypatch.setattr(_kube, "annotate", lambda obj, annotations: self.requests.append("annotate"))
        monkeypatch.setattr(kopf, "event", lambda *a, **k: self.requests.append("event"))
        monkeypatch.setattr(_oom, "_read_previous_log", lambda *a, **k: self.requests.append("log") or "")
        monkeypatch.setattr(_oom, "SEEN", _oom.SeenCrashes(capacity=10))

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        self.requests.append("get")
        return copy.deepcopy(self.body)

    def patch_status(self, obj: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
        self.requests.append("patch status")
        if obj["metadata"]["resourceVersion"] != self.body["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        self.body["status"] = {**self.body["status"], **changes}
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.body)

    def model_requests(self) -> list[str]:
        """The requests about the model (the crashed container's log is read once, Events posted)."""
        return [r for r in self.requests if r not in {"event", "log"}]


def crashed_pod() -> dict[str, Any]:
    body = pod("OOMKilled", 137)
    body["metadata"] |= {"namespace": "team-a", "labels": {_index.INSTANCE_LABEL: "chat"}}
    body["spec"]["nodeName"] = "gpu-1"
    return body


def test_a_crash_is_decided_on_the_indexed_model_without_reading_it(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model(monkeypatch)
    known = _index.model_entry(model.body)
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert model.model_requests() == ["patch status", "annotate"]
    assert model.body["status"]["remediation"]["handledCrashes"]  # the decision is in status


def test_a_stale_indexed_model_is_read_again_and_the_crash_still_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = Model(monkeypatch)
    known = _index.model_entry(model.body)
    model.body["metadata"]["resourceVersion"] = "11"  # changed since the index saw it
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], known)  # type: ignore[arg-type]
    assert model.model_requests() == ["patch status", "get", "patch status", "annotate"]
    assert model.body["status"]["remediation"]["handledCrashes"]


def test_without_an_indexed_model_the_crash_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model(monkeypatch)
    _oom.on_pod_event(crashed_pod(), LOG, OperatorSettings(), [], None)  # type: ignore[arg-type]
    assert model.model_requests() == ["get", "patch status", "annotate"]
