"""The one package that names asyncio or trio: :class:`EventLoop`, for tasks
that outlive their caller (no task group fits them) and wake-ups from any
thread; ``_trio`` is imported only once trio is."""

from __future__ import annotations

import asyncio
import sys
import weakref
from typing import Any

from ._asyncio import AsyncioLoop
from ._base import EventLoop
from ._base import Interruptible
from ._base import Waiters
from ._base import ready

__all__ = ["EventLoop", "Interruptible", "Waiters", "current_loop", "ready"]

#: The handle of each live asyncio loop and trio run (by its token).
_handles: weakref.WeakKeyDictionary[object, EventLoop] = weakref.WeakKeyDictionary()


def current_loop() -> EventLoop:
    """Return the handle of the event loop running in this thread.

    :raises RuntimeError: if no asyncio loop or trio run is active here.
    """
    make: type[EventLoop] = AsyncioLoop
    key: Any
    try:
        key = asyncio.get_running_loop()
    except RuntimeError:
        if sys.modules.get("trio") is None:
            raise RuntimeError(_NO_LOOP) from None
        from ._trio import TrioLoop

        try:
            key, make = TrioLoop.running(), TrioLoop
        except RuntimeError:
            raise RuntimeError(_NO_LOOP) from None
    handle = _handles.get(key)
    if handle is None:
        handle = _handles[key] = make(key)
    return handle


_NO_LOOP = "no asyncio event loop or trio run is active in this thread"
