"""Names and kinds of the objects rendered for an InferenceModel, as pure functions of its name.

The operator needs them without rendering (no plan at hand): to read the workload whose readiness it
mirrors, and to find the children of a layout no longer in use after a re-plan. So they live here, in
one place, and :func:`loadline.render.render_manifests` names its objects through them too.

An InferenceModel ``N`` (a DNS-1035 label of at most 63 characters) is served by:

* single node: Deployment ``N``, Service ``N``, PodDisruptionBudget ``N``;
* several nodes: LeaderWorkerSet :func:`leaderworkerset_name` (``N-lws``), Service ``N``,
  PodDisruptionBudget ``N``.

The client Service keeps the model's name in both layouts, so a re-plan that moves the model between
them never changes the address clients use. The LeaderWorkerSet takes another name because its
controller creates a headless Service named after it (the pods' DNS subdomain, through which the Ray
workers find their leader): with the LeaderWorkerSet named ``N`` that Service would take our
client Service's name, and the controller only creates it if no Service of that name exists yet.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "DEPLOYMENT",
    "LEADERWORKERSET",
    "LWS_NAME_MAX",
    "LWS_SUFFIX",
    "PODDISRUPTIONBUDGET",
    "SERVICE",
    "child_kinds",
    "leaderworkerset_name",
    "pod_selector",
    "service_name",
    "workload_ref",
]

DEPLOYMENT = ("apps/v1", "Deployment")
LEADERWORKERSET = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
SERVICE = ("v1", "Service")
PODDISRUPTIONBUDGET = ("policy/v1", "PodDisruptionBudget")

LWS_SUFFIX = "-lws"

# What the LeaderWorkerSet controller (sigs.k8s.io/lws) derives from the LeaderWorkerSet's name L, and
# the limits each derived name must keep:
#   leader StatefulSet  L          pods L-<group>             (pod names are hostnames: <= 63)
#   worker StatefulSet  L-<group>  pods L-<group>-<worker>    (<= 63)
#   headless Service    L          (a Service name: a DNS-1035 label, <= 63)
# and every StatefulSet S labels its pods controller-revision-hash=S-<hash>, a label value (<= 63) with
# a hash of up to 10 characters (kubernetes/kubernetes#64023), so S itself may have at most 52. Its
# webhook bounds replicas to 1,000,000 (group index: up to 6 digits) and replicas x size to 2^31-1
# (worker index: up to 10 digits). Hence L <= 63 - len("-999999") - len("-<10-char hash>") = 45, which
# also keeps L-<group>-<worker> within 63 (45 + 7 + 11).
_GROUP_INDEX_DIGITS = 6
_WORKER_INDEX_DIGITS = 10
_REVISION_HASH_CHARS = 10
_LABEL_MAX = 63
LWS_NAME_MAX = min(
    _LABEL_MAX - (1 + _GROUP_INDEX_DIGITS) - (1 + _REVISION_HASH_CHARS),
    _LABEL_MAX - (1 + _GROUP_INDEX_DIGITS) - (1 + _WORKER_INDEX_DIGITS),
)
_HASH_CHARS = 8


def leaderworkerset_name(name: str) -> str:
    """The LeaderWorkerSet of model ``name``: ``<name>-lws``, at most :data:`LWS_NAME_MAX` characters.

    A longer model name is cut and a hash of the whole name is put before the suffix
    (``<prefix>-<8 hex>-lws``), so two long names that share a prefix still get two LeaderWorkerSets
    instead of fighting over one. The result is a DNS-1035 label whenever ``name`` is one.
    """
    plain = name + LWS_SUFFIX
    if len(plain) <= LWS_NAME_MAX:
        return plain
    digest = hashlib.sha256(name.encode()).hexdigest()[:_HASH_CHARS]
    keep = LWS_NAME_MAX - len(LWS_SUFFIX) - 1 - _HASH_CHARS
    return f"{name[:keep].rstrip('-')}-{digest}{LWS_SUFFIX}"


def service_name(name: str) -> str:
    """The client Service of model ``name`` (port 8000, ``http``): ``name`` itself, in every layout.

    Clients address the model by this name, so it must not depend on the plan: a re-plan that moves
    the model from one node to several (or back) keeps the Service and its DNS name.
    """
    return name


def workload_ref(name: str, multi_node: bool) -> tuple[str, str, str]:
    """``(apiVersion, kind, name)`` of the workload serving model ``name``: the Deployment ``name``
    for a single-node replica, the LeaderWorkerSet :func:`leaderworkerset_name` for a replica over
    several nodes.

    The operator reads this object's status for readiness without rendering the manifests (it has the
    plan's node count from status, not the whole plan); :func:`render_manifests` names the workload
    through this function, so the two cannot disagree.
    """
    if multi_node:
        return (*LEADERWORKERSET, leaderworkerset_name(name))
    return (*DEPLOYMENT, name)


def child_kinds() -> tuple[tuple[str, str], ...]:
    """Every ``(apiVersion, kind)`` the renderer can produce for a model, in any layout.

    After a re-plan changes the layout, the children of the old one are no longer in the rendered
    list, so the operator cannot learn their kinds from it: it lists these kinds (by the model's label)
    to find the children left behind and delete the ones it owns. The workload kinds come first.
    """
    return (DEPLOYMENT, LEADERWORKERSET, SERVICE, PODDISRUPTIONBUDGET)


def pod_selector(name: str) -> dict[str, str]:
    """The labels every pod of model ``name`` carries and its workload selects them by; also the model's
    ``status.selector`` (the scale subresource's), by which an HPA finds the pods it averages over."""
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}
