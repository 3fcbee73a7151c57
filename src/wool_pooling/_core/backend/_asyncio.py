""":class:`EventLoop` for asyncio (uvloop and eager task factories included)."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Generator
from contextvars import Context
from typing import Any
from typing import final

import attrs

from ._base import AsyncFn
from ._base import EventLoop
from ._base import guarded
from ._base import ready

#: Background tasks, held until done (the loop holds tasks weakly).
_running: set[asyncio.Task[Any]] = set()


@types.coroutine
def _next_pass() -> Generator[None]:
    """End the task's step; the loop runs it again at its next pass."""
    yield


@types.coroutine
def _until_waits(
    awaitable: Awaitable[Any], on_wait: Callable[[], object]
) -> Generator[Any, Any, tuple[Any, bool]]:
    """:attr:`EventLoop.until_waits` for asyncio's own loops: await
    ``awaitable``, calling ``on_wait()`` before a yield on a future or a
    second yield; return its result and whether it yielded at all."""
    steps = awaitable.__await__()
    suspended = False
    sent: Any = None
    error: BaseException | None = None
    while True:
        try:
            yielded = steps.send(sent) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value, suspended
        finally:
            error = None  # raised on, it would hold this frame, and this frame it
        if yielded is not None or suspended:
            on_wait()
        suspended = True
        try:
            sent = yield yielded
        except BaseException as thrown:  # GeneratorExit included: closes steps
            sent, error = None, thrown


@final
class _FutureWaiters:
    """asyncio: one future per waiter, awaited directly."""

    __slots__ = ("_futures", "_loop", "_woken")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._futures: list[asyncio.Future[None]] = []
        self._woken = False

    def wait(self) -> Awaitable[None]:
        if self._woken:
            return ready()
        future = self._loop.create_future()
        self._futures.append(future)
        return future

    def withdraw(self, waiting: Awaitable[None]) -> None:
        if not self._woken:  # woken, it is out of the list already
            self._futures.remove(waiting)  # pyright: ignore[reportArgumentType]

    def wake(self) -> None:
        self._woken = True
        futures, self._futures = self._futures, []
        for future in futures:
            if not future.done():
                future.set_result(None)


@final
@attrs.define(eq=False)
class _TaskInterruptible:
    """asyncio: :meth:`cancel` cancels the task once; leaving the region
    takes it back (:meth:`asyncio.Task.uncancel`)."""

    _task: asyncio.Task[Any] | None = None
    _interrupted: bool = False

    def __enter__(self) -> object:
        self._task = asyncio.current_task()
        return self

    def __exit__(self, *exc_info: object) -> bool:
        task, self._task = self._task, None
        if not self._interrupted or task is None:
            return False
        # One cancel() was ours; one still counted came from elsewhere.
        return task.uncancel() == 0 and isinstance(exc_info[1], asyncio.CancelledError)

    def cancel(self) -> None:
        if self._interrupted or self._task is None:
            return
        self._interrupted = True
        self._task.cancel()


@final
class AsyncioLoop(EventLoop):
    """:class:`EventLoop` for an asyncio loop."""

    __slots__ = ()
    backend = "asyncio"
    current_task = staticmethod(asyncio.current_task)
    running = staticmethod(asyncio.get_running_loop)
    next_pass = staticmethod(_next_pass)
    waiters = staticmethod(_FutureWaiters)
    interruptible = staticmethod(_TaskInterruptible)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        # A task's step costs more than classifying yields, but on uvloop.
        if isinstance(loop, asyncio.BaseEventLoop):
            self.until_waits = _until_waits

    def spawn(self, fn: AsyncFn, *args: Any, context: Context | None = None) -> None:
        task = asyncio.create_task(guarded(fn, *args), context=context)
        _running.add(task)
        task.add_done_callback(_running.discard)

    def _call_soon(self, native: Any, fn: Callable[..., object], *args: Any) -> None:
        native.call_soon_threadsafe(fn, *args)
