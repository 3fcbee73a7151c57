"""The most any async-iterator wrapper can deliver at N = 1, against the floor.

Run from the repository root::

    python benchmarks/wrapper_ceiling.py [--backend asyncio|trio] [--items M]

Times one consumer iterating a never-suspending async generator directly
(the raw-source limit of ``throughput.py``), then through the thinnest possible
wrappers, with no log and no bookkeeping:

- ``coroutine``: an ``__anext__`` coroutine that only awaits the source's,
  what ``async for`` over a :class:`~wool_pooling.FanoutConsumer` (whose
  ``__aiter__`` returns itself) costs at best;
- ``async generator``: ``async for item in source: yield item``, for
  reference (the shape of the consumers of the previous core);
- ``task per item``: the ``coroutine`` wrapper, but each ``__anext__`` of the
  source runs as a task of its own that the consumer awaits, started the way
  the fan-out starts its pulls (eagerly on asyncio with CPython 3.12+ unless
  ``WOOL_POOLING_PULLS=task``; at the loop's next pass on 3.11 and on trio,
  where it is a system task the consumer waits for on an event): the least
  a wrapper that keeps the consumer's cancellation away from the source can
  cost;

and through a one-consumer :class:`~wool_pooling.Fanout`. Repetitions
alternate, and each ratio of items/s (wrapper / floor) is printed, to three
significant digits, with its median and spread. A fan-out's N = 1 figure
cannot exceed the ``task per item`` ratio: everything the fan-out does
besides (logging the item, waking its waiters) comes out of what is left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _results
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


#: Whether pulls start eagerly, as ``wool_pooling``'s do (same rule, same variable).
EAGER = (
    sys.version_info >= (3, 12)
    and os.environ.get("WOOL_POOLING_PULLS", "eager") != "task"
)


class TaskPerItem:
    """An async iterator over ``source`` that runs each of its steps in a new task."""

    def __init__(self, source: AsyncIterator[Any]) -> None:
        self._source = source

    def __aiter__(self) -> TaskPerItem:
        return self

    async def __anext__(self) -> Any:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # trio
            return await self._trio_step()
        if EAGER:
            task = asyncio.eager_task_factory(loop, self._step())  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]
        else:
            task = loop.create_task(self._step())
        return await task  # pyright: ignore[reportUnknownVariableType]

    async def _step(self) -> Any:
        return await self._source.__anext__()

    async def _trio_step(self) -> Any:
        import trio

        done = trio.Event()
        outcome: list[Any] = []

        async def step() -> None:
            try:
                outcome.append((True, await self._step()))
            except BaseException as error:  # handed to the consumer
                outcome.append((False, error))
            done.set()

        trio.lowlevel.spawn_system_task(step)
        await done.wait()
        ok, value = outcome[0]
        if ok:
            return value
        raise value


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
    "task per item": lambda m: seconds(TaskPerItem(never_suspending(m))),
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
    parser = argparse.ArgumentParser(
        prog="python benchmarks/wrapper_ceiling.py",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument(
        "--items", type=int, help="items per repetition (default 300000; --quick: 2000)"
    )
    parser.add_argument("--reps", type=int, help="repetitions (default 7; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes")
    parser.add_argument(
        "--out",
        type=Path,
        help="also write the ratios to "
        "DIR/wrapper_ceiling-<backend>-<interpreter>.json",
    )
    args = parser.parse_args(argv)
    items = args.items or (2_000 if args.quick else 300_000)
    reps = args.reps or (1 if args.quick else 7)
    began = time.perf_counter()
    ratios = anyio.run(measure, items, reps, backend=args.backend)
    rows: list[dict[str, object]] = []
    for name, values in ratios.items():
        print(
            f"{args.backend}: {name} / floor = "
            f"{statistics.median(values):.3g}x (median of {reps}; "
            f"{min(values):.3g}-{max(values):.3g})"
        )
        rows.append(
            {"wrapper": name, "median": statistics.median(values), "values": values}
        )
    if args.out is not None:
        out = _results.folder(args.out, args.quick)
        meta = _results.meta(args.quick, time.perf_counter() - began)
        meta |= {"items": items, "reps": reps}
        report = {"meta": meta, "backend": args.backend, "rows": rows}
        name = f"wrapper_ceiling-{args.backend}-{_results.interpreter()}.json"
        (out / name).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
