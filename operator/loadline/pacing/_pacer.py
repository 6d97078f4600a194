"""The queue of crash roll-outs paced after a storm (the decisions are :mod:`loadline.pacing`'s).

A crash's decision asks for a slot (:meth:`Pacer.ask`) before it is written, so that the one status
write says whether the fix rolls now or waits, behind how many and why. A fix that waits is applied at
once with the Deployment paused (the pod template carries the fix; its controller rolls nothing), and
its release (:meth:`Pacer.hold`) applies it again unpaused when a slot frees: when a running
roll-out's Deployment shows its new pods created (:meth:`Pacer.finished`, from the Deployment's watch
event: what follows, the pods' start, is the nodes' work, minutes of weight loading that must not hold
the control plane's slots), or when it has held its slot for :data:`SLOT_SECONDS` (a roll-out that
makes no progress does not stop the fleet).
An operator that stops with paused Deployments loses nothing: reconcile, on the next start, applies
every workload unpaused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from loadline.pacing._plan import PacingLimits, RollOutRequest, Waiting, plan_pacing

__all__ = ["SLOT_SECONDS", "Pacer"]

#: The longest a roll-out holds its slot: one whose pods do not come up (no room, a bad image) lets the
#: next one start after this, and is left to its own readiness.
SLOT_SECONDS = 120.0
#: How often a watch of the held slots looks for one that ran out (only while some roll-out waits).
WATCH_SECONDS = 2.0

log = logging.getLogger(__name__)


@dataclass
class _Queued:
    request: RollOutRequest
    #: Applies the fix unpaused; None until the paused apply is done (:meth:`Pacer.hold`).
    release: Callable[[], object] | None = None
    #: A slot freed for it before its release was handed in: :meth:`Pacer.hold` releases it at once.
    due: bool = False


class Pacer:
    """The roll-outs running and waiting in this process (a replica paces its own shards' models)."""

    def __init__(self, limits: PacingLimits, slot_seconds: float = SLOT_SECONDS) -> None:
        self.limits = limits
        self.slot_seconds = slot_seconds
        self._lock = threading.Lock()
        self._running: dict[str, tuple[str, float]] = {}
        self._queued: dict[str, _Queued] = {}
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    def ask(self, request: RollOutRequest) -> Waiting | None:
        """Take a slot for ``request`` (None: it rolls now), or queue it (how many are ahead and why).
        Asked again for the same model (a decision written again after a conflict), it answers as
        before."""
        if not self.limits.paced:
            return None
        with self._lock:
            self._expire()
            if request.key in self._running:
                return None
            queued = [q.request for q in self._queued.values() if not q.due]
            plan = plan_pacing(self._pool_of_running(), [*queued, request], self.limits)
            if any(r.key == request.key for r in plan.start):
                self._queued.pop(request.key, None)
                self._running[request.key] = (request.pool, time.monotonic())
                return None
            self._queued.setdefault(request.key, _Queued(request))
            self._ensure_watch()
            return next(w for w in plan.waiting if w.key == request.key)

    def hold(self, key: str, release: Callable[[], object]) -> None:
        """The waiting fix of ``key`` is applied paused; ``release`` applies it unpaused when its turn
        comes (at once, when a slot freed meanwhile)."""
        with self._lock:
            queued = self._queued.get(key)
            if queued is None:
                return
            if not queued.due:
                queued.release = release
                return
            del self._queued[key]
            self._running[key] = (queued.request.pool, time.monotonic())
        release()

    def waiting(self, key: str) -> bool:
        """Whether ``key``'s fix waits for a slot (its crashes meanwhile are the unfixed workload's)."""
        with self._lock:
            return key in self._queued

    def cancel(self, key: str) -> None:
        """``key`` takes no slot: its decision was not written, or its model is gone."""
        self.finished(key)

    def finished(self, key: str) -> None:
        """``key``'s roll-out is over (its Deployment rolled out, or reconcile took the model over):
        its slot goes to the next."""
        with self._lock:
            found = self._running.pop(key, None) is not None or self._queued.pop(key, None) is not None
        if found:
            self._release_due()

    def running(self, key: str) -> bool:
        with self._lock:
            return key in self._running

    def stop(self) -> None:
        self._stop.set()

    def _pool_of_running(self) -> dict[str, str]:
        return {key: pool for key, (pool, _) in self._running.items()}

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.slot_seconds
        for key in [k for k, (_, since) in self._running.items() if since < cutoff]:
            log.info("roll-out of %s held its slot %.0f s; the next one starts", key, self.slot_seconds)
            del self._running[key]

    def _release_due(self) -> None:
        """Start the waiting roll-outs the limits now allow (their releases run outside the lock)."""
        releases: list[Callable[[], object]] = []
        with self._lock:
            self._expire()
            waiting = [q.request for q in self._queued.values() if not q.due]
            if not waiting:
                return
            plan = plan_pacing(self._pool_of_running(), waiting, self.limits)
            for request in plan.start:
                queued = self._queued[request.key]
                if queued.release is None:  # its paused apply is not done: hold() releases it
                    queued.due = True
                    continue
                del self._queued[request.key]
                self._running[request.key] = (request.pool, time.monotonic())
                releases.append(queued.release)
        for release in releases:
            release()

    def _ensure_watch(self) -> None:
        """A thread that frees run-out slots while anything waits (called with the lock held)."""
        if self._watch is not None and self._watch.is_alive():
            return
        self._watch = threading.Thread(target=self._watch_slots, name="loadline-pacing", daemon=True)
        self._watch.start()

    def _watch_slots(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            self._release_due()
            with self._lock:
                if not self._queued:
                    self._watch = None
                    return
