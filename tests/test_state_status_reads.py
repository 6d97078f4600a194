"""A model version's typed status is read once for every timer that asks on each tick."""

from __future__ import annotations

from typing import Any

from loadline.state import StatusReads


def body(version: str | None, phase: str, uid: str | None = "u-1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "chat", "namespace": "team-a"}
    if uid is not None:
        meta["uid"] = uid
    if version is not None:
        meta["resourceVersion"] = version
    return {"metadata": meta, "status": {"phase": phase, "message": "m"}}


def test_one_version_is_read_once_and_a_new_version_again() -> None:
    reads = StatusReads()
    first = reads.read(body("10", "Deploying"))
    assert first.phase == "Deploying"
    assert reads.read(body("10", "Deploying")) is first  # the same version: not validated again
    later = reads.read(body("11", "Ready"))
    assert later.phase == "Ready" and later is not first


def test_two_models_at_the_same_version_number_are_apart() -> None:
    reads = StatusReads()
    assert reads.read(body("10", "Deploying", uid="a")).phase == "Deploying"
    assert reads.read(body("10", "Ready", uid="b")).phase == "Ready"


def test_a_body_without_a_version_is_read_every_time() -> None:
    # A body built by the operator itself (no resourceVersion) names no version to keep.
    reads = StatusReads()
    one, two = reads.read(body(None, "Deploying")), reads.read(body(None, "Ready"))
    assert (one.phase, two.phase) == ("Deploying", "Ready")


def test_the_oldest_versions_make_room() -> None:
    reads = StatusReads(max_entries=2)
    first = reads.read(body("1", "Deploying"))
    reads.read(body("2", "Deploying"))
    reads.read(body("3", "Deploying"))
    assert reads.read(body("1", "Deploying")) is not first
