"""One task per fan-out, the pump, runs every step of every pull.

The pump calls ``aiter()`` on the source, every ``__anext__()`` and its
``aclose()`` (an eager task factory may run the pump's first step inside the
consumer's call that started it, but as the pump's task). These tests pin what
that guarantees for sources that suspend several times per pull, or poll
busily: every step runs in that one task, never a consumer's; all pulls share
one context and leave the consumers' own alone; a deadline or cancel scope the
source enters fires for the source only, even when the consumer that asked
is cancelled; a source error after several checkpoints reaches everyone.

The task running each step is checked with ``asyncio.current_task()`` or
``trio.lowlevel.current_task()``; the task objects are kept, so identity
comparisons are sound. Every test here runs on uvloop too.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest
from _stubs import TIMEOUT
from _stubs import PullTasks
from _stubs import checkpoints
from _stubs import current_task
from _stubs import poll
from _stubs import uvloop_too
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer

pytestmark = [pytest.mark.anyio, uvloop_too]

#: Checkpoints per pull in the multi-step sources below.
K = 3


# --- one task, one context -----------------------------------------------------


@pytest.mark.parametrize(
    "gated", [False, True], ids=["checkpoints-only", "then-a-task-bound-wait"]
)
async def test_every_step_of_every_pull_runs_in_the_pump_never_in_a_consumer(
    gated: bool,
) -> None:
    """Each pull runs all its steps in one task, the pump, never a consumer's."""
    # Checked before and after each checkpoint, and after a task-bound wait (gated).
    send, receive = anyio.create_memory_object_stream[int](math.inf)
    pull_tasks = PullTasks()

    async def source() -> AsyncIterator[int]:
        for number in range(16):
            pull_tasks.begin()
            for _ in range(K):
                await anyio.lowlevel.checkpoint()
                pull_tasks.step()
            if gated and number % 4 == 3:
                await receive.receive()  # parks the pump
                pull_tasks.step()
            yield number
        pull_tasks.begin()  # the pull that finds the source exhausted

    fanout = Fanout(source())
    consumer_tasks: list[object] = [current_task()]
    received: dict[int, list[int]] = {}

    async def consume(index: int, consumer: FanoutConsumer[int]) -> None:
        consumer_tasks.append(current_task())
        received[index] = [item async for item in consumer]

    with anyio.fail_after(TIMEOUT):
        consumers = [fanout.consumer() for _ in range(3)]
        async with anyio.create_task_group() as tg:
            for index, consumer in enumerate(consumers):
                tg.start_soon(consume, index, consumer)
            for _ in range(4 if gated else 0):
                await anyio.wait_all_tasks_blocked()
                assert fanout.statistics().waiting == 3
                await send.send(0)
    assert received == {index: list(range(16)) for index in range(3)}
    assert len(consumer_tasks) == 4
    pull_tasks.check(consumer_tasks, pulls=17)
    await fanout.aclose()


async def test_whichever_consumer_asks_the_source_runs_in_no_consumers_task() -> None:
    """Whichever consumer asked, the source's code runs in a task that is no
    consumer's, one pull at a time."""
    send, receive = anyio.create_memory_object_stream[int](100)
    seen_tasks: list[int] = []
    active = [0, 0]  # pulls in progress now, most ever

    async def source() -> AsyncIterator[int]:
        number = 0
        while True:
            active[0] += 1
            active[1] = max(active)
            seen_tasks.append(anyio.get_current_task().id)
            if number % 3 == 0:
                await receive.receive()  # every third pull suspends
            seen_tasks.append(anyio.get_current_task().id)
            active[0] -= 1
            yield number
            number += 1

    fanout = Fanout(source())
    consumer_tasks: set[int] = set()
    received: dict[str, list[int]] = {"a": [], "b": []}
    alive: list[object] = []  # keeps consumer tasks' ids from being reused

    async def consume(name: str) -> None:
        alive.append(anyio.get_current_task())
        consumer_tasks.add(anyio.get_current_task().id)
        consumer = fanout.consumer()
        while len(received[name]) < 12:
            received[name].append(await anext(consumer))

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, "a")
            tg.start_soon(consume, "b")
            for _ in range(4):
                await anyio.wait_all_tasks_blocked()
                await send.send(0)
    assert received["a"] == received["b"] == list(range(12))
    assert len(seen_tasks) >= 24
    assert not set(seen_tasks) & consumer_tasks
    assert active[1] == 1
    await fanout.aclose()


async def test_pulls_that_suspend_share_one_context_and_leave_the_consumers_alone() -> (
    None
):
    """All pulls run in one context; the consumers' own context values stay theirs."""
    var: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar(
        "var", default=("unset", 0)
    )
    observations: list[tuple[tuple[str, int], tuple[str, int]]] = []

    async def source() -> AsyncIterator[int]:
        mark = 0
        var.set(("source", mark))
        for number in range(12):
            for _ in range(K):
                observations.append((("source", mark), var.get()))
                mark += 1
                var.set(("source", mark))
                await anyio.lowlevel.checkpoint()
                observations.append((("source", mark), var.get()))
            yield number

    fanout = Fanout(source())
    consumer_views: dict[int, list[tuple[str, int]]] = {}
    received: dict[int, list[int]] = {}

    async def consume(index: int, consumer: FanoutConsumer[int]) -> None:
        var.set(("consumer", index))
        views = consumer_views[index] = []
        items = received[index] = []
        async for item in consumer:
            items.append(item)
            views.append(var.get())

    with anyio.fail_after(TIMEOUT):
        consumers = [fanout.consumer() for _ in range(3)]
        async with anyio.create_task_group() as tg:
            for index, consumer in enumerate(consumers):
                tg.start_soon(consume, index, consumer)
    assert received == {index: list(range(12)) for index in range(3)}
    assert len(observations) == 12 * K * 2
    mismatches = [(want, got) for want, got in observations if want != got]
    assert mismatches == []
    for index in range(3):
        assert consumer_views[index] == [("consumer", index)] * 12
    assert var.get() == ("unset", 0)
    await fanout.aclose()


async def test_pulls_share_one_context() -> None:
    """A context variable the source sets in one pull is visible in the next."""
    var: contextvars.ContextVar[int] = contextvars.ContextVar("pulls", default=0)
    send, receive = anyio.create_memory_object_stream[int](100)

    async def source() -> AsyncIterator[int]:
        while True:
            var.set(var.get() + 1)
            if var.get() % 2 == 0:
                await receive.receive()
            yield var.get()

    fanout = Fanout(source())
    consumer = fanout.consumer()
    values: list[int] = []
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:

            async def feed() -> None:
                for _ in range(5):
                    await send.send(0)

            tg.start_soon(feed)
            for _ in range(10):
                values.append(await anext(consumer))
    assert values == list(range(1, 11))
    assert var.get() == 0  # the consumer's own context was never touched
    await fanout.aclose()


# --- the source's own deadlines and cancel scopes ------------------------------


async def timed_source(
    receive: MemoryObjectReceiveStream[str], delay: float
) -> AsyncIterator[str]:
    """Each pull waits for an item, giving up after ``delay`` seconds."""
    while True:
        value = "timeout"
        with anyio.move_on_after(delay):
            value = await receive.receive()
        yield value


async def test_timeout_inside_a_pull_survives_cancelling_the_consumer() -> None:
    """A timeout entered by a pull fires for the pull, not the cancelled consumer."""
    send, receive = anyio.create_memory_object_stream[str](10)
    fanout = Fanout(timed_source(receive, 0.2))
    first, second = fanout.consumer(), fanout.consumer()
    # Start the pump first: the cancelled consumer's demand finds it running.
    await send.send("warm-up")
    with anyio.fail_after(TIMEOUT):
        assert await anext(first) == "warm-up"
        assert await anext(second) == "warm-up"
    finish = anyio.Event()
    outcome: dict[str, object] = {}

    async def consumer_task(*, task_status: TaskStatus[anyio.CancelScope]) -> None:
        with anyio.CancelScope() as scope:
            task_status.started(scope)
            outcome["first"] = await anext(first)
        outcome["cancelled"] = scope.cancelled_caught
        try:
            await finish.wait()  # a stray cancellation would land here
        except anyio.get_cancelled_exc_class():
            outcome["stray cancellation"] = True
            raise

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            scope = await tg.start(consumer_task)
            await anyio.wait_all_tasks_blocked()
            assert fanout.statistics().pulling
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert outcome == {"cancelled": True}
            assert await anext(second) == "timeout"
            finish.set()
    assert "stray cancellation" not in outcome
    await send.send("after")
    with anyio.fail_after(TIMEOUT):
        assert await anext(first) == "timeout"  # nothing lost for the cancelled one
        assert await anext(first) == "after"
        assert await anext(second) == "after"
    await fanout.aclose()


async def test_expired_deadline_inside_a_pull_is_honoured() -> None:
    """A pull whose cancel scope is already expired when it suspends still times out."""
    send, receive = anyio.create_memory_object_stream[str](10)
    fanout = Fanout(timed_source(receive, 0))
    consumer = fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        for _ in range(5):
            assert await anext(consumer) == "timeout"
    await send.send("value")
    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) in {"value", "timeout"}
    await fanout.aclose()
    send.close()


async def test_a_timeout_across_checkpoints_in_a_pull_fires_for_that_pull_only() -> (
    None
):
    """A deadline the source sets across a pull's checkpoints fires for it alone."""
    # The source gets its marker, no consumer gets a stray cancellation, every
    # step stays in the pump, and later pulls work.
    pull_tasks = PullTasks()

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        pull_tasks.begin()
        yield "warm-up"
        for round_ in range(2):
            pull_tasks.begin()
            with anyio.CancelScope() as scope:
                polls = 0
                while True:  # left only by the deadline
                    await poll(give_up_at)
                    pull_tasks.step()
                    polls += 1
                    if polls == K:  # a deadline across the next checkpoints
                        scope.deadline = anyio.current_time() + 0.01
            pull_tasks.step()
            yield f"timed out {round_}" if scope.cancelled_caught else "not timed out"
            pull_tasks.begin()
            await checkpoints(K)
            pull_tasks.step()
            yield f"after {round_}"

    fanout = Fanout(source())
    names = ("a", "b")
    consumers = {name: fanout.consumer() for name in names}
    got: dict[str, list[str]] = {name: [] for name in names}
    arrived = {(name, r): anyio.Event() for name in names for r in range(2)}
    resume = [anyio.Event(), anyio.Event()]
    stray: list[str] = []
    consumer_tasks: list[object] = []

    async def consume(name: str) -> None:
        consumer_tasks.append(current_task())
        consumer = consumers[name]
        try:
            got[name].append(await anext(consumer))
            for round_ in range(2):
                got[name].append(await anext(consumer))
                arrived[name, round_].set()
                await resume[round_].wait()  # a stray cancellation lands here
                got[name].append(await anext(consumer))
        except anyio.get_cancelled_exc_class():
            stray.append(name)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(consume, name)
            for round_ in range(2):
                for name in names:
                    await arrived[name, round_].wait()
                await anyio.wait_all_tasks_blocked()
                resume[round_].set()
    assert stray == []
    expected = ["warm-up", "timed out 0", "after 0", "timed out 1", "after 1"]
    assert got == {name: expected for name in names}
    assert len(pull_tasks.pulls[1]) > K + 1  # polled on until the deadline
    pull_tasks.check(consumer_tasks, pulls=5)
    await fanout.aclose()


async def test_a_pull_polling_until_its_own_deadline_times_out_in_the_pump_only() -> (
    None
):
    """A pull polling until its own deadline times out in the pump only."""
    # The cancellation is normally delivered at a checkpoint ("timed out"); on
    # trio the source may notice the expired deadline first ("deadline seen").
    pull_tasks = PullTasks()

    async def source() -> AsyncIterator[tuple[str, int]]:
        give_up_at = anyio.current_time() + TIMEOUT
        pull_tasks.begin()
        yield ("warm-up", 0)
        for round_ in range(4):
            pull_tasks.begin()
            with anyio.CancelScope() as scope:
                polls = 0
                while not scope.cancel_called:
                    await poll(give_up_at)
                    pull_tasks.step()
                    polls += 1
                    if polls == K:  # the deadline expires while it polls on
                        scope.deadline = anyio.current_time() + 0.01
            pull_tasks.step()
            yield ("timed out" if scope.cancelled_caught else "deadline seen", round_)
            pull_tasks.begin()
            await checkpoints(K)
            pull_tasks.step()
            yield ("after", round_)

    fanout = Fanout(source())
    consumers = [fanout.consumer() for _ in range(3)]
    got: list[list[tuple[str, int]]] = [[] for _ in consumers]
    stray: list[int] = []
    finish = anyio.Event()
    consumer_tasks: list[object] = []

    async def consume(index: int) -> None:
        consumer_tasks.append(current_task())
        try:
            while len(got[index]) < 9:
                got[index].append(await anext(consumers[index]))
            await finish.wait()  # a stray cancellation lands here
        except anyio.get_cancelled_exc_class():
            stray.append(index)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for index in range(len(consumers)):
                tg.start_soon(consume, index)
            await anyio.wait_all_tasks_blocked()
            finish.set()
    assert stray == []
    assert got[1] == got[0]
    assert got[2] == got[0]
    assert got[0][0::2] == [("warm-up", 0)] + [("after", r) for r in range(4)]
    assert [item[1] for item in got[0][1::2]] == list(range(4))
    markers = {item[0] for item in got[0][1::2]}
    assert markers <= {"timed out", "deadline seen"}
    assert all(len(pull_tasks.pulls[index]) > K + 1 for index in (1, 3, 5, 7))
    pull_tasks.check(consumer_tasks, pulls=9)
    await fanout.aclose()


async def test_a_pull_scope_cancelled_from_outside_raises_at_the_pulls_checkpoint() -> (
    None
):
    """A pull's scope cancelled from outside raises at the checkpoint it waits in."""
    # The pull takes no further step first (it would see the stop flag set
    # alongside), and no consumer is cancelled.
    scopes: list[anyio.CancelScope] = []
    stops = [anyio.Event() for _ in range(3)]
    polling = [anyio.Event() for _ in range(3)]
    pull_tasks = PullTasks()

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        pull_tasks.begin()
        yield "warm-up"
        for round_ in range(3):
            pull_tasks.begin()
            with anyio.CancelScope() as scope:
                scopes.append(scope)
                while not stops[round_].is_set():
                    await poll(give_up_at)
                    pull_tasks.step()
                    polling[round_].set()
            pull_tasks.step()
            yield (
                f"cancelled {round_}" if scope.cancelled_caught else f"stopped {round_}"
            )
            pull_tasks.begin()
            await checkpoints(K)
            pull_tasks.step()
            yield f"after {round_}"

    fanout = Fanout(source(), read_ahead=0)  # each round is the reader's demand
    consumer, other = fanout.consumer(), fanout.consumer()
    stray: list[str] = []
    got: list[str] = []
    finish = anyio.Event()
    consumer_tasks: list[object] = [current_task()]

    async def read() -> None:
        consumer_tasks.append(current_task())
        try:
            for _ in range(7):
                got.append(await anext(consumer))
            await finish.wait()  # a stray cancellation lands here
        except anyio.get_cancelled_exc_class():
            stray.append("reader")

    with anyio.fail_after(TIMEOUT):
        assert await anext(other) == "warm-up"
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            for round_ in range(3):
                await polling[round_].wait()
                assert fanout.statistics().waiting == 1  # the reader's demand
                stops[round_].set()
                scopes[round_].cancel()
                assert await anext(other) == f"cancelled {round_}"
                assert await anext(other) == f"after {round_}"
            await anyio.wait_all_tasks_blocked()
            finish.set()
    assert stray == []
    assert got == ["warm-up"] + [
        f"{kind} {r}" for r in range(3) for kind in ("cancelled", "after")
    ]
    pull_tasks.check(consumer_tasks, pulls=7)
    await fanout.aclose()


# --- errors --------------------------------------------------------------------


class SourceFailure(Exception):
    pass


async def test_a_source_error_after_several_checkpoints_reaches_every_consumer() -> (
    None
):
    """A source error after several checkpoints of a pull reaches every consumer."""
    pull_tasks = PullTasks()
    raised_in: list[object] = []

    async def source() -> AsyncIterator[int]:
        for number in range(3):
            pull_tasks.begin()
            for _ in range(K):
                await anyio.lowlevel.checkpoint()
                pull_tasks.step()
            yield number
        pull_tasks.begin()
        for _ in range(K):
            await anyio.lowlevel.checkpoint()
            pull_tasks.step()
        raised_in.append(current_task())
        raise SourceFailure("failed after several checkpoints of a pull")

    fanout = Fanout(source())
    consumers = [fanout.consumer() for _ in range(4)]
    outcomes: dict[int, tuple[list[int], BaseException | None]] = {}
    consumer_tasks: list[object] = [current_task()]

    async def consume(index: int) -> None:
        consumer_tasks.append(current_task())
        items: list[int] = []
        error: BaseException | None = None
        try:
            async for item in consumers[index]:
                items.append(item)
        except Exception as exc:
            error = exc
        outcomes[index] = (items, error)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for index in range(len(consumers)):
                tg.start_soon(consume, index)
        for consumer in consumers:
            with pytest.raises(StopAsyncIteration):
                await anext(consumer)
    assert raised_in == [pull_tasks.current]
    pull_tasks.check(consumer_tasks, pulls=4)
    for index in range(len(consumers)):
        items, error = outcomes[index]
        assert items == [0, 1, 2]
        assert type(error) is SourceFailure
        assert str(error) == "failed after several checkpoints of a pull"
    stats = fanout.statistics()
    assert (stats.pulling, stats.consumers, stats.pulled) == (False, 0, 3)


async def test_an_error_raised_without_suspending_reaches_every_consumer() -> None:
    """An error a pull raises without suspending reaches all consumers."""

    async def source() -> AsyncIterator[int]:
        yield 1
        raise LookupError("failed without suspending")

    fanout = Fanout(source())
    first, second = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        assert await anext(first) == 1
        with pytest.raises(LookupError, match="failed without suspending"):
            await anext(first)
        assert await anext(second) == 1
        with pytest.raises(LookupError, match="failed without suspending"):
            await anext(second)
        with pytest.raises(StopAsyncIteration):
            await anext(second)


async def test_the_source_sees_a_context_variable_its_first_waiting_consumer_set() -> (
    None
):
    """The pump runs in a copy of the context of the first consumer that
    waited: what that consumer set before waiting, the source reads; what a
    later consumer sets, it does not."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []

    async def source() -> AsyncIterator[int]:
        for number in range(3):
            seen.append(var.get())
            yield number

    fanout = Fanout(source(), read_ahead=0)
    first, second = fanout.consumer(), fanout.consumer()

    async def consume(consumer: FanoutConsumer[int], value: str) -> None:
        var.set(value)
        async for _ in consumer:
            pass

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, first, "first")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(consume, second, "second")
    assert var.get() == "unset"
    assert seen == ["first"] * 3
