"""The stamp a workload carries: which loadline version rendered it, and a fingerprint of its pods.

Both are annotations on the workload's own metadata, never on its pod template: writing or updating
the stamp changes no pod template, so it rolls no pod. The fingerprint covers the pod templates only
(what the workload controller rolls pods for), so two renders with the same fingerprint run the
same pods, whatever else (replicas, the workload's labels) differs.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANNOTATION_APPROVE",
    "ANNOTATION_RENDERED_BY",
    "ANNOTATION_RENDER_FINGERPRINT",
    "Stamp",
    "pod_templates",
    "read_stamp",
    "render_fingerprint",
    "stamped",
]

ANNOTATION_RENDERED_BY = "loadline.dev/rendered-by"
"""On a workload: the loadline version that rendered it."""
ANNOTATION_RENDER_FINGERPRINT = "loadline.dev/render-fingerprint"
"""On a workload: :func:`render_fingerprint` of what that version rendered."""
ANNOTATION_APPROVE = "upgrade.loadline.dev/approve"
"""On an InferenceModel: the fingerprint of a waiting render someone approved to roll now. Outside the
operator's ``loadline.dev/`` prefix on purpose: kopf leaves annotations of its own storage prefix out
of the diff that starts a reconcile, and setting this one must start one."""

#: Where each workload kind keeps the pod templates its controller rolls pods for.
_TEMPLATE_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "template"),),
    "LeaderWorkerSet": (
        ("spec", "leaderWorkerTemplate", "leaderTemplate"),
        ("spec", "leaderWorkerTemplate", "workerTemplate"),
    ),
}


@dataclass(frozen=True)
class Stamp:
    """A workload's stamp; both None on a workload rendered before loadline stamped them."""

    version: str | None
    fingerprint: str | None


def pod_templates(workload: Mapping[str, Any]) -> dict[str, Any]:
    """``{path: pod template}`` of a Deployment or LeaderWorkerSet (a missing one is left out)."""
    out: dict[str, Any] = {}
    for path in _TEMPLATE_PATHS.get(str(workload.get("kind")), ()):
        node: Any = workload
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if node is not None:
            out[".".join(path)] = node
    return out


def render_fingerprint(workload: Mapping[str, Any]) -> str:
    """A short hash of the rendered pod templates (16 hex characters: short enough to type into
    ``kubectl annotate``, long enough that two renders never share one by chance)."""
    text = json.dumps(pod_templates(workload), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def stamped(workload: Mapping[str, Any], version: str) -> dict[str, Any]:
    """A copy of the rendered ``workload`` with its stamp (``version`` and the fingerprint)."""
    out = copy.deepcopy(dict(workload))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        ANNOTATION_RENDERED_BY: version,
        ANNOTATION_RENDER_FINGERPRINT: render_fingerprint(workload),
    }
    return out


def read_stamp(workload: Mapping[str, Any] | None) -> Stamp:
    """The stamp of a workload as read from the API (None fields when it has none)."""
    annotations = ((workload or {}).get("metadata") or {}).get("annotations") or {}
    return Stamp(annotations.get(ANNOTATION_RENDERED_BY), annotations.get(ANNOTATION_RENDER_FINGERPRINT))
