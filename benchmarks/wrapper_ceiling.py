"""The most any async-iterator wrapper can deliver at N = 1, against the floor.

Run from the repository root::

    python benchmarks/wrapper_ceiling.py [--backend asyncio|trio] [--items M]

Times one consumer iterating a never-suspending async generator directly
(the floor of ``fanout_throughput.py``) and through the thinnest possible
wrapper: an ``__anext__`` coroutine that only awaits the source's, with no
log, no bookkeeping and no protection of the source from the consumer's
cancellation. Repetitions alternate, and the ratio of items/s (wrapper /
floor) is printed with its median. Any fan-out whose consumers are async
iterators with a Python ``__anext__`` pays at least this wrapper's cost per
item, so its N = 1 figure cannot exceed this ratio of the floor.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio


async def never_suspending(m: int) -> AsyncIterator[int]:
    for item in range(m):
        yield item


class PassThrough:
    """An async iterator over ``source`` that adds one coroutine per item."""

    def __init__(self, source: AsyncIterator[Any]) -> None:
        self._source = source

    def __aiter__(self) -> PassThrough:
        return self

    async def __anext__(self) -> Any:
        return await self._source.__anext__()


async def seconds(iterator: AsyncIterator[Any]) -> float:
    start = time.perf_counter()
    async for _ in iterator:
        pass
    return time.perf_counter() - start


async def measure(m: int, reps: int) -> list[float]:
    ratios: list[float] = []
    for _ in range(reps):
        floor = await seconds(never_suspending(m))
        wrapped = await seconds(PassThrough(never_suspending(m)))
        ratios.append(floor / wrapped)
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--items", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    ratios = anyio.run(measure, args.items, args.reps, backend=args.backend)
    print(
        f"{args.backend}: pass-through wrapper / floor = "
        f"{statistics.median(ratios):.2f}x (median of {args.reps}; "
        f"{min(ratios):.2f}-{max(ratios):.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
