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
  imports it, is imported only by :func:`current_loop` once trio is imported
  and a trio run is active in the calling thread.
"""

from __future__ import annotations

import sys

from ._asyncio import current_asyncio_loop
from ._base import EventLoop
from ._base import Interruptible
from ._base import Waiters
from ._base import ready

__all__ = ["EventLoop", "Interruptible", "Waiters", "current_loop", "ready"]


def current_loop() -> EventLoop:
    """Return the handle of the event loop running in this thread.

    The same handle for as long as the loop or run lives.

    :raises RuntimeError: if no asyncio loop or trio run is active here.
    """
    handle: EventLoop | None = current_asyncio_loop()
    if handle is not None:
        return handle
    if "trio" in sys.modules:  # a trio run needs trio imported
        from ._trio import current_trio_loop

        handle = current_trio_loop()
        if handle is not None:
            return handle
    raise RuntimeError("no asyncio event loop or trio run is active in this thread")
