"""What a fan-out holds and when it frees it: an item is held only by the
consumers still to read it and freed by reference counting the moment the
last of them reads it or leaves (closed, dropped, collected mid-scan)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator
from typing import Literal

import anyio
import anyio.lowlevel
import pytest
from _stubs import Probe
from _stubs import counting_source
from _stubs import settle
from _stubs import take

from wool_pooling import Fanout

pytestmark = pytest.mark.anyio


async def test_items_are_freed_once_every_consumer_received_them(probe: Probe) -> None:
    """``buffered`` drops to 0 once all consumers received the items."""
    fanout = Fanout(probe)
    a, b, c = fanout.consumer(), fanout.consumer(), fanout.consumer()
    probe.feed(*range(6))
    with anyio.fail_after(5):
        assert await take(a, 6) == list(range(6))
        assert fanout.statistics().buffered == 6
        assert await take(b, 6) == list(range(6))
        assert fanout.statistics().buffered == 6
        assert await take(c, 4) == list(range(4))
        assert fanout.statistics().buffered == 2
        assert await take(c, 2) == [4, 5]
    assert fanout.statistics().buffered == 0
    await fanout.aclose()


@pytest.mark.parametrize("read_ahead", [0, 64])
async def test_slow_consumer_holds_items_fast_one_alone_holds_none(
    probe: Probe, read_ahead: int
) -> None:
    """A slow consumer holds items until it reads or leaves; a lone fast one
    holds none beyond those read ahead."""
    fanout = Fanout(probe, read_ahead=read_ahead)
    slow, fast = fanout.consumer(), fanout.consumer()
    probe.feed(*range(10))
    # Read ahead: the five items left at the source (fewer than read_ahead).
    ahead = 5 if read_ahead else 0
    with anyio.fail_after(5):
        assert await take(fast, 5) == list(range(5))
        await anyio.wait_all_tasks_blocked()
        assert fanout.statistics().pulled == 5 + ahead
        assert fanout.statistics().buffered == 5 + ahead
        assert slow.buffered == 5 + ahead
        assert fast.buffered == ahead
        slow.close()
        assert fanout.statistics().buffered == ahead
        assert fanout.statistics().consumers == 1
        for item in range(5, 10):
            assert await anext(fast) == item
            assert fanout.statistics().buffered == (9 - item if read_ahead else 0)
    await fanout.aclose()


async def test_garbage_collected_consumer_stops_holding_items(probe: Probe) -> None:
    """A consumer collected without ``close()`` releases the items it held."""
    fanout = Fanout(probe)
    reader = fanout.consumer()
    fanout.consumer()  # dropped at once, never read
    lost = fanout.consumer()
    probe.feed(*range(4))
    with anyio.fail_after(5):
        assert await take(reader, 4) == list(range(4))
    gc.collect()
    assert fanout.statistics().consumers == 2
    assert fanout.statistics().buffered == 4
    del lost
    gc.collect()
    assert fanout.statistics().consumers == 1
    assert fanout.statistics().buffered == 0
    await fanout.aclose()


@pytest.mark.parametrize("read_ahead", [0, 64])
async def test_large_run_leaves_nothing_buffered(read_ahead: int) -> None:
    """10 000 items through three concurrent consumers leave the log empty;
    while they run, it holds at most ``read_ahead`` items past the three."""
    n = 10_000
    fanout = Fanout(counting_source(n), read_ahead=read_ahead)
    consumers = [fanout.consumer() for _ in range(3)]
    results: list[list[int]] = [[] for _ in consumers]
    peak = 0

    async def run(i: int) -> None:
        nonlocal peak
        async for item in consumers[i]:
            results[i].append(item)
            peak = max(peak, fanout.statistics().buffered)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(len(consumers)):
                tg.start_soon(run, i)
    assert all(result == list(range(n)) for result in results)
    assert fanout.statistics().buffered == 0
    assert fanout.statistics().pulled == n
    # Consumers reading in step never let the log grow past the read-ahead.
    assert peak <= read_ahead + 3


class Token:
    """An item whose lifetime a test can watch (through a weak reference)."""

    def __init__(self, number: int) -> None:
        self.number = number


async def tokens(n: int, made: list[weakref.ref[Token]]) -> AsyncIterator[Token]:
    for number in range(n):
        box = [Token(number)]
        made.append(weakref.ref(box[0]))
        yield box.pop()  # keep no reference in this frame while suspended


def alive(made: list[weakref.ref[Token]]) -> list[int]:
    return [token.number for ref in made if (token := ref()) is not None]


async def test_an_item_is_freed_when_the_last_consumer_that_needs_it_reads_it() -> None:
    """Nothing but the consumers still to read an item keeps it alive."""
    made: list[weakref.ref[Token]] = []
    fanout = Fanout(tokens(6, made))
    first, second = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(5):
        for _ in range(6):
            await anext(first)
        assert alive(made) == list(range(6))  # all held for `second`
        for number in range(6):
            assert (await anext(second)).number == number
            assert alive(made) == list(range(number + 1, 6))
    await fanout.aclose()


async def test_a_leaving_consumer_frees_what_only_it_held() -> None:
    """Closing (or dropping) the slowest consumer frees the items only it needed."""
    made: list[weakref.ref[Token]] = []
    fanout = Fanout(tokens(8, made))
    reader, slow, dropped = fanout.consumer(), fanout.consumer(), fanout.consumer()
    with anyio.fail_after(5):
        for _ in range(8):
            await anext(reader)
        for _ in range(3):
            await anext(slow)
        assert alive(made) == list(range(8))  # `dropped` has read nothing
        del dropped
        gc.collect()
        assert alive(made) == list(range(3, 8))
        slow.close()
        assert alive(made) == []
    await fanout.aclose()


@pytest.mark.parametrize("on_lag", ["wait", "error"])
async def test_consumers_collected_while_the_fanout_scans_them_are_tolerated(
    on_lag: Literal["wait", "error"],
) -> None:
    """A consumer closed by a finaliser in the middle of a scan of the consumers
    (the lag bound's) breaks nothing: garbage collection runs at allocations."""
    fanout = Fanout(counting_source(30), max_lag=2, on_lag=on_lag)
    fast = fanout.consumer()
    slow = [fanout.consumer() for _ in range(40)]  # all at the oldest item
    generations = [200]

    class Holder:
        """Closes its consumer when collected, as a subscription consumer does,
        and leaves new cyclic garbage behind, so collections keep finding some."""

        def __init__(self) -> None:
            self.consumer = fanout.consumer()
            self.cycle = self

        def __del__(self) -> None:
            self.consumer.close()
            if generations[0] > 0:
                generations[0] -= 1
                Holder()

    threshold = gc.get_threshold()
    received: list[int] = []

    async def read_fast() -> None:
        async for item in fast:
            received.append(item)

    try:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                Holder()
                gc.set_threshold(1)  # collect at (almost) every allocation
                tg.start_soon(read_fast)
                await anyio.wait_all_tasks_blocked()
                gc.set_threshold(*threshold)
                for consumer in slow:
                    consumer.close()
    finally:
        gc.set_threshold(*threshold)
        generations[0] = 0
    gc.collect()
    assert received == list(range(30))
    await fanout.aclose()


async def test_cancelled_waits_leave_nothing_behind(probe: Probe) -> None:
    """Waits cancelled while the source is silent hold nothing until an item comes."""
    fanout = Fanout(probe)
    patient, impatient = fanout.consumer(), fanout.consumer()
    received: list[int] = []

    async def wait_patiently() -> None:
        received.append(await anext(patient))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_patiently)
        await settle()
        for _ in range(50):
            with anyio.CancelScope() as scope:
                scope.cancel()
                await anext(impatient)
            with anyio.move_on_after(0):
                await anext(impatient)
        # Only the patient consumer's wait is held (on asyncio, one future).
        arrival = fanout._arrival  # pyright: ignore[reportPrivateUsage]
        futures = getattr(arrival, "_futures", None)
        if futures is not None:
            assert len(futures) == 1
        assert fanout.statistics().waiting == 1
        probe.feed(7)
    assert received == [7]
    with anyio.fail_after(5):
        assert await anext(impatient) == 7
    await fanout.aclose()
