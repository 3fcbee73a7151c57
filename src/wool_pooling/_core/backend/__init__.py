"""The one package that names asyncio or trio: tasks, waiters and threads.

Structured concurrency has no place for a task that belongs to no task group,
nor for a call into the loop from a garbage-collection callback. This library
needs both, in a few narrow places: the task that iterates a fan-out's source
for the source's whole life (it must outlive whichever consumer asked first),
ttl and settle timers, and the release of a consumer abandoned without
``aclose()``. :class:`EventLoop` is that seam, written with the backends'
public APIs only; every task it starts is owned and bounded by the object
that started it.

One module per idea:

- ``_base``: the abstract :class:`EventLoop` and the protocols it hands out,
  :class:`Waiters` and :class:`Interruptible`;
- ``_asyncio``: ``AsyncioLoop``, for asyncio (uvloop included);
- ``_trio``: ``TrioLoop``, for trio. trio is optional: that module, which
  imports it, is imported only by :func:`current_loop`, the first time it
  finds no asyncio loop running while trio is imported (a trio run needs
  it), so an asyncio-only program never imports trio.
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from collections.abc import Callable

from ._asyncio import AsyncioLoop
from ._base import EventLoop
from ._base import Interruptible
from ._base import Waiters
from ._base import ready

__all__ = ["EventLoop", "Interruptible", "Waiters", "current_loop", "ready"]


#: The handle of each live asyncio loop. Here, not in ``_asyncio``, so that
#: ``current_loop`` reads it as one of its module's own names: CPython calls a
#: method of an imported name without its method-call fast path.
_asyncio_handles: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncioLoop] = (
    weakref.WeakKeyDictionary()
)
#: ``_trio.current_trio_loop``, once :func:`trio_finder` has imported it.
_find_trio_loop: Callable[[], EventLoop | None] | None = None


def current_loop() -> EventLoop:
    """Return the handle of the event loop running in this thread.

    The same handle for as long as the loop or run lives.

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
    find = _find_trio_loop or trio_finder()
    if find is None or (trio_handle := find()) is None:
        raise RuntimeError("no asyncio event loop or trio run is active in this thread")
    return trio_handle


def trio_finder() -> Callable[[], EventLoop | None] | None:
    """What finds the active trio run's handle; ``None`` until trio is
    imported (a trio run needs it). Imports the trio backend the first time,
    then keeps it: an import statement per call would cost more than the
    lookup itself."""
    global _find_trio_loop
    if sys.modules.get("trio") is None:  # None: marked unimportable
        return None
    from ._trio import current_trio_loop

    _find_trio_loop = current_trio_loop
    return current_trio_loop
