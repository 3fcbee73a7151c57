"""Cancelling a fan-out consumer abandons only its own wait, promptly.

Whether the consumer is cancelled while it waits, while the pump runs the pull
its call asked for, by a cancellation that pull itself requests, by its own
deadline, or at random among many: the pull goes on in the pump, the source is
never cancelled or closed by it, and the consumer's next read returns the item
it would have got, losing, repeating and reordering nothing.
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _loops import asyncio_only
from _stubs import TIMEOUT
from _stubs import Feed
from _stubs import PollGaveUp
from _stubs import Probe
from _stubs import PullTasks
from _stubs import checkpoints
from _stubs import current_task
from _stubs import drain
from _stubs import loop_take
from _stubs import poll
from _stubs import settle
from _stubs import take
from _stubs import uvloop_too
from _stubs import wait_until_waiting

from wool_pooling import Fanout

pytestmark = pytest.mark.anyio

#: Checkpoints per pull in the multi-step sources below.
K = 3

_MISSING: Any = object()


# --- one consumer cancelled while it waits -------------------------------------


async def test_cancelling_the_pulling_consumer_mid_pull(probe: Probe) -> None:
    """Cancelling the consumer whose wait started the pull is prompt, loses nothing."""
    fanout = Fanout(probe, read_ahead=0)  # counts the pulls
    a, b = fanout.consumer(), fanout.consumer()
    a_scope = anyio.CancelScope()
    a_done = anyio.Event()
    b_items: list[int] = []

    async def run_a() -> None:
        with a_scope:
            await anext(a)
        a_done.set()

    async def run_b() -> None:
        b_items.append(await anext(b))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_a)
            await settle()
            assert probe.active == 1  # A's wait started the pull; the source blocks
            tg.start_soon(run_b)
            await settle()
            assert fanout.statistics().waiting == 2

            a_scope.cancel()
            await a_done.wait()
            # A is done while the source is still blocked: nothing was produced.
            assert a_scope.cancelled_caught
            assert probe.active == 1
            assert fanout.statistics().pulled == 0
            assert fanout.statistics().pulling is True
            assert fanout.statistics().consumers == 2
            assert fanout.statistics().waiting == 1  # A's wait was withdrawn
            assert b_items == []

            probe.feed(0)
        assert b_items == [0]
        assert await anext(a) == 0  # the item A would have received
        assert probe.finally_runs == 0  # the source was never closed
        probe.feed(1, 2)
        assert await take(a, 2) == [1, 2]
        assert await take(b, 2) == [1, 2]
    assert probe.pulls == 3
    assert probe.max_active == 1
    await fanout.aclose()


async def test_cancelling_one_consumer_at_any_point_leaves_the_others_intact() -> None:
    """Cancel one of five consumers after k items, for every k: the others get all."""
    n_items, n_consumers = 8, 5
    for k in range(n_items + 1):
        with Probe() as probe:
            fanout = Fanout(probe)
            consumers = [fanout.consumer() for _ in range(n_consumers)]
            received: list[list[int]] = [[] for _ in consumers]
            scopes = [anyio.CancelScope() for _ in consumers]
            victim = k % n_consumers

            async def run(i: int) -> None:
                with scopes[i]:  # noqa: B023 - the task group ends within the loop body
                    async for item in consumers[i]:  # noqa: B023
                        received[i].append(item)  # noqa: B023

            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    for i in range(n_consumers):
                        tg.start_soon(run, i)
                    probe.feed(*range(k))
                    await settle()
                    # Everyone has k items and waits for item k, a pull in flight.
                    assert fanout.statistics().waiting == n_consumers
                    assert probe.active == 1
                    scopes[victim].cancel()
                    await settle()
                    assert probe.active == 1  # the pull survived the cancellation
                    assert fanout.statistics().waiting == n_consumers - 1
                    probe.feed(*range(k, n_items))
                    probe.end()
                for i in range(n_consumers):
                    if i != victim:
                        assert received[i] == list(range(n_items)), (k, i)
                assert received[victim] == list(range(k)), k
                rest = await drain(consumers[victim])
            assert received[victim] + rest == list(range(n_items)), k
            assert probe.aiter_calls == 1
            assert probe.finally_runs == 1  # ended by exhaustion, once
            assert probe.max_active == 1
            assert fanout.statistics().buffered == 0


async def test_cancelled_anext_loses_nothing_for_that_consumer(probe: Probe) -> None:
    """After a cancelled wait the consumer stays registered and gets the next item."""
    fanout = Fanout(probe)
    consumer = fanout.consumer()
    for _ in range(3):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anext, consumer)
                await settle()
                scope.cancel()
        assert scope.cancelled_caught
        assert fanout.statistics().consumers == 1
        assert fanout.statistics().pulled == 0
        assert probe.pulls == 1  # one pull stays in flight, whoever waits
    probe.feed(0, 1)
    with anyio.fail_after(5):
        assert await take(consumer, 2) == [0, 1]
    assert probe.max_active == 1
    await fanout.aclose()


# --- cancelled during the pull its call asked for ------------------------------

N_ITEMS = 6


TARGET = 3


@pytest.mark.parametrize(
    ("cancel_at", "cancelled_before_the_call"),
    [(0, False), (1, False), (2, False), (0, True)],
    ids=["at-checkpoint-0", "at-checkpoint-1", "at-checkpoint-2", "before-the-call"],
)
@uvloop_too
async def test_cancelling_the_consumer_that_started_a_multi_step_pull_loses_nothing(
    cancel_at: int, cancelled_before_the_call: bool
) -> None:
    """Cancelling the consumer whose call started a polling pull loses nothing."""
    # Cancelled at checkpoint ``cancel_at`` of the pull (or before the call): its
    # next anext returns that pull's item, the others get every item once, and the
    # source never sees the cancellation nor is closed before it is exhausted.
    reached, go, finalized = anyio.Event(), anyio.Event(), anyio.Event()
    through_source: list[BaseException] = []
    pull_tasks = PullTasks()

    async def source() -> AsyncIterator[int]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            for number in range(N_ITEMS):
                pull_tasks.begin()
                for step in range(K):
                    if number == TARGET and step == cancel_at:
                        reached.set()
                        while not go.is_set():  # the busy pull the victim started
                            await poll(give_up_at)
                    else:
                        await anyio.lowlevel.checkpoint()
                    pull_tasks.step()
                yield number
            pull_tasks.begin()
        except BaseException as error:
            through_source.append(error)
            raise
        finally:
            finalized.set()

    fanout = Fanout(source(), read_ahead=0)  # the victim's call starts each pull
    victim = fanout.consumer()
    others = [fanout.consumer() for _ in range(3)]
    victim_items: list[int] = []
    other_items: list[list[int]] = [[] for _ in others]
    victim_scope = anyio.CancelScope()
    victim_out = anyio.Event()
    cancelled_outcome: dict[str, object] = {}
    consumer_tasks: list[object] = []

    async def run_victim() -> None:
        consumer_tasks.append(current_task())
        while len(victim_items) < TARGET:  # it starts these pulls alone
            victim_items.append(await anext(victim))
        item = _MISSING
        with victim_scope:
            if cancelled_before_the_call:
                victim_scope.cancel()
            item = await anext(victim)  # starts pull TARGET
        cancelled_outcome["item"] = item
        cancelled_outcome["cancelled"] = victim_scope.cancelled_caught
        cancelled_outcome["source finalized"] = finalized.is_set()
        victim_out.set()
        async for item in victim:
            victim_items.append(item)

    async def run_other(index: int) -> None:
        consumer_tasks.append(current_task())
        async for item in others[index]:
            other_items[index].append(item)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_victim)
            await reached.wait()
            if not cancelled_before_the_call:
                # The victim waits for the pull it started, polling right now.
                stats = fanout.statistics()
                assert (stats.pulling, stats.waiting, stats.pulled) == (
                    True,
                    1,
                    TARGET,
                )
                victim_scope.cancel()
            for index in range(len(others)):
                tg.start_soon(run_other, index)
            await victim_out.wait()
            assert cancelled_outcome == {
                "item": _MISSING,
                "cancelled": True,
                "source finalized": False,
            }
            assert fanout.statistics().pulling  # the pull goes on
            # The others and the re-asking victim all wait for the same item.
            await wait_until_waiting(fanout, len(others) + 1)
            assert fanout.statistics().pulled == TARGET
            assert not finalized.is_set()
            go.set()
    assert victim_items == list(range(N_ITEMS))
    assert other_items == [list(range(N_ITEMS))] * len(others)
    assert through_source == []
    assert finalized.is_set()  # by exhaustion
    statistics = fanout.statistics()
    assert (statistics.consumers, statistics.buffered, statistics.pulling) == (
        0,
        0,
        False,
    )
    assert statistics.pulled == N_ITEMS
    pull_tasks.check(consumer_tasks, pulls=N_ITEMS + 1)


@pytest.mark.parametrize(
    "suspends", [False, True], ids=["pull-completes-at-once", "pull-then-suspends"]
)
@uvloop_too
async def test_a_consumer_cancelled_by_the_pull_its_call_started_loses_nothing(
    suspends: bool,
) -> None:
    """A pull cancelling its starter's scope cancels that very call; nothing lost."""
    # Before the pull first suspends, so on asyncio 3.12+ inside the consumer's own
    # call: the cancellation is raised there, within the scope, never at a later
    # await; the next anext returns the item.
    victim_scope = anyio.CancelScope()
    through_source: list[BaseException] = []

    async def source() -> AsyncIterator[int]:
        try:
            yield 0
            victim_scope.cancel()
            if suspends:
                await checkpoints(K)
            yield 1
            await checkpoints(K)
            yield 2
        except BaseException as error:
            through_source.append(error)
            raise

    fanout = Fanout(source(), read_ahead=0)  # the victim's call starts each pull
    victim, other = fanout.consumer(), fanout.consumer()
    outcome: dict[str, object] = {}
    items: list[int] = []
    stray: list[str] = []
    with anyio.fail_after(TIMEOUT):
        items.append(await anext(victim))
        item = _MISSING
        with victim_scope:
            item = await anext(victim)  # starts the pull that cancels it
        outcome["item"] = item
        outcome["cancelled"] = victim_scope.cancelled_caught
        try:
            await checkpoints(K)  # a stray cancellation lands here
        except anyio.get_cancelled_exc_class():
            stray.append("victim")
        items += [item async for item in victim]
        assert [item async for item in other] == [0, 1, 2]
    assert outcome == {"item": _MISSING, "cancelled": True}
    assert stray == []
    assert items == [0, 1, 2]
    assert through_source == []
    assert fanout.statistics().pulled == 3


@uvloop_too
async def test_a_consumer_timeout_during_a_multi_step_pull_abandons_only_its_wait() -> (
    None
):
    """A consumer's deadline expiring mid-pull abandons its wait only, not the pull."""
    # The deadline is armed by the pull itself after K polls, so it expires while
    # the pull polls on; the consumer's demand is withdrawn; its next anext returns
    # the item.
    go = anyio.Event()
    through_source: list[BaseException] = []
    pull_tasks = PullTasks()
    consumer_scope = anyio.CancelScope()

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            pull_tasks.begin()
            yield "warm-up"
            pull_tasks.begin()
            polls = 0
            while not go.is_set():
                await poll(give_up_at)
                pull_tasks.step()
                polls += 1
                if polls == K:  # the consumer's deadline: soon, mid-pull
                    consumer_scope.deadline = anyio.current_time() + 0.01
            yield "polled"
            pull_tasks.begin()
            await checkpoints(K)
            pull_tasks.step()
            yield "next"
            pull_tasks.begin()
        except BaseException as error:
            through_source.append(error)
            raise

    fanout = Fanout(source())
    consumer, other = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == "warm-up"
        assert await anext(other) == "warm-up"
        with consumer_scope:
            await anext(consumer)  # starts the busy pull, waits until its deadline
        assert consumer_scope.cancelled_caught
        assert len(pull_tasks.pulls[1]) > K  # the pull polled on
        stats = fanout.statistics()
        assert (stats.pulling, stats.waiting, stats.pulled) == (True, 0, 1)
        go.set()
        assert await anext(consumer) == "polled"
        assert await anext(other) == "polled"
        assert await anext(other) == "next"
        assert await anext(consumer) == "next"
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)
        with pytest.raises(StopAsyncIteration):
            await anext(other)
    assert through_source == []
    pull_tasks.check([current_task()], pulls=4)


@pytest.mark.parametrize("cancel_at", range(9))
@uvloop_too
async def test_cancelling_at_any_pull_of_a_mixed_source_loses_nothing(
    cancel_at: int,
) -> None:
    """With pulls that sometimes suspend, cancelling the puller loses nothing."""
    send, receive = anyio.create_memory_object_stream[int](100)
    closed = anyio.Event()

    async def source() -> AsyncIterator[int]:
        try:
            for number in range(12):
                if number % 2:
                    await receive.receive()  # suspends until fed
                elif number % 4:
                    await anyio.lowlevel.checkpoint()  # suspends briefly
                yield number  # (multiples of 4 come back without suspending)
        finally:
            closed.set()

    fanout = Fanout(source())
    victim = fanout.consumer()
    others = [fanout.consumer() for _ in range(3)]
    victim_items: list[int] = []
    other_items: list[list[int]] = [[] for _ in others]

    async def run_victim() -> None:
        while len(victim_items) < cancel_at:
            victim_items.append(await anext(victim))
        with anyio.CancelScope() as scope:
            scope.cancel()
            # Cancelled wherever it would wait; an item it returns is kept.
            victim_items.append(await anext(victim))
        async for item in victim:
            victim_items.append(item)

    async def run_other(index: int) -> None:
        async for item in others[index]:
            other_items[index].append(item)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_victim)
            for index in range(len(others)):
                tg.start_soon(run_other, index)
            for _ in range(6):
                await anyio.wait_all_tasks_blocked()
                await send.send(0)
    assert victim_items == list(range(12))
    assert other_items == [list(range(12))] * 3
    assert closed.is_set()  # ended by exhaustion, never closed early
    assert fanout.statistics().buffered == 0


# --- async for loops -----------------------------------------------------------


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

    fanout = Fanout(source(), read_ahead=0)  # the victim starts every pull
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


# --- many consumers, random cancellations --------------------------------------

MANY = 50


ITEMS = 300


GATE_EVERY = 100


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@uvloop_too
async def test_random_cancellations_of_many_consumers_lose_nothing(seed: int) -> None:
    """Random cancellations of many consumers lose, repeat and reorder nothing."""
    # Cancelled before the call, by other consumers at random moments, or by a
    # controller while everyone waits for a parked pull.
    send, receive = anyio.create_memory_object_stream[None](math.inf)
    through_source: list[BaseException] = []
    finalized = anyio.Event()
    pull_tasks = PullTasks()
    fanout: Fanout[int] | None = None

    async def source() -> AsyncIterator[int]:
        try:
            for number in range(ITEMS):
                pull_tasks.begin()
                for _ in range(K):
                    await anyio.lowlevel.checkpoint()
                    pull_tasks.step()
                if number % GATE_EVERY == GATE_EVERY - 1:
                    await receive.receive()  # everyone blocks: the controller acts
                    pull_tasks.step()
                yield number
            pull_tasks.begin()
        except BaseException as error:
            through_source.append(error)
            raise
        finally:
            finalized.set()

    fanout = Fanout(source())
    consumers = [fanout.consumer() for _ in range(MANY)]
    received: list[list[int]] = [[] for _ in range(MANY)]
    scopes: list[anyio.CancelScope | None] = [None] * MANY
    # Cancellations of a consumer's pending call, and those made mid-pull.
    cancellations = [0, 0]
    controller_rng = random.Random(seed)
    consumer_tasks: list[object] = []

    def cancel_some(rng: random.Random, count: int) -> None:
        assert fanout is not None
        for _ in range(count):
            scope = scopes[rng.randrange(MANY)]
            if scope is not None and not scope.cancel_called:
                scope.cancel()
                cancellations[0] += 1
                cancellations[1] += fanout.statistics().pulling

    async def consume(index: int) -> None:
        consumer_tasks.append(current_task())
        rng = random.Random(seed * 1000 + index)
        consumer = consumers[index]
        items = received[index]
        while True:
            item = _MISSING
            ended = False
            with anyio.CancelScope() as scope:
                if rng.random() < 0.1:
                    scope.cancel()
                scopes[index] = scope
                try:
                    item = await anext(consumer)
                except StopAsyncIteration:
                    ended = True
            scopes[index] = None
            if ended:
                return
            if item is not _MISSING:
                items.append(item)
            if rng.random() < 0.2:
                await checkpoints(rng.randrange(K + 1))
                cancel_some(rng, 1)

    async def controller() -> None:
        while True:
            await anyio.wait_all_tasks_blocked()
            cancel_some(controller_rng, MANY // 5)
            await send.send(None)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as outer:
            outer.start_soon(controller)
            async with anyio.create_task_group() as tg:
                for index in range(MANY):
                    tg.start_soon(consume, index)
            outer.cancel_scope.cancel()
    bad = [index for index in range(MANY) if received[index] != list(range(ITEMS))]
    assert bad == []
    assert through_source == []
    assert finalized.is_set()
    assert cancellations[1] > 0  # some consumers were cancelled mid-pull
    pull_tasks.check(consumer_tasks, pulls=ITEMS + 1)
    statistics = fanout.statistics()
    assert (statistics.consumers, statistics.buffered, statistics.pulling) == (
        0,
        0,
        False,
    )
    assert statistics.pulled == ITEMS


@asyncio_only
async def test_a_watch_cancelled_from_outside_still_wakes_the_consumers() -> None:
    """The task that holds a batch's wake-up back (the read-ahead watch) may
    be cancelled from outside, as asyncio does to every task when a loop
    shuts down: the consumers waiting are woken all the same, and a later
    batch is delivered too."""
    import asyncio

    more = anyio.Event()

    async def source() -> AsyncIterator[int]:
        for item in range(10):
            await anyio.lowlevel.checkpoint()
            yield item
        await more.wait()
        yield 10
        await anyio.sleep_forever()

    def awaits(task: asyncio.Task[Any]) -> list[str]:
        """The names of the coroutines ``task`` is suspended in, outermost first."""
        names: list[str] = []
        awaited: Any = task.get_coro()
        while awaited is not None and hasattr(awaited, "cr_code"):
            names.append(awaited.cr_code.co_name)
            awaited = awaited.cr_await
        return names

    def watches() -> list[asyncio.Task[Any]]:
        return [
            task for task in asyncio.all_tasks() if "_release_when_idle" in awaits(task)
        ]

    fanout = Fanout(source(), read_ahead=64)
    consumer = fanout.consumer()
    received: list[int] = []

    async def read() -> None:
        async for item in consumer:
            received.append(item)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(read)
            while not (found := watches()):
                await anyio.lowlevel.checkpoint()
            for task in found:
                task.cancel()
            # The source now waits: only the cancelled watch could wake the
            # consumer for the items logged so far.
            while len(received) < 10:
                await anyio.lowlevel.checkpoint()
            assert received == list(range(10))
            more.set()
            while len(received) < 11:
                await anyio.lowlevel.checkpoint()
            assert received == list(range(11))
            group.cancel_scope.cancel()
    await fanout.aclose()
