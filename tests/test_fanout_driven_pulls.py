"""Driven pulls: a consumer carries a pull across yields bound to no task, as the pump.

A consumer at the log's end runs a pull's first step inline, as the fan-out's
pump task. When that step suspends at a yield bound to no task (asyncio's bare
yield, trio's shielded checkpoint), the consumer makes that yield itself and
runs the next step, still as the pump. These tests pin what that must never
change: the source sees one task and one context; a consumer's cancellation,
timeout or ``close()`` never reaches the source; a cancel scope the source
entered fires for the pull only; closing the fan-out ends such a pull; errors
reach everyone.

Whether a pull is being *driven* (rather than run by the pump) is private
state; :func:`driven` reads it only to check that a test exercises the path
it claims to.
"""

from __future__ import annotations

import contextvars
import math
import random
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _stubs import WITH_UVLOOP
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


def driven(fanout: Fanout[Any] | None) -> bool:
    """Whether a consumer (not the pump) is driving the pull in flight."""
    puller = None if fanout is None else fanout._puller  # pyright: ignore[reportPrivateUsage]
    return puller is not None and puller.driving


async def checkpoints(n: int) -> None:
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


class PollGaveUp(Exception):
    """A busy poll inside a pull outlived the test's timeout."""


async def poll(give_up_at: float) -> None:
    """One step of a busy poll inside a pull: a checkpoint.

    Raises once ``give_up_at`` has passed, so that a bug that keeps a driven
    pull polling regardless of cancellation fails the test instead of hanging
    it (``fail_after`` cannot interrupt a consumer that never notices its
    cancellation).
    """
    await anyio.lowlevel.checkpoint()
    if anyio.current_time() > give_up_at:
        raise PollGaveUp


async def wait_until_waiting(fanout: Fanout[Any], n: int) -> None:
    """Let other tasks run until ``n`` consumers wait for the next item.

    Checkpoints rather than ``wait_all_tasks_blocked``: a driven or busy
    polling pull never lets every task block.
    """
    while fanout.statistics().waiting < n:
        await anyio.lowlevel.checkpoint()


# --- 1. one task, one context -----------------------------------------------------


@pytest.mark.parametrize(
    "gated", [False, True], ids=["checkpoints-only", "then-a-task-bound-wait"]
)
async def test_every_step_of_a_driven_pull_runs_as_the_one_pump_task(
    gated: bool,
) -> None:
    """Before and after each checkpoint of every pull, the source sees one task,
    never a consumer's; also when a driven pull then parks on a task-bound
    wait (``gated``), which the pump takes over."""
    send, receive = anyio.create_memory_object_stream[int](math.inf)
    seen: list[int] = []
    driven_steps: list[bool] = []
    fanout: Fanout[int] | None = None

    async def source() -> AsyncIterator[int]:
        try:
            for number in range(16):
                for _ in range(K):
                    seen.append(anyio.get_current_task().id)
                    await anyio.lowlevel.checkpoint()
                    seen.append(anyio.get_current_task().id)
                    driven_steps.append(driven(fanout))
                if gated and number % 4 == 3:
                    # Driven up to here, then parked on a task-bound wait.
                    await receive.receive()
                    seen.append(anyio.get_current_task().id)
                yield number
        finally:
            seen.append(anyio.get_current_task().id)

    fanout = Fanout(source())
    consumer_tasks: set[int] = {anyio.get_current_task().id}
    received: dict[int, list[int]] = {}

    async def consume(index: int, consumer: FanoutConsumer[int]) -> None:
        consumer_tasks.add(anyio.get_current_task().id)
        received[index] = [item async for item in consumer]

    with anyio.fail_after(TIMEOUT):
        consumers = [fanout.consumer() for _ in range(3)]
        async with anyio.create_task_group() as tg:
            for index, consumer in enumerate(consumers):
                tg.start_soon(consume, index, consumer)
            for _ in range(4 if gated else 0):
                await anyio.wait_all_tasks_blocked()
                await send.send(0)
    assert received == {index: list(range(16)) for index in range(3)}
    assert any(driven_steps)  # consumers did drive pulls
    assert len(set(seen)) == 1
    assert not set(seen) & consumer_tasks
    await fanout.aclose()


async def test_driven_pulls_share_the_pump_context_and_leave_consumers_alone() -> None:
    """A context variable the source sets before a checkpoint is visible after it
    and in later pulls; the consumers' own values are never touched."""
    var: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar(
        "var", default=("unset", 0)
    )
    observations: list[tuple[tuple[str, int], tuple[str, int]]] = []
    driven_steps: list[bool] = []
    fanout: Fanout[int] | None = None

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
                driven_steps.append(driven(fanout))
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
    assert any(driven_steps)
    assert len(observations) == 12 * K * 2
    mismatches = [(want, got) for want, got in observations if want != got]
    assert mismatches == []
    for index in range(3):
        assert consumer_views[index] == [("consumer", index)] * 12
    assert var.get() == ("unset", 0)
    await fanout.aclose()


# --- 2. cancelling the driving consumer ---------------------------------------------

N_ITEMS = 6
TARGET = 3


@pytest.mark.parametrize(
    ("cancel_at", "cancelled_before_the_call"),
    [(0, False), (1, False), (2, False), (0, True)],
    ids=["at-checkpoint-0", "at-checkpoint-1", "at-checkpoint-2", "before-the-call"],
)
async def test_cancelling_the_consumer_driving_a_pull_loses_nothing(
    cancel_at: int, cancelled_before_the_call: bool
) -> None:
    """The cancelled driver's next ``anext`` returns the item it was pulling;
    everyone else gets every item once, in order; the source never sees the
    cancellation and is not closed before it is exhausted."""
    reached, go, finalized = anyio.Event(), anyio.Event(), anyio.Event()
    through_source: list[BaseException] = []
    fanout: Fanout[int] | None = None

    async def source() -> AsyncIterator[int]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            for number in range(N_ITEMS):
                for step in range(K):
                    if number == TARGET and step == cancel_at:
                        reached.set()
                        while not go.is_set():  # the busy pull the victim drives
                            await poll(give_up_at)
                    else:
                        await anyio.lowlevel.checkpoint()
                yield number
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

    async def run_victim() -> None:
        while len(victim_items) < TARGET:  # it drives these pulls alone
            victim_items.append(await anext(victim))
        item = _MISSING
        with victim_scope:
            if cancelled_before_the_call:
                victim_scope.cancel()
            item = await anext(victim)
        cancelled_outcome["item"] = item
        cancelled_outcome["cancelled"] = victim_scope.cancelled_caught
        cancelled_outcome["source finalized"] = finalized.is_set()
        victim_out.set()
        async for item in victim:
            victim_items.append(item)

    async def run_other(index: int) -> None:
        async for item in others[index]:
            other_items[index].append(item)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_victim)
            await reached.wait()
            if not cancelled_before_the_call:
                assert driven(fanout)  # the victim drives pull TARGET right now
                victim_scope.cancel()
            for index in range(len(others)):
                tg.start_soon(run_other, index)
            await victim_out.wait()
            assert cancelled_outcome == {
                "item": _MISSING,
                "cancelled": True,
                "source finalized": False,
            }
            assert fanout.statistics().pulling  # the pump carries the pull on
            # The others and the re-asking victim all wait for the same item.
            await wait_until_waiting(fanout, len(others) + 1)
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


async def test_a_consumer_timeout_while_it_drives_a_pull_abandons_only_its_wait() -> (
    None
):
    """A deadline of the driving consumer's own ends its wait, not the pull; its
    next ``anext`` returns the item."""
    go = anyio.Event()
    through_source: list[BaseException] = []
    polls_driven: list[bool] = []
    fanout: Fanout[str] | None = None

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            yield "warm-up"
            while not go.is_set():
                await poll(give_up_at)
                polls_driven.append(driven(fanout))
            yield "polled"
            await checkpoints(K)
            yield "next"
        except BaseException as error:
            through_source.append(error)
            raise

    fanout = Fanout(source())
    consumer, other = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == "warm-up"
        assert await anext(other) == "warm-up"
        with anyio.move_on_after(0.01) as scope:
            await anext(consumer)  # drives the busy pull until its deadline
        assert scope.cancelled_caught
        assert polls_driven
        assert polls_driven[0]  # it was driving
        assert fanout.statistics().pulling
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


# --- 3. a cancel scope inside a driven pull ----------------------------------------


async def test_timeout_across_checkpoints_of_a_driven_pull_fires_for_it_only() -> None:
    """A deadline the source sets around several checkpoints of one pull expires
    while a consumer drives it: the source gets its marker, no consumer gets a
    stray cancellation, the pump stays the one task, and later pulls work."""
    polls_driven: list[bool] = []
    step_tasks: set[int] = set()
    fanout: Fanout[str] | None = None

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        yield "warm-up"
        for round_ in range(2):
            with anyio.move_on_after(0.02) as scope:
                while True:  # left only by the deadline
                    await poll(give_up_at)
                    step_tasks.add(anyio.get_current_task().id)
                    polls_driven.append(driven(fanout))
            yield f"timed out {round_}" if scope.cancelled_caught else "not timed out"
            await checkpoints(K)
            step_tasks.add(anyio.get_current_task().id)
            yield f"after {round_}"

    fanout = Fanout(source())
    names = ("a", "b")
    consumers = {name: fanout.consumer() for name in names}
    got: dict[str, list[str]] = {name: [] for name in names}
    arrived = {(name, r): anyio.Event() for name in names for r in range(2)}
    resume = [anyio.Event(), anyio.Event()]
    stray: list[str] = []

    async def consume(name: str) -> None:
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
    assert any(polls_driven)
    assert len(step_tasks) == 1
    await fanout.aclose()


async def test_a_driven_pull_polling_until_its_deadline_keeps_the_one_pump() -> None:
    """A driven pull polls until its own scope has been cancelled by its
    deadline. The cancellation is normally delivered at a checkpoint ("timed
    out"); on trio the source may notice the expired deadline first ("deadline
    seen"). Either way the pull takes no step outside the pump task, the pump
    survives the expiry, and every consumer gets the same items."""
    step_tasks: set[int] = set()
    polls_driven: list[bool] = []
    fanout: Fanout[tuple[str, int]] | None = None

    async def source() -> AsyncIterator[tuple[str, int]]:
        give_up_at = anyio.current_time() + TIMEOUT
        yield ("warm-up", 0)
        for round_ in range(4):
            with anyio.move_on_after(0.01) as scope:
                while not scope.cancel_called:
                    await poll(give_up_at)
                    step_tasks.add(anyio.get_current_task().id)
                    polls_driven.append(driven(fanout))
            yield ("timed out" if scope.cancelled_caught else "deadline seen", round_)
            await checkpoints(K)
            step_tasks.add(anyio.get_current_task().id)
            yield ("after", round_)

    fanout = Fanout(source())
    consumers = [fanout.consumer() for _ in range(3)]
    got: list[list[tuple[str, int]]] = [[] for _ in consumers]
    stray: list[int] = []
    finish = anyio.Event()

    async def consume(index: int) -> None:
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
    assert any(polls_driven)
    assert len(step_tasks) == 1
    await fanout.aclose()


async def test_cancelled_source_scope_raises_at_the_driven_pulls_checkpoint() -> None:
    """A cancel scope entered by the source (so hosted by the pump), cancelled
    from another task while a consumer drives the pull, raises at the
    checkpoint the pull is suspended at, as in any task: the pull does not
    take another step first (it would see the stop flag set alongside), the
    consumer is not cancelled, and the pump carries on."""
    scopes: list[anyio.CancelScope] = []
    stops = [anyio.Event() for _ in range(3)]
    polling = [anyio.Event() for _ in range(3)]
    step_tasks: set[int] = set()
    fanout: Fanout[str] | None = None

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        yield "warm-up"
        for round_ in range(3):
            with anyio.CancelScope() as scope:
                scopes.append(scope)
                while not stops[round_].is_set():
                    await poll(give_up_at)
                    step_tasks.add(anyio.get_current_task().id)
                    if driven(fanout):
                        polling[round_].set()
            yield (
                f"cancelled {round_}" if scope.cancelled_caught else f"stopped {round_}"
            )
            await checkpoints(K)
            step_tasks.add(anyio.get_current_task().id)
            yield f"after {round_}"

    fanout = Fanout(source())
    consumer, other = fanout.consumer(), fanout.consumer()
    stray: list[str] = []
    got: list[str] = []
    finish = anyio.Event()

    async def drive() -> None:
        try:
            for _ in range(7):
                got.append(await anext(consumer))
            await finish.wait()  # a stray cancellation lands here
        except anyio.get_cancelled_exc_class():
            stray.append("driver")

    with anyio.fail_after(TIMEOUT):
        assert await anext(other) == "warm-up"
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            for round_ in range(3):
                await polling[round_].wait()
                assert driven(fanout)
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
    assert len(step_tasks) == 1
    await fanout.aclose()


# --- 4. closing the fan-out ------------------------------------------------------


async def test_aclose_ends_a_busy_polling_pull_a_consumer_drives() -> None:
    """``aclose()`` returns, runs the source's ``finally`` (as the pump), and the
    driving consumer's pending ``anext`` ends; no pull remains."""
    polling, finalized = anyio.Event(), anyio.Event()
    step_tasks: set[int] = set()
    finally_tasks: list[int] = []
    fanout: Fanout[str] | None = None

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            yield "warm-up"
            while True:
                await poll(give_up_at)
                step_tasks.add(anyio.get_current_task().id)
                if driven(fanout):
                    polling.set()
        finally:
            finally_tasks.append(anyio.get_current_task().id)
            finalized.set()

    await anyio.wait_all_tasks_blocked()
    baseline = running_tasks()
    fanout = Fanout(source())
    consumer, other = fanout.consumer(), fanout.consumer()
    outcome: dict[str, str] = {}

    async def wait_for_next(name: str, consumer: FanoutConsumer[str]) -> None:
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
            tg.start_soon(wait_for_next, "driver", consumer)
            await polling.wait()
            tg.start_soon(wait_for_next, "other", other)
            await wait_until_waiting(fanout, 1)
            assert driven(fanout)
            await fanout.aclose()
            assert finalized.is_set()
    assert outcome == {"driver": "ended", "other": "ended"}
    assert len(step_tasks) == 1
    assert finally_tasks == list(step_tasks)  # closed in the pump, once
    assert not fanout.statistics().pulling
    await anyio.wait_all_tasks_blocked()
    assert running_tasks() == baseline  # the pump is gone
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)


# --- 5. closing the driving consumer ---------------------------------------------


async def test_closing_the_driving_consumer_ends_it_and_spares_the_others() -> None:
    """Closed from another task while it drives a pull, the driver's pending
    ``anext`` ends; the others get every item; once the source is exhausted
    nothing is left (no consumer, no buffered item, no pull, no pump)."""
    reached, go, finalized = anyio.Event(), anyio.Event(), anyio.Event()
    fanout: Fanout[int] | None = None

    async def source() -> AsyncIterator[int]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            for number in range(N_ITEMS):
                await anyio.lowlevel.checkpoint()
                if number == TARGET:
                    await anyio.lowlevel.checkpoint()
                    if driven(fanout):
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
    driver = fanout.consumer()
    others = [fanout.consumer() for _ in range(3)]
    other_items: list[list[int]] = [[] for _ in others]
    driver_items: list[int] = []
    driver_end: list[str] = []

    async def run_driver() -> None:
        while len(driver_items) < TARGET:
            driver_items.append(await anext(driver))
        try:
            driver_items.append(await anext(driver))
        except StopAsyncIteration:
            driver_end.append("ended")

    async def run_other(index: int) -> None:
        async for item in others[index]:
            other_items[index].append(item)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_driver)
            await reached.wait()
            for index in range(len(others)):
                tg.start_soon(run_other, index)
            await wait_until_waiting(fanout, len(others))
            assert driven(fanout)
            driver.close()
            assert fanout.statistics().consumers == len(others)
            go.set()
    assert driver_end == ["ended"]
    assert driver_items == list(range(TARGET))
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
            await anext(driver)
        await anyio.wait_all_tasks_blocked()
    assert running_tasks() == baseline  # the pump is gone


async def test_closing_the_only_consumer_while_it_drives_lets_the_pull_finish() -> None:
    """With no consumer left, the pull in flight still completes (nothing stays
    half-pulled) and no further pull starts."""
    reached, go, finalized = anyio.Event(), anyio.Event(), anyio.Event()
    fanout: Fanout[str] | None = None

    async def source() -> AsyncIterator[str]:
        give_up_at = anyio.current_time() + TIMEOUT
        try:
            yield "warm-up"
            await anyio.lowlevel.checkpoint()
            if driven(fanout):
                reached.set()
            while not go.is_set():
                await poll(give_up_at)
            yield "polled"
            yield "never pulled"
        finally:
            finalized.set()

    await anyio.wait_all_tasks_blocked()
    baseline = running_tasks()
    fanout = Fanout(source())
    consumer = fanout.consumer()
    ended = anyio.Event()

    async def drive() -> None:
        with pytest.raises(StopAsyncIteration):
            await anext(consumer)
        ended.set()

    with anyio.fail_after(TIMEOUT):
        assert await anext(consumer) == "warm-up"
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            await reached.wait()
            consumer.close()
            go.set()
        await ended.wait()
        await anyio.wait_all_tasks_blocked()
    statistics = fanout.statistics()
    assert (
        statistics.consumers,
        statistics.buffered,
        statistics.pulling,
        statistics.pulled,
    ) == (0, 0, False, 2)
    assert running_tasks() == baseline  # the pump ended: nobody is left
    assert not finalized.is_set()
    with anyio.fail_after(TIMEOUT):
        await fanout.aclose()
    assert finalized.is_set()


# --- 6. many consumers, random cancellations ---------------------------------------

MANY = 50
ITEMS = 300
GATE_EVERY = 100


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
async def test_random_cancellations_of_many_consumers_lose_nothing(seed: int) -> None:
    """Consumers cancelled before the call, from other consumers at random
    moments (mostly while some consumer drives a pull), or by a controller
    while everyone is blocked: each still gets exactly the full sequence."""
    send, receive = anyio.create_memory_object_stream[None](math.inf)
    through_source: list[BaseException] = []
    finalized = anyio.Event()
    # Per pull, whether each step after a checkpoint ran in a driving consumer.
    pulls: list[tuple[bool, ...]] = []
    fanout: Fanout[int] | None = None

    async def source() -> AsyncIterator[int]:
        try:
            for number in range(ITEMS):
                steps: list[bool] = []
                for _ in range(K):
                    await anyio.lowlevel.checkpoint()
                    steps.append(driven(fanout))
                pulls.append(tuple(steps))
                if number % GATE_EVERY == GATE_EVERY - 1:
                    await receive.receive()  # everyone blocks: the controller acts
                yield number
        except BaseException as error:
            through_source.append(error)
            raise
        finally:
            finalized.set()

    fanout = Fanout(source())
    consumers = [fanout.consumer() for _ in range(MANY)]
    received: list[list[int]] = [[] for _ in range(MANY)]
    scopes: list[anyio.CancelScope | None] = [None] * MANY
    cancellations = [0]
    controller_rng = random.Random(seed)

    def cancel_some(rng: random.Random, count: int) -> None:
        for _ in range(count):
            scope = scopes[rng.randrange(MANY)]
            if scope is not None and not scope.cancel_called:
                scope.cancel()
                cancellations[0] += 1

    async def consume(index: int) -> None:
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
    # The run did exercise driven pulls, and drivers leaving mid-pull.
    assert any(all(steps) for steps in pulls)
    assert any(steps[0] and not steps[-1] for steps in pulls)
    assert cancellations[0] > 0
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


async def test_source_error_inside_a_driven_pull_reaches_every_consumer() -> None:
    """Raised after some checkpoints of a pull a consumer drives, the error
    reaches every consumer after the earlier items, with its own type."""
    driven_at_raise: list[bool] = []
    fanout: Fanout[int] | None = None

    async def source() -> AsyncIterator[int]:
        for number in range(3):
            await checkpoints(K)
            yield number
        await checkpoints(K)
        driven_at_raise.append(driven(fanout))
        raise SourceFailure("failed inside a driven pull")

    fanout = Fanout(source())
    consumers = [fanout.consumer() for _ in range(4)]
    outcomes: dict[int, tuple[list[int], BaseException | None]] = {}

    async def consume(index: int) -> None:
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
    assert driven_at_raise == [True]
    for index in range(len(consumers)):
        items, error = outcomes[index]
        assert items == [0, 1, 2]
        assert type(error) is SourceFailure
        assert str(error) == "failed inside a driven pull"
    assert not fanout.statistics().pulling
