"""A FleetPolicy was created, changed or deleted: judge every InferenceModel again, then count.

Reconcile judges a model when the model changes; this covers the other direction (a policy added after
the models it governs exist). It only writes status (``PolicyCompliant``, ``policies``,
``violatedPolicies``) and never touches what runs. Policy changes are rare, so one LIST of the models
per change is the price; the counts on each FleetPolicy are refreshed too when reconcile changes what
a model keeps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes.client.exceptions import ApiException

from loadline.api import API_VERSION, KIND, FleetPolicy, InferenceModelStatus
from loadline.errors import LoadlineError
from loadline.handlers import _inputs, _kube, _maintenance, _policies, _reconcile
from loadline.hub import ConfigCache
from loadline.policy import policy_counts
from loadline.settings import OperatorSettings
from loadline.sharding import ShardAssignment

if TYPE_CHECKING:  # _state holds this module's CountRefresher
    from loadline.handlers._state import OperatorState
from loadline.state import RecentReads
from loadline.status import build as _build
from loadline.status import read_status, stored, with_changes

log = logging.getLogger("loadline.policies")


def list_models(settings: OperatorSettings) -> list[dict[str, Any]]:
    """Every InferenceModel the operator watches (one LIST, or one per watched namespace)."""
    namespaces: list[str | None] = list(settings.namespace_list) or [None]
    return [m for ns in namespaces for m in _kube.list_objects(API_VERSION, KIND, ns)]


def judge_models(
    policies: list[FleetPolicy], settings: OperatorSettings, hub: ConfigCache, shards: ShardAssignment
) -> list[dict[str, Any]]:
    """Write each model's compliance where it changed; returns the models with their new status.
    ``hub``: the process's cache of config.json files fetched from the hub; ``shards``: the models this
    process judges (the others are its peers')."""
    judged = []
    for model in list_models(settings):
        model = {**model, "apiVersion": API_VERSION, "kind": KIND}
        if not shards.owns_uid((model.get("metadata") or {}).get("uid")):
            judged.append(model)  # another replica's shard: it judges the model (counts read its status)
            continue
        previous = read_status(model)
        try:
            inputs = _inputs.model_inputs(model, settings, hub)
        except (LoadlineError, kopf.TemporaryError):
            judged.append(model)  # reconcile reports why it cannot be planned
            continue
        compliance = _policies.compliance_status(model, previous, inputs.obj.spec, policies, inputs.plan)
        changes = _build.status_changes(previous, compliance)
        if changes:
            try:
                _kube.patch_status(model, changes)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # Changed meanwhile: its reconcile (which judges it too) is on its way.
                judged.append(model)
                continue
            now = with_changes(previous, changes)
            _reconcile.report_compliance(model, previous, now)
            model = {**model, "status": stored(now)}
        judged.append(model)
    return judged


def count(
    policies: Iterable[FleetPolicy], bodies: Mapping[str, Mapping[str, Any]], models: list[dict[str, Any]]
) -> None:
    """Write each FleetPolicy's counts where they changed (its status subresource)."""
    for policy in policies:
        body = bodies.get(policy.name)
        if body is None:
            continue
        counts = policy_counts(policy, models)
        held = body.get("status") or {}  # a FleetPolicy's: its counts alone
        changes = {key: value for key, value in counts.items() if held.get(key) != value}
        if changes:
            try:
                _kube.patch_status({**body, "apiVersion": API_VERSION, "kind": "FleetPolicy"}, changes)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
                log.info("FleetPolicy %s changed meanwhile; its counts follow on the next pass", policy.name)


def on_policies_changed(
    bodies: Mapping[str, Mapping[str, Any]], settings: OperatorSettings, state: OperatorState
) -> None:
    policies = _policies.parse_policies(bodies.values())
    models = judge_models(policies, settings, state.hub, state.shards)
    count(policies, bodies, models)


def compliance_moved(previous: InferenceModelStatus, changes: Mapping[str, Any]) -> bool:
    """Whether a status change alters which policies govern the model or which it breaks."""
    held = stored(previous)
    return any(key in changes and changes[key] != held.get(key) for key in ("policies", "violatedPolicies"))


def refresh_counts(bodies: Mapping[str, Mapping[str, Any]], settings: OperatorSettings) -> None:
    """Count again from one LIST of the models, and write the counts that changed. Without a
    FleetPolicy there is nothing to count and no LIST: every new model's first status moves the counts
    (its ``policies`` appear), so each model created alone cost two LISTs of every model (at fleet
    scale, 1,000 models parsed on the operator's one interpreter, twice per model)."""
    if not bodies:
        return
    count(_policies.parse_policies(bodies.values()), bodies, list_models(settings))


def restarting_everywhere(
    settings: OperatorSettings, reads: RecentReads[str, dict[str, dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """The models whose restart runs, of every shard (sharded replicas see only their own models in
    their indexes, and FleetPolicy ``maxConcurrent`` slots are counted over the whole cluster): one
    LIST, reused for a few seconds (``reads``) by every timer of this process."""

    def read() -> dict[str, dict[str, Any]]:
        found = {}
        for model in list_models(settings):
            entry = _maintenance.restarting_entry(model)
            if entry is not None:
                meta = model["metadata"]
                found[f"{meta['namespace']}/{meta['name']}"] = entry
        return found

    return dict(reads.get("", read))


COUNT_DELAY_SECONDS = 2.0
"""How long the counts wait for more changes before one LIST (and again once after, see below)."""


class CountRefresher:
    """The FleetPolicies' counts, refreshed off the reconcile path and coalesced.

    Counting reads every InferenceModel (one LIST): done per reconcile, that made creating M models cost
    M LISTs of up to M models (43 % of the operator's CPU at 300 models, py-spy). Here a reconcile only
    marks the counts stale; one thread waits ``delay`` for more changes, counts once, and counts once
    more ``delay`` later. That second pass is what keeps the counts right: the first LIST may miss a
    status patch kopf had not applied yet, and with sharded replicas each counting after its own
    changes, the pass after a replica's last change reads everything written before it (a pass takes
    well under ``delay``), so the last write is never from an older LIST."""

    def __init__(
        self,
        refresh: Callable[[Mapping[str, Mapping[str, Any]], OperatorSettings], None] = refresh_counts,
        delay: float = COUNT_DELAY_SECONDS,
    ) -> None:
        self._refresh = refresh
        self.delay = delay
        self._lock = threading.Lock()
        self._stale = threading.Event()
        self._latest: tuple[Mapping[str, Mapping[str, Any]], OperatorSettings] | None = None
        self._thread: threading.Thread | None = None

    def request(self, bodies: Mapping[str, Mapping[str, Any]], settings: OperatorSettings) -> None:
        """Mark the counts stale (with the FleetPolicies as the index holds them now)."""
        with self._lock:
            self._latest = (dict(bodies), settings)
            self._stale.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="policy-counts", daemon=True)
                self._thread.start()

    def _pass(self) -> None:
        with self._lock:
            latest = self._latest
        if latest is None:
            return
        try:
            self._refresh(*latest)
        except Exception:  # the next change or pass counts again; a dead thread would count never
            log.exception("counting the FleetPolicies' models failed")

    def _loop(self) -> None:
        while True:
            if not self._stale.wait(timeout=60):
                with self._lock:  # idle: end, unless a request came just now
                    if not self._stale.is_set():
                        self._thread = None
                        return
                continue
            time.sleep(self.delay)  # more changes come in bursts: count them once
            self._stale.clear()
            self._pass()
            time.sleep(self.delay)
            if not self._stale.is_set():
                self._pass()
