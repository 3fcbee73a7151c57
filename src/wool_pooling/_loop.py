"""The running event loop, seen through the two operations anyio leaves out.

Structured concurrency has no place for a task that belongs to no task group,
nor for a call into the loop from a garbage-collection callback. This library
needs both, in a few narrow places: the fan-out's pump (which must outlive the
cancellation of whichever consumer asked for the pull), ttl timers, and the
finalisation of a subscription consumer that was abandoned without
``aclose()``. :class:`EventLoop` provides them for asyncio and trio; every
task it starts is owned and bounded by the object that started it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import weakref
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import final

import anyio

__all__ = ["EventLoop", "current_loop"]

logger = logging.getLogger("wool_pooling")

_asyncio_handles: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventLoop] = (
    weakref.WeakKeyDictionary()
)
_trio_handles: weakref.WeakKeyDictionary[Any, EventLoop] = weakref.WeakKeyDictionary()
_running_detached: set[asyncio.Task[None]] = set()


@final
class EventLoop:
    """A handle on one running asyncio loop or trio run.

    Holds the loop weakly: a handle outliving its loop reports that the loop
    is gone instead of keeping it alive.
    """

    __slots__ = ("__weakref__", "_loop_ref", "backend")

    backend: str

    def __init__(self, backend: str, loop: object) -> None:
        self.backend = backend
        self._loop_ref = weakref.ref(loop)

    @property
    def identity(self) -> object | None:
        """The loop object (asyncio) or run token (trio), or ``None`` if gone."""
        return self._loop_ref()

    def is_current(self) -> bool:
        """Whether this is the loop running in the calling thread."""
        try:
            return current_loop() is self
        except RuntimeError:
            return False

    def spawn(
        self,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> None:
        """Start ``fn(*args)`` as a task of its own; call from the loop's thread.

        The task runs in ``context``, by default a copy of the caller's. An
        exception other than cancellation escaping ``fn`` is logged, never
        propagated: on trio the task is a system task, which must not raise.
        """
        loop = self._loop_ref()
        if loop is None:
            raise RuntimeError("the event loop is gone")
        if context is None:
            context = contextvars.copy_context()
        if self.backend == "asyncio":
            assert isinstance(loop, asyncio.AbstractEventLoop)
            task = loop.create_task(_guarded(fn, *args), context=context)
            _running_detached.add(task)
            task.add_done_callback(_running_detached.discard)
        else:
            import trio

            trio.lowlevel.spawn_system_task(_guarded, fn, *args, context=context)

    def run_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        """Schedule ``fn(*args)`` on the loop from any thread.

        :returns: ``False`` if the loop has finished and nothing was scheduled.
        """
        loop = self._loop_ref()
        if loop is None:
            return False
        try:
            if self.backend == "asyncio":
                assert isinstance(loop, asyncio.AbstractEventLoop)
                loop.call_soon_threadsafe(fn, *args)
            else:
                loop.run_sync_soon(fn, *args)  # type: ignore[attr-defined]
        except RuntimeError:  # asyncio: loop closed; trio: RunFinishedError
            return False
        return True

    def __repr__(self) -> str:
        state = "RUNNING" if self._loop_ref() is not None else "GONE"
        return f"<EventLoop [{self.backend}, {state}]>"


async def _guarded(fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    try:
        await fn(*args)
    except anyio.get_cancelled_exc_class():
        raise
    except BaseException:
        logger.exception("unexpected error in a wool_pooling background task")


def current_loop() -> EventLoop:
    """Return the handle of the event loop running in this thread.

    :raises RuntimeError: if no asyncio loop or trio run is active here.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        handle = _asyncio_handles.get(loop)
        if handle is None:
            handle = _asyncio_handles[loop] = EventLoop("asyncio", loop)
        return handle
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            handle = _trio_handles.get(token)
            if handle is None:
                handle = _trio_handles[token] = EventLoop("trio", token)
            return handle
    raise RuntimeError("no asyncio event loop or trio run is active in this thread")
