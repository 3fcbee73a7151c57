"""Every kind of source a fan-out iterates.

An async generator, an ``async def __anext__``, a plain ``def __anext__`` whose
body runs when it is called, an awaitable that is no coroutine, a class-based
async iterable, and something that is no async iterable at all. Driven
through patterns of ready and suspending items, every consumer gets every item
once and in order, then the end or the error; every part of a pull (the plain
``def __anext__`` body included) runs in the pump, a task that is no
consumer's; a pull that cancels its caller's scope cancels that very call,
losing nothing; each item is in the log in the step the source returns it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from collections.abc import Generator
from typing import Any
from typing import Literal

import anyio
import anyio.lowlevel
import pytest
from _loops import BACKENDS
from _loops import run
from _stubs import TIMEOUT
from _stubs import Boom
from _stubs import NumbersIterable
from _stubs import current_task
from _stubs import take
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from wool_pooling import Fanout

# Sync tests (the hypothesis one) are ignored by anyio's plugin despite this mark.
pytestmark = pytest.mark.anyio

Step = Literal["ready", "pause"]
Kind = Literal["async generator", "async def", "plain def", "awaitable"]
KINDS: tuple[Kind, ...] = ("async generator", "async def", "plain def", "awaitable")


class Script:
    """What each pull does: ``"ready"`` returns its item at once, ``"pause"``
    passes a checkpoint first; after the last step the source ends, or
    raises :exc:`Boom` if ``fails``. Records the task of every part of every
    pull (the task objects are kept, so identity comparisons are sound)."""

    def __init__(self, steps: list[Step], fails: bool) -> None:
        self.steps, self.fails = steps, fails
        self.pulls: list[list[object]] = []

    def begin(self) -> int:
        """A pull begins: its index (``len(steps)`` past the end)."""
        self.pulls.append([current_task()])
        return len(self.pulls) - 1

    def finish(self, index: int) -> None:
        """Past the last step: the end, or the error."""
        if self.fails:
            raise Boom(index)
        raise StopAsyncIteration

    async def step(self, index: int) -> int:
        if index == len(self.steps):
            self.finish(index)
        if self.steps[index] == "pause":
            await anyio.lowlevel.checkpoint()
            self.pulls[index].append(current_task())
        return index


class AsyncDefSource:
    """``async def __anext__``: its call runs nothing of the source."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def __aiter__(self) -> AsyncDefSource:
        return self

    async def __anext__(self) -> int:
        return await self.script.step(self.script.begin())


class PlainDefSource:
    """A plain ``def __anext__`` whose body runs when it is called (and
    raises synchronously at the end) and returns a coroutine."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def __aiter__(self) -> PlainDefSource:
        return self

    def __anext__(self) -> Awaitable[int]:
        index = self.script.begin()
        if index == len(self.script.steps):
            self.script.finish(index)
        return self.script.step(index)


class _Step:
    """An awaitable that is no coroutine."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def __await__(self) -> Generator[Any, None, int]:
        return (yield from self.script.step(self.script.begin()).__await__())


class AwaitableSource:
    """``__anext__`` returns an awaitable that is no coroutine."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def __aiter__(self) -> AwaitableSource:
        return self

    def __anext__(self) -> _Step:
        return _Step(self.script)


def make_source(kind: Kind, script: Script) -> Any:
    if kind == "async def":
        return AsyncDefSource(script)
    if kind == "plain def":
        return PlainDefSource(script)
    if kind == "awaitable":
        return AwaitableSource(script)

    async def generator() -> Any:
        while True:
            index = script.begin()
            if index == len(script.steps) and not script.fails:
                return  # (an async generator ends by returning)
            yield await script.step(index)

    return generator()


async def drive(kind: Kind, steps: list[Step], fails: bool, consumers: int) -> None:
    """Every consumer reads to the end in a task of its own; check the lot."""
    script = Script(steps, fails)
    fanout = Fanout(make_source(kind, script))
    readers = [fanout.consumer() for _ in range(consumers)]
    received: list[list[int]] = [[] for _ in readers]
    endings: list[str] = ["none"] * consumers
    consumer_tasks: list[object] = []

    async def read(index: int) -> None:
        consumer_tasks.append(current_task())
        try:
            async for item in readers[index]:
                received[index].append(item)
        except Boom:
            endings[index] = "error"
        else:
            endings[index] = "end"

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as group:
            for index in range(consumers):
                group.start_soon(read, index)
    assert received == [list(range(len(steps)))] * consumers
    assert endings == ["error" if fails else "end"] * consumers
    # One pull per step, plus the one that found the end; a pull never
    # changes task between its parts, and never runs in a consumer's task.
    assert len(script.pulls) == len(steps) + 1
    assert [pull for pull in script.pulls if any(t is not pull[0] for t in pull)] == []
    assert not {id(pull[0]) for pull in script.pulls} & {id(t) for t in consumer_tasks}
    await fanout.aclose()


READY_4: list[Step] = ["ready"] * 4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.sampled_from(["ready", "pause"]), max_size=12),
    fails=st.booleans(),
    consumers=st.integers(1, 3),
)
@example(steps=[*READY_4, "pause", "ready", "ready", "pause"], fails=True, consumers=1)
@example(steps=["pause", *READY_4, "pause", "pause"], fails=False, consumers=2)
def test_every_source_kind_delivers_everything_and_runs_in_no_consumers_task(
    backend: Any, kind: Kind, steps: list[Step], fails: bool, consumers: int
) -> None:
    run(lambda: drive(kind, steps, fails, consumers), backend)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("at", [1, 2, 4])
async def test_a_ready_pull_cancelling_its_callers_scope_cancels_that_call_only(
    kind: Kind, at: int
) -> None:
    """However the pull runs, a cancellation it requests of its caller's
    scope is raised inside that call; the item is kept for the next read
    (``read_ahead=0``: the call that starts a pull is the one it runs for)."""
    victim_scope = anyio.CancelScope()
    script = Script(["ready"] * 6, fails=False)
    step = script.step

    async def cancelling_step(index: int) -> int:
        if index == at:
            victim_scope.cancel()
        return await step(index)

    script.step = cancelling_step  # type: ignore[method-assign]
    fanout = Fanout(make_source(kind, script), read_ahead=0)
    victim = fanout.consumer()
    items: list[int] = []
    stray: list[str] = []
    with anyio.fail_after(TIMEOUT):
        while len(items) < at:
            items.append(await anext(victim))
        with victim_scope:
            items.append(await anext(victim))  # starts the pull that cancels it
        assert victim_scope.cancelled_caught
        try:
            await anyio.lowlevel.checkpoint()  # a stray cancellation lands here
        except anyio.get_cancelled_exc_class():
            stray.append("victim")
        items += [item async for item in victim]
    assert stray == []
    assert items == list(range(6))
    await fanout.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_system_exit_from_a_ready_pull_reaches_every_consumer(kind: Kind) -> None:
    """SystemExit raised by the source ends the fan-out with it, for everyone."""
    script = Script(["ready"] * 3, fails=True)  # finish() is replaced below

    def finish(index: int) -> None:
        raise SystemExit(index)

    script.finish = finish  # type: ignore[method-assign]
    fanout = Fanout(make_source(kind, script))
    first, second = fanout.consumer(), fanout.consumer()
    with anyio.fail_after(TIMEOUT):
        assert [await anext(first) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(SystemExit) as raised:
            await anext(first)
        assert raised.value.code == 3
        assert [await anext(second) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(SystemExit):
            await anext(second)
        with pytest.raises(StopAsyncIteration):
            await anext(second)
    assert fanout.finished
    await fanout.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_the_log_is_never_behind_what_the_source_has_produced(kind: Kind) -> None:
    """Seen from any other task, every item the source has returned is in
    the log: it is logged in the step that receives it (the pool's replay to
    a joining consumer relies on it)."""
    steps: list[Step] = ["ready", "pause"] * 8
    script = Script(steps, fails=False)
    produced = [0]
    step = script.step

    async def counting_step(index: int) -> int:
        item = await step(index)
        produced[0] += 1  # returned to the fan-out right after this
        return item

    script.step = counting_step  # type: ignore[method-assign]
    fanout = Fanout(make_source(kind, script))
    consumers = [fanout.consumer() for _ in range(2)]
    behind: list[tuple[int, int]] = []
    done = anyio.Event()

    async def read(consumer: Any) -> None:
        async for _ in consumer:
            pass

    async def watch() -> None:
        while not done.is_set():
            if fanout.statistics().pulled != produced[0]:
                behind.append((fanout.statistics().pulled, produced[0]))
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            async with anyio.create_task_group() as readers:
                for consumer in consumers:
                    readers.start_soon(read, consumer)
            done.set()
    assert behind == []
    assert produced[0] == fanout.statistics().pulled == len(steps)
    await fanout.aclose()


# --- async iterable classes, and no async iterable -----------------------------


@pytest.mark.parametrize("source", [42, [1, 2, 3], "abc", None])
async def test_non_async_iterable_source_raises_type_error(source: Any) -> None:
    """``Fanout`` of something without ``__aiter__`` raises ``TypeError``."""
    with pytest.raises(TypeError):
        Fanout(source)


async def test_async_iterable_class_is_iterated_once() -> None:
    """A class-based async iterable has ``aiter`` called once for all consumers."""
    source = NumbersIterable(20)
    fanout = Fanout(source, read_ahead=0)  # late registers after item 4 exactly
    consumers = [fanout.consumer() for _ in range(4)]
    with anyio.fail_after(5):
        assert await take(consumers[0], 5) == list(range(5))
        late = fanout.consumer()
        for consumer in consumers[1:]:
            assert await take(consumer, 10) == list(range(10))
        assert await take(late, 5) == list(range(5, 10))
        assert source.aiter_calls == 1
        await fanout.aclose()
        await fanout.aclose()
    assert source.aiter_calls == 1
    assert source.aclose_calls == 1


class _SyncRaising:
    """A source whose plain ``__anext__`` raises at the end instead of awaiting."""

    def __init__(self, items: int, error: Exception | None) -> None:
        self._left = items
        self._count = 0
        self._error = error

    def __aiter__(self) -> _SyncRaising:
        return self

    def __anext__(self) -> Any:
        if self._count == self._left:
            raise self._error or StopAsyncIteration
        self._count += 1
        return self._value(self._count)

    async def _value(self, value: int) -> int:
        return value


@pytest.mark.parametrize("error", [None, ValueError("boom")])
async def test_a_source_anext_that_raises_synchronously_ends_every_consumer(
    error: Exception | None,
) -> None:
    """An ``__anext__`` raising before returning an awaitable ends every consumer."""
    fanout = Fanout(_SyncRaising(3, error))
    first, second = fanout.consumer(), fanout.consumer()
    for consumer in (first, second):
        with anyio.fail_after(5):
            assert await take(consumer, 3) == [1, 2, 3]
            if error is None:
                assert [item async for item in consumer] == []
            else:
                with pytest.raises(ValueError, match="boom"):
                    await anext(consumer)
    await fanout.aclose()
