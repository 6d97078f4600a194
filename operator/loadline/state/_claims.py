"""The restart slots this process took that its index may not show yet."""

from __future__ import annotations

import threading
import time

#: How long a restart claim stands in for the index (seconds); after this it is dropped, so a model
#: deleted mid-restart never holds a slot for the rest of the process's life.
CLAIM_SECONDS = 300.0


class RestartClaims:
    """Models this process set Running whose status its index may not show yet: the restart slots of
    ``maxConcurrent`` are taken under :meth:`slots`, so two timers of this process never take the last
    one together. One process decides at a time (the elected leader), so no lock in the API is needed.
    A claim stands in for the index only for :data:`CLAIM_SECONDS`."""

    def __init__(self) -> None:
        self.slots = threading.Lock()
        self._claimed: dict[str, float] = {}

    def live(self, now: float) -> list[str]:
        """The claims still standing (call under :attr:`slots`)."""
        for key in [k for k, at in self._claimed.items() if now - at > CLAIM_SECONDS]:
            del self._claimed[key]
        return list(self._claimed)

    def claim(self, key: str, now: float) -> None:
        """(Call under :attr:`slots`.)"""
        self._claimed[key] = now

    def drop(self, key: str) -> None:
        """(Call under :attr:`slots`.)"""
        self._claimed.pop(key, None)

    def claimed(self) -> frozenset[str]:
        """Models this process has started restarting and its index may not show yet."""
        with self.slots:
            return frozenset(self.live(time.time()))
