"""The ``Fanout`` / ``FanoutConsumer`` contract of issue 2, without wool."""

from __future__ import annotations

import gc
import math
import traceback
import weakref
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Iterator
from typing import Any
from typing import Literal

import anyio
import anyio.lowlevel
import attrs
import pytest
from _loops import BACKENDS
from _loops import run as run_on_backend
from _stubs import running_tasks
from anyio.streams.memory import MemoryObjectReceiveStream
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer

# Sync tests (the hypothesis one) are ignored by anyio's plugin despite this mark.
pytestmark = pytest.mark.anyio


# --- helpers --------------------------------------------------------------------------


class Probe:
    """A gated source: yields the ints the test feeds it, recording every pull.

    ``pulls`` counts the generator's resumptions (one per ``__anext__``),
    ``active`` the pulls currently blocked waiting for an item.
    """

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[int](math.inf)
        self.aiter_calls = 0
        self.pulls = 0
        self.active = 0
        self.max_active = 0
        self.finally_runs = 0

    def feed(self, *items: int) -> None:
        for item in items:
            self._send.send_nowait(item)

    def end(self) -> None:
        """Make the source exhausted once the fed items are consumed."""
        self._send.close()

    def close(self) -> None:
        self._send.close()
        self._receive.close()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncGenerator[int, None]:
        self.aiter_calls += 1
        return self._generate()

    async def _generate(self) -> AsyncGenerator[int, None]:
        try:
            while True:
                self.pulls += 1
                self.active += 1
                self.max_active = max(self.max_active, self.active)
                try:
                    item = await self._receive.receive()
                except anyio.EndOfStream:
                    return
                finally:
                    self.active -= 1
                yield item
        finally:
            self.finally_runs += 1


@pytest.fixture
def probe() -> Iterator[Probe]:
    with Probe() as source:
        yield source


async def exploding_source(
    receive: MemoryObjectReceiveStream[int],
) -> AsyncGenerator[int, None]:
    """Yield the received ints; raise on a negative one."""
    async for item in receive:
        if item < 0:
            raise ValueError(f"source failed at {item}")
        yield item


async def counting_source(n: int) -> AsyncGenerator[int, None]:
    for item in range(n):
        await anyio.lowlevel.checkpoint()
        yield item


async def settle() -> None:
    """Return once every other task is blocked.

    The checkpoints only let freshly started tasks reach their first wait, so
    that asyncio's ``wait_all_tasks_blocked`` rarely needs its 0.1 s retry;
    the synchronisation itself is ``wait_all_tasks_blocked``.
    """
    for _ in range(5):
        await anyio.lowlevel.checkpoint()
    await anyio.wait_all_tasks_blocked()


async def expect_end(consumer: FanoutConsumer[int]) -> None:
    with pytest.raises(StopAsyncIteration):
        await anext(consumer)


async def take(consumer: FanoutConsumer[int], n: int) -> list[int]:
    return [await anext(consumer) for _ in range(n)]


async def drain(consumer: FanoutConsumer[int]) -> list[int]:
    return [item async for item in consumer]


# --- 1. delivery ----------------------------------------------------------------------


async def test_every_consumer_gets_every_later_item_in_order_once(
    probe: Probe,
) -> None:
    """Each consumer receives each item pulled after it registered, in order, once."""
    fanout = Fanout(probe)
    a, b = fanout.consumer(), fanout.consumer()
    probe.feed(*range(10))
    with anyio.fail_after(5):
        assert await take(a, 3) == [0, 1, 2]
        late = fanout.consumer()  # registered after 3 items were pulled
        assert await take(b, 2) == [0, 1]
        assert await take(late, 4) == [3, 4, 5, 6]
        assert await take(a, 5) == [3, 4, 5, 6, 7]
        assert await take(b, 8) == [2, 3, 4, 5, 6, 7, 8, 9]
        probe.end()
        assert await drain(a) == [8, 9]
        assert await drain(late) == [7, 8, 9]
        assert await drain(b) == []
    assert fanout.statistics().pulled == 10
    assert probe.aiter_calls == 1


async def test_concurrent_consumers_with_a_midway_joiner() -> None:
    """Concurrent consumers get the whole sequence; a midway joiner gets the rest."""
    fanout = Fanout(counting_source(50))
    early = [fanout.consumer() for _ in range(4)]
    results: dict[str, list[int]] = {}

    async def run(name: str, consumer: FanoutConsumer[int]) -> None:
        results[name] = await drain(consumer)

    first = early[0]
    with anyio.fail_after(5):
        head = await take(first, 20)  # the others are not reading yet
        async with anyio.create_task_group() as tg:
            late = fanout.consumer()
            for i, consumer in enumerate(early[1:], 1):
                tg.start_soon(run, f"early{i}", consumer)
            tg.start_soon(run, "late", late)
            tg.start_soon(run, "early0", first)
    assert head == list(range(20))
    assert head + results["early0"] == list(range(50))
    for i in range(1, 4):
        assert results[f"early{i}"] == list(range(50))
    assert results["late"] == list(range(20, 50))


async def test_two_hundred_consumers_get_everything() -> None:
    """200 consumers reading 200 items concurrently each receive all of them."""
    fanout = Fanout(counting_source(200))
    consumers = [fanout.consumer() for _ in range(200)]
    results: list[list[int]] = [[] for _ in consumers]

    async def run(i: int) -> None:
        results[i] = await drain(consumers[i])

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(len(consumers)):
                tg.start_soon(run, i)
    assert all(result == list(range(200)) for result in results)
    assert fanout.statistics().buffered == 0
    assert fanout.statistics().pulled == 200


# --- 2. demand-driven -----------------------------------------------------------------


async def test_nothing_is_pulled_before_a_consumer_waits(probe: Probe) -> None:
    """Creating the fan-out, registering consumers and ``__aiter__`` pull nothing."""
    probe.feed(*range(5))
    fanout = Fanout(probe)
    consumers = [fanout.consumer() for _ in range(3)]
    iterators = [aiter(consumer) for consumer in consumers]
    await settle()
    assert probe.aiter_calls == 0
    assert probe.pulls == 0
    stats = fanout.statistics()
    assert stats.pulled == 0
    assert stats.pulling is False
    assert stats.waiting == 0
    assert stats.consumers == 3
    with anyio.fail_after(5):
        assert await anext(consumers[0]) == 0
        assert await anext(iterators[1]) == 0
    assert probe.pulls == 1
    await fanout.aclose()


async def test_buffered_consumer_is_served_without_a_pull(probe: Probe) -> None:
    """A consumer with buffered items gets them without the source being advanced."""
    fanout = Fanout(probe)
    a, b = fanout.consumer(), fanout.consumer()
    probe.feed(*range(10))
    with anyio.fail_after(5):
        assert await take(a, 3) == [0, 1, 2]
    assert fanout.statistics().pulled == 3
    assert probe.pulls == 3
    assert b.buffered == 3
    assert await take(b, 3) == [0, 1, 2]  # no suspension needed, no pull
    assert fanout.statistics().pulled == 3
    assert probe.pulls == 3
    await fanout.aclose()


async def test_nothing_is_pulled_ahead_of_demand(probe: Probe) -> None:
    """With items available at the source, N requests pull exactly N items."""
    probe.feed(*range(100))
    fanout = Fanout(probe)
    a, b = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(5):
        for n in range(1, 8):
            assert await anext(a) == n - 1
            await settle()
            assert fanout.statistics().pulled == n
            assert probe.pulls == n
            assert fanout.statistics().pulling is False
        assert await take(b, 7) == list(range(7))
    await settle()
    assert fanout.statistics().pulled == 7
    assert probe.pulls == 7
    await fanout.aclose()


async def test_at_most_one_pull_in_flight_with_many_waiters(probe: Probe) -> None:
    """Twenty consumers waiting at once cause one pull at a time, never more."""
    fanout = Fanout(probe)
    consumers = [fanout.consumer() for _ in range(20)]
    results: list[list[int]] = [[] for _ in consumers]

    async def run(i: int) -> None:
        results[i] = await take(consumers[i], 5)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(len(consumers)):
                tg.start_soon(run, i)
            await settle()
            stats = fanout.statistics()
            assert stats.waiting == 20
            assert stats.pulling is True
            assert probe.active == 1
            assert probe.pulls == 1
            for item in range(5):
                probe.feed(item)
                await settle()
                assert fanout.statistics().pulled == item + 1
    assert probe.max_active == 1
    assert all(result == list(range(5)) for result in results)
    assert fanout.statistics().pulled == 5
    await fanout.aclose()


# --- 3. no pull without a waiter; the helper task ends --------------------------------


async def test_no_pull_once_the_only_waiter_is_cancelled(probe: Probe) -> None:
    """After the pull in flight completes, no further pull starts without a waiter."""
    fanout = Fanout(probe)
    consumer = fanout.consumer()
    scope = anyio.CancelScope()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def wait_one() -> None:
                with scope:
                    await anext(consumer)

            tg.start_soon(wait_one)
            await settle()
            assert probe.active == 1
            scope.cancel()
    assert scope.cancelled_caught
    probe.feed(*range(10))
    await settle()
    assert fanout.statistics().pulled == 1  # the pull in flight completed
    assert probe.pulls == 1  # and nothing after it
    assert fanout.statistics().pulling is False
    assert fanout.statistics().waiting == 0
    assert consumer.buffered == 1
    await fanout.aclose()


async def test_no_task_is_left_after_aclose(probe: Probe) -> None:
    """After ``aclose()`` the source's finally ran and no helper task is alive."""
    await settle()
    baseline = running_tasks()
    fanout = Fanout(probe)
    consumer = fanout.consumer()
    probe.feed(0)
    with anyio.fail_after(5):
        assert await anext(consumer) == 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(expect_end, consumer)  # a pull in flight
            await settle()
            assert fanout.statistics().pulling is True
            await fanout.aclose()
    await settle()
    assert probe.finally_runs == 1
    assert probe.active == 0
    assert fanout.statistics().pulling is False
    assert running_tasks() == baseline


async def test_the_pump_ends_with_the_source_and_outlives_its_consumers(
    probe: Probe,
) -> None:
    """The task iterating the source ends once the source is exhausted; the
    last consumer leaving keeps it (and the source) for the next consumer,
    until ``aclose()``."""
    await settle()
    baseline = running_tasks()
    with anyio.fail_after(5):
        exhausted = Fanout(counting_source(3))
        assert await drain(exhausted.consumer()) == [0, 1, 2]
        await settle()
        assert running_tasks() == baseline

        abandoned = Fanout(probe)
        consumer = abandoned.consumer()
        probe.feed(0)
        assert await anext(consumer) == 0
        await consumer.aclose()
        await settle()
        assert running_tasks() == baseline + 1
        assert probe.finally_runs == 0  # leaving never closes the source
        later = abandoned.consumer()
        probe.feed(1)
        assert await anext(later) == 1
    await abandoned.aclose()
    assert probe.finally_runs == 1
    await settle()
    assert running_tasks() == baseline


async def test_no_task_is_left_after_a_fan_out_is_collected_in_a_cycle() -> None:
    """A fan-out and its consumers dropped together, in a reference cycle,
    without ``aclose()``: whatever ran their pulls ends once the collector
    has freed them."""
    await settle()
    baseline = running_tasks()
    with anyio.fail_after(5):
        fanout = Fanout(counting_source(10))
        consumer = fanout.consumer()
        assert await anext(consumer) == 0
        cycle: list[object] = [fanout, consumer]
        cycle.append(cycle)
        state = weakref.ref(fanout)
        del fanout, consumer, cycle
        gc.collect()
        assert state() is None
        await settle()
        assert running_tasks() == baseline


async def test_consumers_leaving_and_rejoining_never_start_a_second_pull(
    probe: Probe,
) -> None:
    """The last consumer leaving between pulls, or during one, and a new one
    joining at once: still one pull at a time, no item lost or repeated."""
    fanout = Fanout(probe)
    with anyio.fail_after(5):
        first = fanout.consumer()
        probe.feed(0)
        assert await anext(first) == 0
        await first.aclose()  # between pulls: nobody is left
        second = fanout.consumer()  # ...and someone joins before anything ran
        received: list[int] = []

        async def receive(consumer: FanoutConsumer[int]) -> None:
            received.append(await anext(consumer))

        async with anyio.create_task_group() as group:
            group.start_soon(receive, second)
            await anyio.wait_all_tasks_blocked()
            assert probe.active == 1
            probe.feed(1)
        assert received == [1]

        async with anyio.create_task_group() as group:
            group.start_soon(receive, second)  # a pull in flight...
            await anyio.wait_all_tasks_blocked()
            group.cancel_scope.cancel()
        await second.aclose()  # ...when the last consumer leaves
        third = fanout.consumer()
        async with anyio.create_task_group() as group:
            group.start_soon(receive, third)
            await anyio.wait_all_tasks_blocked()
            probe.feed(2)
        assert received == [1, 2]
    assert probe.max_active == 1
    assert probe.pulls == 3
    await fanout.aclose()


# --- 4. cancellation safety -----------------------------------------------------------


async def test_cancelling_the_pulling_consumer_mid_pull(probe: Probe) -> None:
    """Cancelling the consumer whose wait started the pull is prompt, loses nothing."""
    fanout = Fanout(probe)
    a, b = fanout.consumer(), fanout.consumer()
    a_scope = anyio.CancelScope()
    a_done = anyio.Event()
    b_items: list[int] = []

    async def run_a() -> None:
        with a_scope:
            await anext(a)
        a_done.set()

    async def run_b() -> None:
        b_items.append(await anext(b))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_a)
            await settle()
            assert probe.active == 1  # A's wait started the pull; the source blocks
            tg.start_soon(run_b)
            await settle()
            assert fanout.statistics().waiting == 2

            a_scope.cancel()
            await a_done.wait()
            # A is done while the source is still blocked: nothing was produced.
            assert a_scope.cancelled_caught
            assert probe.active == 1
            assert fanout.statistics().pulled == 0
            assert fanout.statistics().pulling is True
            assert fanout.statistics().consumers == 2
            assert b_items == []

            probe.feed(0)
        assert b_items == [0]
        assert await anext(a) == 0  # rule 7: the item A would have received
        assert probe.finally_runs == 0  # the source was never closed
        probe.feed(1, 2)
        assert await take(a, 2) == [1, 2]
        assert await take(b, 2) == [1, 2]
    assert probe.pulls == 3
    assert probe.max_active == 1
    await fanout.aclose()


async def test_cancelling_one_consumer_at_any_point_leaves_the_others_intact() -> None:
    """Cancel one of five consumers after k items, for every k: the others get all."""
    n_items, n_consumers = 8, 5
    for k in range(n_items + 1):
        with Probe() as probe:
            fanout = Fanout(probe)
            consumers = [fanout.consumer() for _ in range(n_consumers)]
            received: list[list[int]] = [[] for _ in consumers]
            scopes = [anyio.CancelScope() for _ in consumers]
            victim = k % n_consumers

            async def run(i: int) -> None:
                with scopes[i]:  # noqa: B023 - the task group ends within the loop body
                    async for item in consumers[i]:  # noqa: B023
                        received[i].append(item)  # noqa: B023

            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    for i in range(n_consumers):
                        tg.start_soon(run, i)
                    probe.feed(*range(k))
                    await settle()
                    # Everyone has k items and waits for item k, a pull in flight.
                    assert fanout.statistics().waiting == n_consumers
                    assert probe.active == 1
                    scopes[victim].cancel()
                    await settle()
                    assert probe.active == 1  # the pull survived the cancellation
                    probe.feed(*range(k, n_items))
                    probe.end()
                for i in range(n_consumers):
                    if i != victim:
                        assert received[i] == list(range(n_items)), (k, i)
                assert received[victim] == list(range(k)), k
                rest = await drain(consumers[victim])
            assert received[victim] + rest == list(range(n_items)), k
            assert probe.aiter_calls == 1
            assert probe.finally_runs == 1  # ended by exhaustion, once
            assert probe.max_active == 1
            assert fanout.statistics().buffered == 0


async def test_consumer_closed_mid_wait_does_not_disturb_others(probe: Probe) -> None:
    """A waiting consumer that is ``aclose()``d ends; the pull and the others go on."""
    fanout = Fanout(probe)
    closing, other = fanout.consumer(), fanout.consumer()
    outcome: dict[str, object] = {}

    async def run_closing() -> None:
        try:
            await anext(closing)
        except StopAsyncIteration:
            outcome["closing"] = "ended"

    async def run_other() -> None:
        outcome["other"] = await anext(other)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_closing)  # its wait starts the pull
            await settle()
            tg.start_soon(run_other)
            await settle()
            await closing.aclose()
            await settle()
            assert outcome == {"closing": "ended"}
            assert fanout.statistics().consumers == 1
            assert probe.active == 1  # the pull in flight was not cancelled
            probe.feed(0)
        assert outcome == {"closing": "ended", "other": 0}
        with pytest.raises(StopAsyncIteration):
            await anext(closing)
        probe.feed(1)
        assert await anext(other) == 1
    assert probe.finally_runs == 0
    assert probe.pulls == 2
    assert fanout.statistics().buffered == 0
    await fanout.aclose()


async def test_abandoned_consumer_does_not_disturb_others(probe: Probe) -> None:
    """A consumer dropped without closing (after a cancelled wait) leaves on GC."""
    fanout = Fanout(probe)
    keeper = fanout.consumer()
    abandoned: FanoutConsumer[int] | None = fanout.consumer()
    probe.feed(0, 1, 2)
    with anyio.fail_after(5):
        assert await take(keeper, 3) == [0, 1, 2]
    assert fanout.statistics().buffered == 3  # held for the abandoned one

    async def wait_on(consumer: FanoutConsumer[int], scope: anyio.CancelScope) -> None:
        with scope:
            await anext(consumer)

    with anyio.fail_after(5):
        assert abandoned is not None
        assert await take(abandoned, 3) == [0, 1, 2]
        scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_on, abandoned, scope)  # starts a pull
            await settle()
            assert probe.active == 1
            scope.cancel()
        probe.feed(3)
        await settle()
        assert fanout.statistics().pulled == 4
        assert fanout.statistics().buffered == 1  # item 3, for both
        assert fanout.statistics().consumers == 2

        del abandoned
        gc.collect()
        assert fanout.statistics().consumers == 1
        assert fanout.statistics().buffered == 1  # item 3, for the keeper only

        probe.feed(4)
        assert await take(keeper, 2) == [3, 4]
    assert fanout.statistics().buffered == 0
    assert probe.finally_runs == 0
    await fanout.aclose()


# --- 5. errors ------------------------------------------------------------------------


async def test_source_error_reaches_every_consumer_after_earlier_items() -> None:
    """A source error reaches each consumer after its pending items, with traceback."""
    send, receive = anyio.create_memory_object_stream[int](math.inf)
    with send, receive:
        fanout = Fanout(exploding_source(receive))
        a, b = fanout.consumer(), fanout.consumer()
        send.send_nowait(0)
        send.send_nowait(1)
        with anyio.fail_after(5):
            assert await take(a, 2) == [0, 1]
            c = fanout.consumer()  # joins after two items
            assert await take(b, 1) == [0]
            send.send_nowait(2)
            send.send_nowait(-1)
            assert await anext(a) == 2
            errors: list[ValueError] = []
            with pytest.raises(ValueError, match="source failed at -1") as info:
                await anext(a)
            errors.append(info.value)
            assert await take(b, 2) == [1, 2]
            with pytest.raises(ValueError, match="source failed at -1") as info:
                await anext(b)
            errors.append(info.value)
            assert await take(c, 1) == [2]
            with pytest.raises(ValueError, match="source failed at -1") as info:
                await anext(c)
            errors.append(info.value)
            for error in errors:
                names = [
                    frame.name for frame in traceback.extract_tb(error.__traceback__)
                ]
                assert "exploding_source" in names
            for consumer in (a, b, c):
                with pytest.raises(StopAsyncIteration):
                    await anext(consumer)
        stats = fanout.statistics()
        assert stats.buffered == 0
        assert stats.consumers == 0
        assert stats.pulled == 3
        await fanout.aclose()


async def test_source_error_reaches_waiting_consumers() -> None:
    """Consumers waiting when the source raises all receive the exception."""
    send, receive = anyio.create_memory_object_stream[int](math.inf)
    with send, receive:
        fanout = Fanout(exploding_source(receive))
        consumers = [fanout.consumer() for _ in range(5)]
        errors: list[BaseException] = []

        async def run(consumer: FanoutConsumer[int]) -> None:
            try:
                await anext(consumer)
            except ValueError as error:
                errors.append(error)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for consumer in consumers:
                    tg.start_soon(run, consumer)
                await settle()
                send.send_nowait(-7)
            assert len(errors) == 5
            for error in errors:
                names = [
                    frame.name for frame in traceback.extract_tb(error.__traceback__)
                ]
                assert "exploding_source" in names
            for consumer in consumers:
                with pytest.raises(StopAsyncIteration):
                    await anext(consumer)


# --- 6. memory ------------------------------------------------------------------------


async def test_items_are_freed_once_every_consumer_received_them(probe: Probe) -> None:
    """``buffered`` drops to 0 once all consumers received the items."""
    fanout = Fanout(probe)
    a, b, c = fanout.consumer(), fanout.consumer(), fanout.consumer()
    probe.feed(*range(6))
    with anyio.fail_after(5):
        assert await take(a, 6) == list(range(6))
        assert fanout.statistics().buffered == 6
        assert await take(b, 6) == list(range(6))
        assert fanout.statistics().buffered == 6
        assert await take(c, 4) == list(range(4))
        assert fanout.statistics().buffered == 2
        assert await take(c, 2) == [4, 5]
    assert fanout.statistics().buffered == 0
    await fanout.aclose()


async def test_slow_consumer_holds_items_fast_one_alone_holds_none(
    probe: Probe,
) -> None:
    """A slow consumer holds items until it reads or leaves; a lone fast one, none."""
    fanout = Fanout(probe)
    slow, fast = fanout.consumer(), fanout.consumer()
    probe.feed(*range(10))
    with anyio.fail_after(5):
        assert await take(fast, 5) == list(range(5))
        assert fanout.statistics().buffered == 5
        assert slow.buffered == 5
        assert fast.buffered == 0
        slow.close()
        assert fanout.statistics().buffered == 0
        assert fanout.statistics().consumers == 1
        for item in range(5, 10):
            assert await anext(fast) == item
            assert fanout.statistics().buffered == 0
    await fanout.aclose()


async def test_garbage_collected_consumer_stops_holding_items(probe: Probe) -> None:
    """A consumer collected without ``close()`` releases the items it held."""
    fanout = Fanout(probe)
    reader = fanout.consumer()
    fanout.consumer()  # dropped at once, never read
    lost = fanout.consumer()
    probe.feed(*range(4))
    with anyio.fail_after(5):
        assert await take(reader, 4) == list(range(4))
    gc.collect()
    assert fanout.statistics().consumers == 2
    assert fanout.statistics().buffered == 4
    del lost
    gc.collect()
    assert fanout.statistics().consumers == 1
    assert fanout.statistics().buffered == 0
    await fanout.aclose()


async def test_large_run_leaves_nothing_buffered() -> None:
    """10 000 items through three concurrent consumers leave the log empty."""
    n = 10_000
    fanout = Fanout(counting_source(n))
    consumers = [fanout.consumer() for _ in range(3)]
    results: list[list[int]] = [[] for _ in consumers]
    peak = 0

    async def run(i: int) -> None:
        nonlocal peak
        async for item in consumers[i]:
            results[i].append(item)
            peak = max(peak, fanout.statistics().buffered)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(len(consumers)):
                tg.start_soon(run, i)
    assert all(result == list(range(n)) for result in results)
    assert fanout.statistics().buffered == 0
    assert fanout.statistics().pulled == n
    assert peak <= 3  # consumers reading in step never let the log grow


# --- 7. a cancelled __anext__ loses nothing -------------------------------------------


async def test_cancelled_anext_loses_nothing_for_that_consumer(probe: Probe) -> None:
    """After a cancelled wait the consumer stays registered and gets the next item."""
    fanout = Fanout(probe)
    consumer = fanout.consumer()
    for _ in range(3):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anext, consumer)
                await settle()
                scope.cancel()
        assert scope.cancelled_caught
        assert fanout.statistics().consumers == 1
        assert fanout.statistics().pulled == 0
        assert probe.pulls == 1  # one pull stays in flight, whoever waits
    probe.feed(0, 1)
    with anyio.fail_after(5):
        assert await take(consumer, 2) == [0, 1]
    assert probe.max_active == 1
    await fanout.aclose()


# --- closing and construction ---------------------------------------------------------


async def test_aclose_ends_consumers_cancels_the_pull_and_closes_the_source(
    probe: Probe,
) -> None:
    """aclose() ends waiters, cancels the pull, closes the source once; idempotent."""
    fanout = Fanout(probe)
    consumers = [fanout.consumer() for _ in range(3)]
    probe.feed(0)
    ended: list[int] = []

    async def run(i: int) -> None:
        with pytest.raises(StopAsyncIteration):
            await anext(consumers[i])
        ended.append(i)

    with anyio.fail_after(5):
        for consumer in consumers:
            assert await take(consumer, 1) == [0]
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(run, i)
            await settle()
            assert fanout.statistics().pulling is True
            assert probe.active == 1
            await fanout.aclose()
        assert sorted(ended) == [0, 1, 2]
        assert probe.finally_runs == 1
        assert probe.active == 0
        stats = fanout.statistics()
        assert stats.pulling is False
        assert stats.buffered == 0
        assert stats.consumers == 0
        assert stats.pulled == 1  # the cancelled pull produced nothing
        await fanout.aclose()
        await fanout.aclose()
    assert probe.finally_runs == 1
    with pytest.raises(anyio.ClosedResourceError):
        fanout.consumer()


async def test_aclose_ends_a_consumer_with_buffered_items(probe: Probe) -> None:
    """A consumer holding unread items when the fan-out is closed ends too."""
    fanout = Fanout(probe)
    reader, holder = fanout.consumer(), fanout.consumer()
    probe.feed(0, 1)
    with anyio.fail_after(5):
        assert await take(reader, 2) == [0, 1]
        assert holder.buffered == 2
        await fanout.aclose()
        assert fanout.statistics().buffered == 0
        with pytest.raises(StopAsyncIteration):
            await anext(holder)
        with pytest.raises(StopAsyncIteration):
            await anext(reader)
    assert probe.finally_runs == 1


async def test_aclose_closes_a_source_suspended_between_items(probe: Probe) -> None:
    """A source suspended at ``yield`` is closed (its finally runs) exactly once."""
    fanout = Fanout(probe)
    consumer = fanout.consumer()
    probe.feed(0)
    with anyio.fail_after(5):
        assert await anext(consumer) == 0
        assert probe.finally_runs == 0
        await fanout.aclose()
        await fanout.aclose()
    assert probe.finally_runs == 1
    assert probe.pulls == 1


async def test_aclose_before_any_pull() -> None:
    """``aclose()`` on a fan-out that never pulled ends consumers and is idempotent."""
    source = NumbersIterable(3)
    fanout = Fanout(source)
    consumer = fanout.consumer()
    await fanout.aclose()
    await fanout.aclose()
    assert source.aiter_calls == 0
    with pytest.raises(StopAsyncIteration):
        await anext(consumer)
    with pytest.raises(anyio.ClosedResourceError):
        fanout.consumer()


async def test_consumer_as_async_context_manager(probe: Probe) -> None:
    """``async with fanout.consumer() as c`` iterates, and leaving it unregisters c."""
    fanout = Fanout(probe)
    other = fanout.consumer()
    probe.feed(*range(4))
    with anyio.fail_after(5):
        async with fanout.consumer() as consumer:
            assert isinstance(consumer, FanoutConsumer)
            assert fanout.statistics().consumers == 2
            assert await take(consumer, 3) == [0, 1, 2]
            assert fanout.statistics().buffered == 3
        assert fanout.statistics().consumers == 1
        assert fanout.statistics().buffered == 3  # held for ``other`` only
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)
        assert await take(other, 4) == [0, 1, 2, 3]
    assert fanout.statistics().buffered == 0
    await fanout.aclose()


async def test_source_exhaustion_ends_every_consumer(probe: Probe) -> None:
    """When the source ends, waiting consumers end; others end after their items."""
    fanout = Fanout(probe)
    waiting = [fanout.consumer() for _ in range(3)]
    behind = fanout.consumer()
    ended: list[int] = []

    async def run(i: int) -> None:
        assert await drain(waiting[i]) == [0, 1]
        ended.append(i)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(run, i)
            await settle()
            probe.feed(0, 1)
            await settle()
            assert ended == []
            probe.end()
        assert sorted(ended) == [0, 1, 2]
        assert await drain(behind) == [0, 1]
        late = fanout.consumer()
        assert await drain(late) == []
    assert probe.finally_runs == 1
    assert fanout.statistics().buffered == 0
    assert fanout.statistics().consumers == 0


@pytest.mark.parametrize("source", [42, [1, 2, 3], "abc", None])
async def test_non_async_iterable_source_raises_type_error(source: Any) -> None:
    """``Fanout`` of something without ``__aiter__`` raises ``TypeError``."""
    with pytest.raises(TypeError):
        Fanout(source)


@attrs.define
class NumbersIterator:
    """A class-based async iterator (not a generator) recording ``aclose`` calls."""

    owner: NumbersIterable
    next_item: int = 0

    def __aiter__(self) -> NumbersIterator:
        return self

    async def __anext__(self) -> int:
        await anyio.lowlevel.checkpoint()
        if self.next_item >= self.owner.n:
            raise StopAsyncIteration
        self.next_item += 1
        return self.next_item - 1

    async def aclose(self) -> None:
        self.owner.aclose_calls += 1


@attrs.define
class NumbersIterable:
    """An async iterable class yielding ``range(n)`` from a fresh iterator each time."""

    n: int
    aiter_calls: int = 0
    aclose_calls: int = 0

    def __aiter__(self) -> AsyncIterator[int]:
        self.aiter_calls += 1
        return NumbersIterator(self)


async def test_async_iterable_class_is_iterated_once() -> None:
    """A class-based async iterable has ``aiter`` called once for all consumers."""
    source = NumbersIterable(20)
    fanout = Fanout(source)
    consumers = [fanout.consumer() for _ in range(4)]
    with anyio.fail_after(5):
        assert await take(consumers[0], 5) == list(range(5))
        late = fanout.consumer()
        for consumer in consumers[1:]:
            assert await take(consumer, 10) == list(range(10))
        assert await take(late, 5) == list(range(5, 10))
        assert source.aiter_calls == 1
        await fanout.aclose()
        await fanout.aclose()
    assert source.aiter_calls == 1
    assert source.aclose_calls == 1


# --- property-based -------------------------------------------------------------------

Op = Literal["register", "take", "cancel", "close", "feed"]
program_strategy = st.lists(
    st.tuples(
        st.sampled_from(["register", "take", "cancel", "close", "feed"]),
        st.sampled_from([0, 0, 0, 1, 1, 2, 3]),  # favour interplay on few consumers
    ),
    max_size=40,
)


@attrs.define(eq=False)
class Slot:
    """Model of one consumer: where it joined, what it got, its pending take."""

    consumer: FanoutConsumer[int]
    start: int
    received: list[int] = attrs.field(factory=lambda: list[int]())
    pending: anyio.CancelScope | None = None
    closed: bool = False


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=50, deadline=None)
@given(program=program_strategy)
# The pulling consumer cancelled mid-pull, then served the pulled item.
@example(
    program=[
        ("register", 0),
        ("register", 1),
        ("take", 0),
        ("take", 1),
        ("cancel", 0),
        ("feed", 0),
        ("take", 0),
        ("feed", 0),
        ("take", 1),
    ]
)
# A consumer closed mid-pull; a late joiner; the last consumer leaves mid-pull.
@example(
    program=[
        ("register", 0),
        ("take", 0),
        ("register", 1),
        ("take", 1),
        ("close", 0),
        ("feed", 0),
        ("register", 2),
        ("take", 2),
        ("cancel", 2),
        ("close", 1),
        ("close", 2),
        ("feed", 0),
        ("register", 3),
        ("take", 3),
        ("feed", 0),
    ]
)
def test_random_programs_match_the_reference_model(
    backend: tuple[str, dict[str, Any]], program: list[tuple[Op, int]]
) -> None:
    """Any register/take/cancel/close/feed program keeps every stream exact."""

    async def body() -> None:
        with Probe() as probe:
            fanout = Fanout(probe)
            slots: list[Slot | None] = [None] * 4
            history: list[Slot] = []
            fed = 0
            closing = False
            high_water = 0  # the largest item count any take ever demanded

            async def take_one(slot: Slot, scope: anyio.CancelScope) -> None:
                with scope:
                    try:
                        item = await anext(slot.consumer)
                    except StopAsyncIteration:
                        assert slot.closed or closing
                    else:
                        slot.received.append(item)
                if slot.pending is scope:
                    slot.pending = None

            def check() -> None:
                stats = fanout.statistics()
                live = [s for s in slots if s is not None and not s.closed]
                pending = [s for s in live if s.pending is not None]
                for s in history:
                    expected = list(range(s.start, s.start + len(s.received)))
                    assert s.received == expected
                assert stats.pulled <= high_water
                assert stats.pulled <= fed
                assert stats.consumers == len(live)
                assert stats.waiting == len(pending)
                for s in pending:  # a waiter has nothing buffered ...
                    assert s.start + len(s.received) == stats.pulled
                if pending:  # ... and is never left waiting while items are ready
                    assert stats.pulled == fed
                cursors = [s.start + len(s.received) for s in live]
                expected_buffered = stats.pulled - min(cursors) if cursors else 0
                assert stats.buffered == expected_buffered
                assert probe.pulls == stats.pulled + probe.active
                assert probe.max_active <= 1
                assert probe.finally_runs == 0

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for op, index in program:
                        slot = slots[index]
                        usable = slot is not None and not slot.closed
                        if op == "register" and not usable:
                            start = fanout.statistics().pulled
                            slot = slots[index] = Slot(fanout.consumer(), start)
                            history.append(slot)
                        elif op == "take" and slot is not None and usable:
                            if slot.pending is None:
                                demand = slot.start + len(slot.received) + 1
                                high_water = max(high_water, demand)
                                slot.pending = anyio.CancelScope()
                                tg.start_soon(take_one, slot, slot.pending)
                        elif op == "cancel" and slot is not None:
                            if slot.pending is not None:
                                slot.pending.cancel()
                        elif op == "close" and slot is not None and usable:
                            slot.closed = True
                            slot.consumer.close()
                        elif op == "feed":
                            probe.feed(fed)
                            fed += 1
                        await settle()
                        check()
                    closing = True
                    await fanout.aclose()
            assert all(s.pending is None for s in history)
            assert probe.aiter_calls <= 1
            assert probe.finally_runs == probe.aiter_calls
            assert probe.active == 0
            assert fanout.statistics().buffered == 0

    run_on_backend(body, backend)


class Token:
    """An item whose lifetime a test can watch (through a weak reference)."""

    def __init__(self, number: int) -> None:
        self.number = number


async def tokens(n: int, made: list[weakref.ref[Token]]) -> AsyncIterator[Token]:
    for number in range(n):
        box = [Token(number)]
        made.append(weakref.ref(box[0]))
        yield box.pop()  # keep no reference in this frame while suspended


def alive(made: list[weakref.ref[Token]]) -> list[int]:
    return [token.number for ref in made if (token := ref()) is not None]


async def test_an_item_is_freed_when_the_last_consumer_that_needs_it_reads_it() -> None:
    """Nothing but the consumers still to read an item keeps it alive."""
    made: list[weakref.ref[Token]] = []
    fanout = Fanout(tokens(6, made))
    first, second = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(5):
        for _ in range(6):
            await anext(first)
        assert alive(made) == list(range(6))  # all held for `second`
        for number in range(6):
            assert (await anext(second)).number == number
            assert alive(made) == list(range(number + 1, 6))
    await fanout.aclose()


async def test_a_leaving_consumer_frees_what_only_it_held() -> None:
    """Closing (or dropping) the slowest consumer frees the items only it needed."""
    made: list[weakref.ref[Token]] = []
    fanout = Fanout(tokens(8, made))
    reader, slow, dropped = fanout.consumer(), fanout.consumer(), fanout.consumer()
    with anyio.fail_after(5):
        for _ in range(8):
            await anext(reader)
        for _ in range(3):
            await anext(slow)
        assert alive(made) == list(range(8))  # `dropped` has read nothing
        del dropped
        gc.collect()
        assert alive(made) == list(range(3, 8))
        slow.close()
        assert alive(made) == []
    await fanout.aclose()


@pytest.mark.parametrize("on_lag", ["wait", "error"])
async def test_consumers_collected_while_the_fanout_scans_them_are_tolerated(
    on_lag: Literal["wait", "error"],
) -> None:
    """A consumer closed by a finaliser in the middle of a scan of the consumers
    (the lag bound's) breaks nothing: garbage collection runs at allocations."""
    fanout = Fanout(counting_source(30), max_lag=2, on_lag=on_lag)
    fast = fanout.consumer()
    slow = [fanout.consumer() for _ in range(40)]  # all at the oldest item
    generations = [200]

    class Holder:
        """Closes its consumer when collected, as a subscription consumer does,
        and leaves new cyclic garbage behind, so collections keep finding some."""

        def __init__(self) -> None:
            self.consumer = fanout.consumer()
            self.cycle = self

        def __del__(self) -> None:
            self.consumer.close()
            if generations[0] > 0:
                generations[0] -= 1
                Holder()

    threshold = gc.get_threshold()
    received: list[int] = []

    async def read_fast() -> None:
        async for item in fast:
            received.append(item)

    try:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                Holder()
                gc.set_threshold(1)  # collect at (almost) every allocation
                tg.start_soon(read_fast)
                await anyio.wait_all_tasks_blocked()
                gc.set_threshold(*threshold)
                for consumer in slow:
                    consumer.close()
    finally:
        gc.set_threshold(*threshold)
        generations[0] = 0
    gc.collect()
    assert received == list(range(30))
    await fanout.aclose()


async def test_cancelled_waits_leave_nothing_behind(probe: Probe) -> None:
    """Waits cancelled while the source is silent hold nothing until an item comes."""
    fanout = Fanout(probe)
    patient, impatient = fanout.consumer(), fanout.consumer()
    received: list[int] = []

    async def wait_patiently() -> None:
        received.append(await anext(patient))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_patiently)
        await settle()
        for _ in range(50):
            with anyio.CancelScope() as scope:
                scope.cancel()
                await anext(impatient)
            with anyio.move_on_after(0):
                await anext(impatient)
        # Only the patient consumer's wait is held (on asyncio, one future).
        arrival = fanout._state.arrival  # pyright: ignore[reportPrivateUsage]
        futures = getattr(arrival, "_futures", None)
        if futures is not None:
            assert len(futures) == 1
        assert fanout.statistics().waiting == 1
        probe.feed(7)
    assert received == [7]
    with anyio.fail_after(5):
        assert await anext(impatient) == 7
    await fanout.aclose()


class _SyncRaising:
    """A source whose plain ``__anext__`` raises at the end instead of awaiting."""

    def __init__(self, items: int, error: Exception | None) -> None:
        self._left = items
        self._count = 0
        self._error = error

    def __aiter__(self) -> _SyncRaising:
        return self

    def __anext__(self) -> Any:
        if self._count == self._left:
            raise self._error or StopAsyncIteration
        self._count += 1
        return self._value(self._count)

    async def _value(self, value: int) -> int:
        return value


@pytest.mark.parametrize("error", [None, ValueError("boom")])
async def test_a_source_anext_that_raises_synchronously_ends_every_consumer(
    error: Exception | None,
) -> None:
    """An ``__anext__`` raising before returning an awaitable ends every consumer."""
    fanout = Fanout(_SyncRaising(3, error))
    first, second = fanout.consumer(), fanout.consumer()
    for consumer in (first, second):
        with anyio.fail_after(5):
            assert await take(consumer, 3) == [1, 2, 3]
            if error is None:
                assert [item async for item in consumer] == []
            else:
                with pytest.raises(ValueError, match="boom"):
                    await anext(consumer)
    await fanout.aclose()
