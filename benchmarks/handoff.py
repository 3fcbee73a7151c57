"""What a change costs on its way to one consumer, layer by layer.

Run from the repository root::

    python benchmarks/handoff.py                    # asyncio
    python benchmarks/handoff.py --backend trio
    python benchmarks/handoff.py --quick            # smoke: fewer, smaller bursts

At one consumer pooling has nothing to share, so what it costs is what it
adds to each change passed on. A discovery source that yields a burst of W
changes at once (``--workers``; adds, then drops) is iterated by one
consumer that applies each to a view, as ``pooling.py``'s consumers do:

- ``direct``: the consumer iterates the inner subscriber itself (what a raw
  wool proxy does);
- ``Fanout``: through a :class:`~wool_pooling.Fanout` of the subscriber;
- ``shared_subscription``: through a ``@shared_subscription`` class whose
  ``__aiter__`` is the subscriber's (the fan-out, the known-worker record
  for late joiners, the pool);
- ``SharedDiscovery``: through ``SharedDiscovery(inner).subscribe()``
  (all that, plus the upstream's reader, which merges what it reads).

Each layer runs in an event loop of its own, the layers alternating, for
``--rounds`` rounds; a round times ``--bursts`` bursts from the trigger
until the consumer holds the whole change. A layer's figure is its fastest
burst over all rounds (the machine's noise only ever adds), in
microseconds per event, and what it adds over ``direct``. Prints a table,
and the figures as JSON on the last line.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import SharedDiscovery
from wool_pooling import shared_subscription

LAYERS = ("direct", "Fanout", "shared_subscription", "SharedDiscovery")
WORKERS, QUICK_WORKERS = 1000, 100
ROUNDS, QUICK_ROUNDS = 6, 1
BURSTS, QUICK_BURSTS = 100, 5


class BurstSubscriber:
    """Yields each burst handed to its trigger, all at once."""

    def __init__(self, trigger: MemoryObjectReceiveStream[list[DiscoveryEvent]]):
        self._trigger = trigger

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[DiscoveryEvent]:
        async for burst in self._trigger:
            for event in burst:
                yield event


class BurstDiscovery:
    """A discovery whose subscriber is a :class:`BurstSubscriber`."""

    publisher: Any = None

    def __init__(self, trigger: MemoryObjectReceiveStream[list[DiscoveryEvent]]):
        self._trigger = trigger

    def subscribe(self, filter: Any = None) -> BurstSubscriber:
        return BurstSubscriber(self._trigger)

    def __reduce__(self) -> tuple[Any, ...]:  # lets SharedDiscovery take it
        raise TypeError("a BurstDiscovery stays in its process")


def adds_and_drops(workers: int) -> tuple[list[DiscoveryEvent], list[DiscoveryEvent]]:
    """A burst adding ``workers`` fresh workers, and the burst dropping them."""
    metadata = [
        WorkerMetadata(uid=uuid.uuid4(), address="127.0.0.1:1", pid=1, version="1")
        for _ in range(workers)
    ]
    added = [DiscoveryEvent("worker-added", metadata=m) for m in metadata]
    dropped = [DiscoveryEvent("worker-dropped", metadata=m) for m in metadata]
    return added, dropped


def apply(view: dict[uuid.UUID, WorkerMetadata], event: object) -> None:
    """Apply a discovery event to ``view``, as a consumer keeps its workers
    (a subscription's other items, its ``Synced`` markers, are passed over)."""
    if type(event) is not DiscoveryEvent:
        return
    if event.type == "worker-dropped":
        view.pop(event.metadata.uid, None)
    else:
        view[event.metadata.uid] = event.metadata


def through(layer: str, discovery: BurstDiscovery) -> Callable[[], AsyncIterator[Any]]:
    """How the consumer iterates ``discovery`` in ``layer``."""
    if layer == "direct":
        return lambda: aiter(discovery.subscribe())
    if layer == "Fanout":
        return lambda: aiter(Fanout(discovery.subscribe()).consumer())
    if layer == "shared_subscription":

        @shared_subscription(key=lambda cls: None)
        class Shared:
            def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
                return aiter(discovery.subscribe())

        return lambda: aiter(Shared())
    return lambda: aiter(SharedDiscovery(discovery).subscribe())


async def measure(layer: str, workers: int, bursts: int) -> float:
    """The fastest burst's seconds per event, in a loop of its own."""
    added, dropped = adds_and_drops(workers)
    send, receive = anyio.create_memory_object_stream[list[DiscoveryEvent]](1)
    iterate = through(layer, BurstDiscovery(receive))
    view: dict[uuid.UUID, WorkerMetadata] = {}
    target = -1
    done = anyio.Event()

    async def consume() -> None:
        async for event in iterate():
            apply(view, event)
            if len(view) == target:
                done.set()

    best = float("inf")
    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        for index in range(bursts + 1):  # the first warms up
            for burst, size in ((added, workers), (dropped, 0)):
                target, done = size, anyio.Event()
                start = time.perf_counter()
                await send.send(burst)
                await done.wait()
                if index:
                    best = min(best, (time.perf_counter() - start) / workers)
        tg.cancel_scope.cancel()
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller bursts")
    parser.add_argument("--workers", type=int, help="changes per burst")
    parser.add_argument("--rounds", type=int, help="rounds over the layers")
    args = parser.parse_args(argv)
    workers = args.workers or (QUICK_WORKERS if args.quick else WORKERS)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    bursts = QUICK_BURSTS if args.quick else BURSTS
    if workers < 1 or rounds < 1:
        parser.error("--workers and --rounds must be at least 1")
    best = dict.fromkeys(LAYERS, float("inf"))
    for round_ in range(rounds):
        shift = round_ % len(LAYERS)
        for layer in LAYERS[shift:] + LAYERS[:shift]:
            seconds = anyio.run(measure, layer, workers, bursts, backend=args.backend)
            best[layer] = min(best[layer], seconds)
    print(f"{args.backend}, bursts of {workers} changes, best of {rounds} x {bursts}")
    print(f"{'layer':<22}{'us/event':>10}{'added':>10}")
    for layer in LAYERS:
        extra = best[layer] - best["direct"]
        print(f"{layer:<22}{best[layer] * 1e6:>10.2f}{extra * 1e6:>+10.2f}")
    figures = {layer: seconds * 1e6 for layer, seconds in best.items()}
    print(json.dumps(dict(backend=args.backend, workers=workers, us_per_event=figures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
