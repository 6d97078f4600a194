"""kopf's "every index is populated" gate, without waking every waiter at every new object.

kopf holds each object's handlers until the indexes of every resource are populated: a set of toggles
(``ToggleSet(all)``), one per object not indexed yet, which every object's worker waits on. kopf 1.45
notifies *all* waiters each time a toggle is added or dropped, and each wakes to re-check the whole
set: with thousands of objects arriving at once (2,003 nodes, 1,000 models, their Deployments and
pods) that was a quarter of the operator's CPU while a fleet was created (py-spy: ``make_toggle`` →
``Condition.notify_all``), time the event loop did not spend on the models.

A waiter of the set waits for the set's state (on or off); adding or dropping one toggle only matters
to it when that state changes. :func:`install` makes kopf's ``ToggleSet.make_toggle`` and
``drop_toggle`` notify only then (the toggles themselves, and everything else, are kopf's own). It
checks the class has what it replaces, and leaves kopf alone otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["install"]

#: Set on the methods this module puts in place: installed once, whatever calls install() again.
MARK = "_loadline_notifies_on_change"


def install() -> bool:
    """Replace the two methods (once); False when this kopf's ``ToggleSet`` is not the one this was
    written for (then kopf's own are kept)."""
    try:
        from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet
    except ImportError:
        return False
    if getattr(ToggleSet.make_toggle, MARK, False):
        return True
    probe = ToggleSet(all)
    if not all(hasattr(probe, attr) for attr in ("_condition", "_toggles", "is_on")) or not all(
        hasattr(ToggleSet, method) for method in ("make_toggle", "drop_toggle", "drop_toggles")
    ):
        return False

    async def changed(gate: Any, change: Callable[[], None]) -> None:
        """``change`` the set's toggles; wake its waiters only when the set's state moved."""
        async with gate._condition:
            before = gate.is_on()
            change()
            if gate.is_on() != before:
                gate._condition.notify_all()

    async def make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> Any:
        toggle = Toggle(__val, name=name, condition=self._condition)
        await changed(self, lambda: self._toggles.add(toggle))
        return toggle

    async def drop_toggle(self: Any, toggle: Any) -> None:
        await changed(self, lambda: self._toggles.discard(toggle))

    async def drop_toggles(self: Any, toggles: Any) -> None:
        await changed(self, lambda: self._toggles.difference_update(toggles))

    for method in (make_toggle, drop_toggle, drop_toggles):
        setattr(method, MARK, True)
    ToggleSet.make_toggle = make_toggle  # type: ignore[method-assign]
    ToggleSet.drop_toggle = drop_toggle  # type: ignore[method-assign]
    ToggleSet.drop_toggles = drop_toggles  # type: ignore[method-assign]
    return True
