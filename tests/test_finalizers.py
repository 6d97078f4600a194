"""No finalizer on InferenceModels: a model is deleted at once, with or without the operator running,
and what the operator keeps per model in memory goes on the model's DELETED watch event instead."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from loadline.api import GROUP, KIND, PLURAL, VERSION
from loadline.handlers import _registry
from loadline.handlers._state import OperatorState
from loadline.sizing import Reservation


def test_no_handler_of_the_operator_asks_kopf_for_a_finalizer() -> None:
    """kopf adds its finalizer to an object when a handler matching it requires one: its timers always
    declare so, and a deletion handler unless optional. Two writes per model each time a timer starts
    or stops matching (deploying, a pending roll-out), and models stuck deleting without the operator."""
    registry = kopf.get_default_registry()
    spawning = registry._spawning.get_all_handlers()
    assert {h.id for h in spawning} >= {"readiness", "measured_gpu_memory", "maintenance"}
    assert [h.id for h in spawning if h.requires_finalizer] == []
    assert [h.id for h in registry._changing.get_all_handlers() if h.requires_finalizer] == []


def test_a_deleted_model_frees_its_capacity_reservation_on_its_watch_event(state: OperatorState) -> None:
    """A reservation outliving its model holds GPUs no pod uses: later models would see them taken."""
    state.capacity.planned["ns/gone"] = Reservation("L4", 1, 1)
    state.capacity.planned["ns/kept"] = Reservation("L4", 1, 1)
    handler = next(
        h for h in kopf.get_default_registry()._watching.get_all_handlers() if h.id == "model_deleted"
    )
    assert handler.when is not None
    assert not handler.when(type="MODIFIED") and not handler.when(type="ADDED")  # not even called
    assert handler.when(type="DELETED")
    asyncio.run(_registry.model_deleted(namespace="ns", name="gone", memo=kopf.Memo(state=state)))
    assert set(state.capacity.planned) == {"ns/kept"}


def _model(phase: str, maintenance: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if maintenance:
        status["maintenance"] = {"state": maintenance, "action": "restart"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"namespace": "ns", "name": "stuck", "uid": "uid-stuck", "resourceVersion": "1"},
        "spec": {"model": "meta-llama/Llama-3.1-8B-Instruct"},
        "status": status,
    }


async def _through_kopf(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Feed watch events of one model through kopf's own processing with the operator's registry; the
    model's daemons memory (its running timers) as kopf keeps it."""
    from kopf._cogs.structs.ephemera import Memo
    from kopf._cogs.structs.references import Resource
    from kopf._core.engines.indexing import OperatorIndexers
    from kopf._core.reactor.inventory import ResourceMemories
    from kopf._core.reactor.processing import process_resource_event

    registry = kopf.get_default_registry()
    settings = kopf.OperatorSettings()
    indexers = OperatorIndexers()
    indexers.ensure(registry._indexing.get_all_handlers())
    memories = ResourceMemories()
    resource = Resource(
        GROUP, VERSION, PLURAL, kind=KIND, namespaced=True, subresources=frozenset({"status"})
    )
    memobase = Memo(state=OperatorState())  # as the operator's start-up handler leaves it
    memory = await memories.recall(events[0][1], memobase=memobase)
    for event_type, raw in events:
        # Handled before (its diff-base stored), so no create or update handler runs: the timers only.
        body = kopf.Body(raw)
        essence = settings.persistence.diffbase_storage.build(body=body)
        stored = kopf.Patch()
        settings.persistence.diffbase_storage.store(body=body, patch=stored, essence=essence)
        raw["metadata"].setdefault("annotations", {}).update(stored["metadata"]["annotations"])
        await process_resource_event(
            lifecycle=kopf.lifecycles.all_at_once, indexers=indexers, registry=registry, settings=settings,
            memories=memories, memobase=memobase, resource=resource, raw_event={"type": event_type, "object": raw},
            event_queue=asyncio.Queue(), no_throttling=True,
        )  # fmt: skip
    return memory.daemons_memory.running_daemons  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("phase", "maintenance", "timer"),
    [("Deploying", None, "readiness"), ("Ready", "Scheduled", "maintenance")],
)
def test_a_deleted_models_timers_stop_on_its_watch_event(
    phase: str, maintenance: str | None, timer: str
) -> None:
    """Without a finalizer, kopf sees no deletion coming: the DELETED event's body still says
    Deploying. The timers' filters must not match a model gone from the cluster, or its readiness
    timer would tick on, orphaned, for the life of the process (a task and a read a minute per model
    ever deleted while deploying)."""

    async def scenario() -> tuple[set[str], set[str]]:
        added = await _through_kopf([("ADDED", _model(phase, maintenance))])
        started = {str(handler_id) for handler_id, daemon in added.items() if not daemon.stopper.is_set()}
        deleted = await _through_kopf(
            [("ADDED", _model(phase, maintenance)), ("DELETED", _model(phase, maintenance))]
        )
        left = {str(handler_id) for handler_id, daemon in deleted.items() if not daemon.stopper.is_set()}
        for daemon in [*added.values(), *deleted.values()]:
            daemon.task.cancel()
        return started, left

    started, left = asyncio.run(scenario())
    assert started == {timer}  # a Deploying model has its readiness timer, a pending restart maintenance
    assert left == set()
