""":class:`EventLoop` for asyncio (uvloop and eager task factories included)."""

from __future__ import annotations

import asyncio
import types
import weakref
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Generator
from contextvars import Context
from typing import Any
from typing import final

from ._base import AsyncFn
from ._base import EventLoop
from ._base import Interruptible
from ._base import guarded

#: Background tasks, held until done (the loop holds tasks weakly).
_running: set[asyncio.Task[Any]] = set()


@types.coroutine
def _next_pass() -> Generator[None]:
    """End the task's step; the loop runs it again at its next pass."""
    yield


@final
class AsyncioLoop(EventLoop):
    """:class:`EventLoop` for an asyncio loop."""

    __slots__ = ("_loop_ref",)
    backend = "asyncio"
    event = asyncio.Event
    next_pass = staticmethod(_next_pass)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop_ref = weakref.ref(loop)
        # A task's step costs more than classifying yields, but on uvloop.
        self.until_waits = (
            _UntilWaits if isinstance(loop, asyncio.BaseEventLoop) else None
        )

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop_ref()
        if loop is None:
            raise RuntimeError("the event loop is gone")
        return loop

    def is_current(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop_ref()
        except RuntimeError:
            return False

    def current_task(self) -> object:
        return asyncio.current_task()

    def interruptible(self) -> Interruptible:
        return _TaskInterruptible()

    def spawn(self, fn: AsyncFn, *args: Any, context: Context | None = None) -> None:
        task = self._loop().create_task(guarded(fn, *args), context=context)
        if not task.done():
            _running.add(task)
            task.add_done_callback(_running.discard)

    def run_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        loop = self._loop_ref()
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed
            return False
        return True


@final
class _UntilWaits(Generator[Any, Any, Any]):
    """:attr:`EventLoop.until_waits` for asyncio's own loops: ``await
    wrapper.pull(awaitable)`` calls ``on_wait()`` before a yield on a future
    or a second bare yield. Reused from pull to pull, for speed."""

    __slots__ = ("_on_wait", "_steps", "suspended")

    def __init__(self, on_wait: Callable[[], object]) -> None:
        self._on_wait = on_wait
        self._steps: Generator[Any, Any, Any] | None = None
        #: Whether the last pull yielded to the loop at all.
        self.suspended = False

    def pull(self, awaitable: Awaitable[Any]) -> _UntilWaits:
        self._steps = awaitable.__await__()
        self.suspended = False
        return self

    def __await__(self) -> Generator[Any, Any, Any]:
        return self

    def __next__(self) -> Any:  # what a task calls
        assert self._steps is not None
        yielded = self._steps.send(None)
        if yielded is not None or self.suspended:
            self._on_wait()
        self.suspended = True
        return yielded

    def send(self, value: Any, /) -> Any:
        if value is None:
            return self.__next__()
        assert self._steps is not None
        yielded = self._steps.send(value)
        self._on_wait()
        self.suspended = True
        return yielded

    def throw(self, error: Any, value: Any = None, traceback: Any = None, /) -> Any:
        if not isinstance(error, BaseException):
            error = error() if value is None else value
        del value, traceback
        assert self._steps is not None
        try:
            yielded = self._steps.throw(error)
        finally:
            del error  # raised on, it would hold this frame, and this frame it
        self._on_wait()
        self.suspended = True
        return yielded

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()


@final
class _TaskInterruptible:
    """asyncio: :meth:`cancel` cancels the task once; leaving the region
    takes it back (:meth:`asyncio.Task.uncancel`)."""

    __slots__ = ("_interrupted", "_task")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._interrupted = False

    def __enter__(self) -> object:
        self._task = asyncio.current_task()
        return self

    def __exit__(self, *exc_info: object) -> bool:
        task = self._task
        self._task = None
        if not self._interrupted or task is None:
            return False
        # One cancel() was ours; one still counted came from elsewhere.
        if task.uncancel() > 0:
            return False
        return isinstance(exc_info[1], asyncio.CancelledError)

    def cancel(self) -> None:
        if self._interrupted or self._task is None:
            return
        self._interrupted = True
        self._task.cancel()
