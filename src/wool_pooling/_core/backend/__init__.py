"""The one module that names asyncio or trio: tasks, waiters and threads.

Structured concurrency has no place for a task that belongs to no task group,
nor for a call into the loop from a garbage-collection callback. This library
needs both, in a few narrow places: the task that iterates a fan-out's source
for the source's whole life (it must outlive whichever consumer asked first),
ttl and settle timers, and the release of a consumer abandoned without
``aclose()``. :class:`EventLoop` is that seam, one subclass per backend
(:class:`AsyncioLoop`, uvloop included, and :class:`TrioLoop`), written with
their public APIs only; every task it starts is owned and bounded by the
object that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import sys
import threading
import types
import weakref
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import ClassVar
from typing import Protocol
from typing import final

import anyio

__all__ = ["EventLoop", "Interruptible", "Waiters", "current_loop", "ready"]

logger = logging.getLogger("wool_pooling")

_asyncio_handles: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventLoop] = (
    weakref.WeakKeyDictionary()
)
_trio_handles: weakref.WeakKeyDictionary[Any, EventLoop] = weakref.WeakKeyDictionary()
#: Background asyncio tasks, held until done (the loop holds tasks weakly).
_running: set[asyncio.Task[Any]] = set()


class Waiters(Protocol):
    """Tasks waiting for one thing to happen, woken all at once: a one-shot
    event. A wait that starts after :meth:`wake` returns at once, so a wake
    that lands anywhere (a garbage-collection callback in the middle of a
    wait's own setup, say) is never lost."""

    def wait(self, here: object = None) -> Awaitable[None]:
        """Register the calling task, and return what it awaits, at once,
        until :meth:`wake` is called; cancellable. A wait given up (by
        cancellation) is :meth:`withdraw`-n. ``here``, if given, is what
        :meth:`EventLoop.here` returned in the calling task (the backend
        then need not look the task up again)."""
        ...

    def withdraw(self, waiting: Awaitable[None]) -> None:
        """Forget ``waiting``, given up before :meth:`wake`."""
        ...

    def wake(self) -> None:
        """Wake every task waiting, now and later."""
        ...


class Interruptible(Protocol):
    """A region of one task's code (``with region:``) that another task can
    :meth:`cancel`, once, as a cancellation of that task would: asyncio, one
    :exc:`asyncio.CancelledError` at the current await; trio, the region is
    a :class:`trio.CancelScope`. The region then exits without raising that
    cancellation; one that comes from elsewhere goes through."""

    def __enter__(self) -> object: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> bool | None: ...

    def cancel(self) -> None: ...


class EventLoop:
    """A handle on one running asyncio loop or trio run.

    Holds the loop weakly: a handle outliving its loop reports that the loop
    is gone instead of keeping it alive.
    """

    __slots__ = ("__weakref__", "_loop_ref", "here", "thread")

    #: ``"asyncio"`` or ``"trio"``.
    backend: ClassVar[str]
    #: The thread the loop runs in.
    thread: int
    #: The backend's own (cheapest) call for where the caller runs, raising
    #: :exc:`RuntimeError` outside any loop: asyncio, the running loop; trio,
    #: the current task, which belongs to one run for its whole life. So a
    #: caller that saw this loop current and the same value since is still
    #: in it: the per-wait check.
    here: Callable[[], object]

    def __init__(self, loop: object) -> None:
        self.thread = threading.get_ident()
        self._loop_ref = weakref.ref(loop)

    def current_task(self) -> object:
        """The calling task, if the caller runs in a task of this backend.

        :raises RuntimeError: if it does not.
        """
        raise NotImplementedError

    def is_current(self) -> bool:
        """Whether this is the loop running in the calling thread."""
        raise NotImplementedError

    def check_current(self, what: str) -> None:
        """Raise unless this is the loop running in the calling thread.

        :raises RuntimeError: naming ``what``, bound to this loop.
        """
        if not self.is_current():
            raise RuntimeError(
                f"{what} is bound to the event loop that first used it ({self!r}) "
                "and cannot be used from another one"
            )

    def in_own_thread(self) -> bool:
        """Whether the caller runs in the loop's thread."""
        return threading.get_ident() == self.thread

    def waiters(self) -> Waiters:
        """A new, empty set of waiters for this loop."""
        raise NotImplementedError

    def interruptible(self) -> Interruptible:
        """A new region that :meth:`Interruptible.cancel` can cut short."""
        raise NotImplementedError

    def spawn(
        self,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> None:
        """Start ``fn(*args)`` as a background task; call from the loop's thread.

        The task runs in ``context``, by default a copy of the caller's. An
        exception other than cancellation escaping ``fn`` is logged, never
        propagated: on trio the task is a system task, which must not raise.
        """
        raise NotImplementedError

    def run_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        """Schedule ``fn(*args)`` on the loop; safe from any thread and from
        garbage-collection callbacks.

        :returns: ``False`` if the loop has finished and nothing was scheduled.
        """
        raise NotImplementedError

    def _state(self) -> str:
        return "GONE" if self._loop_ref() is None else "RUNNING"

    def __repr__(self) -> str:
        return f"<EventLoop [{self.backend}, {self._state()}]>"


# -- asyncio (uvloop included) ------------------------------------------------


@final
class AsyncioLoop(EventLoop):
    """:class:`EventLoop` for an asyncio loop."""

    __slots__ = ()
    backend = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.here = asyncio.get_running_loop

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop_ref()
        if loop is None:
            raise RuntimeError("the event loop is gone")
        assert isinstance(loop, asyncio.AbstractEventLoop)
        return loop

    def is_current(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop_ref()
        except RuntimeError:
            return False

    def current_task(self) -> object:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("not in an asyncio task")
        return task

    def waiters(self) -> Waiters:
        return _FutureWaiters(self._loop())

    def interruptible(self) -> Interruptible:
        return _TaskInterruptible()

    def spawn(
        self,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> None:
        if context is None:
            context = contextvars.copy_context()
        task = self._loop().create_task(_guarded(fn, *args), context=context)
        if not task.done():
            _running.add(task)
            task.add_done_callback(_running.discard)

    def run_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        loop = self._loop_ref()
        if loop is None:
            return False
        assert isinstance(loop, asyncio.AbstractEventLoop)
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def _state(self) -> str:
        loop = self._loop_ref()
        if isinstance(loop, asyncio.AbstractEventLoop) and loop.is_closed():
            return "CLOSED"
        return super()._state()


@final
class _FutureWaiters:
    """asyncio: one future per waiter, awaited directly."""

    __slots__ = ("_futures", "_loop", "_woken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._futures: list[asyncio.Future[None]] = []
        self._woken = False

    def wait(self, here: object = None) -> Awaitable[None]:
        if self._woken:
            return ready()
        future = self._loop.create_future()
        self._futures.append(future)
        return future

    def withdraw(self, waiting: Awaitable[None]) -> None:
        with contextlib.suppress(ValueError):  # woken meanwhile
            self._futures.remove(waiting)  # pyright: ignore[reportArgumentType]

    def wake(self) -> None:
        self._woken = True
        futures, self._futures = self._futures, []
        for future in futures:
            if not future.done():
                future.set_result(None)


@final
class _TaskInterruptible:
    """asyncio: :meth:`cancel` cancels the task once; leaving the region
    takes that one cancellation back (:meth:`asyncio.Task.uncancel`)."""

    __slots__ = ("_inside", "_interrupted", "_task")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._inside = False
        self._interrupted = False

    def __enter__(self) -> object:
        self._task = asyncio.current_task()
        self._inside = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> bool:
        self._inside = False
        task = self._task
        self._task = None
        if not self._interrupted or task is None:
            return False
        # One cancel() was ours: take it back. A cancellation still counted
        # after that came from elsewhere and goes through.
        if task.uncancel() > 0:
            return False
        return exc_type is not None and issubclass(exc_type, asyncio.CancelledError)

    def cancel(self) -> None:
        if self._interrupted or not self._inside:
            return
        task = self._task
        if task is None or task is asyncio.current_task():
            return  # from inside the region: it sees what it waits for itself
        self._interrupted = True
        task.cancel()


async def ready() -> None:
    """A wait that is over before it starts."""


async def _guarded(fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    try:
        await fn(*args)
    except anyio.get_cancelled_exc_class():
        raise
    except BaseException:
        logger.exception("unexpected error in a wool_pooling background task")


# -- trio -----------------------------------------------------------------------


@final
class TrioLoop(EventLoop):
    """:class:`EventLoop` for a trio run."""

    __slots__ = ("_trio",)
    backend = "trio"

    def __init__(self, token: object) -> None:
        super().__init__(token)
        self._trio: Any = sys.modules["trio"]
        self.here = self._trio.lowlevel.current_task

    def is_current(self) -> bool:
        try:
            return self._trio.lowlevel.current_trio_token() is self._loop_ref()
        except RuntimeError:
            return False

    def current_task(self) -> object:
        return self._trio.lowlevel.current_task()

    def waiters(self) -> Waiters:
        return _TrioWaiters(self._trio.lowlevel)

    def interruptible(self) -> Interruptible:
        return self._trio.CancelScope()

    def spawn(
        self,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> None:
        if context is None:
            context = contextvars.copy_context()
        self._trio.lowlevel.spawn_system_task(_guarded, fn, *args, context=context)

    def run_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        token: Any = self._loop_ref()
        if token is None:
            return False
        try:
            token.run_sync_soon(fn, *args)
        except RuntimeError:  # trio.RunFinishedError
            return False
        return True


@final
class _TrioWaiters:
    """trio: the waiting tasks, parked and rescheduled with trio's public
    low-level API (what :class:`trio.lowlevel.ParkingLot` does, without its
    ordering and re-parking machinery, which a one-shot wake never needs)."""

    __slots__ = ("_lowlevel", "_tasks", "_woken")

    def __init__(self, lowlevel: Any) -> None:
        self._lowlevel = lowlevel
        self._tasks: dict[Any, None] = {}
        self._woken = False

    def wait(self, here: object = None) -> Awaitable[None]:
        if self._woken:
            return ready()
        lowlevel = self._lowlevel
        task = here if here is not None else lowlevel.current_task()
        tasks = self._tasks
        tasks[task] = None

        def abort(_: object) -> Any:
            tasks.pop(task, None)
            return lowlevel.Abort.SUCCEEDED

        return lowlevel.wait_task_rescheduled(abort)

    def withdraw(self, waiting: Awaitable[None]) -> None:
        pass  # the abort function has forgotten the task

    def wake(self) -> None:
        self._woken = True
        tasks = self._tasks
        if tasks:
            self._tasks = {}
            reschedule = self._lowlevel.reschedule
            for task in tasks:
                reschedule(task)


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
            handle = _asyncio_handles[loop] = AsyncioLoop(loop)
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
                handle = _trio_handles[token] = TrioLoop(token)
            return handle
    raise RuntimeError("no asyncio event loop or trio run is active in this thread")
