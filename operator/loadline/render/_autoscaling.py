"""spec.autoscaling as a KEDA ScaledObject (pure: the model and the operator's Prometheus in, the object
out).

KEDA's operator turns the ScaledObject into an HPA on the InferenceModel's scale subresource and serves
the trigger's value to it; the HPA writes ``spec.replicas`` and reconcile renders the workload with it.
The trigger asks the operator's Prometheus for the model's total load on the signal chosen, under the
metric names the model's vLLM version exports (``loadline.traffic``'s table): the HPA keeps
``total / replicas`` near the target (``metricType: AverageValue``).
"""

from __future__ import annotations

from typing import Any

from loadline.api import API_VERSION, KIND, InferenceModel
from loadline.errors import RenderError
from loadline.render._render import LABEL_MANAGED_BY, LABEL_MODEL, MANAGED_BY
from loadline.render._template import render_object
from loadline.traffic import model_signal_query, signal_names

__all__ = ["KEDA_POLLING_SECONDS", "SCALEDOBJECT", "autoscaling_query", "render_scaled_object"]

SCALEDOBJECT = ("keda.sh/v1alpha1", "ScaledObject")
#: How often KEDA asks Prometheus (its default, 30 s, halved: vLLM's queues build within seconds).
KEDA_POLLING_SECONDS = 15

#: signal → (table key, how one pod's engines are combined): KV-cache usage is a fraction per engine
#: (the fullest decides), waiting requests a count (they add up).
_SIGNALS = {"kvCacheUsage": ("kvCacheUsage", "max"), "waitingRequests": ("requestsWaiting", "sum")}


def autoscaling_query(obj: InferenceModel, namespace: str) -> str:
    """The PromQL whose value is the model's total load on its autoscaling signal."""
    scaling = obj.spec.autoscaling
    assert scaling is not None
    if scaling.signal == "promql":
        assert scaling.query is not None
        return scaling.query
    table_key, per_pod = _SIGNALS[scaling.signal]
    name = str(obj.metadata["name"])
    return model_signal_query(namespace, name, signal_names(table_key, obj.spec.engine.version), per_pod)


def render_scaled_object(obj: InferenceModel, namespace: str, prometheus_url: str) -> dict[str, Any] | None:
    """The model's ScaledObject, or None without ``spec.autoscaling``.

    Raises :class:`RenderError` naming ``spec.autoscaling`` when the operator has no Prometheus to give
    KEDA (the trigger reads the same one the operator does)."""
    scaling = obj.spec.autoscaling
    if scaling is None:
        return None
    if not prometheus_url:
        raise RenderError(
            "spec.autoscaling",
            "the operator has no Prometheus for KEDA's trigger to read vLLM's series from",
            "set the chart's settings.prometheusUrl (LOADLINE_PROMETHEUS_URL), or remove spec.autoscaling",
        )
    name = str(obj.metadata["name"])
    target = f"{scaling.target:g}"
    return render_object(
        "scaledobject.yaml.j2",
        {
            "meta": {"name": name, "namespace": namespace, "labels": _labels(obj)},
            "target_api_version": API_VERSION,
            "target_kind": KIND,
            "target_name": name,
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "polling_seconds": KEDA_POLLING_SECONDS,
            "scale_down_seconds": scaling.scale_down_stabilization_seconds,
            "server": prometheus_url,
            "query": autoscaling_query(obj, namespace),
            "threshold": target,
        },
    )


def _labels(obj: InferenceModel) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_MODEL: str(obj.metadata["name"])}
