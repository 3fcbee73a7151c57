"""The ``Fanout`` / ``FanoutConsumer`` contract, without wool: delivery,
demand-driven pulls, the pump's lifetime, source errors and exhaustion, and
a reference model of random programs."""

from __future__ import annotations

import gc
import math
import traceback
import weakref
from collections.abc import AsyncGenerator
from typing import Any
from typing import Literal

import anyio
import anyio.lowlevel
import attrs
import pytest
from _loops import BACKENDS
from _loops import run as run_on_backend
from _stubs import Probe
from _stubs import counting_source
from _stubs import drain
from _stubs import expect_end
from _stubs import running_tasks
from _stubs import settle
from _stubs import take
from anyio.streams.memory import MemoryObjectReceiveStream
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer

# Sync tests (the hypothesis one) are ignored by anyio's plugin despite this mark.
pytestmark = pytest.mark.anyio


async def exploding_source(
    receive: MemoryObjectReceiveStream[int],
) -> AsyncGenerator[int, None]:
    """Yield the received ints; raise on a negative one."""
    async for item in receive:
        if item < 0:
            raise ValueError(f"source failed at {item}")
        yield item


# --- delivery ------------------------------------------------------------------


async def test_every_consumer_gets_every_later_item_in_order_once(
    probe: Probe,
) -> None:
    """Each consumer receives each item pulled after it registered, in order, once."""
    fanout = Fanout(probe, read_ahead=0)
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
            joined = fanout.statistics().pulled  # 20, and more if read ahead
            for i, consumer in enumerate(early[1:], 1):
                tg.start_soon(run, f"early{i}", consumer)
            tg.start_soon(run, "late", late)
            tg.start_soon(run, "early0", first)
    assert head == list(range(20))
    assert head + results["early0"] == list(range(50))
    for i in range(1, 4):
        assert results[f"early{i}"] == list(range(50))
    assert joined >= 20
    assert results["late"] == list(range(joined, 50))


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


# --- demand --------------------------------------------------------------------


async def test_nothing_is_pulled_before_a_consumer_waits(probe: Probe) -> None:
    """Creating the fan-out, registering consumers and ``__aiter__`` pull nothing."""
    probe.feed(*range(5))
    fanout = Fanout(probe, read_ahead=0)
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
    fanout = Fanout(probe, read_ahead=0)
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
    fanout = Fanout(probe, read_ahead=0)
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


async def test_no_pull_once_the_only_waiter_is_cancelled(probe: Probe) -> None:
    """After the pull in flight completes, no further pull starts without a waiter."""
    fanout = Fanout(probe, read_ahead=0)
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


# --- the pump's lifetime -------------------------------------------------------


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
    fanout = Fanout(probe, read_ahead=0)
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


# --- source errors and exhaustion ----------------------------------------------


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


# --- property-based ------------------------------------------------------------

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


@pytest.mark.parametrize("read_ahead", [0, 3])
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
    backend: tuple[str, dict[str, Any]],
    read_ahead: int,
    program: list[tuple[Op, int]],
) -> None:
    """Any register/take/cancel/close/feed program keeps every stream exact.

    With ``read_ahead=0`` the model pulls on demand only: never past the
    largest demand; with ``read_ahead=R``, never more than R past it."""

    async def body() -> None:
        with Probe() as probe:
            fanout = Fanout(probe, read_ahead=read_ahead)
            slots: list[Slot | None] = [None] * 4
            history: list[Slot] = []
            fed = 0
            closing = False
            high_water = 0  # the largest item count any take ever demanded
            # The demand of the last take that waited at the log's end, and
            # whether a consumer has been registered at every step since.
            reset: int | None = None
            continuous = False

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
                assert stats.pulled <= high_water + read_ahead
                if reset is not None and continuous:  # ... and reads that far
                    assert stats.pulled == min(fed, reset + read_ahead)
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
                                if demand == fanout.statistics().pulled + 1:
                                    reset, continuous = demand, True
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
                        if not any(s is not None and not s.closed for s in slots):
                            continuous = False
                        check()
                    closing = True
                    await fanout.aclose()
            assert all(s.pending is None for s in history)
            assert probe.aiter_calls <= 1
            assert probe.finally_runs == probe.aiter_calls
            assert probe.active == 0
            assert fanout.statistics().buffered == 0

    run_on_backend(body, backend)


# -- wait_readable(): waiting for an item without taking it ----------------------


async def test_wait_readable_starts_a_pull_and_leaves_the_item_to_read() -> None:
    with Probe() as probe:
        fanout = Fanout(probe, read_ahead=0)
        consumer, other = fanout.consumer(), fanout.consumer()
        with pytest.raises(anyio.WouldBlock):
            consumer.receive_nowait()
        readable = anyio.Event()

        async def wait() -> None:
            await consumer.wait_readable()
            readable.set()

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await settle()
                assert (probe.pulls, probe.active) == (1, 1)  # its wait pulls
                assert fanout.statistics().waiting == 1
                assert not readable.is_set()
                probe.feed(7)
                await readable.wait()
        assert consumer.receive_nowait() == 7
        assert other.receive_nowait() == 7
        assert probe.pulls == 1  # nothing pulled ahead of the next demand
        with pytest.raises(anyio.WouldBlock):
            consumer.receive_nowait()
        await fanout.aclose()


async def test_wait_readable_returns_at_once_when_an_item_or_the_end_is_there() -> None:
    fanout = Fanout(counting_source(1))
    consumer, reader = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(5):
        assert await anext(reader) == 0
        await consumer.wait_readable()  # item 0 is buffered
        assert fanout.statistics().pulled == 1
        assert consumer.receive_nowait() == 0
        await consumer.wait_readable()  # pulls: the source ends
        with pytest.raises(anyio.EndOfStream):
            consumer.receive_nowait()
        await consumer.wait_readable()  # ended
    assert consumer.closed
    await fanout.aclose()


async def test_cancelled_wait_readable_withdraws_only_its_own_demand() -> None:
    with Probe() as probe:
        fanout = Fanout(probe, read_ahead=0)
        consumer, other = fanout.consumer(), fanout.consumer()
        scope, got = anyio.CancelScope(), list[int]()

        async def wait() -> None:
            with scope:
                await consumer.wait_readable()

        async def read() -> None:
            got.append(await anext(other))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                tg.start_soon(read)
                await settle()
                assert fanout.statistics().waiting == 2
                scope.cancel()
                await settle()
                assert scope.cancelled_caught
                assert fanout.statistics().waiting == 1
                assert probe.active == 1  # the pull it started goes on
                probe.feed(3)
            assert got == [3]
            assert consumer.receive_nowait() == 3  # nothing lost
            probe.feed(4)
            await consumer.wait_readable()  # a new wait after a cancelled one
            assert consumer.receive_nowait() == 4
            assert probe.pulls == 2
        await fanout.aclose()


async def test_wait_readable_while_another_task_waits_is_busy() -> None:
    with Probe() as probe:
        fanout = Fanout(probe)
        consumer = fanout.consumer()
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.wait_readable)
                await settle()
                with pytest.raises(anyio.BusyResourceError):
                    await consumer.wait_readable()
                with pytest.raises(anyio.BusyResourceError):
                    await anext(consumer)
                with pytest.raises(anyio.BusyResourceError):
                    consumer.receive_nowait()
                probe.feed(1)
        assert consumer.receive_nowait() == 1
        await fanout.aclose()


async def test_wait_readable_returns_when_its_consumer_is_closed() -> None:
    with Probe() as probe:
        fanout = Fanout(probe)
        consumer = fanout.consumer()
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.wait_readable)
                await settle()
                consumer.close()
        assert fanout.statistics().waiting == 0
        with pytest.raises(anyio.EndOfStream):
            consumer.receive_nowait()
        await fanout.aclose()


async def test_position_counts_the_items_a_consumer_moved_past() -> None:
    """``position`` is the seq of the consumer's next item: it grows by one per
    item received, counts a skip once its ``Lagged`` is raised, and reads
    ``-1`` once the consumer has ended."""
    from wool_pooling import Lagged

    fanout: Fanout[int] = Fanout(counting_source(9), max_lag=2, on_lag="error")
    early = fanout.consumer()
    for item in range(3):
        fanout.inject(item)
    late = fanout.consumer()
    assert (early.position, late.position) == (0, 3)
    for item in range(3, 6):
        fanout.inject(item)
    assert early.position == 0  # left behind, the skip not yet reported
    with pytest.raises(Lagged) as lagged:
        early.receive_nowait()
    assert lagged.value.skipped == 4
    assert early.position == 4
    assert early.receive_nowait() == 4
    assert early.position == 5
    early.close()
    assert early.position == -1
    await fanout.aclose()


def test_the_state_consumers_share_is_the_fanout_in_a_dozen_fields() -> None:
    """What a consumer shares with its fan-out is the ``Fanout`` itself, and
    it, its pump and a consumer each hold at most twelve fields."""
    from wool_pooling._core.fanout import _Pump  # pyright: ignore[reportPrivateUsage]

    fanout: Fanout[int] = Fanout(counting_source(9))
    consumer = fanout.consumer()
    shared: Any = consumer._state  # pyright: ignore[reportPrivateUsage]
    assert shared is fanout
    for cls in (type(shared), _Pump, FanoutConsumer):
        fields = [name for name in cls.__slots__ if name != "__weakref__"]
        assert len(fields) <= 12, (cls.__name__, fields)
