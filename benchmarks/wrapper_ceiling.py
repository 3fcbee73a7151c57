"""The most any async-iterator wrapper can deliver at N = 1, against the floor.

Run from the repository root::

    python benchmarks/wrapper_ceiling.py [--backend asyncio|trio] [--items M]

Times one consumer iterating a never-suspending async generator directly
(the floor of ``fanout_throughput.py``), then through the thinnest possible
wrappers, with no log, no bookkeeping and no protection of the source from
the consumer's cancellation:

- ``coroutine``: an ``__anext__`` coroutine that only awaits the source's;
- ``async generator``: ``async for item in source: yield item``, what
  ``async for`` over a :class:`~wool_pooling.FanoutConsumer` costs at best;

and through a one-consumer :class:`~wool_pooling.Fanout`. Repetitions
alternate, and each ratio of items/s (wrapper / floor) is printed with its
median and spread. A fan-out's N = 1 figure cannot exceed the async
generator's ratio: everything the fan-out does besides (logging the item,
running the pull as its pump task) comes out of what is left.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any

import anyio

from wool_pooling import Fanout


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


async def pass_through_generator(source: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``source`` again, through one async-generator step per item."""
    async for item in source:
        yield item


async def seconds(iterator: Any) -> float:
    start = time.perf_counter()
    async for _ in iterator:
        pass
    return time.perf_counter() - start


async def through_fanout(m: int) -> float:
    fanout = Fanout(never_suspending(m))
    try:
        return await seconds(fanout.consumer())
    finally:
        await fanout.aclose()


WRAPPERS: dict[str, Callable[[int], Any]] = {
    "coroutine": lambda m: seconds(PassThrough(never_suspending(m))),
    "async generator": lambda m: seconds(pass_through_generator(never_suspending(m))),
    "wool_pooling.Fanout": through_fanout,
}


async def measure(m: int, reps: int) -> dict[str, list[float]]:
    ratios: dict[str, list[float]] = {name: [] for name in WRAPPERS}
    for _ in range(reps):
        for name, run in WRAPPERS.items():
            floor = await seconds(never_suspending(m))
            ratios[name].append(floor / await run(m))
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--items", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    ratios = anyio.run(measure, args.items, args.reps, backend=args.backend)
    for name, values in ratios.items():
        print(
            f"{args.backend}: {name} / floor = "
            f"{statistics.median(values):.2f}x (median of {args.reps}; "
            f"{min(values):.2f}-{max(values):.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
