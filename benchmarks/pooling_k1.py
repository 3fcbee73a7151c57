"""One consumer, raw and pooled, paired round by round in one process.

Run from the repository root::

    python benchmarks/pooling_k1.py              # record: benchmarks/results/
    python benchmarks/pooling_k1.py --quick      # smoke: a temporary folder
    python benchmarks/pooling_k1.py --out DIR    # record into DIR

``pooling.py`` measures each configuration in a fresh process of its own,
which its idle CPU and memory need; but at K = 1 a convergence is mostly the
publisher's own time, which varies more between processes (about 20%) than
pooling costs a change (a few microseconds, ``handoff.py``). So its K = 1
ratio says only that the two are within noise. This script measures the same
convergence with the noise paired away: one process, one publisher, and
rounds of raw and pooled in turn (which goes first alternates pair by pair),
each round a consumer of its own:

- ``raw``: ``kind.make(ns).subscribe(**options)``, iterated by one task;
- ``pooled``: ``SharedDiscovery(kind.make(ns), **options).subscribe()``.

A round opens its subscription, waits until the consumer holds the one
worker published beforehand and for ``SETTLE`` seconds more (the joiner's
rescan closes), then publishes W workers and times until the consumer holds
them all, then W drops the same way; the publisher's own time (the publish
calls) is recorded too, and the tail is the convergence less the publisher's
time: what the subscription itself took after the last publish. Then the
subscription closes (the round checks that it opened one watchdog observer,
and the next finds none). ``PAIRS`` pairs per W, in ``--runs`` fresh
processes.

For each pair: pooled / raw of the convergence and of its tail, and the
tail's difference per change, the floor pooling adds to a change at one
consumer, measured in the same run. Writes ``pooling_k1-cpython3.11.json``;
``benchmarks/report.py`` renders the medians over every pair.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import wool
from _results import folder
from _results import meta
from _results import write
from pooling import CAPACITY
from pooling import DEADLINE
from pooling import KINDS
from pooling import Views
from pooling import fake_workers
from pooling import observers
from watchdog.observers.api import BaseObserver

from wool_pooling import SharedDiscovery

WORKERS, QUICK_WORKERS = (10, 100, 1000), (10,)
PAIRS, QUICK_PAIRS = 7, 1
RUNS, QUICK_RUNS = 3, 1
#: Seconds a round waits once its consumer holds the first worker.
SETTLE, QUICK_SETTLE = 0.5, 0.1
CONFIGURATIONS = ("raw", "pooled")


async def one_round(
    kind_name: str, namespace: str, publisher: Any, w: int, pooled: bool, settle: float
) -> dict[str, float]:
    """One consumer of one configuration: W added, then W dropped, timed."""
    kind = KINDS[kind_name]
    views = Views(1)
    if observers():
        raise RuntimeError("a subscription of the previous round is still open")

    async def consume() -> None:
        if pooled:
            subscription: Any = SharedDiscovery(
                kind.make(namespace), **kind.options
            ).subscribe()
        else:
            subscription = kind.make(namespace).subscribe(**kind.options)
        try:
            async for event in subscription:
                views.apply(0, event)
        except Exception as error:  # counted: no consumer fails unseen
            views.fail(0, error)

    task = asyncio.create_task(consume())
    figures: dict[str, float] = {}
    try:
        await views.wait_all(1)
        await asyncio.sleep(settle)
        if views.failed or observers() != 1:
            raise RuntimeError(
                f"the round's subscription failed or opened {observers()} "
                f"observers: {views.error}"
            )
        batch = fake_workers(w)
        for what, event, size in (
            ("added", "worker-added", 1 + w),
            ("dropped", "worker-dropped", 1),
        ):
            start = time.perf_counter()
            for metadata in batch:
                await publisher.publish(event, metadata)
            published = time.perf_counter() - start
            await views.wait_all(size)
            figures[what] = time.perf_counter() - start
            figures[f"{what}_publisher"] = published
            figures[f"{what}_tail"] = figures[what] - published
            if views.failed:
                raise RuntimeError(f"the round's consumer failed: {views.error}")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    for thread in threading.enumerate():  # it stops once the iteration closes
        if isinstance(thread, BaseObserver):
            await asyncio.to_thread(thread.join, DEADLINE)
    return figures


async def measure(kind_name: str, first: str, quick: bool) -> dict[str, Any]:
    """Every pair of rounds of one run, in this (fresh) process."""
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    owner = wool.LocalDiscovery(namespace, capacity=CAPACITY)
    settle = QUICK_SETTLE if quick else SETTLE
    result: dict[str, Any] = dict(kind=kind_name, first=first, pairs={})
    with owner:
        publisher: Any = owner.publisher
        async with publisher:
            anchor = fake_workers(1)[0]
            await publisher.publish("worker-added", anchor)
            for w in QUICK_WORKERS if quick else WORKERS:
                pairs = []
                for index in range(QUICK_PAIRS if quick else PAIRS):
                    order = CONFIGURATIONS if index % 2 == 0 else CONFIGURATIONS[::-1]
                    if first != CONFIGURATIONS[0]:
                        order = order[::-1]
                    pair: dict[str, Any] = {"order": list(order)}
                    for name in order:
                        pair[name] = await one_round(
                            kind_name, namespace, publisher, w, name == "pooled", settle
                        )
                    pairs.append(pair)
                result["pairs"][str(w)] = pairs
            await publisher.publish("worker-dropped", anchor)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small pair per run")
    parser.add_argument("--out", type=Path, help="results folder")
    parser.add_argument(
        "--runs", type=int, help=f"fresh processes (default {RUNS}; --quick: 1)"
    )
    parser.add_argument("--process", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.process:  # one run, in a fresh process
        kind, first = args.process
        if first not in CONFIGURATIONS:
            parser.error("--process KIND FIRST: FIRST is raw or pooled")
        print(json.dumps(asyncio.run(measure(kind, first, args.quick))))
        return 0
    runs = args.runs if args.runs is not None else QUICK_RUNS if args.quick else RUNS
    if runs < 1:
        parser.error("--runs must be at least 1")
    out = folder(args.out, args.quick)
    began, rows = time.perf_counter(), []
    for run in range(runs):
        for kind in KINDS:
            first = CONFIGURATIONS[run % 2]
            command = [sys.executable, __file__, "--process", kind, first]
            command += ["--quick"] if args.quick else []
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                sys.stderr.write(done.stderr)
                return 1
            row = json.loads(done.stdout.splitlines()[-1]) | {"run": run}
            rows.append(row)
            print(
                f"run {run} {kind}: {len(row['pairs'])} sizes "
                f"({time.perf_counter() - began:.0f} s)",
                file=sys.stderr,
            )
    info = meta(args.quick, time.perf_counter() - began) | dict(
        runs=runs, wool=wool.__version__, settle=QUICK_SETTLE if args.quick else SETTLE
    )
    write(out, "pooling_k1", info, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
