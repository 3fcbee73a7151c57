"""What the core frees, where it runs and whom it refuses: reference counting
alone, sources that raise synchronously, cancel requests made by a source,
finalisers in foreign threads, foreign event loops and concurrent readers."""

from __future__ import annotations

import asyncio
import gc
import math
import threading
import weakref
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _loops import asyncio_options
from _stubs import ev
from _stubs import make_stub
from _stubs import meta
from _stubs import subscribe
from wool import DiscoveryEvent

from wool_pooling import Fanout
from wool_pooling import RestartPolicy
from wool_pooling import SubscriptionPool
from wool_pooling import current_pool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio

TIMEOUT = 5


@contextmanager
def collector_off() -> Iterator[None]:
    """Disable the cyclic garbage collector: only reference counting frees."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition()`` holds (bounded by TIMEOUT)."""
    with anyio.fail_after(TIMEOUT):
        # A callback handed over from another thread: poll, with a deadline.
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.001)


class Item:
    """An item that can be weakly referenced."""


class Silent:
    """A source whose pulls wait until fed, counting pulls and closes."""

    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[Any](math.inf)
        self.closed = 0

    def __aiter__(self) -> Silent:
        return self

    async def __anext__(self) -> Any:
        return await self.receive.receive()

    async def aclose(self) -> None:
        self.closed += 1


async def read_to_end(consumer: AsyncIterator[Any]) -> None:
    async for _ in consumer:
        pass


# -- freed by reference counting alone ----------------------------------------


@pytest.mark.parametrize("restart", [None, RestartPolicy()], ids=["plain", "restart"])
async def test_closed_entries_are_freed_by_reference_counting_alone(
    restart: RestartPolicy | None,
) -> None:
    """With the collector off, opening and closing many keys leaves no raw
    instance, fan-out or item alive once each last consumer's aclose() returns."""

    @shared_subscription(restart=restart)
    class Keyed:
        def __init__(self, name: str) -> None:
            self.name = name
            self.send, self.receive = anyio.create_memory_object_stream[Any](1)
            event = ev("worker-added", meta())
            self.send.send_nowait(event)
            raws.append(weakref.ref(self))
            events.append(weakref.ref(event))

        async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
            async for event in self.receive:
                yield event

    raws: list[weakref.ref[Any]] = []
    fanouts: list[weakref.ref[Any]] = []
    events: list[weakref.ref[Any]] = []
    with collector_off():
        async with SubscriptionPool() as pool:
            for index in range(200):
                async with aiter(Keyed(f"k{index}")) as consumer:
                    with anyio.fail_after(TIMEOUT):
                        await anext(consumer)
                    entry = next(iter(pool._entries.values()))  # pyright: ignore[reportPrivateUsage]
                    fanouts.append(weakref.ref(entry.fanout))
                    del entry
                    if index % 2:  # half of them with a pull in flight at close
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(anext, consumer)
                            await anyio.lowlevel.checkpoint()
                            tg.cancel_scope.cancel()
                assert pool.statistics().entries == 0
        assert [ref for ref in raws if ref() is not None] == []
        assert [ref for ref in fanouts if ref() is not None] == []
        assert [ref for ref in events if ref() is not None] == []
    assert len(raws) == 200


async def test_a_fanout_closed_mid_pull_is_freed_by_reference_counting() -> None:
    """With the collector off, a fan-out closed while its pull waits on the
    source is freed with every item once nothing references it."""
    source = Silent()
    with collector_off():
        fanout = Fanout(source)
        first, second = fanout.consumer(), fanout.consumer()
        item = Item()
        items = [weakref.ref(item)]
        source.send.send_nowait(item)
        del item
        with anyio.fail_after(TIMEOUT):
            await anext(first)  # the second still holds the item
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_to_end, first)
                await anyio.wait_all_tasks_blocked()  # a pull waits on the source
                await fanout.aclose()
        assert source.closed == 1
        reference = weakref.ref(fanout)
        del fanout, first, second
        await anyio.lowlevel.checkpoint()
        assert reference() is None
        assert items[0]() is None


# -- sources that raise synchronously -----------------------------------------


class RaisingAiter:
    """``aiter()`` raises instead of returning an iterator."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __aiter__(self) -> AsyncIterator[int]:
        raise self.error


class RaisingAnext:
    """``__anext__()`` raises instead of returning an awaitable."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __aiter__(self) -> RaisingAnext:
        return self

    def __anext__(self) -> Any:
        raise self.error


@pytest.mark.parametrize("kind", [RaisingAiter, RaisingAnext])
async def test_a_source_raising_synchronously_fails_every_consumer(kind: type) -> None:
    """A first aiter() or __anext__() that raises synchronously reaches every
    consumer with the error, instead of leaving them waiting."""
    fanout = Fanout(kind(LookupError("no such stream")))
    consumers = [fanout.consumer() for _ in range(3)]
    outcomes: list[str] = []

    async def read(consumer: Any) -> None:
        try:
            await anext(consumer)
        except LookupError as error:
            outcomes.append(str(error))

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for consumer in consumers:
                tg.start_soon(read, consumer)
    assert outcomes == ["no such stream"] * 3
    await fanout.aclose()


@pytest.mark.parametrize("kind", [RaisingAiter, RaisingAnext])
async def test_a_source_ending_synchronously_ends_every_consumer(kind: type) -> None:
    """A first aiter() or __anext__() raising StopAsyncIteration ends every
    consumer."""
    fanout = Fanout(kind(StopAsyncIteration()))
    consumers = [fanout.consumer() for _ in range(3)]
    with anyio.fail_after(TIMEOUT):
        for consumer in consumers:
            assert [item async for item in consumer] == []
    await fanout.aclose()


# -- a source that cancels its consumer's scope --------------------------------


class CancellingSource:
    """Each pull cancels the scope given to it, then returns at once."""

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.pulls = 0

    def __aiter__(self) -> CancellingSource:
        return self

    async def __anext__(self) -> int:
        self.pulls += 1
        if self.scope is not None:
            self.scope.cancel()
        return self.pulls


async def test_a_source_cancelling_the_consumers_scope_leaves_no_stray_cancel() -> None:
    """A pull that cancels the consumer's own cancel scope and returns at once
    is delivered to that scope: the consumer's next, unrelated await runs."""
    source = CancellingSource()
    fanout = Fanout(source, read_ahead=0)  # the call in the scope starts the pull
    consumer = fanout.consumer()
    after: list[str] = []

    async def body() -> None:
        with anyio.CancelScope() as scope:
            source.scope = scope
            await anext(consumer)
        source.scope = None
        await anyio.lowlevel.checkpoint()  # no cancellation left behind
        after.append("ran on")

    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == 1  # a first pull, with no scope to cancel
        async with anyio.create_task_group() as tg:
            tg.start_soon(body)
        assert after == ["ran on"]
        assert await anext(consumer) == 2  # the item was kept, not lost
    await fanout.aclose()


# -- release from a finaliser in another thread ----------------------------------


async def test_a_consumer_collected_in_another_thread_is_released_on_its_loop() -> None:
    """A subscription consumer dropped in a foreign thread is released by its
    own loop: the entry goes, the raw instance is closed, and no loop-unsafe
    call is made from that thread (asyncio runs in debug mode here)."""
    if isinstance(asyncio_loop := _running_asyncio_loop(), asyncio.AbstractEventLoop):
        asyncio_loop.set_debug(True)
    stub = make_stub()
    async with SubscriptionPool() as pool:
        holder = [aiter(subscribe(stub))]
        async with anyio.create_task_group() as tg:
            tg.start_soon(anext, holder[0])
            await anyio.wait_all_tasks_blocked()
            stub.instances[-1].push(ev("worker-added", meta()))
        assert pool.statistics().consumers == 1
        errors: list[BaseException] = []

        def drop() -> None:
            try:
                holder.clear()  # the last reference goes in this thread
            except BaseException as error:  # pragma: no cover - reported below
                errors.append(error)

        thread = threading.Thread(target=drop)
        thread.start()
        await anyio.to_thread.run_sync(thread.join)
        await until(lambda: pool.statistics().entries == 0)
        assert errors == []
        assert stub.instances[-1].close_calls == 1


def _running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# -- another event loop ----------------------------------------------------------


FIRST_LOOPS = pytest.mark.parametrize(
    "first_loop",
    [("asyncio", asyncio_options()), ("trio", {})],
    ids=["first-asyncio", "first-trio"],
)


@FIRST_LOOPS
def test_a_fanout_consumer_iterated_under_another_loop_raises_at_once(
    first_loop: tuple[str, dict[str, Any]],
) -> None:
    """A consumer that waited under one event loop raises RuntimeError at once
    when it waits under another (a second run of the same library, or the
    other one)."""
    source = Silent()
    fanout = Fanout(source)
    consumer = fanout.consumer()

    async def first() -> None:
        source.send.send_nowait(1)
        assert await anext(consumer) == 1

    async def again() -> None:
        with anyio.fail_after(TIMEOUT), pytest.raises(RuntimeError, match="event loop"):
            await anext(consumer)

    anyio.run(first, backend=first_loop[0], backend_options=first_loop[1])
    anyio.run(again, backend="asyncio", backend_options=asyncio_options())
    anyio.run(again, backend="trio")


@FIRST_LOOPS
def test_a_subscription_consumer_iterated_under_another_loop_raises_at_once(
    first_loop: tuple[str, dict[str, Any]],
) -> None:
    """A subscription consumer joined under one event loop raises RuntimeError
    at once when iterated under another, and stays attached to its own pool."""
    stub = make_stub()
    holder: list[Any] = []

    async def first() -> None:
        consumer = aiter(subscribe(stub))
        holder.append(consumer)
        async with anyio.create_task_group() as tg:
            tg.start_soon(anext, consumer)
            await anyio.wait_all_tasks_blocked()
            stub.instances[-1].push(ev("worker-added", meta()))
        holder.append(current_pool())

    async def again() -> None:
        with anyio.fail_after(TIMEOUT), pytest.raises(RuntimeError, match="event loop"):
            await anext(holder[0])

    anyio.run(first, backend=first_loop[0], backend_options=first_loop[1])
    anyio.run(again, backend="asyncio", backend_options=asyncio_options())
    anyio.run(again, backend="trio")
    assert holder[1].statistics().consumers == 1


# -- one reader at a time -------------------------------------------------------


async def test_two_tasks_iterating_one_fanout_consumer_is_refused() -> None:
    """A second task reading a consumer another task waits on gets
    BusyResourceError instead of silently splitting the items."""
    source = Silent()
    fanout = Fanout(source)
    consumer = fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anext, consumer)
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(anyio.BusyResourceError):
                await anext(consumer)
            with pytest.raises(anyio.BusyResourceError):
                consumer.receive_nowait()
            source.send.send_nowait(1)
    source.send.send_nowait(2)
    assert await anext(consumer) == 2  # the first task got 1; nothing was split
    await fanout.aclose()


async def test_two_tasks_iterating_one_subscription_consumer_is_refused() -> None:
    """A second task iterating a subscription consumer another task waits on
    gets BusyResourceError, and the first keeps its consumer."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        consumer = aiter(subscribe(stub))
        got: list[DiscoveryEvent] = []

        async def first() -> None:
            got.append(await anext(consumer))

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await anyio.wait_all_tasks_blocked()
                with pytest.raises(anyio.BusyResourceError):
                    await anext(consumer)
                assert pool.statistics().consumers == 1
                stub.instances[-1].push(ev("worker-added", meta()))
        assert len(got) == 1
        await consumer.aclose()


# -- async for under a timeout ----------------------------------------------------


async def test_async_for_over_a_fanout_consumer_goes_on_after_a_timeout() -> None:
    """A FanoutConsumer's ``async for`` cut short by move_on_after loses
    nothing: iterating it again goes on from there."""
    source = Silent()
    fanout = Fanout(source)
    consumer = fanout.consumer()
    source.send.send_nowait(0)
    got: list[int] = []
    with anyio.move_on_after(0.05):
        async for item in consumer:
            got.append(item)
    source.send.send_nowait(1)
    with anyio.fail_after(TIMEOUT):
        async for item in consumer:
            got.append(item)
            break
    assert got == [0, 1]
    await fanout.aclose()


async def test_async_for_over_a_subscription_consumer_ends_it_at_a_timeout() -> None:
    """A SubscriptionConsumer's ``async for`` cut short by move_on_after ends
    that consumer and releases its reference, as documented."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        consumer = aiter(subscribe(stub))
        with anyio.move_on_after(0.05):
            async for _ in consumer:
                pass
        assert pool.statistics().consumers == 0
        with anyio.fail_after(TIMEOUT):
            assert [event async for event in consumer] == []
