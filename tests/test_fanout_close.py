"""Closing a consumer, dropping it, or closing the fan-out.

A consumer closed (or dropped) mid-wait ends, and the pull it asked for goes
on for the others; the last consumer leaving lets the pull in flight finish
and starts no other. ``Fanout.aclose()`` cancels the pull in the pump (however
busily it polls), closes the source exactly once and ends every consumer, is
idempotent, and frees a fan-out dropped mid-pull without logging the pull's
later error.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _loops import asyncio_only
from _stubs import TIMEOUT
from _stubs import Boom
from _stubs import NumbersIterable
from _stubs import Probe
from _stubs import PullTasks
from _stubs import checkpoints
from _stubs import current_task
from _stubs import poll
from _stubs import running_tasks
from _stubs import settle
from _stubs import take
from _stubs import uvloop_too
from _stubs import wait_until_waiting

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer

pytestmark = pytest.mark.anyio

#: Checkpoints per pull in the multi-step sources below.
K = 3

N_ITEMS = 6
TARGET = 3


# --- closing or dropping a consumer --------------------------------------------


async def test_consumer_closed_mid_wait_does_not_disturb_others(probe: Probe) -> None:
    """A waiting consumer that is ``aclose()``d ends; the pull and the others go on."""
    fanout = Fanout(probe, read_ahead=0)  # counts the pulls
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


async def test_consumer_as_async_context_manager(probe: Probe) -> None:
    """``async with fanout.consumer() as c`` iterates, and leaving it unregisters c."""
    fanout = Fanout(probe, read_ahead=0)  # counts what is buffered
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


@uvloop_too
async def test_closing_the_consumer_that_started_a_pull_spares_the_others() -> None:
    """Closing the consumer that started a pull ends it; the pull serves the rest."""
    # Closed from another task while its pull polls; once the source is exhausted
    # nothing is left: no consumer, no buffered item, no pull, no task.
    reached, go, finalized = anyio.Event(), anyio.Event(), anyio.Event()

    async def source() -> AsyncIterator[int]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            for number in range(N_ITEMS):
                await anyio.lowlevel.checkpoint()
                if number == TARGET:
                    await anyio.lowlevel.checkpoint()
                    reached.set()
                    while not go.is_set():
                        await poll(give_up_at)
                await checkpoints(K - 1)
                yield number
        finally:
            finalized.set()

    await anyio.wait_all_tasks_blocked()
    baseline = running_tasks()
    fanout = Fanout(source(), read_ahead=0)  # the starter starts the pulls
    starter = fanout.consumer()
    others = [fanout.consumer() for _ in range(3)]
    other_items: list[list[int]] = [[] for _ in others]
    starter_items: list[int] = []
    starter_end: list[str] = []
    starter_out = anyio.Event()

    async def run_starter() -> None:
        while len(starter_items) < TARGET:  # it starts these pulls alone
            starter_items.append(await anext(starter))
        try:
            starter_items.append(await anext(starter))  # starts pull TARGET
        except StopAsyncIteration:
            starter_end.append("ended")
        starter_out.set()

    async def run_other(index: int) -> None:
        async for item in others[index]:
            other_items[index].append(item)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_starter)
            await reached.wait()
            assert fanout.statistics().waiting == 1  # the starter waits for it
            for index in range(len(others)):
                tg.start_soon(run_other, index)
            await wait_until_waiting(fanout, len(others) + 1)
            starter.close()
            assert fanout.statistics().consumers == len(others)
            await starter_out.wait()  # its pending anext ended at the close...
            assert starter_end == ["ended"]
            assert fanout.statistics().pulling  # ...while the pull goes on
            go.set()
    assert starter_items == list(range(TARGET))
    assert other_items == [list(range(N_ITEMS))] * len(others)
    assert finalized.is_set()
    statistics = fanout.statistics()
    assert (statistics.consumers, statistics.buffered, statistics.pulling) == (
        0,
        0,
        False,
    )
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(StopAsyncIteration):
            await anext(starter)
        await anyio.wait_all_tasks_blocked()
    assert running_tasks() == baseline  # no pump is left


@uvloop_too
async def test_closing_the_only_consumer_lets_its_pull_finish_and_starts_no_more() -> (
    None
):
    """With its only consumer closed, the pull in flight finishes; no other starts."""
    reached, go, finalized = anyio.Event(), anyio.Event(), anyio.Event()
    polled: list[str] = []

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            yield "warm-up"
            await anyio.lowlevel.checkpoint()
            reached.set()
            while not go.is_set():
                await poll(give_up_at)
            polled.append("polled")
            yield "polled"
            polled.append("never pulled")
            yield "never pulled"
        finally:
            finalized.set()

    await anyio.wait_all_tasks_blocked()
    baseline = running_tasks()
    fanout = Fanout(source())
    consumer = fanout.consumer()
    ended = anyio.Event()

    async def read() -> None:
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)
        ended.set()

    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == "warm-up"
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await reached.wait()
            consumer.close()
            await ended.wait()  # its pending anext ended at the close...
            assert fanout.statistics().pulling  # ...while the pull goes on
            go.set()
        await anyio.wait_all_tasks_blocked()
    assert polled == ["polled"]
    statistics = fanout.statistics()
    assert (
        statistics.consumers,
        statistics.buffered,
        statistics.pulling,
        statistics.pulled,
    ) == (0, 0, False, 2)
    # the pull ended; the pump waits, parked, for the next consumer
    assert running_tasks() == baseline + 1
    assert not finalized.is_set()
    with anyio.fail_after(TIMEOUT):
        await fanout.aclose()
        await anyio.wait_all_tasks_blocked()
    assert finalized.is_set()
    assert running_tasks() == baseline


@uvloop_too
async def test_a_consumer_closed_in_the_first_step_of_its_own_pull_ends_at_once() -> (
    None
):
    """Closed before the pull its call started first suspends, a consumer ends."""
    # Its pending anext ends while the pull is still in flight, as when it is
    # closed at any later step; under an eager task factory that first step
    # runs inside the consumer's own call (as the pump).
    go = anyio.Event()
    holder: list[FanoutConsumer[int]] = []

    async def source() -> AsyncIterator[int]:
        yield 0
        holder[0].close()  # the consumer whose anext started this pull
        await go.wait()
        yield 1

    fanout = Fanout(source(), read_ahead=0)  # the second pull is the starter's
    starter, other = fanout.consumer(), fanout.consumer()
    holder.append(starter)
    outcome: list[str] = []

    async def read() -> None:
        try:
            await anext(starter)
        except StopAsyncIteration:
            outcome.append("ended")
        else:
            outcome.append("item")

    with anyio.fail_after(TIMEOUT):
        assert await anext(starter) == 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()  # the pull waits for go
            observed = (list(outcome), fanout.statistics().pulling)
            go.set()
        assert [item async for item in other] == [0, 1]
    assert observed == (["ended"], True)
    assert outcome == ["ended"]


# --- Fanout.aclose() -----------------------------------------------------------


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
    fanout = Fanout(probe, read_ahead=0)  # so that no pull is in flight
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


@uvloop_too
async def test_aclose_ends_a_busy_polling_pull_and_every_pending_consumer() -> None:
    """aclose() cancels a polling pull in its task and ends every pending consumer."""
    # The pending anext of the pull's starter and of the consumer beside it end;
    # the source's finally runs once, in the pump; no pull or task remains.
    polling, finalized = anyio.Event(), anyio.Event()
    finally_tasks: list[object] = []
    through_source: list[BaseException] = []
    pull_tasks = PullTasks()

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            pull_tasks.begin()
            yield "warm-up"
            pull_tasks.begin()
            while True:
                await poll(give_up_at)
                pull_tasks.step()
                polling.set()
        except BaseException as error:
            through_source.append(error)
            raise
        finally:
            finally_tasks.append(current_task())
            finalized.set()

    await anyio.wait_all_tasks_blocked()
    baseline = running_tasks()
    fanout = Fanout(source())
    consumer, other = fanout.consumer(), fanout.consumer()
    outcome: dict[str, str] = {}
    consumer_tasks: list[object] = [current_task()]

    async def wait_for_next(name: str, consumer: FanoutConsumer[str]) -> None:
        consumer_tasks.append(current_task())
        try:
            await anext(consumer)
        except StopAsyncIteration:
            outcome[name] = "ended"
        else:
            outcome[name] = "item"

    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == "warm-up"
        assert await anext(other) == "warm-up"
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_next, "starter", consumer)
            await polling.wait()
            tg.start_soon(wait_for_next, "other", other)
            await wait_until_waiting(fanout, 2)
            assert fanout.statistics().pulling
            await fanout.aclose()
            assert finalized.is_set()
    assert outcome == {"starter": "ended", "other": "ended"}
    # Cancelled, not given up: a pull aclose() left polling would raise PollGaveUp.
    assert [type(error) for error in through_source] == [
        anyio.get_cancelled_exc_class()
    ]
    assert len(finally_tasks) == 1
    assert finally_tasks[0] is pull_tasks.current  # ended inside the pump
    pull_tasks.check(consumer_tasks, pulls=2)
    assert not fanout.statistics().pulling
    await anyio.wait_all_tasks_blocked()
    assert running_tasks() == baseline  # no pump is left
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)


@uvloop_too
async def test_aclose_cancels_the_pull_a_running_pump_waits_in() -> None:
    """``aclose()`` cancels the pull a running pump waits in and ends its consumer."""
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


async def test_a_source_closing_its_own_fan_out_finishes_its_pull_uncancelled() -> None:
    """A source that closes its own fan-out in a pull gets no cancellation:
    ``aclose()`` returns at once, the pull's later awaits go through, its
    consumer ends, and the source is closed once the pull returns."""
    steps: list[str] = []
    fanout: Fanout[int] | None = None
    closed = anyio.Event()

    async def source() -> AsyncIterator[int]:
        try:
            assert fanout is not None
            await fanout.aclose()
            await anyio.lowlevel.checkpoint()
            steps.append("checkpoint passed")
            yield 1
        finally:
            steps.append("closed")
            closed.set()

    fanout = Fanout(source())
    consumer = fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)
        await closed.wait()
    assert steps == ["checkpoint passed", "closed"]
    assert fanout.closed
    assert consumer.closed


@asyncio_only
async def test_aclose_cancels_an_asyncio_sources_pull_once() -> None:
    """On asyncio, ``aclose()`` cancels the pull in flight with one
    :exc:`asyncio.CancelledError`, as a task is cancelled: the source's
    handler awaits its cleanup unshielded and is not cancelled again."""
    steps: list[str] = []

    async def source() -> AsyncIterator[int]:
        try:
            await anyio.sleep_forever()
            yield 0
        except asyncio.CancelledError:
            await anyio.lowlevel.checkpoint()
            await anyio.lowlevel.checkpoint()
            steps.append("cleaned up")
            raise

    fanout = Fanout(source())
    consumer = fanout.consumer()

    async def wait_for_next() -> None:
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_next)
            await anyio.wait_all_tasks_blocked()
            assert fanout.statistics().pulling
            await fanout.aclose()
    assert steps == ["cleaned up"]


class Held:
    """A source whose items come ready until ``hold`` is set; then each pull
    waits for ``release`` and raises :exc:`Boom`."""

    def __init__(self, hold_from: int | None = None) -> None:
        self.hold = False
        self.hold_from = hold_from  # holds from this item on, if set
        self.release = anyio.Event()
        self.closed = False

    async def items(self) -> Any:
        try:
            number = 0
            while True:
                if self.hold or number == self.hold_from:
                    await self.release.wait()
                    raise Boom(number)
                yield number
                number += 1
        finally:
            self.closed = True


async def test_closing_during_a_ready_sources_suspended_pull_cancels_it() -> None:
    """A pull that suspends after ready ones is cancelled by ``aclose()``,
    which closes the source and ends the waiting consumer."""
    source = Held()
    fanout = Fanout(source.items())
    consumer = fanout.consumer()
    ended: list[str] = []

    async def wait_for_the_held_item() -> None:
        async for _ in consumer:
            pass
        ended.append("end")

    with anyio.fail_after(TIMEOUT):
        assert [await anext(consumer) for _ in range(4)] == [0, 1, 2, 3]
        source.hold = True
        async with anyio.create_task_group() as group:
            group.start_soon(wait_for_the_held_item)
            await anyio.wait_all_tasks_blocked()
            assert fanout.statistics().pulling
            await fanout.aclose()
    assert ended == ["end"]
    assert source.closed
    assert not fanout.statistics().pulling


@pytest.mark.parametrize("read_ahead", [0, 64])
async def test_a_fan_out_dropped_mid_pull_is_freed_and_its_pulls_error_is_not_logged(
    caplog: pytest.LogCaptureFixture, read_ahead: int
) -> None:
    """Dropped while a pull waits (after ready ones): nothing keeps the
    fan-out alive, and the pull's later error is dealt with, not reported."""
    import gc

    source = Held(hold_from=4)
    fanout = Fanout(source.items(), read_ahead=read_ahead)
    consumer = fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        assert [await anext(consumer) for _ in range(4)] == [0, 1, 2, 3]
        with anyio.CancelScope() as scope:
            scope.deadline = anyio.current_time()  # gives up at its wait
            await anext(consumer)
        assert scope.cancelled_caught
        assert fanout.statistics().pulling
        state = weakref.ref(fanout)
        del fanout, consumer
        # (trio keeps the Cancelled last thrown into this task, with its
        # traceback, until the task is next rescheduled.)
        await anyio.lowlevel.checkpoint()
        gc.collect()
        assert state() is None
        source.release.set()
        for _ in range(5):  # the pump ends, its callback runs
            await anyio.lowlevel.checkpoint()
        await anyio.wait_all_tasks_blocked()
        gc.collect()
    assert [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


async def test_aclose_completes_when_called_from_a_cancelled_scope() -> None:
    """``aclose()`` called inside a scope already cancelled still interrupts
    the pull in flight, has the pump close the source and waits for it."""
    closed: list[str] = []

    async def source() -> AsyncIterator[int]:
        try:
            yield 0
            await anyio.sleep_forever()
            yield 1
        finally:
            with anyio.CancelScope(shield=True):  # as trio code cleans up
                await anyio.lowlevel.checkpoint()
            closed.append("source")

    fanout = Fanout(source())
    consumer = fanout.consumer()
    ended: list[bool] = []

    async def read_on() -> None:
        async for _ in consumer:
            pass
        ended.append(True)

    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_on)  # a pull now waits in the source
            await anyio.wait_all_tasks_blocked()
            with anyio.CancelScope() as scope:
                scope.cancel()
                await fanout.aclose()
            assert closed == ["source"]
            assert fanout.statistics().pulling is False
        assert ended == [True]
