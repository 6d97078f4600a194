"""The upgrade gate in reconcile: pods another loadline rendered keep running until their roll, which
comes in the model's window (or at once: urgent, approved, immediate), and the model says what waits."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pytest

from loadline import __version__
from loadline.handlers import _events, _kube, _reconcile, _upgrade
from loadline.handlers._state import OperatorState
from loadline.settings import OperatorSettings
from loadline.status.patch import merged
from loadline.upgrade import (
    ANNOTATION_APPROVE,
    ANNOTATION_RENDER_FINGERPRINT,
    ANNOTATION_RENDERED_BY,
    read_stamp,
)
from tests.conftest import typed_status
from tests.test_capacity import node
from tests.test_reconcile_requests import FakeKube, body

KEY = ("Deployment", "team-a", "chat")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, state: OperatorState) -> Cluster:
    kube = Cluster(state)
    for name in ("apply", "get", "list_objects", "has_kind"):
        monkeypatch.setattr(_kube, name, getattr(kube, name))
    monkeypatch.setattr(_events, "event", lambda *a, **k: None)
    monkeypatch.setattr(_upgrade, "_event", lambda *a, **k: None)
    return kube


class Cluster(FakeKube):
    """The fake API server, with the memory of the one operator process that reconciles against it."""

    def __init__(self, state: OperatorState) -> None:
        super().__init__()
        self.state = state


def run(fake: Cluster, model: dict[str, Any], **settings: Any) -> dict[str, Any]:
    patch = kopf.Patch()
    view = ([node("l4", "NVIDIA-L4", 4)], [])
    _reconcile.reconcile(
        fake.state, kopf.Body(model), patch, logging.getLogger("t"), OperatorSettings(**settings), view, []
    )
    return dict(patch.status)


def container(workload: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = workload["spec"]["template"]["spec"]["containers"][0]
    return c


def unstamp(workload: dict[str, Any]) -> None:
    """As a loadline from before the stamp applied it."""
    for key in (ANNOTATION_RENDERED_BY, ANNOTATION_RENDER_FINGERPRINT):
        del workload["metadata"]["annotations"][key]


@pytest.fixture
def older(fake: Cluster) -> dict[str, Any]:
    """A model running pods an earlier loadline rendered (no stamp, a shorter start-up probe and one
    more flag), its status as that loadline left it; the fake answers what it applied."""
    status = run(fake, body())
    workload = fake.objects[KEY]
    unstamp(workload)
    container(workload)["startupProbe"]["failureThreshold"] = 40
    container(workload)["args"].append("--enforce-eager")
    status.pop("render")
    fake.calls.clear()
    return body(status)


def applied(fake: Cluster) -> list[str]:
    return [kind for verb, kind in fake.calls if verb == "apply"]


def test_a_new_model_is_stamped(fake: Cluster) -> None:
    status = run(fake, body())
    assert read_stamp(fake.objects[KEY]).version == __version__
    assert merged({}, status)["render"] == {
        "renderedBy": __version__,
        "fingerprint": read_stamp(fake.objects[KEY]).fingerprint,
        "changes": [],
        "urgent": False,
        "decision": "",
    }


def test_an_upgrade_keeps_the_pods_and_schedules_the_roll(fake: Cluster, older: dict[str, Any]) -> None:
    status = run(fake, older)
    assert applied(fake) == []  # nothing of the model applied: its pods stay as they are
    assert container(fake.objects[KEY])["startupProbe"]["failureThreshold"] == 40
    render = merged(older["status"], status)["render"]
    assert "renderedBy" not in render  # before the stamp
    assert render["changes"] == [
        "flag --enforce-eager removed (was set): this version renders it so",
        "probe startupProbe failureThreshold 40 → 77: the start-up probe is sized from the checkpoint's "
        "download, not the in-GPU weights, so a slow download no longer gets the pod killed before vLLM serves",
    ]
    assert not render["urgent"]
    [condition] = [c for c in status["conditions"] if c["type"] == "RenderOutdated"]
    assert (
        condition["status"] == "True" and "rolls in the model's next restart window" in condition["message"]
    )
    assert status["maintenance"]["action"] == "remediation"
    assert status["maintenance"]["state"] == "Scheduled"


def test_the_roll_in_the_window_applies_and_clears_the_condition(
    fake: Cluster, older: dict[str, Any]
) -> None:
    waiting = run(fake, older)
    model = body(merged(older["status"], waiting))  # the status patch, as the API server merges it
    assert _upgrade.waiting(typed_status(model["status"]))
    model["status"]["maintenance"] = {
        **waiting["maintenance"],
        "state": "Running",
        "startedAt": "2026-01-01T00:00:00Z",
    }
    status = run(fake, model)
    assert "Deployment" in applied(fake)
    assert container(fake.objects[KEY])["startupProbe"]["failureThreshold"] == 77
    assert read_stamp(fake.objects[KEY]).version == __version__
    stored = merged(model["status"], status)
    assert stored["render"]["changes"] == [] and not _upgrade.waiting(typed_status(stored))
    assert "pendingFingerprint" not in stored["render"]
    [condition] = [c for c in status["conditions"] if c["type"] == "RenderOutdated"]
    assert condition["status"] == "False"


def test_manual_waits_for_the_approval_of_this_render(fake: Cluster, older: dict[str, Any]) -> None:
    waiting = run(fake, older, upgrade_roll="manual")
    assert applied(fake) == [] and "maintenance" not in waiting
    assert (
        "waiting for approval (kubectl annotate inferencemodel -n team-a chat"
        in waiting["render"]["decision"]
    )
    model = body(merged(older["status"], waiting))
    model["metadata"]["annotations"] = {ANNOTATION_APPROVE: "not-this-one"}
    run(fake, model, upgrade_roll="manual")
    assert applied(fake) == []
    model["metadata"]["annotations"] = {ANNOTATION_APPROVE: waiting["render"]["pendingFingerprint"]}
    run(fake, model, upgrade_roll="manual")
    assert "Deployment" in applied(fake)


def test_immediate_rolls_at_once(fake: Cluster, older: dict[str, Any]) -> None:
    run(fake, older, upgrade_roll="immediate")
    assert "Deployment" in applied(fake)
    assert container(fake.objects[KEY])["startupProbe"]["failureThreshold"] == 77


def test_an_urgent_fix_rolls_at_once_in_window_mode(fake: Cluster, older: dict[str, Any]) -> None:
    env = container(fake.objects[KEY])["env"]
    env[:] = [e for e in env if e["name"] != "PYTORCH_ALLOC_CONF"]
    run(fake, older)
    assert "Deployment" in applied(fake)
    assert "PYTORCH_ALLOC_CONF" in {e["name"] for e in container(fake.objects[KEY])["env"]}


def test_a_spec_change_rolls_with_this_versions_render(fake: Cluster, older: dict[str, Any]) -> None:
    older["metadata"]["generation"] = 2
    run(fake, older)
    assert "Deployment" in applied(fake)


def test_pods_an_earlier_loadline_rendered_the_same_are_stamped_without_a_roll(fake: Cluster) -> None:
    status = run(fake, body())
    workload = fake.objects[KEY]
    template = workload["spec"]["template"]
    unstamp(workload)
    status.pop("render")
    fake.calls.clear()
    status = run(fake, body(status))
    assert "Deployment" in applied(fake)
    assert fake.objects[KEY]["spec"]["template"] == template
    assert read_stamp(fake.objects[KEY]).version == __version__
    assert "RenderOutdated" not in {c["type"] for c in status.get("conditions", [])}


def test_the_maintenance_timer_rolls_a_waiting_render_when_its_restart_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window came for a render that waited: the timer's running remediation reconciles the model
    (which the gate then lets through); with nothing waiting it only asks whether the roll-out is done."""
    from datetime import UTC, datetime

    from loadline.handlers import _maintenance

    reconciled: list[Any] = []
    monkeypatch.setattr(_reconcile, "reconcile", lambda state, body, *a, **k: reconciled.append(body))
    monkeypatch.setattr(_maintenance, "_rollout_complete", lambda *a: False)
    started = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    running = {"action": "remediation", "state": "Running", "startedAt": started, "trigger": "policyWindow"}
    model = body(
        {"phase": "Ready", "plan": {"gpusPerReplica": 1, "nodesPerReplica": 1}, "maintenance": running}
    )
    model["status"]["render"] = {"pendingFingerprint": "0123456789abcdef", "changes": ["probe ..."]}
    fleet = _maintenance.FleetView({}, [], [], [], state=OperatorState())
    logger = logging.getLogger("t")
    _maintenance.tend(kopf.Body(model), kopf.Patch(), {}, OperatorSettings(), fleet, logger)
    assert len(reconciled) == 1
    model["status"]["render"] = {"renderedBy": __version__, "fingerprint": "0123456789abcdef"}
    _maintenance.tend(kopf.Body(model), kopf.Patch(), {}, OperatorSettings(), fleet, logger)
    assert len(reconciled) == 1
