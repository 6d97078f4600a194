"""Fetching config.json from a hub: success, token refusal, missing repo, unreachable hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadline.errors import ModelConfigError
from loadline.hub import ConfigCache, HubUnavailable, config_url, fetch_config
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


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cache_keys_by_credential_so_one_namespaces_token_never_serves_another() -> None:
    cache = ConfigCache(ttl=60)
    with_token = ConfigCache.key("http://hub/", "private/model", None, "team-a-token")
    without = ConfigCache.key("http://hub", "private/model", "main", None)
    other_token = ConfigCache.key("http://hub", "private/model", "main", "team-b-token")
    cache.put(with_token, {"hidden_size": 1})
    assert cache.get(with_token) == {"hidden_size": 1}
    assert cache.get(without) is None and cache.get(other_token) is None
    assert "team-a-token" not in repr(with_token)  # only a digest of the credential is kept


def test_cache_entries_expire_and_the_oldest_go_first() -> None:
    clock = _Clock()
    cache = ConfigCache(ttl=10, max_entries=2, clock=clock)
    a, b, c = (ConfigCache.key("http://hub", name, None, None) for name in ("a/a", "b/b", "c/c"))
    cache.put(a, {"n": 1})
    clock.now = 9.9
    assert cache.get(a) == {"n": 1}
    clock.now = 10.0
    assert cache.get(a) is None and len(cache) == 0
    cache.put(a, {"n": 1})
    cache.put(b, {"n": 2})
    cache.get(a)  # a is used again: b is now the least recently used
    cache.put(c, {"n": 3})
    assert len(cache) == 2 and cache.get(b) is None and cache.get(a) == {"n": 1}
