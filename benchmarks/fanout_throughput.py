"""Fan-out throughput, memory and late-join benchmarks, against the alternatives.

Run from the repository root::

    pip install -e '.[test,bench]'
    python benchmarks/fanout_throughput.py            # full run, about 8 minutes
    python benchmarks/fanout_throughput.py --quick    # smoke run, about 20 s
    python benchmarks/fanout_throughput.py --only memory  # one section

Everything is measured in one process run and written to ``--out`` (default
``benchmarks/results/``): ``fanout_throughput.md`` (the tables, also printed to
stdout at the end), ``fanout_throughput.json`` (raw figures) and
``fanout_throughput.png`` (items/s against N, one panel per backend and
source). A progress line per case goes to stderr. ``--only SECTION``
(repeatable) runs only some of throughput, memory and join, and names the
files after them (``fanout_throughput_memory.md``, ...).

**Throughput.** N = 1, 10, 100, 1000 concurrent consumers each take all M
items of one source; the figure is delivered items per second, M·N / wall
time (from releasing the N consumer tasks, already started and waiting at a
gate, to the last one finishing: spawning tasks is not delivery), median of
5 repetitions (3 with ``--quick``), with min-max. The repetitions of all
implementations for one backend, source and N are interleaved, one of each
per round, so that ratios compare figures taken moments apart. M is
calibrated per case so that one repetition takes about 0.25 s (and is at
least 50), then set to the median of the group's calibrated values, so that
all implementations in a row of the table do the same work (the floor keeps
its own); ``--quick`` uses a few hundred deliveries per case. Compared:

- ``fanout``: this library's :class:`wool_pooling.Fanout`;
- ``shared_subscription``: a ``@shared_subscription(max_lag=None)`` class
  whose ``__aiter__`` yields the source, N consumers of it inside
  ``async with SubscriptionPool()`` (the source waits for all N to join);
  unbounded because each consumer must take all M items, and a resync
  (the default bound) has no worker state to resend for plain ints;
- ``wool_fanout``: wool's ``wool.utilities.fanout.Fanout`` (asyncio only);
- ``tee``: ``asyncstdlib.tee``, with ``lock=trio.Lock()`` under trio and
  ``lock=asyncio.Lock()`` under asyncio when the source suspends (without a
  lock, concurrent peers would re-enter the suspended async generator);
- ``pump_streams``: one pump task feeding one anyio memory object stream per
  consumer (``send_nowait``, falling back to ``await send()`` when a buffer
  of 256 is full);
- ``floor``: one consumer iterating the raw source directly, measured once
  per backend and source; every row is compared against it.

Two sources: an async generator that never suspends, and one that passes one
checkpoint (``await anyio.lowlevel.checkpoint()``) per item. Backends:
asyncio, asyncio with uvloop (when importable), trio.

**Memory.** One consumer takes its first item and stalls; then another
takes M = 1,000,000 discovery-shaped events (20,000 with ``--quick``): fresh
``DiscoveryEvent`` objects over 100 workers that are added, dropped, added back
and updated (see :func:`churn_event`). Each case runs in a fresh process.
Reported: the growth of the peak resident set size until the reader is done
(Linux; tracemalloc's peak elsewhere), i.e. what is held for the stalled
consumer plus transient garbage; what the fan-out still holds then
(``statistics().buffered`` for this library's, a queue's or stream's size
for the others) and its estimated bytes; then the stalled consumer resumes
and reads to the end, and its view of the workers (uid -> metadata) is
compared with the reader's. Besides the implementations above:
``Fanout(max_lag=1024, on_lag="error")`` and the ``SharedSubscription``
with the decorator's default bound (1,024: a consumer further behind is
resynchronised with a diff of the workers), and the same without a bound.
The pump's streams are unbounded here: with a bounded buffer the stalled
consumer would block the pump, and the reading consumer would never finish
(likewise ``Fanout(on_lag="wait")``).

**Late join.** W = 10, 1,000, 10,000 (10, 100, 1,000 with ``--quick``)
``worker-added`` events are pushed
through a ``SharedSubscription`` and read by one consumer; then a new consumer
joins and takes its W replay events. Reported: the time the W events took to
arrive, the time of the late joiner's replay (from its first ``__anext__`` to
its W-th event), and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
import uuid
import warnings
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import attrs
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import Lagged
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

# -- what can run here -------------------------------------------------------


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


HAVE_TRIO = _importable("trio")
HAVE_UVLOOP = _importable("uvloop")
HAVE_ASYNCSTDLIB = _importable("asyncstdlib")
HAVE_MATPLOTLIB = _importable("matplotlib")
HAVE_WOOL_FANOUT = _importable("wool.utilities.fanout")

#: Backend id -> (anyio backend, backend options).
BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {"asyncio": ("asyncio", {})}
if HAVE_UVLOOP:
    BACKENDS["asyncio+uvloop"] = ("asyncio", {"use_uvloop": True})
if HAVE_TRIO:
    BACKENDS["trio"] = ("trio", {})

SOURCES = {
    "never-suspending": "never-suspending source",
    "one-checkpoint": "one checkpoint per item",
}

#: Implementation id -> label, in table order.
IMPLEMENTATIONS = {
    "fanout": "wool_pooling.Fanout",
    "shared_subscription": "SharedSubscription (pool)",
    "wool_fanout": "wool Fanout",
    "tee": "asyncstdlib.tee",
    "pump_streams": "pump + memory streams",
    "floor": "floor (raw source, 1 consumer)",
}

#: The bound ``@shared_subscription`` applies when none is given.
DEFAULT_MAX_LAG: int = (
    inspect.signature(shared_subscription).parameters["max_lag"].default
)

#: Memory case id -> label, in table order: the implementations above, with
#: this library's fan-out and shared subscription both unbounded and bounded.
MEMORY_IMPLEMENTATIONS = {
    "fanout": "wool_pooling.Fanout(max_lag=None), unbounded",
    "fanout_bounded": (
        f'wool_pooling.Fanout(max_lag={DEFAULT_MAX_LAG}, on_lag="error")'
    ),
    "shared_subscription": (
        f"SharedSubscription (pool, default max_lag={DEFAULT_MAX_LAG})"
    ),
    "shared_subscription_unbounded": "SharedSubscription (pool, max_lag=None)",
    "wool_fanout": IMPLEMENTATIONS["wool_fanout"],
    "tee": IMPLEMENTATIONS["tee"],
    "pump_streams": IMPLEMENTATIONS["pump_streams"],
    "floor": IMPLEMENTATIONS["floor"],
}

#: Sections of a run, for ``--only``.
SECTIONS = ("throughput", "memory", "join")

CONSUMER_COUNTS = (1, 10, 100, 1000)
JOIN_WORKERS = (10, 1_000, 10_000)
QUICK_JOIN_WORKERS = (10, 100, 1_000)
MEMORY_WORKERS = 100
#: Metadata versions per worker in the memory stream (updates cycle over them).
MEMORY_VARIANTS = 4
PUMP_BUFFER = 256
NO_PLOT = "matplotlib is not installed: no plot (pip install -e '.[bench]')"


def available_implementations() -> tuple[list[str], dict[str, str]]:
    """Return the implementations that can run here, and why others cannot."""
    skipped: dict[str, str] = {}
    if not HAVE_WOOL_FANOUT:
        skipped["wool_fanout"] = "wool.utilities.fanout is not importable"
    if not HAVE_ASYNCSTDLIB:
        skipped["tee"] = "asyncstdlib is not installed (pip install -e '.[bench]')"
    return [name for name in IMPLEMENTATIONS if name not in skipped], skipped


def memory_implementations(implementations: list[str]) -> list[str]:
    """The memory cases that can run, given the implementations that can."""
    return [
        name
        for name in MEMORY_IMPLEMENTATIONS
        if name in implementations or name.startswith(("fanout", "shared_"))
    ]


def runs_on(implementation: str, backend: str) -> bool:
    """Whether an implementation can run on a backend (wool's Fanout: asyncio)."""
    return implementation != "wool_fanout" or backend != "trio"


# -- sources -----------------------------------------------------------------


async def never_suspending(
    m: int, gate: anyio.Event | None = None
) -> AsyncIterator[int]:
    """Yield ``range(m)`` without ever suspending (after ``gate``, if given)."""
    if gate is not None:
        await gate.wait()
    for item in range(m):
        yield item


async def one_checkpoint(m: int, gate: anyio.Event | None = None) -> AsyncIterator[int]:
    """Yield ``range(m)``, passing one checkpoint before each item."""
    if gate is not None:
        await gate.wait()
    checkpoint = anyio.lowlevel.checkpoint
    for item in range(m):
        await checkpoint()
        yield item


SOURCE_FACTORIES: dict[str, Callable[..., AsyncIterator[int]]] = {
    "never-suspending": never_suspending,
    "one-checkpoint": one_checkpoint,
}


def make_metadata(count: int) -> list[WorkerMetadata]:
    return [
        WorkerMetadata(uid=uuid.uuid4(), address="127.0.0.1:1", pid=1, version="1")
        for _ in range(count)
    ]


def make_variants(workers: int, versions: int) -> list[list[WorkerMetadata]]:
    """``versions`` metadata per worker: same uid, different ``version``."""
    return [
        [
            WorkerMetadata(uid=uid, address="127.0.0.1:1", pid=1, version=str(v))
            for v in range(versions)
        ]
        for uid in (uuid.uuid4() for _ in range(workers))
    ]


def churn_event(index: int, variants: list[list[WorkerMetadata]]) -> DiscoveryEvent:
    """The ``index``-th event of the memory stream, a fresh object.

    Rounds of one event per worker: round 0 adds every worker; afterwards
    the even workers are dropped in odd rounds and added back in even ones,
    the odd workers updated; each round uses the next metadata version.
    """
    round_, worker = divmod(index, len(variants))
    if round_ == 0:
        kind = "worker-added"
    elif worker % 2 == 0:
        kind = "worker-dropped" if round_ % 2 else "worker-added"
    else:
        kind = "worker-updated"
    versions = variants[worker]
    return DiscoveryEvent(kind, metadata=versions[round_ % len(versions)])


def churn_state(m: int, variants: list[list[WorkerMetadata]]) -> dict[Any, Any]:
    """The workers known after the first ``m`` events of the memory stream."""
    state: dict[Any, Any] = {}
    for worker in range(min(m, len(variants))):
        last = worker + (m - 1 - worker) // len(variants) * len(variants)
        apply_event(state, churn_event(last, variants))
    return state


async def churn_events(
    m: int, variants: list[list[WorkerMetadata]]
) -> AsyncIterator[DiscoveryEvent]:
    """Yield the ``m`` first events of the memory stream, never suspending."""
    for index in range(m):
        yield churn_event(index, variants)


def apply_event(view: dict[Any, Any], event: Any) -> None:
    """Update a view (uid -> metadata) with one discovery event."""
    if not isinstance(event, DiscoveryEvent):
        return
    if event.type == "worker-dropped":
        view.pop(event.metadata.uid, None)
    else:
        view[event.metadata.uid] = event.metadata


class _Subscriber:
    """A subscriber whose single iteration is ``factory()``."""

    def __init__(self, factory: Callable[[], AsyncIterator[Any]]) -> None:
        self._factory = factory

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._factory()


@shared_subscription
class BenchSubscriber(_Subscriber):
    """A shared subscription with the default bound on lag (late join, memory)."""


@shared_subscription(max_lag=None)
class LosslessBenchSubscriber(_Subscriber):
    """A shared subscription without bound on lag (throughput, memory).

    Throughput checks that every consumer takes all M items: with a bound, a
    consumer that falls that many items of a never-suspending source behind
    would be resynchronised, and plain ints carry no worker state to resend.
    """


# -- throughput: one repetition of one case ------------------------------------


async def drain(iterator: AsyncIterator[Any], counts: list[int], index: int) -> None:
    count = 0
    async for _ in iterator:
        count += 1
    counts[index] = count


def check_counts(implementation: str, counts: list[int], m: int) -> None:
    if any(count != m for count in counts):
        raise RuntimeError(
            f"{implementation}: consumers received {sorted(set(counts))} items, "
            f"expected {m} each"
        )


async def gated(
    gate: anyio.Event, function: Callable[..., Awaitable[Any]], *args: Any
) -> None:
    await gate.wait()
    await function(*args)


async def run_consumers(
    iterators: list[AsyncIterator[Any]],
    *,
    pump: Callable[[], Awaitable[Any]] | None = None,
) -> tuple[float, list[int]]:
    """Drain every iterator in its own task; time from their release to the end.

    The tasks (and ``pump``, if any) are started first and wait at a gate;
    the clock starts when every one of them is blocked there, so spawning
    N tasks is not counted as delivery.
    """
    counts = [-1] * len(iterators)
    gate = anyio.Event()
    async with anyio.create_task_group() as group:
        if pump is not None:
            group.start_soon(gated, gate, pump)
        for index, iterator in enumerate(iterators):
            group.start_soon(gated, gate, drain, iterator, counts, index)
        await anyio.wait_all_tasks_blocked()
        start = time.perf_counter()
        gate.set()
    return time.perf_counter() - start, counts


async def bench_floor(source: str, m: int, n: int) -> float:
    elapsed, counts = await run_consumers([SOURCE_FACTORIES[source](m)])
    check_counts("floor", counts, m)
    return elapsed


async def bench_fanout(source: str, m: int, n: int) -> float:
    fanout = Fanout(SOURCE_FACTORIES[source](m))
    consumers = [fanout.consumer() for _ in range(n)]
    elapsed, counts = await run_consumers(list(consumers))
    await fanout.aclose()
    check_counts("fanout", counts, m)
    return elapsed


async def bench_shared_subscription(source: str, m: int, n: int) -> float:
    gate = anyio.Event()
    factory = SOURCE_FACTORIES[source]
    subscription = LosslessBenchSubscriber(lambda: factory(m, gate))
    counts = [-1] * n
    async with SubscriptionPool() as pool:
        async with anyio.create_task_group() as group:
            for index in range(n):
                group.start_soon(drain, aiter(subscription), counts, index)
            # Consumers join at their first __anext__: open the source once
            # all n are registered, so each takes all m items.
            while pool.statistics().consumers < n:
                await anyio.lowlevel.checkpoint()
            await anyio.wait_all_tasks_blocked()
            start = time.perf_counter()
            gate.set()
        elapsed = time.perf_counter() - start
    check_counts("shared_subscription", counts, m)
    return elapsed


async def bench_wool_fanout(source: str, m: int, n: int) -> float:
    from wool.utilities.fanout import Fanout as WoolFanout

    fanout = WoolFanout(SOURCE_FACTORIES[source](m))  # pyright: ignore[reportArgumentType]
    consumers = [fanout.consumer() for _ in range(n)]
    elapsed, counts = await run_consumers(list(consumers))
    await fanout.cleanup()
    check_counts("wool_fanout", counts, m)
    return elapsed


def tee_lock(
    backend: str, source: str
) -> contextlib.AbstractAsyncContextManager[Any] | None:
    """The ``lock=`` given to ``asyncstdlib.tee`` (see the module docstring)."""
    if backend == "trio":
        import trio

        return trio.Lock()
    if source != "never-suspending":
        return asyncio.Lock()
    return None


def tee_variant(backend: str, source: str) -> str:
    if backend == "trio":
        return "lock=trio.Lock()"
    return "no lock" if source == "never-suspending" else "lock=asyncio.Lock()"


async def bench_tee(source: str, m: int, n: int, backend: str) -> float:
    import asyncstdlib

    tee = asyncstdlib.tee(
        SOURCE_FACTORIES[source](m), n=n, lock=tee_lock(backend, source)
    )
    elapsed, counts = await run_consumers(list(tee))
    await tee.aclose()
    check_counts("tee", counts, m)
    return elapsed


async def bench_pump_streams(source: str, m: int, n: int) -> float:
    streams = [anyio.create_memory_object_stream[int](PUMP_BUFFER) for _ in range(n)]
    senders = [send for send, _ in streams]

    async def pump() -> None:
        try:
            async for item in SOURCE_FACTORIES[source](m):
                for send in senders:
                    try:
                        send.send_nowait(item)
                    except anyio.WouldBlock:
                        await send.send(item)
        finally:
            for send in senders:
                send.close()

    elapsed, counts = await run_consumers(
        [receive for _, receive in streams], pump=pump
    )
    for _, receive in streams:
        receive.close()
    check_counts("pump_streams", counts, m)
    return elapsed


def throughput_case(
    implementation: str, backend: str
) -> Callable[[str, int, int], Awaitable[float]]:
    if implementation == "tee":
        return lambda source, m, n: bench_tee(source, m, n, backend)
    return {
        "floor": bench_floor,
        "fanout": bench_fanout,
        "shared_subscription": bench_shared_subscription,
        "wool_fanout": bench_wool_fanout,
        "pump_streams": bench_pump_streams,
    }[implementation]


def run_on(backend: str, function: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``function(*args)`` in a fresh event loop of ``backend``."""
    name, options = BACKENDS[backend]
    gc.collect()
    return anyio.run(function, *args, backend=name, backend_options=options)


# -- sizes -------------------------------------------------------------------


#: Full mode: M is chosen so that one repetition takes about this long.
TARGET_SECONDS = 0.25
#: Full mode: at most this many deliveries (M x N) per repetition.
MAX_DELIVERED = 5_000_000
#: Full mode: every consumer takes at least this many items.
LEAST_ITEMS = 50


def quick_items(source: str, n: int) -> int:
    """M in quick mode: a few thousand deliveries, at least a few items each."""
    delivered = 500 if source == "never-suspending" else 300
    return max(delivered // n, 2)


def calibrate(
    backend: str,
    bench: Callable[[str, int, int], Awaitable[float]],
    source: str,
    n: int,
) -> int:
    """M such that one repetition takes about :data:`TARGET_SECONDS`.

    At least :data:`LEAST_ITEMS`, so that starting N tasks does not dominate
    the figure at large N even when delivery is slow. The trial runs double as
    the warm-up; they are not recorded.
    """
    m = max(1_000 // n, 10)
    while True:
        elapsed = run_on(backend, bench, source, m, n)
        if elapsed >= TARGET_SECONDS / 5 or m * n >= MAX_DELIVERED:
            break
        m *= 2 if elapsed >= TARGET_SECONDS / 20 else 10
    m = int(m * TARGET_SECONDS / max(elapsed, 1e-6))
    return max(LEAST_ITEMS, min(m, MAX_DELIVERED // n))


# -- memory ------------------------------------------------------------------


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (Linux), in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def _reset_peak_rss() -> bool:
    """Reset the peak resident set size (Linux >= 4.0); ``False`` if impossible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
        _status_bytes("VmHWM")
    except (OSError, LookupError):
        return False
    return True


class MemoryProbe:
    """Peak memory above a baseline: resident set size, else tracemalloc.

    The resident set (reset peak, then ``VmHWM - VmRSS`` at the start) costs
    nothing while the case runs and counts allocator overhead too; it needs a
    process of its own per case. tracemalloc counts Python allocations only
    and slows the run down several times.
    """

    def __init__(self) -> None:
        self.method = "rss" if _reset_peak_rss() else "tracemalloc"
        self._baseline = 0

    def start(self) -> None:
        gc.collect()
        if self.method == "rss":
            _reset_peak_rss()
            self._baseline = _status_bytes("VmRSS")
        else:
            tracemalloc.start()
            self._baseline = tracemalloc.get_traced_memory()[0]

    def peak(self) -> int:
        if self.method == "rss":
            return _status_bytes("VmHWM") - self._baseline
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak - self._baseline


def held_bytes_per_item(variants: list[list[WorkerMetadata]]) -> float:
    """Bytes one buffered event costs: the fresh event plus two list slots.

    Measured with tracemalloc on 10,000 events, after the case (so neither
    tracemalloc nor the memory it frees affect the measured peak).
    """
    sample = 10_000
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    events = [churn_event(index, variants) for index in range(sample)]
    counts = [1] * sample
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del events, counts
    return used / sample


async def memory_case(implementation: str, m: int, backend: str) -> dict[str, Any]:
    """Peak memory while one consumer is stalled and another reads ``m`` events.

    Then the stalled consumer resumes and reads to the end; its view of the
    workers is compared with the reader's.
    """
    variants = make_variants(MEMORY_WORKERS, MEMORY_VARIANTS)
    expected = churn_state(m, variants)
    probe = MemoryProbe()
    outcome = _StallOutcome()
    probe.start()
    start = time.perf_counter()

    def reader_done(buffered: int | None) -> None:
        outcome.peak = probe.peak()
        outcome.buffered = buffered

    if implementation == "floor":
        view: dict[Any, Any] = {}
        async for event in churn_events(m, variants):
            outcome.received += 1
            apply_event(view, event)
        outcome.reader_view = view
        reader_done(None)
    else:
        await _memory_with_stalled_consumer(
            implementation, m, variants, backend, outcome, reader_done
        )
    elapsed = time.perf_counter() - start
    if outcome.received != m:
        raise RuntimeError(
            f"{implementation}: the reader got {outcome.received} of {m} events"
        )
    if outcome.reader_view != expected:
        raise RuntimeError(f"{implementation}: the reader's view is not the source's")
    peak = outcome.peak
    stalled = implementation != "floor"
    # Calibrated last: the memory it frees would otherwise absorb the peak.
    item_bytes = held_bytes_per_item(variants)
    return {
        "implementation": implementation,
        "backend": backend,
        "events": m,
        "workers": MEMORY_WORKERS,
        "method": probe.method,
        "peak_bytes": peak,
        "peak_mb": peak / 1e6,
        "bytes_per_event": peak / m,
        "buffered_at_end": outcome.buffered,
        "item_bytes": item_bytes,
        "held_estimate_bytes": (
            None if outcome.buffered is None else outcome.buffered * item_bytes
        ),
        "resumed_items": outcome.resumed if stalled else None,
        "lagged_skipped": outcome.skipped if stalled else None,
        "view_equal": (
            outcome.stalled_view == outcome.reader_view if stalled else None
        ),
        "seconds": elapsed,
        "library_digest": library_digest(),
    }


@attrs.define
class _StallOutcome:
    """What one memory case observed."""

    received: int = 0
    peak: int = 0
    buffered: int | None = None
    reader_view: dict[Any, Any] = attrs.Factory(dict)
    stalled_view: dict[Any, Any] = attrs.Factory(dict)
    #: Items the stalled consumer received after it resumed.
    resumed: int = 0
    #: Items it was told it skipped (``Lagged``), if any.
    skipped: int = 0
    #: Items the fan-out holds (for the stalled consumer), where observable.
    count_buffered: Callable[[], int | None] = lambda: None


async def _memory_with_stalled_consumer(
    implementation: str,
    m: int,
    variants: list[list[WorkerMetadata]],
    backend: str,
    outcome: _StallOutcome,
    reader_done: Callable[[int | None], None],
) -> None:
    """Stall one consumer after its first item, read ``m`` items with another.

    The reader starts only once the stalled consumer has taken its first item
    (for a shared subscription: once it has joined, and pulled the first
    event). When the reader is done, ``reader_done(buffered)`` records the
    peak and what the fan-out still holds; then the stalled consumer resumes
    and reads to the end, catching :exc:`Lagged`.
    """
    joined = anyio.Event()
    resume = anyio.Event()

    async def stall(iterator: AsyncIterator[Any]) -> None:
        apply_event(outcome.stalled_view, await anext(iterator))
        joined.set()
        await resume.wait()
        while True:
            try:
                event = await anext(iterator)
            except Lagged as lagged:
                outcome.skipped += lagged.skipped
                continue
            except StopAsyncIteration:
                break
            outcome.resumed += 1
            apply_event(outcome.stalled_view, event)

    async def read(iterator: AsyncIterator[Any]) -> None:
        await joined.wait()
        async for event in iterator:
            outcome.received += 1
            apply_event(outcome.reader_view, event)
        reader_done(outcome.count_buffered())
        resume.set()

    async def race(stalled: AsyncIterator[Any], reader: AsyncIterator[Any]) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(stall, stalled)
            group.start_soon(read, reader)

    if implementation in ("fanout", "fanout_bounded"):
        if implementation == "fanout":
            fanout = Fanout(churn_events(m, variants))
        else:
            fanout = Fanout(
                churn_events(m, variants), max_lag=DEFAULT_MAX_LAG, on_lag="error"
            )
        outcome.count_buffered = lambda: fanout.statistics().buffered
        await race(fanout.consumer(), fanout.consumer())
        await fanout.aclose()
    elif implementation in ("shared_subscription", "shared_subscription_unbounded"):
        if implementation == "shared_subscription":
            subscription = BenchSubscriber(lambda: churn_events(m, variants))
        else:
            subscription = LosslessBenchSubscriber(lambda: churn_events(m, variants))
        async with SubscriptionPool() as pool:
            stalled = aiter(subscription)
            # The entry's fan-out, through the stalled consumer (private).
            outcome.count_buffered = lambda: (
                None
                if stalled._consumer is None
                else stalled._consumer.fanout.statistics().buffered
            )
            await race(stalled, aiter(subscription))
            if pool.statistics().entries:
                raise RuntimeError(f"{implementation}: the entry was not finalised")
    elif implementation == "wool_fanout":
        from wool.utilities.fanout import Fanout as WoolFanout

        wool_fanout = WoolFanout(churn_events(m, variants))  # pyright: ignore[reportArgumentType]
        stalled_wool = wool_fanout.consumer()
        # Its queue: the items, then the end-of-stream sentinel.
        outcome.count_buffered = lambda: stalled_wool._queue.qsize() - 1
        await race(stalled_wool, wool_fanout.consumer())
        await wool_fanout.cleanup()
    elif implementation == "tee":
        import asyncstdlib

        tee = asyncstdlib.tee(
            churn_events(m, variants),
            n=2,
            lock=tee_lock(backend, "never-suspending"),
        )
        await race(tee[0], tee[1])
        await tee.aclose()
    elif implementation == "pump_streams":
        streams = [
            anyio.create_memory_object_stream[DiscoveryEvent](math.inf)
            for _ in range(2)
        ]
        outcome.count_buffered = lambda: streams[0][1].statistics().current_buffer_used

        async def pump() -> None:
            with streams[0][0], streams[1][0]:
                async for event in churn_events(m, variants):
                    for send, _ in streams:
                        send.send_nowait(event)

        with streams[0][1], streams[1][1]:
            async with anyio.create_task_group() as group:
                group.start_soon(pump)
                group.start_soon(race, streams[0][1], streams[1][1])
    else:
        raise ValueError(implementation)


# -- late join ---------------------------------------------------------------


async def join_case(
    workers: int, metadata: list[WorkerMetadata]
) -> tuple[float, float]:
    """Return (arrival seconds of ``workers`` events, late joiner's replay seconds)."""

    async def source() -> AsyncIterator[DiscoveryEvent]:
        for worker in metadata[:workers]:
            yield DiscoveryEvent("worker-added", metadata=worker)
        await anyio.sleep_forever()

    subscription = BenchSubscriber(source)
    async with SubscriptionPool():
        first = aiter(subscription)
        start = time.perf_counter()
        for _ in range(workers):
            await anext(first)
        arrival = time.perf_counter() - start
        late = aiter(subscription)
        start = time.perf_counter()
        replay = [await anext(late) for _ in range(workers)]
        elapsed = time.perf_counter() - start
        expected = {worker.uid for worker in metadata[:workers]}
        if {event.metadata.uid for event in replay} != expected or any(
            event.type != "worker-added" for event in replay
        ):
            raise RuntimeError("the late joiner's replay is not one add per worker")
        await late.aclose()
        await first.aclose()
    return arrival, elapsed


# -- the run -----------------------------------------------------------------


def summarise(times: list[float], delivered: int) -> dict[str, Any]:
    rates = [delivered / t for t in times]
    return {
        "seconds": times,
        "rates": rates,
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
    }


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def human(rate: float) -> str:
    if rate >= 1e6:
        return f"{rate / 1e6:.2f}M"
    if rate >= 1e3:
        return f"{rate / 1e3:.1f}k"
    return f"{rate:.0f}"


def run_throughput(
    implementations: list[str], reps: int, quick: bool
) -> list[dict[str, Any]]:
    """Every case, grouped by backend, source and N.

    Within a group the repetitions are interleaved (one of each
    implementation per round), so that a ratio compares figures taken
    moments apart on a machine whose speed drifts.
    """
    groups: list[tuple[str, str, int, list[str]]] = []
    for backend in BACKENDS:
        for source in SOURCES:
            for n in CONSUMER_COUNTS:
                members = [
                    implementation
                    for implementation in implementations
                    if implementation != "floor" and runs_on(implementation, backend)
                ]
                if n == 1:
                    members.insert(0, "floor")
                groups.append((backend, source, n, members))
    total = sum(len(members) for *_, members in groups)
    results: list[dict[str, Any]] = []
    number = 0
    # The plain-asyncio M of each (source, N): see wool_reference.
    asyncio_sizes: dict[tuple[str, int], int] = {}
    for backend, source, n, members in groups:
        began = time.perf_counter()
        sizes: dict[str, int] = {}
        for implementation in members:
            bench = throughput_case(implementation, backend)
            sizes[implementation] = (
                quick_items(source, n)
                if quick
                else calibrate(backend, bench, source, n)
            )
        # One M for the whole group (the median of the calibrated ones; the
        # floor keeps its own), so that every ratio compares the same work:
        # at large N a smaller M would weigh the fixed per-task costs more.
        compared = [sizes[name] for name in members if name != "floor"]
        if compared and not quick:
            common = max(LEAST_ITEMS, int(statistics.median(compared)))
            if backend == "asyncio":
                asyncio_sizes[(source, n)] = common
            elif not runs_on("wool_fanout", backend):
                # Compared with wool's plain-asyncio figure (wool's Fanout
                # cannot run here): take the M it was measured at, so that
                # the ratio compares the same work.
                common = asyncio_sizes.get((source, n), common)
            for name in members:
                if name != "floor":
                    sizes[name] = common
        times: dict[str, list[float]] = {
            implementation: [] for implementation in members
        }
        for _ in range(reps):
            for implementation in members:
                bench = throughput_case(implementation, backend)
                m = sizes[implementation]
                times[implementation].append(run_on(backend, bench, source, m, n))
        for implementation in members:
            number += 1
            m = sizes[implementation]
            entry: dict[str, Any] = {
                "backend": backend,
                "source": source,
                "implementation": implementation,
                "n": n,
                "m": m,
                "delivered": m * n,
                **summarise(times[implementation], m * n),
            }
            if implementation == "tee":
                entry["variant"] = tee_variant(backend, source)
            results.append(entry)
            log(
                f"[{number:3}/{total}] {backend:<15} {source:<16} N={n:<5} "
                f"{IMPLEMENTATIONS[implementation]:<30} M={m:<8} "
                f"{human(entry['median'])} items/s "
                f"({human(entry['min'])}-{human(entry['max'])})"
            )
        log(f"      group done in {time.perf_counter() - began:.1f}s")
    return results


def run_memory(implementations: list[str], m: int) -> list[dict[str, Any]]:
    """Each case in a fresh interpreter, so no run inherits another's heap."""
    results: list[dict[str, Any]] = []
    for implementation in memory_implementations(implementations):
        began = time.perf_counter()
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--memory-case",
            implementation,
            "--events",
            str(m),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                f"memory case {implementation} failed ({done.returncode}):\n"
                + done.stderr
            )
        entry = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(entry)
        log(
            f"[memory] {MEMORY_IMPLEMENTATIONS[implementation]:<51} M={m:<9} "
            f"peak {entry['peak_mb']:8.1f} MB ({entry['bytes_per_event']:.0f} B/event,"
            f" {entry['method']}), buffered {fmt_count(entry['buffered_at_end'])}, "
            f"view equal {fmt_flag(entry['view_equal'])}  "
            f"{time.perf_counter() - began:.1f}s"
        )
    return results


def run_join(reps: int, quick: bool) -> list[dict[str, Any]]:
    counts = QUICK_JOIN_WORKERS if quick else JOIN_WORKERS
    metadata = make_metadata(max(counts))
    results: list[dict[str, Any]] = []
    for backend in BACKENDS:
        for workers in counts:
            if not quick:  # warm-up
                run_on(backend, join_case, workers, metadata)
            pairs = [run_on(backend, join_case, workers, metadata) for _ in range(reps)]
            arrival = [a for a, _ in pairs]
            replay = [r for _, r in pairs]
            entry = {
                "backend": backend,
                "workers": workers,
                "arrival_seconds": arrival,
                "replay_seconds": replay,
                "arrival_median": statistics.median(arrival),
                "replay_median": statistics.median(replay),
                "replay_min": min(replay),
                "replay_max": max(replay),
                "ratio": statistics.median(replay) / statistics.median(arrival),
            }
            results.append(entry)
            log(
                f"[join] {backend:<15} W={workers:<6} arrival "
                f"{entry['arrival_median'] * 1e3:8.2f} ms, replay "
                f"{entry['replay_median'] * 1e3:8.2f} ms ({entry['ratio']:.2f}x)"
            )
    return results


# -- reporting ---------------------------------------------------------------


def lookup(
    results: list[dict[str, Any]],
    backend: str,
    source: str,
    implementation: str,
    n: int,
) -> dict[str, Any] | None:
    for entry in results:
        if (
            entry["backend"] == backend
            and entry["source"] == source
            and entry["implementation"] == implementation
            and entry["n"] == n
        ):
            return entry
    return None


def wool_reference(
    results: list[dict[str, Any]], backend: str, source: str, n: int
) -> dict[str, Any] | None:
    """wool's Fanout on this backend, or on plain asyncio where it cannot run."""
    found = lookup(results, backend, source, "wool_fanout", n)
    if found is None:
        found = lookup(results, "asyncio", source, "wool_fanout", n)
    return found


def ratio(value: float, reference: dict[str, Any] | None) -> float | None:
    if reference is None or reference["median"] <= 0:
        return None
    return value / reference["median"]


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def throughput_tables(results: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for backend in BACKENDS:
        for source, title in SOURCES.items():
            floor = lookup(results, backend, source, "floor", 1)
            star = "" if backend != "trio" else " *"
            lines += [
                f"### {backend}, {title}",
                "",
                f"| N | implementation | M | items/s (median) | min-max "
                f"| vs wool Fanout{star} | vs floor |",
                "|---:|---|---:|---:|---|---:|---:|",
            ]
            if floor is not None:
                versus_wool = ratio(
                    floor["median"], wool_reference(results, backend, source, 1)
                )
                lines.append(
                    f"| 1 | {IMPLEMENTATIONS['floor']} | {floor['m']} "
                    f"| {human(floor['median'])} "
                    f"| {human(floor['min'])}-{human(floor['max'])} "
                    f"| {fmt_ratio(versus_wool)} | 1.00x |"
                )
            for n in CONSUMER_COUNTS:
                reference = wool_reference(results, backend, source, n)
                for implementation in IMPLEMENTATIONS:
                    entry = lookup(results, backend, source, implementation, n)
                    if entry is None or implementation == "floor":
                        continue
                    label = IMPLEMENTATIONS[implementation]
                    if "variant" in entry:
                        label += f" ({entry['variant']})"
                    lines.append(
                        f"| {n} | {label} | {entry['m']} | {human(entry['median'])} "
                        f"| {human(entry['min'])}-{human(entry['max'])} "
                        f"| {fmt_ratio(ratio(entry['median'], reference))} "
                        f"| {fmt_ratio(ratio(entry['median'], floor))} |"
                    )
            lines.append("")
    if "trio" in BACKENDS:
        lines += [
            "\\* wool's Fanout runs on asyncio only: trio rows are compared with "
            "its plain-asyncio figure for the same source and N, and take that "
            "asyncio group's M.",
            "",
        ]
    return lines


def reference_entry(
    results: list[dict[str, Any]], versus: str, backend: str, source: str, n: int
) -> dict[str, Any] | None:
    """The figure a target compares against: wool's Fanout, the tee or the floor."""
    if versus == "wool_fanout":
        return wool_reference(results, backend, source, n)
    if versus == "floor":
        return lookup(results, backend, source, "floor", 1)
    return lookup(results, backend, source, versus, n)


#: Issue 4's throughput targets: (source, N values, compared with, at least).
THROUGHPUT_TARGETS = (
    ("never-suspending", (10, 100, 1000), "wool_fanout", 3.0),
    ("never-suspending", CONSUMER_COUNTS, "tee", 1.0),
    ("never-suspending", (1,), "floor", 0.5),
    ("one-checkpoint", (1,), "floor", 0.5),
    ("one-checkpoint", (100,), "wool_fanout", 2.0),
)


def target_rows(
    results: list[dict[str, Any]], join: list[dict[str, Any]]
) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each target of issue 4 that was measured."""
    rows: list[tuple[str, str, bool]] = []
    for backend in BACKENDS:
        for implementation in ("fanout", "shared_subscription"):
            for source, counts, versus, least in THROUGHPUT_TARGETS:
                pairs: list[tuple[int, float]] = []
                for n in counts:
                    entry = lookup(results, backend, source, implementation, n)
                    other = reference_entry(results, versus, backend, source, n)
                    if entry is not None and other is not None:
                        pairs.append((n, entry["median"] / other["median"]))
                if not pairs:
                    continue
                where = "N=" + "/".join(str(n) for n, _ in pairs)
                name = "the floor" if versus == "floor" else IMPLEMENTATIONS[versus]
                rows.append(
                    (
                        f"{IMPLEMENTATIONS[implementation]}, {backend}, {source}, "
                        f"{where}: >= {least:g}x {name}",
                        ", ".join(f"{value:.2f}x" for _, value in pairs),
                        all(value >= least for _, value in pairs),
                    )
                )
    for entry in join:
        if entry["workers"] == max(JOIN_WORKERS):
            rows.append(
                (
                    f"join, {entry['backend']}, W={entry['workers']:,}: replay "
                    "well under arrival (checked here as <= 0.5x)",
                    f"{entry['ratio']:.2f}x",
                    entry["ratio"] <= 0.5,
                )
            )
    return rows


def fmt_count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def fmt_flag(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "**no**")


def resume_text(entry: dict[str, Any]) -> str:
    """What the stalled consumer received when it resumed."""
    if entry["resumed_items"] is None:
        return "-"
    text = f"{entry['resumed_items']:,} events"
    if entry["lagged_skipped"]:
        text = f"Lagged(skipped={entry['lagged_skipped']:,}), then {text}"
    elif entry["implementation"] == "shared_subscription":
        text = f"resync diff: {text}"
    return text


#: Issue 5's memory target: the shared subscription's peak, with the default bound.
MEMORY_TARGET_MB = 1.0


def memory_table(memory: list[dict[str, Any]], events: int, method: str) -> list[str]:
    lines = [
        "",
        f"## Memory: one consumer stalled, another takes {events:,} discovery "
        f"events ({MEMORY_WORKERS} workers)",
        "",
        "The stalled consumer takes the first event, then the reader starts. "
        "Peak = memory above the baseline until the reader is done, on asyncio, "
        f"each case in a fresh process; measured as {method}. Buffered = what "
        "the fan-out (queue, stream) still holds for the stalled consumer when "
        "the reader is done; held = buffered x "
        f"{memory[0]['item_bytes']:.0f} bytes (one fresh event and its slots, "
        "measured apart). Then the stalled consumer resumes and reads to the "
        "end: its view (uid -> metadata, from the events it received) is "
        "compared with the reader's, which equals the source's.",
        "",
        "| implementation | peak MB | bytes/event | buffered at end | held (est.) "
        "| stalled consumer on resume | view equal after resume |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for entry in memory:
        held = entry["held_estimate_bytes"]
        lines.append(
            f"| {MEMORY_IMPLEMENTATIONS[entry['implementation']]} "
            f"| {entry['peak_mb']:.2f} | {entry['bytes_per_event']:.1f} "
            f"| {fmt_count(entry['buffered_at_end'])} "
            f"| {'-' if held is None else f'{held / 1e6:.2f} MB'} "
            f"| {resume_text(entry)} | {fmt_flag(entry['view_equal'])} |"
        )
    bounded = [e for e in memory if e["implementation"] == "shared_subscription"]
    if bounded:
        entry = bounded[0]
        lines += [
            "",
            "### Targets of issue 5",
            "",
            "| target | measured | met |",
            "|---|---:|---|",
            f"| {MEMORY_IMPLEMENTATIONS['shared_subscription']}: peak under "
            f"{MEMORY_TARGET_MB:g} MB | {entry['peak_mb']:.2f} MB "
            f"| {fmt_flag(entry['peak_mb'] < MEMORY_TARGET_MB)} |",
            f"| the same: the stalled consumer's view equals the live view after "
            f"it resumes | {fmt_flag(entry['view_equal'])} "
            f"| {fmt_flag(entry['view_equal'])} |",
        ]
    return lines


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    methods = {entry["method"] for entry in report["memory"]}
    memory_method = " and ".join(
        {
            "rss": "the growth of the peak resident set size (reset first)",
            "tracemalloc": "the tracemalloc peak (Python allocations only)",
        }[method]
        for method in sorted(methods)
    )
    sections = meta["sections"]
    lines = [
        "# Fan-out throughput",
        "",
        f"`{meta['command']}` on {meta['date']} (wool_pooling source "
        f"{meta['library_digest']}): Python {meta['python']}, "
        f"{meta['platform']}, {meta['cpus']} CPUs"
        + (
            f"; {meta['repetitions']} repetitions per case (median, min-max)"
            if {"throughput", "join"} & set(sections)
            else ""
        )
        + f"{', QUICK mode' if meta['quick'] else ''}"
        f"{'' if len(sections) == len(SECTIONS) else ', only ' + ', '.join(sections)}"
        ".",
        "",
    ]
    if meta["library_changed_during_run"]:
        lines += [
            "**Warning: the library's source changed during this run; its figures "
            "mix versions.**",
            "",
        ]
    if meta["skipped"]:
        lines += ["Skipped here:", ""]
        lines += [f"- {name}: {why}" for name, why in meta["skipped"].items()]
        lines.append("")
    if "throughput" in sections:
        lines += [
            "## Throughput",
            "",
            "Delivered items/s = M x N / wall time, N consumers each taking all "
            "M items.",
            "",
        ]
        lines += throughput_tables(report["throughput"])
    targets = target_rows(report["throughput"], report["join"])
    if targets:
        lines += [
            "## Targets of issue 4",
            "",
            "| target | measured | met |",
            "|---|---:|---|",
        ]
        for target, measured, met in targets:
            lines.append(f"| {target} | {measured} | {fmt_flag(met)} |")
    if report["memory"]:
        lines += memory_table(report["memory"], meta["memory_events"], memory_method)
    if report["join"]:
        lines += [
            "",
            "## Late join: replay of W known workers",
            "",
            "| backend | W | arrival of W events (ms) | late joiner's replay (ms) "
            "| replay min-max (ms) | replay / arrival |",
            "|---|---:|---:|---:|---|---:|",
        ]
        for entry in report["join"]:
            lines.append(
                f"| {entry['backend']} | {entry['workers']:,} "
                f"| {entry['arrival_median'] * 1e3:.2f} "
                f"| {entry['replay_median'] * 1e3:.3f} "
                f"| {entry['replay_min'] * 1e3:.3f}-{entry['replay_max'] * 1e3:.3f} "
                f"| {entry['ratio']:.2f}x |"
            )
    lines.append("")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> bool:
    if not HAVE_MATPLOTLIB:
        warnings.warn(NO_PLOT, stacklevel=1)
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["throughput"]
    backends = list(BACKENDS)
    figure, axes = plt.subplots(
        len(backends),
        len(SOURCES),
        figsize=(6 * len(SOURCES), 4 * len(backends)),
        squeeze=False,
    )
    for row, backend in enumerate(backends):
        for column, source in enumerate(SOURCES):
            axis = axes[row][column]
            for number, (implementation, label) in enumerate(IMPLEMENTATIONS.items()):
                colour = f"C{number}"
                if implementation == "floor":
                    floor = lookup(results, backend, source, "floor", 1)
                    if floor is not None:
                        axis.axhline(
                            floor["median"], color="grey", linestyle="--", label=label
                        )
                    continue
                points = [
                    entry
                    for n in CONSUMER_COUNTS
                    if (entry := lookup(results, backend, source, implementation, n))
                ]
                if not points:
                    continue
                xs = [entry["n"] for entry in points]
                ys = [entry["median"] for entry in points]
                errors = [
                    [entry["median"] - entry["min"] for entry in points],
                    [entry["max"] - entry["median"] for entry in points],
                ]
                axis.errorbar(
                    xs,
                    ys,
                    yerr=errors,
                    marker="o",
                    capsize=3,
                    label=label,
                    color=colour,
                )
            axis.set_xscale("log")
            axis.set_yscale("log")
            axis.set_xlabel("consumers N")
            axis.set_ylabel("delivered items/s")
            axis.set_title(f"{backend}, {SOURCES[source]}")
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def library_digest() -> str:
    """A short hash of ``wool_pooling``'s source, to tell runs of versions apart."""
    import wool_pooling

    digest = hashlib.sha256()
    for path in sorted(Path(wool_pooling.__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: a smoke run of a few seconds"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results",
        help="directory for the .md, .json and .png files (default: %(default)s)",
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        default=None,
        help="timed repetitions per case, at least 3 (default: 5, --quick: 3)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="run only this section (repeatable); the files are then named "
        "fanout_throughput_<sections>.* so a full run's results are kept",
    )
    # Internal: one memory case, in a process of its own (see run_memory).
    parser.add_argument("--memory-case", help=argparse.SUPPRESS)
    parser.add_argument("--events", type=int, default=0, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.memory_case is not None:
        entry = anyio.run(memory_case, options.memory_case, options.events, "asyncio")
        print(json.dumps(entry))
        return 0
    reps = options.repetitions or (3 if options.quick else 5)
    if reps < 3:
        parser.error("--repetitions must be at least 3")
    implementations, skipped = available_implementations()
    if not HAVE_UVLOOP:
        skipped["asyncio+uvloop backend"] = "uvloop is not installed"
    if not HAVE_TRIO:
        skipped["trio backend"] = "trio is not installed"
    if not HAVE_MATPLOTLIB:
        skipped["plot"] = NO_PLOT
    for name, why in skipped.items():
        log(f"skipping {name}: {why}")
    # Leave the imported modules out of every collection, so that collecting
    # between repetitions is cheap and the collections during one stay small.
    gc.collect()
    gc.freeze()
    sections = [name for name in SECTIONS if name in (options.only or SECTIONS)]
    stem = "fanout_throughput"
    if options.only:
        stem += "_" + "_".join(sections)
    memory_events = 20_000 if options.quick else 1_000_000
    began = time.perf_counter()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    digest = library_digest()
    throughput = (
        run_throughput(implementations, reps, options.quick)
        if "throughput" in sections
        else []
    )
    memory = run_memory(implementations, memory_events) if "memory" in sections else []
    join = run_join(reps, options.quick) if "join" in sections else []
    report: dict[str, Any] = {
        "meta": {
            "command": "python benchmarks/fanout_throughput.py"
            + (" --quick" if options.quick else "")
            + "".join(f" --only {name}" for name in options.only or ()),
            "sections": sections,
            "date": started,
            "library_digest": digest,
            "library_changed_during_run": any(
                entry["library_digest"] != digest for entry in memory
            )
            or library_digest() != digest,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "quick": options.quick,
            "repetitions": reps,
            "backends": list(BACKENDS),
            "sources": list(SOURCES),
            "implementations": implementations,
            "labels": IMPLEMENTATIONS,
            "memory_labels": MEMORY_IMPLEMENTATIONS,
            "default_max_lag": DEFAULT_MAX_LAG,
            "skipped": skipped,
            "memory_events": memory_events,
            "pump_buffer": PUMP_BUFFER,
            "versions": {
                name: version(name)
                for name in (
                    "wool-pooling",
                    "wool",
                    "anyio",
                    "trio",
                    "asyncstdlib",
                    "uvloop",
                )
            },
        },
        "throughput": throughput,
        "memory": memory,
        "join": join,
    }
    options.out.mkdir(parents=True, exist_ok=True)
    table = markdown(report)
    if throughput and plot(report, options.out / f"{stem}.png"):
        table += f"\n![items/s against N]({stem}.png)\n"
    report["meta"]["seconds"] = time.perf_counter() - began
    (options.out / f"{stem}.md").write_text(table, encoding="utf-8")
    (options.out / f"{stem}.json").write_text(
        json.dumps(report, indent=2), encoding="utf-8"
    )
    log(f"done in {report['meta']['seconds']:.0f}s; results in {options.out}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
