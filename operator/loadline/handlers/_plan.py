"""A model's plan on the cluster as the operator's indexes show it, and its children's manifests.

The capacity accounting itself is pure (:class:`loadline.sizing.CapacityBook`, one per process in
:class:`loadline.handlers._state.OperatorState`); this reads the cluster into it and plans with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loadline.handlers import _inputs, _kube, _scale
from loadline.render import render_manifests
from loadline.settings import OperatorSettings
from loadline.sizing import ClusterView, Plan, workload_demand
from loadline.state import INSTANCE_LABEL

if TYPE_CHECKING:
    from loadline.handlers._state import OperatorState

#: Set on a model whose pods the scheduler cannot place, to the workload version it refused: kopf's
#: update handler sees the change and reconciles (re-plans). Outside the "loadline.dev/" prefix for
#: the reason ``_rollout.REMEDIATION_ANNOTATION`` is.
REPLAN_ANNOTATION = "replan.loadline.dev/unschedulable"


def cluster_view(view: ClusterView | None, *, pods: bool) -> ClusterView:
    """(GPU nodes, GPU pods) from the operator's in-memory indexes; without them (e.g. called outside
    kopf) the API is listed (pods only when ``pods``: capacity awareness needs them, shapes do not)."""
    if view is None:
        return _kube.list_objects("v1", "Node"), _kube.list_objects("v1", "Pod") if pods else []
    return view


def note_demand(state: OperatorState, body: Mapping[str, Any], deleted: bool = False) -> None:
    """Keep (or, when ``deleted``, forget) what a loadline Deployment asks for, whoever planned it."""
    meta = body.get("metadata") or {}
    model = (meta.get("labels") or {}).get(INSTANCE_LABEL)
    if not model:
        return
    state.capacity.note_demand(f"{meta.get('namespace')}/{model}", None if deleted else workload_demand(body))


def plan_and_render(
    state: OperatorState, body: Mapping[str, Any], settings: OperatorSettings, view: ClusterView | None
) -> tuple[_inputs.ModelInputs, Plan, list[dict[str, Any]]]:
    """The model's plan on the cluster as ``view`` shows it, and its children's manifests."""
    meta = body["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    inputs = _inputs.model_inputs(body, settings, state.hub)
    overrides = inputs.state.overrides
    book = state.capacity
    cluster = cluster_view(view, pods=settings.capacity_aware)
    options: dict[str, Any] = {
        "cluster_shapes": book.capacity(cluster).shapes,
        "min_gpus": overrides.min_gpus_per_replica or 1,
        "min_gpu_memory_gib": overrides.min_gpu_memory_gi_b or 0.0,
        "corrections": state.observations.current(),  # learned from what vLLM reported (docs/observe.md)
    }
    if not settings.capacity_aware:
        plan = inputs.plan(free_gpus=None, **options)
    else:
        with book.planning():  # the free GPUs read and the ones this plan takes held, in one step
            free = book.free_gpus(meta["name"], meta["namespace"], cluster)
            refused = book.scheduler_refusal(key, book.capacity(cluster).bound)
            if refused is not None:  # the scheduler's word over the snapshot's: no room of that type
                free = {**free, refused[0]: []}
            plan = inputs.plan(free_gpus=free, **options)
            book.hold(key, plan, inputs.obj.spec.replicas)
    return (
        inputs,
        plan,
        [*render_manifests(inputs.obj, plan), *_scale.autoscaling_children(body, inputs.obj, settings)],
    )


def plan_message(plan: Plan) -> str:
    s = plan.summary()
    text = (
        f"{s.gpu} per replica (TP {s.tensor_parallel_size}, PP {s.pipeline_parallel_size}), "
        f"KV cache {s.kv_cache_tokens} tokens = {s.max_concurrency} sequences of {s.max_model_len}"
    )
    if plan.fallback_from:
        text += f"; {plan.fallback_from} had no free capacity"
    return text
