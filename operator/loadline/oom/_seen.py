"""A bounded memory of crash ids already handled by this process (least recently seen first out).

After a crash, most pod events (the restart, the roll-out, the deletion) carry the same terminated
state; answering them from memory saves a request each. The InferenceModel's status stays the source
of truth across operator restarts, so forgetting an old id costs one read, never a second action.
"""

from __future__ import annotations

import threading

from cachetools import LRUCache


class SeenCrashes:
    """A thread-safe LRU set of crash ids, at most ``capacity`` long."""

    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._ids: LRUCache[str, None] = LRUCache(maxsize=capacity)
        self._lock = threading.Lock()

    def __contains__(self, crash_id: object) -> bool:
        with self._lock:
            if crash_id not in self._ids:
                return False
            self._ids[str(crash_id)] = None  # seen again: most recently used
            return True

    def add(self, crash_id: str) -> None:
        with self._lock:
            self._ids[crash_id] = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)
