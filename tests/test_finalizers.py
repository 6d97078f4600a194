"""No finalizer on InferenceModels: a model is deleted at once, with or without the operator running,
and what the operator keeps per model in memory goes on the model's DELETED watch event instead."""

from __future__ import annotations

import asyncio

import kopf

from loadline.handlers import _reconcile, _registry


def test_no_handler_of_the_operator_asks_kopf_for_a_finalizer() -> None:
    """kopf adds its finalizer to an object when a handler matching it requires one: its timers always
    declare so, and a deletion handler unless optional. Two writes per model each time a timer starts
    or stops matching (deploying, a pending roll-out), and models stuck deleting without the operator."""
    registry = kopf.get_default_registry()
    spawning = registry._spawning.get_all_handlers()
    assert {h.id for h in spawning} >= {"readiness", "measured_gpu_memory", "maintenance"}
    assert [h.id for h in spawning if h.requires_finalizer] == []
    assert [h.id for h in registry._changing.get_all_handlers() if h.requires_finalizer] == []


def test_a_deleted_model_frees_its_capacity_reservation_on_its_watch_event() -> None:
    """A reservation outliving its model holds GPUs no pod uses: later models would see them taken."""
    _reconcile._PLANNED["ns/gone"] = ("L4", 1, 1)
    _reconcile._PLANNED["ns/kept"] = ("L4", 1, 1)
    handler = next(
        h for h in kopf.get_default_registry()._watching.get_all_handlers() if h.id == "model_deleted"
    )
    assert handler.when is not None
    assert not handler.when(type="MODIFIED") and not handler.when(type="ADDED")  # not even called
    assert handler.when(type="DELETED")
    asyncio.run(_registry.model_deleted(namespace="ns", name="gone"))
    assert set(_reconcile._PLANNED) == {"ns/kept"}
