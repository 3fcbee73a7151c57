"""The one-shot waiters under every fan-out wait: a wake is never lost."""

from __future__ import annotations

import anyio
import pytest

from wool_pooling._backend import current_loop

pytestmark = pytest.mark.anyio


async def test_a_wait_after_the_wake_returns_at_once() -> None:
    waiters = current_loop().waiters()
    waiters.wake()
    with anyio.fail_after(5):
        await waiters.wait()
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


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_parking_wakes_the_task_parked_there_each_time_and_no_other() -> None:
    """trio's parking (a pump between pulls): reusable; a wake reaches only
    a task parked then; a cancelled wait leaves it empty."""
    loop = current_loop()
    parking = loop.parking()
    parking.wake()  # nobody parked: nothing happens, nothing is kept
    rounds: list[int] = []

    async def park() -> None:
        for index in range(3):
            await parking.wait()
            rounds.append(index)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(park)
            for index in range(3):
                await anyio.wait_all_tasks_blocked()
                assert rounds == list(range(index))
                parking.wake()
                parking.wake()  # the task is no longer parked: nothing
        with anyio.CancelScope() as scope:
            scope.cancel()
            await parking.wait()
        assert scope.cancelled_caught
        parking.wake()  # the cancelled wait left nobody to reschedule
    assert rounds == [0, 1, 2]
