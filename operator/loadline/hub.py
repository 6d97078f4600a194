"""Fetch a model's ``config.json`` from a Hugging Face hub (opt-in: ``LOADLINE_HF_FETCH=true``).

Only used when the model is neither inline, in a ConfigMap, nor in the bundled catalog. The endpoint is
configurable (``LOADLINE_HF_ENDPOINT``, like huggingface_hub's ``HF_ENDPOINT``) so air-gapped clusters can
point it at a mirror. Errors are split the way the operator needs them: a refusal or a missing repository
is the spec's problem (:class:`ModelConfigError`, naming the field); a network failure is the world's
(:class:`HubUnavailable`, retried later).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from cachetools import TTLCache

from loadline.errors import LoadlineError, ModelConfigError

__all__ = ["ConfigCache", "HubUnavailable", "config_url", "fetch_config"]

DEFAULT_ENDPOINT = "https://huggingface.co"


class HubUnavailable(LoadlineError):
    """The hub could not be reached or answered with a server error; try again later."""


def config_url(repo_id: str, revision: str | None, endpoint: str = DEFAULT_ENDPOINT) -> str:
    repo = "/".join(urllib.parse.quote(part, safe="") for part in repo_id.split("/"))
    rev = urllib.parse.quote(revision or "main", safe="")
    return f"{endpoint.rstrip('/')}/{repo}/resolve/{rev}/config.json"


def fetch_config(
    repo_id: str,
    revision: str | None = None,
    token: str | None = None,
    *,
    endpoint: str = DEFAULT_ENDPOINT,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """The repository's config.json as a dict."""
    request = urllib.request.Request(
        config_url(repo_id, revision, endpoint), headers={"User-Agent": "loadline"}
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise ModelConfigError(
                "spec.model.tokenSecretRef",
                f"the hub refused {repo_id} (HTTP {exc.code}: gated or private)",
                "reference a Secret with a token that has access to the repository",
            ) from None
        if exc.code == 404:
            raise ModelConfigError(
                "spec.model.name",
                f"{repo_id} (revision {revision or 'main'}) has no config.json on {endpoint}",
                "check the repository id and revision, or give spec.model.config",
            ) from None
        raise HubUnavailable(f"the hub answered HTTP {exc.code} for {repo_id}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise HubUnavailable(f"cannot reach {endpoint}: {getattr(exc, 'reason', exc)}") from None
    try:
        config = json.loads(body)
    except json.JSONDecodeError:
        raise ModelConfigError(
            "spec.model.name", f"{repo_id}'s config.json is not JSON", "give spec.model.config"
        ) from None
    if not isinstance(config, dict):
        raise ModelConfigError(
            "spec.model.name", f"{repo_id}'s config.json is not an object", "give spec.model.config"
        )
    return config


CacheKey = tuple[str, str, str, str]


class ConfigCache:
    """Fetched config.json files, keyed by endpoint, repository, revision *and* the credential used.

    The credential is part of the key (as a SHA-256 digest, never the token itself) because a gated
    model's config fetched with one namespace's token must not be served to a namespace whose token
    has no access: each credential earns its own entry. Entries expire after ``ttl`` seconds, so a
    revoked token or a moved ``main`` branch is seen again, and at most ``max_entries`` are kept (least
    recently used first out). Thread-safe: the operator's handlers run in a thread pool.
    """

    def __init__(
        self, ttl: float = 3600.0, max_entries: int = 512, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: TTLCache[CacheKey, dict[str, Any]] = TTLCache(
            maxsize=max_entries, ttl=ttl, timer=clock
        )

    @staticmethod
    def key(endpoint: str, repo_id: str, revision: str | None, token: str | None) -> CacheKey:
        credential = hashlib.sha256(token.encode()).hexdigest() if token else ""
        return (endpoint.rstrip("/"), repo_id, revision or "main", credential)

    def get(self, key: CacheKey) -> dict[str, Any] | None:
        with self._lock:
            return self._entries.get(key)

    def put(self, key: CacheKey, config: dict[str, Any]) -> None:
        with self._lock:
            self._entries[key] = config

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
