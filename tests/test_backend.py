"""The backend seam: an abstract EventLoop, one handle class per backend, and
trio imported only where trio runs."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Generator
from typing import Any

import anyio
import pytest
from _loops import BACKENDS
from _loops import asyncio_only
from _loops import run

from wool_pooling._core.backend import EventLoop
from wool_pooling._core.backend import current_loop
from wool_pooling._core.backend._asyncio import AsyncioLoop
from wool_pooling._core.backend._asyncio import _until_waits
from wool_pooling._core.backend._trio import TrioLoop

#: What a backend must provide, beyond its class attributes (``backend``,
#: ``current_task``, ``running``, ``next_pass``, and the ``waiters`` and
#: ``interruptible`` factories, pinned for each backend below).
ABSTRACT = {"spawn", "_call_soon"}


class Native:
    """What a test backend's handle is made for (an asyncio loop, a trio token)."""


def backend_with_all_but(missing: str | None) -> type[EventLoop]:
    """A subclass of EventLoop defining every abstract method but ``missing``."""

    def spawn(
        self: EventLoop,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        context: Any = None,
    ) -> None:
        pass

    def _call_soon(
        self: EventLoop, native: Any, fn: Callable[..., object], *args: Any
    ) -> None:
        fn(*args)

    methods: dict[str, Any] = {
        "spawn": spawn,
        "_call_soon": _call_soon,
    }
    methods.pop(missing or "", None)
    return type(
        "Partial",
        (EventLoop,),
        {
            "__slots__": (),
            "backend": "test",
            "current_task": staticmethod(lambda: None),
            "running": staticmethod(lambda: None),
            **methods,
        },
    )


def test_event_loop_is_abstract_in_exactly_the_backend_methods() -> None:
    """EventLoop itself cannot be instantiated; what it leaves to a backend is
    exactly its backend-specific methods."""
    with pytest.raises(TypeError, match="abstract"):
        EventLoop(Native())  # pyright: ignore[reportAbstractUsage]
    assert EventLoop.__abstractmethods__ == ABSTRACT


@pytest.mark.parametrize("missing", sorted(ABSTRACT))
def test_a_backend_missing_a_method_cannot_be_instantiated(missing: str) -> None:
    """A subclass that leaves out any one backend method is refused at
    instantiation, naming the method; with all of them it is accepted, and its
    shared methods work through what it defines: current while its native
    handle is the running one, scheduling until that handle is gone."""
    with pytest.raises(TypeError, match=missing):
        backend_with_all_but(missing)(Native())
    native = Native()
    handle = backend_with_all_but(None)(native)
    assert repr(handle) == "<EventLoop [test]>"
    assert not handle.is_current()  # its running() gives None
    called: list[int] = []
    assert handle.run_soon(called.append, 1) is True
    assert called == [1]
    del native
    gc.collect()
    assert handle.run_soon(called.append, 2) is False
    assert called == [1]


@pytest.mark.parametrize("backend", [AsyncioLoop, TrioLoop])
def test_each_backend_defines_every_class_attribute_the_seam_declares(
    backend: type[EventLoop],
) -> None:
    """What EventLoop declares as class attributes (its name, task and loop
    look-ups, the pass, and the factories of waiters and regions), each
    backend defines itself."""
    declared = {
        name
        for name, annotation in EventLoop.__annotations__.items()
        if str(annotation).startswith("ClassVar")
    }
    assert declared == {
        "backend",
        "current_task",
        "running",
        "next_pass",
        "waiters",
        "interruptible",
    }
    assert declared <= set(vars(backend))


def test_current_loop_outside_any_loop_raises() -> None:
    """Outside an asyncio loop or trio run, current_loop raises RuntimeError."""
    with pytest.raises(RuntimeError, match="no asyncio event loop or trio run"):
        current_loop()


@pytest.mark.anyio
async def test_current_loop_is_the_running_backends_handle(
    anyio_backend: tuple[str, dict[str, Any]],
) -> None:
    """current_loop returns the running backend's own class, the same handle
    at every call in the loop, current in it and running."""
    name = anyio_backend[0]
    expected = {"asyncio": AsyncioLoop, "trio": TrioLoop}[name]
    handle = current_loop()
    assert type(handle) is expected
    assert handle.backend == name
    assert current_loop() is handle
    assert handle.is_current()
    assert handle.in_own_thread()
    assert handle.current_task() is not None
    assert repr(handle) == f"<EventLoop [{name}]>"


@pytest.mark.anyio
async def test_next_pass_lets_the_tasks_ready_have_their_step(
    anyio_backend: tuple[str, dict[str, Any]],
) -> None:
    """A task awaiting ``next_pass()`` resumes after the tasks made ready
    before it had their step: on asyncio, every one of them (its ready queue
    runs in order); on trio, whose batches run in either order, within the
    next two passes."""
    stepped: list[int] = []
    released = anyio.Event()

    async def woken(index: int) -> None:
        await released.wait()
        stepped.append(index)

    async with anyio.create_task_group() as group:
        for index in range(5):
            group.start_soon(woken, index)
        await anyio.wait_all_tasks_blocked()
        released.set()
        handle = current_loop()
        await handle.next_pass()
        if anyio_backend[0] == "asyncio":
            assert sorted(stepped) == list(range(5))
        else:
            await handle.next_pass()
            assert sorted(stepped) == list(range(5))


@pytest.mark.anyio
async def test_current_loop_differs_in_a_worker_threads_own_run(
    anyio_backend: tuple[str, dict[str, Any]],
) -> None:
    """A loop running in another thread has a handle of its own, not current
    in this one."""
    handle = current_loop()

    def elsewhere() -> EventLoop:
        async def body() -> EventLoop:
            return current_loop()

        return run(body, anyio_backend)

    other = await anyio.to_thread.run_sync(elsewhere)
    assert other is not handle
    assert type(other) is type(handle)
    assert not other.is_current()
    assert not other.in_own_thread()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_handle_outliving_its_loop_schedules_nothing(
    backend: tuple[str, dict[str, Any]],
) -> None:
    """Once its loop or run has finished, run_soon returns False and nothing
    runs, also once the loop is collected."""
    called: list[int] = []

    async def body() -> EventLoop:
        return current_loop()

    handle = run(body, backend)
    assert not handle.is_current()
    assert handle.run_soon(called.append, 1) is False
    assert called == []
    gc.collect()
    assert handle.run_soon(called.append, 2) is False
    assert called == []


def test_the_asyncio_backend_never_imports_trio() -> None:
    """Importing wool_pooling and running it on asyncio leaves trio unimported."""
    code = textwrap.dedent(
        """
        import asyncio, sys
        import wool_pooling
        from wool_pooling._core.backend import current_loop

        async def main():
            return current_loop().backend

        assert asyncio.run(main()) == "asyncio"
        print("trio" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_current_loop_outside_any_loop_raises_with_trio_unimportable() -> None:
    """With trio marked unimportable (``sys.modules["trio"] = None``, as where
    it is not installed), current_loop outside a loop still raises
    RuntimeError, not ImportError."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["trio"] = None
        from wool_pooling._core.backend import current_loop
        try:
            current_loop()
        except RuntimeError as error:
            print(type(error).__name__)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "RuntimeError"


@pytest.mark.anyio
async def test_until_waits_is_offered_on_asyncios_own_loops_only(
    anyio_backend: tuple[str, dict[str, Any]],
) -> None:
    """Telling a checkpoint from a wait costs less than a task's step on
    asyncio's own loops only: uvloop and trio have no ``until_waits``."""
    handle = current_loop()
    own = anyio_backend[0] == "asyncio" and isinstance(
        asyncio.get_running_loop(), asyncio.BaseEventLoop
    )
    assert (handle.until_waits is not None) is own


@asyncio_only
@pytest.mark.anyio
async def test_until_waits_calls_on_wait_for_a_wait_that_may_last_only() -> None:
    """A pull through asyncio's ``until_waits`` wrapper returns or raises
    what the awaitable does, and whether it yielded; ``on_wait`` runs before
    a yield on a future and before a second bare yield, never for one bare
    yield or none."""
    calls: list[str] = []
    stage = ["start"]

    def on_wait() -> None:
        calls.append(stage[0])

    async def at_once() -> str:
        return "ready"

    async def checkpoints(count: int) -> int:
        for index in range(count):
            stage[0] = f"checkpoint {index + 1}"
            await asyncio.sleep(0)
        return count

    async def fails() -> None:
        await asyncio.sleep(0)
        raise LookupError("from the source")

    assert await _until_waits(at_once(), on_wait) == ("ready", False)
    assert calls == []
    assert await _until_waits(checkpoints(1), on_wait) == (1, True)
    assert calls == []
    assert await _until_waits(checkpoints(2), on_wait) == (2, True)
    assert calls == ["checkpoint 2"]
    calls.clear()
    with pytest.raises(LookupError, match="from the source"):
        await _until_waits(fails(), on_wait)
    assert calls == []

    event = asyncio.Event()

    async def waits() -> str:
        stage[0] = "waiting"
        await event.wait()
        return "set"

    async def set_later() -> None:
        await asyncio.sleep(0)
        assert calls == ["waiting"]  # called before the wait, not after
        event.set()

    setter = asyncio.ensure_future(set_later())
    assert await _until_waits(waits(), on_wait) == ("set", True)
    await setter
    assert calls == ["waiting"]

    calls.clear()
    cleaned: list[bool] = []

    async def cancelled() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(True)

    task = asyncio.ensure_future(_until_waits(cancelled(), on_wait))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]


def test_until_waits_hands_a_sent_value_and_a_thrown_error_to_the_awaitable() -> None:
    """What a task sends into asyncio's ``until_waits`` wrapper, a value or an
    error, reaches the awaitable's step unchanged; each such step counts as a
    wait that may last, and what the awaitable yields or returns comes back
    unchanged."""
    waits: list[int] = []
    received: list[object] = []

    class Steps:
        def __await__(self) -> Generator[str, object, str]:
            received.append((yield "first"))
            for _ in range(3):
                try:
                    yield "next"
                except LookupError as error:
                    received.append(error)
            return "done"

    steps = _until_waits(Steps(), lambda: waits.append(len(waits)))
    assert next(steps) == "first"
    assert steps.send(42) == "next"
    assert received == [42]
    assert steps.throw(LookupError("first")) == "next"
    assert steps.throw(LookupError("with a value")) == "next"
    instance = LookupError("an instance")
    with pytest.raises(StopIteration) as stopped:
        steps.throw(instance)
    assert stopped.value.value == ("done", True)
    assert received[0] == 42
    assert [type(error) for error in received[1:]] == [LookupError] * 3
    assert [str(error) for error in received[2:]] == ["with a value", "an instance"]
    assert waits == [0, 1, 2, 3]
