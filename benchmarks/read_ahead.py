"""What each read-ahead buys: the fan-out's delivery rate for R = 0 to 1,024.

Run from the repository root::

    python benchmarks/read_ahead.py                   # asyncio
    python benchmarks/read_ahead.py --backend trio
    python benchmarks/read_ahead.py --quick           # smoke: small, one round

The evidence behind ``DEFAULT_READ_AHEAD``. For each ``read_ahead`` R in
``--values`` and each source, N consumers take every item:

- ``never``, ``checkpoint``, ``waiting``: ``throughput.py``'s sources (never
  suspends, one checkpoint per item, waits for another task per item),
  ``--items`` items through a :class:`~wool_pooling.Fanout`, run as
  ``throughput.py`` runs its ``Fanout`` case;
- ``discovery``: a discovery source yielding bursts of ``--workers``
  changes at once (adds, then drops), through a ``@shared_subscription``
  with the decorator's default ``max_lag``, each consumer applying every
  change to a view of its own, timed from the burst until every view holds
  it.

The values of R alternate in order round by round, each measurement in an
event loop of its own; a case's figure is its fastest round (the machine's
noise only ever adds), as items delivered per second, and its ratio to
R = 0 (pull on demand). Prints a table, and the figures as JSON on the last
line. It records nothing.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from handoff import BurstSubscriber
from handoff import adds_and_drops
from handoff import apply
from throughput import BACKENDS
from throughput import one_run
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

SOURCES = ("never", "checkpoint", "waiting", "discovery")
VALUES = (0, 1, 4, 16, 64, 256, 1024)
NS, QUICK_NS = (1, 100), (1, 10)
ITEMS, QUICK_ITEMS = 4096, 128
WORKERS, QUICK_WORKERS = 1000, 50
ROUNDS, QUICK_ROUNDS = 5, 1


async def discovery(read_ahead: int, n: int, workers: int) -> float:
    """Seconds for a burst of adds and one of drops to reach ``n`` views."""
    added, dropped = adds_and_drops(workers)
    send, receive = anyio.create_memory_object_stream[list[DiscoveryEvent]](1)

    @shared_subscription(key=lambda cls: None, read_ahead=read_ahead)
    class Shared:
        def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
            return aiter(BurstSubscriber(receive))

    target, left, done = -1, n, anyio.Event()

    async def consume() -> None:
        nonlocal left
        view: dict[uuid.UUID, WorkerMetadata] = {}
        async for event in Shared():
            apply(view, event)
            if len(view) == target:
                left -= 1
                if not left:
                    done.set()

    elapsed = 0.0
    async with SubscriptionPool(), anyio.create_task_group() as group:
        for _ in range(n):
            group.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        for burst, size in ((added, workers), (dropped, 0)):
            target, left, done = size, n, anyio.Event()
            start = time.perf_counter()
            await send.send(burst)
            await done.wait()
            elapsed += time.perf_counter() - start
        group.cancel_scope.cancel()
    return elapsed


def measure(backend: str, source: str, read_ahead: int, n: int, size: int) -> float:
    """Items delivered per second, in an event loop of its own."""
    name, options = BACKENDS[backend]
    if source == "discovery":
        seconds = anyio.run(
            discovery, read_ahead, n, size, backend=name, backend_options=options
        )
        return 2 * size * n / seconds
    seconds = anyio.run(
        one_run,
        "Fanout",
        backend,
        source,
        size,
        n,
        read_ahead,
        backend=name,
        backend_options=options,
    )
    return size * n / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=tuple(BACKENDS), default="asyncio")
    parser.add_argument("--quick", action="store_true", help="small, one round")
    parser.add_argument(
        "--values",
        type=int,
        nargs="+",
        help=f"read-ahead values, 0 first (default: {' '.join(map(str, VALUES))})",
    )
    parser.add_argument("--items", type=int, help="items per fan-out run")
    parser.add_argument("--workers", type=int, help="changes per discovery burst")
    parser.add_argument("--rounds", type=int, help="rounds over the values")
    args = parser.parse_args(argv)
    values = tuple(args.values or VALUES)
    ns = QUICK_NS if args.quick else NS
    items = args.items or (QUICK_ITEMS if args.quick else ITEMS)
    workers = args.workers or (QUICK_WORKERS if args.quick else WORKERS)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    if values[0] != 0 or min(values) < 0:
        parser.error("--values must start with 0 and hold no negative value")
    if items < 1 or workers < 1 or rounds < 1:
        parser.error("--items, --workers and --rounds must be at least 1")
    best: dict[tuple[str, int, int], float] = {}
    for round_ in range(rounds):
        shift = round_ % len(values)
        for source in SOURCES:
            size = workers if source == "discovery" else items
            for n in ns:
                for value in values[shift:] + values[:shift]:
                    rate = measure(args.backend, source, value, n, size)
                    key = (source, n, value)
                    best[key] = max(best.get(key, 0.0), rate)
    print(
        f"{args.backend}: items/s by read_ahead (x R = 0), fastest of {rounds} "
        f"round(s); {items} items, bursts of {workers} changes"
    )
    print(f"{'source':<11}{'N':>5}" + "".join(f"{f'R={v}':>18}" for v in values))
    rows: list[dict[str, Any]] = []
    for source in SOURCES:
        for n in ns:
            rates = [best[(source, n, value)] for value in values]
            cells = "".join(
                f"{rate / 1e3:>10.1f}k {rate / rates[0]:>5.2f}x" for rate in rates
            )
            print(f"{source:<11}{n:>5}{cells}")
            rows.append(
                dict(source=source, n=n, rates=dict(zip(values, rates, strict=True)))
            )
    print(json.dumps(dict(backend=args.backend, values=values, rows=rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
