"""SharedSubscription: sharing, late-joiner replay, ttl, errors and cancellation
(release and finalisation are in ``test_subscription_release``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

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
from wool import DiscoverySubscriberLike

from wool_pooling import PoolStatistics
from wool_pooling import SubscriptionConsumer
from wool_pooling import SubscriptionPool

pytestmark = pytest.mark.anyio


# -- sharing -------------------------------------------------------------------


async def test_consumer_receives_event() -> None:
    """A consumer receives the event its raw subscriber yields."""
    stub = make_stub()
    async with SubscriptionPool():
        it = aiter(subscribe(stub))
        await join(stub, it, first=ev("worker-added", meta()))  # asserts it
        await it.aclose()


async def test_two_consumers_receive_every_event() -> None:
    """Two consumers of one key both receive every event, in order."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(3)]
    async with SubscriptionPool():
        sub = subscribe(stub)
        first, second = aiter(sub), aiter(sub)
        await join(stub, first, second, first=events[0])
        stub.instances[-1].push(*events[1:])
        assert pairs(await take(first, 2)) == pairs(events[1:])
        assert pairs(await take(second, 2)) == pairs(events[1:])
        assert len(stub.instances) == 1
        await first.aclose()
        await second.aclose()


async def test_each_aiter_is_an_independent_consumer() -> None:
    """Each __aiter__() returns a distinct consumer reading at its own pace."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(4)]
    async with SubscriptionPool():
        sub = subscribe(stub)
        first, second = aiter(sub), aiter(sub)
        assert first is not second
        assert isinstance(first, SubscriptionConsumer)
        assert isinstance(first, AsyncIterator)
        async with first, second:
            # Join both (the first event is pulled once, for both).
            await join(stub, first, second, first=events[0])
            stub.instances[-1].push(*events[1:])
            assert pairs(await take(first, 3)) == pairs(events[1:])
            assert pairs(await take(second, 1)) == pairs(events[1:2])
            assert pairs(await take(second, 2)) == pairs(events[2:])


async def test_subscription_is_discovery_subscriber_like() -> None:
    """A SharedSubscription satisfies wool's DiscoverySubscriberLike protocol."""
    assert isinstance(subscribe(make_stub()), DiscoverySubscriberLike)


async def test_one_raw_iteration_for_all_consumers() -> None:
    """All consumers of a key share one raw instance and ONE aiter(raw)."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(3)]
    async with SubscriptionPool() as pool:
        # Five separate constructions of the same key, one consumer each.
        consumers = [aiter(subscribe(stub)) for _ in range(5)]
        results: list[list[DiscoveryEvent]] = []

        async def read(it: AsyncIterator[DiscoveryEvent]) -> None:
            results.append(await take(it, 3))

        async with anyio.create_task_group() as tg:
            for it in consumers:
                tg.start_soon(read, it)
            await anyio.wait_all_tasks_blocked()
            assert pool.statistics().entries == 1
            assert pool.statistics().consumers == 5
            stub.instances[-1].push(*events)
        assert len(stub.instances) == 1
        assert stub.instances[0].aiter_calls == 1
        assert [pairs(r) for r in results] == [pairs(events)] * 5
        for it in consumers:
            await it.aclose()


async def test_consumer_joins_at_first_anext() -> None:
    """__aiter__() builds nothing; the raw instance is built at the first __anext__."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        it = aiter(subscribe(stub))
        assert stub.instances == []
        assert pool.statistics().entries == 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(take, it, 1)
            await anyio.wait_all_tasks_blocked()
            assert len(stub.instances) == 1
            assert pool.statistics().consumers == 1
            stub.instances[0].push(ev("worker-added", meta()))
        await it.aclose()


async def test_many_consumers_each_get_full_sequence() -> None:
    """100 consumers of one key each receive the full sequence from one iteration."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(10)]
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        results: list[list[DiscoveryEvent]] = []

        async def read() -> None:
            async with aiter(sub) as it:
                results.append(await drain(it))

        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            assert pool.statistics().consumers == 100
            raw = stub.instances[-1]
            raw.push(*events)
            raw.end()
        assert len(results) == 100
        assert all(pairs(r) == pairs(events) for r in results)
        assert raw.aiter_calls == 1
        assert len(stub.instances) == 1
        assert pool.statistics().entries == 0


# -- late-joiner replay ---------------------------------------------------------


async def test_late_joiner_replay_then_live_no_gap_no_duplicate() -> None:
    """A late joiner gets one worker-added per known worker (latest metadata), then
    exactly the events pulled after its join."""
    stub = make_stub(read_ahead=0)  # pushed events wait for a demand
    w1, w2, w3 = meta(), meta(), meta()
    w1b = meta(w1.uid, pid=2)
    early = [
        ev("worker-added", w1),
        ev("worker-added", w2),
        ev("worker-updated", w1b),
        ev("worker-added", w3),
    ]
    async with SubscriptionPool():
        sub = subscribe(stub)
        ahead, behind = aiter(sub), aiter(sub)
        await join(stub, behind, ahead, first=early[0])
        raw = stub.instances[-1]
        # Pushed but not yet pulled: the source is demand-driven.
        raw.push(*early[1:], ev("worker-dropped", w2), ev("worker-added", meta()))
        # `ahead` pulls up to w3; `behind` still has three of them buffered.
        assert pairs(await take(ahead, 3)) == pairs(early[1:])
        late = aiter(sub)
        replay = await take(late, 3)
        # One worker-added per known worker, with its latest metadata (any order).
        assert all(isinstance(e, DiscoveryEvent) for e in replay)
        assert sorted(pairs(replay), key=lambda p: p[1].uid) == sorted(
            [("worker-added", w1b), ("worker-added", w2), ("worker-added", w3)],
            key=lambda p: p[1].uid,
        )
        # Live events after the join point: the two already pushed, then more.
        w4 = meta()
        raw.push(ev("worker-dropped", w1b), ev("worker-added", w4))
        rest = await take(late, 4)
        assert pairs(await take(ahead, 4)) == pairs(rest)
        assert pairs(rest)[0] == ("worker-dropped", w2)
        assert pairs(rest)[2:] == [("worker-dropped", w1b), ("worker-added", w4)]
        # The consumer behind still gets every event, from where it was.
        tail = await take(behind, 7)
        assert pairs(tail[:3]) == pairs(early[1:])
        assert pairs(tail[3:]) == pairs(rest)
        for it in (ahead, behind, late):
            await it.aclose()


async def test_replay_after_add_update_drop() -> None:
    """A worker added, updated then dropped is not replayed; a surviving updated
    worker is replayed once, as worker-added with its latest metadata."""
    stub = make_stub()
    gone, kept = meta(), meta()
    gone2, kept2 = meta(gone.uid, pid=2), meta(kept.uid, pid=3)
    history = [
        ev("worker-added", gone),
        ev("worker-updated", gone2),
        ev("worker-dropped", gone2),
        ev("worker-added", kept),
        ev("worker-updated", kept2),
    ]
    async with SubscriptionPool():
        sub = subscribe(stub)
        async with aiter(sub) as first:
            await join(stub, first, first=history[0])
            raw = stub.instances[-1]
            raw.push(*history[1:])
            await take(first, 4)
            async with aiter(sub) as late:
                assert pairs(await take(late, 1)) == [("worker-added", kept2)]
                live = ev("worker-added", meta())
                raw.push(live)
                assert pairs(await take(late, 1)) == pairs([live])
                assert pairs(await take(first, 1)) == pairs([live])
        assert len(stub.instances) == 1


async def test_replay_state_does_not_depend_on_consumers_reading() -> None:
    """Known workers are tracked as the source is pulled: a consumer that never
    reads does not hold back a late joiner's replay."""
    stub = make_stub()
    x, a, b = meta(), meta(), meta()
    async with SubscriptionPool():
        sub = subscribe(stub)
        idle, active = aiter(sub), aiter(sub)
        await join(stub, idle, active, first=ev("worker-added", x))
        raw = stub.instances[-1]
        raw.push(ev("worker-added", a))
        raw.push(ev("worker-added", b), ev("worker-dropped", a))
        await take(active, 3)  # `idle` never reads again
        late = aiter(sub)
        replay = await take(late, 2)
        assert {p[0] for p in pairs(replay)} == {"worker-added"}
        assert {e.metadata.uid for e in replay} == {x.uid, b.uid}
        live = ev("worker-added", meta())
        raw.push(live)
        assert pairs(await take(late, 1)) == pairs([live])
        for it in (idle, active, late):
            await it.aclose()


class CountingDict(dict[Any, Any]):
    """A dict counting its mutations, swapped in for the known-worker state."""

    updates = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        self.updates += 1
        super().__setitem__(key, value)

    def pop(self, key: Any, *default: Any) -> Any:
        self.updates += 1
        return super().pop(key, *default)

    def __delitem__(self, key: Any) -> None:
        self.updates += 1
        super().__delitem__(key)


async def test_known_workers_updated_once_per_event() -> None:
    """With three consumers, the known-worker state is updated once per event."""
    stub = make_stub()
    w = meta()
    events = [
        ev("worker-added", w),
        ev("worker-updated", meta(w.uid, pid=2)),
        ev("worker-added", meta()),
        ev("worker-dropped", w),
    ]
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        consumers = [aiter(sub) for _ in range(3)]
        async with anyio.create_task_group() as tg:
            for it in consumers:
                tg.start_soon(take, it, 1)
            await anyio.wait_all_tasks_blocked()
            counting = CountingDict()
            entry_of(pool, sub).source.view.workers = counting
            stub.instances[-1].push(*events)
        for it in consumers:
            assert len(await take(it, 3)) == 3
        assert counting.updates == len(events)
        assert len(counting) == 1
        for it in consumers:
            await it.aclose()


async def test_finite_source_first_gets_all_second_gets_replay() -> None:
    """Over a finite source of two events, the first consumer gets both, a
    second joining after them gets their replay; both then reach the end."""
    stub = make_stub(read_ahead=0)  # the end waits for a demand
    m1, m2 = meta(), meta()
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        first = aiter(sub)
        await join(stub, first, first=ev("worker-updated", m1))
        raw = stub.instances[-1]
        raw.push(ev("worker-added", m2))
        raw.end()
        assert pairs(await take(first, 1)) == [("worker-added", m2)]
        second = aiter(sub)
        second_events = await drain(second)
        first_rest = await drain(first)
        assert pairs(second_events) == [("worker-added", m1), ("worker-added", m2)]
        assert first_rest == []
        assert raw.aiter_calls == 1
        assert pool.statistics().entries == 0
        assert raw.closes_done == 1


# -- ttl -------------------------------------------------------------------------


async def test_ttl_reuse_then_expiry() -> None:
    """With ttl > 0 a consumer arriving in time reuses the entry (and gets the
    replay); after the ttl the entry is finalised once."""
    stub = make_stub(ttl=0.5)
    m = meta()
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        async with aiter(sub) as it, anyio.create_task_group() as tg:
            tg.start_soon(take, it, 1)
            await anyio.wait_all_tasks_blocked()
            raw = stub.instances[-1]
            raw.push(ev("worker-added", m))
        assert pool.statistics() == PoolStatistics(entries=1, consumers=0, idle=1)
        assert raw.close_calls == 0
        async with aiter(subscribe(stub)) as again:
            assert pairs(await take(again, 1)) == [("worker-added", m)]
            assert len(stub.instances) == 1
            assert raw.aiter_calls == 1
            m2 = meta()
            raw.push(ev("worker-added", m2))
            assert pairs(await take(again, 1)) == [("worker-added", m2)]
        assert raw.close_calls == 0
        with anyio.fail_after(5):
            # Waiting for the ttl timer itself, not synchronising tasks.
            while pool.statistics().entries:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert raw.close_calls == raw.closes_done == 1
        assert raw.finally_runs == 1
        async with (
            aiter(subscribe(stub)) as fresh,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(take, fresh, 1)
            await anyio.wait_all_tasks_blocked()
            assert len(stub.instances) == 2
            stub.instances[-1].push(ev("worker-added", meta()))
    assert raw.close_calls == 1


# -- errors ---------------------------------------------------------------------


async def test_error_reaches_every_consumer() -> None:
    """An exception from the raw stream reaches every consumer after the items
    before it; the failed entry is not reused."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(2)]
    error = ValueError("boom")
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        outcomes: list[tuple[list[DiscoveryEvent], BaseException | None]] = []

        async def read() -> None:
            got: list[DiscoveryEvent] = []
            caught: BaseException | None = None
            try:
                with anyio.fail_after(5):
                    async for event in aiter(sub):
                        got.append(event)
            except ValueError as exc:
                caught = exc
            outcomes.append((got, caught))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            raw = stub.instances[-1]
            raw.push(*events)
            raw.fail(error)
        assert len(outcomes) == 3
        for got, caught in outcomes:
            assert pairs(got) == pairs(events)
            assert caught is error
        assert pool.statistics().entries == 0
        assert raw.close_calls == raw.closes_done == 1
        # The next consumer starts fresh.
        async with aiter(sub) as it, anyio.create_task_group() as tg:
            tg.start_soon(take, it, 1)
            await anyio.wait_all_tasks_blocked()
            assert len(stub.instances) == 2
            assert stub.instances[-1] is not raw
            stub.instances[-1].push(ev("worker-added", meta()))


async def test_consumer_joining_failed_entry_gets_fresh_instance() -> None:
    """While an old consumer still holds a failed entry, a new consumer gets a
    fresh raw instance; the old one is finalised once its holder ends."""
    stub = make_stub()
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        failed, holder = aiter(sub), aiter(sub)
        await join(stub, failed, holder, first=ev("worker-added", meta()))
        old = stub.instances[-1]
        old.fail(RuntimeError("gone"))
        with pytest.raises(RuntimeError, match="gone"):
            await take(failed, 1)
        assert pool.statistics().consumers == 1  # `holder` has not seen it yet
        fresh_events: list[DiscoveryEvent] = []
        newcomer = aiter(sub)
        async with anyio.create_task_group() as tg:

            async def read() -> None:
                fresh_events.extend(await take(newcomer, 1))

            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            assert len(stub.instances) == 2
            new = stub.instances[-1]
            assert new is not old
            m = meta()
            new.push(ev("worker-added", m))
        assert pairs(fresh_events) == [("worker-added", m)]
        assert old.close_calls == 0
        with pytest.raises(RuntimeError, match="gone"):
            await take(holder, 1)
        assert old.close_calls == old.closes_done == 1
        assert new.close_calls == 0
        assert pool.statistics().entries == 1
        await newcomer.aclose()
        assert new.close_calls == 1


# -- cancellation -----------------------------------------------------------------


async def test_cancelled_puller_does_not_disturb_others() -> None:
    """Cancelling the consumer whose request started the pull loses nothing for
    the others and leaves the shared source open."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(4)]
    async with SubscriptionPool() as pool:
        sub = subscribe(stub)
        puller = aiter(sub)
        others = [aiter(sub), aiter(sub)]
        results: list[list[DiscoveryEvent]] = []
        puller_scope = anyio.CancelScope()

        async def pull() -> None:
            with puller_scope:
                await anext(puller)

        async def read(it: AsyncIterator[DiscoveryEvent]) -> None:
            results.append(await take(it, len(events)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(pull)  # its request starts the pull
            await anyio.wait_all_tasks_blocked()
            raw = stub.instances[-1]
            assert entry_of(pool, sub).fanout.statistics().pulling
            for it in others:
                tg.start_soon(read, it)
            await anyio.wait_all_tasks_blocked()
            puller_scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert pool.statistics().consumers == 2
            raw.push(*events)
        assert puller_scope.cancelled_caught
        assert [pairs(r) for r in results] == [pairs(events)] * 2
        assert raw.finally_runs == 0
        assert raw.close_calls == 0
        assert raw.aiter_calls == 1
        assert await ended(puller)
        more = ev("worker-added", meta())
        raw.push(more)
        for it in others:
            assert pairs(await take(it, 1)) == pairs([more])
            await it.aclose()
        assert raw.close_calls == 1


async def test_async_for_replay_stops_when_the_consumer_is_closed_mid_replay() -> None:
    """Closing a consumer in an ``async for`` over its replay ends the loop there."""
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(5)]
    async with SubscriptionPool():
        sub = subscribe(stub)
        async with aiter(sub) as first:
            await join(stub, first, first=events[0])
            stub.instances[-1].push(*events[1:])
            assert pairs(await take(first, 4)) == pairs(events[1:])
            late = aiter(sub)
            seen: list[DiscoveryEvent] = []
            with anyio.fail_after(5):
                async for event in late:
                    seen.append(event)
                    if len(seen) == 2:
                        await late.aclose()
            # Two of the five replayed workers, then the end: nothing after
            # the close, and no live event either.
            assert len(seen) == 2
            assert {e.metadata.uid for e in seen} <= {e.metadata.uid for e in events}
            assert await ended(late)
