"""The kopf settings loadline starts with, where kopf's defaults cost API writes at fleet scale."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest

from loadline.handlers import _registry
from loadline.handlers._state import OperatorState


def test_kopf_waits_for_its_own_patch_as_long_as_a_loaded_watch_lags(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's 5 s default made one model in three reconcile twice at 100 crashes at once (its own patch's
    watch event came 8.7 s late, and it handled the older event as current); and kopf's own INFO
    Events would be a write per handler run, which a resync must not make."""
    # The metrics endpoint is not what this checks: binding its real port (9464) failed the test
    # whenever another process on the machine held it (an operator of an e2e run).
    monkeypatch.setattr(_registry.telemetry, "serve", lambda port: None)
    settings = kopf.OperatorSettings()
    memo = kopf.Memo()
    _registry.configure(settings=settings, memo=memo)
    assert isinstance(memo["state"], OperatorState)  # the operator's memory, handed to every handler
    assert settings.persistence.consistency_timeout >= 30.0
    assert settings.posting.level == logging.WARNING


def _log_of_one_handler_run(kind: str, filtered: bool) -> list[str]:
    """What the operator's log says of one run of a handler through kopf's own execution: the handler
    says something itself, then kopf says it succeeded. ``kind``: ``watching`` (a watch event's
    handler, logged as kopf logs those: without a k8s Event), ``timer``, or ``changing`` (reconcile's)."""
    from kopf._cogs.structs import bodies, ephemera, ids, patches, references
    from kopf._core.actions import execution, loggers, progression
    from kopf._core.intents import causes, handlers

    from loadline._cli_run import RoutineSuccesses

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    objects = logging.getLogger("kopf.objects")
    collect, routine = Collect(), RoutineSuccesses()
    objects.addHandler(collect)
    level = objects.level
    objects.setLevel(logging.INFO)
    if filtered:
        objects.addFilter(routine)
    settings = kopf.OperatorSettings()
    body = bodies.Body({"metadata": {"namespace": "team-a", "name": "chat"}})
    logger_class = loggers.LocalObjectLogger if kind == "watching" else loggers.ObjectLogger
    cause = causes.WatchingCause(
        logger=logger_class(body=body, settings=settings), indices={}, memo=ephemera.Memo(),
        resource=references.Resource("loadline.dev", "v1alpha1", "inferencemodels"),
        patch=patches.Patch(), body=body, type="MODIFIED", event={"type": "MODIFIED", "object": {}},
    )  # fmt: skip

    def said(logger: logging.Logger, **_: object) -> None:
        logger.info("team-a/chat is Ready: 1/1 replicas available")

    common: dict[str, Any] = dict(
        id=ids.HandlerId("h"), fn=said, param=None, errors=None, timeout=None, retries=None, backoff=None,
        selector=None, labels=None, annotations=None, when=None, field=None, value=None,
    )  # fmt: skip
    handler: Any
    if kind == "watching":
        handler = handlers.WatchingHandler(**common)
    elif kind == "timer":
        handler = handlers.TimerHandler(
            **common, requires_finalizer=False, initial_delay=None, sharp=None, idle=None, interval=5
        )
    else:
        handler = handlers.ChangingHandler(
            **common, reason=None, initial=None, deleted=None, requires_finalizer=None, old=None, new=None,
            field_needs_change=None,
        )  # fmt: skip

    async def run() -> None:
        state = progression.State.from_scratch().with_handlers([handler])
        await execution.execute_handler_once(
            settings=settings, handler=handler, cause=cause, state=state[handler.id], lifecycle=None
        )

    try:
        asyncio.run(run())
    finally:
        objects.removeHandler(collect)
        objects.removeFilter(routine)
        objects.setLevel(level)
    return lines


def test_the_log_leaves_out_only_kopfs_routine_success_lines() -> None:
    """kopf logs "Handler 'x' succeeded." for every timer tick and watch event: 99 % of the log in a
    storm of 1,000 crashes. Those lines go; what a handler says itself stays, and so do the lines of
    kopf's handlers of changes (reconcile's), which operators and tests read."""
    said = "team-a/chat is Ready: 1/1 replicas available"
    assert _log_of_one_handler_run("watching", filtered=False) == [said, "Handler 'h' succeeded."]
    assert _log_of_one_handler_run("timer", filtered=False) == [said, "Timer 'h' succeeded."]
    assert _log_of_one_handler_run("watching", filtered=True) == [said]
    assert _log_of_one_handler_run("timer", filtered=True) == [said]
    assert _log_of_one_handler_run("changing", filtered=True) == [said, "Handler 'h' succeeded."]


def test_the_client_module_of_pod_logs_loads_at_start_up_not_at_a_bursts_first_log_read() -> None:
    """Loading the client's CoreV1Api takes about a second under the import lock; at a burst's first
    log read every other handler thread waited on it. The handlers' modules alone (what the admission
    process imports) do not load it; the operator's start-up does."""
    import subprocess
    import sys

    script = (
        "import sys, kopf\n"
        "from loadline.handlers import _registry\n"
        "name = 'kubernetes.client.api.core_v1_api'\n"
        "print(name in sys.modules)\n"
        "_registry.telemetry.serve = lambda port: None\n"
        "_registry.configure(settings=kopf.OperatorSettings(), memo=kopf.Memo())\n"
        "print(name in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
