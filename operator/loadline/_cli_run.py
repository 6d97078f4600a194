"""``loadline run``: start the operator (kopf) with the handlers in :mod:`loadline.handlers._registry`.

kopf always runs standalone: it never peers with other replicas. Without leader election
(``LOADLINE_LEADER_ELECTION`` unset or false: one replica, local runs, tests) kopf starts at once.

With leader election on (the Helm chart, two replicas) the process first stands by on the Lease
(:class:`loadline.handlers._election.LeaderElector`), answering ``/healthz`` with ``standby`` so the
kubelet's liveness probe leaves it alone. Once it holds the Lease it closes that server and starts kopf,
which serves ``/healthz`` from then on, while a thread renews the Lease. Then either:

* the Lease is lost (not renewed within the renew deadline, or someone else holds it): kopf is stopped
  and the process exits with status 1, so the kubelet restarts it and it stands by again, the
  controller-runtime convention. Should kopf not stop before a standby may take the Lease, the process
  exits anyway, so two replicas never reconcile at once;
* SIGTERM or SIGINT (a rolling update, a drain, Ctrl-C): kopf stops, the handler threads finish, and
  then the Lease is released (an empty holder), so the standby takes over on its next read instead of
  waiting for the Lease to expire. Exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVarTuple, Unpack

from loadline.sharding import ShardAssignment

if TYPE_CHECKING:
    from loadline.settings import OperatorSettings

_PR_SET_PDEATHSIG = 1  # linux/prctl.h

EXIT_LOST = 1
"""Exit status after losing the Lease: the kubelet restarts the container, which then stands by."""

log = logging.getLogger("loadline.election")
_Ts = TypeVarTuple("_Ts")


class RoutineSuccesses(logging.Filter):
    """Leaves out kopf's "Timer 'x' succeeded." / "Handler 'x' succeeded." for its timers and the
    handlers of watch events (pods, Deployments, the models' own events). They were 99 % of the
    operator's log in a storm of 1,000 crashes (58,000 lines in four minutes: the readiness timer
    alone 25 per crash), and formatting and writing them a few percent of its CPU, while they say only
    that nothing failed. A failure is still logged, as is everything the handlers themselves say, and
    reconcile's outcomes (kopf's handlers of changes, which kopf posts as Events too); ``--verbose``
    keeps every line.

    Told by where the record comes from, not by its text: an INFO record whose first caller outside
    the logging plumbing is kopf's own ``execute_handler_once``, for a handler of one of those kinds."""

    def __init__(self) -> None:
        super().__init__()
        from kopf._core.actions import execution, loggers
        from kopf._core.intents import handlers

        self._execute = execution.execute_handler_once.__code__
        self._plumbing = {logging.__file__, loggers.__file__}
        self._routine = (handlers.WatchingHandler, handlers.SpawningHandler)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename in self._plumbing:
            frame = frame.f_back
        if frame is None or frame.f_code is not self._execute:
            return True
        return not isinstance(frame.f_locals.get("handler"), self._routine)


def _configure_logging(verbose: bool, debug: bool) -> None:
    """kopf's logging, every object's lines naming it ("[namespace/name] ..."): one operator log serves
    every model; kopf's routine success lines left out unless ``--verbose``/``--debug``."""
    import kopf

    kopf.configure(verbose=verbose, debug=debug, log_prefix=True)
    if not (verbose or debug):
        logging.getLogger("kopf.objects").addFilter(RoutineSuccesses())


def _cmd_run(args: argparse.Namespace) -> int:
    if args.namespace:
        os.environ["LOADLINE_NAMESPACES"] = ",".join(args.namespace)
    import kopf

    from loadline import telemetry
    from loadline.handlers import _kube, _registry

    settings = _registry.SETTINGS.__class__()  # re-read env after the flags above
    _registry.SETTINGS.__dict__.update(settings.__dict__)
    _configure_logging(args.verbose, args.debug)
    liveness = f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None
    # /metrics from the start, for as long as the process lives: standbys serve it too
    # (loadline_leader_election_status says which replica leads), and a kopf run restarted with other
    # shards keeps the same counters.
    telemetry.serve(settings.metrics_port)
    # Before the first request (a sharded run checks the API server before kopf starts): the shared
    # client's pool is made once, with a connection per thread that may use it.
    _kube.set_pool_size(settings.api_connections)
    admission = _Admission.start(settings, args.verbose, args.debug) if settings.webhook_port else None
    try:
        if settings.shards > 1:
            return _run_sharded(settings, liveness)
        if settings.leader_election:
            return _run_elected(settings, liveness)
        namespaces = settings.namespace_list
        kopf.run(
            clusterwide=not namespaces, namespaces=namespaces, standalone=True, liveness_endpoint=liveness
        )
        return 0
    finally:
        if admission is not None:
            admission.stop()


class _Admission:
    """The admission webhooks: kopf with the ``ADMISSION`` registry in a process of its own, for the
    whole life of this one, on every replica (leader or standby), so a hand-over never leaves
    ``kubectl apply`` without an answer.

    A process, not a thread: validation plans the model (CPU), and in one process it shared the GIL
    with the reconcile threads; at fleet scale (1,000 models created back to back) applies were refused
    because the webhook did not answer within the API server's 10 s. Its answers' metrics are relayed
    to this process, which serves /metrics. It exits when this process dies (it watches its parent), as
    a container's processes all go together; if it stops unasked, this process stops too (the kubelet
    restarts the container)."""

    def __init__(self, settings: OperatorSettings, verbose: bool, debug: bool) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # no fork of a process with threads
        self._relay: Any = context.Queue()
        self._process = context.Process(
            target=_admission_process, args=(self._relay, os.getpid(), verbose, debug),
            name="loadline-admission", daemon=True,
        )  # fmt: skip
        self._stopping = False
        self._watcher = threading.Thread(target=self._watch, name="admission-watch", daemon=True)
        self._relayer = threading.Thread(target=self._relay_metrics, name="admission-metrics", daemon=True)

    @classmethod
    def start(cls, settings: OperatorSettings, verbose: bool = False, debug: bool = False) -> _Admission:
        from loadline.errors import SpecError

        for name in ("tls.crt", "tls.key"):
            if not (settings.webhook_cert_dir / name).is_file():
                raise SpecError(
                    "LOADLINE_WEBHOOK_CERT_DIR",
                    f"{settings.webhook_cert_dir} has no {name}",
                    "mount the webhook's certificate Secret there, or set LOADLINE_WEBHOOK_PORT=0",
                )
        admission = cls(settings, verbose, debug)
        admission._process.start()
        admission._watcher.start()
        admission._relayer.start()
        return admission

    def _watch(self) -> None:
        self._process.join()
        if not self._stopping:
            log.error(
                "the admission webhooks stopped unasked (exit %s): stopping the operator",
                self._process.exitcode,
            )
            os.kill(os.getpid(), signal.SIGTERM)

    def _relay_metrics(self) -> None:
        from loadline import telemetry

        while True:
            item = self._relay.get()
            if item is None:
                return
            telemetry.record_admission(*item)

    def stop(self, timeout: float = 10) -> None:
        self._stopping = True
        if self._process.is_alive():
            self._process.terminate()  # SIGTERM: kopf stops its server
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        self._relay.put(None)
        self._relayer.join(timeout)


def _admission_process(relay: Any, parent: int, verbose: bool, debug: bool) -> None:
    """The admission process's main: kopf with the ADMISSION registry until SIGTERM or the parent dies."""
    import kopf

    from loadline.handlers import _registry

    _configure_logging(verbose, debug)
    # Die with the parent at once, as a container's processes do (SIGKILL of the operator's process
    # must not leave a webhook server that answers for a moment and then cuts the API server off).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)

    def orphaned() -> None:  # where prctl is not there (not Linux)
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=orphaned, name="parent-watch", daemon=True).start()

    def record(webhook: str, result: str, seconds: float) -> None:
        relay.put((webhook, result, seconds))  # to the process serving /metrics

    kopf.run(
        registry=_registry.ADMISSION,
        settings=kopf.OperatorSettings(),
        clusterwide=True,
        standalone=True,
        memo=kopf.Memo(record_admission=record),
    )


class _Signals:
    """While installed, SIGTERM and SIGINT only set ``flag`` (and record which came first), so that
    every stop goes through the same orderly path: stop kopf, finish handlers, release the Lease."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag
        self.received: str | None = None
        self._previous: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int | None] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
        self.flag.set()

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()


class _RelayingLoop(asyncio.SelectorEventLoop):
    """An event loop whose signal handlers also raise ``stop``.

    kopf installs SIGTERM/SIGINT handlers on its loop and stops through them, but while a threading.Event
    stop flag stays unset, its waiter on that flag cannot finish and kopf 1.45 waits 5 s for it before
    cancelling; the standby would get the Lease that much later. Raising the flag with the signal makes
    kopf's stop as quick as a stop by flag."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__()
        self._stop = stop

    def add_signal_handler(self, sig: int, callback: Callable[[Unpack[_Ts]], object], *args: *_Ts) -> None:
        def relay(*received: *_Ts) -> None:
            self._stop.set()
            callback(*received)

        super().add_signal_handler(sig, relay, *args)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does on the way out: cancel leftovers, close generators and the default
    executor (where kopf waits on a threading.Event stop flag, set before this), then close."""
    try:
        leftovers = asyncio.all_tasks(loop)
        for task in leftovers:
            task.cancel()
        if leftovers:
            loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()


def _exit_now(grace: int) -> None:
    log.error("kopf did not stop within %d s of losing the lease: exiting now", grace)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_LOST)


class _LossWatchdog:
    """What losing a Lease does, for the elected and the sharded paths: raise ``lost`` and ``stop``,
    and exit the process should kopf not stop in time. A standby may take the Lease lease_duration
    after our last renewal, and the loss is seen at the renew deadline: kopf gets what is left (less a
    second) to stop."""

    def __init__(self, settings: OperatorSettings, stop: threading.Event, lost: threading.Event) -> None:
        grace = max(1, settings.lease_duration_seconds - settings.renew_deadline_seconds - 1)
        self._timer = threading.Timer(grace, _exit_now, args=(grace,))
        self._timer.daemon = True
        self._stop, self._lost = stop, lost

    def on_lost(self, _reason: str) -> None:
        self._lost.set()
        self._stop.set()
        self._timer.start()

    def cancel(self) -> None:
        """kopf stopped in time."""
        self._timer.cancel()


def _run_kopf(
    settings: OperatorSettings,
    stop: threading.Event,
    stop_flag: threading.Event,
    liveness: str | None,
    signals: _Signals,
    shards: ShardAssignment | None = None,
) -> None:
    """Run the reconciling kopf until ``stop_flag`` (a signal sets ``stop``, and the caller relays it to
    ``stop_flag``), then wait for its handler threads: nothing may still write once this returns.
    ``shards``: the models this run reconciles (all, when None), handed to its handlers in kopf's memo."""
    import kopf

    kopf_settings = kopf.OperatorSettings()
    namespaces = settings.namespace_list
    # A loop of our own rather than asyncio.run inside kopf.run: kopf waits on a threading.Event
    # stop flag in the loop's default executor, and asyncio.run would join that thread forever when
    # kopf stops for another reason (an error). Here the flag is set before the loop is closed.
    loop = _RelayingLoop(stop)
    try:
        kopf.run(
            loop=loop,
            settings=kopf_settings,
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            stop_flag=stop_flag,
            liveness_endpoint=liveness,
            memo=kopf.Memo(shards=shards or ShardAssignment()),
        )
    finally:
        stop_flag.set()
        _close_loop(loop)
        signals.install()  # closing kopf's loop reset SIGTERM/SIGINT to their defaults
        # Handler threads outlive kopf.run; a standby or a wider run must not start while one writes.
        kopf_settings.execution.executor.shutdown(wait=True, cancel_futures=True)


def _run_elected(settings: OperatorSettings, liveness: str | None) -> int:
    """Stand by until this replica holds the Lease, then run kopf until a signal or the Lease is lost."""

    from loadline.handlers._election import LeaderElector, StandbyHealth

    elector = LeaderElector.from_settings(settings)  # a SpecError when the Lease's namespace is unknown
    stop = threading.Event()  # set by SIGTERM/SIGINT, or when the Lease is lost; kopf's stop flag
    lost = threading.Event()
    signals = _Signals(stop)
    signals.install()
    try:
        health = StandbyHealth(settings.liveness_port) if settings.liveness_port else None
        try:
            leading = elector.acquire(stop)
        finally:
            if health is not None:
                health.close()  # kopf serves /healthz on this port from now on
        if not leading or stop.is_set():
            log.info("standby: stopping on %s", signals.received or "request")
            if leading:
                elector.release()
            return 0

        watchdog = _LossWatchdog(settings, stop, lost)
        elector.start_renewing(watchdog.on_lost)
        try:
            _run_kopf(settings, stop, stop, liveness, signals)
        finally:
            watchdog.cancel()
            if not lost.is_set():
                elector.release()
        return EXIT_LOST if lost.is_set() else 0
    finally:
        signals.restore()


def _run_sharded(settings: OperatorSettings, liveness: str | None) -> int:
    """Own shards of the InferenceModels (``settings.shards``, one Lease each) and reconcile theirs.

    Stands by (``/healthz``: standby) until the keeper holds a shard, then runs kopf watching the
    owned shards' models only. When the keeper claims more (a dead replica's shard, after its Lease
    expired), kopf is stopped and started again with the wider selector; the models of the new shard
    are resumed like after any restart. When another replica asks for a shard this one holds beyond
    its share (it came back after the take-over), kopf is stopped, the shard's Lease released and kopf
    started again with the narrower selector. A shard lost is handled as a lost Lease: kopf stops, the
    process exits 1 (the kubelet restarts it, and it claims again)."""

    from loadline.handlers import _shards
    from loadline.handlers._election import StandbyHealth

    _shards.check_server(settings, settings.shards)  # a SpecError: the API server would not shard
    stop = threading.Event()  # SIGTERM/SIGINT, or a shard lost
    lost = threading.Event()
    grew = threading.Event()
    surplus: list[frozenset[int]] = []  # shards asked for by others, to hand over once kopf stopped
    changed = threading.Event()  # more shards held, or some to hand over: restart kopf
    signals = _Signals(stop)
    signals.install()
    watchdog = _LossWatchdog(settings, stop, lost)

    def on_surplus(indices: frozenset[int]) -> None:
        surplus.append(indices)
        changed.set()

    def on_grew(_held: frozenset[int]) -> None:
        grew.set()
        changed.set()

    keeper = _shards.ShardKeeper(settings, on_grew=on_grew, on_lost=watchdog.on_lost, on_surplus=on_surplus)
    try:
        health = StandbyHealth(settings.liveness_port) if settings.liveness_port else None
        keeper.start()
        try:
            while not (stop.is_set() or keeper.held):
                grew.wait(0.5)
        finally:
            if health is not None:
                health.close()  # kopf serves /healthz on this port from now on
        while not stop.is_set():
            changed.clear()
            while surplus:  # kopf is stopped: nothing of these shards is being reconciled now
                keeper.hand_over(surplus.pop())
            shards = ShardAssignment(settings.shards, keeper.held)
            log.info(
                "reconciling shards %s of %d: %s",
                ",".join(str(i) for i in sorted(shards.owned)), settings.shards, shards.watch_selector(),
            )  # fmt: skip
            # kopf's stop flag for this run: set on a signal, a loss, more shards held or some to hand over.
            run_stop = threading.Event()

            def relay(run_stop: threading.Event = run_stop) -> None:
                while not run_stop.is_set():
                    if stop.wait(0.25) or changed.is_set():
                        run_stop.set()

            relay_thread = threading.Thread(target=relay, name="shard-relay", daemon=True)
            relay_thread.start()
            try:
                _run_kopf(settings, stop, run_stop, liveness, signals, shards)
            finally:
                run_stop.set()
                relay_thread.join()
        watchdog.cancel()
        if lost.is_set():
            keeper.stop_renewing()
            return EXIT_LOST
        keeper.release()
        return 0
    finally:
        keeper.stop()
        signals.restore()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the operator against the current kubeconfig or in-cluster config")
    run.add_argument("--namespace", "-n", action="append", help="watch only this namespace (repeatable)")
    # Accepted so that existing command lines keep working; kopf never peers now, and whether replicas
    # elect a leader is LOADLINE_LEADER_ELECTION's to say.
    run.add_argument("--standalone", action="store_true", help=argparse.SUPPRESS)
    run.add_argument("--verbose", action="store_true")
    run.add_argument("--debug", action="store_true")
    run.set_defaults(func=_cmd_run)
