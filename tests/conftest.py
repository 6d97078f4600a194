"""Shared fixtures for the fast tests (no cluster)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from loadline.handlers._state import OperatorState

REPO = Path(__file__).resolve().parent.parent
CALIBRATION = REPO.parent / "shared" / "calibration"

# A Llama-3.1-8B-shaped config kept inline so the tests that use it do not depend on the catalog.
LLAMA_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3", "original_max_position_embeddings": 8192},
}


@pytest.fixture
def llama_8b_config() -> dict[str, Any]:
    return copy.deepcopy(LLAMA_8B)


def inference_model(**spec: Any) -> dict[str, Any]:
    """An InferenceModel manifest as a dict with the given spec fields."""
    body: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "config": copy.deepcopy(LLAMA_8B)}
    }
    body.update(spec)
    return {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "chat", "namespace": "team-a"},
        "spec": body,
    }


def _planned() -> dict[str, Any]:
    from loadline.api import parse_inference_model
    from loadline.sizing import plan_inference_model

    plan = plan_inference_model(parse_inference_model(inference_model()).spec).summary()
    return plan.model_dump(by_alias=True, mode="json", exclude_none=True)


_PLANNED: dict[str, Any] = {}


def stored_plan(**fields: Any) -> dict[str, Any]:
    """``status.plan`` as the operator stores it (every field the API model requires, from a real plan
    of the inline Llama), with ``fields`` (camelCase) over it; ``memory`` is merged member by member.
    Status is read typed, so a partial plan in a fixture would be read as no plan at all."""
    if not _PLANNED:
        _PLANNED.update(_planned())
    plan = copy.deepcopy(_PLANNED)
    memory = {**plan["memory"], **fields.pop("memory", {})}
    return {**plan, **fields, "memory": memory}


def typed_status(status: Any) -> Any:
    """A status as the handlers hand it to the pure core (read once into the API model), from the wire
    form a test writes it in; a typed one (or None) as it is."""
    from loadline.status import read_status

    if status is None or not isinstance(status, dict):
        return status
    return read_status({"status": status})


@pytest.fixture
def state() -> OperatorState:
    """The operator's memory as a fresh process starts with it: nothing applied, planned or seen."""
    return OperatorState()
