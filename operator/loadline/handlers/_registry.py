"""Every kopf registration of loadline, in one place. Each handler is a thin call into the core.

Two registries: kopf's default one (reconcile, OOM handling, timers), run by the replica that holds
the Lease; and :data:`ADMISSION` (the webhooks and the FleetPolicy index they read), run by every
replica, so admission never waits for a hand-over (``loadline run`` starts both, see ``_cli_run``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from loadline import telemetry
from loadline.api import GROUP, KIND, PLURAL, POLICY_PLURAL, VERSION, InferenceModelStatus
from loadline.handlers import (
    _admission,
    _discovery,
    _fleet,
    _kube,
    _maintenance,
    _measure,
    _observe,
    _oom,
    _outcomes,
    _plan,
    _policies,
    _readiness,
    _reconcile,
    _scale,
    _shards,
    _storage,
    _toggles,
)
from loadline.handlers._state import OperatorState
from loadline.hub import ConfigCache
from loadline.lanes import Lanes
from loadline.pacing import Pacer, PacingLimits
from loadline.render import LABEL_MANAGED_BY, MANAGED_BY
from loadline.settings import OperatorSettings
from loadline.sharding import ShardAssignment
from loadline.state import INSTANCE_LABEL, WATCH_SELECTORS, model_entry, node_entry, pairs, pod_entry
from loadline.status import read_status

SETTINGS = OperatorSettings()
MANAGED = {LABEL_MANAGED_BY: MANAGED_BY}
ADMISSION = kopf.OperatorRegistry()
WEBHOOK_PATHS = {
    "mutate-inferencemodel": "defaults of the FleetPolicies that govern an InferenceModel",
    "validate-inferencemodel": "an InferenceModel against its FleetPolicies' limits",
    "validate-fleetpolicy": "a FleetPolicy the operator can apply",
}
"""Handler ids, which are also the webhook URL paths the chart's webhook configurations call."""


CONSISTENCY_TIMEOUT_SECONDS = 30.0
"""How long kopf waits for the watch event of its own patch before it treats an older event as current.

kopf's default is 5 s. Past it, kopf runs the change handlers on the object as it was before its own
patch: the diff against the last-handled configuration is the one it just handled, so reconcile runs
again (applies every child, patches status: measured at 100 crashes at once, one in three models
reconciled twice, 8.7 s apart, when the watch was that far behind). Waiting longer costs nothing when
the event comes (the wait ends on it); it delays a change made meanwhile only when the event never comes
(a watch that re-lists past it), by this long at most."""


def state_of(memo: kopf.Memo) -> OperatorState:
    """The operator's state, put in kopf's operator memo by :func:`configure` (kopf copies that memo
    into every object's)."""
    state: OperatorState = memo["state"]
    return state


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # One per kopf run: a new leadership term starts afresh. The run's shards come in kopf's memo
    # (loadline run builds them before it starts kopf).
    memo["state"] = state = OperatorState(
        shards=memo.get("shards") or ShardAssignment(),
        lanes=Lanes.sized(SETTINGS.max_workers),
        pacer=Pacer(PacingLimits(SETTINGS.rollouts_at_once, SETTINGS.rollouts_per_pool)),
    )
    _kube.load_client_modules()
    # Before any watch starts: kopf's index gate woke every waiting object at each new object.
    if not _toggles.install():
        logging.getLogger(__name__).info("kopf's ToggleSet is not the one expected; kept as it is")
    prefix = SETTINGS.prefix
    settings.persistence.finalizer = f"{prefix}/finalizer"
    # kopf's state of a model lives in its status, written with the status (loadline.handlers._storage).
    settings.persistence.progress_storage = _storage.StatusProgress(prefix)
    settings.persistence.diffbase_storage = _storage.StatusDiffBase(prefix, "last-handled-configuration")
    settings.persistence.consistency_timeout = CONSISTENCY_TIMEOUT_SECONDS
    settings.watching.server_timeout = SETTINGS.watch_server_timeout
    settings.watching.client_timeout = SETTINGS.watch_client_timeout
    select_watches(settings)
    if state.shards.sharded:  # only this replica's shards of the models (loadline.handlers._shards)
        settings.watching.shard_selectors[GROUP, VERSION, PLURAL] = state.shards.watch_selector()
    # No kopf peering: one replica runs kopf at a time, elected on a Lease (loadline.handlers._election).
    settings.peering.standalone = True
    settings.peering.mandatory = False
    # Only our explicit Events reach `kubectl describe`; kopf's own INFO chatter would be a write per
    # handler run, which an idle resync must not make.
    settings.posting.level = logging.WARNING
    settings.queueing.error_delays = [1, 2, 5, 10, 30, 60]
    # Handlers are synchronous (the Kubernetes client is); enough threads that 100 models crashing at
    # once are handled in parallel rather than queued behind each other.
    settings.execution.max_workers = SETTINGS.max_workers
    # A connection per thread that may call the API server (loadline run sizes it before any request;
    # this is for a kopf run started otherwise).
    _kube.set_pool_size(SETTINGS.api_connections)


@kopf.on.cleanup()
def stop_lanes(memo: kopf.Memo, **_: Any) -> None:
    """The run stops: its lanes finish what they took, so nothing of it writes once kopf returns (a
    standby, or the next run with other shards, may start then)."""
    state = state_of(memo)
    state.pacer.stop()
    state.lanes.shutdown(wait=True)


@kopf.on.startup(id="discovery", backoff=_discovery.RETRY_SECONDS)
def wait_for_discovery(**_: Any) -> None:
    """kopf watches what discovery lists when it starts: not before it lists loadline's resources."""
    _discovery.check_served()


def select_watches(settings: kopf.OperatorSettings) -> None:
    """Server-side selectors: the API server sends only what an index or handler keeps (GPU nodes,
    bound pods, our Deployments), not every node and pod of the cluster."""
    for (group, version, plural), (labels, fields) in WATCH_SELECTORS.items():
        if labels:
            settings.watching.label_selectors[group, version, plural] = labels
        if fields:
            settings.watching.field_selectors[group, version, plural] = fields


@kopf.index("", "v1", "nodes")
def gpu_nodes(body: kopf.Body, name: str, **_: Any) -> dict[str, Any]:
    """GPU nodes, trimmed to what capacity planning reads (kept in memory, no LIST per reconcile)."""
    return node_entry(body, name)


@kopf.index("", "v1", "pods")
def gpu_pods(body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Bound pods that hold GPUs, trimmed likewise."""
    return pod_entry(body)


def _owned(meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> bool:
    """This replica's model (always, unless sharded): checked here too, not only by the watch."""
    return state_of(memo).shards.owns_uid(meta.get("uid"))


@kopf.on.resume(GROUP, VERSION, PLURAL, when=_owned)
@kopf.on.create(GROUP, VERSION, PLURAL, when=_owned)
@kopf.on.update(GROUP, VERSION, PLURAL, when=_owned)
async def reconcile(
    body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, memo: kopf.Memo, **kwargs: Any
) -> None:
    # kopf passes every index by name: gpu_nodes, gpu_pods and fleet_policies below. The work (plan,
    # apply) runs on the MODELS lane: a new model never queues behind routine events and timers.
    indexes = kwargs["fleet_policies"], kwargs["gpu_nodes"], kwargs["gpu_pods"]
    state = state_of(memo)
    await state.lanes.models.run(_reconcile_model, state, body, patch, logger, *indexes)


def _reconcile_model(
    state: OperatorState,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: kopf.Logger,
    fleet_policies: kopf.Index[str, dict[str, Any]],
    gpu_nodes: kopf.Index[str, dict[str, Any]],
    gpu_pods: kopf.Index[str, dict[str, Any]],
) -> None:
    bodies = _policy_bodies(fleet_policies)
    policies = _policies.parse_policies(bodies.values())
    view = state.views.view(gpu_nodes, gpu_pods)
    _reconcile.reconcile(state, body, patch, logger, SETTINGS, view, policies)
    # A change in what the model keeps moves the counts on the FleetPolicies (no timer on them: a
    # timer would make kopf put a finalizer on every policy, and deleting one would wait on us).
    if _fleet.compliance_moved(read_status(body), patch.status):
        state.counts.request(bodies, SETTINGS)  # counted off this path, after the patch is written


@kopf.index(GROUP, VERSION, POLICY_PLURAL, registry=ADMISSION)
@kopf.index(GROUP, VERSION, POLICY_PLURAL)
def fleet_policies(body: kopf.Body, name: str, **_: Any) -> dict[str, Any]:
    """Every FleetPolicy (few, small): reconcile judges each model against those that govern it."""
    return {name: {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in body}}


def _policy_bodies(index: kopf.Index[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    bodies: dict[str, dict[str, Any]] = {}
    for name, body in pairs(index):  # read from handlers' threads too
        bodies.setdefault(name, body)
    return bodies


@kopf.on.event(GROUP, VERSION, POLICY_PLURAL)
def policy_event(body: kopf.Body, type: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """A FleetPolicy came, changed or went: judge every model again (status only, nothing rolls).
    Our own count writes (status) change no generation and are skipped."""
    status = body.get("status") or {}
    if type == "MODIFIED" and status.get("observedGeneration") == body["metadata"].get("generation"):
        return
    bodies = _policy_bodies(kwargs["fleet_policies"])
    if type == "DELETED":
        bodies.pop(body["metadata"]["name"], None)
    _fleet.on_policies_changed(bodies, SETTINGS, state_of(memo))


def _present(meta: kopf.Meta, indexes: dict[str, Any]) -> bool:
    """This replica's model, and still in the cluster: kopf drops a model from its indexes on the
    DELETED event before it re-matches the timers, while the event's body still reads as it last was
    (no finalizer, so no deletion timestamp). Every timer's filter asks this, so kopf stops a deleted
    model's timers instead of leaving them to tick on, orphaned, for the life of the process."""
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    return state_of(indexes["memo"]).shards.owns_uid(meta.get("uid")) and key in indexes["owned_models"]


def _status(body: kopf.Body, kwargs: Mapping[str, Any]) -> InferenceModelStatus:
    """The typed status of this version of the model, read once for every timer's filter and
    due-check that asks on each tick (:class:`loadline.state.StatusReads`)."""
    return state_of(kwargs["memo"]).status_reads.read(body)


def _deploying(body: kopf.Body, meta: kopf.Meta, **kwargs: Any) -> bool:
    return _status(body, kwargs).phase == "Deploying" and _present(meta, kwargs)


@kopf.timer(GROUP, VERSION, PLURAL, interval=5, initial_delay=2, when=_deploying)
async def readiness(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    # Fires every 5 s but reads the cluster on a back-off (5, 10, 20, 40 s, then each minute): the tick
    # is decided on the event loop, and only a due look takes a thread (the CHECKS lane).
    state = state_of(memo)
    if _readiness.readiness_due(state.status_reads.read(body), memo):
        await state.lanes.checks.run(
            _readiness.read_readiness, state, body, patch, memo, SETTINGS.capacity_aware
        )


def _measurable(body: kopf.Body, meta: kopf.Meta, **kwargs: Any) -> bool:
    return _measure.measuring(SETTINGS, _status(body, kwargs)) and _present(meta, kwargs)


@kopf.timer(
    GROUP, VERSION, PLURAL, interval=max(SETTINGS.measure_interval_seconds, 1),
    initial_delay=min(max(SETTINGS.measure_interval_seconds, 1), 10), when=_measurable,
)  # fmt: skip
def measured_gpu_memory(
    body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, memo: kopf.Memo, **_: Any
) -> None:
    # Off without LOADLINE_PROMETHEUS_URL or with LOADLINE_MEASURE_INTERVAL_SECONDS=0 (then `when` never
    # holds and kopf starts no timer); bounded by one Prometheus deadline, never blocks long.
    # Every LOADLINE_RISK_INTERVAL_SECONDS also the OOM-risk estimate (memo: per model, per process).
    _measure.measure(body, patch, SETTINGS, logger, memo)


def _observable(body: kopf.Body, meta: kopf.Meta, **kwargs: Any) -> bool:
    return _observe.observing(_status(body, kwargs)) and _present(meta, kwargs)


@kopf.on.startup(id="observations")
def load_observations(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """The fleet's learned corrections, for the plans this process makes (docs/observe.md)."""
    state_of(memo).observations.load(SETTINGS, logger)


def _judging(body: kopf.Body, meta: kopf.Meta, **kwargs: Any) -> bool:
    return _outcomes.judging(_status(body, kwargs), meta.get("generation")) and _present(meta, kwargs)


@kopf.timer(
    GROUP, VERSION, PLURAL, interval=_outcomes.interval_seconds(SETTINGS),
    initial_delay=_outcomes.interval_seconds(SETTINGS), when=_judging,
)  # fmt: skip
def remediation_outcomes(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    # Only models with fixes not judged yet; a fix that held for its horizon is judged worked here
    # (one that did not is judged at its crash, by the crash's decision).
    _outcomes.judge_trials(body, SETTINGS, logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=_observe.INTERVAL_SECONDS, initial_delay=2, when=_observable)
def observed_memory(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    # Runs only while the running plan is not observed yet (``when``): one bounded log read a look,
    # the looks on a back-off (a log that never says costs a read every ten minutes). In kopf's own
    # pool: in a storm the models Ready again read their logs all at once, and on the CHECKS lane those
    # reads kept its threads from the readiness looks (18 s waits).
    if _observe.look_due(body, memo):
        state = state_of(memo)
        _observe.observe(body, patch, SETTINGS, state.observations, logger, state.ready_pods)


@kopf.index(GROUP, VERSION, PLURAL)
def restarting(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[str, Any]:
    """Models whose restart runs: they hold their FleetPolicies' ``maxConcurrent`` restart slots.
    ``{}`` once it is over (kopf keeps the previous entry of an object whose function returns None)."""
    entry = _maintenance.restarting_entry(body)
    return {} if entry is None else {f"{namespace}/{name}": entry}


def _maintenance_pending(body: kopf.Body, meta: kopf.Meta, **kwargs: Any) -> bool:
    return _maintenance.pending(_status(body, kwargs)) and _present(meta, kwargs)


@kopf.timer(
    GROUP, VERSION, PLURAL, interval=SETTINGS.maintenance_interval_seconds,
    initial_delay=min(SETTINGS.maintenance_interval_seconds, 5), when=_maintenance_pending,
)  # fmt: skip
def maintenance(
    body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, memo: kopf.Memo, **kwargs: Any
) -> None:
    # A pending restart or remediation roll-out: when (window, policy slots, predicted OOM), then one
    # step per tick. Reads Prometheus once an hour per model (the learned window is kept in memo).
    state = state_of(memo)
    if _maintenance.remediation_rolling(state, body):
        return  # the workload's controller rolls it: nothing to gather or do this tick
    nodes, pods = state.views.view(kwargs["gpu_nodes"], kwargs["gpu_pods"])
    restarting_now = dict(pairs(kwargs["restarting"]))
    if state.shards.sharded:  # the slots are the cluster's: other shards' restarts hold them too
        restarting_now = {**_fleet.restarting_everywhere(SETTINGS, state.restarting), **restarting_now}
    policies = _policies.parse_policies(_policy_bodies(kwargs["fleet_policies"]).values())
    fleet = _maintenance.FleetView(
        restarting_now, nodes, pods, policies, shared_slots=state.shards.sharded, state=state
    )
    _maintenance.tend(body, patch, memo, SETTINGS, fleet, logger)


@kopf.index(GROUP, VERSION, PLURAL)
def owned_models(
    body: kopf.Body, namespace: str | None, name: str, meta: kopf.Meta, memo: kopf.Memo, **_: Any
) -> dict[str, dict[str, Any]] | None:
    """This replica's models as last seen (:func:`model_entry`): its pods' events are handled
    here and no one else's, and a child's event or a crash is judged without reading the model."""
    if not state_of(memo).shards.owns_uid(meta.get("uid")):
        return None
    return {f"{namespace}/{name}": model_entry(body)}


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
def workload_event(
    body: kopf.Body, logger: kopf.Logger, type: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    # Every shard's Deployments hold their GPUs in this replica's plans (capacity shared between shards).
    state = state_of(memo)
    _plan.note_demand(state, body, deleted=type == "DELETED")
    if type == "DELETED":
        state.workloads.note(body, deleted=True)
        return
    if not state.shards.owns_uid(_shards.owner_uid(body)):
        return
    state.workloads.note(body)  # the readiness timer reads it here, not from the API server
    refs = body["metadata"].get("ownerReferences") or []
    owner = next((ref.get("name") for ref in refs if ref.get("kind") == KIND), None)
    key = f"{body['metadata'].get('namespace')}/{owner}"
    known = next(iter(kwargs["owned_models"].get(key, ())), None)
    if owner and state.pacer.running(key) and _readiness.new_pods_created(state, body, str(owner)):
        state.pacer.finished(key)  # the control plane's part is done: its slot goes to the next model
    latest = known
    try:
        latest = _readiness.on_workload_event(state, body, logger, known)
    finally:  # an event is not retried: the scale's count is written even when readiness gave up
        _scale.sync_scale_status(state, body, latest, logger)  # status.replicas/selector


@kopf.on.event("", "v1", "pods", labels={INSTANCE_LABEL: kopf.PRESENT})
async def pod_event(body: kopf.Body, logger: kopf.Logger, memo: kopf.Memo, **kwargs: Any) -> None:
    # Most pod events are no crash: decided on the event loop; a crash takes a CRASHES lane thread, a
    # Deploying model's pod turning Ready a CHECKS lane thread.
    state = state_of(memo)
    model = f"{body['metadata'].get('namespace')}/{body['metadata']['labels'][INSTANCE_LABEL]}"
    if state.ready_pods.note(body, deleted=kwargs.get("type") == "DELETED"):
        known = next(iter(kwargs["owned_models"].get(model, ())), None)
        if state.shards.owns_key(model, kwargs["owned_models"]) and _readiness.needs_readiness(known):
            await state.lanes.checks.run(_readiness.on_pod_ready, state, body, logger, known)
    if kwargs.get("type") == "DELETED" or not _oom.has_new_crash(state, body):
        return
    if not state.shards.owns_key(model, kwargs["owned_models"]):
        return
    policies = _policies.parse_policies(_policy_bodies(kwargs["fleet_policies"]).values())
    known = next(iter(kwargs["owned_models"].get(model, ())), None)
    indexes = kwargs["gpu_nodes"], kwargs["gpu_pods"]
    await state.lanes.crashes.run(_oom.on_pod_event, state, body, logger, SETTINGS, policies, known, indexes)


def _deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


@kopf.on.event(GROUP, VERSION, PLURAL, when=lambda type, **_: type != "DELETED")
def model_gauges(body: kopf.Body, **_: Any) -> None:
    _scale.model_gauges(body)  # replicas and GPU memory series (no I/O)


@kopf.on.event(GROUP, VERSION, PLURAL, when=_deleted)
async def model_deleted(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A deleted model's metric series and capacity reservation go with it, on its DELETED watch event
    (no I/O: on the event loop; ``when`` keeps kopf from calling, and logging, it for other events).
    Not a deletion handler: that needs a finalizer on every model, and an optional one ran only while a
    timer's finalizer happened to be there (a Ready model's reservation outlived it, holding GPUs that
    no pod used)."""
    telemetry.forget(namespace or "", name)
    state_of(memo).forget_model(namespace or "", name)


def _timers_without_finalizers(registry: kopf.OperatorRegistry) -> None:
    """kopf puts a finalizer on every object one of its timers matches and takes it off when none does
    (its timers are declared ``requires_finalizer=True``; kopf issue #1074): two writes per model each
    time it starts deploying or a roll-out is pending, and models that cannot be deleted while the
    operator is down. loadline's timers keep nothing that deletion must clean up (their filters stop matching
    on the DELETED event, :func:`_present`; a tick racing a deletion gets 404, which kopf logs), so none
    holds a finalizer."""
    spawning = registry._spawning
    spawning._handlers = [
        dataclasses.replace(handler, requires_finalizer=False) for handler in spawning.get_all_handlers()
    ]


# --- admission, on every replica (the ADMISSION registry) ---


@kopf.on.startup(registry=ADMISSION)
def configure_admission(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # config.json files fetched from the hub while admitting (loadline.hub.ConfigCache says why).
    memo["hub"] = ConfigCache(ttl=3600, max_entries=512)
    # Where the answers' metrics go: the process serving /metrics relays them (loadline run).
    memo.setdefault("record_admission", telemetry.record_admission)
    settings.watching.server_timeout = SETTINGS.watch_server_timeout
    settings.watching.client_timeout = SETTINGS.watch_client_timeout
    settings.peering.standalone = True
    settings.peering.mandatory = False
    settings.posting.enabled = False  # admission writes nothing, Events included
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # a line per request; kopf logs each
    # The chart owns the webhook configurations (settings.admission.managed stays unset: no RBAC on
    # them). kopf re-reads the certificate files and serves a renewed one without a restart.
    cert_dir = SETTINGS.webhook_cert_dir
    settings.admission.server = kopf.WebhookServer(
        addr="0.0.0.0",  # every interface: the Service reaches the pod on its IP
        port=SETTINGS.webhook_port,
        certfile=cert_dir / "tls.crt",
        pkeyfile=cert_dir / "tls.key",
        file_check_interval=SETTINGS.webhook_cert_check_seconds,
    )


@kopf.on.startup(registry=ADMISSION, id="discovery", backoff=_discovery.RETRY_SECONDS)
def wait_for_discovery_admission(**_: Any) -> None:
    """Nor serves webhooks before then: it would answer 404 for every model, for good."""
    _discovery.check_served()


@kopf.on.login(registry=ADMISSION)
def login_admission(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """What kopf's default registry does on its own: the client's config (in-cluster, else KUBECONFIG)."""
    return kopf.login_via_client(**kwargs)


def _index_policies(kwargs: dict[str, Any]) -> list[Any]:
    return _policies.parse_policies(_policy_bodies(kwargs["fleet_policies"]).values())


@kopf.on.mutate(GROUP, VERSION, PLURAL, id=telemetry.MUTATE_MODEL, operations=["CREATE", "UPDATE"],
                registry=ADMISSION)  # fmt: skip
def mutate_inference_model(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any) -> None:
    # kopf passes `old` and `operation` among the kwargs (its WebhookFn protocol does not name them).
    policies = _index_policies(kwargs)
    old, operation = kwargs.get("old"), kwargs.get("operation")
    _admission.mutate_model(
        body, old, operation, patch, policies, SETTINGS, memo["hub"], memo["record_admission"]
    )


@kopf.on.validate(GROUP, VERSION, PLURAL, id=telemetry.VALIDATE_MODEL, operations=["CREATE", "UPDATE"],
                  registry=ADMISSION)  # fmt: skip
def validate_inference_model(body: kopf.Body, warnings: list[str], memo: kopf.Memo, **kwargs: Any) -> None:
    policies = _index_policies(kwargs)
    old, operation = kwargs.get("old"), kwargs.get("operation")
    record = memo["record_admission"]
    _admission.validate_model(body, old, operation, warnings, policies, SETTINGS, memo["hub"], record)


@kopf.on.validate(GROUP, VERSION, PLURAL, id="validate-inferencemodel-scale", subresource="scale",
                  operations=["UPDATE"], registry=ADMISSION)  # fmt: skip
def validate_inference_model_scale(
    body: kopf.Body, warnings: list[str], memo: kopf.Memo, **kwargs: Any
) -> None:
    policies = _index_policies(kwargs)
    _scale.validate_scale(body, warnings, policies, SETTINGS, memo["hub"], memo["record_admission"])


@kopf.on.validate(GROUP, VERSION, POLICY_PLURAL, id=telemetry.VALIDATE_POLICY,
                  operations=["CREATE", "UPDATE"], registry=ADMISSION)  # fmt: skip
def validate_fleet_policy(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _admission.validate_policy(body, memo["record_admission"])


# After every registration above: the timers are all declared by now.
_timers_without_finalizers(kopf.get_default_registry())
