"""A pull belongs to the fan-out, never to the consumer that asked for it.

Every pull runs in a task of its own (on asyncio with CPython 3.12+ its first
step runs eagerly, inside the consumer's call, but as that task). The source
must never see a consumer's task, must see one context for all its pulls,
and task-bound constructs inside a pull (timeouts, cancel scopes) must keep
working after the consumer that started the pull is cancelled.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest
from _stubs import WITH_UVLOOP
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream

from wool_pooling import Fanout

pytestmark = pytest.mark.anyio


@pytest.fixture(params=WITH_UVLOOP)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """asyncio, uvloop (when installed) and trio."""
    return request.param


TIMEOUT = 5


async def timed_source(
    receive: MemoryObjectReceiveStream[str], delay: float
) -> AsyncIterator[str]:
    """Each pull waits for an item, giving up after ``delay`` seconds."""
    while True:
        value = "timeout"
        with anyio.move_on_after(delay):
            value = await receive.receive()
        yield value


async def test_timeout_inside_a_pull_survives_cancelling_the_consumer() -> None:
    """A timeout entered by a pull fires for the pull, not the cancelled consumer."""
    send, receive = anyio.create_memory_object_stream[str](10)
    fanout = Fanout(timed_source(receive, 0.2))
    first, second = fanout.consumer(), fanout.consumer()
    # Warm the pump up so that the next pull starts inline on asyncio.
    await send.send("warm-up")
    with anyio.fail_after(TIMEOUT):
        assert await anext(first) == "warm-up"
        assert await anext(second) == "warm-up"
    finish = anyio.Event()
    outcome: dict[str, object] = {}

    async def consumer_task(*, task_status: TaskStatus[anyio.CancelScope]) -> None:
        with anyio.CancelScope() as scope:
            task_status.started(scope)
            outcome["first"] = await anext(first)
        outcome["cancelled"] = scope.cancelled_caught
        try:
            await finish.wait()  # a stray cancellation would land here
        except anyio.get_cancelled_exc_class():
            outcome["stray cancellation"] = True
            raise

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            scope = await tg.start(consumer_task)
            await anyio.wait_all_tasks_blocked()
            assert fanout.statistics().pulling
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert outcome == {"cancelled": True}
            assert await anext(second) == "timeout"
            finish.set()
    assert "stray cancellation" not in outcome
    await send.send("after")
    with anyio.fail_after(TIMEOUT):
        assert await anext(first) == "timeout"  # nothing lost for the cancelled one
        assert await anext(first) == "after"
        assert await anext(second) == "after"
    await fanout.aclose()


async def test_expired_deadline_inside_a_pull_is_honoured() -> None:
    """A pull whose cancel scope is already expired when it suspends still times out."""
    send, receive = anyio.create_memory_object_stream[str](10)
    fanout = Fanout(timed_source(receive, 0))
    consumer = fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        for _ in range(5):
            assert await anext(consumer) == "timeout"
    await send.send("value")
    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) in {"value", "timeout"}
    await fanout.aclose()
    send.close()


async def test_every_pull_runs_in_a_task_of_its_own_never_a_consumers() -> None:
    """Whichever consumer asked, the source's code runs in a task that is no
    consumer's, one pull at a time."""
    send, receive = anyio.create_memory_object_stream[int](100)
    seen_tasks: list[int] = []
    active = [0, 0]  # pulls in progress now, most ever

    async def source() -> AsyncIterator[int]:
        number = 0
        while True:
            active[0] += 1
            active[1] = max(active)
            seen_tasks.append(anyio.get_current_task().id)
            if number % 3 == 0:
                await receive.receive()  # every third pull suspends
            seen_tasks.append(anyio.get_current_task().id)
            active[0] -= 1
            yield number
            number += 1

    fanout = Fanout(source())
    consumer_tasks: set[int] = set()
    received: dict[str, list[int]] = {"a": [], "b": []}
    alive: list[object] = []  # keeps consumer tasks' ids from being reused

    async def consume(name: str) -> None:
        alive.append(anyio.get_current_task())
        consumer_tasks.add(anyio.get_current_task().id)
        consumer = fanout.consumer()
        while len(received[name]) < 12:
            received[name].append(await anext(consumer))

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, "a")
            tg.start_soon(consume, "b")
            for _ in range(4):
                await anyio.wait_all_tasks_blocked()
                await send.send(0)
    assert received["a"] == received["b"] == list(range(12))
    assert len(seen_tasks) >= 24
    assert not set(seen_tasks) & consumer_tasks
    assert active[1] == 1
    await fanout.aclose()


async def test_pulls_share_one_context() -> None:
    """A context variable the source sets in one pull is visible in the next."""
    var: contextvars.ContextVar[int] = contextvars.ContextVar("pulls", default=0)
    send, receive = anyio.create_memory_object_stream[int](100)

    async def source() -> AsyncIterator[int]:
        while True:
            var.set(var.get() + 1)
            if var.get() % 2 == 0:
                await receive.receive()
            yield var.get()

    fanout = Fanout(source())
    consumer = fanout.consumer()
    values: list[int] = []
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:

            async def feed() -> None:
                for _ in range(5):
                    await send.send(0)

            tg.start_soon(feed)
            for _ in range(10):
                values.append(await anext(consumer))
    assert values == list(range(1, 11))
    assert var.get() == 0  # the consumer's own context was never touched
    await fanout.aclose()


@pytest.mark.parametrize("cancel_at", range(9))
async def test_cancelling_at_any_pull_of_a_mixed_source_loses_nothing(
    cancel_at: int,
) -> None:
    """With pulls that sometimes suspend, cancelling the puller loses nothing."""
    send, receive = anyio.create_memory_object_stream[int](100)
    closed = anyio.Event()

    async def source() -> AsyncIterator[int]:
        try:
            for number in range(12):
                if number % 2:
                    await receive.receive()  # suspends until fed
                elif number % 4:
                    await anyio.lowlevel.checkpoint()  # suspends briefly
                yield number  # (multiples of 4 come back without suspending)
        finally:
            closed.set()

    fanout = Fanout(source())
    victim = fanout.consumer()
    others = [fanout.consumer() for _ in range(3)]
    victim_items: list[int] = []
    other_items: list[list[int]] = [[] for _ in others]

    async def run_victim() -> None:
        while len(victim_items) < cancel_at:
            victim_items.append(await anext(victim))
        with anyio.CancelScope() as scope:
            scope.cancel()
            # Cancelled wherever it would wait; an item it returns is kept.
            victim_items.append(await anext(victim))
        async for item in victim:
            victim_items.append(item)

    async def run_other(index: int) -> None:
        async for item in others[index]:
            other_items[index].append(item)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_victim)
            for index in range(len(others)):
                tg.start_soon(run_other, index)
            for _ in range(6):
                await anyio.wait_all_tasks_blocked()
                await send.send(0)
    assert victim_items == list(range(12))
    assert other_items == [list(range(12))] * 3
    assert closed.is_set()  # ended by exhaustion, never closed early
    assert fanout.statistics().buffered == 0


async def test_closing_cancels_a_pull_started_inline() -> None:
    """``aclose()`` cancels a pull a consumer started inline and the pump took over."""
    send, receive = anyio.create_memory_object_stream[int](10)
    finalized = anyio.Event()

    async def source() -> AsyncIterator[int]:
        try:
            while True:
                yield await receive.receive()
        finally:
            finalized.set()

    fanout = Fanout(source())
    consumer = fanout.consumer()
    await send.send(1)
    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == 1  # the pump is running and idle now
    ended = anyio.Event()

    async def wait_for_next() -> None:
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)
        ended.set()

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_next)
            await anyio.wait_all_tasks_blocked()
            assert fanout.statistics().pulling
            await fanout.aclose()
            await ended.wait()
    assert finalized.is_set()
    assert not fanout.statistics().pulling


async def test_source_error_in_an_inline_pull_reaches_every_consumer() -> None:
    """An error raised while a consumer pulls inline reaches all consumers."""

    async def source() -> AsyncIterator[int]:
        yield 1
        raise LookupError("inline failure")

    fanout = Fanout(source())
    first, second = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        assert await anext(first) == 1
        with pytest.raises(LookupError, match="inline failure"):
            await anext(first)
        assert await anext(second) == 1
        with pytest.raises(LookupError, match="inline failure"):
            await anext(second)
        with pytest.raises(StopAsyncIteration):
            await anext(second)
