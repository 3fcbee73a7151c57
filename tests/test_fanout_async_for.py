"""``async for`` over a fan-out consumer: ``aiter(consumer)`` is the consumer.

``FanoutConsumer.__aiter__`` returns the consumer, so a loop goes through its
``__anext__`` and its position is the consumer's: a loop yields exactly what
``anext()`` would; leaving a loop (``break``, an exception, :exc:`Lagged`)
leaves the consumer where it was, and the next loop or ``anext`` goes on at
the next item, losing and repeating nothing; ``aiter()`` pulls nothing.
"""

from __future__ import annotations

import gc
import weakref

import anyio
import anyio.lowlevel
import pytest
from _stubs import LEAVING
from _stubs import TIMEOUT
from _stubs import Feed
from _stubs import Leaving
from _stubs import loop_take
from _stubs import read_in_loops
from _stubs import read_until_raises
from _stubs import running_tasks
from _stubs import settle
from _stubs import take

from wool_pooling import Fanout
from wool_pooling import Lagged

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "checkpoints", [0, 2], ids=["pulls-complete-at-once", "pulls-pass-checkpoints"]
)
async def test_fanout_async_for_yields_exactly_what_anext_yields(
    checkpoints: int,
) -> None:
    """``async for`` yields what ``anext`` does and pulls nothing ahead of demand."""
    source = Feed(checkpoints=checkpoints)
    fanout = Fanout(source, read_ahead=0)
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


@pytest.mark.parametrize("read_ahead", [0, 64])
@pytest.mark.parametrize(
    "checkpoints", [0, 1], ids=["pulls-complete-at-once", "pulls-pass-checkpoints"]
)
async def test_fanout_concurrent_async_for_loops_each_get_everything_once(
    checkpoints: int, read_ahead: int
) -> None:
    """Concurrent loops, left and re-entered every k items, each get all items once."""
    # Five paces; the source sees one pull at a time and, with read_ahead=0,
    # none beyond the demand.
    n, burst = 60, 10
    source = Feed(checkpoints=checkpoints)
    fanout = Fanout(source, read_ahead=read_ahead)
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
    # Read-ahead leaves one pull waiting at the dry source, never more.
    assert fanout.statistics().pulled == n
    assert source.pulls == n + (read_ahead > 0)
    await fanout.aclose()


@pytest.mark.parametrize("leave", LEAVING)
async def test_fanout_leaving_a_loop_then_iterating_again_continues_at_the_next_item(
    leave: Leaving,
) -> None:
    """A loop left by break, raise or cancel leaves the consumer at the next item."""
    source = Feed()
    fanout = Fanout(source, read_ahead=0)
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
    fanout = Fanout(source, read_ahead=0)
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


async def test_fanout_lagged_ends_the_loop_and_the_next_starts_at_the_oldest_item() -> (
    None
):
    """``Lagged`` ends the loop, not the consumer; the next loop reads the oldest."""
    source = Feed()
    source.feed(*range(12))
    fanout = Fanout(source, max_lag=2, on_lag="error", read_ahead=0)
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


@pytest.mark.parametrize("when", ["ready", "awaited"])
async def test_fanout_source_error_reaches_async_for_after_the_items_before_it(
    when: str,
) -> None:
    """A source error ends ``async for`` after the items before it, for everyone."""
    # Raised by a pull that finds it ready or by one the loop waits for; a consumer
    # still behind gets it the same way, with the error itself; both then end.
    source = Feed()
    fanout = Fanout(source)
    first, behind = fanout.consumer(), fanout.consumer()
    error = ValueError("boom")
    source.feed(0, 1, *([error] if when == "ready" else []))
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
    fanout = Fanout(source, read_ahead=0)
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


async def test_fanout_aiter_returns_the_consumer_and_pulls_nothing() -> None:
    """``aiter()`` returns the fan-out consumer itself and pulls nothing."""
    await settle()
    baseline = running_tasks()
    source = Feed()
    source.feed(*range(5))
    fanout = Fanout(source, read_ahead=0)
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
