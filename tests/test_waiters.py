"""The one-shot waiters under every fan-out wait: a wake is never lost."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from wool_pooling._core.backend import current_loop

pytestmark = pytest.mark.anyio


async def test_a_wait_after_the_wake_returns_at_once() -> None:
    waiters = current_loop().waiters()
    waiters.wake()
    with anyio.fail_after(5):
        await waiters.wait()
        await waiters.wait()


async def test_a_wait_woken_before_it_is_withdrawn_stays_woken() -> None:
    """Withdrawing a wait the wake reached first (its task cancelled after the
    wake) raises nothing, and a wait after it still returns at once."""
    waiters = current_loop().waiters()
    waiting = waiters.wait()
    waiters.wake()
    waiters.withdraw(waiting)
    with anyio.fail_after(5):
        await waiting
        await waiters.wait()


async def test_wake_releases_every_waiter_and_a_cancelled_one_is_withdrawn() -> None:
    waiters = current_loop().waiters()
    woken: list[int] = []

    async def wait(index: int) -> None:
        await waiters.wait()
        woken.append(index)

    withdrawn = anyio.CancelScope()

    async def cancelled() -> None:
        with withdrawn:
            await waiters.wait()
            woken.append(-1)

    async with anyio.create_task_group() as group:
        group.start_soon(wait, 0)
        group.start_soon(cancelled)
        group.start_soon(wait, 1)
        await anyio.wait_all_tasks_blocked()
        withdrawn.cancel()
        await anyio.wait_all_tasks_blocked()
        assert woken == []
        waiters.wake()
    assert sorted(woken) == [0, 1]


async def test_an_interruptible_region_takes_back_only_its_own_cancellation() -> None:
    """``cancel()`` from another task interrupts what the region awaits, once,
    and the region exits quietly; awaits after it are not cancelled; a
    cancellation from elsewhere goes through the region."""
    loop = current_loop()
    outcome: list[str] = []
    entered = anyio.Event()
    region = loop.interruptible()

    async def inside() -> None:
        with region:
            entered.set()
            try:
                await anyio.sleep_forever()
            finally:
                outcome.append("interrupted")
        await anyio.lowlevel.checkpoint()  # not cancelled any more
        outcome.append("after")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(inside)
            await entered.wait()
            await anyio.wait_all_tasks_blocked()
            region.cancel()
        assert outcome == ["interrupted", "after"]

        other = loop.interruptible()
        with anyio.CancelScope() as outer:
            with other:
                outer.cancel()
                await anyio.sleep_forever()
        assert outer.cancelled_caught
