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


@pytest.fixture
def state() -> OperatorState:
    """The operator's memory as a fresh process starts with it: nothing applied, planned or seen."""
    return OperatorState()
