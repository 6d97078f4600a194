"""A model's typed status, read once per version for the checks that only look at it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from cachetools import LRUCache

from loadline.api import InferenceModelStatus
from loadline.status import read_status

#: Versions kept: a few per model of a large fleet (an old version is never asked for again).
STATUS_READS_MAX = 8192


class StatusReads:
    """:func:`loadline.status.read_status` of a model's version, kept by its uid and resourceVersion.

    kopf asks every timer's filter on every tick and event, and a due-check reads the status again: at
    fleet scale those reads of an unchanged version were a tenth of the operator's CPU in a crash storm
    (pydantic validating the whole status, plan and incidents, each time). A version's status never
    changes, so it is read once. Only for bodies as the API server gave them (a kopf body: its
    resourceVersion names its content); a body built with other members under the same resourceVersion
    must go through ``read_status``. The status returned is shared: callers read it, never change it."""

    def __init__(self, max_entries: int = STATUS_READS_MAX) -> None:
        self._lock = threading.Lock()
        self._read: LRUCache[tuple[str, str], InferenceModelStatus] = LRUCache(maxsize=max_entries)

    def read(self, body: Mapping[str, Any]) -> InferenceModelStatus:
        meta = body.get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not uid or not version:
            return read_status(body)
        key = (str(uid), str(version))
        with self._lock:
            found = self._read.get(key)
        if found is None:
            found = read_status(body)
            with self._lock:
                self._read[key] = found
        return found
