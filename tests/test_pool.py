"""SubscriptionPool and current_pool(): scoping, closing, statistics, default pools."""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from _loops import BACKENDS
from _loops import run as run_on_backend
from _stubs import StreamStub
from _stubs import ended
from _stubs import ev
from _stubs import make_stub
from _stubs import meta
from _stubs import pairs
from _stubs import subscribe
from _stubs import take
from wool import DiscoveryEvent

from wool_pooling import PoolStatistics
from wool_pooling import SubscriptionPool
from wool_pooling import current_pool

pytestmark = pytest.mark.anyio


async def join_all(stub: type[StreamStub], *consumers: AsyncIterator[DiscoveryEvent]):
    """Start every consumer (it joins at its first __anext__) by feeding one event."""
    async with anyio.create_task_group() as tg:
        for it in consumers:
            tg.start_soon(take, it, 1)
        await anyio.wait_all_tasks_blocked()
        stub.instances[-1].push(ev("worker-added", meta()))


# -- scoping ----------------------------------------------------------------------


async def test_pool_is_current_inside_block_only() -> None:
    """`async with SubscriptionPool() as pool` makes it current for the block only."""
    outer = current_pool()
    async with SubscriptionPool() as pool:
        assert current_pool() is pool
        assert pool is not outer
        seen: list[SubscriptionPool] = []

        async def look() -> None:
            seen.append(current_pool())

        async with anyio.create_task_group() as tg:
            tg.start_soon(look)
        assert seen == [pool]
    assert current_pool() is not pool
    assert current_pool() is outer
    assert pool.closed


async def test_nested_pools_restore_outer() -> None:
    """Leaving an inner pool makes the outer one current again."""
    async with SubscriptionPool() as outer:
        async with SubscriptionPool() as inner:
            assert current_pool() is inner
        assert current_pool() is outer
        assert not outer.closed


async def test_pools_do_not_share_entries() -> None:
    """The same key in two pools gets two raw instances; two keys never share."""
    stub = make_stub()
    async with SubscriptionPool():
        a1 = aiter(subscribe(stub, "a"))
        await join_all(stub, a1)
        async with SubscriptionPool():
            a2 = aiter(subscribe(stub, "a"))
            await join_all(stub, a2)
            assert len(stub.instances) == 2
            await a2.aclose()
        b = aiter(subscribe(stub, "b"))
        await join_all(stub, b)
        assert len(stub.instances) == 3
        assert [raw.name for raw in stub.instances] == ["a", "a", "b"]
        await a1.aclose()
        await b.aclose()


# -- closing ----------------------------------------------------------------------


async def test_pool_exit_finalises_every_entry() -> None:
    """On exit every entry is finalised: raw closed once, blocked consumers end."""
    closing, shutting = make_stub(), make_stub(shutdown=True)
    outcomes: list[str] = []

    async def read(it: AsyncIterator[DiscoveryEvent]) -> None:
        with anyio.fail_after(5):
            try:
                while True:
                    await anext(it)
            except StopAsyncIteration:
                outcomes.append("ended")

    async with anyio.create_task_group() as tg:
        async with SubscriptionPool() as pool:
            for stub in (closing, shutting):
                for _ in range(2):
                    tg.start_soon(read, aiter(subscribe(stub)))
            await anyio.wait_all_tasks_blocked()
            assert pool.statistics() == PoolStatistics(entries=2, consumers=4, idle=0)
            raws = [closing.instances[-1], shutting.instances[-1]]
            assert all(raw.finally_runs == 0 for raw in raws)
        # Finalisation completed before the block was left.
        assert pool.closed
        assert pool.statistics().entries == 0
        for raw, closes in zip(raws, (1, 0), strict=True):
            # aclose() once; a private _shutdown() is not the pool's to call.
            assert raw.close_calls == raw.closes_done == closes
            assert raw.finally_runs == 1  # the blocked pull was cancelled
            assert raw.aiter_calls == 1
    assert outcomes == ["ended"] * 4


async def test_consumer_of_closed_entry_ends() -> None:
    """After its pool is closed, a joined consumer's __anext__ ends."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        it = aiter(subscribe(stub))
        await join_all(stub, it)
        await pool.aclose()
        assert await ended(it)
        assert stub.instances[-1].close_calls == 1


async def test_consumer_with_pending_replay_ends_at_pool_close() -> None:
    """A consumer still holding undelivered replay also ends at pool close."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        first = aiter(sub)
        await join_all(stub, first)
        stub.instances[-1].push(ev("worker-added", meta()))
        await take(first, 1)
        late = aiter(sub)
        await take(late, 1)  # one of its two replay events
        await pool.aclose()
        assert await ended(late)
        assert await ended(first)


async def test_iterating_after_pool_block_exit_raises() -> None:
    """A task whose context still holds an exited pool cannot start iterating."""
    stub = make_stub()
    go = anyio.Event()
    errors: list[RuntimeError] = []

    async def later() -> None:
        await go.wait()
        with pytest.raises(RuntimeError) as info:
            await anext(aiter(subscribe(stub)))
        errors.append(info.value)

    async with anyio.create_task_group() as tg:
        async with SubscriptionPool() as pool:
            tg.start_soon(later)
            await anyio.wait_all_tasks_blocked()
        assert pool.closed
        go.set()
    assert len(errors) == 1
    assert "closed" in str(errors[0])
    assert stub.instances == []


async def test_iterating_after_pool_aclose_raises() -> None:
    """Iterating a subscription whose current pool was closed raises RuntimeError."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        await pool.aclose()
        await pool.aclose()  # idempotent
        assert current_pool() is pool
        with pytest.raises(RuntimeError, match="closed"):
            await anext(aiter(subscribe(stub)))
    assert stub.instances == []


async def test_entering_closed_pool_raises() -> None:
    """A closed pool cannot be entered again."""
    pool = SubscriptionPool()
    async with pool:
        pass
    with pytest.raises(RuntimeError):
        async with pool:
            pass  # pragma: no cover
    assert current_pool() is not pool


async def test_entering_an_entered_pool_raises() -> None:
    """A pool entered once cannot be entered again until it is exited."""
    async with SubscriptionPool() as pool:
        with pytest.raises(RuntimeError, match="already entered"):
            await pool.__aenter__()
        assert current_pool() is pool
    assert pool.closed


def test_a_pool_refuses_a_join_under_another_event_loop() -> None:
    """A pool is bound to the event loop that first uses it: a join under
    another loop (trio, in a thread where the pool is current) raises
    RuntimeError, and the pool's own consumer is not disturbed."""
    stub = make_stub()
    errors: list[RuntimeError] = []

    async def elsewhere() -> None:
        with pytest.raises(
            RuntimeError, match="a SubscriptionPool is bound to the event"
        ) as info:
            await anext(aiter(subscribe(stub)))
        errors.append(info.value)

    async def main() -> None:
        async with SubscriptionPool() as pool, aiter(subscribe(stub)):
            another_loop = functools.partial(anyio.run, elsewhere, backend="trio")
            await anyio.to_thread.run_sync(another_loop)
            assert pool.statistics().consumers == 1

    anyio.run(main)
    assert len(errors) == 1
    assert len(stub.instances) == 1


# -- statistics and repr --------------------------------------------------------


async def test_statistics_count_entries_and_consumers() -> None:
    """statistics() counts live entries and attached consumers across keys."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)
        a = [aiter(subscribe(stub, "a")) for _ in range(3)]
        b = [aiter(subscribe(stub, "b")) for _ in range(3)]
        assert pool.statistics().entries == 0  # nobody has started iterating
        async with anyio.create_task_group() as tg:
            for it in (*a, *b):
                tg.start_soon(take, it, 1)
            await anyio.wait_all_tasks_blocked()
            assert pool.statistics() == PoolStatistics(entries=2, consumers=6, idle=0)
            for raw in stub.instances:
                raw.push(ev("worker-added", meta()))
        assert re.search(r"entries\D{0,4}2", repr(pool))
        await a[0].aclose()
        assert pool.statistics() == PoolStatistics(entries=2, consumers=5, idle=0)
        await a[1].aclose()
        await a[2].aclose()
        assert pool.statistics() == PoolStatistics(entries=1, consumers=3, idle=0)
        assert re.search(r"entries\D{0,4}1", repr(pool))
        for it in b:
            await it.aclose()
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)


async def test_statistics_is_a_frozen_record() -> None:
    """statistics() returns an immutable snapshot."""
    async with SubscriptionPool() as pool:
        stats = pool.statistics()
        with pytest.raises(AttributeError):
            stats.entries = 3  # type: ignore[misc]


# -- default pool -----------------------------------------------------------------


async def test_sibling_tasks_share_default_pool_instance() -> None:
    """Without an explicit pool, sibling tasks constructing the same subscriber
    share one raw instance; a later one discovers known workers by replay."""
    stub = make_stub()
    m = meta()
    pools: list[SubscriptionPool] = []
    first_events: list[DiscoveryEvent] = []
    second_events: list[DiscoveryEvent] = []
    first_read, second_done = anyio.Event(), anyio.Event()

    async def first() -> None:
        pools.append(current_pool())
        async with aiter(subscribe(stub, "shared")) as it:
            first_events.extend(await take(it, 1))
            first_read.set()
            await second_done.wait()

    async def second() -> None:
        await first_read.wait()
        pools.append(current_pool())
        async with aiter(subscribe(stub, "shared")) as it:
            second_events.extend(await take(it, 1))
        second_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        assert len(stub.instances) == 1
        stub.instances[-1].push(ev("worker-added", m))
    assert len(stub.instances) == 1
    assert pairs(first_events) == [("worker-added", m)]
    assert pairs(second_events) == [("worker-added", m)]
    assert pools[0] is pools[1] is current_pool()
    assert stub.instances[0].close_calls == 1
    assert current_pool().statistics().entries == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_run_gets_its_own_default_pool(
    backend: tuple[str, dict[str, Any]],
) -> None:
    """current_pool() is one object per run; a second run gets a fresh pool."""
    stub = make_stub()
    sub = subscribe(stub)
    received: list[list[DiscoveryEvent]] = []

    async def run() -> SubscriptionPool:
        pool = current_pool()
        seen: list[SubscriptionPool] = []

        async def look() -> None:
            seen.append(current_pool())

        async with anyio.create_task_group() as tg:
            tg.start_soon(look)
        assert seen == [pool]
        assert current_pool() is pool
        async with aiter(sub) as it, anyio.create_task_group() as tg:

            async def read() -> None:
                received.append(await take(it, 1))

            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            stub.instances[-1].push(ev("worker-added", meta()))
        return pool

    first = run_on_backend(run, backend)
    second = run_on_backend(run, backend)
    assert isinstance(first, SubscriptionPool)
    assert second is not first
    assert len(received) == 2
    assert len(stub.instances) == 2
    assert all(raw.closes_done == 1 for raw in stub.instances)


def test_current_pool_outside_loop_raises() -> None:
    """current_pool() with no pool set and no running loop raises RuntimeError."""
    with pytest.raises(RuntimeError):
        current_pool()


@pytest.mark.parametrize("backend", BACKENDS)
def test_subscription_built_in_one_thread_iterated_in_another(
    backend: tuple[str, dict[str, Any]],
) -> None:
    """Construction needs no loop; iteration uses the iterating thread's loop."""
    stub = make_stub()
    sub = subscribe(stub)  # no event loop runs in this thread
    results: list[list[DiscoveryEvent]] = []
    errors: list[BaseException] = []

    async def consume() -> None:
        async with aiter(sub) as it, anyio.create_task_group() as tg:

            async def read() -> None:
                results.append(await take(it, 1))

            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            stub.instances[-1].push(ev("worker-added", m))

    def run() -> None:
        try:
            run_on_backend(consume, backend)
        except BaseException as error:  # reported to the main thread
            errors.append(error)

    m = meta()
    for _ in range(2):
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(10)
        assert not thread.is_alive()
    assert errors == []
    assert [pairs(r) for r in results] == [[("worker-added", m)]] * 2
    assert len(stub.instances) == 2
    assert all(raw.closes_done == 1 for raw in stub.instances)
