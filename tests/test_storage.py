"""kopf's diff base in the model's status: one write per handled change, and no model re-reconciled
(or left unreconciled) by the move from the annotation that earlier versions wrote."""

from __future__ import annotations

import json
from typing import Any

import kopf

from loadline.api import InferenceModelStatus
from loadline.handlers._storage import FIELD, StatusDiffBase, StatusProgress

PREFIX = "loadline.dev"
KEY = "last-handled-configuration"


def _body(annotations: dict[str, str] | None = None, status: dict[str, Any] | None = None) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {
                "namespace": "ns",
                "name": "chat",
                "uid": "u1",
                "labels": {"team": "a"},
                "annotations": {"note": "x", **(annotations or {})},
            },
            "spec": {"model": "meta-llama/Llama-3.1-8B-Instruct", "concurrency": 4},
            "status": {"phase": "Ready", **(status or {})},
        }
    )


def test_the_diff_base_goes_with_the_status_and_nothing_else() -> None:
    storage = StatusDiffBase(PREFIX, KEY)
    body = _body()
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    assert set(patch) == {"status"}  # kopf writes it with the status: no patch of the object itself
    stored = json.loads(patch["status"]["lastHandledConfiguration"])
    assert stored["spec"] == body["spec"]
    assert stored["metadata"] == {"labels": {"team": "a"}, "annotations": {"note": "x"}}
    assert FIELD == "status.lastHandledConfiguration"
    # The CRD's status schema has the field, or the API server would prune it and every event would
    # look like a change.
    assert "lastHandledConfiguration" in InferenceModelStatus.model_json_schema(by_alias=True)["properties"]


def test_fetch_reads_the_status_and_a_spec_change_is_still_a_change() -> None:
    storage = StatusDiffBase(PREFIX, KEY)
    handled = _body()
    patch = kopf.Patch()
    storage.store(body=handled, patch=patch, essence=storage.build(body=handled))
    later = _body(status=dict(patch["status"]))
    assert storage.fetch(body=later) == storage.build(body=later)
    changed = _body(status=dict(patch["status"]))
    changed["spec"]["concurrency"] = 8
    assert storage.fetch(body=changed) != storage.build(body=changed)


def test_a_model_handled_by_an_earlier_version_is_not_handled_again_and_loses_the_annotation() -> None:
    """Earlier versions kept the diff base in an annotation beside kopf's marker (which made kopf leave
    every ``loadline.dev/`` annotation out of the essence). The same essence comes out now, so an
    upgrade re-runs no reconcile; the annotation goes with the first diff base written to status.
    (The marker stays: kopf's progress storage shares the prefix.)"""
    legacy = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key=KEY)
    before = _body()
    written = kopf.Patch()
    legacy.store(body=before, patch=written, essence=legacy.build(body=before))
    old = _body(annotations=dict(written["metadata"]["annotations"]))
    assert set(old["metadata"]["annotations"]) == {"note", f"{PREFIX}/{KEY}", f"{PREFIX}/kopf-managed"}

    storage = StatusDiffBase(PREFIX, KEY)
    assert storage.fetch(body=old) == storage.build(body=old)  # no change: no reconcile on upgrade

    patch = kopf.Patch()
    storage.store(body=old, patch=patch, essence=storage.build(body=old))
    assert patch["metadata"]["annotations"] == {f"{PREFIX}/{KEY}": None}
    assert "lastHandledConfiguration" in patch["status"]
    # And with the annotation gone and the diff base in status, still no change.
    migrated = _body(
        annotations={"loadline.dev/render-notes": "n", f"{PREFIX}/kopf-managed": "yes"},
        status=dict(patch["status"]),
    )
    assert storage.fetch(body=migrated) == storage.build(body=migrated)


def test_a_handler_that_succeeds_at_once_leaves_no_write_of_the_object_itself() -> None:
    """kopf records a handler's start and purges the record when it succeeds, in the same patch. The
    annotation storage left its marker annotation behind (a patch of the object on every creation);
    in status the record and the purge go with the status patch, and nothing else is left."""
    storage = StatusProgress(PREFIX)
    body = _body()
    patch = kopf.Patch()
    storage.store(
        key="reconcile", record={"started": "2026-11-27T05:00:00", "retries": 0}, body=body, patch=patch
    )
    storage.purge(key="reconcile", body=body, patch=patch)
    assert "metadata" not in patch
    legacy_patch = kopf.Patch()
    legacy = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    legacy.store(
        key="reconcile",
        record={"started": "2026-11-27T05:00:00", "retries": 0},
        body=body,
        patch=legacy_patch,
    )
    legacy.purge(key="reconcile", body=body, patch=legacy_patch)
    assert legacy_patch["metadata"]["annotations"] == {f"{PREFIX}/kopf-managed": "yes"}  # what it cost before
    # A retry in progress is kept in status, where kopf reads it back.
    storage.store(
        key="reconcile", record={"started": "2026-11-27T05:00:00", "retries": 2}, body=body, patch=patch
    )
    assert storage.fetch(key="reconcile", body=_body(status=dict(patch["status"]))) == {
        "started": "2026-11-27T05:00:00",
        "retries": 2,
    }
    assert "kopf" in InferenceModelStatus.model_json_schema(by_alias=True)["properties"]


def test_a_retry_an_earlier_version_recorded_is_read_and_then_purged_from_its_annotation() -> None:
    legacy = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    body = _body()
    written = kopf.Patch()
    legacy.store(
        key="reconcile", record={"started": "2026-11-27T05:00:00", "retries": 3}, body=body, patch=written
    )
    old = _body(annotations=dict(written["metadata"]["annotations"]))
    storage = StatusProgress(PREFIX)
    assert storage.fetch(key="reconcile", body=old) == {"started": "2026-11-27T05:00:00", "retries": 3}
    patch = kopf.Patch()
    storage.purge(key="reconcile", body=old, patch=patch)
    assert patch["metadata"]["annotations"] == {f"{PREFIX}/reconcile": None}
    # Neither copy counts as a change of the model.
    essence = StatusDiffBase(PREFIX, KEY).build(body=old)
    assert storage.clear(essence=essence)["metadata"]["annotations"] == {"note": "x"}


def test_the_essence_is_kopfs_own_without_copying_what_it_drops() -> None:
    """Built from the fields the essence keeps only (status and managedFields are most of a model's
    bytes): the same essence as kopf's own storage makes, and a
    copy (a later change to the object does not reach it)."""
    body = _body(
        annotations={
            f"{PREFIX}/kopf-managed": "yes",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
        },
        status={"incidents": [{"count": 3}], "lastHandledConfiguration": "{}"},
    )
    body["metadata"]["managedFields"] = [{"manager": "kopf", "fieldsV1": {"f:status": {}}}]
    body["metadata"]["resourceVersion"] = "7"
    ours = StatusDiffBase(PREFIX, KEY).build(body=body)
    kopfs = kopf.StatusDiffBaseStorage(field=FIELD).build(body=body)
    assert ours == kopfs
    assert ours == {"spec": body["spec"], "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}}}
    body["spec"]["concurrency"] = 8
    body["metadata"]["labels"]["team"] = "b"
    assert ours["spec"]["concurrency"] == 4 and ours["metadata"]["labels"] == {"team": "a"}


def test_clearing_kopfs_progress_gives_what_kopfs_own_storages_give_without_copies() -> None:
    """kopf's clear deep-copies the essence, and the fallback to the earlier annotations did so again:
    the same result is made in place, on the essence kopf built for the one comparison."""
    body = _body(
        annotations={f"{PREFIX}/reconcile": '{"retries": 1}'},
        status={"kopf": {"progress": {"reconcile": {"retries": 1}}, "dummy": "x"}},
    )

    def essence() -> Any:
        built = kopf.StatusDiffBaseStorage(field=FIELD).build(body=body)
        built["status"] = {"kopf": {"progress": {"reconcile": {"retries": 1}}, "dummy": "x"}}
        return built

    kopfs = kopf.AnnotationsProgressStorage(prefix=PREFIX).clear(
        essence=kopf.StatusProgressStorage(name="kopf").clear(essence=essence())
    )
    given = essence()
    ours = StatusProgress(PREFIX).clear(essence=given)
    assert ours == kopfs
    assert ours is given  # no copy
    assert (
        "progress" not in ours["status"]["kopf"]
        and f"{PREFIX}/reconcile" not in ours["metadata"]["annotations"]
    )


def test_objects_of_other_kinds_have_no_essence_to_compare() -> None:
    """kopf builds and compares an essence for every watch event of every kind it watches; only a
    model's changes are handled (reconcile), so a pod's or a Deployment's spec is not copied."""
    storage = StatusDiffBase(PREFIX, KEY)
    pod = kopf.Body(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    )
    assert storage.build(body=pod) == {} and storage.fetch(body=pod) is None
    # A model is compared as before, and one whose body does not say its kind is taken as a model.
    model = _body()
    assert storage.build(body=model)["spec"] == model["spec"]
    unsaid = kopf.Body({k: v for k, v in _body().items() if k != "kind"})
    assert storage.build(body=unsaid)["spec"] == model["spec"]
