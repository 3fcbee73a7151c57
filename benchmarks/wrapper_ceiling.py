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
- ``one task``: the source iterated by a task of its own, each item asked
  for and handed over with one wake-up each way, through the waiters the
  fan-out uses: the least a wrapper that iterates the source in one task
  of its own (so that a source may keep task-bound state across its yields,
  and a consumer's cancellation never reaches it) can cost;

and through a one-consumer :class:`~wool_pooling.Fanout`. Repetitions
alternate, and each ratio of items/s (wrapper / floor) is printed, to three
significant digits, with its median and spread. A fan-out's N = 1 figure
cannot exceed the ``one task`` ratio: everything the fan-out does
besides (logging the item, waking its waiters) comes out of what is left.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import AsyncIterator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _results
import anyio

from wool_pooling import Fanout
from wool_pooling._core.backend import current_loop


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


class OneTask:
    """``source`` iterated by a task of its own for its whole life: each item
    is asked for and handed over with one wake-up each way, through the
    waiters the fan-out uses (a fan-out's pump at N = 1, without the log)."""

    def __init__(self, source: AsyncIterator[Any]) -> None:
        self._source = source
        self._demand: Any = None
        self._ready: Any = None
        self._outcome: tuple[bool, Any] = (True, None)

    def __aiter__(self) -> OneTask:
        return self

    async def __anext__(self) -> Any:
        loop = current_loop()
        ready = self._ready = loop.waiters()
        if self._demand is None:
            loop.spawn(self._pump)
        else:
            self._demand.wake()
        await ready.wait()
        ok, value = self._outcome
        if ok:
            return value
        raise value

    async def _pump(self) -> None:
        loop = current_loop()
        while True:
            try:
                self._outcome = (True, await self._source.__anext__())
            except BaseException as error:  # the end included: the consumer's
                self._outcome = (False, error)
            demand = self._demand = loop.waiters()
            self._ready.wake()
            if not self._outcome[0]:
                return
            await demand.wait()


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
    "one task": lambda m: seconds(OneTask(never_suspending(m))),
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
