"""The shared view: ``workers()`` to read it, ``synced`` and ``wait_synced()``
to know it is complete, and the :class:`~wool_pooling.Synced` marker a
source yields at the end of its first listing.

The sources here are scripted: each iteration of a :class:`Scripted`
subscriber reads the next run of its :class:`Feed`, a memory stream the test
fills, so each test decides when every item (a marker, a failure) arrives.
"""

from __future__ import annotations

import math
import pickle
import uuid
from collections.abc import AsyncIterator
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import wool
from _loops import BACKENDS
from _loops import asyncio_only
from _loops import run
from _stubs import TIMEOUT
from _stubs import meta
from anyio.streams.memory import MemoryObjectReceiveStream
from anyio.streams.memory import MemoryObjectSendStream
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import RestartPolicy
from wool_pooling import SharedDiscovery
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionConsumer
from wool_pooling import SubscriptionPool
from wool_pooling import Synced
from wool_pooling import shared_subscription
from wool_pooling._wool import shared_discovery

pytestmark = pytest.mark.anyio

A, B, C, D, E = (meta(uuid.UUID(int=n), pid=n) for n in range(1, 6))


def added(metadata: WorkerMetadata) -> DiscoveryEvent:
    return DiscoveryEvent("worker-added", metadata=metadata)


class Feed:
    """The runs of a scripted source: one memory stream per iteration."""

    def __init__(self, runs: int = 1) -> None:
        self.sends: list[MemoryObjectSendStream[Any]] = []
        self.receives: list[MemoryObjectReceiveStream[Any]] = []
        for _ in range(runs):
            send, receive = anyio.create_memory_object_stream[Any](math.inf)
            self.sends.append(send)
            self.receives.append(receive)
        self.started = 0

    def push(self, *items: Any, run: int = 0) -> None:
        for item in items:
            self.sends[run].send_nowait(item)


class Scripted:
    """A raw subscriber yielding what its feed's next run is given; an
    exception given is raised."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed

    async def __aiter__(self) -> Any:
        feed = self.feed
        receive = feed.receives[feed.started]
        feed.started += 1
        async for item in receive:
            if isinstance(item, Exception):
                raise item
            yield item


Source = shared_subscription(type("Source", (Scripted,), {}))


class _OnDemand(Scripted):
    """A scripted source pulled on demand only (``read_ahead=0``): where a
    test counts which items a consumer's reads have pulled."""


OnDemand = shared_subscription(read_ahead=0)(_OnDemand)
Lagging = shared_subscription(max_lag=2, read_ahead=0)(type("Lagging", (Scripted,), {}))
Restarting = shared_subscription(
    restart=RestartPolicy(backoff=0, jitter=0, settle=3600)
)(type("Restarting", (Scripted,), {}))


def subscription(feed: Feed, cls: Any = Source) -> SharedSubscription[DiscoveryEvent]:
    return cls(feed)


@asynccontextmanager
async def driven(
    sub: SharedSubscription[DiscoveryEvent],
) -> AsyncIterator[tuple[SubscriptionConsumer[DiscoveryEvent], list[WorkerMetadata]]]:
    """A consumer of ``sub`` iterated by a task of its own (so the source is
    pulled as it produces), and the workers it has been handed."""
    handed: list[WorkerMetadata] = []
    async with aiter(sub) as consumer, anyio.create_task_group() as tg:

        async def iterate() -> None:
            async for event in consumer:
                handed.append(event.metadata)

        tg.start_soon(iterate)
        yield consumer, handed
        tg.cancel_scope.cancel()


async def synced(consumer: SubscriptionConsumer[DiscoveryEvent]) -> None:
    """Wait until the listing has reached ``consumer``, then until the task
    iterating it has been handed it."""
    with anyio.fail_after(TIMEOUT):
        await consumer.wait_synced()
    await anyio.wait_all_tasks_blocked()
    assert consumer.synced


async def read(consumer: SubscriptionConsumer[DiscoveryEvent]) -> WorkerMetadata:
    with anyio.fail_after(TIMEOUT):
        return (await anext(consumer)).metadata


# -- reading the view ---------------------------------------------------------


def test_workers_outside_an_event_loop_is_empty() -> None:
    """With no event loop (so nothing iterates it), the view is empty."""
    assert dict(subscription(Feed()).workers()) == {}


async def test_workers_is_empty_while_nothing_iterates() -> None:
    """No live entry in the current pool: an empty view, and nothing built."""
    feed = Feed()
    async with SubscriptionPool():
        assert dict(subscription(feed).workers()) == {}
        assert feed.started == 0


async def test_workers_is_a_read_only_snapshot_of_what_the_entry_knows() -> None:
    """``workers()`` copies the known workers (latest metadata, first-seen
    order) at the call: read-only, and unchanged by later events."""
    feed = Feed()
    sub = subscription(feed)
    newer_a = meta(A.uid, pid=10)
    feed.push(added(A), added(B), DiscoveryEvent("worker-updated", metadata=newer_a))
    async with SubscriptionPool(), aiter(sub) as consumer:
        for _ in range(3):
            await read(consumer)
        view = sub.workers()
        assert list(view.items()) == [(A.uid, newer_a), (B.uid, B)]
        with pytest.raises(TypeError):
            view[C.uid] = C  # type: ignore[index]
        feed.push(added(C), DiscoveryEvent("worker-dropped", metadata=B))
        await read(consumer)
        await read(consumer)
        assert list(view) == [A.uid, B.uid]
        assert list(sub.workers()) == [A.uid, C.uid]
        assert isinstance(sub.workers(), Mapping)
    assert dict(sub.workers()) == {}  # the pool is closed: nothing live


async def test_workers_of_another_pool_are_not_seen() -> None:
    """The view is the current pool's entry's: another pool's is not read."""
    feed = Feed()
    sub = subscription(feed)
    feed.push(added(A))
    async with SubscriptionPool(), aiter(sub) as consumer:
        await read(consumer)
        async with SubscriptionPool():
            assert dict(sub.workers()) == {}
        assert list(sub.workers()) == [A.uid]


# -- knowing it is complete ---------------------------------------------------


async def test_first_consumers_are_synced_once_handed_the_first_listing() -> None:
    """A consumer there from the start is synced once the source has yielded
    the marker and the consumer has been handed every item before it; the
    marker itself is never handed to it."""
    feed = Feed()
    sub = subscription(feed)
    handed: list[tuple[WorkerMetadata, bool]] = []
    async with SubscriptionPool(), aiter(sub) as consumer:
        assert not consumer.synced  # joined, nothing listed yet

        async def iterate() -> None:
            async for event in consumer:
                handed.append((event.metadata, consumer.synced))

        async with anyio.create_task_group() as tg:
            tg.start_soon(iterate)
            feed.push(added(A), added(B))
            await anyio.wait_all_tasks_blocked()
            assert [m for m, _ in handed] == [A, B]
            assert not consumer.synced  # the listing is not over yet
            feed.push(Synced(), added(C))
            with anyio.fail_after(TIMEOUT):
                await consumer.wait_synced()
            assert consumer.synced
            await anyio.wait_all_tasks_blocked()
            assert handed == [(A, False), (B, False), (C, True)]
            tg.cancel_scope.cancel()


async def test_a_late_joiner_is_synced_once_its_replay_is_read() -> None:
    """A consumer joining after the first listing is synced once it has been
    handed the replay of the workers its entry knew when it joined."""
    feed = Feed()
    sub = subscription(feed)
    feed.push(added(A), added(B), Synced())
    async with SubscriptionPool(), driven(sub) as (first, _):
        await synced(first)
        async with aiter(sub) as late:
            assert not late.synced
            assert await read(late) == A
            assert not late.synced
            assert await read(late) == B
            assert late.synced
            with anyio.fail_after(TIMEOUT):
                await late.wait_synced()


async def test_a_joiner_during_the_listing_waits_for_its_end() -> None:
    """A consumer joining before the marker is synced only once it has been
    handed the rest of the listing too, not at the end of its replay."""
    feed = Feed()
    sub = subscription(feed)
    feed.push(added(A))
    async with SubscriptionPool(), driven(sub) as (first, handed):
        await anyio.wait_all_tasks_blocked()
        assert handed == [A]
        async with aiter(sub) as joiner:
            assert await read(joiner) == A  # its replay
            assert not joiner.synced
            feed.push(added(B), Synced())
            await synced(first)
            assert not joiner.synced  # B is still to be handed to it
            assert await read(joiner) == B
            assert joiner.synced


async def test_wait_synced_cancelled_loses_nothing() -> None:
    """Cancelling ``wait_synced`` changes nothing: the consumer is handed
    every event, and a later wait returns once it is synced."""
    feed = Feed()
    sub = subscription(feed)
    handed: list[WorkerMetadata] = []
    async with SubscriptionPool(), aiter(sub) as consumer:

        async def iterate() -> None:
            async for event in consumer:
                handed.append(event.metadata)

        async with anyio.create_task_group() as tg:
            tg.start_soon(iterate)
            feed.push(added(A))
            with anyio.CancelScope() as scope:
                tg.start_soon(_cancel_when_blocked, scope)
                await consumer.wait_synced()
            assert scope.cancelled_caught
            assert not consumer.synced
            feed.push(added(B), Synced())
            await synced(consumer)
            assert handed == [A, B]
            tg.cancel_scope.cancel()


async def _cancel_when_blocked(scope: anyio.CancelScope) -> None:
    await anyio.wait_all_tasks_blocked()
    scope.cancel()


async def test_a_source_that_never_marks_never_syncs_its_consumers() -> None:
    """Without a marker no consumer is synced, first or late: ``wait_synced``
    waits (until the consumer ends)."""
    feed = Feed()
    sub = subscription(feed)
    feed.push(added(A))
    async with SubscriptionPool(), aiter(sub) as first:
        await read(first)
        async with aiter(sub) as late:
            assert await read(late) == A
            async with anyio.create_task_group() as tg:
                tg.start_soon(anext, first)
                tg.start_soon(anext, late)
                with anyio.CancelScope() as scope:
                    tg.start_soon(_cancel_when_blocked, scope)
                    await first.wait_synced()
                assert scope.cancelled_caught
                assert not first.synced
                assert not late.synced
                tg.cancel_scope.cancel()


async def test_wait_synced_returns_when_the_consumer_ends_unsynced() -> None:
    """A consumer that ends (its source ended) before it is synced wakes its
    waiters; ``synced`` stays false."""
    feed = Feed()
    sub = subscription(feed)
    async with SubscriptionPool(), aiter(sub) as consumer:

        async def iterate() -> None:
            async for _ in consumer:
                pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(iterate)
            feed.push(added(A))
            await anyio.wait_all_tasks_blocked()
            feed.sends[0].close()
            with anyio.fail_after(TIMEOUT):
                await consumer.wait_synced()
            assert not consumer.synced


async def test_a_restart_keeps_synced_and_its_listing_ends_the_settle() -> None:
    """After a restart, consumers stay synced; the restarted stream's marker
    drops at once the workers it did not report (no wait for ``settle``)."""
    feed = Feed(runs=2)
    sub = subscription(feed, Restarting)
    feed.push(added(A), added(B), Synced())
    async with SubscriptionPool(), driven(sub) as (driver, _):
        await synced(driver)
        async with aiter(sub) as consumer:
            assert [await read(consumer), await read(consumer)] == [A, B]
            assert consumer.synced
            feed.push(RuntimeError("lost"), run=0)
            feed.push(added(A), Synced(), run=1)
            with anyio.fail_after(TIMEOUT):
                event = await anext(consumer)
            assert (event.type, event.metadata) == ("worker-dropped", B)
            assert consumer.synced
            assert driver.synced
            assert list(sub.workers()) == [A.uid]


async def test_a_restart_before_the_marker_is_listed_by_the_new_stream() -> None:
    """A stream that fails before its marker: the restarted stream's marker
    ends the first listing."""
    feed = Feed(runs=2)
    sub = subscription(feed, Restarting)
    feed.push(added(A), RuntimeError("lost"))
    feed.push(added(A), added(B), Synced(), run=1)
    async with SubscriptionPool(), driven(sub) as (consumer, handed):
        await synced(consumer)
        assert handed == [A, B]
        assert list(sub.workers()) == [A.uid, B.uid]


async def test_a_resynced_consumer_is_synced_once_handed_the_diff() -> None:
    """A consumer that fell behind the lag bound during the first listing is
    synced once it has been handed the diff that replaces what it missed;
    one synced before it fell behind stays synced through its resync."""
    feed = Feed()
    sub = subscription(feed, Lagging)
    async with SubscriptionPool(), driven(sub) as (fast, handed):
        slow = aiter(sub)
        feed.push(added(A))
        assert await read(slow) == A
        feed.push(added(B), added(C), added(D), Synced())
        await synced(fast)
        assert handed == [A, B, C, D]
        assert not slow.synced
        # slow is 3 behind (max_lag=2): resynchronised by diff.
        assert await read(slow) == B
        assert not slow.synced
        assert await read(slow) == C
        assert await read(slow) == D
        assert slow.synced
        feed.push(added(E), *(added(meta(uuid.UUID(int=n))) for n in range(6, 9)))
        await anyio.wait_all_tasks_blocked()
        assert len(handed) == 8
        assert await read(slow) == E  # resynchronised again
        assert slow.synced
        await slow.aclose()


async def test_the_marker_passes_through_a_plain_fanout() -> None:
    """A plain :class:`Fanout` does not interpret the marker: its consumers
    get it like any other item."""

    first, marker, last = added(A), Synced(), added(B)

    async def items() -> Any:
        yield first
        yield marker
        yield last

    fanout = Fanout(items())
    try:
        async with fanout.consumer() as consumer:
            with anyio.fail_after(TIMEOUT):
                got = [item async for item in consumer]
    finally:
        await fanout.aclose()
    assert got == [first, marker, last]


def test_synced_markers_are_equal_and_pickle() -> None:
    """Every marker equals every other, and survives pickling."""
    assert Synced() == Synced()
    assert hash(Synced()) == hash(Synced())
    assert pickle.loads(pickle.dumps(Synced())) == Synced()
    assert repr(Synced()) == "Synced()"
    assert Synced() != added(A)


# -- SharedDiscovery ----------------------------------------------------------


class ScriptedDiscovery:
    """A fake wool discovery whose subscriber yields what ``feed`` is given
    (``nested``: through a shared subscription of its own, as
    ``RedisDiscovery`` does)."""

    publisher: Any = None

    def __init__(self, feed: Feed, nested: bool = False) -> None:
        self.feed = feed
        self.nested = nested

    def subscribe(self, filter: Any = None) -> Any:
        if self.nested:
            return Source(self.feed)
        return Scripted(self.feed)


@pytest.mark.parametrize("nested", [False, True], ids=["plain", "nested-shared"])
async def test_shared_discovery_consumers_sync_on_the_inner_marker(
    nested: bool,
) -> None:
    """A ``SharedDiscovery`` passes its inner subscriber's end of listing on
    to its consumers (the marker, or the ``synced`` of an inner shared
    subscription), and its ``workers()`` reads the upstream's view."""
    feed = Feed()
    discovery = SharedDiscovery(ScriptedDiscovery(feed, nested))
    sub = discovery.subscribe()
    handed: list[WorkerMetadata] = []
    async with SubscriptionPool(), aiter(sub) as consumer:
        assert dict(discovery.workers()) == {}

        async def iterate() -> None:
            async for event in consumer:
                handed.append(event.metadata)

        async with anyio.create_task_group() as tg:
            tg.start_soon(iterate)
            feed.push(added(A), added(B))
            await anyio.wait_all_tasks_blocked()
            assert not consumer.synced
            feed.push(Synced())
            await synced(consumer)
            assert handed == [A, B]
            assert list(discovery.workers()) == [A.uid, B.uid]
            assert list(discovery.workers(filter=lambda m: m.pid == 2)) == [B.uid]
            tg.cancel_scope.cancel()


def test_shared_discovery_workers_takes_subscribes_keywords_only() -> None:
    """A keyword ``subscribe`` does not take is a TypeError naming it."""
    discovery = SharedDiscovery(ScriptedDiscovery(Feed()))
    with pytest.raises(TypeError, match="poll_interval"):
        discovery.workers(poll_interval=1)


@asyncio_only
async def test_around_local_discovery_the_first_scan_is_estimated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """wool's ``LocalDiscovery`` never says when a scan is done: the first
    consumers are synced once the upstream has found nothing new for a
    quiet time (lengthened here, so a loaded machine's slow first scan fits
    in it), with the workers published before it started."""
    monkeypatch.setattr(shared_discovery.merge, "LISTING_QUIET", 1.0)
    workers = [meta(uuid.uuid4(), pid=0) for _ in range(3)]
    with wool.LocalDiscovery(f"view-{uuid.uuid4().hex[:8]}") as inner:
        for worker in workers:
            await inner.publisher.publish("worker-added", worker)
        discovery = SharedDiscovery(inner)
        async with SubscriptionPool(), driven(discovery.subscribe()) as (first, seen):
            assert not first.synced
            await synced(first)
            assert {m.uid for m in seen} == {w.uid for w in workers}
            assert set(discovery.workers()) == {w.uid for w in workers}
            async with aiter(discovery.subscribe()) as late:
                for _ in workers:
                    await read(late)
                assert late.synced


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_synced_follows_the_model(backend: Any, data: st.DataObject) -> None:
    """With the marker after ``k`` of ``n`` workers (pulled on demand), a
    first consumer is synced after reading ``i`` items exactly when ``i >
    k``; a consumer joining after ``j`` items is synced after its replay
    exactly when the marker was taken in by then (``j > k``)."""
    n = data.draw(st.integers(1, 6), label="n")
    k = data.draw(st.integers(0, n), label="k")
    j = data.draw(st.integers(1, n), label="j")
    workers = [meta(uuid.UUID(int=number), pid=number) for number in range(1, n + 1)]
    items: list[Any] = [added(worker) for worker in workers]
    items.insert(k, Synced())

    async def body() -> None:
        feed = Feed()
        feed.push(*items)
        sub = subscription(feed, OnDemand)
        async with SubscriptionPool(), aiter(sub) as first:
            for i in range(1, j + 1):
                await read(first)
                assert first.synced is (i > k), (i, k)
            async with aiter(sub) as late:
                for r in range(1, j + 1):
                    await read(late)
                    assert late.synced is (r == j and j > k), (r, j, k)
            assert list(sub.workers()) == [worker.uid for worker in workers[:j]]

    run(body, backend)
