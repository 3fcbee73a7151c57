"""What every backend provides: :class:`EventLoop` and the types it hands out.

:class:`EventLoop` is abstract: a backend that leaves one of its methods out
cannot be instantiated. :class:`Waiters` and :class:`Interruptible` are
protocols, so a backend may hand out one of its own types as is (trio's
:class:`trio.CancelScope` is an :class:`Interruptible`).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import types
from abc import ABC
from abc import abstractmethod
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import ClassVar
from typing import Protocol

import anyio

logger = logging.getLogger("wool_pooling")


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
        /,
    ) -> bool | None: ...

    def cancel(self) -> None: ...


class Suspensions(Protocol):
    """What :attr:`EventLoop.until_waits` returns: reused for one pull after
    another."""

    #: Whether the last pull awaited through it yielded to the loop at all.
    suspended: bool

    def pull(self, awaitable: Awaitable[Any]) -> Awaitable[Any]:
        """What to await for ``awaitable``: its result, its error."""
        ...


class EventLoop(ABC):
    """A handle on one running asyncio loop or trio run.

    Holds the loop weakly: a handle outliving its loop reports that the loop
    is gone instead of keeping it alive.
    """

    __slots__ = ("__weakref__", "here", "next_pass", "thread", "until_waits")

    #: ``"asyncio"`` or ``"trio"``.
    backend: ClassVar[str]
    #: The thread the loop runs in.
    thread: int
    #: The backend's own (cheapest) call for where the caller runs, raising
    #: :exc:`RuntimeError` outside any loop: asyncio, the running loop; trio,
    #: the current task, which belongs to one run for its whole life. So a
    #: caller that saw this loop current and the same value since is still
    #: in it: the per-wait check. An attribute, not a method: calling it
    #: binds nothing.
    here: Callable[[], object]
    #: What a task awaits to let every other task ready to run have its step
    #: first, the backend's cheapest way: asyncio, a bare yield (what
    #: ``asyncio.sleep(0)`` does); trio, :func:`trio.lowlevel.checkpoint`.
    next_pass: Callable[[], Awaitable[None]]
    #: ``until_waits(on_wait)``: a :class:`Suspensions`, whose ``pull(a)``
    #: awaits ``a`` and calls ``on_wait()`` (synchronously) as soon as ``a``
    #: suspends in a way that may last: on something to happen, or past one
    #: bare checkpoint. ``None`` where telling them apart costs more than a
    #: task's step (uvloop), or where the backend cannot tell them (trio).
    until_waits: Callable[[Callable[[], object]], Suspensions] | None

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    @abstractmethod
    def current_task(self) -> object:
        """The calling task, if the caller runs in a task of this backend.

        :raises RuntimeError: if it does not.
        """

    @abstractmethod
    def is_current(self) -> bool:
        """Whether this is the loop running in the calling thread."""

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

    @abstractmethod
    def waiters(self) -> Waiters:
        """A new, empty set of waiters for this loop."""

    @abstractmethod
    def interruptible(self) -> Interruptible:
        """A new region that :meth:`Interruptible.cancel` can cut short."""

    @abstractmethod
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

    @abstractmethod
    def run_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        """Schedule ``fn(*args)`` on the loop; safe from any thread and from
        garbage-collection callbacks.

        :returns: ``False`` if the loop has finished and nothing was scheduled.
        """

    @abstractmethod
    def state(self) -> str:
        """``"RUNNING"``, ``"CLOSED"`` (asyncio: closed, not yet collected)
        or ``"GONE"`` (the loop or run has been collected). A finished trio
        run reads ``"RUNNING"`` until its token is collected: trio tells
        whether a run has finished only by refusing :meth:`run_soon`."""

    def __repr__(self) -> str:
        return f"<EventLoop [{self.backend}, {self.state()}]>"


async def ready() -> None:
    """A wait that is over before it starts."""


async def guarded(fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Await ``fn(*args)``, logging any exception but cancellation instead of
    raising it: what a background task runs."""
    try:
        await fn(*args)
    except anyio.get_cancelled_exc_class():
        raise
    except BaseException:
        logger.exception("unexpected error in a wool_pooling background task")
