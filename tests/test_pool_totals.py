"""A pool's running totals (``SubscriptionPool.totals()``) keep counting across
its entries' closes and reopens, and never go down."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from typing import Any
from typing import cast

import anyio
import pytest
from _loops import BACKENDS
from _loops import run as run_on_backend
from _stubs import Endless
from _stubs import added
from _stubs import first_read
from _stubs import make_stub
from _stubs import subscribe
from _stubs import take
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from wool_pooling import PoolTotals
from wool_pooling import RestartPolicy
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import SubscriptionStatistics
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio


async def test_totals_outlive_the_entry_that_counted_them() -> None:
    """An entry's deliveries stay in the pool's totals once it closed, while
    its subscription's statistics start from zero; the next entry adds to
    them; opened and closed count the entries."""
    cls = make_stub()
    sub = subscribe(cls)
    async with SubscriptionPool() as pool:
        assert pool.totals() == PoolTotals()
        async with aiter(sub) as consumer:
            await first_read(
                consumer, lambda: cls.instances[0].push(added(1), added(2))
            )
            await take(consumer, 1)
            assert pool.totals() == PoolTotals(opened=1, delivered=2)
        assert sub.statistics() == SubscriptionStatistics()
        assert pool.totals() == PoolTotals(opened=1, closed=1, delivered=2)
        async with aiter(sub) as consumer:  # a new entry, a new raw instance
            await first_read(consumer, lambda: cls.instances[1].push(added(3)))
            assert sub.statistics().delivered == 1
            assert pool.totals() == PoolTotals(opened=2, closed=1, delivered=3)
    assert pool.totals() == PoolTotals(opened=2, closed=2, delivered=3)


async def test_lags_and_skips_stay_counted_after_the_entry_closed() -> None:
    """A lagging consumer's lag, skipped items and resync stay in the totals
    once its entry closed; the entry's statistics count the skipped items
    while it lives."""
    cls = make_stub(max_lag=2)
    sub = subscribe(cls)
    async with SubscriptionPool() as pool:
        fast, slow = aiter(sub), aiter(sub)
        await first_read(fast, lambda: cls.instances[0].push(added(1)))
        await take(slow, 1)  # joins: the replay of worker 1
        cls.instances[0].push(*(added(n) for n in range(2, 7)))
        await take(fast, 5)
        await take(slow, 5)  # the difference, for the 5 items it skipped
        stats = sub.statistics()
        assert (stats.lagged, stats.skipped, stats.resyncs) == (1, 5, 1)
        await fast.aclose()
        await slow.aclose()
    assert pool.totals() == PoolTotals(
        opened=1, closed=1, delivered=6, replays=1, lagged=1, skipped=5, resyncs=1
    )


async def test_restarts_stay_counted_after_the_entry_closed() -> None:
    """The restarts of a raw stream, and the errors behind them, stay in the
    totals once its entry closed."""
    cls = make_stub(restart=RestartPolicy(backoff=0, jitter=0, settle=60))
    sub = subscribe(cls)
    async with SubscriptionPool() as pool:
        async with aiter(sub) as consumer:
            await first_read(consumer, lambda: cls.instances[0].push(added(1)))
            cls.instances[0].fail(RuntimeError("first"))
            cls.instances[0].fail(RuntimeError("second"))
            cls.instances[0].push(added(2))
            await take(consumer, 1)
        totals = pool.totals()
    assert (totals.restarts, totals.source_errors, totals.closed) == (2, 2, 1)


async def test_closing_the_pool_counts_what_its_consumers_had_read() -> None:
    """Consumers still attached when the pool closes are counted for what
    they had read, not for what was logged, and their later release
    changes nothing."""
    cls = make_stub(read_ahead=0)
    sub = subscribe(cls)
    pool = SubscriptionPool()
    async with pool:
        ahead, behind = aiter(sub), aiter(sub)
        await first_read(ahead, lambda: cls.instances[0].push(added(1)))
        await take(behind, 1)  # joins: the replay of worker 1
        cls.instances[0].push(added(2), added(3), added(4))
        await take(ahead, 3)
        await take(behind, 1)
        assert pool.totals().delivered == 4 + 1
    closed = PoolTotals(opened=1, closed=1, delivered=5, replays=1)
    assert pool.totals() == closed
    await ahead.aclose()
    await behind.aclose()
    assert pool.totals() == closed


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
def test_totals_match_a_model_across_entries(
    backend: tuple[str, dict[str, Any]], ops: list[tuple[str, int]]
) -> None:
    """Whatever the joins, reads, leaves and garbage-collected consumers, with
    entries closing as the last consumer leaves and reopening at the next
    join, ``delivered`` is every item read in the pool (a model counts each
    read), and the entries opened and closed are those the model made."""

    async def main() -> None:
        cls = shared_subscription(max_lag=None)(type("Endless", (Endless,), {}))
        sub = cast("SharedSubscription[int]", cls("n"))
        async with SubscriptionPool() as pool:
            consumers: list[AsyncIterator[int]] = []
            reads = opened = 0
            for op, n in ops:
                if op == "join":
                    opened += not consumers
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
                closed = opened - bool(consumers)
                assert pool.totals() == PoolTotals(
                    opened=opened, closed=closed, delivered=reads
                )
            for consumer in consumers:
                await cast("Any", consumer).aclose()

    run_on_backend(main, backend)
