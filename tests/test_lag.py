"""Slow consumers: ``max_lag`` / ``on_lag`` on ``Fanout``, resync by diff."""

from __future__ import annotations

import gc
import itertools
import math
import random
import uuid
from collections.abc import AsyncGenerator
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any
from typing import ClassVar
from typing import cast

import anyio
import anyio.lowlevel
import pytest
from _loops import BACKENDS
from _loops import run as run_on_backend
from _stubs import ev
from _stubs import meta
from _stubs import pairs
from anyio.streams.memory import MemoryObjectReceiveStream
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer
from wool_pooling import Lagged
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

# Sync tests (validation, hypothesis) are ignored by anyio's plugin despite this mark.
pytestmark = pytest.mark.anyio

View = dict[uuid.UUID, WorkerMetadata]


# --- Fanout helpers ---------------------------------------------------------------


class Counter:
    """Async iterable of ``0 .. n-1``; ``on_pull(i)`` runs as item ``i`` is produced.

    With ``suspend=True`` every pull suspends once (a checkpoint) before its
    item, so the consumers wait for the pump instead of finding items ready.
    """

    def __init__(
        self,
        n: int,
        *,
        suspend: bool = False,
        on_pull: Callable[[int], None] | None = None,
    ) -> None:
        self.n = n
        self.suspend = suspend
        self.on_pull = on_pull
        self.pulls = 0

    def __aiter__(self) -> AsyncGenerator[int, None]:
        return self._items()

    async def _items(self) -> AsyncGenerator[int, None]:
        for i in range(self.n):
            if self.suspend:
                await anyio.lowlevel.checkpoint()
            self.pulls += 1
            if self.on_pull is not None:
                self.on_pull(i)
            yield i


async def read(consumer: FanoutConsumer[int], n: int) -> list[int]:
    """Read exactly ``n`` items (failing instead of hanging)."""
    with anyio.fail_after(5):
        return [await anext(consumer) for _ in range(n)]


async def read_to_end(consumer: FanoutConsumer[int]) -> list[int]:
    with anyio.fail_after(5):
        return [item async for item in consumer]


# --- Fanout, on_lag="wait" --------------------------------------------------------


@pytest.mark.parametrize("suspend", [False, True], ids=["ready", "suspending"])
async def test_wait_mode_fast_consumer_moves_in_lockstep_with_slowest(
    suspend: bool,
) -> None:
    """on_lag="wait": the fast one stops max_lag ahead and resumes as the slow reads."""
    max_lag, n = 3, 12
    slow_read = 0
    early_pulls: list[tuple[int, int]] = []

    def on_pull(index: int) -> None:
        if index >= slow_read + max_lag:
            early_pulls.append((index, slow_read))

    fanout = Fanout(Counter(n, suspend=suspend, on_pull=on_pull), max_lag=max_lag)
    fast, slow = fanout.consumer(), fanout.consumer()
    fast_items: list[int] = []
    slow_items: list[int] = []

    async def run_fast() -> None:
        async for item in fast:
            fast_items.append(item)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_fast)
            await anyio.wait_all_tasks_blocked()
            assert fast_items == [0, 1, 2]
            stats = fanout.statistics()
            assert (stats.pulled, stats.buffered, stats.consumers) == (3, 3, 2)
            for _ in range(n):
                slow_items.append(await anext(slow))
                slow_read += 1
                await anyio.wait_all_tasks_blocked()
                ahead = min(n, slow_read + max_lag)
                assert fast_items == list(range(ahead))
                stats = fanout.statistics()
                assert stats.pulled == ahead
                assert stats.buffered == ahead - slow_read <= max_lag
            with pytest.raises(StopAsyncIteration):
                await anext(slow)
    assert fast_items == list(range(n))
    assert slow_items == list(range(n))
    assert early_pulls == []
    assert fanout.statistics().buffered == 0


@pytest.mark.parametrize("leave", ["close", "aclose", "async_with", "gc"])
async def test_wait_mode_fast_consumer_resumes_when_slowest_leaves(leave: str) -> None:
    """on_lag="wait": when the slowest leaves, the next slowest bounds the fast one."""
    max_lag, n = 3, 10
    fanout = Fanout(Counter(n), max_lag=max_lag)
    fast = fanout.consumer()
    middle = fanout.consumer()
    slow: FanoutConsumer[int] | None = fanout.consumer()
    fast_items: list[int] = []

    async def run_fast() -> None:
        async for item in fast:
            fast_items.append(item)

    async def leave_with(consumer: FanoutConsumer[int]) -> None:
        if leave == "close":
            consumer.close()
        elif leave == "aclose":
            await consumer.aclose()
        else:
            async with consumer:
                pass

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_fast)
            await anyio.wait_all_tasks_blocked()
            assert fast_items == [0, 1, 2]
            assert await read(middle, 2) == [0, 1]
            await anyio.wait_all_tasks_blocked()
            assert fast_items == [0, 1, 2]  # the slow consumer still holds item 0
            assert slow is not None
            if leave == "gc":
                slow = None
                gc.collect()
            else:
                await leave_with(slow)
            await anyio.wait_all_tasks_blocked()
            assert fast_items == [0, 1, 2, 3, 4]  # now bound by the middle one
            stats = fanout.statistics()
            assert (stats.consumers, stats.buffered, stats.pulled) == (2, 3, 5)
            middle.close()
    assert fast_items == list(range(n))
    stats = fanout.statistics()
    assert (stats.consumers, stats.buffered, stats.pulled) == (0, 0, n)


async def test_wait_mode_cancelled_wait_for_space_loses_nothing() -> None:
    """on_lag="wait": a cancelled wait for space keeps the consumer, loses nothing."""
    max_lag, n = 2, 8
    source = Counter(n)
    fanout = Fanout(source, max_lag=max_lag)
    fast, slow = fanout.consumer(), fanout.consumer()
    assert await read(fast, 2) == [0, 1]
    got: list[int] = []
    scope = anyio.CancelScope()

    async def wait_for_space() -> None:
        with scope:
            got.append(await anext(fast))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_space)
            await anyio.wait_all_tasks_blocked()
            assert got == []
            scope.cancel()
    assert scope.cancelled_caught
    assert got == []
    stats = fanout.statistics()
    assert (stats.consumers, stats.pulled, stats.buffered) == (2, 2, 2)
    assert source.pulls == 2
    assert await read(slow, 1) == [0]
    assert await read(fast, 1) == [2]
    rest: dict[str, list[int]] = {}

    async def drain(name: str, consumer: FanoutConsumer[int]) -> None:
        rest[name] = await read_to_end(consumer)

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain, "fast", fast)
        tg.start_soon(drain, "slow", slow)
    assert [0, 1, 2, *rest["fast"]] == list(range(n))
    assert [0, *rest["slow"]] == list(range(n))


# --- Fanout, on_lag="error" -------------------------------------------------------


@pytest.mark.parametrize("suspend", [False, True], ids=["ready", "suspending"])
async def test_error_mode_lagged_counts_exactly_the_skipped_items(
    suspend: bool,
) -> None:
    """on_lag="error": exact Lagged(skipped), then the oldest held item; rest intact."""
    max_lag, n = 3, 20
    fanout = Fanout(Counter(n, suspend=suspend), max_lag=max_lag, on_lag="error")
    fast, slow = fanout.consumer(), fanout.consumer()
    for i in range(10):
        assert await read(fast, 1) == [i]
        assert fanout.statistics().buffered <= max_lag
    assert fanout.statistics().buffered == max_lag
    late = fanout.consumer()
    with pytest.raises(Lagged) as info:
        await anext(slow)
    assert info.value.skipped == 7
    assert isinstance(info.value, Exception)
    assert await read(slow, 3) == [7, 8, 9]
    assert fanout.statistics().buffered == 0
    for i in range(10, n):
        for consumer in (fast, late, slow):
            assert await read(consumer, 1) == [i]
            assert fanout.statistics().buffered <= max_lag
    for consumer in (fast, late, slow):
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)


async def test_error_mode_lags_again_and_bounds_a_long_log() -> None:
    """on_lag="error": a consumer can lag repeatedly; the log never exceeds max_lag."""
    max_lag = 5
    fanout = Fanout(Counter(700), max_lag=max_lag, on_lag="error")
    fast, slow = fanout.consumer(), fanout.consumer()
    for i in range(600):
        assert await read(fast, 1) == [i]
        assert fanout.statistics().buffered <= max_lag
    with pytest.raises(Lagged) as info:
        await anext(slow)
    assert info.value.skipped == 595
    assert await read(slow, 5) == [595, 596, 597, 598, 599]
    assert await read(fast, 100) == list(range(600, 700))
    assert fanout.statistics().buffered == max_lag
    with pytest.raises(Lagged) as info:
        await anext(slow)
    assert info.value.skipped == 95
    assert await read(slow, 5) == [695, 696, 697, 698, 699]
    for consumer in (fast, slow):
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)
    assert fanout.statistics().pulled == 700


async def test_error_mode_lag_of_exactly_max_lag_loses_nothing() -> None:
    """on_lag="error": a consumer exactly max_lag behind receives every item."""
    max_lag = 4
    fanout = Fanout(Counter(12), max_lag=max_lag, on_lag="error")
    fast, slow = fanout.consumer(), fanout.consumer()
    for start in range(0, 12, max_lag):
        assert await read(fast, max_lag) == list(range(start, start + max_lag))
        assert fanout.statistics().buffered == max_lag
        assert await read(slow, max_lag) == list(range(start, start + max_lag))
    await fanout.aclose()


async def test_max_lag_none_is_unbounded() -> None:
    """max_lag=None: a stalled consumer makes the log grow; it later gets every item."""
    n = 100
    fanout = Fanout(Counter(n), max_lag=None)
    fast, slow = fanout.consumer(), fanout.consumer()
    assert await read(fast, n) == list(range(n))
    assert fanout.statistics().buffered == n
    assert await read(slow, n) == list(range(n))
    assert fanout.statistics().buffered == 0
    await fanout.aclose()


def test_the_error_policy_without_a_bound_is_refused() -> None:
    """``on_lag="error"`` with ``max_lag=None`` could never act: refused at
    construction, saying why."""
    with pytest.raises(ValueError, match=r"on_lag='error' needs a max_lag"):
        Fanout(Counter(1), max_lag=None, on_lag="error")


async def test_default_fanout_holds_what_the_decorator_holds() -> None:
    """Fanout(source) without max_lag is bounded as ``@shared_subscription``
    is, at 1024 items: a stalled consumer holds back the pull past it."""
    n = 2000
    fanout = Fanout(Counter(n), read_ahead=0)
    fast, slow = fanout.consumer(), fanout.consumer()
    assert await read(fast, 1024) == list(range(1024))
    with anyio.CancelScope() as scope:
        scope.deadline = anyio.current_time()
        await anext(fast)  # waits for room: the slow one holds the log
    assert scope.cancelled_caught
    assert fanout.statistics().buffered == 1024
    assert await read(slow, n) == list(range(n))
    assert await read(fast, n - 1024) == list(range(1024, n))
    await fanout.aclose()


# --- validation ---------------------------------------------------------------------


BAD_MAX_LAGS = [0, -1, 1.5, 2.0, True, False, "3"]


@pytest.mark.parametrize("max_lag", BAD_MAX_LAGS, ids=repr)
def test_fanout_rejects_bad_max_lag(max_lag: Any) -> None:
    """Fanout: max_lag < 1, non-int or bool raises ValueError naming max_lag."""
    with pytest.raises(ValueError, match="max_lag"):
        Fanout(Counter(1), max_lag=max_lag)


@pytest.mark.parametrize("on_lag", ["drop", "", None, "WAIT"], ids=repr)
def test_fanout_rejects_unknown_on_lag(on_lag: Any) -> None:
    """Fanout: an unknown on_lag raises ValueError naming on_lag."""
    with pytest.raises(ValueError, match="on_lag"):
        Fanout(Counter(1), max_lag=3, on_lag=on_lag)


def test_fanout_accepts_good_lag_arguments() -> None:
    """Fanout: max_lag=1 and both policies are accepted, and no bound with
    ``"wait"``."""
    for on_lag in ("wait", "error"):
        Fanout(Counter(1), max_lag=1, on_lag=on_lag)  # type: ignore[arg-type]
    Fanout(Counter(1), max_lag=None, on_lag="wait")


class _Raw:
    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self._events()

    async def _events(self) -> AsyncGenerator[DiscoveryEvent, None]:
        await anyio.sleep_forever()
        yield ev("worker-added", meta())  # pragma: no cover


@pytest.mark.parametrize("max_lag", BAD_MAX_LAGS, ids=repr)
def test_decorator_rejects_bad_max_lag_when_called(max_lag: Any) -> None:
    """@shared_subscription(max_lag=bad) raises ValueError naming max_lag at once."""
    with pytest.raises(ValueError, match="max_lag"):
        shared_subscription(max_lag=max_lag)
    cls = type("Raw", (_Raw,), {})
    with pytest.raises(ValueError, match="max_lag"):
        shared_subscription(cls, max_lag=max_lag)


def test_decorator_default_max_lag_is_1024() -> None:
    """Decorated without max_lag, a class is bounded at 1024; the bound is settable."""
    bare = shared_subscription(type("Bare", (_Raw,), {}))
    called = shared_subscription(ttl=1)(type("Called", (_Raw,), {}))
    custom = shared_subscription(max_lag=7)(type("Custom", (_Raw,), {}))
    unbounded = shared_subscription(max_lag=None)(type("Unbounded", (_Raw,), {}))
    assert cast(SharedSubscription, bare()).max_lag == 1024
    assert cast(SharedSubscription, called()).max_lag == 1024
    assert cast(SharedSubscription, custom()).max_lag == 7
    assert cast(SharedSubscription, unbounded()).max_lag is None


# --- SharedSubscription helpers -----------------------------------------------------


def make_script(n: int, workers: int, seed: int) -> list[DiscoveryEvent]:
    """A valid random discovery stream: added for unknown, updated/dropped for known."""
    rng = random.Random(seed)
    uids = [uuid.UUID(int=i + 1) for i in range(workers)]
    return build_script((rng.choice(uids), rng.random() < 0.3) for _ in range(n))


def build_script(ops: Iterable[tuple[uuid.UUID, bool]]) -> list[DiscoveryEvent]:
    """``(uid, drop)`` ops -> events; every update carries new metadata (a new pid)."""
    pids = itertools.count(1)
    state: View = {}
    events: list[DiscoveryEvent] = []
    for uid, drop in ops:
        if uid not in state:
            state[uid] = meta(uid, pid=next(pids))
            events.append(ev("worker-added", state[uid]))
        elif drop:
            events.append(ev("worker-dropped", state.pop(uid)))
        else:
            state[uid] = meta(uid, pid=next(pids))
            events.append(ev("worker-updated", state[uid]))
    return events


def state_of(events: Iterable[DiscoveryEvent]) -> View:
    state: View = {}
    for event in events:
        if event.type == "worker-dropped":
            del state[event.metadata.uid]
        else:
            state[event.metadata.uid] = event.metadata
    return state


def apply_checked(view: View, event: DiscoveryEvent) -> DiscoveryEvent:
    """Apply ``event`` to a consumer's view, asserting it is consistent with it."""
    metadata = event.metadata
    uid = metadata.uid
    if event.type == "worker-added":
        assert uid not in view, f"worker-added for known worker {uid}"
        view[uid] = metadata
    elif event.type == "worker-updated":
        assert uid in view, f"worker-updated for unknown worker {uid}"
        assert view[uid] != metadata, f"worker-updated without a change for {uid}"
        view[uid] = metadata
    else:
        assert event.type == "worker-dropped", event.type
        assert uid in view, f"worker-dropped for unknown worker {uid}"
        assert view[uid] == metadata, f"worker-dropped with other metadata for {uid}"
        del view[uid]
    return event


def expected_diff(seen: View, current: View) -> set[tuple[str, WorkerMetadata]]:
    diff: set[tuple[str, WorkerMetadata]] = set()
    for uid, metadata in current.items():
        if uid not in seen:
            diff.add(("worker-added", metadata))
        elif seen[uid] != metadata:
            diff.add(("worker-updated", metadata))
    for uid, metadata in seen.items():
        if uid not in current:
            diff.add(("worker-dropped", metadata))
    return diff


class Scripted:
    """Raw subscriber: yields ``script`` at once, then (unless ``ends``) live pushes.

    Subclassed per test by :func:`scripted_class`; every raw instance replays
    the script. ``aiter_calls`` counts upstream iterations.
    """

    script: ClassVar[list[DiscoveryEvent]] = []
    ends: ClassVar[bool] = False
    live: ClassVar[MemoryObjectReceiveStream[DiscoveryEvent] | None] = None
    aiter_calls: ClassVar[int] = 0

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        type(self).aiter_calls += 1
        return self._events()

    async def _events(self) -> AsyncGenerator[DiscoveryEvent, None]:
        for event in self.script:
            yield event
        if self.ends:
            return
        if self.live is None:
            await anyio.sleep_forever()
        else:
            async for event in self.live:
                yield event


def scripted_class(
    script: list[DiscoveryEvent],
    *,
    ends: bool = False,
    live: MemoryObjectReceiveStream[DiscoveryEvent] | None = None,
    **options: Any,
) -> type[Scripted]:
    """A decorated :class:`Scripted` subclass; after the script it ends or blocks.

    When blocking, it yields what the test sends to ``live``, if given.
    """
    namespace = {"script": script, "ends": ends, "live": live, "aiter_calls": 0}
    return shared_subscription(**options)(type("Scripted", (Scripted,), namespace))


def subscribe(cls: type) -> SharedSubscription:
    return cast(SharedSubscription, cls())


def only_entry(pool: SubscriptionPool) -> Any:
    entries = list(pool._entries.values())  # pyright: ignore[reportPrivateUsage]
    assert len(entries) == 1
    return entries[0]


# --- SharedSubscription resync ------------------------------------------------------


async def test_stalled_consumer_is_resynced_by_state_diff() -> None:
    """A consumer more than max_lag behind gets the state diff, then the live stream."""
    max_lag, n, prefix = 8, 300, 40
    script = make_script(n, workers=10, seed=5)
    live, receive = anyio.create_memory_object_stream[DiscoveryEvent](math.inf)
    # read_ahead=0: the second consumer joins before anything is pulled
    # ahead, so it receives the script itself rather than a replay.
    cls = scripted_class(script, live=receive, max_lag=max_lag, read_ahead=0)
    fast_view: View = {}
    slow_view: View = {}
    with live, receive:
        async with SubscriptionPool() as pool:
            fast, slow = aiter(subscribe(cls)), aiter(subscribe(cls))
            with anyio.fail_after(5):
                fast_events: list[DiscoveryEvent] = []
                slow_events: list[DiscoveryEvent] = []
                for _ in range(prefix):
                    slow_events.append(apply_checked(slow_view, await anext(slow)))
                    fast_events.append(apply_checked(fast_view, await anext(fast)))
                entry = only_entry(pool)
                for _ in range(n - prefix):
                    fast_events.append(apply_checked(fast_view, await anext(fast)))
                    assert entry.fanout.statistics().buffered <= max_lag
                assert pairs(slow_events) == pairs(script[:prefix])
                assert pairs(fast_events) == pairs(script)
                assert fast_view == state_of(script)
                assert entry.fanout.statistics().buffered <= max_lag

                diff = expected_diff(slow_view, fast_view)
                # The script makes the diff exercise every kind of event.
                assert {type_ for type_, _ in diff} == {
                    "worker-added",
                    "worker-updated",
                    "worker-dropped",
                }
                resync = [
                    apply_checked(slow_view, await anext(slow))
                    for _ in range(len(diff))
                ]
                assert len(set(pairs(resync))) == len(resync)
                assert set(pairs(resync)) == diff
                assert slow_view == fast_view
                assert entry.fanout.statistics().buffered == 0

                # Then the live stream, for both.
                newcomer = meta(uuid.UUID(int=1000), pid=10_000)
                known = next(iter(fast_view.values()))
                live.send_nowait(ev("worker-added", newcomer))
                live.send_nowait(ev("worker-dropped", known))
                expected = [("worker-added", newcomer), ("worker-dropped", known)]
                for consumer, view in ((fast, fast_view), (slow, slow_view)):
                    got = [apply_checked(view, await anext(consumer)) for _ in range(2)]
                    assert pairs(got) == expected
                assert slow_view == fast_view
                assert cls.aiter_calls == 1  # one upstream iteration


async def test_consumer_within_max_lag_gets_the_exact_sequence() -> None:
    """A consumer at most max_lag behind receives every event, in order: no resync."""
    max_lag, n = 8, 120
    script = make_script(n, workers=10, seed=11)
    # read_ahead=0: counts what is buffered; the second consumer joins
    # before anything is pulled ahead, so it receives the script itself.
    cls = scripted_class(script, max_lag=max_lag, read_ahead=0)
    async with SubscriptionPool() as pool:
        fast, slow = aiter(subscribe(cls)), aiter(subscribe(cls))
        with anyio.fail_after(5):
            slow_events = [await anext(slow)]
            fast_events = [await anext(fast)]
            entry = only_entry(pool)
            while len(fast_events) < n:
                chunk = min(max_lag, n - len(fast_events))
                for _ in range(chunk):
                    fast_events.append(await anext(fast))
                assert entry.fanout.statistics().buffered == chunk
                for _ in range(chunk):
                    slow_events.append(await anext(slow))
            assert pairs(fast_events) == pairs(script)
            assert pairs(slow_events) == pairs(script)


async def test_default_bound_applies_to_the_shared_log() -> None:
    """Without max_lag, the shared log holds at most 1024 events for a stalled one."""
    n = 1100
    script = make_script(n, workers=10, seed=3)
    # read_ahead=0: the second consumer joins before anything is pulled
    # ahead, so it receives the script itself rather than a replay.
    cls = scripted_class(script, read_ahead=0)
    fast_view: View = {}
    slow_view: View = {}
    async with SubscriptionPool() as pool:
        fast, slow = aiter(subscribe(cls)), aiter(subscribe(cls))
        with anyio.fail_after(5):
            apply_checked(slow_view, await anext(slow))
            for _ in range(n):
                apply_checked(fast_view, await anext(fast))
            assert only_entry(pool).fanout.statistics().buffered <= 1024
            assert fast_view == state_of(script)
            diff = expected_diff(slow_view, fast_view)
            for _ in range(len(diff)):
                apply_checked(slow_view, await anext(slow))
            assert slow_view == fast_view


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=8, max_size=40),
    bursts=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 8)), min_size=1, max_size=25
    ),
    max_lag=st.integers(1, 5),
    consumers=st.integers(2, 3),
    join_first=st.booleans(),
)
def test_resync_keeps_every_view_consistent_and_converging(
    backend: tuple[str, dict[str, Any]],
    ops: list[tuple[int, bool]],
    bursts: list[tuple[int, int]],
    max_lag: int,
    consumers: int,
    join_first: bool,
) -> None:
    """Any interleaving: each event fits its consumer's view; views end at the state."""
    script = build_script((uuid.UUID(int=w + 1), drop) for w, drop in ops)
    final = state_of(script)
    # Bursts of reads by one consumer make the others fall behind.
    steps = [who for who, count in bursts for _ in range(count)]
    if join_first:  # every consumer joins before the bursts (else at its first read)
        steps[:0] = range(consumers)

    async def body() -> None:
        cls = scripted_class(script, ends=True, max_lag=max_lag)
        views: list[View] = [{} for _ in range(consumers)]
        done = [False] * consumers
        async with SubscriptionPool() as pool:
            subs = [aiter(subscribe(cls)) for _ in range(consumers)]

            async def step(i: int) -> None:
                try:
                    event = await anext(subs[i])
                except StopAsyncIteration:
                    done[i] = True
                else:
                    apply_checked(views[i], event)

            with anyio.fail_after(5):
                for i in steps:
                    if not done[i % consumers]:
                        await step(i % consumers)
                    for entry in pool._live:  # pyright: ignore[reportPrivateUsage]
                        assert entry.fanout.statistics().buffered <= max_lag
                for i in range(consumers):
                    while not done[i]:
                        await step(i)
        for view in views:
            assert view == final

    run_on_backend(body, backend)


async def test_error_mode_stalled_consumer_pins_at_most_max_lag_items() -> None:
    """on_lag="error": what a stalled consumer keeps alive stays within the bound."""
    max_lag = 4
    alive: set[int] = set()

    class Item:
        def __init__(self, number: int) -> None:
            self.number = number
            alive.add(number)

        def __del__(self) -> None:
            alive.discard(self.number)

    async def items() -> AsyncGenerator[Item, None]:
        for number in range(50):
            yield Item(number)

    fanout = Fanout(items(), max_lag=max_lag, on_lag="error")
    fast, stalled = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(5):
        for number in range(50):
            assert (await anext(fast)).number == number
            assert len(alive) <= max_lag
        assert alive == set(range(50 - max_lag, 50))
        with pytest.raises(Lagged) as info:
            await anext(stalled)
        assert info.value.skipped == 50 - max_lag
        for number in range(50 - max_lag, 50):
            assert (await anext(stalled)).number == number
        assert alive == set()
    await fanout.aclose()
