"""Async generators that ``async for`` can drop without the event loop's help.

A consumer's ``__anext__`` is a coroutine, and a coroutine is created for
every call; an async generator is created once and each step resumes it in
C. So a consumer's ``__aiter__`` returns an async generator that reads
buffered items itself and awaits ``__anext__`` only when it must wait: a
buffered item then costs what a step of ``asyncstdlib.tee`` costs.

An async generator left unfinished (``break`` out of ``async for``) would
normally be handed to the event loop's finaliser hook when collected: trio
warns (``ResourceWarning``) and schedules its ``aclose()``, asyncio schedules
it as a task. These generators hold nothing that needs an ``await`` to
release, so :func:`unhooked` binds them to no hooks: collected unfinished,
they are closed on the spot, synchronously, like a plain generator.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator
from typing import TypeVar

__all__ = ["unhooked"]

T = TypeVar("T")


def unhooked(generator: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """Bind ``generator`` (not yet started) to no async-generator hooks.

    The hooks in force are bound to a generator at its first ``__anext__()``
    call, not when that step runs: the call is made here, with the hooks
    unset, and its (unstarted) step discarded.
    """
    hooks = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(firstiter=None, finalizer=None)
    try:
        step = generator.__anext__()
        del step  # never run: the generator stays unstarted
    finally:
        sys.set_asyncgen_hooks(*hooks)
    return generator
