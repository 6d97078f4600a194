"""Fetching config.json from a hub: success, token refusal, missing repo, unreachable hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadline.errors import ModelConfigError
from loadline.hub import HubUnavailable, config_url, fetch_config
from tests.conftest import LLAMA_8B
from tests.hubserver import TOKEN, HubServer


def test_config_url_follows_the_hub_layout() -> None:
    assert config_url("org/model", None) == "https://huggingface.co/org/model/resolve/main/config.json"
    assert (
        config_url("org/model", "v1.0", "http://mirror/")
        == "http://mirror/org/model/resolve/v1.0/config.json"
    )


def test_fetch_public_and_private_repos(tmp_path: Path) -> None:
    with HubServer(tmp_path) as hub:
        hub.add("org/model", json.dumps(LLAMA_8B))
        hub.add("private/model", json.dumps(LLAMA_8B), revision="abc123")
        assert fetch_config("org/model", endpoint=hub.url)["hidden_size"] == 4096
        assert fetch_config("private/model", "abc123", TOKEN, endpoint=hub.url)["num_hidden_layers"] == 32
        with pytest.raises(ModelConfigError) as refused:
            fetch_config("private/model", "abc123", "wrong", endpoint=hub.url)
        assert refused.value.field == "spec.model.tokenSecretRef"
        with pytest.raises(ModelConfigError) as missing:
            fetch_config("org/nope", endpoint=hub.url)
        assert missing.value.field == "spec.model.name"


def test_unreachable_hub_is_temporary() -> None:
    with pytest.raises(HubUnavailable):
        fetch_config("org/model", endpoint="http://127.0.0.1:9", timeout=2)
