"""``async for`` over consumers: ``aiter(consumer)`` is the consumer itself.

``FanoutConsumer.__aiter__`` and ``SubscriptionConsumer.__aiter__`` return the
consumer, so an ``async for`` loop goes through its ``__anext__`` and its
position is the consumer's. These tests pin what that must keep: ``async for``
yields exactly what ``anext()`` would; leaving a loop (``break``, an exception,
a cancellation, :exc:`Lagged`) leaves a FanoutConsumer where it was, and the
next loop or ``anext`` goes on at the next item, losing and repeating nothing;
``aclose()`` of the loop's iterator closes the consumer; one task at a time
may wait on a consumer; ``aiter()`` pulls and joins nothing.
"""

from __future__ import annotations

import gc
import weakref
from collections import deque
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any
from typing import Literal
from typing import TypeVar
from typing import cast

import anyio
import anyio.lowlevel
import pytest
from _stubs import AcloseStub
from _stubs import StreamStub
from _stubs import ended
from _stubs import ev
from _stubs import make_stub
from _stubs import meta
from _stubs import pairs
from _stubs import running_tasks
from _stubs import subscribe
from wool import DiscoveryEvent

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer
from wool_pooling import Lagged
from wool_pooling import PoolStatistics
from wool_pooling import SubscriptionConsumer
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio

T = TypeVar("T")

TIMEOUT = 5

#: More items than any test expects from one loop.
RUNAWAY = 1000

Leaving = Literal["break", "raise", "cancel"]
LEAVING: list[Leaving] = ["break", "raise", "cancel"]
KINDS = ["fanout", "subscription"]


# --- helpers ----------------------------------------------------------------------


class Feed:
    """A source fed by the test: a fed item is pulled without suspending.

    With ``checkpoints``, every pull first passes that many checkpoints (so it
    suspends several times even when an item is ready). A fed exception is
    raised by its pull. ``pulls`` counts the pulls started, ``active`` those in
    progress.
    """

    def __init__(self, *, checkpoints: int = 0) -> None:
        self.checkpoints = checkpoints
        self._queue: deque[int | BaseException] = deque()
        self._arrived: anyio.Event | None = None
        self._ended = False
        self.aiter_calls = 0
        self.pulls = 0
        self.active = 0
        self.max_active = 0
        self.finally_runs = 0

    def feed(self, *items: int | BaseException) -> None:
        self._queue.extend(items)
        self._wake()

    def end(self) -> None:
        """Exhaust the source once the fed items are pulled."""
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        arrived, self._arrived = self._arrived, None
        if arrived is not None:
            arrived.set()

    def __aiter__(self) -> AsyncGenerator[int, None]:
        self.aiter_calls += 1
        return self._generate()

    async def _generate(self) -> AsyncGenerator[int, None]:
        try:
            while True:
                self.pulls += 1
                self.active += 1
                self.max_active = max(self.max_active, self.active)
                try:
                    for _ in range(self.checkpoints):
                        await anyio.lowlevel.checkpoint()
                    while not self._queue:
                        if self._ended:
                            return
                        arrived = self._arrived = anyio.Event()
                        await arrived.wait()
                    item = self._queue.popleft()
                finally:
                    self.active -= 1
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.finally_runs += 1


class Leave(Exception):
    """Raised in an ``async for`` body to leave the loop with an exception."""


class PollGaveUp(Exception):
    """A busy poll inside a pull outlived the test's timeout."""


async def settle() -> None:
    """Return once every other task is blocked (see ``test_fanout.settle``)."""
    for _ in range(5):
        await anyio.lowlevel.checkpoint()
    await anyio.wait_all_tasks_blocked()


async def take(iterator: AsyncIterator[T], n: int) -> list[T]:
    """Read exactly ``n`` items with ``anext`` (failing instead of hanging)."""
    with anyio.fail_after(TIMEOUT):
        return [await anext(iterator) for _ in range(n)]


async def loop_take(
    consumer: AsyncIterable[T], n: int, leave: Leaving = "break"
) -> list[T]:
    """Read ``n`` items with one ``async for`` loop, then leave it as ``leave`` says:
    ``break``, raise from the body, or cancel the loop's scope from the body
    (the loop is left by the cancellation, at the body's next checkpoint)."""
    got: list[T] = []
    with anyio.fail_after(TIMEOUT):
        with anyio.CancelScope() as scope:
            try:
                async for item in consumer:
                    got.append(item)
                    if len(got) == n:
                        if leave == "raise":
                            raise Leave
                        if leave == "cancel":
                            scope.cancel()
                            await anyio.lowlevel.checkpoint()
                            pytest.fail("the cancellation did not leave the loop")
                        break
            except Leave:
                pass
        assert scope.cancelled_caught == (leave == "cancel")
    return got


async def read_until_raises(
    iterable: AsyncIterable[T],
    on_item: Callable[[T], Awaitable[None]] | None = None,
) -> tuple[list[T], Exception]:
    """Iterate with one ``async for`` loop until it raises: the items, the error.

    ``on_item`` runs in the loop's body after each item. Fails if the loop
    ends without an exception, or runs away (``fail_after`` cannot stop a loop
    that never suspends).
    """
    got: list[T] = []
    with anyio.fail_after(TIMEOUT):
        try:
            async for item in iterable:
                got.append(item)
                if len(got) > RUNAWAY:
                    pytest.fail(f"the loop ran away: {got[:5]}...")
                if on_item is not None:
                    await on_item(item)
        except Exception as error:
            return got, error
    pytest.fail(f"the loop ended without an error, after {got}")


async def read_in_loops(
    consumer: AsyncIterable[T], n: int, every: int, into: list[T], pace: int = 0
) -> None:
    """Append ``n`` items to ``into``, with ``async for`` loops left every
    ``every`` items; after each item, pass ``pace`` checkpoints."""
    while len(into) < n:
        size = min(every, n - len(into))
        async for item in consumer:
            into.append(item)
            for _ in range(pace):
                await anyio.lowlevel.checkpoint()
            size -= 1
            if size == 0:
                break


async def wait_until_waiting(fanout: Fanout[Any], n: int) -> None:
    """Checkpoint until ``n`` consumers wait (a busy pull never lets all block)."""
    while fanout.statistics().waiting < n:
        await anyio.lowlevel.checkpoint()


async def join(stub: type[StreamStub], *consumers: Any, first: DiscoveryEvent) -> None:
    """Make the consumers join: each reads ``first``, pushed once all of them wait."""
    got: list[list[DiscoveryEvent]] = []

    async def read(consumer: Any) -> None:
        got.append(await take(consumer, 1))

    async with anyio.create_task_group() as tg:
        for consumer in consumers:
            tg.start_soon(read, consumer)
        await anyio.wait_all_tasks_blocked()
        stub.instances[-1].push(first)
    assert [pairs(events) for events in got] == [pairs([first])] * len(consumers)


#: A consumer of either kind.
AnyConsumer = FanoutConsumer[int] | SubscriptionConsumer


@asynccontextmanager
async def buffered_consumer(
    kind: str,
) -> AsyncIterator[tuple[AnyConsumer, list[Any], Callable[[], Any]]]:
    """A joined consumer of ``kind`` with three items buffered, those items, and
    a function that makes one more item arrive at the source and returns it.

    The items are comparable with ``==`` (pairs for discovery events); use
    :func:`comparable` on what the consumer yields.
    """
    if kind == "fanout":
        source = Feed()
        fanout = Fanout(source)
        other, consumer = fanout.consumer(), fanout.consumer()
        source.feed(*range(3))
        fed = [2]

        def more_items() -> int:
            fed[0] += 1
            source.feed(fed[0])
            return fed[0]

        try:
            assert await take(other, 3) == [0, 1, 2]
            yield consumer, [0, 1, 2], more_items
        finally:
            await fanout.aclose()
        return
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(4)]
    async with SubscriptionPool():
        sub = subscribe(stub)
        other, consumer = aiter(sub), aiter(sub)
        await join(stub, other, consumer, first=events[0])
        raw = stub.instances[-1]
        raw.push(*events[1:])
        assert pairs(await take(other, 3)) == pairs(events[1:])

        def more_events() -> Any:
            event = ev("worker-added", meta())
            raw.push(event)
            return pairs([event])[0]

        try:
            yield consumer, pairs(events[1:]), more_events
        finally:
            await other.aclose()
            await consumer.aclose()


def comparable(items: list[Any]) -> list[Any]:
    """Items as :func:`buffered_consumer` lists them."""
    if items and isinstance(items[0], DiscoveryEvent):
        return pairs(items)
    return items


# --- Fanout: async for yields what anext yields -----------------------------------


@pytest.mark.parametrize(
    "checkpoints", [0, 2], ids=["pulls-complete-at-once", "pulls-pass-checkpoints"]
)
async def test_fanout_async_for_yields_exactly_what_anext_yields(
    checkpoints: int,
) -> None:
    """``async for`` yields what ``anext`` does and pulls nothing ahead of demand."""
    source = Feed(checkpoints=checkpoints)
    fanout = Fanout(source)
    reference, subject = fanout.consumer(), fanout.consumer()
    source.feed(*range(6))
    expected = await take(reference, 3)  # the subject has three buffered
    got: list[int] = []

    async def run() -> None:
        async for item in subject:
            got.append(item)
            if len(got) == 8:
                break

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await settle()
            assert got == [0, 1, 2, 3, 4, 5]  # three buffered, three pulled
            stats = fanout.statistics()
            assert (stats.pulled, stats.waiting, stats.pulling) == (6, 1, True)
            assert source.active == 1  # waits for item 6
            source.feed(6)
            await settle()
            assert got == list(range(7))
            source.feed(7, 8)  # 8 is never asked for
    assert got == list(range(8))
    await settle()
    assert fanout.statistics().pulled == 8
    assert source.pulls == 8
    assert source.max_active == 1
    expected += await take(reference, 5)
    assert got == expected
    await fanout.aclose()


@pytest.mark.parametrize(
    "checkpoints", [0, 1], ids=["pulls-complete-at-once", "pulls-pass-checkpoints"]
)
async def test_fanout_concurrent_async_for_loops_each_get_everything_once(
    checkpoints: int,
) -> None:
    """Concurrent loops, left and re-entered every k items, each get all items once."""
    # Five paces; the source sees one pull at a time and none beyond the demand.
    n, burst = 60, 10
    source = Feed(checkpoints=checkpoints)
    fanout = Fanout(source)
    every = [1, 2, 3, 7, n]  # items per loop, per consumer
    consumers = [fanout.consumer() for _ in every]
    results: list[list[int]] = [[] for _ in every]

    async def run(index: int) -> None:
        await read_in_loops(
            consumers[index], n, every[index], results[index], pace=index % 3
        )

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for index in range(len(every)):
                tg.start_soon(run, index)
            for start in range(0, n, burst):
                await settle()
                assert results == [list(range(start))] * len(every)
                assert fanout.statistics().waiting == len(every)
                source.feed(*range(start, start + burst))
    assert results == [list(range(n))] * len(every)
    assert source.max_active == 1
    assert source.pulls == fanout.statistics().pulled == n
    await fanout.aclose()


# --- Fanout: leaving a loop and iterating again -----------------------------------


@pytest.mark.parametrize("leave", LEAVING)
async def test_fanout_leaving_a_loop_then_iterating_again_continues_at_the_next_item(
    leave: Leaving,
) -> None:
    """A loop left by break, raise or cancel leaves the consumer at the next item."""
    source = Feed()
    fanout = Fanout(source)
    reference, subject = fanout.consumer(), fanout.consumer()
    source.feed(*range(7))
    assert await take(reference, 4) == [0, 1, 2, 3]  # the subject has four buffered
    assert await loop_take(subject, 1, leave) == [0]  # left on a buffered item
    assert await loop_take(subject, 4, leave) == [1, 2, 3, 4]  # left on a pulled one
    assert await loop_take(subject, 1, leave) == [5]
    assert await anext(subject) == 6
    assert fanout.statistics().pulled == 7
    got: list[int] = []

    async def run() -> None:
        got.extend(await loop_take(subject, 1, leave))

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await settle()
            assert fanout.statistics().waiting == 1
            source.feed(7, 8)
    assert got == [7]  # left on an item it waited for
    assert await anext(subject) == 8
    assert source.pulls == 9
    assert await take(reference, 5) == [4, 5, 6, 7, 8]
    await fanout.aclose()


async def test_fanout_anext_and_async_for_loops_share_the_consumers_one_position() -> (
    None
):
    """Loops over a consumer and ``anext`` calls in them share its one position."""
    source = Feed()
    fanout = Fanout(source)
    reference, subject = fanout.consumer(), fanout.consumer()
    source.feed(*range(9))
    assert await take(reference, 3) == [0, 1, 2]  # the subject has three buffered
    assert aiter(subject) is subject
    got: list[tuple[str, int]] = []
    with anyio.fail_after(TIMEOUT):
        async for item in subject:
            got.append(("loop", item))
            got.append(("anext", await anext(subject)))
            async for inner in subject:
                got.append(("inner loop", inner))
                break
            if len(got) == 9:
                break
        kinds = ["loop", "anext", "inner loop"] * 3
        assert got == list(zip(kinds, range(9), strict=True))
        awaited: list[int] = []

        async def read() -> None:
            async for item in subject:
                awaited.append(item)
                awaited.append(await anext(subject))
                break

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await settle()
            assert fanout.statistics().waiting == 1
            source.feed(9, 10, 11)
        assert awaited == [9, 10]
        assert await anext(subject) == 11
    assert source.pulls == 12
    assert await take(reference, 9) == list(range(3, 12))
    await fanout.aclose()


# --- Fanout: cancellation ---------------------------------------------------------


@pytest.mark.parametrize("role", ["pulling", "waiting"])
async def test_fanout_cancelled_async_for_loses_nothing_and_keeps_the_source_open(
    role: str,
) -> None:
    """A loop cancelled while it waits loses nothing and leaves the pull alone."""
    # Whether its own demand started the pull or another consumer's did; a new
    # loop gets the item it would have got, and the source stays open.
    source = Feed()
    fanout = Fanout(source)
    victim, other = fanout.consumer(), fanout.consumer()
    victim_items: list[int] = []
    other_items: list[int] = []
    scope = anyio.CancelScope()
    victim_out = anyio.Event()

    async def run_victim() -> None:
        with scope:
            async for item in victim:
                victim_items.append(item)
        victim_out.set()

    async def run_other() -> None:
        async for item in other:
            other_items.append(item)

    source.feed(0)
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            first, second = (
                (run_victim, run_other)
                if role == "pulling"
                else (run_other, run_victim)
            )
            tg.start_soon(first)
            await settle()
            assert source.pulls == 2  # the first loop's demand started pull 1
            assert source.active == 1
            tg.start_soon(second)
            await settle()
            assert fanout.statistics().waiting == 2
            scope.cancel()
            await victim_out.wait()
            assert scope.cancelled_caught
            assert victim_items == [0]
            stats = fanout.statistics()
            assert (stats.consumers, stats.pulling, stats.pulled) == (2, True, 1)
            assert source.active == 1  # the pull goes on
            assert source.finally_runs == 0
            source.feed(1)
            await settle()
            assert other_items == [0, 1]
            assert victim.buffered == 1
            assert await loop_take(victim, 1) == [1]  # the item it would have got
            source.feed(2)
            await settle()
            assert other_items == [0, 1, 2]
            assert await loop_take(victim, 1) == [2]
            other.close()  # ends the other loop
    assert source.pulls == 4
    assert source.max_active == 1
    assert source.finally_runs == 0
    await fanout.aclose()
    assert source.finally_runs == 1


async def test_fanout_loop_cancelled_during_the_pull_it_started_loses_nothing() -> None:
    """A loop cancelled during the pull it started loses nothing; the pull goes on."""
    # The pull polls across checkpoints in a task that is not the loop's; the
    # source neither sees the cancellation nor is closed; a new loop starts with
    # the item that was being pulled.
    reached, go = anyio.Event(), anyio.Event()
    through_source: list[BaseException] = []
    finally_runs: list[int] = []
    # anyio task ids of the polling steps, and of the victim's task (both
    # alive when recorded, so equal ids would mean the same task).
    poll_tasks: set[int] = set()
    victim_task: list[int] = []

    async def source() -> AsyncIterator[int]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            for number in range(6):
                await anyio.lowlevel.checkpoint()
                if number == 3:
                    reached.set()
                    while not go.is_set():  # the busy pull the victim started
                        await anyio.lowlevel.checkpoint()
                        poll_tasks.add(anyio.get_current_task().id)
                        if anyio.current_time() > give_up_at:
                            raise PollGaveUp
                yield number
        except BaseException as error:
            through_source.append(error)
            raise
        finally:
            finally_runs.append(1)

    fanout = Fanout(source())
    victim, other = fanout.consumer(), fanout.consumer()
    victim_items: list[int] = []
    other_items: list[int] = []
    scope = anyio.CancelScope()
    victim_out = anyio.Event()

    async def run_victim() -> None:
        victim_task.append(anyio.get_current_task().id)
        with scope:
            async for item in victim:
                victim_items.append(item)
        victim_out.set()

    async def run_other() -> None:
        other_items.extend([item async for item in other])

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_victim)
            await reached.wait()
            # The victim's loop waits for pull 3, which it started.
            stats = fanout.statistics()
            assert (stats.pulling, stats.waiting, stats.pulled) == (True, 1, 3)
            scope.cancel()
            await victim_out.wait()
            assert scope.cancelled_caught
            assert victim_items == [0, 1, 2]
            assert fanout.statistics().pulling  # the pull goes on
            assert finally_runs == []
            assert poll_tasks  # the pull polled meanwhile
            assert not poll_tasks & set(victim_task)
            tg.start_soon(run_other)
            await wait_until_waiting(fanout, 1)
            assert other_items == []  # still in its loop, waiting for item 3
            go.set()
            victim_items += [item async for item in victim]
    assert victim_items == list(range(6))
    assert other_items == list(range(6))
    assert through_source == []
    assert finally_runs == [1]  # by exhaustion
    assert fanout.statistics().pulled == 6


# --- Fanout: lag ------------------------------------------------------------------


async def test_fanout_lagged_ends_the_loop_and_the_next_starts_at_the_oldest_item() -> (
    None
):
    """``Lagged`` ends the loop, not the consumer; the next loop reads the oldest."""
    source = Feed()
    source.feed(*range(12))
    fanout = Fanout(source, max_lag=2, on_lag="error")
    fast, slow = fanout.consumer(), fanout.consumer()

    async def overtake(item: int) -> None:
        if item == 0:  # items 1 and 2 are dropped before the slow loop reads them
            assert await take(fast, 5) == [0, 1, 2, 3, 4]

    got, error = await read_until_raises(slow, overtake)
    assert got == [0]
    assert isinstance(error, Lagged)
    assert error.skipped == 2
    assert "ACTIVE" in repr(slow)  # the loop ended; the consumer did not
    assert slow.buffered == 2
    assert await loop_take(slow, 3) == [3, 4, 5]  # the oldest held, then a pull
    assert await take(fast, 5) == [5, 6, 7, 8, 9]
    # Lagging again, at the first read of a new loop this time.
    got, error = await read_until_raises(slow)
    assert got == []
    assert isinstance(error, Lagged)
    assert error.skipped == 2
    assert await loop_take(slow, 3) == [8, 9, 10]
    assert await anext(fast) == 10
    assert fanout.statistics().pulled == 11
    await fanout.aclose()


async def test_fanout_loops_under_backpressure_receive_everything() -> None:
    """Loops under on_lag="wait" never pass max_lag, and all get every item."""
    max_lag, n = 2, 30
    source = Feed()
    source.feed(*range(n))
    source.end()
    fanout = Fanout(source, max_lag=max_lag, on_lag="wait")
    runners = [fanout.consumer() for _ in range(3)]
    stalled = fanout.consumer()
    release = anyio.Event()
    results: dict[str, list[int]] = {}
    overshoot: list[int] = []

    async def run(index: int) -> None:
        got = results[f"runner{index}"] = []
        async for item in runners[index]:
            got.append(item)
            buffered = fanout.statistics().buffered
            if buffered > max_lag:
                overshoot.append(buffered)
            for _ in range(index):  # read at different paces
                await anyio.lowlevel.checkpoint()

    async def run_stalled() -> None:
        await release.wait()
        results["stalled"] = [item async for item in stalled]

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for index in range(len(runners)):
                tg.start_soon(run, index)
            tg.start_soon(run_stalled)
            await settle()
            assert fanout.statistics().pulled == max_lag
            assert all(results[f"runner{i}"] == [0, 1] for i in range(3))
            release.set()
    assert results == {
        name: list(range(n)) for name in ["runner0", "runner1", "runner2", "stalled"]
    }
    assert overshoot == []
    assert fanout.statistics().buffered == 0


# --- Fanout: errors ---------------------------------------------------------------


@pytest.mark.parametrize("when", ["inline", "awaited"])
async def test_fanout_source_error_reaches_async_for_after_the_items_before_it(
    when: str,
) -> None:
    """A source error ends ``async for`` after the items before it, for everyone."""
    # Raised in a pull the loop makes itself or in one it waits for; a consumer
    # still behind gets it the same way, with the error itself; both then end.
    source = Feed()
    fanout = Fanout(source)
    first, behind = fanout.consumer(), fanout.consumer()
    error = ValueError("boom")
    source.feed(0, 1, *([error] if when == "inline" else []))
    got: list[int] = []
    caught: list[BaseException] = []

    async def run() -> None:
        try:
            async for item in first:
                got.append(item)
        except ValueError as exc:
            caught.append(exc)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await settle()
            if when == "awaited":
                assert got == [0, 1]
                assert fanout.statistics().waiting == 1
                source.feed(error)
        assert got == [0, 1]
        assert caught == [error]
        assert caught[0] is error
        assert [item async for item in first] == []  # the consumer ended
        assert await read_until_raises(behind) == ([0, 1], error)
        assert [item async for item in behind] == []
    assert source.finally_runs == 1
    assert fanout.statistics().consumers == 0
    await fanout.aclose()


async def test_fanout_loop_over_an_ended_consumer_ends_at_once_without_a_pull() -> None:
    """A loop over an ended consumer ends at once, without a pull."""
    # A closed consumer, or any consumer of a closed fan-out, even with items
    # ready at the source.
    source = Feed()
    fanout = Fanout(source)
    reader, closed = fanout.consumer(), fanout.consumer()
    source.feed(*range(4))
    assert await take(reader, 1) == [0]
    closed.close()
    assert [item async for item in closed] == []
    assert await loop_take(reader, 1) == [1]
    assert [item async for item in closed] == []
    assert source.pulls == fanout.statistics().pulled == 2
    await fanout.aclose()
    assert [item async for item in reader] == []
    assert source.pulls == 2


# --- freeing a consumer a loop left ----------------------------------------------


@pytest.mark.parametrize("left", ["buffered", "pulled", "awaited", "cancelled"])
async def test_a_fanout_consumer_left_by_async_for_is_freed_by_reference_counting(
    left: str,
) -> None:
    """A consumer a loop left is freed, and leaves, by refcounting once dropped."""
    # Left by break after a buffered, a pulled or an awaited item, or by a
    # cancellation; freed with the collector off.
    source = Feed()
    fanout = Fanout(source)
    other = fanout.consumer()
    holder = [fanout.consumer()]
    source.feed(0, 1)
    assert await take(other, 1) == [0]  # one item buffered for the consumer
    gc.disable()
    try:
        got: list[int] = []

        async def run(scope: anyio.CancelScope) -> None:
            with scope:
                async for item in holder[0]:
                    got.append(item)
                    if left != "cancelled":
                        break

        with anyio.fail_after(TIMEOUT):
            if left == "buffered":
                await run(anyio.CancelScope())
                assert got == [0]
            elif left == "pulled":
                assert await take(holder[0], 1) == [0]
                await run(anyio.CancelScope())
                assert got == [1]
            else:
                assert await take(holder[0], 2) == [0, 1]
                scope = anyio.CancelScope()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run, scope)
                    await settle()
                    assert fanout.statistics().waiting == 1
                    if left == "awaited":
                        source.feed(2)
                    else:
                        scope.cancel()
                assert got == ([2] if left == "awaited" else [])
                del scope
        reference = weakref.ref(holder[0])
        holder.clear()
        assert reference() is None
        assert fanout.statistics().consumers == 1
    finally:
        gc.enable()
    await fanout.aclose()


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


# --- SharedSubscription consumers -------------------------------------------------


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


# --- aiter() itself, and who may iterate ------------------------------------------


async def test_fanout_aiter_returns_the_consumer_and_pulls_nothing() -> None:
    """``aiter()`` returns the fan-out consumer itself and pulls nothing."""
    await settle()
    baseline = running_tasks()
    source = Feed()
    source.feed(*range(5))
    fanout = Fanout(source)
    consumers = [fanout.consumer() for _ in range(3)]
    iterators = [aiter(consumer) for consumer in consumers]
    assert all(
        it is consumer for it, consumer in zip(iterators, consumers, strict=True)
    )
    await settle()
    assert source.aiter_calls == 0
    assert source.pulls == 0
    stats = fanout.statistics()
    assert (stats.pulled, stats.waiting, stats.pulling, stats.consumers) == (
        0,
        0,
        False,
        3,
    )
    assert running_tasks() == baseline
    assert await take(iterators[0], 1) == [0]
    assert await take(iterators[1], 1) == [0]  # buffered: no pull
    assert source.pulls == 1
    await fanout.aclose()


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


@pytest.mark.parametrize("kind", KINDS)
async def test_aclose_of_the_iterator_a_loop_used_closes_the_consumer(
    kind: str,
) -> None:
    """``aclose()`` of the iterator a loop used closes the consumer itself."""
    async with buffered_consumer(kind) as (consumer, expected, more):
        iterator = aiter(consumer)
        assert iterator is consumer
        got: list[Any] = []
        with anyio.fail_after(TIMEOUT):
            async for item in iterator:
                got.append(item)
                break
            await iterator.aclose()
            more()
            assert [item async for item in consumer] == []
        assert "ENDED" in repr(consumer)
        assert comparable(got) == expected[:1]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_loop_over_a_consumer_another_task_waits_on_raises_busy(
    kind: str,
) -> None:
    """A loop over a consumer another task waits on raises BusyResourceError."""
    async with buffered_consumer(kind) as (consumer, expected, more):
        got: list[Any] = []

        async def loop() -> None:
            async for item in consumer:
                got.append(item)
                if len(got) == len(expected) + 1:
                    break

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(loop)
                await settle()
                assert comparable(got) == expected  # then it waits for one more
                with pytest.raises(anyio.BusyResourceError):
                    await loop_take(consumer, 1)  # a second loop, in this task
                arrived = more()
            assert comparable(got) == [*expected, arrived]
            following = more()
            assert comparable(await take(consumer, 1)) == [following]
