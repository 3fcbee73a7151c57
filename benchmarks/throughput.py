"""Fan-out throughput, memory under a stalled consumer, late-join replay: on pyperf.

Run from the repository root::

    python benchmarks/throughput.py                # record: benchmarks/results/
    python benchmarks/throughput.py --quick        # smoke: a temporary folder, quiet
    python benchmarks/throughput.py --out DIR      # record into DIR

pyperf does the calibration, warm-ups, worker processes and statistics; this
file holds the cases only. Every case is one pyperf benchmark named
``{backend}/{source}/{implementation}/N={n}``: N consumers each take all M
items of one source, timed from releasing the consumers (all started first,
blocked on an event) to the last one finishing; the value is seconds per
delivered item (``inner_loops`` = M x N), so items/s = 1 / value.

The late-join benchmarks (``join/{backend}/W={w}/arrival|replay``) time W
``worker-added`` events reaching a ``SharedSubscription``'s first consumer,
and a second consumer's replay of them. The memory cases are not timings:
each runs in a fresh process (``--memory-case``) and reports the growth of
the peak resident set size.

Files, named after the interpreter (for example ``cpython3.11``): pyperf's
``throughput-cpython3.11.json`` (compare two with ``python -m pyperf
compare_to``) and ``memory-cpython3.11.json``. ``benchmarks/report.py``
turns them into the tables and the plots.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import math
import platform
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from _results import folder
from _results import interpreter
from _results import write
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import Lagged
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

SOURCES = ("never", "checkpoint", "waiting")
NS = (1, 10, 100, 1000)
#: Delivered items (M x N) per run; M is at least LEAST_ITEMS.
DELIVERED, QUICK_DELIVERED, LEAST_ITEMS = 20_000, 200, 50
JOIN_WORKERS, QUICK_JOIN_WORKERS = (10, 1_000, 10_000), (10, 100)
MEMORY_EVENTS, QUICK_MEMORY_EVENTS, MEMORY_WORKERS = 1_000_000, 20_000, 100
#: Fresh processes per memory case: the peak resident set size moves by a whole
#: allocator arena (1 MB) from one process to the next (CPython 3.15: 0.36 to
#: 1.27 MB for one case), so a case reports its median run, with every run's.
MEMORY_RUNS = 3
DEFAULT_MAX_LAG = 1024  # @shared_subscription's default
#: The read-ahead ``Fanout`` and ``SharedSubscription`` run with here, and the
#: batch of ``wake-up per batch``: its ratio shows how close read-ahead comes
#: to one wake-up per batch.
READ_AHEAD = 64
PUMP_BUFFER = 256


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


def implementations(backend: str, n: int) -> list[str]:
    names = ["Fanout", "SharedSubscription"]
    if backend != "trio" and importable("wool.utilities.fanout"):
        names.append("wool Fanout")  # asyncio only
    if importable("asyncstdlib"):
        names.append("asyncstdlib.tee")
    names += ["pump + streams", "wake-up only", "wake-up per batch"]
    return [*names, "raw source"] if n == 1 else names


# -- sources -------------------------------------------------------------------


def on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def never(m: int) -> AsyncIterator[int]:
    for item in range(m):
        yield item


async def checkpoint(m: int) -> AsyncIterator[int]:
    # asyncio.sleep(0) is the cheapest checkpoint on asyncio.
    sleep = asyncio.sleep if on_asyncio() else None
    for item in range(m):
        await (sleep(0) if sleep else anyio.lowlevel.checkpoint())
        yield item


def make_source(
    source: str, m: int
) -> tuple[AsyncIterator[int], Callable[[], Awaitable[None]] | None]:
    """The source, and the producer task it waits for (``waiting`` only)."""
    if source == "never":
        return never(m), None
    if source == "checkpoint":
        return checkpoint(m), None
    send, receive = anyio.create_memory_object_stream[int](0)

    async def produce() -> None:
        async with send:
            for item in range(m):
                await send.send(item)

    async def received() -> AsyncIterator[int]:
        async with receive:
            async for item in receive:
                yield item

    return received(), produce


class Subscriber:
    """A subscriber whose one iteration is ``factory()``."""

    def __init__(self, factory: Callable[[], AsyncIterator[Any]]) -> None:
        self.factory = factory

    def __aiter__(self) -> AsyncIterator[Any]:
        return self.factory()


@shared_subscription
class Bounded(Subscriber):
    """A shared subscription with the default bound on lag."""


@shared_subscription(max_lag=None, read_ahead=READ_AHEAD)
class Lossless(Subscriber):
    """Unbounded: a throughput consumer must take all M plain ints (no resync)."""


# -- one throughput run ----------------------------------------------------------


async def drain(iterator: Any, counts: list[int], index: int) -> None:
    count = 0
    async for _ in iterator:
        count += 1
    counts[index] = count


async def gated(gate: anyio.Event, function: Callable[..., Awaitable[Any]], *args: Any):
    await gate.wait()
    await function(*args)


async def through(function: Callable[..., Awaitable[Any]], *args: Any):
    """``function(*args)`` one frame down, as ``gated`` runs it (no gate)."""
    await function(*args)


async def gated_source(gate: anyio.Event, source: AsyncIterator[int]):
    await gate.wait()
    async for item in source:
        yield item


class Bell:
    """N tasks woken once per item by one event, no log: the scheduler's limit.

    The ringer swaps in a fresh event, sets the old one, and waits until all
    N consumers have taken the item (one more wake-up per item: its own).
    Its consumers wait for the first ring itself, not for the gate (the ring
    must find them waiting), but run one frame down (``through``), so their
    tasks suspend through as many frames as every implementation's
    consumers, which run in ``gated``.
    """

    def __init__(self, n: int, counts: list[int]) -> None:
        self.n, self.counts, self.done = n, counts, False
        self.bell, self.taken, self.left = anyio.Event(), anyio.Event(), 0

    async def consume(self, index: int) -> None:
        count = 0
        while True:
            await self.bell.wait()
            if self.done:
                break
            count += 1
            self.left -= 1
            if self.left == 0:
                self.taken.set()
        self.counts[index] = count

    async def ring(self, source: AsyncIterator[int]) -> None:
        async for _ in source:
            bell, self.bell = self.bell, anyio.Event()
            self.left, self.taken = self.n, anyio.Event()
            bell.set()
            await self.taken.wait()
        self.done = True
        self.bell.set()


class BatchBell:
    """N tasks woken once per batch of ``READ_AHEAD`` items: the batched limit.

    The ringer pulls up to ``READ_AHEAD`` items in its own task, then wakes
    the N consumers once for the whole batch, as ``Bell`` does for one item;
    each consumer takes the batch's items inline. What read-ahead could at
    best save: one wake-up per consumer per batch instead of per item.
    """

    def __init__(self, n: int, counts: list[int]) -> None:
        self.n, self.counts, self.done = n, counts, False
        self.bell, self.taken, self.left = anyio.Event(), anyio.Event(), 0
        self.batch: list[int] = []

    async def consume(self, index: int) -> None:
        count = 0
        while True:
            await self.bell.wait()
            if self.done:
                break
            for _ in self.batch:
                count += 1
            self.left -= 1
            if self.left == 0:
                self.taken.set()
        self.counts[index] = count

    async def publish(self, batch: list[int]) -> None:
        bell, self.bell = self.bell, anyio.Event()
        self.batch, self.left, self.taken = batch, self.n, anyio.Event()
        bell.set()
        await self.taken.wait()

    async def ring(self, source: AsyncIterator[int]) -> None:
        batch: list[int] = []
        async for item in source:
            batch.append(item)
            if len(batch) == READ_AHEAD:
                await self.publish(batch)
                batch = []
        if batch:
            await self.publish(batch)
        self.done = True
        self.bell.set()


async def one_run(
    implementation: str,
    backend: str,
    source: str,
    m: int,
    n: int,
    read_ahead: int = READ_AHEAD,
):
    """Seconds from releasing the consumers to the last one finishing
    (``read_ahead``: the ``Fanout``'s, for ``read_ahead.py``'s sweep)."""
    iterator, produce = make_source(source, m)
    counts, consumers = [-1] * n, list[Any]()
    pool, closer, pump = None, None, None
    gate, start = anyio.Event(), 0.0
    if implementation == "Fanout":
        fanout = Fanout(iterator, read_ahead=read_ahead)
        consumers, closer = [fanout.consumer() for _ in range(n)], fanout.aclose
    elif implementation == "SharedSubscription":
        subscription = Lossless(lambda: gated_source(gate, iterator))
        pool = SubscriptionPool()
        await pool.__aenter__()
        consumers = [aiter(subscription) for _ in range(n)]
    elif implementation == "wool Fanout":
        from wool.utilities.fanout import Fanout as WoolFanout

        wool_fanout = WoolFanout[int](iterator)  # pyright: ignore[reportArgumentType]
        consumers = [wool_fanout.consumer() for _ in range(n)]
        closer = wool_fanout.cleanup
    elif implementation == "asyncstdlib.tee":
        import asyncstdlib

        lock: Any = None  # a suspending source needs the lock
        if source != "never" or backend == "trio":
            lock = asyncio.Lock() if on_asyncio() else anyio.Lock()
        tee = asyncstdlib.tee(iterator, n=n, lock=lock)
        consumers, closer = list(tee), tee.aclose
    elif implementation == "pump + streams":
        streams = [
            anyio.create_memory_object_stream[int](PUMP_BUFFER) for _ in range(n)
        ]
        consumers = [receive for _, receive in streams]

        async def pump() -> None:
            async for item in iterator:
                for send, _ in streams:
                    try:
                        send.send_nowait(item)
                    except anyio.WouldBlock:
                        await send.send(item)
            for send, _ in streams:
                send.close()

    elif implementation == "raw source":
        consumers = [iterator]
    async with anyio.create_task_group() as group:
        if produce is not None:
            group.start_soon(gated, gate, produce)
        if implementation == "wake-up only":
            bell = Bell(n, counts)
            group.start_soon(gated, gate, bell.ring, iterator)
            for index in range(n):
                group.start_soon(through, bell.consume, index)
        if implementation == "wake-up per batch":
            batch_bell = BatchBell(n, counts)
            group.start_soon(gated, gate, batch_bell.ring, iterator)
            for index in range(n):
                group.start_soon(through, batch_bell.consume, index)
        if implementation == "pump + streams":
            group.start_soon(gated, gate, pump)
        for index, consumer in enumerate(consumers):
            if pool is None:
                group.start_soon(gated, gate, drain, consumer, counts, index)
            else:  # they join at their first __anext__; the source waits
                group.start_soon(drain, consumer, counts, index)
        if pool is not None:
            while pool.statistics().consumers < n:
                await anyio.lowlevel.checkpoint()
        await anyio.wait_all_tasks_blocked()
        start = time.perf_counter()
        gate.set()
    elapsed = time.perf_counter() - start
    if closer is not None:
        await closer()
    if pool is not None:
        await pool.__aexit__(None, None, None)
    if any(count != m for count in counts):
        raise RuntimeError(f"{implementation}: got {sorted(set(counts))}, not {m}")
    return elapsed


def time_runs(loops: int, backend: str, *case: Any) -> float:
    """pyperf's time function: ``loops`` runs on one event loop, summed."""

    async def runs() -> float:
        total = 0.0
        for _ in range(loops):
            total += await one_run(*case)
        return total

    name, options = BACKENDS[backend]
    gc.collect()
    return anyio.run(runs, backend=name, backend_options=options)


# -- late join ---------------------------------------------------------------------


def time_join(loops: int, backend: str, workers: int, what: str) -> float:
    """Seconds for W events to reach one consumer, or for a late joiner's replay."""
    metadata = [
        WorkerMetadata(uid=uuid.uuid4(), address="127.0.0.1:1", pid=1, version="1")
        for _ in range(workers)
    ]

    async def source() -> AsyncIterator[DiscoveryEvent]:
        for worker in metadata:
            yield DiscoveryEvent("worker-added", metadata=worker)
        await anyio.sleep_forever()

    async def runs() -> float:
        total = 0.0
        for _ in range(loops):
            subscription = Bounded(source)
            async with SubscriptionPool():
                first = aiter(subscription)
                start = time.perf_counter()
                for _ in range(workers):
                    await anext(first)
                arrival = time.perf_counter() - start
                late = aiter(subscription)
                start = time.perf_counter()
                replay = [await anext(late) for _ in range(workers)]
                replayed = time.perf_counter() - start
                if {event.metadata.uid for event in replay} != {
                    worker.uid for worker in metadata
                }:
                    raise RuntimeError("the replay is not one add per worker")
                await late.aclose()
                await first.aclose()
            total += arrival if what == "arrival" else replayed
        return total

    name, options = BACKENDS[backend]
    return anyio.run(runs, backend=name, backend_options=options)


# -- memory under a stalled consumer (one fresh process per case) ------------------

MEMORY_CASES = (
    "Fanout(max_lag=None), unbounded",
    f'Fanout(max_lag={DEFAULT_MAX_LAG}, on_lag="error")',
    f"SharedSubscription (pool, default max_lag={DEFAULT_MAX_LAG})",
    "SharedSubscription (pool, max_lag=None)",
    "wool Fanout",
    "asyncstdlib.tee",
    "pump + streams",
    "raw source",
)


def churn(m: int) -> tuple[Callable[[], AsyncIterator[DiscoveryEvent]], dict[Any, Any]]:
    """``m`` fresh discovery events over 100 workers, and the state they end in.

    Rounds of one event per worker: all added; then the even workers dropped
    and added back in turn, the odd ones updated; four metadata versions.
    """
    variants = [
        [
            WorkerMetadata(uid=uid, address="127.0.0.1:1", pid=1, version=str(v))
            for v in range(4)
        ]
        for uid in (uuid.uuid4() for _ in range(MEMORY_WORKERS))
    ]

    def event(index: int) -> DiscoveryEvent:
        round_, worker = divmod(index, MEMORY_WORKERS)
        kind = "worker-updated"
        if round_ == 0 or (worker % 2 == 0 and round_ % 2 == 0):
            kind = "worker-added"
        elif worker % 2 == 0:
            kind = "worker-dropped"
        return DiscoveryEvent(kind, metadata=variants[worker][round_ % 4])

    async def events() -> AsyncIterator[DiscoveryEvent]:
        for index in range(m):
            yield event(index)

    state: dict[Any, Any] = {}
    for index in range(max(0, m - MEMORY_WORKERS), m):
        apply(state, event(index))
    return events, state


def apply(view: dict[Any, Any], event: DiscoveryEvent) -> None:
    if event.type == "worker-dropped":
        view.pop(event.metadata.uid, None)
    else:
        view[event.metadata.uid] = event.metadata


def status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


async def memory_case(case: str, m: int) -> dict[str, Any]:
    """One consumer takes an event and stalls; another reads all ``m``; then it resumes.

    The peak is the growth of the peak resident set size (reset first) until
    the reader is done. Linux only.
    """
    events, expected = churn(m)
    got: dict[str, Any] = dict(stalled={}, reader={}, resumed=0, skipped=0)
    joined, resume = anyio.Event(), anyio.Event()
    count_buffered: Callable[[], int | None] = lambda: None  # noqa: E731
    gc.collect()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:  # noqa: ASYNC230
        clear_refs.write("5")  # reset the peak resident set size
    baseline = status_kb("VmRSS")

    def reader_done() -> None:
        got["peak_mb"] = (status_kb("VmHWM") - baseline) * 1024 / 1e6
        got["buffered"] = count_buffered()

    async def stall(iterator: Any) -> None:
        apply(got["stalled"], await anext(iterator))
        joined.set()
        await resume.wait()
        while True:
            try:
                event = await anext(iterator)
            except Lagged as lagged:
                got["skipped"] += lagged.skipped
                continue
            except StopAsyncIteration:
                break
            got["resumed"] += 1
            apply(got["stalled"], event)

    async def read(iterator: Any) -> None:
        await joined.wait()
        async for event in iterator:
            apply(got["reader"], event)
        reader_done()
        resume.set()

    async def race(stalled: Any, reader: Any) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(stall, stalled)
            group.start_soon(read, reader)

    if case.startswith("Fanout"):
        bounded = "on_lag" in case
        fanout = Fanout(
            events(),
            max_lag=DEFAULT_MAX_LAG if bounded else None,
            on_lag="error" if bounded else "wait",
        )
        count_buffered = lambda: fanout.statistics().buffered  # noqa: E731
        await race(fanout.consumer(), fanout.consumer())
        await fanout.aclose()
    elif case.startswith("SharedSubscription"):
        subscription = (Lossless if "None" in case else Bounded)(events)
        async with SubscriptionPool():
            stalled = aiter(subscription)
            # The pool entry's fan-out, through the consumer (this library's own).
            count_buffered = lambda: stalled._consumer.fanout.statistics().buffered  # noqa: E731 # pyright: ignore
            await race(stalled, aiter(subscription))
    elif case == "wool Fanout":
        from wool.utilities.fanout import Fanout as WoolFanout

        wool_fanout = WoolFanout(events())  # pyright: ignore[reportArgumentType]
        first = wool_fanout.consumer()
        # Its queue: the items, then the end-of-stream sentinel.
        count_buffered = lambda: first._queue.qsize() - 1  # noqa: E731 # pyright: ignore
        await race(first, wool_fanout.consumer())
        await wool_fanout.cleanup()
    elif case == "asyncstdlib.tee":
        import asyncstdlib

        tee = asyncstdlib.tee(events(), n=2)
        await race(tee[0], tee[1])
        await tee.aclose()
    elif case == "pump + streams":
        streams = [anyio.create_memory_object_stream[Any](math.inf) for _ in range(2)]
        count_buffered = lambda: streams[0][1].statistics().current_buffer_used  # noqa: E731

        async def pump() -> None:
            with streams[0][0], streams[1][0]:
                async for event in events():
                    for send, _ in streams:
                        send.send_nowait(event)

        async with anyio.create_task_group() as group:
            group.start_soon(pump)
            group.start_soon(race, streams[0][1], streams[1][1])
    else:  # the raw source, one reader, nothing stalled
        async for event in events():
            apply(got["reader"], event)
        reader_done()
        got["stalled"] = None
    if got["reader"] != expected:
        raise RuntimeError(f"{case}: the reader's view is not the source's")
    # One buffered event's cost (the event and two list slots), measured apart.
    gc.collect()
    tracemalloc.start()
    sample: list[DiscoveryEvent] = []
    async for event in events():
        sample.append(event)
        if len(sample) == 10_000:
            break
    per_event = tracemalloc.get_traced_memory()[0] / len(sample)
    tracemalloc.stop()
    stalled = got["stalled"]
    return dict(
        case=case,
        events=m,
        peak_mb=got["peak_mb"],
        buffered=got["buffered"],
        held_mb=None if got["buffered"] is None else got["buffered"] * per_event / 1e6,
        event_bytes=per_event,
        resumed=None if stalled is None else got["resumed"],
        skipped=None if stalled is None else got["skipped"],
        view_equal=None if stalled is None else stalled == got["reader"],
    )


def run_memory(out: Path, quick: bool, began: float) -> None:
    events = QUICK_MEMORY_EVENTS if quick else MEMORY_EVENTS
    cases = [
        case
        for case in MEMORY_CASES
        if (case != "wool Fanout" or importable("wool.utilities.fanout"))
        and (case != "asyncstdlib.tee" or importable("asyncstdlib"))
    ]
    rows = []
    for case in cases:
        runs = [
            json.loads(
                subprocess.run(
                    [sys.executable, __file__, "--memory-case", case, str(events)],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            )
            for _ in range(MEMORY_RUNS)
        ]
        runs.sort(key=lambda run: run["peak_mb"])
        rows.append(
            runs[len(runs) // 2] | {"peak_mb_runs": [r["peak_mb"] for r in runs]}
        )
        peaks = ", ".join(f"{run['peak_mb']:.2f}" for run in runs)
        print(
            f"memory: {case}: {rows[-1]['peak_mb']:.2f} MB ({peaks})", file=sys.stderr
        )
    meta = dict(python=sys.version, platform=platform.platform(), events=events)
    meta["run_seconds"] = time.perf_counter() - began  # the whole run, pyperf's too
    write(out, "memory", meta, rows)


# -- main ------------------------------------------------------------------------------


def add_cmdline_args(cmd: list[str], args: Any) -> None:
    if args.quick:
        cmd.append("--quick")


def main() -> None:
    if sys.argv[1:2] == ["--memory-case"]:
        row = anyio.run(memory_case, sys.argv[2], int(sys.argv[3]))
        print(json.dumps(row))
        return
    import pyperf

    # Four processes, not two: a case's speed differs from process to process
    # (trio, waiting source, N = 100: per-process fastest values of the
    # wake-up limit from 3.1 to 5.7 µs over ten processes).
    runner = pyperf.Runner(
        processes=4,
        values=2,
        warmups=1,
        min_time=0.05,
        add_cmdline_args=add_cmdline_args,
        metadata=dict(wool_pooling_interpreter=interpreter()),
    )
    runner.argparser.prog = "python benchmarks/throughput.py"
    runner.argparser.description = (
        f"{(__doc__ or '').splitlines()[0]} The options below --quick and --out "
        "are pyperf's."
    )
    runner.argparser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: tiny sizes, one value per case, in this process, quiet "
        "(add --verbose for pyperf's per-case lines and stability warnings); "
        "writes to a temporary folder unless --out is given",
    )
    runner.argparser.add_argument(
        "--out",
        type=Path,
        help="results folder (default: benchmarks/results, or a temporary folder "
        "with --quick)",
    )
    argv = sys.argv[1:]
    if "--quick" in argv and "--worker" not in argv:
        argv += ["--debug-single-value", "--in-process"]
        # One value per case always looks unstable to pyperf: say nothing of it.
        if not {"-v", "--verbose", "-q", "--quiet"} & set(argv):
            argv.append("--quiet")
    args = runner.parse_args(argv)
    began = time.perf_counter()
    if not args.worker:
        out = folder(args.out, args.quick)
        args.output = str(out / f"throughput-{interpreter()}.json")
        Path(args.output).unlink(missing_ok=True)  # this run replaces the last one
    delivered = QUICK_DELIVERED if args.quick else DELIVERED
    for backend in BACKENDS:
        for source in SOURCES:
            for n in NS:
                m = max(delivered // n, 3 if args.quick else LEAST_ITEMS)
                for name in implementations(backend, n):
                    runner.bench_time_func(
                        f"{backend}/{source}/{name}/N={n}",
                        time_runs,
                        backend,
                        name,
                        backend,
                        source,
                        m,
                        n,
                        inner_loops=m * (1 if name == "raw source" else n),
                    )
    for backend in BACKENDS:
        for workers in QUICK_JOIN_WORKERS if args.quick else JOIN_WORKERS:
            for what in ("arrival", "replay"):
                runner.bench_time_func(
                    f"join/{backend}/W={workers}/{what}",
                    time_join,
                    backend,
                    workers,
                    what,
                )
    if not args.worker:
        run_memory(out, args.quick, began)
        seconds = time.perf_counter() - began
        print(f"total: {seconds:.0f} s; results in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
