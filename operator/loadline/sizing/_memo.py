"""A bounded memo for the planner's pure, repeated computations.

The planner asks for the same budget, layout and shape list again and again (the tuning ladder's rungs,
refusal fixes, every reconcile of an unchanged model), so they are memoised. Each entry keeps the object
it was computed from (the coefficients table, the GPU type): an entry computed from a table that has
since been reloaded is computed again. The memo is cleared when full, which keeps a long-running
operator's memory bounded without the bookkeeping of an LRU.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["GuardedMemo"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class GuardedMemo(Generic[K, V]):
    """``key → value`` computed once while ``guard`` (compared by identity) stays the same object."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: dict[K, tuple[object, V]] = {}

    def get(self, key: K, guard: object, compute: Callable[[], V]) -> V:
        found = self._entries.get(key)
        if found is not None and found[0] is guard:
            return found[1]
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        value = compute()
        self._entries[key] = (guard, value)
        return value

    def peek(self, key: K, guard: object) -> V | None:
        """The value computed for ``key`` under ``guard``, or None (for memos whose values are never
        None): a hot path then builds no ``compute`` closure when the value is there."""
        found = self._entries.get(key)
        if found is not None and found[0] is guard:
            return found[1]
        return None

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
