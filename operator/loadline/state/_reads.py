"""Reads shared by the timers of a burst: one answer per key for a few seconds, one read in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RecentReads(Generic[K, V]):
    """A read (a LIST, usually) reused for ``max_age`` seconds per key, one in flight per key: callers
    that ask meanwhile wait for it and take its answer. For what many timers of a burst ask within the
    same few seconds (a LIST per caller was a large share of the operator's requests at fleet scale)."""

    def __init__(self, max_age: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age = max_age
        self._clock = clock
        self._guard = threading.Lock()
        self._locks: dict[K, threading.Lock] = {}
        self._answers: dict[K, tuple[float, V]] = {}

    def get(self, key: K, read: Callable[[], V]) -> V:
        """The answer of ``read()`` for ``key``, read again only when the last is older than max_age."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            taken = self._answers.get(key)
            if taken is None or self._clock() - taken[0] > self.max_age:
                started = self._clock()
                taken = (started, read())
                self._answers[key] = taken
            return taken[1]
