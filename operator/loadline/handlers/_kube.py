"""The Kubernetes API as the handlers use it: server-side apply, reads of nodes, pods and ConfigMaps.

A thin wrapper over the official client's dynamic client, returning plain dicts. It is the only module
besides the kopf registrations that talks to the API server.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from loadline import telemetry
from loadline.state import AppliedVersions, applied_now
from loadline.status.patch import build_tested_status_patch

_lock = threading.Lock()
_client: DynamicClient | None = None


# Read-decide-write rounds on 409 Conflict before a handler gives up and lets kopf retry it.
CONFLICT_RETRIES = 10

#: HTTP connections kept per API server; at least one per handler thread, or threads beyond the
#: client's default (5 per CPU) queue for a connection and urllib3 logs "Connection pool is full".
_pool_size = 16


def set_pool_size(size: int) -> None:
    """Size the client's connection pool (before the first request: the operator's startup does)."""
    global _pool_size
    _pool_size = max(1, size)


def load_config() -> None:
    """Load in-cluster config, else KUBECONFIG, as the default of every client made afterwards (the
    dynamic client here, CoreV1Api for logs), with a pool of :func:`set_pool_size` connections."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = _pool_size
    client.Configuration.set_default(configuration)
    client.ApiClient.set_default(CountingApiClient())  # type: ignore[no-untyped-call]  # CoreV1Api() too


#: What a request may fail with besides the API's answer (by status): no answer (refused, reset, timed
#: out). Leases (_election, _lease_watch) and the startup's discovery read (_discovery) go on after it.
UNREACHABLE = (urllib3.exceptions.HTTPError, OSError)


def client_configuration() -> client.Configuration:
    """A new client configuration from the in-cluster config, else KUBECONFIG, for a client of its own
    (its own retries, its own pool), leaving the default that :func:`load_config` sets alone."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


def read_discovery(path: str) -> dict[str, Any] | None:
    """A discovery document (``/apis``, ``/apis/<group>/<version>``) as plain dicts, None on 404.

    Read with a client of its own: kopf's startup handlers call this before the operator's ``configure``
    has sized the shared client's pool (see :func:`set_pool_size`)."""
    with CountingApiClient(client_configuration()) as api:
        request = api.param_serialize("GET", path, auth_settings=["BearerToken"])
        response = api.call_api(*request, _request_timeout=10)
        response.read()
    if response.status == 404:
        return None
    if not 200 <= response.status < 300:
        raise ApiException(http_resp=response)
    document: dict[str, Any] = json.loads(response.data)
    return document


class CountingApiClient(client.ApiClient):
    """The official client, counting each request in ``loadline_api_requests_total`` (verb, resource,
    code): the operator's own share of its API traffic, which the API server cannot split from kopf's."""

    def call_api(  # type: ignore[no-untyped-def]
        self, method, url, header_params=None, body=None, post_params=None, _request_timeout=None
    ):
        try:
            response = super().call_api(method, url, header_params, body, post_params, _request_timeout)
        except ApiException as exc:
            telemetry.record_api_request(method, url, header_params, str(exc.status))
            raise
        except Exception:
            telemetry.record_api_request(method, url, header_params, "error")
            raise
        telemetry.record_api_request(method, url, header_params, str(response.status))
        return response


def dynamic() -> DynamicClient:
    """One discovery-backed client per process (in-cluster config, else KUBECONFIG)."""
    global _client
    with _lock:
        if _client is None:
            load_config()
            _client = DynamicClient(CountingApiClient())  # type: ignore[no-untyped-call]
        return _client


def _resource(api_version: str, kind: str) -> Any:
    return dynamic().resources.get(api_version=api_version, kind=kind)


def _plain(response: Any) -> dict[str, Any]:
    """The JSON body of a dynamic-client call made with ``serialize=False``, as plain dicts.

    The dynamic client's default wraps every answer in ResourceInstance/ResourceField objects, one per
    nested dict, and ``to_dict()`` walks them back: at fleet scale that was a fifth of the operator's
    CPU (py-spy, 300 models). The raw body parsed once gives the same dicts."""
    result: dict[str, Any] = json.loads(response.data)
    return result


def load_client_modules() -> None:
    """Load the client's ``CoreV1Api`` (pod logs, evictions) now, at start-up: its module takes about a
    second to load, under the import lock, and loaded at a burst's first log read it held every other
    handler thread waiting (py-spy, 100 models created: 6 % of the operator's samples). Only the
    process that runs the handlers calls this; the admission process never loads it."""
    importlib.import_module("kubernetes.client.api.core_v1_api")


def get(api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
    try:
        return _plain(_resource(api_version, kind).get(name=name, namespace=namespace, serialize=False))
    except NotFoundError:
        return None


def has_kind(api_version: str, kind: str) -> bool:
    """Whether the API server serves the kind (re-discovering once, for CRDs installed meanwhile)."""
    try:
        _resource(api_version, kind)
    except ResourceNotFoundError:
        dynamic().resources.invalidate_cache()
        try:
            _resource(api_version, kind)
        except ResourceNotFoundError:
            return False
    return True


def apply(
    manifest: Mapping[str, Any], field_manager: str, versions: AppliedVersions
) -> tuple[dict[str, Any], bool]:
    """Server-side apply one object; returns it and whether the API server changed anything
    (``versions``: what this process's applies returned before)."""
    meta = manifest["metadata"]
    resource = _resource(manifest["apiVersion"], manifest["kind"])
    response = resource.server_side_apply(
        body=dict(manifest),
        name=meta["name"],
        namespace=meta.get("namespace"),
        field_manager=field_manager,
        force_conflicts=True,
        serialize=False,
    )
    result = _plain(response)
    key = (manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"])
    version = result["metadata"].get("resourceVersion")
    before = versions.swap(key, version)
    if before == version:  # applied by this process before, and nobody wrote it since
        return result, False
    # Another version: this apply's, or another writer's since ours (a PodDisruptionBudget's status,
    # written by the disruption controller whenever its pods change): only the apply's own time says.
    return result, applied_now(result, field_manager, response.headers.get("Date"))


def list_objects(
    api_version: str, kind: str, namespace: str | None = None, **selectors: str
) -> list[dict[str, Any]]:
    answer = _plain(_resource(api_version, kind).get(namespace=namespace, serialize=False, **selectors))
    return list(answer.get("items") or [])


def delete(
    api_version: str, kind: str, namespace: str | None, name: str, versions: AppliedVersions | None = None
) -> bool:
    if versions is not None:
        versions.forget((api_version, kind, namespace, name))
    try:
        _resource(api_version, kind).delete(name=name, namespace=namespace)
    except (NotFoundError, ApiException) as exc:
        if isinstance(exc, NotFoundError) or getattr(exc, "status", None) == 404:
            return False
        raise
    return True


def patch_status(obj: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """Merge-patch the status subresource of ``obj`` (guarded by its resourceVersion)."""
    meta = obj["metadata"]
    resource = _resource(obj["apiVersion"], obj["kind"])
    body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": dict(changes)}
    result = resource.status.patch(
        body=body,
        name=meta["name"],
        namespace=meta.get("namespace"),
        content_type="application/merge-patch+json",
        serialize=False,
    )
    return _plain(result)


def set_status_members(
    api_version: str, kind: str, namespace: str | None, name: str, uid: str, members: Mapping[str, Any]
) -> dict[str, Any]:
    """Set top-level members of an object's status on condition that it is still the object ``uid``
    names (one JSON patch testing ``/metadata/uid``; 422 when it is not, or has no status yet). For a
    value decided on the event that carries it rather than on what the object held: no read first and
    no resourceVersion guard, so a write of another member meanwhile neither refuses it nor is undone."""
    ops = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        *({"op": "add", "path": f"/status/{key}", "value": value} for key, value in members.items()),
    ]
    result = _resource(api_version, kind).status.patch(
        body=ops,
        name=name,
        namespace=namespace,
        content_type="application/json-patch+json",
        serialize=False,
    )
    return _plain(result)


class Changed(Exception):
    """The object no longer holds what a write was decided on (:func:`patch_status_tested`): read it
    again and decide again."""


def patch_status_tested(
    obj: Mapping[str, Any],
    sets: Mapping[str, Any] | None,
    tested: tuple[str, ...],
    changes: Mapping[str, Any],
) -> dict[str, Any]:
    """Write ``sets`` (JSON pointers into ``status``) on condition that the values the decision read
    (``tested``) still hold what ``obj`` shows, else raise :class:`Changed`. When a tested value is not
    :func:`testable`, or there are no ``sets`` (the caller found nothing to test against),
    ``changes`` (the same write as a merge patch of ``status``) is written guarded by the
    resourceVersion instead, a 409 raising :class:`Changed` likewise.

    Optimistic concurrency per field, where :func:`patch_status`'s resourceVersion guard is per object:
    at fleet scale a model is written by several hands at once (a crash's decision, its children's
    readiness, kopf's reconcile, the maintenance timer), and a guard on the whole object refused most
    of the readiness writes (2.4 conflicts per crash at 100 crashes, each a refused PATCH and a GET)
    though none had read what another wrote."""
    ops = None if sets is None else build_tested_status_patch(obj, sets, tested)
    meta = obj["metadata"]
    try:
        if ops is None:
            return patch_status(obj, changes)
        result = _resource(obj["apiVersion"], obj["kind"]).status.patch(
            body=ops,
            name=meta["name"],
            namespace=meta.get("namespace"),
            content_type="application/json-patch+json",
            serialize=False,
        )
    except ApiException as exc:
        # 409: the resourceVersion moved (the fallback); 422: a "test" failed.
        if exc.status in (409, 422):
            raise Changed(f"{meta.get('namespace')}/{meta['name']} changed since it was read") from None
        raise
    return _plain(result)


def patch_spec(api_version: str, kind: str, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
    """Merge-patch fields of an object's spec (e.g. a workload's replicas during a surge restart)."""
    _resource(api_version, kind).patch(
        body={"spec": dict(spec)},
        name=name,
        namespace=namespace,
        content_type="application/merge-patch+json",
    )


def evict(namespace: str, name: str) -> bool:
    """Evict a pod through the Eviction API (honours PodDisruptionBudgets). False when the pod is gone
    or a budget refuses it now (HTTP 429): the caller tries again later."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
    dynamic()  # loads the configuration the typed client below uses
    try:
        client.CoreV1Api().create_namespaced_pod_eviction(name, namespace, body)
    except ApiException as exc:
        if exc.status in (404, 429):
            return False
        raise
    return True


def annotate(obj: Mapping[str, Any], annotations: Mapping[str, str]) -> dict[str, Any]:
    """Merge-patch annotations onto ``obj`` (no resourceVersion guard: annotations merge by key)."""
    meta = obj["metadata"]
    resource = _resource(obj["apiVersion"], obj["kind"])
    result = resource.patch(
        body={"metadata": {"annotations": dict(annotations)}},
        name=meta["name"],
        namespace=meta.get("namespace"),
        content_type="application/merge-patch+json",
        serialize=False,
    )
    return _plain(result)


def api_error_text(exc: ApiException) -> str:
    """``HTTP <status>: <the API server's message>`` from an API error (its Status body when it has one)."""
    detail = str(exc.reason or "")
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        detail = str(body["message"])
    return f"HTTP {exc.status}: {detail}"[:1000]
