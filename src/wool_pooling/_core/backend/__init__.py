"""The one package that names asyncio or trio: tasks, waiters and threads.

A fan-out's pump outlives whichever consumer asked first, timers outlive
their caller, and a consumer dropped without ``aclose()`` is released from
a garbage-collection callback: no task group fits these. :class:`EventLoop`
is that seam, over the backends' public APIs; every task it starts is owned
by the object that started it. ``_base`` holds the seam; ``_asyncio`` and
``_trio`` a backend each (``_trio`` imported only once trio is, so an
asyncio-only program never imports trio).
"""

from __future__ import annotations

import asyncio
import sys
import weakref

from ._asyncio import AsyncioLoop
from ._base import EventLoop
from ._base import Waiters
from ._base import ready

__all__ = ["EventLoop", "Waiters", "current_loop", "ready"]

#: The handle of each live asyncio loop.
_asyncio_handles: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncioLoop] = (
    weakref.WeakKeyDictionary()
)


def current_loop() -> EventLoop:
    """Return the handle of the event loop running in this thread (the same
    one for as long as the loop lives).

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
    if sys.modules.get("trio") is not None:  # a trio run imported it
        from ._trio import current_trio_loop

        if (trio_handle := current_trio_loop()) is not None:
            return trio_handle
    raise RuntimeError("no asyncio event loop or trio run is active in this thread")
