"""This replica's shards of the InferenceModels: which it owns (read by the handlers' filters and the
watch's ``shardSelector``), the API server check, and the keeper that claims and renews shard Leases.

Ownership is checked twice: the API server sends only the owned models (``shardSelector``, set in
``_registry.configure`` from the run's :class:`loadline.sharding.ShardAssignment`), and every handler of
a model, its children's events and its pods' events asks the assignment too (``state.shards``), so that
no model is handled by two replicas even if a watch were unfiltered. With one shard (the default) every
model is owned and nothing here runs.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from loadline import sharding
from loadline.api import GROUP, KIND, PLURAL, VERSION
from loadline.election import LeaseDecision, format_micro_time, parse_micro_time
from loadline.errors import SpecError
from loadline.handlers import _kube
from loadline.handlers._election import LeaderElector, coordination_api
from loadline.handlers._lease_watch import LeaseWatch
from loadline.settings import OperatorSettings

log = logging.getLogger("loadline.shards")


def owner_uid(body: Mapping[str, Any]) -> str | None:
    """The uid of the InferenceModel that owns a child (a Deployment, a LeaderWorkerSet)."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND:
            return str(ref.get("uid") or "") or None
    return None


#: A selector every API server that shards must refuse (its range is empty): an error when the feature
#: gate is on, ignored (200 OK) when it is off.
INVALID_PROBE = "shardRange(object.metadata.uid, '0x0000000000000001', '0x0000000000000000')"


def check_server(settings: OperatorSettings, shards: int) -> None:
    """Refuse to shard when the API server would ignore the selector: without the feature gate it
    answers every watch with every model, and each replica would filter on its own (correct, but
    without the memory and traffic sharding is for). Custom resources' lists do not echo
    ``metadata.shardInfo`` (UnstructuredList), so the check is behavioural: a server that shards
    refuses an empty range and accepts this replica's selector of shard 0."""
    namespaces = settings.namespace_list
    path = (
        f"/apis/{GROUP}/{VERSION}/namespaces/{namespaces[0]}/{PLURAL}"
        if namespaces
        else f"/apis/{GROUP}/{VERSION}/{PLURAL}"
    )
    fix = (
        "start kube-apiserver with --feature-gates=ShardedListAndWatch=true (Kubernetes 1.36+), or set "
        "shards to 1 (the chart's sharding.shards)"
    )

    def probe(selector: str) -> int:
        try:
            _kube.dynamic().request("GET", path, query_params=[("limit", 1), ("shardSelector", selector)])
        except ApiException as exc:
            return int(exc.status or 0)
        return 200

    # Any refusal means the server parsed the selector (1.36.3 answers 500 Internal Server Error
    # "invalid shard selector", where 400 would be right); a server without the gate lists (200).
    if probe(INVALID_PROBE) == 200:
        raise SpecError("LOADLINE_SHARDS", f"{shards} shards, but the API server ignores shardSelector", fix)
    accepted = probe(sharding.selector([0], shards))
    if accepted != 200:
        raise SpecError(
            "LOADLINE_SHARDS", f"the API server refused this replica's shardSelector: {accepted}", fix
        )


class ShardKeeper:
    """Claims shard Leases (its fair share at once, any shard left free for a Lease duration), renews
    them, and says when what it holds grew (``on_grew``) or a held one was lost (``on_lost``).

    Rebalancing (:mod:`loadline.sharding`'s ``plan_request`` / ``plan_hand_over``): short of its share
    with no shard free, it asks a replica over its share for one (an annotation on that Lease); holding
    more than its share, it says which asked-for shards to hand over (``on_surplus``); the caller stops
    reconciling them and calls :meth:`hand_over`.

    The shards it does not hold it sees through a watch of the split's Leases (:class:`LeaseWatch`,
    started by :meth:`start`), reading one only while that watch is not current; ``lease_watch``
    gives one (the tests feed theirs)."""

    def __init__(
        self,
        settings: OperatorSettings,
        *,
        on_grew: Callable[[frozenset[int]], None],
        on_lost: Callable[[str], None],
        on_surplus: Callable[[frozenset[int]], None] = lambda _indices: None,
        api: Any = None,
        clock: Callable[[], datetime] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        lease_watch: LeaseWatch | None = None,
    ) -> None:
        self.shards = settings.shards
        self.replicas = settings.replicas
        self.grace_seconds = float(settings.lease_duration_seconds)
        self.retry_period_seconds = float(settings.retry_period_seconds)
        namespace = settings.resolved_lease_namespace()
        identity = settings.resolved_identity()
        api = api if api is not None else coordination_api()
        timing: dict[str, Any] = {"monotonic": monotonic} | ({"clock": clock} if clock is not None else {})
        self._monotonic = monotonic
        self.electors = [
            LeaderElector(
                api,
                name=sharding.lease_name(settings.lease_name, index, self.shards),
                namespace=namespace,
                identity=identity,
                lease_duration_seconds=settings.lease_duration_seconds,
                renew_deadline_seconds=settings.renew_deadline_seconds,
                retry_period_seconds=settings.retry_period_seconds,
                labels={sharding.SHARD_LEASE_LABEL: str(self.shards)},
                **timing,
            )
            for index in range(self.shards)
        ]
        self._api = api
        self._namespace = namespace
        self._lease_watch = lease_watch
        self.identity = identity
        self.lease_base = settings.lease_name
        self._on_grew = on_grew
        self._on_lost = on_lost
        self._on_surplus = on_surplus
        self._clock = clock if clock is not None else (lambda: datetime.now(UTC))
        self._held: set[int] = set()
        self._held_lock = threading.Lock()  # the keeper's thread claims, the run loop hands over
        self._handing_over: frozenset[int] = frozenset()
        self._free_since: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shard-keeper", daemon=True)
        self._lost_once = threading.Lock()
        self._lost = False

    @property
    def held(self) -> frozenset[int]:
        with self._held_lock:
            return frozenset(self._held)

    def start(self) -> None:
        # One line per process naming its identity, as for the single Lease (e2e/chart.py reads it).
        log.info("candidate: for lease %s-shard-*-of-%d as %s", self.lease_base, self.shards, self.identity)
        if self._lease_watch is None:
            self._lease_watch = LeaseWatch(
                self._api,
                self._namespace,
                sharding.lease_selector(self.shards),
                retry_seconds=self.retry_period_seconds,
            )
            self._lease_watch.start()
        self._thread.start()

    def round(self) -> bool:
        """One look at every shard not held: claim what :func:`loadline.sharding.plan_claims` says,
        else ask for one back (:func:`loadline.sharding.plan_request`); then, of the held shards, say
        which were asked for and are beyond the share (``on_surplus``). True when a shard was taken."""
        now = self._monotonic()
        holders: dict[int, str] | None = {}
        for index, elector in enumerate(self.electors):
            if index in self._held:
                continue
            decision = self._look(elector)
            if decision is not None and decision.acquires:
                self._free_since.setdefault(index, now)
            else:
                self._free_since.pop(index, None)
            if decision is None:
                holders = None  # no answer: do not ask for anything on a partial view
            elif holders is not None:
                holders[index] = "" if decision.acquires else decision.holder
        claims = sharding.plan_claims(
            self.shards, self._held, self._free_since, now,
            replicas=self.replicas, grace_seconds=self.grace_seconds,
        )  # fmt: skip
        grew = False
        for claim in claims:
            elector = self.electors[claim.index]
            if elector.try_acquire():
                log.info("shard %d of %d claimed: %s", claim.index, self.shards, claim.why)
                with self._held_lock:
                    self._held.add(claim.index)
                self._free_since.pop(claim.index, None)
                elector.start_renewing(functools.partial(self._lose, claim.index))
                grew = True
        if not grew and holders is not None:
            self._ask(holders)
        self._offer()
        return grew

    def _look(self, elector: LeaderElector) -> LeaseDecision | None:
        """What ``elector`` decides on its Lease: as the watch has it while current, else as read."""
        if self._lease_watch is not None:
            current, lease = self._lease_watch.seen(elector.name)
            if current:
                return elector.judge(lease)
        return elector.peek()

    def _ask(self, holders: dict[int, str]) -> None:
        """Short of the share with every shard held: ask the richest holder for one, once per half a
        Lease duration (the request counts for a whole one)."""
        index = sharding.plan_request(self.shards, self.held, holders, replicas=self.replicas)
        if index is None:
            return
        elector = self.electors[index]
        seen = elector.annotations
        asked = parse_micro_time(seen.get(sharding.WANTED_AT_ANNOTATION))
        ours = seen.get(sharding.WANTED_BY_ANNOTATION) == self.identity
        if ours and asked is not None and (self._clock() - asked).total_seconds() < self.grace_seconds / 2:
            return
        if elector.annotate(
            {
                sharding.WANTED_BY_ANNOTATION: self.identity,
                sharding.WANTED_AT_ANNOTATION: format_micro_time(self._clock()),
            }
        ):
            log.info(
                "shard %d of %d asked back from %s: this replica holds %d, fewer than its share",
                index, self.shards, holders[index], len(self.held),
            )  # fmt: skip

    def _offer(self) -> None:
        """Held shards another replica asked for, while this one is over its share: ``on_surplus``
        (once per hand-over)."""
        held = self.held
        if len(held) <= sharding.fair_share(self.shards, self.replicas) or self._handing_over:
            return
        now = self._clock()
        requests = {}
        for index in held:
            seen = self.electors[index].annotations
            requester = seen.get(sharding.WANTED_BY_ANNOTATION)
            asked = parse_micro_time(seen.get(sharding.WANTED_AT_ANNOTATION))
            if requester and asked is not None:
                requests[index] = sharding.ShardRequest(requester, (now - asked).total_seconds())
        surplus = sharding.plan_hand_over(
            self.shards, held, requests, replicas=self.replicas, identity=self.identity,
            lease_duration_seconds=self.grace_seconds,
        )  # fmt: skip
        if surplus:
            self._handing_over = frozenset(surplus)
            for index in surplus:
                log.info(
                    "shard %d of %d asked for by %s: handing it over (this replica holds %d, over its share)",
                    index, self.shards, requests[index].requester, len(held),
                )  # fmt: skip
            self._on_surplus(self._handing_over)

    def hand_over(self, indices: frozenset[int]) -> None:
        """Release these shards' Leases (the caller has stopped reconciling their models) so the
        replicas that asked claim them on their next round."""
        for index in sorted(indices):
            with self._held_lock:
                self._held.discard(index)
            self.electors[index].release()
        self._handing_over = frozenset()

    def _lose(self, index: int, reason: str) -> None:
        with self._lost_once:
            if self._lost:
                return
            self._lost = True
        self._on_lost(f"shard {index}: {reason}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.round():
                    self._on_grew(self.held)
            except Exception:  # a dead keeper would leave free shards unclaimed forever
                log.exception("shard keeper round failed")
            # Also when every shard is ours: a replica that comes back asks for its share on a Lease,
            # which the renewers read; the round sees it (no request when nothing is to be peeked).
            self._stop.wait(self.retry_period_seconds)

    def stop(self) -> None:
        self._stop.set()
        if self._lease_watch is not None:
            self._lease_watch.stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def release(self) -> None:
        """Stop claiming, and hand every held shard over (empty holder) so others take them at once."""
        self.stop()
        for index in sorted(self._held):
            self.electors[index].release()
        with self._held_lock:
            self._held.clear()

    def stop_renewing(self) -> None:
        self.stop()
        for elector in self.electors:
            elector.stop_renewing()
