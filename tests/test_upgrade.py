"""loadline.upgrade: what a new render changes in the running pods, why, and when it may roll."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loadline import __version__
from loadline.upgrade import (
    ANNOTATION_RENDER_FINGERPRINT,
    ANNOTATION_RENDERED_BY,
    Difference,
    decide_roll,
    explain,
    read_stamp,
    render_changes,
    render_fingerprint,
    stamped,
    template_differences,
)
from tests.test_render import by_kind, make_obj, render


def workload(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return by_kind(render(make_obj(spec)))["Deployment"]


def as_stored(deployment: dict[str, Any]) -> dict[str, Any]:
    """The Deployment as the API server returns it: the defaults it fills in (kubernetes
    pkg/apis/core/v1/defaults.go, pkg/apis/apps/v1/defaults.go) and quantities in canonical form."""
    out = copy.deepcopy(deployment)
    out["spec"]["progressDeadlineSeconds"] = 600
    pod = out["spec"]["template"]["spec"]
    pod.update({"dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "default-scheduler"})
    for c in pod["containers"]:
        c["terminationMessagePath"] = "/dev/termination-log"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in c:
                c[probe]["successThreshold"] = 1
                c[probe]["httpGet"]["scheme"] = "HTTP"
        c["resources"]["requests"]["cpu"] = str(c["resources"]["requests"]["cpu"])
    return out


def names(differences: list[Difference]) -> set[tuple[str, str]]:
    return {(d.kind, d.name) for d in differences}


def test_the_same_render_as_stored_is_no_difference() -> None:
    rendered = workload()
    assert template_differences(as_stored(rendered), rendered) == []


def test_quantities_compare_as_quantities() -> None:
    rendered = workload()
    live = as_stored(rendered)
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3000m"
    assert template_differences(live, rendered) == []


def test_an_older_render_is_described_field_by_field() -> None:
    rendered = workload()
    live = as_stored(rendered)
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "PYTORCH_ALLOC_CONF"]
    container["env"].append({"name": "OLD_ONLY", "value": "1"})
    container["startupProbe"]["failureThreshold"] = 40
    index = container["args"].index("--max-model-len")
    container["args"][index + 1] = "4096"
    container["args"].append("--enforce-eager")
    container["image"] = "vllm/vllm-openai:v0.18.0"
    del live["spec"]["template"]["metadata"]["labels"]["loadline.dev/role"]
    found = {d.words for d in template_differences(live, rendered)}
    assert found == {
        "env PYTORCH_ALLOC_CONF added (expandable_segments:True)",
        "env OLD_ONLY removed (was 1)",
        "probe startupProbe failureThreshold 40 → "
        + str(rendered["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureThreshold"]),
        "flag --max-model-len 4096 → 8192",
        "flag --enforce-eager removed (was set)",
        "image vllm/vllm-openai:v0.18.0 → vllm/vllm-openai:v0.19.0",
        "label loadline.dev/role added (server)",
    }


def test_a_foreign_annotation_on_the_pods_is_not_a_difference() -> None:
    rendered = workload()
    live = as_stored(rendered)
    live["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = "2026-01-01"
    assert template_differences(live, rendered) == []


def test_workload_fields_outside_the_pods_are_not_differences() -> None:
    rendered = workload()
    live = as_stored(rendered)
    live["spec"]["replicas"] = 3
    live["metadata"]["labels"].pop("app.kubernetes.io/managed-by")
    assert template_differences(live, rendered) == []


def test_stamp_rolls_no_pod_and_fingerprints_the_pods_only() -> None:
    rendered = workload()
    stamp = stamped(rendered, "9.9.9")
    assert stamp["spec"]["template"] == rendered["spec"]["template"]
    assert read_stamp(stamp).version == "9.9.9"
    assert stamp["metadata"]["annotations"][ANNOTATION_RENDER_FINGERPRINT] == render_fingerprint(rendered)
    assert read_stamp(rendered).version is None
    more = copy.deepcopy(rendered)
    more["spec"]["replicas"] = 5
    assert render_fingerprint(more) == render_fingerprint(rendered)
    more["spec"]["template"]["spec"]["containers"][0]["image"] = "other"
    assert render_fingerprint(more) != render_fingerprint(rendered)
    assert ANNOTATION_RENDERED_BY not in (rendered["metadata"].get("annotations") or {})


def test_the_allocator_fix_is_urgent_and_says_why() -> None:
    difference = Difference("env", "PYTORCH_ALLOC_CONF", None, "expandable_segments:True")
    explained = explain([difference], None, __version__)
    assert explained.urgent
    assert explained.oom_classes == ("fragmentation",)
    assert "fixes fragmentation OOMs" in explained.lines[0]


def test_a_change_the_table_does_not_know_is_ordinary() -> None:
    explained = explain([Difference("flag", "--max-model-len", "4096", "8192")], None, __version__)
    assert not explained.urgent
    assert explained.lines == ("flag --max-model-len 4096 → 8192: this version renders it so",)


def test_rows_up_to_the_running_version_are_not_counted_again() -> None:
    difference = Difference("env", "PYTORCH_ALLOC_CONF", None, "expandable_segments:True")
    newest = max(row.since for row in render_changes())
    assert not explain([difference], str(newest), str(newest)).urgent
    assert explain([difference], None, str(newest)).urgent


def test_probe_rows_match_by_prefix() -> None:
    explained = explain([Difference("probe", "startupProbe failureThreshold", "40", "77")], None, __version__)
    assert "download" in explained.lines[0]
    assert not explained.urgent


BASE = {
    "differs": True,
    "same_version": False,
    "spec_changed": False,
    "restarting": False,
    "urgent": False,
    "approved": False,
    "mode": "window",
}


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({}, "schedule"),
        ({"differs": False}, "apply"),
        ({"same_version": True}, "apply"),
        ({"spec_changed": True}, "apply"),
        ({"restarting": True}, "apply"),
        ({"urgent": True}, "apply"),
        ({"approved": True, "mode": "manual"}, "apply"),
        ({"mode": "immediate"}, "apply"),
        ({"mode": "manual"}, "hold"),
        ({"mode": "manual", "urgent": True}, "apply"),
    ],
)
def test_when_a_difference_rolls(change: dict[str, Any], kind: str) -> None:
    assert decide_roll(**{**BASE, **change}).kind == kind  # type: ignore[arg-type]


def test_manual_names_how_to_approve() -> None:
    decision = decide_roll(**{**BASE, "mode": "manual"}, approve_hint="kubectl annotate ...")  # type: ignore[arg-type]
    assert "kubectl annotate" in decision.reason
