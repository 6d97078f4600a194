"""What planning a model reads besides its spec: its config.json (inline, a ConfigMap, the catalog or
the hub, with a token from a Secret) and the remediation overrides in force."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from loadline.api import (
    InferenceModel,
    InferenceModelSpec,
    RemediationState,
    apply_overrides,
    parse_inference_model,
)
from loadline.errors import ReferencedObjectError
from loadline.handlers import _kube
from loadline.hub import ConfigCache, HubUnavailable, fetch_config
from loadline.oom import remediation_in_force
from loadline.settings import OperatorSettings
from loadline.sizing import Plan, find_catalog_model, plan_inference_model
from loadline.status import read_status


def _config_map_config(obj: InferenceModel, namespace: str) -> dict[str, Any] | None:
    ref = obj.spec.model.config_map_ref
    if ref is None:
        return None
    cm = _kube.get("v1", "ConfigMap", namespace, ref.name)
    if cm is None:
        raise kopf.TemporaryError(f"ConfigMap {ref.name} not found", delay=30)
    text = (cm.get("data") or {}).get(ref.key)
    if text is None:
        raise ReferencedObjectError(
            "spec.model.configMapRef.key",
            f"ConfigMap {ref.name} has no key {ref.key!r}",
            f"add the model's config.json under {ref.key!r} or point key at the right one",
        )
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReferencedObjectError(
            "spec.model.configMapRef",
            f"ConfigMap {ref.name} key {ref.key} is not JSON: {exc}",
            "fix its JSON",
        ) from None
    if not isinstance(parsed, dict):
        raise ReferencedObjectError(
            "spec.model.configMapRef", "config.json is not a JSON object", "fix its JSON"
        )
    return parsed


def _secret_value(namespace: str, name: str, key: str, field: str) -> str:
    secret = _kube.get("v1", "Secret", namespace, name)
    if secret is None:
        raise kopf.TemporaryError(f"Secret {name} ({field}) not found", delay=30)
    data = (secret.get("data") or {}).get(key)
    if data is None:
        raise ReferencedObjectError(
            field, f"Secret {name} has no key {key!r}", f"add the token under {key!r}"
        )
    return base64.b64decode(data).decode().strip()


def _hub_config(
    obj: InferenceModel, namespace: str, settings: OperatorSettings, cache: ConfigCache
) -> dict[str, Any] | None:
    """config.json from the hub, for a model that is neither inline, in a ConfigMap nor in the catalog."""
    model = obj.spec.model
    if not settings.hf_fetch or model.config or model.config_map_ref or find_catalog_model(model.name):
        return None
    token = None
    if model.token_secret_ref is not None:
        ref = model.token_secret_ref
        token = _secret_value(namespace, ref.name, ref.key, "spec.model.tokenSecretRef")
    key = ConfigCache.key(settings.hf_endpoint, model.name, model.revision, token)
    cached = cache.get(key)
    if cached is not None:
        return cached
    try:
        config = fetch_config(model.name, model.revision, token, endpoint=settings.hf_endpoint)
    except HubUnavailable as exc:
        raise kopf.TemporaryError(str(exc), delay=settings.retry_delay_seconds) from None
    cache.put(key, config)
    return config


@dataclass(frozen=True)
class ModelInputs:
    """What planning a model needs, read once: the model with remediation's overrides applied (they
    hold for the spec generation they were made for), its remediation state, and its config.json from
    a ConfigMap or the hub when it is not inline or in the catalog."""

    obj: InferenceModel
    state: RemediationState
    config: dict[str, Any] | None
    hub: dict[str, Any] | None

    def plan(self, spec: InferenceModelSpec | None = None, **options: Any) -> Plan:
        """Plan ``spec`` (default: the model's) with the model's config.json (a :data:`PlanFn`)."""
        return plan_inference_model(
            spec or self.obj.spec, config_map_config=self.config, hub_config=self.hub, **options
        )


def model_inputs(body: Mapping[str, Any], settings: OperatorSettings, hub: ConfigCache) -> ModelInputs:
    """Reconcile, admission and the FleetPolicy judge read a model the same way (raises on a bad spec).
    ``hub``: the process's cache of config.json files fetched from the hub."""
    raw = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    state = remediation_in_force(read_status(body), body["metadata"].get("generation"))
    obj = parse_inference_model({**raw, "metadata": dict(body["metadata"])}, unknown="ignore")
    # Overrides waiting for the restart window are not rendered yet: the pods keep the held ones.
    running = state.held_overrides if state.held_overrides is not None else state.overrides
    obj = obj.model_copy(update={"spec": apply_overrides(obj.spec, running)})
    namespace = body["metadata"]["namespace"]
    config = _config_map_config(obj, namespace)
    return ModelInputs(obj, state, config, _hub_config(obj, namespace, settings, hub))
