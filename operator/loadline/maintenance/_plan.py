"""When to restart one model's pods: now, in its next quiet window, or earlier because a crash is coming.

The rules, in order (docs/restarts.md says the same for platform teams):

1. **Nothing pending**: idle; the record shows the next window.
2. **A restart is running** (persisted ``Running``): go on with it. A hand-over resumes it; the pods
   already newer than its start are not restarted again.
3. **Cool-down**: never two restarts of one model within it. An action that would run inside it is
   refused until it ends; a window is chosen only after it.
4. **Crash loop**: act now. The model is not serving, so waiting spares no one; windows and the
   policies' restart slots do not hold it back (it still takes a slot while it runs).
5. **A persisted schedule is kept** while it still holds: inside every policy's windows, after the
   cool-down, before a predicted crash, and its window not yet over. Re-learning the windows every
   reconcile therefore never moves a restart, and an operator restart or hand-over finds the same time.
6. **A predicted out-of-memory crash before the restart would be done** moves it earlier: to the
   quietest slot (by the learned weekday profile) that ends before the predicted time, inside the
   policy windows; with no room left before the crash, at once.
7. **Otherwise the next window**: the first learned window (or policy or default window, as
   :func:`loadline.windows.plan_windows` chose) that lies inside every governing policy's windows and
   starts after the cool-down; failing that, the first time every policy allows.
8. **Due**: act, unless a governing policy's ``maxConcurrent`` restart slots are all held by other
   models: then wait for a slot (until the window ends, after which rule 7 picks the next one).

Everything is computed in UTC; local time appears only in the sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from loadline.maintenance._allowed import PolicySet, allowed_intervals, first_fit, fits
from loadline.maintenance._errors import MaintenanceInputError
from loadline.maintenance._forecast import quietest_start
from loadline.maintenance._model import (
    Action,
    LoadSlot,
    MaintenanceDecision,
    MaintenanceRecord,
    RestartLock,
    Trigger,
)
from loadline.risk import OOMRiskEstimate
from loadline.windows import PolicyWindowError, Window, parse_timezone

__all__ = ["finish_maintenance", "plan_maintenance"]

_WORDS = {"restart": "restart of the pods", "remediation": "roll-out of the remediation"}


def _utc(moment: datetime, name: str) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise MaintenanceInputError(
            name, "is a naive datetime", "pass an aware datetime, e.g. datetime.now(UTC)"
        )
    return moment.astimezone(UTC)


def _merge(new: Action | None, old: Action | None) -> Action | None:
    """A remediation rolls every pod, so it covers a pending plain restart."""
    if new is None or old is None:
        return new or old
    return "remediation" if "remediation" in (new, old) else "restart"


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class _Planner:
    """One decision's inputs, normalised, and the sentences it writes."""

    def __init__(
        self,
        *,
        model: str,
        now: datetime,
        zone: ZoneInfo,
        duration: timedelta,
        persisted: MaintenanceRecord,
        action: Action,
        cooldown_end: datetime | None,
        locks: Sequence[RestartLock],
        allowed: list[tuple[float, float]] | None,
        given: MaintenanceRecord | None,
    ) -> None:
        self.model = model
        self.now = now
        self.zone = zone
        self.duration = duration
        self.span = duration.total_seconds()
        self.persisted = persisted
        self.action = action
        self.cooldown_end = cooldown_end
        self.earliest = cooldown_end or now
        self.locks = locks
        #: The policies' allowed intervals (None: no policy limits the time).
        self.allowed = allowed
        #: The record as the caller gave it (None: none): a decision says whether it changes it.
        self.given = given
        #: Why an earlier schedule was given up, said before the new decision's reason.
        self.notes: list[str] = []

    def local(self, moment: datetime) -> str:
        return f"{moment.astimezone(self.zone):%a %Y-%m-%d %H:%M %Z}"

    @property
    def what(self) -> str:
        return _WORDS[self.action]

    def decision(
        self,
        kind: str,
        at: datetime | None,
        reason: str,
        *,
        state: str,
        trigger: Trigger | None,
        window: tuple[datetime, datetime] | None,
        scheduled_at: datetime | None,
        started_at: datetime | None = None,
    ) -> MaintenanceDecision:
        record = MaintenanceRecord(
            action=self.action,
            state=state,  # type: ignore[arg-type]
            trigger=trigger,
            window_start=window[0] if window else None,
            window_end=window[1] if window else None,
            scheduled_at=scheduled_at,
            started_at=started_at,
            last_restart_at=self.persisted.last_restart_at,
            reason=reason,
        )
        return MaintenanceDecision(kind, at, reason, record, record != self.persisted)  # type: ignore[arg-type]

    def cooling(self, why: str) -> MaintenanceDecision:
        assert self.cooldown_end is not None
        last = self.persisted.last_restart_at
        reason = (
            f"{why}, but the last restart ({self.local(last) if last else 'recent'}) is within the "
            f"cool-down: not before {self.local(self.cooldown_end)}."
        )
        return self.decision(
            "cooldown",
            self.cooldown_end,
            reason,
            state="CoolingDown",
            trigger=None,
            window=None,
            scheduled_at=None,
        )

    def due(
        self, trigger: Trigger, window: tuple[datetime, datetime] | None, scheduled: datetime, why: str
    ) -> MaintenanceDecision:
        """Time to act: start, unless every restart slot of a governing policy is taken."""
        for lock in self.locks:
            others = sorted(lock.holders - {self.model})
            if len(others) >= lock.max_concurrent:
                reason = (
                    f"{why}; due, but FleetPolicy {lock.policy} allows {lock.max_concurrent} restart"
                    f"{'s' if lock.max_concurrent != 1 else ''} at once and {', '.join(others)} "
                    f"{'is' if len(others) == 1 else 'are'} restarting: waiting for a slot."
                )
                return self.decision(
                    "wait_lock",
                    self.now,
                    reason,
                    state="WaitingForLock",
                    trigger=trigger,
                    window=window,
                    scheduled_at=scheduled,
                )
        return self.decision(
            "act",
            self.now,
            f"{why}; starting the {self.what} now.",
            state="Running",
            trigger=trigger,
            window=window,
            scheduled_at=scheduled,
            started_at=self.now,
        )

    def at_time(
        self, trigger: Trigger, window: tuple[datetime, datetime] | None, start: datetime, why: str
    ) -> MaintenanceDecision:
        if start <= self.now:
            return self.due(trigger, window, start, why)
        return self.decision(
            "schedule",
            start,
            f"{why}: the {self.what} is scheduled for {self.local(start)}.",
            state="Scheduled",
            trigger=trigger,
            window=window,
            scheduled_at=start,
        )

    def keep(self, record: MaintenanceRecord, kind: str, at: datetime) -> MaintenanceDecision:
        """The persisted record goes on as it is (``record``: it, with the pending action)."""
        return MaintenanceDecision(kind, at, record.reason, record, record != self.given)  # type: ignore[arg-type]

    def because(self, text: str) -> str:
        return "; ".join([*self.notes, text])

    def crash_loop(self) -> MaintenanceDecision:
        """Rules 3 and 4: act now, unless the cool-down forbids it."""
        if self.cooldown_end is not None:
            return self.cooling("the model is crash-looping")
        why = (
            "the model is crash-looping: it is not serving, so waiting for a window spares no one "
            "(windows and restart slots do not apply)"
        )
        return self.decision(
            "act",
            self.now,
            f"{why}; starting the {self.what} now.",
            state="Running",
            trigger="crashLoop",
            window=None,
            scheduled_at=self.now,
            started_at=self.now,
        )

    def predicted(self, risk: OOMRiskEstimate | None) -> tuple[datetime | None, str]:
        """When an out-of-memory crash is predicted (None: none is), and the sentence that says so."""
        deadline = risk.predicted_at.astimezone(UTC) if risk is not None and risk.predicted_at else None
        crash = f"an out-of-memory crash is predicted {self.local(deadline)}" if deadline else ""
        if deadline is not None and risk is not None and risk.deciding is not None:
            crash += f" ({risk.deciding.evidence.split(':')[0]})"
        return deadline, crash

    def kept_schedule(self, deadline: datetime | None, crash: str) -> MaintenanceDecision | None:
        """Rule 5: the persisted schedule while it holds; None, with a note saying why, when it does not."""
        prev = self.persisted
        if prev.state not in ("Scheduled", "WaitingForLock") or prev.scheduled_at is None:
            return None
        start = prev.scheduled_at.astimezone(UTC)
        window_end = (prev.window_end or start + self.duration).astimezone(UTC)
        window = (prev.window_start.astimezone(UTC) if prev.window_start else start, window_end)
        ts = start.timestamp()
        problems = []
        if self.now >= window_end:
            problems.append(f"its window ended at {self.local(window_end)}")
        if self.cooldown_end is not None and start < self.cooldown_end:
            problems.append("it falls within the cool-down of a later restart")
        if not fits(self.allowed, ts, ts + self.span):
            problems.append("the policy windows no longer allow it")
        if deadline is not None and start + self.duration > deadline:
            problems.append(f"{crash}, before it would be done")
        if not problems:
            if self.now < start:
                return self.keep(replace(prev, action=self.action), "schedule", start)
            return self.due(prev.trigger or "window", window, start, f"scheduled for {self.local(start)}")
        self.notes.append(f"rescheduled from {self.local(start)} because " + " and ".join(problems))
        return None

    def before_crash(
        self, deadline: datetime | None, crash: str, next_window: Window | None, forecast: Sequence[LoadSlot]
    ) -> MaintenanceDecision | None:
        """Rule 6: a predicted crash before the next window's restart would be done moves it earlier, to
        the quietest slot; None (with a note when no policy window allows one) otherwise."""
        if deadline is None or (next_window is not None and next_window.start + self.duration <= deadline):
            return None
        now, earliest, span, allowed = self.now, self.earliest, self.span, self.allowed
        latest = deadline.timestamp() - span
        if latest >= earliest.timestamp():
            slot = quietest_start(forecast, earliest.timestamp(), latest, span, allowed)
            if slot is not None:
                start_ts, load = slot
                quiet = (
                    f"the quietest slot before it (expected load {load:.2f} of a typical day's mean)"
                    if load is not None
                    else "as soon as allowed (no traffic history to find a quieter slot)"
                )
                window = (_at(start_ts), _at(start_ts + span))
                return self.at_time("oomRisk", window, _at(start_ts), self.because(f"{crash}: {quiet}"))
        elif self.cooldown_end is not None:
            return self.cooling(self.because(f"{crash}, sooner than a restart takes"))
        elif fits(allowed, now.timestamp(), now.timestamp()):
            window = (now, now + self.duration)
            return self.due("oomRisk", window, now, self.because(f"{crash}, sooner than a restart takes"))
        self.notes.append(f"{crash}, but the policy windows allow no restart before it")
        return None

    def in_next_window(self, next_window: Window | None, search: timedelta) -> MaintenanceDecision:
        """Rule 7: the next window that fits; failing that, the first time every policy allows."""
        if next_window is not None:
            start = next_window.start.astimezone(UTC)
            source = next_window.source
            trigger: Trigger = "policyWindow" if source == "policy" else "window"
            kind = {"learned": "learned low-traffic", "policy": "policy", "default": "default"}[source]
            window = (start, next_window.end.astimezone(UTC))
            return self.at_time(trigger, window, start, self.because(f"the next {kind} window"))
        earliest, span = self.earliest, self.span
        if self.allowed is not None:
            first = first_fit(self.allowed, earliest.timestamp(), span)
            if first is None:
                raise PolicyWindowError(
                    "spec.restarts.windows",
                    f"the governing FleetPolicies together allow no {self.duration} restart in the next "
                    f"{search.days} days",
                    "widen a policy's windows so that they overlap for the restart's length",
                )
            return self.at_time(
                "policyWindow",
                (_at(first), _at(first + span)),
                _at(first),
                self.because("no learned window fits the policy windows; the first time every policy allows"),
            )
        return self.at_time(
            "noWindow",
            (earliest, earliest + self.duration),
            earliest,
            self.because("no restart window is known"),
        )


def _check_lengths(duration: timedelta, cooldown: timedelta) -> None:
    if duration <= timedelta(0):
        raise MaintenanceInputError(
            "duration", f"{duration} is not positive", "pass the restart window length"
        )
    if cooldown < timedelta(0):
        raise MaintenanceInputError(
            "cooldown", f"{cooldown} is negative", "pass zero or a positive cool-down"
        )


def _restarted(
    persisted: MaintenanceRecord | None, last_restart: datetime | None, cooldown: timedelta, now: datetime
) -> tuple[MaintenanceRecord, datetime | None]:
    """The record with the latest restart known (its own or ``last_restart``), and the end of that
    restart's cool-down while it lasts (None once it is over)."""
    prev = persisted or MaintenanceRecord()
    lasts = [_utc(t, "last_restart") for t in (prev.last_restart_at, last_restart) if t is not None]
    last = max(lasts) if lasts else None
    prev = replace(prev, last_restart_at=last)
    cooldown_end = last + cooldown if last is not None and cooldown > timedelta(0) else None
    if cooldown_end is not None and cooldown_end <= now:
        cooldown_end = None
    return prev, cooldown_end


def _next_window(
    windows: Sequence[Window],
    earliest: datetime,
    allowed: list[tuple[float, float]] | None,
    duration: timedelta,
) -> Window | None:
    """The first of ``windows`` after ``earliest`` whose restart fits inside every policy's windows."""
    span = duration.total_seconds()
    coming = sorted(
        (
            w
            for w in windows
            if _utc(w.start, "windows[].start") >= earliest
            and fits(allowed, w.start.timestamp(), w.start.timestamp() + span)
        ),
        key=lambda w: w.start,
    )
    return coming[0] if coming else None


def _idle(
    prev: MaintenanceRecord, persisted: MaintenanceRecord | None, next_window: Window | None, zone: ZoneInfo
) -> MaintenanceDecision:
    """Rule 1: nothing pending; the record shows the next window."""
    window = (next_window.start.astimezone(UTC), next_window.end.astimezone(UTC)) if next_window else None
    reason = "nothing pending"
    if next_window is not None:
        reason += f"; the next window is {next_window.start.astimezone(zone):%a %Y-%m-%d %H:%M %Z}"
    record = replace(
        prev,
        state="Done" if prev.state == "Done" else "Idle",
        scheduled_at=None,
        window_start=window[0] if window else None,
        window_end=window[1] if window else None,
        reason=reason + ".",
    )
    return MaintenanceDecision("idle", None, record.reason, record, record != persisted)


def plan_maintenance(
    *,
    model: str,
    now: datetime,
    action: Action | None,
    windows: Sequence[Window],
    duration: timedelta,
    persisted: MaintenanceRecord | None = None,
    policy_windows: Sequence[PolicySet] = (),
    locks: Sequence[RestartLock] = (),
    last_restart: datetime | None = None,
    cooldown: timedelta = timedelta(0),
    crash_looping: bool = False,
    risk: OOMRiskEstimate | None = None,
    forecast: Sequence[LoadSlot] = (),
    timezone: str | ZoneInfo = "UTC",
    search: timedelta = timedelta(days=35),
) -> MaintenanceDecision:
    """Decide when to do ``action`` for ``model`` (``namespace/name``), by the rules in the module
    docstring; pure, and a function of ``persisted`` (what ``status.maintenance`` holds).

    ``windows``: the model's coming windows (:func:`loadline.windows.plan_windows`), each ``duration``
    long. ``policy_windows``: each governing policy's windows
    (:func:`loadline.policy.restart_window_sets`). ``locks``: the governing policies' ``maxConcurrent``
    and who restarts now (:func:`restart_locks`). ``last_restart``: when the pods last restarted for
    other reasons (e.g. a remediation's roll-out); the record's own ``last_restart_at`` counts too.
    ``risk``: the OOM-risk estimate; ``forecast``: expected load ahead (:func:`forecast_load`), for
    the quietest slot before a predicted crash. ``timezone``: the model's, for policy windows without
    one and for the sentences. ``action`` None with nothing persisted pending: idle, with the next
    window in the record. Raises :class:`MaintenanceInputError` for naive datetimes or a non-positive
    duration, :class:`loadline.windows.PolicyWindowError` when the policies allow no restart of that
    length within ``search``.
    """
    now = _utc(now, "now")
    _check_lengths(duration, cooldown)
    zone = parse_timezone(timezone)
    prev, cooldown_end = _restarted(persisted, last_restart, cooldown, now)
    allowed = allowed_intervals(policy_windows, zone, now - timedelta(days=1), now + search)
    next_window = _next_window(windows, cooldown_end or now, allowed, duration)
    pending = _merge(action, prev.action if prev.pending else None)
    if pending is None:
        return _idle(prev, persisted, next_window, zone)
    plan = _Planner(
        model=model,
        now=now,
        zone=zone,
        duration=duration,
        persisted=prev,
        action=pending,
        cooldown_end=cooldown_end,
        locks=locks,
        allowed=allowed,
        given=persisted,
    )
    # 2. A running restart goes on (it holds its slot; its start time says which pods are done).
    if prev.state == "Running" and prev.started_at is not None:
        return plan.keep(replace(prev, action=pending), "act", now)
    # 3./4. Crash loop: now, unless the cool-down forbids it.
    if crash_looping:
        return plan.crash_loop()
    deadline, crash = plan.predicted(risk)
    # 5. Keep a persisted schedule while it holds; 6. earlier for a predicted crash; 7. the next window.
    return (
        plan.kept_schedule(deadline, crash)
        or plan.before_crash(deadline, crash, next_window, forecast)
        or plan.in_next_window(next_window, search)
    )


def finish_maintenance(record: MaintenanceRecord, now: datetime) -> MaintenanceRecord:
    """The record once the roll-out is done (:func:`plan_rollout` says ``done``): state Done, the
    cool-down counting from ``now``, the restart slot released."""
    now = _utc(now, "now")
    started = record.started_at
    reason = f"{_WORDS.get(record.action or 'restart', 'restart')} done" + (
        f" (started {started:%Y-%m-%d %H:%M} UTC)." if started else "."
    )
    return replace(record, state="Done", last_restart_at=now, scheduled_at=None, reason=reason)
