"""What pooling buys a wool process: K discovery consumers, raw and pooled.

Run from the repository root::

    python benchmarks/pooling.py              # record: benchmarks/results/
    python benchmarks/pooling.py --quick      # smoke: a temporary folder
    python benchmarks/pooling.py --out DIR    # record into DIR

For each discovery kind (today one: ``wool.LocalDiscovery``; add a row to
``KINDS`` for another) and K = 1, 10, 100, 1,000 and 10,000 consumers, two
configurations: ``raw`` (each consumer iterates a subscriber of its own,
``kind.make(ns).subscribe(**options)``) and ``pooled`` (every consumer
iterates ``SharedDiscovery(kind.make(ns), **options).subscribe()``), with
the same options (``poll_interval=0.1``) for both. Each configuration runs
in a fresh process; the whole set runs three times (``--runs``), raw and pooled
alternating (which goes first alternates too), and the report takes
medians. Raw at K = 10,000 is measured once: it fails at Linux's inotify
instance limit (128 per user), as it does from K = 1,000 on; its dispatch
figures are not measured (K client tasks are beside the point there). Each
process measures in turn:

- upstream subscriptions open once every consumer holds the first worker
  (counted after the idle period, once a joiner's rescan has closed):
  watchdog observer threads, one per ``LocalDiscovery`` iteration, and the
  shared-memory handles open in the process;
- idle cost while nothing changes: process CPU seconds per wall second (all
  threads), the resident set size (current and peak), and the RSS the K
  consumers added, per consumer;
- convergence: W = 10, 100, 1,000 workers (K = 10,000: W = 1,000 only)
  published through the discovery's publisher, seconds from the first
  publish until every consumer holds all W; then the same for W drops. The
  publisher's own time (the publish calls) is recorded too, and the
  delivery rate is K x W over the convergence time less the publisher's.
  Each W is added and dropped three times and each figure is the median of
  the three (at K = 10,000 a round takes about 20 s, and one alone moved
  the delivery rate by up to 20% between runs);
- pooled, from K = 1,000 on: the fan-out's own delivery rate, for
  comparison in the same process: a ``wool_pooling.Fanout`` of 1,000
  discovery events to N = K consumers doing the same per-event work as
  the consumers above (the median of three measurements: one is as noisy
  as the machine); and, as recorded before, to N = 1,000 consumers (at
  K = 10,000 that rate is about 25% higher: ten times fewer views to
  update, each a dict of W workers, fit the processor's caches better).

Then, for K < 10,000, two more fresh processes measure dispatch, raw and
pooled side by side: two real ``wool.WorkerPool(spawn=2,
discovery=...)`` open at once (raw: the kind's plain discovery,
subscribed with the same options; pooled: its ``SharedDiscovery``), K
client tasks each dispatching ``leaf`` (a plain routine) and then
``nested`` (a routine that dispatches ``leaf`` from the worker, so each
worker unpickles the proxies) in a loop, in 16 alternating bursts of
0.375 s per pool (6 s per pool and routine), so that a drift of the shared
machine meets both alike. Which pool opens first, and so spawns its
workers first, is a difference of its own (a few percent either way), so
one process opens raw first and the other pooled first, and the run's
figures pool both: dispatches per second over both processes' time, p50/p99
latency over all their dispatches. Per dispatch too, the pickled size of
each pool's proxy (which wool ships with every task), the time to pickle it
in the parent and to unpickle it in a worker (the mean of the two
processes).

Writes ``pooling-cpython3.11.json`` (every figure, and the run's length);
``benchmarks/report.py`` renders the table: each figure pooled / raw (the
median over the runs of each run's ratio), plus both absolute figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import wool
from _results import folder
from _results import meta
from _results import write
from watchdog.observers.api import BaseObserver
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import SharedDiscovery

CONSUMERS, QUICK_CONSUMERS = (1, 10, 100, 1000, 10_000), (1, 10)
#: Consumers from which raw cannot run (inotify): measured in the first run only.
RAW_ONCE = 10_000
WORKERS, QUICK_WORKERS = (10, 100, 1000), (10,)
#: Workers for K = 10,000 (one million deliveries per 100 workers).
WORKERS_AT_10K = (1000,)
RUNS, QUICK_RUNS = 3, 1
#: Which pool opens first in a run's dispatch processes: both, one each.
DISPATCH_ORDERS = ("raw", "pooled")
#: The fan-out comparison: M events to K consumers, and to N.
FANOUT_N, FANOUT_M, QUICK_FANOUT_M = 1000, 1000, 100
#: Serialisation timings: pickles of the proxy per figure (median of rounds).
SERIALISE_LOOPS, SERIALISE_ROUNDS = 200, 5
IDLE_SECONDS, QUICK_IDLE_SECONDS = 3.0, 0.3
#: Dispatch seconds per pool and routine in one dispatch process; each run
#: has two such processes, one per opening order (see ``dispatch``).
DISPATCH_SECONDS, QUICK_DISPATCH_SECONDS = 6.0, 0.3
#: Alternating bursts each configuration's dispatch time is cut into.
DISPATCH_BURSTS = 16
#: Measurements of the fan-out's own rate per process (the median is used).
FANOUT_REPEATS = 3
#: Add-and-drop rounds per W, as many as the fan-out's own rate gets (each
#: figure is the median over the rounds).
CONVERGE_REPEATS = FANOUT_REPEATS
CAPACITY = 2048  # the namespace's bound on workers (wool's default is 128)
DEADLINE = 300.0  # bound on any one wait


@dataclass(frozen=True)
class Kind:
    """A discovery to measure: how to make it for a namespace, and subscribe."""

    label: str
    make: Callable[[str], Any]
    options: dict[str, Any] = field(default_factory=dict[str, Any])


#: Discovery kinds, one table row group each (a Redis discovery can be added).
KINDS: dict[str, Kind] = {
    "local": Kind("wool.LocalDiscovery", wool.LocalDiscovery, {"poll_interval": 0.1}),
}


def status_mb(field_name: str) -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    raise LookupError(field_name)


def observers() -> int:
    """Watchdog observer threads alive: one per LocalDiscovery iteration."""
    return sum(
        isinstance(thread, BaseObserver) and thread.is_alive()
        for thread in threading.enumerate()
    )


def shared_memory_handles() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/shm/")
    return count


def fake_workers(count: int) -> list[WorkerMetadata]:
    return [
        WorkerMetadata(uid=uuid.uuid4(), address="127.0.0.1:1", pid=1, version="1")
        for _ in range(count)
    ]


class Views:
    """Every consumer's view (uid -> metadata), and a wait until all have ``size``.

    Counts the consumers whose view has the target size as events arrive, so
    that a wait costs O(1) per event, not O(K) per wake-up: the figures are
    the pooling's, not this bookkeeping's.
    """

    def __init__(self, k: int) -> None:
        self.views: list[dict[Any, Any]] = [{} for _ in range(k)]
        self.changed = asyncio.Event()
        #: Consumers whose subscription raised, and the first error.
        self.failed: set[int] = set()
        self.error: str | None = None
        self.target = -1
        self.at_target = 0

    def fail(self, index: int, error: Exception) -> None:
        self.failed.add(index)
        if len(self.views[index]) == self.target:
            self.at_target -= 1
        self.error = self.error or f"{type(error).__name__}: {error}"
        self.changed.set()

    def apply(self, index: int, event: Any) -> None:
        view = self.views[index]
        before = len(view)
        if event.type == "worker-dropped":
            view.pop(event.metadata.uid, None)
        else:
            view[event.metadata.uid] = event.metadata
        after = len(view)
        if after != before:
            target = self.target
            if after == target:
                self.at_target += 1
                if self.at_target == len(self.views) - len(self.failed):
                    self.changed.set()
            elif before == target:
                self.at_target -= 1

    async def wait_all(self, size: int) -> None:
        self.target = size
        self.at_target = sum(
            len(view) == size
            for index, view in enumerate(self.views)
            if index not in self.failed
        )
        async with asyncio.timeout(DEADLINE):
            while self.at_target != len(self.views) - len(self.failed):
                self.changed.clear()
                await self.changed.wait()


def make_discovery(kind: Kind, namespace: str, pooled: bool) -> Any:
    """The discovery a pool is given: the kind's, subscribed with its options."""
    if pooled:
        return SharedDiscovery(kind.make(namespace), **kind.options)
    return WithOptions(kind.make(namespace), kind.options)


class WithOptions:
    """A raw discovery whose subscribers get ``options`` (``poll_interval``), so
    that raw and pooled pools poll alike; entered as the inner one is."""

    def __init__(self, inner: Any, options: dict[str, Any]) -> None:
        self.inner, self.options = inner, options

    @property
    def publisher(self) -> Any:
        return self.inner.publisher

    @property
    def subscriber(self) -> Any:
        return self.subscribe()

    def subscribe(self, filter: Any = None) -> Any:
        return self.inner.subscribe(filter, **self.options)

    def __enter__(self) -> WithOptions:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.inner.__exit__(*exc_info)


async def measure(kind_name: str, pooled: bool, k: int, quick: bool) -> dict[str, Any]:
    """One configuration, in this (fresh) process."""
    kind = KINDS[kind_name]
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    result: dict[str, Any] = dict(kind=kind_name, pooled=pooled, k=k)
    owner = kind.make(namespace)
    if kind_name == "local":
        owner = wool.LocalDiscovery(namespace, capacity=CAPACITY)
    with owner:
        shared = SharedDiscovery(kind.make(namespace), **kind.options)
        views = Views(k)

        async def consume(index: int) -> None:
            if pooled:
                subscription: Any = shared.subscribe()
            else:
                subscription = kind.make(namespace).subscribe(**kind.options)
            try:
                async for event in subscription:
                    views.apply(index, event)
            except Exception as error:  # counted: no consumer fails unseen
                views.fail(index, error)

        rss_before = status_mb("VmRSS")
        tasks = [asyncio.create_task(consume(index)) for index in range(k)]
        publisher: Any = owner.publisher
        async with publisher:
            first = fake_workers(1)[0]
            await publisher.publish("worker-added", first)
            await views.wait_all(1)
            result.update(failed=len(views.failed), error=views.error)
            idle = QUICK_IDLE_SECONDS if quick else IDLE_SECONDS
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.sleep(idle)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            result.update(observers=observers(), shm_handles=shared_memory_handles())
            result.update(idle_cpu=cpu / wall, rss_mb=status_mb("VmRSS"))
            result["max_rss_mb"] = status_mb("VmHWM")
            result["rss_kb_per_consumer"] = (
                1024 * (result["rss_mb"] - rss_before) / max(1, k - len(views.failed))
            )
            result["converge"] = {}
            sizes = WORKERS_AT_10K if k >= 10_000 else WORKERS
            for w in QUICK_WORKERS if quick else sizes:
                rounds: list[dict[str, float]] = []
                for _ in range(CONVERGE_REPEATS):
                    figures: dict[str, float] = {}
                    batch = fake_workers(w)
                    for what, event in (
                        ("added", "worker-added"),
                        ("dropped", "worker-dropped"),
                    ):
                        start = time.perf_counter()
                        for metadata in batch:
                            await publisher.publish(event, metadata)
                        published = time.perf_counter() - start
                        await views.wait_all(1 + w if what == "added" else 1)
                        figures[what] = time.perf_counter() - start
                        figures[f"{what}_publisher"] = published
                        net = figures[what] - published
                        deliveries = w * (k - len(views.failed))
                        figures[f"{what}_rate"] = deliveries / net if net > 0 else 0.0
                    rounds.append(figures)
                result["converge"][str(w)] = {
                    name: statistics.median(r[name] for r in rounds)
                    for name in rounds[0]
                } | {"rounds": rounds}
            await publisher.publish("worker-dropped", first)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    result["fanout_rate"] = None
    if pooled and (quick or k >= 1000):  # what the pooled deliveries compare with
        m = QUICK_FANOUT_M if quick else FANOUT_M
        rates = [await fanout_rate(k, m) for _ in range(FANOUT_REPEATS)]
        result["fanout_rates"] = rates
        result["fanout_rate"] = statistics.median(rates)
        at_n = rates
        if k != FANOUT_N:
            at_n = [await fanout_rate(FANOUT_N, m) for _ in range(FANOUT_REPEATS)]
        result["fanout_rates_at_n"] = at_n
        result["fanout_rate_at_n"] = statistics.median(at_n)
    result["dispatch"] = result["dispatch_leaf"] = None
    return result


async def fanout_rate(n: int, m: int) -> float:
    """Deliveries per second of a ``Fanout`` of ``m`` discovery events to
    ``n`` consumers applying each to a view, as the consumers above."""
    events = [
        wool.DiscoveryEvent("worker-added", metadata=metadata)
        for metadata in fake_workers(m)
    ]

    async def source() -> Any:
        for event in events:
            yield event

    fanout = Fanout(source())
    views = Views(n)
    consumers = [fanout.consumer() for _ in range(n)]

    async def consume(index: int, consumer: Any) -> None:
        async for event in consumer:
            views.apply(index, event)

    start = time.perf_counter()
    await asyncio.gather(*(consume(i, c) for i, c in enumerate(consumers)))
    elapsed = time.perf_counter() - start
    await fanout.aclose()
    assert all(len(view) == m for view in views.views)
    return n * m / elapsed


async def dispatch(kind: Kind, k: int, quick: bool, first: str) -> dict[str, Any]:
    """K client tasks dispatching through two pools of 2 spawned workers each,
    raw and pooled, open side by side in this process (``first`` opens
    first): ``leaf``, then ``nested``, in alternating bursts (which pool goes
    first alternates too), so that both meet the same machine; and what each
    pool's proxy costs a task. Returns ``{"raw": figures, "pooled": figures}``,
    every latency included (``merge_dispatches`` pools two such processes)."""
    from pooling_routines import leaf
    from pooling_routines import nested
    from pooling_routines import unpickle_seconds

    seconds = QUICK_DISPATCH_SECONDS if quick else DISPATCH_SECONDS
    burst = seconds / DISPATCH_BURSTS
    stop = asyncio.Event()

    async def hold(pooled: bool, ready: asyncio.Future[contextvars.Context]) -> None:
        """Keep a pool open; hand over a context in which routines dispatch to it."""
        namespace = f"bench-{uuid.uuid4().hex[:12]}"
        async with wool.WorkerPool(
            spawn=2, discovery=make_discovery(kind, namespace, pooled)
        ):
            ready.set_result(contextvars.copy_context())
            await stop.wait()

    async def run(
        routine: Any, offset: int, until: float
    ) -> tuple[list[float], list[str]]:
        latencies: list[float] = []
        errors: list[str] = []

        async def client(index: int) -> None:
            while time.perf_counter() < until:
                start = time.perf_counter()
                try:
                    result = await routine(index)
                except Exception as error:  # counted, like a wrong result
                    errors.append(f"{type(error).__name__}: {error}")
                    continue
                if result != index + offset:
                    errors.append(f"{routine.__name__} returned {result!r}")
                    continue
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(client(i) for i in range(k)))
        return latencies, errors

    async def warm_up() -> None:
        await asyncio.gather(*(nested(index) for index in range(4)))

    loop = asyncio.get_running_loop()
    contexts: dict[str, contextvars.Context] = {}
    holders = []
    for name in (first, "pooled" if first == "raw" else "raw"):
        ready: asyncio.Future[contextvars.Context] = loop.create_future()
        holders.append(asyncio.create_task(hold(name == "pooled", ready)))
        async with asyncio.timeout(DEADLINE):
            contexts[name] = await ready

    def within(name: str, coroutine: Any) -> asyncio.Task[Any]:
        return asyncio.create_task(coroutine, context=contexts[name])

    figures: dict[str, dict[str, Any]] = {"raw": {}, "pooled": {}}
    try:
        async with asyncio.timeout(DEADLINE):
            for name in contexts:  # every worker has served a nested dispatch
                await within(name, warm_up())
        for routine, offset in ((leaf, 1), (nested, 2)):
            latencies: dict[str, list[float]] = {"raw": [], "pooled": []}
            errors: dict[str, list[str]] = {"raw": [], "pooled": []}
            walls = {"raw": 0.0, "pooled": 0.0}
            for index in range(DISPATCH_BURSTS):
                order = ("raw", "pooled") if index % 2 == 0 else ("pooled", "raw")
                for name in order:
                    start = time.perf_counter()
                    async with asyncio.timeout(DEADLINE):
                        got, failed = await within(
                            name, run(routine, offset, start + burst)
                        )
                    walls[name] += time.perf_counter() - start
                    latencies[name] += got
                    errors[name] += failed
            for name in contexts:
                times = sorted(latencies[name])
                if not times:
                    raise RuntimeError(f"no dispatch succeeded: {errors[name][:1]}")
                figures[name][routine.__name__] = dict(
                    dispatch_figures(times, walls[name], errors[name]),
                    latencies=times,
                    errors=errors[name],
                )
        for name, context in contexts.items():
            proxy = context.run(wool.__proxy__.get)
            serializer = wool.CloudpickleSerializer()
            data = serializer.dumps(proxy)
            rounds = []
            for _ in range(SERIALISE_ROUNDS):
                start = time.perf_counter()
                for _ in range(SERIALISE_LOOPS):
                    serializer.dumps(proxy)
                rounds.append((time.perf_counter() - start) / SERIALISE_LOOPS)
            async with asyncio.timeout(DEADLINE):
                worker = await within(
                    name, unpickle_seconds(data, SERIALISE_LOOPS, SERIALISE_ROUNDS)
                )
            figures[name]["serialise"] = dict(
                proxy_bytes=len(data),
                parent_dumps_us=1e6 * statistics.median(rounds),
                worker_loads_us=1e6 * worker,
            )
    finally:
        stop.set()
        await asyncio.gather(*holders)
    return figures


def dispatch_figures(
    times: list[float], wall: float, errors: list[str]
) -> dict[str, Any]:
    """Rate and latency of one pool's dispatches (``times``: sorted latencies)."""
    return dict(
        failed=len(errors),
        error=errors[0] if errors else None,
        dispatches=len(times),
        wall=wall,
        per_second=len(times) / wall,
        p50=statistics.median(times),
        p99=times[min(len(times) - 1, int(len(times) * 0.99))],
    )


def merge_dispatches(children: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's dispatch figures from its processes (one per opening order):
    per pool and routine, every dispatch over the processes' summed wall time,
    latency percentiles over all latencies; serialisation, the mean."""
    merged: dict[str, Any] = {}
    for name in ("raw", "pooled"):
        merged[name] = {}
        for routine in ("leaf", "nested"):
            parts = [child[name][routine] for child in children]
            times = sorted(t for part in parts for t in part["latencies"])
            errors = [e for part in parts for e in part["errors"]]
            merged[name][routine] = dispatch_figures(
                times, sum(part["wall"] for part in parts), errors
            ) | {"per_order": [part["per_second"] for part in parts]}
        merged[name]["serialise"] = {
            field: statistics.mean(
                child[name]["serialise"][field] for child in children
            )
            for field in children[0][name]["serialise"]
        }
    return merged


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small K, short waits")
    parser.add_argument("--out", type=Path, help="results folder")
    parser.add_argument("--kind", action="append", choices=list(KINDS))
    parser.add_argument(
        "--runs", type=int, help=f"runs of the whole set (default {RUNS}; --quick: 1)"
    )
    parser.add_argument("--configuration", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--dispatch", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.configuration:  # one configuration, in a fresh process
        kind, pooled, k = args.configuration
        row = asyncio.run(measure(kind, pooled == "pooled", int(k), args.quick))
        print(json.dumps(row))
        return 0
    if args.dispatch:  # both configurations' dispatch, in a fresh process
        kind, k, first = args.dispatch
        if first not in ("raw", "pooled"):
            parser.error("--dispatch KIND K FIRST: FIRST is raw or pooled")
        row = asyncio.run(dispatch(KINDS[kind], int(k), args.quick, first))
        print(json.dumps(row))
        return 0
    out = folder(args.out, args.quick)
    runs = args.runs if args.runs is not None else QUICK_RUNS if args.quick else RUNS
    if runs < 1:
        parser.error("--runs must be at least 1")
    began, rows = time.perf_counter(), []

    def child(*arguments: str) -> Any:
        command = [sys.executable, __file__, *arguments]
        command += ["--quick"] if args.quick else []
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            sys.stderr.write(done.stderr)
            raise SystemExit(1)
        return json.loads(done.stdout.splitlines()[-1])

    for run in range(runs):
        for kind in args.kind or list(KINDS):
            for k in QUICK_CONSUMERS if args.quick else CONSUMERS:
                order = ("raw", "pooled") if (run + k) % 2 == 0 else ("pooled", "raw")
                measured: dict[str, dict[str, Any]] = {}
                for pooled in order:
                    if pooled == "raw" and k >= RAW_ONCE and run > 0:
                        continue  # it cannot run: measured once is enough
                    row = measured[pooled] = child(
                        "--configuration", kind, pooled, str(k)
                    )
                    row["run"] = run
                    rows.append(row)
                    print(
                        f"run {run} {kind} {pooled} K={k}: idle {row['idle_cpu']:.1%} "
                        f"CPU, {row['rss_mb']:.0f} MB, {row['observers']} observers, "
                        f"{row['failed']} failed ({time.perf_counter() - began:.0f} s)",
                        file=sys.stderr,
                    )
                if k >= RAW_ONCE:
                    continue  # K client tasks are beside the point there
                firsts = DISPATCH_ORDERS if run % 2 == 0 else DISPATCH_ORDERS[::-1]
                paired = merge_dispatches(
                    [child("--dispatch", kind, str(k), first) for first in firsts]
                )
                for pooled, row in measured.items():
                    figures = paired[pooled]
                    row["dispatch"], row["dispatch_leaf"] = (
                        figures["nested"],
                        figures["leaf"],
                    )
                    row["serialise"] = figures["serialise"]
                    row["dispatch_opened_first"] = list(firsts)
                print(
                    f"run {run} {kind} K={k} dispatch: leaf "
                    f"{paired['pooled']['leaf']['per_second']:.0f} / "
                    f"{paired['raw']['leaf']['per_second']:.0f}, nested "
                    f"{paired['pooled']['nested']['per_second']:.0f} / "
                    f"{paired['raw']['nested']['per_second']:.0f} dispatches/s "
                    f"pooled / raw ({time.perf_counter() - began:.0f} s)",
                    file=sys.stderr,
                )
    info = meta(args.quick, time.perf_counter() - began) | dict(
        wool=wool.__version__,
        runs=runs,
        fanout=dict(n=FANOUT_N, m=QUICK_FANOUT_M if args.quick else FANOUT_M),
    )
    write(out, "pooling", info, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
