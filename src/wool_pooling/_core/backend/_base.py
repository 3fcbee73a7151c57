"""What every backend provides: :class:`EventLoop` and the protocols it hands out."""

from __future__ import annotations

import logging
import threading
import weakref
from abc import ABC
from abc import abstractmethod
from collections.abc import Awaitable
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import Context
from typing import Any
from typing import ClassVar
from typing import Protocol

import anyio

logger = logging.getLogger("wool_pooling")

#: A function whose call returns what a task awaits.
AsyncFn = Callable[..., Awaitable[Any]]


class Waiters(Protocol):
    """A one-shot event: a wait that starts after :meth:`wake` returns at once."""

    def wait(self) -> Awaitable[None]:
        """What the calling task awaits, in its own frame, until :meth:`wake`."""
        ...

    def withdraw(self, waiting: Awaitable[None]) -> None:
        """Forget ``waiting``, cancelled before :meth:`wake`."""

    def wake(self) -> None:
        """Wake every task waiting, now and later."""


class Interruptible(AbstractContextManager[object, bool | None], Protocol):
    """A region of one task that another can :meth:`cancel` once; the region
    takes that cancellation back and lets others through."""

    def cancel(self) -> None: ...


class EventLoop(ABC):
    """A handle on one running asyncio loop or trio run, held weakly."""

    __slots__ = ("__weakref__", "_native", "thread", "until_waits")

    #: ``"asyncio"`` or ``"trio"``.
    backend: ClassVar[str]
    #: The thread the loop runs in.
    thread: int
    #: The calling task.
    current_task: ClassVar[staticmethod[[], object]]
    #: The running asyncio loop or trio token; raises :exc:`RuntimeError` if none.
    running: ClassVar[staticmethod[[], object]]
    #: What a task awaits to let every task ready to run have its step first.
    next_pass: ClassVar[staticmethod[[], Awaitable[None]]]
    #: A new, empty set of waiters, made in a task or callback of the loop.
    waiters: ClassVar[staticmethod[[], Waiters]]
    #: A new region that :meth:`Interruptible.cancel` can cut short.
    interruptible: ClassVar[staticmethod[[], Interruptible]]
    #: What the pump awaits a pull through, calling ``on_wait()`` once it may
    #: wait long; ``None`` where that costs more than a step (uvloop, trio).
    until_waits: (
        Callable[[Awaitable[Any], Callable[[], object]], Awaitable[tuple[Any, bool]]]
        | None
    )

    def __init__(self, native: object) -> None:
        self._native: weakref.ref[Any] = weakref.ref(native)  # what running gives
        self.thread = threading.get_ident()
        self.until_waits = None

    def is_current(self) -> bool:
        """Whether this is the loop running in the calling thread."""
        try:
            return self.running() is self._native()
        except RuntimeError:
            return False

    def check_current(self, what: str) -> None:
        """:raises RuntimeError: naming ``what``, unless this loop is current."""
        if not self.is_current():
            raise RuntimeError(
                f"{what} is bound to the event loop that first used it ({self!r}) "
                "and cannot be used from another one"
            )

    def in_own_thread(self) -> bool:
        """Whether the caller runs in the loop's thread."""
        return threading.get_ident() == self.thread

    @abstractmethod
    def spawn(self, fn: AsyncFn, *args: Any, context: Context | None = None) -> None:
        """Start ``fn(*args)`` as a background task, from a task or callback of
        the loop (in ``context``, by default a copy of the caller's); its error
        is logged."""

    def run_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        """Schedule ``fn(*args)`` from any thread; ``False`` once the loop ended."""
        native = self._native()
        if native is None:
            return False
        try:
            self._call_soon(native, fn, *args)
        except RuntimeError:  # the loop is closed, or the run finished
            return False
        return True

    @abstractmethod
    def _call_soon(self, native: Any, fn: Callable[..., object], *args: Any) -> None:
        """Schedule ``fn(*args)`` on ``native``, the loop or token, thread-safely."""

    def __repr__(self) -> str:
        return f"<EventLoop [{self.backend}]>"


async def ready() -> None:
    """A wait that is over before it starts."""


async def guarded(fn: AsyncFn, *args: Any) -> None:
    """Await ``fn(*args)``, logging any exception but cancellation."""
    try:
        await fn(*args)
    except anyio.get_cancelled_exc_class():
        raise
    except BaseException:
        logger.exception("unexpected error in a wool_pooling background task")
