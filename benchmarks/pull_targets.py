"""Delivered items/s of fan-outs over three kinds of source, against the targets.

Run from the repository root::

    python benchmarks/pull_targets.py [--quick] [--reps K] [--backend B]
        [--source S] [--out FILE.md]

N = 1, 10, 100, 1000 consumers each take all M items of one source; the
figure is M x N / wall time, from releasing the N consumer tasks (started
first, all blocked on an event) to the last one finishing. Sources: ``never``
(an async generator that never suspends); ``checkpoint`` (one per item:
``asyncio.sleep(0)``, on trio ``anyio.lowlevel.checkpoint()``); ``waiting``
(a producer task, released with the consumers, sends the M items into a
zero-buffer anyio memory object stream, whose receive end the source
iterates). Implementations: ``wool_pooling.Fanout``; wool's ``Fanout``
(asyncio only: the trio tables carry a row of it run on asyncio, same M,
interleaved); ``asyncstdlib.tee`` (locked when the source suspends:
``asyncio.Lock()``, on trio ``anyio.Lock()``); the floor, the raw source
iterated by one consumer (N = 1 only). M is calibrated once per (backend,
source, N) on ``wool_pooling.Fanout`` (one run ~0.1 s) and used for every
implementation of the group. Each run has an event loop of its own; the
repetitions are interleaved, one run of each implementation per round.
Nothing is written unless ``--out FILE.md`` is given (plus FILE.json).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from wool_pooling import Fanout


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {"asyncio": ("asyncio", {})}
if importable("uvloop"):
    BACKENDS["uvloop"] = ("asyncio", {"use_uvloop": True})
if importable("trio"):
    BACKENDS["trio"] = ("trio", {})
SOURCES = ("never", "checkpoint", "waiting")
NS = (1, 10, 100, 1000)
FANOUT, WOOL, TEE, FLOOR = (
    "wool_pooling.Fanout",
    "wool Fanout",
    "asyncstdlib.tee",
    "floor",
)
WOOL_ON_ASYNCIO = "wool Fanout (asyncio)"
COLUMNS = (
    "N",
    "implementation",
    "M",
    "median items/s",
    "min-max",
    "vs wool Fanout",
    "vs tee",
)
TARGET_SECONDS = 0.1
LEAST_ITEMS = 20


def implementations(backend: str, n: int) -> list[str]:
    """The rows of one (backend, source, N) group, in table order."""
    names = [FANOUT]
    if importable("wool.utilities.fanout"):
        names.append(WOOL_ON_ASYNCIO if backend == "trio" else WOOL)
    if importable("asyncstdlib"):
        names.append(TEE)
    return [*names, FLOOR] if n == 1 else names


# -- sources -------------------------------------------------------------------


async def never(m: int) -> AsyncIterator[int]:
    for item in range(m):
        yield item


async def checkpoint(m: int) -> AsyncIterator[int]:
    on_asyncio = is_asyncio()
    for item in range(m):
        if on_asyncio:
            await asyncio.sleep(0)
        else:
            await anyio.lowlevel.checkpoint()
        yield item


async def receive_all(receive: Any) -> AsyncIterator[int]:
    async with receive:
        async for item in receive:
            yield item


def is_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def make_source(
    source: str, m: int
) -> tuple[AsyncIterator[int], Callable[[], Awaitable[None]] | None]:
    """The source iterator, and the producer task it waits for (if any)."""
    if source == "never":
        return never(m), None
    if source == "checkpoint":
        return checkpoint(m), None
    send, receive = anyio.create_memory_object_stream[int](0)

    async def produce() -> None:
        async with send:
            for item in range(m):
                await send.send(item)

    return receive_all(receive), produce


# -- one run -------------------------------------------------------------------


async def drain(iterator: AsyncIterator[Any], counts: list[int], index: int) -> None:
    count = 0
    async for _ in iterator:
        count += 1
    counts[index] = count


async def gated(
    gate: anyio.Event, function: Callable[..., Awaitable[Any]], *args: Any
) -> None:
    await gate.wait()
    await function(*args)


async def one_run(implementation: str, source: str, m: int, n: int) -> float:
    """Seconds from releasing the consumers to the last one finishing."""
    iterator, produce = make_source(source, m)
    closer: Callable[[], Awaitable[Any]] | None = None
    if implementation == FANOUT:
        fanout = Fanout(iterator)
        consumers: list[AsyncIterator[int]] = [fanout.consumer() for _ in range(n)]
        closer = fanout.aclose
    elif implementation in (WOOL, WOOL_ON_ASYNCIO):
        from wool.utilities.fanout import Fanout as WoolFanout

        wool_fanout = WoolFanout[int](iterator)  # pyright: ignore[reportArgumentType]
        consumers = [wool_fanout.consumer() for _ in range(n)]
        closer = wool_fanout.cleanup
    elif implementation == TEE:
        import asyncstdlib

        tee_lock: Any = None
        if source != "never":  # a suspending source needs the lock
            tee_lock = asyncio.Lock() if is_asyncio() else anyio.Lock()
        tee = asyncstdlib.tee(iterator, n=n, lock=tee_lock)
        consumers = list(tee)
        closer = tee.aclose
    else:
        consumers = [iterator]
    counts = [-1] * len(consumers)
    gate, start = anyio.Event(), 0.0
    async with anyio.create_task_group() as group:
        if produce is not None:
            group.start_soon(gated, gate, produce)
        for index, consumer in enumerate(consumers):
            group.start_soon(gated, gate, drain, consumer, counts, index)
        await anyio.wait_all_tasks_blocked()
        start = time.perf_counter()
        gate.set()
    elapsed = time.perf_counter() - start
    if closer is not None:
        await closer()
    if any(count != m for count in counts):
        raise RuntimeError(f"{implementation}: got {sorted(set(counts))}, expected {m}")
    return elapsed


def run(backend: str, implementation: str, source: str, m: int, n: int) -> float:
    if implementation == WOOL_ON_ASYNCIO:
        backend = "asyncio"
    name, options = BACKENDS[backend]
    gc.collect()
    return anyio.run(
        one_run, implementation, source, m, n, backend=name, backend_options=options
    )


def calibrate(backend: str, source: str, n: int) -> int:
    m = max(1_000 // n, LEAST_ITEMS)
    while True:
        elapsed = run(backend, FANOUT, source, m, n)
        if elapsed >= TARGET_SECONDS / 4:
            break
        m *= 2 if elapsed >= TARGET_SECONDS / 20 else 8
    return max(LEAST_ITEMS, int(m * TARGET_SECONDS / elapsed))


# -- the tables ----------------------------------------------------------------


def ratio(rate: float, versus: float | None) -> str:
    return "-" if versus is None else f"{rate / versus:.2f}x"


def table(backend: str, source: str, rows: list[dict[str, Any]]) -> str:
    wool_name = WOOL_ON_ASYNCIO if backend == "trio" else WOOL
    lines = [f"### {backend} / {source}", ""]
    if backend == "trio":
        lines += [
            f"wool's Fanout runs on asyncio only: `{WOOL_ON_ASYNCIO}` was run on "
            "asyncio (same M, interleaved with these runs), and 'vs wool Fanout' "
            "compares with that asyncio figure.",
            "",
        ]
    lock = "none" if source == "never" else "asyncio.Lock()"
    if backend == "trio" and source != "never":
        lock = "anyio.Lock()"
    lines += [f"tee lock: {lock}", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|---:|---|---:|---:|---:|---:|---:|"]
    for n in NS:
        group = {row["implementation"]: row for row in rows if row["n"] == n}
        wool = group.get(wool_name, {}).get("median")
        tee = group.get(TEE, {}).get("median")
        for name, row in group.items():
            lines.append(
                f"| {n} | {name} | {row['m']:,} | {row['median']:,.0f} | "
                f"{row['min']:,.0f}-{row['max']:,.0f} | "
                f"{ratio(row['median'], wool)} | {ratio(row['median'], tee)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny M, 1 rep (smoke)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--backend", action="append", choices=list(BACKENDS))
    parser.add_argument("--source", action="append", choices=SOURCES)
    parser.add_argument("--out", type=Path, help="write FILE.md and FILE.json")
    args = parser.parse_args(argv)
    reps = 1 if args.quick else args.reps
    backends = args.backend or list(BACKENDS)
    sources = args.source or list(SOURCES)
    pulls = os.environ.get("WOOL_POOLING_PULLS")
    eager = sys.version_info >= (3, 12) and pulls != "task"  # as wool_pooling decides
    header = f"`sys.version`: {sys.version}; platform: {platform.platform()}"
    if pulls is not None:
        header += f"; WOOL_POOLING_PULLS={pulls}"
    header += f"; pulls start {'eagerly' if eager else 'as plain tasks'} on asyncio"
    header += f"; {'quick' if args.quick else f'{reps} reps'}"
    results: list[dict[str, Any]] = []
    sections: list[str] = []
    began = time.perf_counter()
    for backend in backends:
        for source in sources:
            rows: list[dict[str, Any]] = []
            for n in NS:
                m = max(200 // n, 3) if args.quick else calibrate(backend, source, n)
                names = implementations(backend, n)
                seconds: dict[str, list[float]] = {name: [] for name in names}
                for _ in range(reps):
                    for name in names:
                        seconds[name].append(run(backend, name, source, m, n))
                for name in names:
                    delivered = m * (1 if name == FLOOR else n)
                    rates = [delivered / s for s in seconds[name]]
                    row: dict[str, Any] = dict(
                        backend=backend, source=source, n=n, implementation=name
                    )
                    row.update(m=m, seconds=seconds[name], rates=rates)
                    median = statistics.median(rates)
                    rows.append(
                        dict(row, median=median, min=min(rates), max=max(rates))
                    )
                print(
                    f"{backend} / {source} / N={n}: M={m:,} "
                    f"({time.perf_counter() - began:.0f} s)",
                    file=sys.stderr,
                )
            results += rows
            sections.append(table(backend, source, rows))
    total = time.perf_counter() - began
    markdown = "\n\n".join(
        [f"# Pull targets\n\n{header}; total {total:.0f} s", *sections]
    )
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
        meta: dict[str, Any] = dict(
            version=sys.version, platform=platform.platform(), pulls=pulls
        )
        meta.update(reps=reps, quick=args.quick, seconds=total)
        args.out.with_suffix(".json").write_text(
            json.dumps(dict(meta=meta, results=results), indent=1), encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
