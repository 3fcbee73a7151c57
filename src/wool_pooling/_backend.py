"""The one module that names asyncio or trio: tasks, waiters and threads.

Structured concurrency has no place for a task that belongs to no task group,
nor for a call into the loop from a garbage-collection callback. This library
needs both, in a few narrow places: the fan-out's pulls (which must outlive
the cancellation of whichever consumer asked for them), ttl and settle
timers, and the release of a consumer abandoned without ``aclose()``.
:class:`EventLoop` provides them for asyncio (uvloop included) and trio, with
their public APIs only; every task it starts is owned and bounded by the
object that started it.

**Where a pull runs.** On asyncio, :meth:`EventLoop.start_pull` starts each
pull as a task of its own. With CPython 3.12+ the task is created with
``eager_start=True`` (what :func:`asyncio.eager_task_factory` does): its
first step runs at once, inside the consumer's call, but *as the new task*
(``asyncio.current_task()`` is the pull's task, and the consumer's
cancellation cannot reach it), so an item the source has ready costs no trip
through the event loop. (``FanoutConsumer.__anext__`` starts that task
itself, with :data:`eager_task`, to spare the calls.) On CPython 3.11 the
task starts at the loop's next pass; setting the environment variable
``WOOL_POOLING_PULLS=task`` before import selects that route on every
interpreter (the test suite runs under both). On trio, where spawning a task
and its cancel scope costs more than a pull, a fan-out runs all its pulls in
one system task, its pump (:attr:`EventLoop.pulls_in_pump`), started by the
first pull and waiting between pulls for the next demand, at a
:meth:`EventLoop.parking`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import sys
import threading
import weakref
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Coroutine
from typing import Any
from typing import Protocol
from typing import final

import anyio

__all__ = [
    "EAGER_PULLS",
    "EventLoop",
    "PullTask",
    "Waiters",
    "current_loop",
    "eager_task",
    "running_task",
    "trio_lowlevel",
]

logger = logging.getLogger("wool_pooling")

#: Whether asyncio pulls start eagerly (CPython 3.12+, unless
#: ``WOOL_POOLING_PULLS=task``).
EAGER_PULLS = (
    sys.version_info >= (3, 12)
    and os.environ.get("WOOL_POOLING_PULLS", "eager") != "task"
)

#: The eager route's parts, named here for the fan-out's per-item fast path
#: (``FanoutConsumer.__anext__``), where a call through
#: :meth:`EventLoop.start_pull` would cost as much as the rest of a pull.
#: (``asyncio.Task``: called with ``eager_start=True``, 3.12+ only.)
eager_task: Callable[..., Any] = asyncio.Task
running_task = asyncio.current_task

_asyncio_handles: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventLoop] = (
    weakref.WeakKeyDictionary()
)
_trio_handles: weakref.WeakKeyDictionary[Any, EventLoop] = weakref.WeakKeyDictionary()
#: ``trio.lowlevel``, once a trio run has been seen (trio is imported only
#: by programs that run it): for the fan-out's per-item wait on trio
#: (``FanoutConsumer.__anext__``), and the waiters here.
trio_lowlevel: Any = None
#: Background asyncio tasks, held until done (the loop holds tasks weakly).
_running: set[asyncio.Task[Any]] = set()


class PullTask(Protocol):
    """What the fan-out keeps of a pull in flight: a way to cancel it."""

    def cancel(self) -> object: ...


class Waiters(Protocol):
    """Tasks waiting for one thing to happen, woken all at once: a one-shot
    event. A wait that starts after :meth:`wake` returns at once, so a wake
    that lands anywhere (a garbage-collection callback in the middle of a
    wait's own setup, say) is never lost."""

    async def wait(self) -> None:
        """Wait until :meth:`wake` is called; cancellable, holds nothing after."""
        ...

    def wake(self) -> None:
        """Wake every task waiting, now and later."""
        ...


@final
class _FutureWaiters:
    """asyncio: one future per waiter, awaited directly."""

    __slots__ = ("_futures", "_loop", "_woken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._futures: list[asyncio.Future[None]] = []
        self._woken = False

    async def wait(self) -> None:
        if self._woken:
            return
        future = self._loop.create_future()
        self._futures.append(future)
        if self._woken:  # woken while the future was being registered
            return
        try:
            await future
        except BaseException:
            if not future.done() or future.cancelled():
                with contextlib.suppress(ValueError):  # woken meanwhile
                    self._futures.remove(future)
            raise

    def wake(self) -> None:
        self._woken = True
        futures, self._futures = self._futures, []
        for future in futures:
            if not future.done():
                future.set_result(None)


@final
class EventLoop:
    """A handle on one running asyncio loop or trio run.

    Holds the loop weakly: a handle outliving its loop reports that the loop
    is gone instead of keeping it alive.
    """

    __slots__ = ("__weakref__", "_loop_ref", "backend", "pulls_in_pump", "thread")

    #: ``"asyncio"`` or ``"trio"``.
    backend: str
    #: Whether a fan-out runs all its pulls in one task, its pump (trio:
    #: spawning a task per pull costs more than the pull), rather than each
    #: in a task of its own (asyncio).
    pulls_in_pump: bool
    #: The thread the loop runs in.
    thread: int

    def __init__(self, backend: str, loop: object) -> None:
        self.backend = backend
        self.pulls_in_pump = backend == "trio"
        self.thread = threading.get_ident()
        self._loop_ref = weakref.ref(loop)

    def _asyncio_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop_ref()
        if loop is None:
            raise RuntimeError("the event loop is gone")
        assert isinstance(loop, asyncio.AbstractEventLoop)
        return loop

    def check_current(self, what: str) -> None:
        """Raise unless this is the loop running in the calling thread.

        :raises RuntimeError: naming ``what``, bound to this loop.
        """
        loop = self._loop_ref()
        try:
            if self.backend == "asyncio":
                current: object = asyncio.get_running_loop()
            else:
                current = sys.modules["trio"].lowlevel.current_trio_token()
        except (RuntimeError, KeyError):
            current = None
        if current is None or current is not loop:
            raise RuntimeError(
                f"{what} is bound to the event loop that first used it ({self!r}) "
                "and cannot be used from another one"
            )

    def in_own_thread(self) -> bool:
        """Whether the caller runs in the loop's thread."""
        return threading.get_ident() == self.thread

    def eager_loop(self) -> asyncio.AbstractEventLoop | None:
        """The asyncio loop, if pulls start eagerly on it (:data:`EAGER_PULLS`);
        ``None`` on trio and on the non-eager route. A caller may then start
        a pull itself, as :meth:`start_pull` does, without the call."""
        if self.backend == "asyncio" and EAGER_PULLS:
            return self._asyncio_loop()
        return None

    def waiters(self) -> Waiters:
        """A new, empty set of waiters for this loop."""
        if self.backend == "asyncio":
            return _FutureWaiters(self._asyncio_loop())
        return _TrioWaiters()

    def parking(self) -> Waiters:
        """trio: a place where one task waits to be woken, again and again
        (unlike :meth:`waiters`, a wake reaches only a task waiting then)."""
        assert self.backend == "trio"
        return _TrioParking()

    def start_pull(
        self,
        run: Callable[[Any], Coroutine[Any, Any, None]],
        arg: object,
        context: contextvars.Context,
    ) -> tuple[PullTask, bool]:
        """Start ``run(arg)`` as a task of its own, in ``context``.

        On asyncio with :data:`EAGER_PULLS` its first step runs before this
        returns (an :class:`asyncio.Task` created with ``eager_start=True``,
        what :func:`asyncio.eager_task_factory` does). ``run`` must not raise
        anything but cancellation.

        :returns: the task, and whether its first step, run inline, asked to
            cancel the calling task (say, by cancelling a cancel scope of the
            caller's): the caller must then let that cancellation through at
            an await of its own, before it returns.
        """
        if self.backend == "asyncio":
            loop = self._asyncio_loop()
            if EAGER_PULLS:
                caller = asyncio.current_task()
                before = caller.cancelling() if caller is not None else 0
                task: asyncio.Task[None] = asyncio.Task(  # pyright: ignore[reportUnknownVariableType]
                    run(arg),
                    loop=loop,
                    context=context,
                    eager_start=True,  # pyright: ignore[reportCallIssue] (3.12+)
                )
                after = caller.cancelling() if caller is not None else 0
                return task, after > before
            return loop.create_task(run(arg), context=context), False
        import trio

        scope = trio.CancelScope()
        trio.lowlevel.spawn_system_task(_scoped, scope, run, arg, context=context)
        return scope, False

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
        if context is None:
            context = contextvars.copy_context()
        if self.backend == "asyncio":
            loop = self._asyncio_loop()
            task = loop.create_task(_guarded(fn, *args), context=context)
            if not task.done():
                _running.add(task)
                task.add_done_callback(_running.discard)
        else:
            import trio

            trio.lowlevel.spawn_system_task(_guarded, fn, *args, context=context)

    def run_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        """Schedule ``fn(*args)`` on the loop; safe from any thread and from
        garbage-collection callbacks.

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
                loop.run_sync_soon(fn, *args)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
        except RuntimeError:  # asyncio: loop closed; trio: RunFinishedError
            return False
        return True

    def __repr__(self) -> str:
        loop = self._loop_ref()
        if loop is None:
            state = "GONE"
        elif isinstance(loop, asyncio.AbstractEventLoop) and loop.is_closed():
            state = "CLOSED"
        else:
            state = "RUNNING"
        return f"<EventLoop [{self.backend}, {state}]>"


@final
class _TrioWaiters:
    """trio: the waiting tasks, parked and rescheduled with trio's public
    low-level API (what :class:`trio.lowlevel.ParkingLot` does, without its
    ordering and re-parking machinery, which a one-shot wake never needs)."""

    __slots__ = ("_tasks", "_woken")

    def __init__(self) -> None:
        self._tasks: dict[Any, None] = {}
        self._woken = False

    async def wait(self) -> None:
        if self._woken:
            return
        task = trio_lowlevel.current_task()
        await trio_lowlevel.wait_task_rescheduled(self.enter(task))

    def enter(self, task: Any) -> Any:
        """Register ``task`` (the caller's) to be woken, and return the abort
        function it then parks with (``await
        trio.lowlevel.wait_task_rescheduled(abort)``): :meth:`wait` without
        a coroutine of its own. Only before :meth:`wake`."""
        tasks = self._tasks
        tasks[task] = None

        def abort(_: object) -> Any:
            tasks.pop(task, None)
            return trio_lowlevel.Abort.SUCCEEDED

        return abort

    def wake(self) -> None:
        self._woken = True
        tasks = self._tasks
        if tasks:
            self._tasks = {}
            reschedule = trio_lowlevel.reschedule
            for task in tasks:
                reschedule(task)


@final
class _TrioParking:
    """trio: where one task waits, again and again, to be woken (a fan-out's
    pump between pulls). :meth:`wake` wakes the task parked there, if any."""

    __slots__ = ("_task",)

    def __init__(self) -> None:
        self._task: Any = None

    async def wait(self) -> None:
        lowlevel = trio_lowlevel
        self._task = lowlevel.current_task()
        await lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: object) -> Any:
        self._task = None
        return trio_lowlevel.Abort.SUCCEEDED

    def wake(self) -> None:
        task = self._task
        if task is not None:
            self._task = None
            trio_lowlevel.reschedule(task)


async def _scoped(
    scope: Any, run: Callable[[Any], Coroutine[Any, Any, None]], arg: object
) -> None:
    with scope:
        await run(arg)


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
            global trio_lowlevel
            trio_lowlevel = trio.lowlevel
            handle = _trio_handles.get(token)
            if handle is None:
                handle = _trio_handles[token] = EventLoop("trio", token)
            return handle
    raise RuntimeError("no asyncio event loop or trio run is active in this thread")
