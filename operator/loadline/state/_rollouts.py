"""The coordination of a crash's roll-out with reconcile, within one operator process."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from loadline.state._keys import ModelKey
from loadline.status import read_status

#: How long a remediation being rolled out makes reconcile pass over versions of the model written
#: before its decision (the decision's own version normally reaches the operator within seconds; one
#: that never comes, because the write failed, must not hold reconcile off for longer than this).
ROLL_OUT_GUARD_SECONDS = 60.0


class RollOuts:
    """The coordination of a crash's roll-out with reconcile.

    A guard per model whose remediation this process rolls out itself (the crash, since when): reconcile
    passes over versions of the model that do not carry that decision yet. And one lock per model, held
    by reconcile from its guard check through its last apply and by a crash's roll-out around its
    apply: a reconcile of an older version of the model that is already past its guard applies its
    workload before the roll-out does, never after (which would put the memory back)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expected: dict[ModelKey, tuple[str, float]] = {}
        #: The workload generation each in-flight remediation applied (None: not applied yet), and since.
        self._rolled: dict[ModelKey, tuple[int | None, float]] = {}
        self._locks: dict[ModelKey, threading.Lock] = {}

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def expect(self, namespace: str, name: str, crash: str) -> None:
        """Note, before its decision is written, that this process rolls out the remediation of
        ``crash`` itself."""
        with self._lock:
            self._expected[(namespace, name)] = (crash, time.monotonic())

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._expected.pop((namespace, name), None)
            self._rolled.pop((namespace, name), None)

    def rolling(self, namespace: str, name: str) -> None:
        """The decision of a remediation this process rolls out is being written: until its workload
        is applied, the workload that runs is the one that crashed."""
        with self._lock:
            self._rolled[(namespace, name)] = (None, time.monotonic())

    def applied(self, namespace: str, name: str, generation: int | None) -> None:
        """The remediation's workload is applied: it is this ``generation`` of the workload."""
        with self._lock:
            if (namespace, name) in self._rolled:
                self._rolled[(namespace, name)] = (generation, time.monotonic())

    def settled(self, namespace: str, name: str) -> None:
        """No workload of this process's is coming for the remediation (reconcile applies it)."""
        with self._lock:
            self._rolled.pop((namespace, name), None)

    def older_than_remediation(self, namespace: str, name: str, generation: int | None) -> bool:
        """Whether a workload of this ``generation`` predates the remediation this process rolls out
        for the model (its apply has not happened, or made a later generation), for
        :data:`ROLL_OUT_GUARD_SECONDS` at most: the crashed workload being available again says
        nothing about the fix. A workload of the applied generation or later ends the guard."""
        key = (namespace, name)
        with self._lock:
            found = self._rolled.get(key)
            if found is None:
                return False
            applied, since = found
            if time.monotonic() - since > ROLL_OUT_GUARD_SECONDS:
                del self._rolled[key]
                return False
            if applied is not None and (generation is None or generation >= applied):
                del self._rolled[key]
                return False
            return True

    def forget_model(self, namespace: str, name: str) -> None:
        """A deleted model's guard and lock go with it."""
        with self._lock:
            self._expected.pop((namespace, name), None)
            self._rolled.pop((namespace, name), None)
            self._locks.pop((namespace, name), None)

    def predates(self, body: Mapping[str, Any]) -> bool:
        """Whether ``body`` is a version of the model older than the decision of a remediation this
        process is rolling out: one whose ``status.remediation.handledCrashes`` lacks that crash, for
        :data:`ROLL_OUT_GUARD_SECONDS` at most. Reconciling it would put the memory back as it was, and
        roll the pods twice. A version carrying the decision ends the guard."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        with self._lock:
            found = self._expected.get(key)
            if found is None:
                return False
            crash, since = found
            remediation = read_status(body).remediation
            handled = [] if remediation is None else remediation.handled_crashes
            if crash in handled or time.monotonic() - since > ROLL_OUT_GUARD_SECONDS:
                del self._expected[key]
                return False
            return True
