"""FleetPolicy ``maxConcurrent`` restart slots shared between shards: a claims table on a Lease.

One elected process takes slots under a lock of its own (:mod:`loadline.handlers._maintenance`).
Sharded replicas decide at the same time, each counting the other shards' restarts from a LIST that is
seconds old, so two of them whose restarts come due together could both take a policy's last slot.
Between shards a start is decided on, and claimed in, one table: the annotation
:data:`SLOTS_ANNOTATION` of the Lease ``<lease name>-restart-slots`` in the operator's namespace
(:func:`loadline.maintenance.standing_claims` says which claims count). The write is guarded by the
resourceVersion the decision read, so of two replicas deciding at once exactly one write lands; the
other gets 409 Conflict, reads the table again and decides again with the winner's claim in it.

A Lease and not a ConfigMap: the chart already grants the Leases of its own names, and a Lease is
what the cluster's tools show as a lock. No new permission beyond its name in the chart's Role.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from datetime import datetime

import urllib3
from kubernetes.client import CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

from loadline.maintenance import (
    SLOT_CLAIM_GRACE,
    MaintenanceDecision,
    SlotClaim,
    claim_holders,
    format_slot_claims,
    parse_slot_claims,
    standing_claims,
)
from loadline.settings import OperatorSettings

__all__ = ["SLOTS_ANNOTATION", "give_back", "lease_name", "take"]

log = logging.getLogger("loadline.restarts")

SLOTS_ANNOTATION = "loadline.dev/restart-slots"
"""On the slots Lease: the claims table (``namespace/name`` → policies and when it was claimed)."""

CONFLICT_RETRIES = 3
"""Reads and decisions again after a 409; more means other replicas keep winning: the next tick tries."""


def lease_name(settings: OperatorSettings) -> str:
    """The slots Lease's name, beside the election's and the shards' Leases."""
    return f"{settings.lease_name}-restart-slots"


def _read(api: CoordinationV1Api, namespace: str, name: str) -> V1Lease | None:
    try:
        lease: V1Lease = api.read_namespaced_lease(name, namespace, _request_timeout=10)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return lease


def _claims(lease: V1Lease | None) -> dict[str, SlotClaim]:
    if lease is None or lease.metadata is None:
        return {}
    return parse_slot_claims((lease.metadata.annotations or {}).get(SLOTS_ANNOTATION))


def _write(
    api: CoordinationV1Api, namespace: str, name: str, lease: V1Lease | None, claims: Mapping[str, SlotClaim]
) -> None:
    """The table as ``claims``: created when there was no Lease, else replaced at the resourceVersion
    read (409 when anyone wrote it since, or created it meanwhile)."""
    text = format_slot_claims(claims)
    if lease is None:
        body = V1Lease(
            metadata=V1ObjectMeta(name=name, namespace=namespace, annotations={SLOTS_ANNOTATION: text}),
            spec=V1LeaseSpec(lease_duration_seconds=int(SLOT_CLAIM_GRACE.total_seconds())),
        )
        api.create_namespaced_lease(namespace, body, _request_timeout=10)
        return
    meta = lease.metadata if lease.metadata is not None else V1ObjectMeta(name=name, namespace=namespace)
    meta.annotations = {**(meta.annotations or {}), SLOTS_ANNOTATION: text}
    lease.metadata = meta
    api.replace_namespaced_lease(name, namespace, lease, _request_timeout=10)


def take(
    model: str,
    policies: Collection[str],
    decide: Callable[[Mapping[str, frozenset[str]]], MaintenanceDecision],
    restarting: Collection[str],
    now: datetime,
    settings: OperatorSettings,
    api: CoordinationV1Api,
) -> MaintenanceDecision | None:
    """Decide on ``model``'s due restart with every standing claim of another model counted as a
    holder of its policies' slots (``decide`` gets policy → claiming models), and when the decision is
    to start, claim ``policies``' slots in the table that decision was made on.

    ``restarting``: the models whose status says Running, over every shard. None: the table changed
    under this replica :data:`CONFLICT_RETRIES` times in a row; nothing is started, the next tick
    decides again."""
    namespace, name = settings.resolved_lease_namespace(), lease_name(settings)
    for _ in range(CONFLICT_RETRIES):
        lease = _read(api, namespace, name)
        claims = standing_claims(_claims(lease), restarting, now)
        decision = decide(claim_holders({other: c for other, c in claims.items() if other != model}))
        if decision.kind != "act":
            return decision
        try:
            _write(api, namespace, name, lease, {**claims, model: SlotClaim(tuple(sorted(policies)), now)})
        except ApiException as exc:
            if exc.status == 409:
                continue
            raise
        return decision
    log.info("restart of %s: the slot table kept changing under this replica; deciding next tick", model)
    return None


def give_back(
    model: str,
    restarting: Collection[str],
    now: datetime,
    settings: OperatorSettings,
    api: CoordinationV1Api,
) -> None:
    """Drop ``model``'s claim (its restart is over), and the claims that stand no more with it.

    Best effort: a claim left behind frees its slots by itself once :data:`SLOT_CLAIM_GRACE` has
    passed and its model is no longer Running, so a failure here must not hold up the restart's end."""
    try:
        namespace, name = settings.resolved_lease_namespace(), lease_name(settings)
        for _ in range(CONFLICT_RETRIES):
            lease = _read(api, namespace, name)
            claims = _claims(lease)
            if model not in claims:
                return
            others = {other: c for other, c in claims.items() if other != model}
            try:
                _write(api, namespace, name, lease, standing_claims(others, restarting, now))
            except ApiException as exc:
                if exc.status == 409:
                    continue
                raise
            return
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        log.warning("restart of %s: its slot claim stays until it expires (%s)", model, exc)
