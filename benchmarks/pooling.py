"""What pooling buys a wool process: K discovery consumers, raw and pooled.

Run from the repository root::

    python benchmarks/pooling.py              # record: benchmarks/results/
    python benchmarks/pooling.py --quick      # smoke: a temporary folder
    python benchmarks/pooling.py --out DIR    # record into DIR

For each discovery kind (today one: ``wool.LocalDiscovery``; add a row to
``KINDS`` for another) and K = 1, 10, 100, 1,000 consumers, two
configurations: ``raw`` (each consumer iterates a subscriber of its own,
``kind.make(ns).subscribe(**options)``) and ``pooled`` (every consumer
iterates ``SharedDiscovery(kind.make(ns), **options).subscribe()``). Each
configuration runs in a fresh process, which measures in turn:

- upstream subscriptions open once every consumer holds the first worker:
  watchdog observer threads, one per ``LocalDiscovery`` iteration, and the
  shared-memory handles open in the process;
- idle cost while nothing changes: process CPU seconds per wall second (all
  threads) and the resident set size (current and peak);
- convergence: W = 10, 100, 1,000 workers published through the discovery's
  publisher, seconds until every consumer holds all W; then the same for W
  drops;
- a real ``wool.WorkerPool(spawn=2, discovery=...)`` (raw: the kind's plain
  discovery; pooled: its ``SharedDiscovery``) with K client tasks, each
  dispatching ``nested`` (a routine that dispatches ``leaf`` from the
  worker, so each worker unpickles the proxies) in a loop for a fixed time:
  dispatches per second and p50/p99 latency.

Writes ``pooling-cpython3.11.json`` (every figure, and the run's length);
``benchmarks/report.py`` renders the table: each figure pooled / raw, plus
both absolute figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import wool
from watchdog.observers.api import BaseObserver
from wool import WorkerMetadata

from wool_pooling import SharedDiscovery

RESULTS = Path(__file__).resolve().parent / "results"
CONSUMERS, QUICK_CONSUMERS = (1, 10, 100, 1000), (1, 10)
WORKERS, QUICK_WORKERS = (10, 100, 1000), (10,)
IDLE_SECONDS, QUICK_IDLE_SECONDS = 3.0, 0.3
DISPATCH_SECONDS, QUICK_DISPATCH_SECONDS = 3.0, 0.3
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


def interpreter() -> str:
    return f"{sys.implementation.name}{sys.version_info[0]}.{sys.version_info[1]}"


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
    """Every consumer's view (uid -> metadata), and a wait until all have ``size``."""

    def __init__(self, k: int) -> None:
        self.views: list[dict[Any, Any]] = [{} for _ in range(k)]
        self.changed = asyncio.Event()
        #: Consumers whose subscription raised, and the first error.
        self.failed: set[int] = set()
        self.error: str | None = None

    def fail(self, index: int, error: Exception) -> None:
        self.failed.add(index)
        self.error = self.error or f"{type(error).__name__}: {error}"
        self.changed.set()

    def apply(self, index: int, event: Any) -> None:
        if event.type == "worker-dropped":
            self.views[index].pop(event.metadata.uid, None)
        else:
            self.views[index][event.metadata.uid] = event.metadata
        self.changed.set()

    async def wait_all(self, size: int) -> None:
        async with asyncio.timeout(DEADLINE):
            while any(
                len(view) != size
                for index, view in enumerate(self.views)
                if index not in self.failed
            ):
                self.changed.clear()
                await self.changed.wait()


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

        tasks = [asyncio.create_task(consume(index)) for index in range(k)]
        publisher: Any = owner.publisher
        async with publisher:
            first = fake_workers(1)[0]
            await publisher.publish("worker-added", first)
            await views.wait_all(1)
            result.update(observers=observers(), shm_handles=shared_memory_handles())
            result.update(failed=len(views.failed), error=views.error)
            idle = QUICK_IDLE_SECONDS if quick else IDLE_SECONDS
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.sleep(idle)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            result.update(idle_cpu=cpu / wall, rss_mb=status_mb("VmRSS"))
            result["max_rss_mb"] = status_mb("VmHWM")
            result["converge"] = {}
            for w in QUICK_WORKERS if quick else WORKERS:
                batch = fake_workers(w)
                start = time.perf_counter()
                for metadata in batch:
                    await publisher.publish("worker-added", metadata)
                await views.wait_all(1 + w)
                added = time.perf_counter() - start
                start = time.perf_counter()
                for metadata in batch:
                    await publisher.publish("worker-dropped", metadata)
                await views.wait_all(1)
                dropped = time.perf_counter() - start
                result["converge"][str(w)] = dict(added=added, dropped=dropped)
            await publisher.publish("worker-dropped", first)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    result["dispatch"] = await dispatch(kind, pooled, k, quick)
    return result


async def dispatch(kind: Kind, pooled: bool, k: int, quick: bool) -> dict[str, Any]:
    """K client tasks dispatching ``nested`` through a pool of 2 spawned workers."""
    from pooling_routines import nested

    discovery: Any = kind.make(f"bench-{uuid.uuid4().hex[:12]}")
    if pooled:
        discovery = SharedDiscovery(discovery, **kind.options)
    latencies: list[float] = []
    errors: list[str] = []
    seconds = QUICK_DISPATCH_SECONDS if quick else DISPATCH_SECONDS

    async def client(index: int, until: float) -> None:
        while time.perf_counter() < until:
            start = time.perf_counter()
            try:
                result = await nested(index)
            except Exception as error:  # counted, like a wrong result
                errors.append(f"{type(error).__name__}: {error}")
                continue
            if result != index + 2:
                errors.append(f"nested returned {result!r}")
                continue
            latencies.append(time.perf_counter() - start)

    async with wool.WorkerPool(spawn=2, discovery=discovery):
        # Warm up: every worker has served a nested dispatch once.
        async with asyncio.timeout(DEADLINE):
            await asyncio.gather(*(nested(index) for index in range(4)))
        start = time.perf_counter()
        async with asyncio.timeout(DEADLINE):
            await asyncio.gather(*(client(i, start + seconds) for i in range(k)))
        wall = time.perf_counter() - start
    latencies.sort()
    if not latencies:
        raise RuntimeError(f"no dispatch succeeded: {errors[:1]}")
    return dict(
        failed=len(errors),
        error=errors[0] if errors else None,
        dispatches=len(latencies),
        per_second=len(latencies) / wall,
        p50=statistics.median(latencies),
        p99=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small K, short waits")
    parser.add_argument("--out", type=Path, help="results folder")
    parser.add_argument("--kind", action="append", choices=list(KINDS))
    parser.add_argument("--configuration", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.configuration:  # one configuration, in a fresh process
        kind, pooled, k = args.configuration
        row = asyncio.run(measure(kind, pooled == "pooled", int(k), args.quick))
        print(json.dumps(row))
        return 0
    out: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="wool-pooling-bench-")) if args.quick else RESULTS
    )
    out.mkdir(parents=True, exist_ok=True)
    began, rows = time.perf_counter(), []
    for kind in args.kind or list(KINDS):
        for k in QUICK_CONSUMERS if args.quick else CONSUMERS:
            for pooled in ("raw", "pooled"):
                command = [sys.executable, __file__, "--configuration", kind, pooled]
                command += [str(k), *(["--quick"] if args.quick else [])]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    sys.stderr.write(done.stderr)
                    return 1
                rows.append(json.loads(done.stdout.splitlines()[-1]))
                row = rows[-1]
                print(
                    f"{kind} {pooled} K={k}: idle {row['idle_cpu']:.1%} CPU, "
                    f"{row['rss_mb']:.0f} MB, {row['observers']} observers, "
                    f"{row['dispatch']['per_second']:.0f} dispatches/s "
                    f"({time.perf_counter() - began:.0f} s)",
                    file=sys.stderr,
                )
    meta = dict(
        python=sys.version,
        interpreter=interpreter(),
        platform=platform.platform(),
        cpus=os.cpu_count(),
        wool=wool.__version__ if hasattr(wool, "__version__") else None,
        quick=args.quick,
        seconds=time.perf_counter() - began,
    )
    path = out / f"pooling-{interpreter()}.json"
    path.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    print(f"results: {path} ({meta['seconds']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
