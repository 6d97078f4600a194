"""Applying a model's children, skipping those this process applied exactly so for this generation
(:class:`loadline.state.AppliedChildren`), and removing those of a layout no longer planned."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from loadline.handlers import _kube
from loadline.render import child_kinds
from loadline.state import INSTANCE_LABEL
from loadline.status import build as _build

if TYPE_CHECKING:
    from loadline.handlers._state import OperatorState

WORKLOAD_KINDS = frozenset({"Deployment", "LeaderWorkerSet"})


def fingerprint(child: Mapping[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(child, sort_keys=True).encode(), digest_size=16).hexdigest()


def workload(manifests: list[dict[str, Any]]) -> dict[str, Any] | None:
    for manifest in manifests:
        if manifest.get("kind") in WORKLOAD_KINDS:
            return manifest
    return None


@dataclass
class Applied:
    """What :func:`apply_children` did, also when the API server refused a child part way (then
    ``error`` holds the refusal and the children before it are in the lists)."""

    changed: list[str] = field(default_factory=list)
    workload: dict[str, Any] | None = None
    error: ApiException | None = None


def apply_children(
    state: OperatorState, body: Mapping[str, Any], manifests: list[dict[str, Any]], field_manager: str
) -> Applied:
    """Apply every child of the model (its owner reference set), the workload always (its answer is the
    model's readiness) and the others only when this process has not applied them so for this
    generation already."""
    meta = body["metadata"]
    owner = _build.build_owner_reference(body)
    applied = Applied()
    try:
        for manifest in manifests:
            child = _build.with_owner(manifest, owner, meta["namespace"])
            is_workload = child["kind"] in WORKLOAD_KINDS
            fp = fingerprint(child)
            if not is_workload and state.applied.already(meta, child, fp):
                continue
            result, changed = _kube.apply(child, field_manager, state.versions)
            state.applied.note(meta, child, fp)
            if changed:
                applied.changed.append(f"{child['kind']}/{child['metadata']['name']}")
            if is_workload:
                applied.workload = result
    except ApiException as exc:
        applied.error = exc
    return applied


def remove_stale_children(
    state: OperatorState, namespace: str, name: str, uid: str, manifests: list[dict[str, Any]]
) -> list[str]:
    """Delete the children of a layout no longer planned (found by label, kept only when this model is
    their controller), so a Deployment ↔ LeaderWorkerSet move never leaves pods holding GPUs."""
    wanted = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    existing = []
    for api_version, kind in child_kinds():
        if kind == "LeaderWorkerSet" and not _kube.has_kind(api_version, kind):
            continue
        for item in _kube.list_objects(
            api_version, kind, namespace, label_selector=f"{INSTANCE_LABEL}={name}"
        ):
            existing.append({**item, "apiVersion": api_version, "kind": kind})
    removed = []
    for api_version, kind, child in _build.stale_children(existing, wanted, uid):
        if _kube.delete(api_version, kind, namespace, child, state.versions):
            removed.append(f"{kind}/{child}")
    return removed
