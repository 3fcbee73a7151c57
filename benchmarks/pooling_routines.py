"""Routines for ``benchmarks/pooling.py``, importable by wool's worker processes.

Workers start with ``spawn`` and unpickle routines by reference, so these
live in a module of their own (``benchmarks/`` is on ``sys.path`` when the
script runs, and ``spawn`` hands it down).
"""

from __future__ import annotations

import statistics
import time

import wool


@wool.routine
async def leaf(x: int) -> int:
    """Return ``x + 1``."""
    return x + 1


@wool.routine
async def nested(x: int) -> int:
    """Dispatch :func:`leaf` from inside a worker, through the proxy it carried."""
    return await leaf(x) + 1


@wool.routine
async def unpickle_seconds(data: bytes, loops: int, rounds: int) -> float:
    """Seconds one unpickle of ``data`` (a pickled proxy) takes in this worker:
    the median over ``rounds`` of ``loops`` unpickles each."""
    serializer = wool.CloudpickleSerializer()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(loops):
            serializer.loads(data)
        times.append((time.perf_counter() - start) / loops)
    return statistics.median(times)
