"""A source is iterated as one ``async for`` in one task would iterate it.

One task calls ``aiter()`` on the source, every ``__anext__()`` and the final
``aclose()``, whoever asks and whichever backend runs, so a source may hold a
task group (with a task feeding it), a cancel scope or an
:func:`asyncio.timeout` open across its own ``yield``. Each case runs through
a bare :class:`~wool_pooling.Fanout` and through a ``@shared_subscription``
class, on every loop the suite runs (plain asyncio, eager, uvloop, trio).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import uuid
from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import sniffio
from _loops import BACKENDS
from _stubs import current_task
from anyio.abc import ObjectSendStream
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio

TIMEOUT = 10
CONSUMERS = 3
ITEMS = 5


def event(number: int) -> DiscoveryEvent:
    """A distinct ``worker-added`` event per number."""
    return DiscoveryEvent(
        "worker-added",
        metadata=WorkerMetadata(
            uid=uuid.UUID(int=number + 1), address="127.0.0.1:1", pid=1, version="1"
        ),
    )


def numbers(events: list[Any]) -> list[int]:
    return [item.metadata.uid.int - 1 for item in events]


SourceFactory = Callable[[], AsyncIterator[DiscoveryEvent]]


@shared_subscription(key=lambda cls, name, factory: name)
class TaskBound:
    """A subscriber whose stream is whatever ``factory()`` returns."""

    def __init__(self, name: str, factory: SourceFactory) -> None:
        self.factory = factory

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self.factory()


@pytest.fixture(params=["fanout", "subscription"])
def via(request: pytest.FixtureRequest) -> str:
    """Through a bare ``Fanout``, or a ``@shared_subscription`` class."""
    return request.param


class Shared:
    """``CONSUMERS`` consumers of one source, through ``via``; ``close()``
    closes the shared iteration from outside (``Fanout.aclose()``, or the
    pool's exit)."""

    def __init__(self, via: str, factory: SourceFactory) -> None:
        self.via = via
        self.factory = factory
        self.fanout: Fanout[DiscoveryEvent] | None = None
        self.pool: SubscriptionPool | None = None

    async def __aenter__(self) -> list[AsyncIterator[Any]]:
        if self.via == "fanout":
            fanout = self.fanout = Fanout(self.factory())
            return [fanout.consumer() for _ in range(CONSUMERS)]
        pool = self.pool = SubscriptionPool()
        await pool.__aenter__()
        subscription = TaskBound(uuid.uuid4().hex, self.factory)
        return [aiter(subscription) for _ in range(CONSUMERS)]

    async def close(self) -> None:
        if self.fanout is not None:
            await self.fanout.aclose()
        elif self.pool is not None:
            await self.pool.__aexit__(None, None, None)

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def read_all(consumer: AsyncIterator[Any], into: list[Any]) -> None:
    async for item in consumer:
        into.append(item)


async def read_everything(
    via: str,
    factory: SourceFactory,
    ending: type[BaseException] | tuple[type[BaseException], ...] = (),
) -> tuple[list[list[Any]], list[BaseException]]:
    """``CONSUMERS`` consumers of ``factory()`` through ``via``, each read to
    its end in a task of its own: what each received, and the errors of
    type ``ending`` they ended with (any other error fails the test)."""
    received: list[list[Any]] = [[] for _ in range(CONSUMERS)]
    errors: list[BaseException] = []

    async def read(consumer: AsyncIterator[Any], into: list[Any]) -> None:
        try:
            await read_all(consumer, into)
        except ending as error:
            errors.append(error)

    with anyio.fail_after(TIMEOUT):
        async with Shared(via, factory) as consumers, anyio.create_task_group() as tg:
            for consumer, into in zip(consumers, received, strict=True):
                tg.start_soon(read, consumer, into)
    return received, errors


class Record:
    """Which tasks ran the source's steps."""

    def __init__(self) -> None:
        self.tasks: list[object] = []
        self.closed_in: object = None

    def step(self) -> None:
        self.tasks.append(current_task())

    def one_task(self) -> bool:
        return len(self.tasks) > 1 and all(t is self.tasks[0] for t in self.tasks)


async def test_a_source_with_a_task_group_feeding_it_serves_every_consumer(
    via: str,
) -> None:
    """A source that yields inside ``async with create_task_group()``, fed by a
    task of that group, delivers every item to every consumer and ends
    cleanly: its group is entered and exited in the same task."""
    record = Record()

    async def watch(send: ObjectSendStream[DiscoveryEvent]) -> None:
        async with send:
            for number in range(ITEMS):
                await send.send(event(number))

    async def source() -> AsyncIterator[DiscoveryEvent]:
        record.step()
        send, receive = anyio.create_memory_object_stream[DiscoveryEvent](0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, send)
            async with receive:
                async for item in receive:
                    record.step()
                    yield item
        record.step()

    received, _ = await read_everything(via, source)
    assert [numbers(items) for items in received] == [list(range(ITEMS))] * CONSUMERS
    assert record.one_task()
    assert len(record.tasks) == ITEMS + 2


async def test_a_source_keeping_a_cancel_scope_open_across_yields(via: str) -> None:
    """``anyio.move_on_after`` open across the source's yields: entered and left
    in one task; its deadline ends the source, and every consumer with it."""
    record = Record()
    stuck = anyio.Event()

    async def source() -> AsyncIterator[DiscoveryEvent]:
        with anyio.move_on_after(TIMEOUT) as scope:
            for number in range(ITEMS):
                record.step()
                yield event(number)
            stuck.set()
            scope.deadline = anyio.current_time() + 0.01
            await anyio.sleep_forever()  # until the deadline
        assert scope.cancelled_caught
        record.step()

    received, _ = await read_everything(via, source)
    assert stuck.is_set()
    assert [numbers(items) for items in received] == [list(range(ITEMS))] * CONSUMERS
    assert record.one_task()


@pytest.mark.parametrize("anyio_backend", BACKENDS[:1])  # asyncio, as configured
async def test_a_source_keeping_an_asyncio_timeout_open_across_yields(
    via: str, anyio_backend: object
) -> None:
    """``asyncio.timeout`` open across the source's yields sees one task, and
    its deadline cancels that task: the source's, never a consumer's."""
    del anyio_backend
    record = Record()

    async def source() -> AsyncIterator[DiscoveryEvent]:
        async with asyncio.timeout(TIMEOUT) as timeout:
            for number in range(ITEMS):
                record.step()
                yield event(number)
            timeout.reschedule(asyncio.get_running_loop().time() + 0.01)
            await asyncio.sleep(TIMEOUT)  # until the deadline

    received, outcomes = await read_everything(via, source, TimeoutError)
    assert [numbers(items) for items in received] == [list(range(ITEMS))] * CONSUMERS
    assert len(outcomes) == CONSUMERS
    assert all(isinstance(outcome, TimeoutError) for outcome in outcomes)
    assert record.one_task()


async def test_a_failing_background_task_of_the_source_reaches_every_consumer(
    via: str,
) -> None:
    """The source's own task group holds a task that fails: every consumer
    gets the items before it, then that error (in the group's
    ``ExceptionGroup``), with its traceback."""

    class WatchFailed(Exception):
        pass

    async def watch(send: ObjectSendStream[DiscoveryEvent]) -> None:
        async with send:
            for number in range(ITEMS):
                await send.send(event(number))
            raise WatchFailed("the watch broke")

    async def source() -> AsyncIterator[DiscoveryEvent]:
        send, receive = anyio.create_memory_object_stream[DiscoveryEvent](0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, send)
            async with receive:
                async for item in receive:
                    yield item
            await anyio.sleep_forever()  # the failure cancels this

    received, errors = await read_everything(via, source, BaseExceptionGroup)
    assert [numbers(items) for items in received] == [list(range(ITEMS))] * CONSUMERS
    assert len(errors) == CONSUMERS
    for error in errors:
        assert isinstance(error, BaseExceptionGroup)
        matched = error.subgroup(WatchFailed)
        assert matched is not None
        failure = matched.exceptions[0]
        assert str(failure) == "the watch broke"
        assert failure.__traceback__ is not None


async def test_a_source_closed_mid_pull_from_another_task_runs_its_finally_there(
    via: str,
) -> None:
    """Closed from another task while the source waits inside a pull (and
    inside its task group): the pull is cancelled in the source's own task,
    whose ``finally`` (with an await) runs there, and the close returns."""
    record = Record()
    waiting = anyio.Event()
    cleaned = anyio.Event()

    async def source() -> AsyncIterator[DiscoveryEvent]:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.sleep_forever)
                record.step()
                yield event(0)
                record.step()
                waiting.set()
                await anyio.sleep_forever()
                yield event(1)  # never reached
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()
                record.closed_in = current_task()
            cleaned.set()

    shared = Shared(via, source)
    received: list[list[Any]] = [[] for _ in range(CONSUMERS)]
    with anyio.fail_after(TIMEOUT):
        consumers = await shared.__aenter__()
        async with anyio.create_task_group() as tg:
            for consumer, into in zip(consumers, received, strict=True):
                tg.start_soon(read_all, consumer, into)
            await waiting.wait()
            await anyio.wait_all_tasks_blocked()
            await shared.close()  # every consumer ends: the group exits
        assert cleaned.is_set()
    assert [numbers(items) for items in received] == [[0]] * CONSUMERS
    assert record.one_task()
    assert record.closed_in is record.tasks[0]


async def test_the_last_consumer_leaving_closes_the_source_in_its_own_task() -> None:
    """With ``ttl == 0`` the last consumer of a subscription leaving mid-pull
    closes the shared source in the task that iterates it: the source's
    cancel scope and ``finally`` (with an await) run there."""
    record = Record()
    waiting = anyio.Event()
    cleaned = anyio.Event()

    async def source() -> AsyncIterator[DiscoveryEvent]:
        try:
            with anyio.CancelScope():
                record.step()
                yield event(0)
                record.step()
                waiting.set()
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()
                record.closed_in = current_task()
            cleaned.set()

    subscription = TaskBound(uuid.uuid4().hex, source)
    with anyio.fail_after(TIMEOUT):
        async with SubscriptionPool() as pool:
            consumers = [aiter(subscription) for _ in range(CONSUMERS)]
            for consumer in consumers:
                assert numbers([await anext(consumer)]) == [0]
            async with anyio.create_task_group() as tg:
                for consumer in consumers:
                    tg.start_soon(anext, consumer)
                await waiting.wait()
                await anyio.wait_all_tasks_blocked()
                tg.cancel_scope.cancel()  # every consumer leaves mid-pull
            await cleaned.wait()
            assert pool.statistics().entries == 0
    assert record.one_task()
    assert record.closed_in is record.tasks[0]


async def test_a_fan_out_dropped_mid_pull_closes_its_source_in_its_own_task() -> None:
    """A fan-out and its consumers dropped without ``aclose()`` while the
    source waits inside a pull: the pull is cancelled and the source closed
    in the task that iterated it."""
    record = Record()
    waiting = anyio.Event()
    cleaned = anyio.Event()

    async def source() -> AsyncIterator[int]:
        try:
            with anyio.CancelScope():
                record.step()
                yield 0
                record.step()
                waiting.set()
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()
                record.closed_in = current_task()
            cleaned.set()

    with anyio.fail_after(TIMEOUT):
        fanout = Fanout(source())
        consumer = fanout.consumer()
        assert await anext(consumer) == 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(anext, consumer)
            await waiting.wait()
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        del fanout, consumer, tg
        gc.collect()  # a cancelled task's traceback may hold the consumer
        await cleaned.wait()
    assert record.one_task()
    assert record.closed_in is record.tasks[0]


@pytest.mark.parametrize("readers", [1, 5])
async def test_aclose_from_another_task_while_consumers_iterate_returns(
    readers: int,
) -> None:
    """``Fanout.aclose()`` from another task while several consumers iterate a
    source that checkpoints once per item returns promptly, every consumer
    ends, and the source is closed."""
    closed = anyio.Event()

    async def source() -> AsyncIterator[int]:
        try:
            number = 0
            while True:
                await anyio.lowlevel.checkpoint()
                yield number
                number += 1
        finally:
            closed.set()

    fanout = Fanout(source())
    seen = anyio.Event()
    counts = [0] * readers

    async def consumer(index: int) -> None:
        async for item in fanout.consumer():
            counts[index] += 1
            if item == 7:
                seen.set()

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for index in range(readers):
                tg.start_soon(consumer, index)
            await seen.wait()
            await fanout.aclose()
    assert closed.is_set()
    assert all(count >= 8 for count in counts) or readers > 1
    assert max(counts) >= 8


async def test_every_step_of_a_source_runs_in_one_task_whoever_asks() -> None:
    """Consumers in different tasks, joining and leaving between items: the
    source's ``aiter()``, every ``__anext__()`` and its ``aclose()`` see one
    task, which is none of the consumers'."""
    seen: list[object] = []

    class Source:
        def __init__(self) -> None:
            self.number = 0

        def __aiter__(self) -> Source:
            seen.append(current_task())
            return self

        async def __anext__(self) -> int:
            seen.append(current_task())
            await anyio.lowlevel.checkpoint()
            self.number += 1
            return self.number

        async def aclose(self) -> None:
            seen.append(current_task())

    fanout = Fanout(Source())
    readers: list[object] = []

    async def read_two() -> None:
        readers.append(current_task())
        consumer = fanout.consumer()
        await anext(consumer)
        await anext(consumer)
        await consumer.aclose()

    with anyio.fail_after(TIMEOUT):
        for _ in range(3):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_two)
                tg.start_soon(read_two)
        await fanout.aclose()
    assert len(seen) >= 2 + 3 + 1
    assert all(task is seen[0] for task in seen)
    assert not any(task is seen[0] for task in readers)
    assert sniffio.current_async_library() in ("asyncio", "trio")
    assert sys.version_info >= (3, 11)
