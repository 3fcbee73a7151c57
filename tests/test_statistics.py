"""What a shared subscription counts for operators: ``SharedSubscription.statistics()``
and ``SharedDiscovery.statistics()``."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from typing import Any
from typing import TypeVar
from typing import cast

import anyio
import pytest
from _loops import BACKENDS
from _loops import run as run_on_backend
from _stubs import Endless
from _stubs import StreamStub
from _stubs import added
from _stubs import ev
from _stubs import first_read
from _stubs import make_stub
from _stubs import meta
from _stubs import subscribe
from _stubs import take
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from wool_pooling import Lagged
from wool_pooling import RestartPolicy
from wool_pooling import SharedDiscovery
from wool_pooling import SharedDiscoveryStatistics
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import SubscriptionStatistics
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio

T = TypeVar("T")


async def test_statistics_are_zero_when_nothing_iterates_the_key() -> None:
    """A subscription no consumer iterates in the pool has all-zero statistics,
    and they count from zero again once its entry closed."""
    cls = make_stub()
    sub = subscribe(cls)
    async with SubscriptionPool() as pool:
        assert sub.statistics() == SubscriptionStatistics()
        async with aiter(sub) as consumer:
            await first_read(consumer, lambda: cls.instances[0].push(added(1)))
            assert sub.statistics(pool).delivered == 1
        assert sub.statistics(pool) == SubscriptionStatistics()


async def test_delivered_counts_every_item_each_consumer_received() -> None:
    """``delivered`` sums the live items each consumer read, joined or left,
    and leaves out the join's replay; ``replays`` counts joins replayed."""
    cls = make_stub()
    sub = subscribe(cls)
    async with SubscriptionPool():
        first = aiter(sub)
        await first_read(
            first, lambda: cls.instances[0].push(added(1), added(2), added(3))
        )
        await take(first, 2)
        assert sub.statistics() == SubscriptionStatistics(consumers=1, delivered=3)
        second = aiter(sub)
        await take(second, 3)  # the replay of the known workers
        assert sub.statistics() == SubscriptionStatistics(
            consumers=2, delivered=3, replays=1
        )
        cls.instances[0].push(added(4), added(5))
        await take(second, 2)
        await take(first, 1)
        assert sub.statistics().delivered == 3 + 2 + 1
        await second.aclose()
        assert sub.statistics() == SubscriptionStatistics(
            consumers=1, delivered=6, replays=1
        )
        await take(first, 1)
        assert sub.statistics().delivered == 7
        await first.aclose()


async def test_a_dropped_consumer_keeps_what_it_received_counted() -> None:
    """A consumer garbage collected without ``aclose()`` leaves its deliveries
    counted."""
    # Pulled on demand (read_ahead=0): the second consumer joins after one
    # item, so its replay is worker 1 alone.
    cls = make_stub(ttl=60, read_ahead=0)
    sub = subscribe(cls)
    async with SubscriptionPool():
        keeper = aiter(sub)
        await first_read(keeper, lambda: cls.instances[0].push(added(1), added(2)))
        dropped = aiter(sub)
        await take(dropped, 1)  # the replay of worker 1
        await take(keeper, 1)
        await take(dropped, 1)
        del dropped
        gc.collect()
        await anyio.wait_all_tasks_blocked()
        assert sub.statistics() == SubscriptionStatistics(
            consumers=1, delivered=3, replays=1
        )
        await keeper.aclose()


async def test_a_lagging_consumer_is_counted_lagged_and_resynced() -> None:
    """A consumer left ``max_lag`` behind counts one lag and one resync; the
    items it skipped and the resync's difference are not delivered."""
    cls = make_stub(max_lag=2)
    sub = subscribe(cls)
    async with SubscriptionPool():
        fast, slow = aiter(sub), aiter(sub)
        await first_read(fast, lambda: cls.instances[0].push(added(1)))
        await take(slow, 1)  # joins: the replay of worker 1
        cls.instances[0].push(*(added(n) for n in range(2, 7)))
        await take(fast, 5)
        assert sub.statistics().lagged == 0  # counted once it is reported
        diff = await take(slow, 5)  # workers 2..6, as a difference
        assert {event.metadata.pid for event in diff} == {2, 3, 4, 5, 6}
        stats = sub.statistics()
        assert (stats.lagged, stats.resyncs, stats.replays) == (1, 1, 1)
        assert stats.delivered == 6
        cls.instances[0].push(added(7))
        await take(slow, 1)
        await take(fast, 1)
        assert sub.statistics().delivered == 6 + 2
        await fast.aclose()
        await slow.aclose()


class Numbers:
    """A raw subscriber of plain ints, fed by the test."""

    def __init__(self, name: str) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[int](100)

    async def __aiter__(self) -> AsyncIterator[int]:
        async for item in self.receive:
            yield item


async def test_a_lag_that_cannot_be_resynced_counts_no_resync() -> None:
    """On a stream of items that are not discovery events, a lagging
    consumer's :exc:`Lagged` counts a lag, no resync, and what it skipped is
    not delivered."""
    built: list[Numbers] = []

    class Recorded(Numbers):
        def __init__(self, name: str) -> None:
            super().__init__(name)
            built.append(self)

    cls = shared_subscription(max_lag=2)(Recorded)
    sub = cast("SharedSubscription[int]", cls("n"))
    async with SubscriptionPool():
        fast, slow = aiter(sub), aiter(sub)
        assert await first_read(fast, lambda: built[0].send.send_nowait(0)) == 0
        assert await first_read(slow, lambda: built[0].send.send_nowait(1)) == 1
        for n in range(2, 7):
            built[0].send.send_nowait(n)
        assert await take(fast, 6) == [1, 2, 3, 4, 5, 6]
        with pytest.raises(Lagged) as lagged:
            await anext(slow)
        assert lagged.value.skipped == 3
        assert await take(slow, 2) == [5, 6]
        stats = sub.statistics()
        assert (stats.lagged, stats.resyncs, stats.delivered) == (1, 0, 7 + 1 + 2)
        await fast.aclose()
        await slow.aclose()


async def test_restarts_and_the_errors_behind_them_are_counted() -> None:
    """Each restart of a failing raw stream counts one restart and one source
    error."""
    policy = RestartPolicy(backoff=0, jitter=0, settle=60)
    cls = make_stub(restart=policy)
    sub = subscribe(cls)
    async with SubscriptionPool(), aiter(sub) as consumer:
        one = ev("worker-added", meta(pid=1))
        await first_read(consumer, lambda: cls.instances[0].push(one))
        raw = cls.instances[0]
        raw.fail(RuntimeError("first"))
        raw.fail(RuntimeError("second"))
        raw.push(one, added(2))  # worker 1 again, unchanged: not repeated
        assert [event.metadata.pid for event in await take(consumer, 1)] == [2]
        stats = sub.statistics()
        assert (stats.restarts, stats.source_errors) == (2, 2)


async def test_a_source_error_without_restart_is_counted_while_consumers_remain() -> (
    None
):
    """The error that ended an unrestarted source counts once, as long as a
    consumer still holds the ended entry."""
    cls = make_stub()
    sub = subscribe(cls)
    async with SubscriptionPool():
        first, second = aiter(sub), aiter(sub)
        await first_read(first, lambda: cls.instances[0].push(added(1)))
        await take(second, 1)  # the replay
        cls.instances[0].fail(RuntimeError("boom"))
        with pytest.raises(RuntimeError, match="boom"):
            await anext(first)
        assert sub.statistics() == SubscriptionStatistics(
            consumers=1, delivered=1, replays=1, source_errors=1
        )
        await second.aclose()
        assert sub.statistics() == SubscriptionStatistics()


class Inner:
    """A wool discovery over stubs: each subscribe() is one more scan."""

    def __init__(self) -> None:
        self.built: list[StreamStub] = []

    @property
    def publisher(self) -> Any:
        raise NotImplementedError

    def subscribe(self, filter: Any = None) -> StreamStub:
        self.built.append(StreamStub())
        return self.built[-1]

    def __reduce__(self) -> tuple[Any, ...]:
        return (Inner, ())


async def test_shared_discovery_counts_the_rescans_of_its_joiners() -> None:
    """``SharedDiscovery.statistics()`` counts the consumers of its upstream,
    filtered ones included; a join starts a fresh scan."""
    inner = Inner()
    shared = SharedDiscovery(inner)
    one = meta(pid=1)
    async with SubscriptionPool():
        assert shared.statistics() == SharedDiscoveryStatistics()
        early = aiter(shared.subscriber)
        async with anyio.create_task_group() as tg:
            tg.start_soon(anext, early)
            await anyio.wait_all_tasks_blocked()
            inner.built[0].push(ev("worker-added", one))
        late = aiter(shared.subscribe(lambda metadata: True))
        await take(late, 1)  # the replay
        async with anyio.create_task_group() as tg:
            tg.start_soon(anext, late)
            await anyio.wait_all_tasks_blocked()
            assert len(inner.built) == 2
            inner.built[1].push(ev("worker-added", meta(pid=2)))
        stats = shared.statistics()
        assert (stats.consumers, stats.replays, len(inner.built)) == (2, 1, 2)
        assert stats.delivered == 1 + 1
        await late.aclose()
        await early.aclose()


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["join", "read", "leave", "drop"]), st.integers(0, 4)
        ),
        max_size=30,
    )
)
def test_delivered_matches_a_model_that_counts_every_read(
    backend: tuple[str, dict[str, Any]], ops: list[tuple[str, int]]
) -> None:
    """Whatever the joins, reads, leaves and garbage-collected consumers,
    ``delivered`` is the number of items the consumers read (a model counts
    each read), and ``consumers`` those attached."""

    async def main() -> None:
        cls = shared_subscription(ttl=60, max_lag=None)(type("Endless", (Endless,), {}))
        sub = cast("SharedSubscription[int]", cls("n"))
        async with SubscriptionPool():
            consumers: list[AsyncIterator[int]] = []
            reads = 0
            for op, n in ops:
                if op == "join":
                    consumers.append(aiter(sub))
                    await take(consumers[-1], 1)  # joins at its first read
                    reads += 1
                elif consumers:
                    consumer = consumers[n % len(consumers)]
                    if op == "read":
                        await take(consumer, n)
                        reads += n
                    else:
                        consumers.remove(consumer)
                        if op == "leave":
                            await cast("Any", consumer).aclose()
                        del consumer
                        gc.collect()
                        await anyio.wait_all_tasks_blocked()
                stats = sub.statistics()
                assert (stats.consumers, stats.delivered) == (len(consumers), reads)
            for consumer in consumers:
                await cast("Any", consumer).aclose()

    run_on_backend(main, backend)
