"""Lanes: bounded thread pools of their own for the handlers whose latency users feel.

kopf runs every synchronous handler in one thread pool (``settings.execution``), first come first
served. At fleet scale that pool is full of routine work (a thousand Deployments' events, readiness
timers, status follow-ups) exactly when it matters that a new model or a crash is handled at once. The
handlers that wait on the network are therefore ``async`` (kopf awaits them on its event loop) and hop
to a lane of their own: a bounded pool, so their concurrency is bounded too, and a queue nobody else
stands in. What needs no network (is a crash new, is a readiness check due) is decided on the event
loop first, and only the work that reads or writes the cluster takes a thread.

The three lanes of a kopf run are one :class:`Lanes`, in the run's state (``OperatorState.lanes``),
sized from the settings when the run starts and shut down, waiting for their work, when it stops:

- ``models``: reconciling an InferenceModel (create, update, resume), and rolling out a crash's
  remediation (submitted by the crash's handler, which does not wait for it; under the model's lock,
  as reconcile is).
- ``crashes``: handling a container crash (classify, remediate).
- ``checks``: a due readiness look of a Deploying model (its timer ticks on the event loop).
- everything else: kopf's own pool.

The time each call waited for a thread is ``loadline_lane_wait_seconds{lane}``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from prometheus_client import Histogram

__all__ = ["LANE_WAIT", "Lane", "Lanes"]

P = ParamSpec("P")
T = TypeVar("T")

LANE_WAIT = Histogram(
    "loadline_lane_wait_seconds",
    "Time a handler waited for a thread of its lane (models, crashes, checks).",
    ["lane"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


class Lane:
    """A named, bounded pool of ``workers`` threads, made on first use."""

    def __init__(self, name: str, workers: int) -> None:
        self.name = name
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def shutdown(self, wait: bool) -> None:
        """Stop taking work; with ``wait``, return once the work taken is done."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=f"lane-{self.name}")
            return self._pool

    def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Callable[[], T]:
        """``fn(*args, **kwargs)`` bound to the caller's context (kopf's per-handler context variables,
        such as its logger's object, go along, as for kopf's own sync handlers), observing the time it
        waits for a thread."""
        context = contextvars.copy_context()
        queued = time.monotonic()

        def call() -> T:
            LANE_WAIT.labels(self.name).observe(time.monotonic() - queued)
            return context.run(functools.partial(fn, *args, **kwargs))

        return call

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a thread of this lane, in the caller's context."""
        call = self._call(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor(), call)

    def submit(self, fn: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> Future[object]:
        """``fn(*args, **kwargs)`` on a thread of this lane, asked from any thread and not waited for
        (a handler that must not hold its own lane's thread while the work runs); in the caller's
        context, and an exception it raises is logged."""
        future = self._executor().submit(self._call(fn, *args, **kwargs))
        future.add_done_callback(_log_failure)
        return future


def _log_failure(future: Future[object]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logging.getLogger(__name__).error("lane work failed", exc_info=future.exception())


@dataclass(frozen=True)
class Lanes:
    """The lanes of one kopf run (the module's docstring says which work takes which)."""

    models: Lane
    crashes: Lane
    checks: Lane

    @classmethod
    def sized(cls, max_workers: int) -> Lanes:
        """As many threads as kopf's pool for models and crashes, a quarter for readiness looks."""
        return cls(
            Lane("models", max_workers),
            Lane("crashes", max_workers),
            Lane("checks", max(1, max_workers // 4)),
        )

    def shutdown(self, wait: bool = True) -> None:
        """Stop the three lanes; with ``wait``, once nothing taken is still running (nothing of this run
        writes after it)."""
        for lane in (self.models, self.crashes, self.checks):
            lane.shutdown(wait)
