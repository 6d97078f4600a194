"""Whether the API server's discovery lists loadline's resources yet: kopf must not start before it does.

kopf learns which resources exist from discovery (``/apis``, then ``/apis/<group>/<version>``) once, when
it starts, and again only when a CustomResourceDefinition changes later (the re-list after a broken watch
is ignored). An API server that has just started serves the CRDs' objects a moment before its discovery
lists them. A replica that starts in that moment (after a control-plane restart the leader loses its
Lease and the kubelet restarts it, its admission process with it) gets a view of the cluster without
loadline.dev, and keeps it: its webhooks answer every admission request 404 ("the server could not find
the requested resource"), which with ``failurePolicy: Fail`` refuses every ``kubectl apply`` of an
InferenceModel until the pod is restarted, and the leader watches no models. Seen once in CI, 30 e2e
tests failing after ``test_api_server_and_etcd_restart_under_the_operator``.

So each kopf registry has a startup handler (:mod:`loadline.handlers._registry`) that waits, retried by
kopf, until discovery lists every resource here; kopf starts its watches and its webhook server only
after its startup handlers are done. Until then the webhook port is closed (the Service sends nothing
there, as for a pod not ready) and nothing is reconciled.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from loadline.api import GROUP, PLURAL, POLICY_PLURAL, VERSION
from loadline.handlers import _kube

SERVED: tuple[str, ...] = (PLURAL, f"{PLURAL}/status", POLICY_PLURAL)
"""What both registries need listed: the models (watched, their status written), and the FleetPolicies
(indexed by both, so that admission and reconcile never decide without the policies)."""

GROUP_VERSION = f"{GROUP}/{VERSION}"
GROUP_LIST_PATH = "/apis"
RESOURCE_LIST_PATH = f"/apis/{GROUP_VERSION}"

RETRY_SECONDS = 2.0
"""How often the startup handler reads discovery again while it waits (two GETs each time)."""


def group_listed(group_list: Mapping[str, Any]) -> bool:
    """Whether ``/apis`` (an APIGroupList) lists our group at our version; kopf reads only the versions
    listed there."""
    for group in group_list.get("groups") or []:
        if group.get("name") == GROUP:
            return any(v.get("version") == VERSION for v in group.get("versions") or [])
    return False


def unserved(
    group_list: Mapping[str, Any],
    resource_list: Mapping[str, Any] | None,
    wanted: Collection[str] = SERVED,
) -> list[str]:
    """The names in ``wanted`` kopf would not find in discovery: all of them while ``/apis`` does not
    list the group version, else those its APIResourceList (None when it answered 404) lacks."""
    if not group_listed(group_list) or resource_list is None:
        return list(wanted)
    names = {r.get("name") for r in resource_list.get("resources") or []}
    return [name for name in wanted if name not in names]


def waiting_message(missing: Collection[str]) -> str:
    """The one line a startup that waits on discovery logs (kopf logs it with each retry)."""
    return (
        f"the API server does not list {GROUP_VERSION} {', '.join(missing)} in its discovery yet: "
        f"waiting (it does a moment after it starts; if this lasts, apply the chart's CRDs)"
    )


def check_served() -> None:
    """Return once discovery lists every resource of :data:`SERVED`; until then raise
    ``kopf.TemporaryError`` (a startup handler: kopf retries it after :data:`RETRY_SECONDS`)."""
    try:
        group_list = _kube.read_discovery(GROUP_LIST_PATH) or {}
        resource_list = _kube.read_discovery(RESOURCE_LIST_PATH) if group_listed(group_list) else None
    except ApiException as exc:
        raise kopf.TemporaryError(
            f"discovery cannot be read ({_kube.api_error_text(exc)}): waiting", delay=RETRY_SECONDS
        ) from None
    except _kube.UNREACHABLE as exc:
        raise kopf.TemporaryError(
            f"the API server is unreachable ({type(exc).__name__}): waiting", delay=RETRY_SECONDS
        ) from None
    missing = unserved(group_list, resource_list)
    if missing:
        raise kopf.TemporaryError(waiting_message(missing), delay=RETRY_SECONDS)
