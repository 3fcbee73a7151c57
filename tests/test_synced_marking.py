"""Marking the end of a first listing with ``mark_synced()``, and waiting for
it: a consumer joins when asked, and the shared view can be awaited.

The sources are scripted: a :class:`Feed` holds one memory stream per
iteration of the source; the test pushes each item, :data:`MARK` (the source
calls ``mark_synced()`` there) or an exception (the source raises it).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from _stubs import TIMEOUT
from _stubs import meta
from anyio.streams.memory import MemoryObjectReceiveStream
from anyio.streams.memory import MemoryObjectSendStream
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import RestartPolicy
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import mark_synced
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio

A, B, C = (meta(uuid.UUID(int=n), pid=n) for n in range(1, 4))
MARK = object()


def added(metadata: WorkerMetadata) -> DiscoveryEvent:
    return DiscoveryEvent("worker-added", metadata=metadata)


class Feed:
    """The runs of a scripted source, one memory stream each, and what each
    ``mark_synced()`` call returned."""

    def __init__(self, runs: int = 1) -> None:
        streams = [
            anyio.create_memory_object_stream[Any](math.inf) for _ in range(runs)
        ]
        self.sends: list[MemoryObjectSendStream[Any]] = [s for s, _ in streams]
        self.receives: list[MemoryObjectReceiveStream[Any]] = [r for _, r in streams]
        self.started = 0
        self.marked: list[bool] = []

    def push(self, *items: Any, run: int = 0) -> None:
        for item in items:
            self.sends[run].send_nowait(item)


class Scripted:
    """Yields what its feed's next run is given; marks the listing at
    :data:`MARK`; raises an exception given."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        feed = self.feed
        receive = feed.receives[feed.started]
        feed.started += 1
        async for item in receive:
            if item is MARK:
                feed.marked.append(mark_synced())
            elif isinstance(item, Exception):
                raise item
            else:
                yield item


Source = shared_subscription(type("Source", (Scripted,), {}))
Kept = shared_subscription(ttl=3600)(type("Kept", (Scripted,), {}))
OnDemand = shared_subscription(read_ahead=0)(type("OnDemand", (Scripted,), {}))
Restarting = shared_subscription(
    restart=RestartPolicy(backoff=0, jitter=0, settle=3600)
)(type("Restarting", (Scripted,), {}))


async def read(consumer: AsyncIterator[DiscoveryEvent]) -> WorkerMetadata:
    with anyio.fail_after(TIMEOUT):
        return (await anext(consumer)).metadata


# -- mark_synced() -------------------------------------------------------------


async def test_mark_synced_ends_the_first_listing_after_the_items_yielded() -> None:
    """``mark_synced()`` inside the source marks the listing right after the
    items it yielded so far: the consumer is synced once handed them, and
    the call returns ``True``."""
    feed = Feed()
    sub: SharedSubscription[DiscoveryEvent] = Source(feed)
    feed.push(added(A), added(B), MARK, added(C))
    async with SubscriptionPool(), aiter(sub) as consumer:
        assert await read(consumer) == A
        assert not consumer.synced
        assert await read(consumer) == B
        assert consumer.synced
        assert await read(consumer) == C
    assert feed.marked == [True]


async def test_a_late_joiner_after_mark_synced_is_synced_by_its_replay() -> None:
    """A consumer joining once the listing is marked is synced once handed
    its replay."""
    feed = Feed()
    sub = Source(feed)
    feed.push(added(A), MARK)
    async with SubscriptionPool(), aiter(sub) as first:
        with anyio.fail_after(TIMEOUT):
            await first.wait_synced()
        async with aiter(sub) as late:
            assert not late.synced
            assert await read(late) == A
            assert late.synced


async def test_mark_synced_ends_the_settle_time_of_a_restart() -> None:
    """After a restart, the new stream's ``mark_synced()`` drops at once the
    workers it did not report, as a yielded ``Synced`` does."""
    feed = Feed(runs=2)
    sub = Restarting(feed)
    feed.push(added(A), added(B), MARK)
    async with SubscriptionPool(), aiter(sub) as consumer:
        assert [await read(consumer), await read(consumer)] == [A, B]
        assert consumer.synced
        feed.push(RuntimeError("lost"), run=0)
        feed.push(added(A), MARK, run=1)
        with anyio.fail_after(TIMEOUT):
            event = await anext(consumer)
        assert (event.type, event.metadata) == ("worker-dropped", B)
        assert list(sub.workers()) == [A.uid]
    assert feed.marked == [True, True]


async def test_mark_synced_outside_a_shared_subscription_does_nothing() -> None:
    """Iterated directly, or by a plain ``Fanout``, the source's
    ``mark_synced()`` returns ``False`` and changes nothing; so does a call
    from the consumer's side."""
    feed = Feed(runs=2)
    raw = Scripted(feed)
    feed.push(added(A), MARK, added(B))
    feed.sends[0].close()
    assert [event.metadata async for event in raw] == [A, B]
    feed.push(MARK, added(C), run=1)
    fanout = Fanout(raw)
    async with fanout.consumer() as consumer:
        assert await read(consumer) == C
    await fanout.aclose()
    assert feed.marked == [False, False]
    assert mark_synced() is False


# -- a consumer joins when asked -----------------------------------------------


async def test_async_with_joins_the_consumer() -> None:
    """Entering ``async with`` joins: the entry is built and counts it
    before any read."""
    feed = Feed()
    sub = Source(feed)
    async with SubscriptionPool():
        async with aiter(sub) as consumer:
            assert feed.started == 0  # built, not iterated yet
            assert sub.statistics().consumers == 1
            assert repr(consumer).startswith("<SubscriptionConsumer [ACTIVE")
        assert sub.statistics().consumers == 0


async def test_wait_synced_joins_and_pulls_with_no_task_iterating() -> None:
    """``async with aiter(sub) as c: await c.wait_synced()`` returns once the
    listing has reached the consumer, though nothing reads it; its reads
    then return the listing, and it is synced once handed it."""
    feed = Feed()
    sub = OnDemand(feed)
    feed.push(added(A), added(B), MARK)
    async with SubscriptionPool(), aiter(sub) as consumer:
        with anyio.fail_after(TIMEOUT):
            await consumer.wait_synced()
        assert not consumer.synced  # held for it, not handed yet
        assert list(sub.workers()) == [A.uid, B.uid]
        feed.push(added(C))
        assert await read(consumer) == A
        assert await read(consumer) == B
        assert consumer.synced
        assert await read(consumer) == C


async def test_wait_synced_on_a_consumer_not_entered_joins_it() -> None:
    """``wait_synced`` joins a consumer never entered nor read; it is then
    replayed nothing twice."""
    feed = Feed()
    sub = Source(feed)
    feed.push(added(A), MARK)
    async with SubscriptionPool():
        consumer = aiter(sub)
        with anyio.fail_after(TIMEOUT):
            await consumer.wait_synced()
        assert sub.statistics().consumers == 1
        assert await read(consumer) == A
        assert consumer.synced
        await consumer.aclose()


async def test_wait_synced_returns_when_the_source_fails_unlisted() -> None:
    """A source that fails before marking its listing: ``wait_synced``
    returns, and the consumer's reads raise the error after the items."""
    feed = Feed()
    sub = Source(feed)
    feed.push(added(A), LookupError("gone"))
    async with SubscriptionPool(), aiter(sub) as consumer:
        with anyio.fail_after(TIMEOUT):
            await consumer.wait_synced()
        assert not consumer.synced
        assert await read(consumer) == A
        with pytest.raises(LookupError, match="gone"):
            await read(consumer)


async def test_wait_synced_returns_when_the_source_ends_unlisted() -> None:
    """A source that ends before marking: ``wait_synced`` returns, unsynced."""
    feed = Feed()
    sub = Source(feed)
    feed.push(added(A))
    feed.sends[0].close()
    async with SubscriptionPool(), aiter(sub) as consumer:
        with anyio.fail_after(TIMEOUT):
            await consumer.wait_synced()
        assert not consumer.synced


async def test_cancelling_wait_synced_loses_nothing() -> None:
    """Cancelling ``wait_synced`` while it pulls leaves the consumer whole:
    it reads every item, and a later wait returns."""
    feed = Feed()
    sub = OnDemand(feed)
    feed.push(added(A))
    async with SubscriptionPool(), aiter(sub) as consumer:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_when_blocked() -> None:
                    await anyio.wait_all_tasks_blocked()
                    scope.cancel()

                tg.start_soon(cancel_when_blocked)
                await consumer.wait_synced()
        assert scope.cancelled_caught
        feed.push(added(B), MARK)
        with anyio.fail_after(TIMEOUT):
            await consumer.wait_synced()
        assert [await read(consumer), await read(consumer)] == [A, B]
        assert consumer.synced


# -- the shared view can be awaited --------------------------------------------


async def test_subscription_wait_synced_holds_the_listing_while_it_lives() -> None:
    """``await sub.wait_synced()`` with no consumer and the default ``ttl=0``:
    the source is started and pulled to its mark; ``workers()`` then reads the
    whole first listing, held until ``sub`` is dropped."""
    feed = Feed()
    sub = Source(feed)
    feed.push(added(A), added(B), MARK)
    async with SubscriptionPool() as pool:
        with anyio.fail_after(TIMEOUT):
            await sub.wait_synced()
        await anyio.wait_all_tasks_blocked()
        assert list(sub.workers()) == [A.uid, B.uid]
        assert (pool.statistics().entries, pool.statistics().idle) == (1, 0)
        with anyio.fail_after(TIMEOUT):
            await sub.wait_synced()  # listed already: at once
        await anyio.wait_all_tasks_blocked()
        assert (feed.started, pool.statistics().entries) == (1, 1)
        del sub  # no cycle: released at once, without a garbage collection
        await anyio.wait_all_tasks_blocked()
        assert pool.statistics().entries == 0
        assert dict(Source(feed).workers()) == {}


async def test_subscription_wait_synced_then_its_ttl_once_dropped() -> None:
    """With a ttl, the entry a dropped ``sub`` held stays idle for it."""
    feed = Feed()
    sub = Kept(feed)
    feed.push(added(A), MARK)
    async with SubscriptionPool() as pool:
        with anyio.fail_after(TIMEOUT):
            await sub.wait_synced()
        del sub  # no cycle: released at once, without a garbage collection
        await anyio.wait_all_tasks_blocked()
        assert (pool.statistics().entries, pool.statistics().idle) == (1, 1)
        assert list(Kept(feed).workers()) == [A.uid]


async def test_subscription_wait_synced_beside_an_iterating_consumer() -> None:
    """With a consumer iterating (ttl 0), ``sub.wait_synced()`` returns once
    the listing is marked, whoever pulls it; ``workers()`` holds it."""
    feed = Feed()
    sub = Source(feed)
    handed: list[WorkerMetadata] = []

    async def iterate() -> None:
        async for event in consumer:
            handed.append(event.metadata)

    async with (
        SubscriptionPool(),
        aiter(sub) as consumer,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(iterate)
        feed.push(added(A))
        await anyio.wait_all_tasks_blocked()
        async with anyio.create_task_group() as waiters:
            waiters.start_soon(sub.wait_synced)
            await anyio.wait_all_tasks_blocked()
            assert list(sub.workers()) == [A.uid]
            feed.push(added(B), MARK)
        assert list(sub.workers()) == [A.uid, B.uid]
        await anyio.wait_all_tasks_blocked()
        assert handed == [A, B]
        assert consumer.synced
        tg.cancel_scope.cancel()


async def test_subscription_wait_synced_raises_the_source_error() -> None:
    """The source fails before its mark: ``sub.wait_synced()`` raises it."""
    feed = Feed()
    sub = Source(feed)
    feed.push(added(A), LookupError("gone"))
    async with SubscriptionPool():
        with anyio.fail_after(TIMEOUT), pytest.raises(LookupError, match="gone"):
            await sub.wait_synced()


@shared_subscription
class MarkedByATask:
    """Lists A, then a task it started marks the listing."""

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        yield added(A)
        marked: list[bool] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _mark(marked))
        assert marked == [True]
        yield added(B)
        await anyio.sleep_forever()


async def _mark(marked: list[bool]) -> None:
    marked.append(mark_synced())


async def test_a_task_started_by_the_source_can_mark_its_listing() -> None:
    """``mark_synced()`` from a task the source started marks the listing."""
    async with SubscriptionPool(), aiter(MarkedByATask()) as consumer:
        assert await read(consumer) == A
        with anyio.fail_after(TIMEOUT):
            await consumer.wait_synced()
        assert consumer.synced
        assert await read(consumer) == B
