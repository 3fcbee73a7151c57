"""Pulls that suspend several times: each is a task of its own, never a consumer's.

Every pull runs as a task of its own, started by the consumer whose demand
needs an item (on asyncio with CPython 3.12+ its first step runs eagerly,
inside that consumer's call, but as the new task). The consumers only wait for
the item. These tests pin what that must guarantee for a pull that passes
several checkpoints (or polls busily) before it yields: every step of a pull
runs in that pull's task and all pulls share one context; cancelling, timing
out or closing any consumer, even the one whose call started the pull, never
reaches the source and loses nothing; a cancel scope the source entered fires
for the pull only; closing the fan-out ends such a pull; errors reach
everyone.

The task running each step is checked with ``asyncio.current_task()`` or
``trio.lowlevel.current_task()``; the task objects are kept, so identity
comparisons are sound.
"""

from __future__ import annotations

import contextvars
import math
import random
from collections.abc import AsyncIterator
from collections.abc import Iterable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _stubs import WITH_UVLOOP
from _stubs import current_task
from _stubs import running_tasks

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer

pytestmark = pytest.mark.anyio


@pytest.fixture(params=WITH_UVLOOP)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """asyncio, uvloop (when installed) and trio."""
    return request.param


TIMEOUT = 5

#: Checkpoints per pull in the sources below.
K = 3

_MISSING: Any = object()


class PullTasks:
    """Which task ran each step of each pull, as the source reports it.

    The source calls :meth:`begin` where a pull begins (the generator's start
    and right after each ``yield``) and :meth:`step` after each suspension.
    """

    def __init__(self) -> None:
        #: Per pull, the task of each of its steps, in order.
        self.pulls: list[list[object]] = []

    def begin(self) -> None:
        self.pulls.append([current_task()])

    def step(self) -> None:
        self.pulls[-1].append(current_task())

    @property
    def current(self) -> object:
        """The task of the pull the source is in (or was last in)."""
        return self.pulls[-1][0]

    def check(self, consumer_tasks: Iterable[object], pulls: int) -> None:
        """Assert that there were ``pulls`` pulls, each of whose steps ran in
        one task, which is none of ``consumer_tasks``."""
        assert len(self.pulls) == pulls
        split = [
            index
            for index, tasks in enumerate(self.pulls)
            if any(task is not tasks[0] for task in tasks)
        ]
        assert split == []  # no pull changed task between its steps
        consumers = {id(task) for task in consumer_tasks}
        in_a_consumer = [
            index for index, tasks in enumerate(self.pulls) if id(tasks[0]) in consumers
        ]
        assert in_a_consumer == []


async def checkpoints(n: int) -> None:
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


class PollGaveUp(Exception):
    """A busy poll inside a pull outlived the test's timeout."""


async def poll(give_up_at: float) -> None:
    """One step of a busy poll inside a pull: a checkpoint.

    Raises once ``give_up_at`` has passed, so that a bug that keeps a pull
    polling regardless of cancellation fails the test instead of hanging it.
    """
    await anyio.lowlevel.checkpoint()
    if anyio.current_time() > give_up_at:
        raise PollGaveUp


async def wait_until_waiting(fanout: Fanout[Any], n: int) -> None:
    """Let other tasks run until ``n`` consumers wait for the next item.

    Checkpoints rather than ``wait_all_tasks_blocked``: a busy polling pull
    never lets every task block.
    """
    while fanout.statistics().waiting < n:
        await anyio.lowlevel.checkpoint()


# --- 1. one task per pull, one context ----------------------------------------------


@pytest.mark.parametrize(
    "gated", [False, True], ids=["checkpoints-only", "then-a-task-bound-wait"]
)
async def test_every_step_of_every_pull_runs_in_that_pulls_task_never_a_consumers(
    gated: bool,
) -> None:
    """Each pull runs all its steps in one task of its own, never a consumer's."""
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
                await receive.receive()  # parks the pull's task
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


# --- 2. cancelling the consumer that started a pull --------------------------------

N_ITEMS = 6
TARGET = 3


@pytest.mark.parametrize(
    ("cancel_at", "cancelled_before_the_call"),
    [(0, False), (1, False), (2, False), (0, True)],
    ids=["at-checkpoint-0", "at-checkpoint-1", "at-checkpoint-2", "before-the-call"],
)
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

    fanout = Fanout(source())
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

    fanout = Fanout(source())
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


# --- 3. a cancel scope inside a pull -------------------------------------------------


async def test_a_timeout_across_checkpoints_in_a_pull_fires_for_that_pull_only() -> (
    None
):
    """A deadline the source sets across a pull's checkpoints fires for it alone."""
    # The source gets its marker, no consumer gets a stray cancellation, every
    # step stays in its pull's task, and later pulls work.
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


async def test_a_pull_polling_until_its_own_deadline_times_out_in_its_own_task() -> (
    None
):
    """A pull polling until its own deadline times out in its own task only."""
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

    fanout = Fanout(source())
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


# --- 4. closing the fan-out ------------------------------------------------------


async def test_aclose_ends_a_busy_polling_pull_and_every_pending_consumer() -> None:
    """aclose() cancels a polling pull in its task and ends every pending consumer."""
    # The pending anext of the pull's starter and of the consumer beside it end;
    # the source's finally runs once, in the pull's task; no pull or task remains.
    polling, finalized = anyio.Event(), anyio.Event()
    finally_tasks: list[object] = []
    through_source: list[BaseException] = []
    pull_tasks = PullTasks()

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            pull_tasks.begin()
            yield "warm-up"
            pull_tasks.begin()
            while True:
                await poll(give_up_at)
                pull_tasks.step()
                polling.set()
        except BaseException as error:
            through_source.append(error)
            raise
        finally:
            finally_tasks.append(current_task())
            finalized.set()

    await anyio.wait_all_tasks_blocked()
    baseline = running_tasks()
    fanout = Fanout(source())
    consumer, other = fanout.consumer(), fanout.consumer()
    outcome: dict[str, str] = {}
    consumer_tasks: list[object] = [current_task()]

    async def wait_for_next(name: str, consumer: FanoutConsumer[str]) -> None:
        consumer_tasks.append(current_task())
        try:
            await anext(consumer)
        except StopAsyncIteration:
            outcome[name] = "ended"
        else:
            outcome[name] = "item"

    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == "warm-up"
        assert await anext(other) == "warm-up"
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_next, "starter", consumer)
            await polling.wait()
            tg.start_soon(wait_for_next, "other", other)
            await wait_until_waiting(fanout, 2)
            assert fanout.statistics().pulling
            await fanout.aclose()
            assert finalized.is_set()
    assert outcome == {"starter": "ended", "other": "ended"}
    # Cancelled, not given up: a pull aclose() left polling would raise PollGaveUp.
    assert [type(error) for error in through_source] == [
        anyio.get_cancelled_exc_class()
    ]
    assert len(finally_tasks) == 1
    assert finally_tasks[0] is pull_tasks.current  # ended inside the pull's task
    pull_tasks.check(consumer_tasks, pulls=2)
    assert not fanout.statistics().pulling
    await anyio.wait_all_tasks_blocked()
    assert running_tasks() == baseline  # no pull task is left
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)


# --- 5. closing the consumer that started a pull ----------------------------------


async def test_closing_the_consumer_that_started_a_pull_spares_the_others() -> None:
    """Closing the consumer that started a pull ends it; the pull serves the rest."""
    # Closed from another task while its pull polls; once the source is exhausted
    # nothing is left: no consumer, no buffered item, no pull, no task.
    reached, go, finalized = anyio.Event(), anyio.Event(), anyio.Event()

    async def source() -> AsyncIterator[int]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            for number in range(N_ITEMS):
                await anyio.lowlevel.checkpoint()
                if number == TARGET:
                    await anyio.lowlevel.checkpoint()
                    reached.set()
                    while not go.is_set():
                        await poll(give_up_at)
                await checkpoints(K - 1)
                yield number
        finally:
            finalized.set()

    await anyio.wait_all_tasks_blocked()
    baseline = running_tasks()
    fanout = Fanout(source())
    starter = fanout.consumer()
    others = [fanout.consumer() for _ in range(3)]
    other_items: list[list[int]] = [[] for _ in others]
    starter_items: list[int] = []
    starter_end: list[str] = []
    starter_out = anyio.Event()

    async def run_starter() -> None:
        while len(starter_items) < TARGET:  # it starts these pulls alone
            starter_items.append(await anext(starter))
        try:
            starter_items.append(await anext(starter))  # starts pull TARGET
        except StopAsyncIteration:
            starter_end.append("ended")
        starter_out.set()

    async def run_other(index: int) -> None:
        async for item in others[index]:
            other_items[index].append(item)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_starter)
            await reached.wait()
            assert fanout.statistics().waiting == 1  # the starter waits for it
            for index in range(len(others)):
                tg.start_soon(run_other, index)
            await wait_until_waiting(fanout, len(others) + 1)
            starter.close()
            assert fanout.statistics().consumers == len(others)
            await starter_out.wait()  # its pending anext ended at the close...
            assert starter_end == ["ended"]
            assert fanout.statistics().pulling  # ...while the pull goes on
            go.set()
    assert starter_items == list(range(TARGET))
    assert other_items == [list(range(N_ITEMS))] * len(others)
    assert finalized.is_set()
    statistics = fanout.statistics()
    assert (statistics.consumers, statistics.buffered, statistics.pulling) == (
        0,
        0,
        False,
    )
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(StopAsyncIteration):
            await anext(starter)
        await anyio.wait_all_tasks_blocked()
    assert running_tasks() == baseline  # no pull task is left


async def test_closing_the_only_consumer_lets_its_pull_finish_and_starts_no_more() -> (
    None
):
    """With its only consumer closed, the pull in flight finishes; no other starts."""
    reached, go, finalized = anyio.Event(), anyio.Event(), anyio.Event()
    polled: list[str] = []

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            yield "warm-up"
            await anyio.lowlevel.checkpoint()
            reached.set()
            while not go.is_set():
                await poll(give_up_at)
            polled.append("polled")
            yield "polled"
            polled.append("never pulled")
            yield "never pulled"
        finally:
            finalized.set()

    await anyio.wait_all_tasks_blocked()
    baseline = running_tasks()
    fanout = Fanout(source())
    consumer = fanout.consumer()
    ended = anyio.Event()

    async def read() -> None:
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)
        ended.set()

    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == "warm-up"
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await reached.wait()
            consumer.close()
            await ended.wait()  # its pending anext ended at the close...
            assert fanout.statistics().pulling  # ...while the pull goes on
            go.set()
        await anyio.wait_all_tasks_blocked()
    assert polled == ["polled"]
    statistics = fanout.statistics()
    assert (
        statistics.consumers,
        statistics.buffered,
        statistics.pulling,
        statistics.pulled,
    ) == (0, 0, False, 2)
    # the pull ended; the pump waits, parked, for the next consumer
    assert running_tasks() == baseline + 1
    assert not finalized.is_set()
    with anyio.fail_after(TIMEOUT):
        await fanout.aclose()
        await anyio.wait_all_tasks_blocked()
    assert finalized.is_set()
    assert running_tasks() == baseline


async def test_a_consumer_closed_in_the_first_step_of_its_own_pull_ends_at_once() -> (
    None
):
    """Closed before the pull its call started first suspends, a consumer ends."""
    # Its pending anext ends while the pull is still in flight, as when it is
    # closed at any later step; on asyncio 3.12+ that first step runs eagerly,
    # inside the consumer's own call.
    go = anyio.Event()
    holder: list[FanoutConsumer[int]] = []

    async def source() -> AsyncIterator[int]:
        yield 0
        holder[0].close()  # the consumer whose anext started this pull
        await go.wait()
        yield 1

    fanout = Fanout(source())
    starter, other = fanout.consumer(), fanout.consumer()
    holder.append(starter)
    outcome: list[str] = []

    async def read() -> None:
        try:
            await anext(starter)
        except StopAsyncIteration:
            outcome.append("ended")
        else:
            outcome.append("item")

    with anyio.fail_after(TIMEOUT):
        assert await anext(starter) == 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()  # the pull waits for go
            observed = (list(outcome), fanout.statistics().pulling)
            go.set()
        assert [item async for item in other] == [0, 1]
    assert observed == (["ended"], True)
    assert outcome == ["ended"]


# --- 6. many consumers, random cancellations ---------------------------------------

MANY = 50
ITEMS = 300
GATE_EVERY = 100


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
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


# --- 7. errors -------------------------------------------------------------------


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
