"""kopf's index gate (a set of toggles every object's worker waits on) wakes its waiters only when the
set's state changes, not at every object added or dropped (loadline.handlers._toggles)."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits.aiotoggles import ToggleSet

from loadline.handlers import _toggles


def gate_run(objects: int, waiters: int) -> tuple[int, list[bool]]:
    """``objects`` arrive one by one (a toggle each, as kopf's watcher makes them) while ``waiters``
    indexed objects wait for the whole set; then every object is indexed (its toggle dropped).
    Returns how often the waiters re-checked the set, and whether each got through."""

    async def main() -> tuple[int, list[bool]]:
        gate = ToggleSet(all)
        checks = [0]
        original = gate.is_on

        def counted() -> bool:
            checks[0] += 1
            return original()

        gate.is_on = counted  # type: ignore[method-assign]
        first = await gate.make_toggle(name="first")
        done = [False] * waiters

        async def wait(i: int) -> None:
            await gate.wait_for(True)
            done[i] = True

        tasks = [asyncio.create_task(wait(i)) for i in range(waiters)]
        await asyncio.sleep(0)
        toggles = [await gate.make_toggle(name=str(n)) for n in range(objects)]
        for toggle in toggles:
            await gate.drop_toggle(toggle)
            await asyncio.sleep(0)
        assert not any(done)  # the first object is not indexed yet: nobody passes
        await gate.drop_toggle(first)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
        return checks[0], done

    return asyncio.run(main())


def test_waiters_pass_once_every_object_is_indexed_and_are_not_woken_before() -> None:
    from kopf._cogs.aiokits.aiotoggles import ToggleSet

    assert _toggles.install()
    installed = ToggleSet.make_toggle
    assert _toggles.install() and ToggleSet.make_toggle is installed  # each kopf run calls it: once
    checks, done = gate_run(objects=300, waiters=300)
    assert all(done)
    # Each add and drop checks the set twice; each waiter checks it when it starts and when woken at the
    # end. kopf's own methods woke all 300 waiters at each of the 600 changes (~180,000 checks).
    assert checks <= 2 * (2 * 300 + 2) + 2 * 300 + 10, checks
