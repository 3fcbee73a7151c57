""":class:`EventLoop` for trio, imported only once trio is (see ``current_loop``)."""

from __future__ import annotations

from collections.abc import Awaitable
from collections.abc import Callable
from contextvars import Context
from contextvars import copy_context
from typing import Any
from typing import final

import attrs
import trio

from ._base import AsyncFn
from ._base import EventLoop
from ._base import guarded


@final
@attrs.define(eq=False)
class _TrioWaiters:
    """trio: a :class:`trio.Event` (a wait cancelled leaves its parking lot)."""

    _event: trio.Event = attrs.field(factory=trio.Event)

    def wait(self) -> Awaitable[None]:
        return self._event.wait()

    def withdraw(self, waiting: Awaitable[None]) -> None:
        pass

    def wake(self) -> None:
        self._event.set()


@final
class TrioLoop(EventLoop):
    """:class:`EventLoop` for a trio run."""

    __slots__ = ()
    backend = "trio"
    current_task = staticmethod(trio.lowlevel.current_task)
    running = staticmethod(trio.lowlevel.current_trio_token)
    next_pass = staticmethod(trio.lowlevel.checkpoint)
    waiters = staticmethod(_TrioWaiters)
    interruptible = staticmethod(trio.CancelScope)

    def spawn(self, fn: AsyncFn, *args: Any, context: Context | None = None) -> None:
        if context is None:
            context = copy_context()
        trio.lowlevel.spawn_system_task(guarded, fn, *args, context=context)

    def _call_soon(self, native: Any, fn: Callable[..., object], *args: Any) -> None:
        native.run_sync_soon(fn, *args)
