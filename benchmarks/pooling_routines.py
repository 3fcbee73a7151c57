"""Routines for ``benchmarks/pooling.py``, importable by wool's worker processes.

Workers start with ``spawn`` and unpickle routines by reference, so these
live in a module of their own (``benchmarks/`` is on ``sys.path`` when the
script runs, and ``spawn`` hands it down).
"""

from __future__ import annotations

import wool


@wool.routine
async def leaf(x: int) -> int:
    """Return ``x + 1``."""
    return x + 1


@wool.routine
async def nested(x: int) -> int:
    """Dispatch :func:`leaf` from inside a worker, through the proxy it carried."""
    return await leaf(x) + 1
