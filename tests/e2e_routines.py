"""Routines for the end-to-end tests, importable by worker processes.

Worker processes start with ``spawn``, so they unpickle these by reference:
this module must be importable in the worker (``tests/`` is on ``sys.path``,
which ``spawn`` hands down).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator

import wool

from wool_pooling import current_pool

#: Per-token rendezvous of concurrent routines on one worker (worker loop only).
_arrivals: dict[str, tuple[list[int], asyncio.Event]] = {}


@wool.routine
async def add(a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b


@wool.routine
async def worker_pid() -> int:
    """Return the pid of the worker process that ran this routine."""
    return os.getpid()


@wool.routine
async def ticks() -> AsyncGenerator[int, None]:
    """Yield ``0`` at once, then hang until cancelled."""
    yield 0
    await asyncio.Event().wait()
    yield 1  # pragma: no cover - never reached


@wool.routine
async def nested_add(a: int, b: int) -> tuple[int, int]:
    """Dispatch ``add(a, b)`` from inside a worker; return it and this worker's pid."""
    return await add(a, b), os.getpid()


@wool.routine
async def nested_then_pool_statistics(
    token: str, parties: int, a: int, b: int
) -> tuple[int, int, int, int]:
    """Nested-dispatch ``add(a, b)``, meet ``parties`` peers, report the pool.

    Waits (at most 30 s) until ``parties`` calls with the same ``token`` are
    running on this worker, so that all of them, and the proxies that carried
    them here, are alive at once; then returns ``(a + b, pid, entries,
    consumers)`` of this worker process's ``current_pool().statistics()``.
    """
    total = await add(a, b)
    arrived, everyone = _arrivals.setdefault(token, ([0], asyncio.Event()))
    arrived[0] += 1
    if arrived[0] >= parties:
        everyone.set()
    await asyncio.wait_for(everyone.wait(), timeout=30)
    statistics = current_pool().statistics()
    return total, os.getpid(), statistics.entries, statistics.consumers
