"""SharedSubscription: release and finalisation.

Every way a consumer ends (``aclose``, ``async with``, exhaustion,
cancellation, garbage collection) releases its reference; the last release
finalises the raw instance and cancels its pull, leaving nothing in the pool;
the next consumer builds a fresh raw instance."""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest
from _stubs import drain
from _stubs import ended
from _stubs import entry_of
from _stubs import ev
from _stubs import join
from _stubs import make_stub
from _stubs import meta
from _stubs import pairs
from _stubs import subscribe
from _stubs import take
from wool import DiscoveryEvent

from wool_pooling import PoolStatistics
from wool_pooling import SubscriptionPool

pytestmark = pytest.mark.anyio

RELEASES = ["aclose", "async_with", "exhausted", "cancelled", "collected"]


async def settle(pool: SubscriptionPool, *, consumers: int) -> None:
    """Let background releases run until the pool has ``consumers`` consumers."""
    with anyio.fail_after(5):
        while pool.statistics().consumers != consumers:
            await anyio.wait_all_tasks_blocked()


@pytest.mark.parametrize("how", RELEASES)
async def test_each_way_of_ending_releases_the_reference(how: str) -> None:
    """aclose, async-with exit, exhaustion, cancellation and GC each release the
    consumer's reference; the last release finalises the entry exactly once."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        other = aiter(sub)
        it = aiter(sub)
        await join(stub, other, it, first=ev("worker-added", meta()))
        raw = stub.instances[-1]
        assert pool.statistics().consumers == 2

        async def end(consumer: AsyncIterator[DiscoveryEvent]) -> None:
            if how == "aclose":
                await consumer.aclose()  # type: ignore[attr-defined]
            elif how == "async_with":
                async with consumer:  # type: ignore[attr-defined]
                    pass
            elif how == "cancelled":
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as inner:
                        inner.start_soon(anext, consumer)
                        await anyio.wait_all_tasks_blocked()
                        scope.cancel()
                assert await ended(consumer)

        if how == "exhausted":
            raw.end()
            assert await drain(it) == []
            assert await drain(other) == []
        elif how == "collected":
            del it
            gc.collect()
            await settle(pool, consumers=1)
            assert raw.close_calls == 0
            del other
            gc.collect()
            await settle(pool, consumers=0)
            with anyio.fail_after(5):
                while pool.statistics().entries:
                    await anyio.wait_all_tasks_blocked()
        else:
            await end(it)
            assert pool.statistics().consumers == 1
            assert raw.close_calls == 0
            assert raw.finally_runs == 0
            await end(other)
        # With ttl=0, finalisation completed before the last release returned.
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)
        assert raw.close_calls == raw.closes_done == 1
        assert raw.finally_runs == 1


async def test_cancelled_anext_ends_consumer_and_propagates() -> None:
    """A cancelled pending __anext__ releases the consumer; later __anext__ ends."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        keeper, it = aiter(sub), aiter(sub)
        await join(stub, keeper, it, first=ev("worker-added", meta()))
        outcome: list[str] = []

        async def pending() -> None:
            try:
                await anext(it)
            except anyio.get_cancelled_exc_class():
                outcome.append("cancelled")
                raise

        async with anyio.create_task_group() as tg:
            tg.start_soon(pending)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert outcome == ["cancelled"]
        assert pool.statistics().consumers == 1
        with pytest.raises(StopAsyncIteration):
            await anext(it)
        await keeper.aclose()


async def test_private_shutdown_is_not_called_when_there_is_no_aclose() -> None:
    """A raw instance without aclose() is finalised without calling its private
    ``_shutdown()`` (wool's, a no-op there): only its iterator is closed."""
    stub = make_stub(shutdown=True)
    assert not hasattr(stub, "aclose")
    async with SubscriptionPool() as pool:
        async with (
            aiter(subscribe(stub)) as it,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(take, it, 1)
            await anyio.wait_all_tasks_blocked()
            raw = stub.instances[-1]
            raw.push(ev("worker-added", meta()))
        assert raw.close_calls == raw.closes_done == 0
        assert raw.finally_runs == 1
        assert pool.statistics().entries == 0


async def test_later_consumer_builds_fresh_raw_instance() -> None:
    """After finalisation, the next consumer builds a new raw instance (its
    __aiter__ called anew) and gets no replay from the old one."""
    stub = make_stub()
    m = meta()
    async with SubscriptionPool():
        async with (
            aiter(subscribe(stub)) as it,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(take, it, 1)
            await anyio.wait_all_tasks_blocked()
            stub.instances[-1].push(ev("worker-added", m))
        old = stub.instances[-1]
        assert old.closes_done == 1
        async with (
            aiter(subscribe(stub)) as it,
            anyio.create_task_group() as tg,
        ):
            results: list[DiscoveryEvent] = []

            async def read() -> None:
                results.extend(await take(it, 1))

            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            assert len(stub.instances) == 2
            new = stub.instances[-1]
            assert new is not old
            assert new.aiter_calls == 1
            m2 = meta()
            new.push(ev("worker-added", m2))
        # No replay of the old instance's workers: a fresh start.
        assert pairs(results) == [("worker-added", m2)]
        assert old.aiter_calls == 1
        assert old.closes_done == 1


async def test_no_leak_after_all_consumers_end() -> None:
    """After every consumer ends: the pool is empty, the raw instance is
    collectable and its source iterator was closed exactly once."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)

        async def consume(n: int) -> None:
            async with aiter(sub) as it:
                await take(it, n)

        async with anyio.create_task_group() as tg:
            for n in (1, 2, 3):
                tg.start_soon(consume, n)
            await anyio.wait_all_tasks_blocked()
            raw = stub.instances.pop()
            raw.push(*(ev("worker-added", meta()) for _ in range(3)))
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)
        assert raw.finally_runs == 1
        assert raw.close_calls == raw.closes_done == 1
        assert raw.aiter_calls == 1
        ref = weakref.ref(raw)
        del raw
        gc.collect()
        assert ref() is None


async def test_ended_consumer_object_does_not_pin_raw_instance() -> None:
    """A consumer object kept after it ended does not keep the raw instance alive."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        it = aiter(subscribe(stub))
        await join(stub, it, first=ev("worker-added", meta()))
        raw = stub.instances.pop()
        await it.aclose()
        assert pool.statistics().entries == 0
        ref = weakref.ref(raw)
        del raw
        gc.collect()
        assert ref() is None
        assert await ended(it)


async def test_in_flight_pull_cancelled_only_at_finalisation() -> None:
    """A blocked pull survives the release of non-last consumers and is cancelled
    during the last consumer's aclose()."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        puller, last = aiter(sub), aiter(sub)
        await join(stub, puller, last, first=ev("worker-added", meta()))
        raw = stub.instances[-1]
        async with anyio.create_task_group() as tg:
            tg.start_soon(anext, puller)
            await anyio.wait_all_tasks_blocked()
            assert entry_of(pool, sub).fanout.statistics().pulling
            tg.cancel_scope.cancel()
        # The puller is gone, the pull is still in flight for `last`.
        assert pool.statistics().consumers == 1
        assert raw.finally_runs == 0
        assert entry_of(pool, sub).fanout.statistics().pulling
        await last.aclose()
        assert raw.finally_runs == 1
        assert raw.close_calls == raw.closes_done == 1
        assert pool.statistics().entries == 0
