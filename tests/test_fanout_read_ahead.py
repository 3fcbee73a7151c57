"""Read-ahead: the pump pulls up to ``read_ahead`` items past the demand.

With ``read_ahead=R`` the pump keeps pulling, in its one task, while fewer
than R items wait unread by the most advanced consumer, so a source with
items ready costs one wake-up per batch. These tests pin what still holds:
one task runs every step, the bound on lag counts the items read ahead, a
cancelled consumer loses nothing of a batch, an error after part of a batch
reaches every consumer after the items before it, a late joiner's replay
has no gap and no duplicate, and ``read_ahead=0`` pulls on demand only.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest
from _stubs import current_task
from _stubs import ev
from _stubs import meta
from _stubs import pairs
from _stubs import uvloop_too
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer
from wool_pooling import Lagged
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = [pytest.mark.anyio, uvloop_too]


async def ready(count: int, pulls: list[int] | None = None) -> AsyncIterator[int]:
    """``count`` items, each ready at once (the source never suspends)."""
    for item in range(count):
        if pulls is not None:
            pulls.append(item)
        yield item


async def read(consumer: FanoutConsumer[int], count: int) -> list[int]:
    return [await anext(consumer) for _ in range(count)]


async def drain_into(consumer: FanoutConsumer[int], received: list[int]) -> None:
    async for item in consumer:
        received.append(item)


@pytest.mark.parametrize("read_ahead", [1, 4, 16])
async def test_the_pump_pulls_read_ahead_items_past_the_demand_and_stops(
    read_ahead: int,
) -> None:
    """One demand pulls the item asked for and then ``read_ahead`` more, and
    no further while nobody reads them."""
    pulls: list[int] = []
    fanout = Fanout(ready(100, pulls), read_ahead=read_ahead)
    async with fanout.consumer() as consumer:
        assert await read(consumer, 1) == [0]
        await anyio.wait_all_tasks_blocked()
        assert pulls == list(range(1 + read_ahead))
        assert consumer.buffered == read_ahead
        statistics = fanout.statistics()
        assert (statistics.pulled, statistics.pulling) == (1 + read_ahead, False)
    await fanout.aclose()


async def test_read_ahead_zero_pulls_on_demand_only() -> None:
    """``read_ahead=0``: nothing is pulled that no consumer asked for."""
    pulls: list[int] = []
    fanout = Fanout(ready(100, pulls), read_ahead=0)
    async with fanout.consumer() as consumer:
        assert await read(consumer, 3) == [0, 1, 2]
        await anyio.wait_all_tasks_blocked()
        assert pulls == [0, 1, 2]
        assert consumer.buffered == 0
    await fanout.aclose()


async def test_a_batch_is_read_without_suspending() -> None:
    """A consumer reads the items pulled ahead inline: ``receive_nowait``
    returns each of them without a pull."""
    fanout = Fanout(ready(100), read_ahead=8)
    async with fanout.consumer() as consumer:
        assert await read(consumer, 1) == [0]
        await anyio.wait_all_tasks_blocked()
        assert [consumer.receive_nowait() for _ in range(8)] == list(range(1, 9))
        with pytest.raises(anyio.WouldBlock):
            consumer.receive_nowait()
    await fanout.aclose()


async def test_the_most_advanced_consumer_sets_the_read_ahead() -> None:
    """Items count as read ahead once the most advanced consumer has read
    everything: a lagging consumer does not make the pump pull further."""
    pulls: list[int] = []
    fanout = Fanout(ready(100, pulls), read_ahead=4)
    ahead, behind = fanout.consumer(), fanout.consumer()
    # The first demand pulls item 0 and reads 1-4 ahead; `ahead` reads them
    # inline, then waits at the 6th: item 5 and 6-9 ahead.
    assert await read(ahead, 6) == [0, 1, 2, 3, 4, 5]
    await anyio.wait_all_tasks_blocked()
    assert len(pulls) == 10
    assert behind.buffered == 10
    assert await read(behind, 10) == list(range(10))
    await anyio.wait_all_tasks_blocked()
    assert len(pulls) == 10
    ahead.close()
    behind.close()
    await fanout.aclose()


async def test_no_consumer_no_read_ahead() -> None:
    """Once the last consumer has left, the pump starts no pull: the one
    in flight as it left completes, and nothing follows."""
    pulls: list[int] = []
    send, receive = anyio.create_memory_object_stream[int](100)

    async def source() -> AsyncIterator[int]:
        async with receive:
            async for item in receive:
                pulls.append(item)
                yield item

    fanout = Fanout(source(), read_ahead=16)
    consumer = fanout.consumer()
    send.send_nowait(0)
    assert await read(consumer, 1) == [0]
    consumer.close()
    for item in range(1, 10):
        send.send_nowait(item)
    await anyio.wait_all_tasks_blocked()
    assert pulls == [0, 1]
    send.close()
    await fanout.aclose()


async def test_every_step_of_a_batch_runs_in_the_pump_task() -> None:
    """Read-ahead pulls run in the pump's one task, as every pull does."""
    tasks: list[object] = []

    async def source() -> AsyncIterator[int]:
        for item in range(40):
            tasks.append(current_task())
            await anyio.lowlevel.checkpoint()
            tasks.append(current_task())
            yield item

    fanout = Fanout(source(), read_ahead=8)
    received: list[list[int]] = []

    async def consume() -> None:
        async with fanout.consumer() as consumer:
            received.append([item async for item in consumer])

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(consume)
    assert received == [list(range(40))] * 3
    assert len(tasks) == 80
    assert len({id(task) for task in tasks}) == 1
    await fanout.aclose()


@pytest.mark.parametrize("on_lag", ["wait", "error"])
async def test_read_ahead_never_takes_the_log_past_max_lag(on_lag: str) -> None:
    """The items read ahead count inside ``max_lag``: with a consumer that
    reads nothing, the pump stops at the bound (no :exc:`Lagged` is caused by
    reading ahead, no item beyond the bound is held)."""
    pulls: list[int] = []
    fanout = Fanout(
        ready(1000, pulls),
        max_lag=10,
        on_lag=on_lag,  # pyright: ignore[reportArgumentType]
        read_ahead=64,
    )
    stalled = fanout.consumer()
    reader = fanout.consumer()
    assert await read(reader, 1) == [0]
    await anyio.wait_all_tasks_blocked()
    assert len(pulls) <= 10
    assert fanout.statistics().buffered <= 10
    # The stalled consumer then reads everything held, from the first item.
    assert await read(stalled, len(pulls)) == pulls
    stalled.close()
    reader.close()
    await fanout.aclose()


async def test_a_stalled_consumer_holds_at_most_max_lag_items_while_others_read() -> (
    None
):
    """``on_lag="error"``: a fast reader with read-ahead keeps the log bounded
    at ``max_lag`` behind a stalled consumer, which then gets :exc:`Lagged`."""
    fanout = Fanout(ready(500), max_lag=16, on_lag="error", read_ahead=32)
    stalled = fanout.consumer()
    async with fanout.consumer() as reader:
        peak = 0
        async for _ in reader:
            peak = max(peak, fanout.statistics().buffered)
    assert peak <= 16
    with pytest.raises(Lagged):
        await anext(stalled)
    stalled.close()
    await fanout.aclose()


async def test_a_consumer_cancelled_mid_batch_loses_nothing() -> None:
    """Cancelling a consumer while the pump reads ahead (the source
    suspending between items) loses, repeats and reorders nothing."""
    release = anyio.Event()

    async def source() -> AsyncIterator[int]:
        for item in range(20):
            if item == 3:
                await release.wait()
            await anyio.lowlevel.checkpoint()
            yield item

    fanout = Fanout(source(), read_ahead=8)
    consumer = fanout.consumer()
    assert await read(consumer, 3) == [0, 1, 2]
    with anyio.CancelScope() as scope:
        scope.cancel()
        await anext(consumer)
    assert scope.cancelled_caught
    release.set()
    assert [item async for item in consumer] == list(range(3, 20))
    await fanout.aclose()


async def test_an_error_mid_batch_reaches_every_consumer_after_its_items() -> None:
    """A source that fails after part of a batch: every consumer gets the
    items pulled before the error, then the error."""

    async def source() -> AsyncIterator[int]:
        for item in range(5):
            yield item
        raise ValueError("source failed mid-batch")

    fanout = Fanout(source(), read_ahead=16)
    consumers = [fanout.consumer() for _ in range(3)]
    for consumer in consumers:
        received: list[int] = []
        with pytest.raises(ValueError, match="mid-batch"):
            await drain_into(consumer, received)
        assert received == [0, 1, 2, 3, 4]
    await fanout.aclose()


async def test_a_consumer_registered_mid_batch_starts_at_the_log_end() -> None:
    """A consumer registered after a batch was read ahead receives what is
    pulled after it registered, once, in order: no item of the batch and no
    gap."""
    fanout = Fanout(ready(30), read_ahead=8)
    first = fanout.consumer()
    assert await read(first, 1) == [0]
    await anyio.wait_all_tasks_blocked()
    late = fanout.consumer()
    assert [item async for item in late] == list(range(9, 30))
    assert [item async for item in first] == list(range(1, 30))
    await fanout.aclose()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8", None])
async def test_read_ahead_must_be_an_int_of_zero_or_more(bad: object) -> None:
    """A ``read_ahead`` that is not an int >= 0 is refused at construction."""
    with pytest.raises(ValueError, match="read_ahead must be an int >= 0"):
        Fanout(ready(1), read_ahead=bad)  # pyright: ignore[reportArgumentType]


# --- through @shared_subscription ----------------------------------------------

PULLS: list[int] = []


def worker(number: int) -> WorkerMetadata:
    return meta(uuid.UUID(int=number + 1))


@shared_subscription(read_ahead=4, max_lag=None)
class ReadyWorkers:
    """Twenty ``worker-added`` events, each ready at once."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        for number in range(20):
            PULLS.append(number)
            yield ev("worker-added", worker(number))
        await anyio.sleep_forever()


async def test_a_shared_subscription_reads_ahead_as_its_decorator_says() -> None:
    """``@shared_subscription(read_ahead=4)``: one demand pulls the event
    asked for and four more, in the entry's one iteration."""
    PULLS.clear()
    async with SubscriptionPool(), aiter(ReadyWorkers("a")) as consumer:
        await anext(consumer)
        await anyio.wait_all_tasks_blocked()
        assert PULLS == [0, 1, 2, 3, 4]


async def test_a_shared_subscription_consumer_reads_a_batch_without_suspending() -> (
    None
):
    """The events read ahead are handed out by the subscription's consumer
    inline, in order: each ``__anext__`` returns without suspending."""
    PULLS.clear()
    async with SubscriptionPool(), aiter(ReadyWorkers("b")) as consumer:
        first = await anext(consumer)
        assert first.metadata.uid == worker(0).uid
        await anyio.wait_all_tasks_blocked()
        for number in range(1, 5):
            step = consumer.__anext__()
            with pytest.raises(StopIteration) as returned:
                step.send(None)  # StopIteration: it returned at once
            assert returned.value.value.metadata.uid == worker(number).uid
        assert PULLS == [0, 1, 2, 3, 4]


async def test_a_late_joiner_after_a_batch_gets_a_replay_without_gap_or_duplicate() -> (
    None
):
    """A consumer joining while events read ahead wait unread by the first
    gets one ``worker-added`` per worker known (those read ahead included),
    then only the later events: every worker once."""
    PULLS.clear()
    async with SubscriptionPool(), aiter(ReadyWorkers("b")) as first:
        assert (await anext(first)).metadata == worker(0)
        await anyio.wait_all_tasks_blocked()
        async with aiter(ReadyWorkers("b")) as late:
            seen = [(await anext(late)).metadata for _ in range(20)]
        assert seen == [worker(number) for number in range(20)]
        rest = [(await anext(first)).metadata for _ in range(19)]
        assert rest == [worker(number) for number in range(1, 20)]


def churn(count: int) -> list[DiscoveryEvent]:
    """``count`` events over ten workers: each added, then updated or
    dropped (and later added back) in turn, so a diff has every kind."""
    events: list[DiscoveryEvent] = []
    known: dict[int, WorkerMetadata] = {}
    for step in range(count):
        number = step % 10
        if number not in known:
            known[number] = meta(uuid.UUID(int=number + 1), pid=step + 1)
            events.append(ev("worker-added", known[number]))
        elif (step // 10 + number) % 3 == 0:
            events.append(ev("worker-dropped", known.pop(number)))
        else:
            known[number] = meta(uuid.UUID(int=number + 1), pid=step + 1)
            events.append(ev("worker-updated", known[number]))
    return events


CHURN = churn(300)

View = dict[uuid.UUID, WorkerMetadata]


def apply(view: View, event: DiscoveryEvent) -> None:
    """Apply ``event`` to a consumer's view, checking it fits the view."""
    uid = event.metadata.uid
    if event.type == "worker-added":
        assert uid not in view
        view[uid] = event.metadata
    elif event.type == "worker-updated":
        assert uid in view
        assert view[uid] != event.metadata
        view[uid] = event.metadata
    else:
        assert view.pop(uid) == event.metadata


def diff_size(seen: View, current: View) -> int:
    """How many events the resync from ``seen`` to ``current`` holds."""
    changed = sum(1 for uid, md in current.items() if seen.get(uid) != md)
    return changed + sum(1 for uid in seen if uid not in current)


@shared_subscription(max_lag=8)  # the default read-ahead, inside max_lag
class ChurningWorkers:
    """:data:`CHURN`, each event ready at once; then nothing more."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        for event in CHURN:
            yield event
        await anyio.sleep_forever()


async def test_a_stalled_consumer_is_resynced_exactly_with_the_default_read_ahead() -> (
    None
):
    """With the default read-ahead, a consumer that falls more than
    ``max_lag`` behind gets the diff to the current workers, then the live
    stream; the first consumer gets every event once, in order."""
    final: View = {}
    for event in CHURN:
        apply(final, event)
    fast_view: View = {}
    slow_view: View = {}
    with anyio.fail_after(10):
        async with SubscriptionPool():
            fast, slow = aiter(ChurningWorkers("c")), aiter(ChurningWorkers("c"))
            fast_events = [await anext(fast)]  # pulls a batch, inside max_lag
            await anyio.wait_all_tasks_blocked()
            # The batch stopped at max_lag: eight events, all adds, which the
            # late joiner receives as its replay.
            replay = [await anext(slow) for _ in range(8)]
            assert pairs(replay) == pairs(CHURN[:8])
            for event in replay:
                apply(slow_view, event)
            fast_events += [await anext(fast) for _ in range(len(CHURN) - 1)]
            for event in fast_events:
                apply(fast_view, event)
            assert pairs(fast_events) == pairs(CHURN)
            assert fast_view == final
            for _ in range(diff_size(slow_view, final)):
                apply(slow_view, await anext(slow))
            assert slow_view == final
            await slow.aclose()
            await fast.aclose()


async def test_the_decorator_refuses_a_bad_read_ahead() -> None:
    """``read_ahead`` is checked when the class is decorated."""
    with pytest.raises(ValueError, match="read_ahead must be an int >= 0"):
        shared_subscription(read_ahead=-1)


async def checkpointing(count: int) -> AsyncIterator[int]:
    """``count`` items, each after one checkpoint (each pull suspends once)."""
    for item in range(count):
        await anyio.lowlevel.checkpoint()
        yield item


async def test_consumers_of_a_checkpointing_source_are_woken_once_per_batch() -> None:
    """A source whose pulls only pass a checkpoint wakes its waiting consumers
    once per batch of ``read_ahead`` items, not once per item: each wait of a
    consumer ends with about a batch to read inline."""
    count, read_ahead, n = 320, 16, 3
    fanout = Fanout(checkpointing(count), read_ahead=read_ahead)
    consumers = [fanout.consumer() for _ in range(n)]
    waits = [0] * n
    received: list[list[int]] = [[] for _ in range(n)]

    async def run(index: int) -> None:
        consumer = consumers[index]
        while True:
            if consumer.buffered == 0:
                waits[index] += 1  # this __anext__ waits for the pump
            try:
                received[index].append(await anext(consumer))
            except StopAsyncIteration:
                return

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for index in range(n):
                group.start_soon(run, index)
    assert received == [list(range(count))] * n
    # Woken per item, each consumer would wait ~320 times.
    assert max(waits) <= 2 * count // read_ahead + 4, waits
    await fanout.aclose()


@pytest.mark.parametrize("source_kind", ["polls", "waits"])
async def test_items_logged_before_the_source_stalls_reach_a_waiting_consumer(
    source_kind: str,
) -> None:
    """A source that logs a few items and then stalls, by polling a flag at
    every pass or by waiting on an event, does not hold back the items it
    logged: the consumer waiting gets them while it stalls (the flag is set
    only once the consumer has them)."""
    go_on = anyio.Event()

    async def source() -> AsyncIterator[int]:
        for item in range(3):
            await anyio.lowlevel.checkpoint()
            yield item
        if source_kind == "polls":
            while not go_on.is_set():
                await anyio.lowlevel.checkpoint()
        else:
            await go_on.wait()
        yield 3

    fanout = Fanout(source(), read_ahead=64)
    received: list[int] = []
    with anyio.fail_after(10):
        async with fanout.consumer() as consumer:
            while len(received) < 3:
                received.append(await anext(consumer))
            go_on.set()
            received.append(await anext(consumer))
    assert received == [0, 1, 2, 3]
    await fanout.aclose()


@pytest.mark.parametrize("burst", [1, 5, 40])
async def test_items_reach_every_consumer_before_all_tasks_block(burst: int) -> None:
    """However the wake-ups of a batch are held back, a consumer has every
    item logged once ``wait_all_tasks_blocked()`` returns: the hold is a task,
    never a pending callback (bursts smaller and larger than the read-ahead)."""
    send, receive = anyio.create_memory_object_stream[int](100)
    n, rounds = 3, 8

    async def source() -> AsyncIterator[int]:
        async with receive:
            async for item in receive:
                await anyio.lowlevel.checkpoint()
                yield item

    fanout = Fanout(source(), read_ahead=16)
    consumers = [fanout.consumer() for _ in range(n)]
    received: list[list[int]] = [[] for _ in range(n)]
    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            for index in range(n):
                group.start_soon(drain_into, consumers[index], received[index])
            sent: list[int] = []
            for round_ in range(rounds):
                for item in range(round_ * burst, (round_ + 1) * burst):
                    send.send_nowait(item)
                    sent.append(item)
                await anyio.wait_all_tasks_blocked()
                assert received == [sent] * n, round_
            send.close()
    await fanout.aclose()
