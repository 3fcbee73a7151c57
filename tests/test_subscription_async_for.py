"""``async for`` over a subscription consumer: ``aiter(consumer)`` is the consumer.

``SubscriptionConsumer.__aiter__`` returns the consumer, so a loop yields what
``anext()`` would (replay, buffered, then live events, in order) and counts in
the view a later resync diffs against; leaving a loop does not end the
consumer (``aclose()`` does); a cancelled loop ends only its own consumer; a
raw stream error ends every loop after the events before it; ``aiter()``
joins nothing; a consumer a loop left is released once dropped.
"""

from __future__ import annotations

import gc
from typing import cast

import anyio
import anyio.lowlevel
import pytest
from _stubs import LEAVING
from _stubs import TIMEOUT
from _stubs import AcloseStub
from _stubs import StreamStub
from _stubs import ended
from _stubs import ev
from _stubs import join
from _stubs import loop_take
from _stubs import make_stub
from _stubs import meta
from _stubs import pairs
from _stubs import read_in_loops
from _stubs import read_until_raises
from _stubs import settle
from _stubs import subscribe
from _stubs import take
from wool import DiscoveryEvent

from wool_pooling import PoolStatistics
from wool_pooling import SubscriptionConsumer
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio


async def test_subscription_loop_yields_replay_buffered_and_live_events_in_order() -> (
    None
):
    """A subscription loop yields what ``anext`` does: replay, buffered, live."""
    # A late joiner's loop finishes its replay before the live events buffered
    # meanwhile.
    stub = make_stub()
    workers = [meta() for _ in range(7)]
    events = [ev("worker-added", worker) for worker in workers]
    async with SubscriptionPool():
        sub = subscribe(stub)
        reference, subject = aiter(sub), aiter(sub)
        await join(stub, reference, subject, first=events[0])
        raw = stub.instances[-1]
        raw.push(*events[1:4])
        assert pairs(await take(reference, 3)) == pairs(events[1:4])
        got: list[DiscoveryEvent] = []

        async def run() -> None:
            got.extend(await loop_take(subject, 4))

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await settle()
                assert pairs(got) == []  # three read, then waiting for the fourth
                raw.push(events[4])
        assert pairs(got) == pairs(events[1:5])
        assert pairs(await take(reference, 1)) == pairs(events[4:5])

        late = aiter(sub)
        replay = await take(late, 1)  # joins: five workers to replay
        raw.push(*events[5:7])
        assert pairs(await take(reference, 2)) == pairs(events[5:7])
        replay += await loop_take(late, 4)
        assert sorted(pairs(replay), key=lambda pair: pair[1].uid) == sorted(
            pairs(events[:5]), key=lambda pair: pair[1].uid
        )
        assert pairs(await loop_take(late, 2)) == pairs(events[5:7])
        assert pairs(await loop_take(subject, 2)) == pairs(events[5:7])
        assert raw.aiter_calls == 1
        for consumer in (reference, subject, late):
            await consumer.aclose()


async def test_subscription_concurrent_async_for_loops_each_get_everything_once() -> (
    None
):
    """Concurrent subscription loops, left and re-entered, each get all events once."""
    stub = make_stub()
    n, burst = 20, 5
    events = [ev("worker-added", meta()) for _ in range(n)]
    every = [1, 2, 3, n]
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        consumers = [aiter(sub) for _ in every]
        results: list[list[DiscoveryEvent]] = [[] for _ in every]

        async def run(index: int) -> None:
            await read_in_loops(
                consumers[index], n, every[index], results[index], pace=index
            )

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                for index in range(len(every)):
                    tg.start_soon(run, index)
                await settle()
                assert pool.statistics().consumers == len(every)
                raw = stub.instances[-1]
                for start in range(0, n, burst):
                    await settle()
                    assert [pairs(r) for r in results] == [pairs(events[:start])] * len(
                        every
                    )
                    raw.push(*events[start : start + burst])
        assert [pairs(r) for r in results] == [pairs(events)] * len(every)
        assert raw.aiter_calls == 1
        assert len(stub.instances) == 1
        for consumer in consumers:
            await consumer.aclose()
        assert raw.closes_done == 1


async def test_subscription_async_for_keeps_the_view_a_resync_diffs_against() -> None:
    """Events a loop reads count in the view a later resync diffs against."""
    stub = cast(
        "type[StreamStub]",
        shared_subscription(max_lag=2)(
            type("AcloseStub", (AcloseStub,), {"instances": []})
        ),
    )
    first, a, b, c, d, e = (meta() for _ in range(6))
    b2 = meta(b.uid, pid=2)
    async with SubscriptionPool():
        sub = subscribe(stub)
        fast, slow = aiter(sub), aiter(sub)
        await join(stub, fast, slow, first=ev("worker-added", first))
        raw = stub.instances[-1]
        told = [ev("worker-added", a), ev("worker-added", b)]
        raw.push(*told)
        assert pairs(await take(fast, 2)) == pairs(told)
        assert pairs(await loop_take(slow, 2)) == pairs(told)  # from the buffer
        missed = [
            ev("worker-dropped", a),
            ev("worker-added", c),
            ev("worker-updated", b2),
            ev("worker-added", d),
        ]
        raw.push(*missed)
        assert pairs(await take(fast, 4)) == pairs(missed)  # the slow one lags
        resync = await loop_take(slow, 4)
        assert sorted(pairs(resync), key=lambda pair: (pair[0], pair[1].uid)) == sorted(
            [
                ("worker-dropped", a),
                ("worker-updated", b2),
                ("worker-added", c),
                ("worker-added", d),
            ],
            key=lambda pair: (pair[0], pair[1].uid),
        )
        live = ev("worker-added", e)
        raw.push(live)
        assert pairs(await take(fast, 1)) == pairs([live])
        assert pairs(await loop_take(slow, 1)) == pairs([live])
        await fast.aclose()
        await slow.aclose()


async def test_subscription_source_error_ends_the_loop_after_the_events_before_it() -> (
    None
):
    """A raw stream error ends subscription loops after the events before it."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(3)]
    error = ValueError("boom")
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        first, behind = aiter(sub), aiter(sub)
        await join(stub, first, behind, first=events[0])
        raw = stub.instances[-1]
        outcome: list[tuple[list[DiscoveryEvent], Exception]] = []

        async def run() -> None:
            outcome.append(await read_until_raises(first))

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await settle()
                raw.push(*events[1:])
                await settle()
                raw.fail(error)
        [(got, caught)] = outcome
        assert pairs(got) == pairs(events[1:])
        assert caught is error
        assert [event async for event in first] == []
        assert pool.statistics().consumers == 1
        got, caught = await read_until_raises(behind)
        assert pairs(got) == pairs(events[1:])  # from the buffer
        assert caught is error
        assert [event async for event in behind] == []
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)
        assert raw.close_calls == raw.closes_done == 1


async def test_subscription_consumer_outlives_a_left_loop_until_aclose() -> None:
    """Leaving a loop does not end a subscription consumer; ``aclose()`` does."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(6)]
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        consumer, other = aiter(sub), aiter(sub)
        await join(stub, consumer, other, first=events[0])
        raw = stub.instances[-1]
        raw.push(*events[1:5])
        assert pairs(await take(other, 4)) == pairs(events[1:5])
        for index, leave in enumerate(LEAVING, start=1):
            got = await loop_take(consumer, 1, leave)
            assert pairs(got) == pairs(events[index : index + 1])
        assert pool.statistics() == PoolStatistics(entries=1, consumers=2, idle=0)
        await other.aclose()
        assert pool.statistics() == PoolStatistics(entries=1, consumers=1, idle=0)
        got: list[DiscoveryEvent] = []

        async def run() -> None:
            got.extend(await loop_take(consumer, 2))

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await settle()
                raw.push(events[5])
        assert pairs(got) == pairs(events[4:6])  # a buffered one, an awaited one
        assert raw.close_calls == 0
        assert raw.finally_runs == 0
        await consumer.aclose()
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)
        assert raw.close_calls == raw.closes_done == 1
        assert raw.finally_runs == 1
        assert [event async for event in consumer] == []
        assert await ended(consumer)


async def test_subscription_cancelled_async_for_ends_only_that_consumer() -> None:
    """A subscription loop cancelled while it waits ends only its own consumer."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(3)]
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        victim, other = aiter(sub), aiter(sub)
        await join(stub, victim, other, first=events[0])
        raw = stub.instances[-1]
        scope = anyio.CancelScope()
        other_events: list[DiscoveryEvent] = []

        async def run_victim() -> None:
            with scope:
                async for _ in victim:
                    pass

        async def run_other() -> None:
            other_events.extend(await loop_take(other, 2))

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_victim)
                await settle()
                tg.start_soon(run_other)
                await settle()
                scope.cancel()
                await settle()
                assert scope.cancelled_caught
                assert pool.statistics().consumers == 1
                assert raw.close_calls == 0
                assert raw.finally_runs == 0
                raw.push(*events[1:])
        assert pairs(other_events) == pairs(events[1:])
        assert [event async for event in victim] == []
        assert await ended(victim)
        await other.aclose()
        assert raw.close_calls == 1


async def test_subscription_aiter_returns_the_consumer_and_joins_nothing() -> None:
    """``aiter()`` returns the subscription consumer itself and joins nothing."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        consumer = aiter(subscribe(stub))
        assert isinstance(consumer, SubscriptionConsumer)
        assert aiter(consumer) is consumer
        await settle()
        assert stub.instances == []
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)
        assert "NOT STARTED" in repr(consumer)
        event = ev("worker-added", meta())
        got: list[DiscoveryEvent] = []

        async def run() -> None:
            got.extend(await loop_take(consumer, 1))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await settle()
            assert len(stub.instances) == 1
            assert pool.statistics().consumers == 1
            stub.instances[0].push(event)
        assert pairs(got) == pairs([event])
        await consumer.aclose()
        assert pool.statistics().entries == 0


async def test_a_subscription_consumer_left_by_async_for_is_released_when_dropped() -> (
    None
):
    """A subscription consumer a loop left is released by refcounting once dropped."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(3)]
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        other = aiter(sub)
        holder = [aiter(sub)]
        await join(stub, other, holder[0], first=events[0])
        stub.instances[-1].push(*events[1:])
        assert pairs(await take(other, 2)) == pairs(events[1:])
        gc.disable()
        try:
            async for event in holder[0]:
                assert pairs([event]) == pairs(events[1:2])
                break
            assert pool.statistics().consumers == 2
            holder.clear()
            assert pool.statistics().consumers == 1
        finally:
            gc.enable()
        await other.aclose()
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)
