"""Export a shared subscription's counters to Prometheus with ``prometheus_client``.

Run it with ``python examples/metrics.py`` (first ``pip install
"wool-pooling[metrics]"``: the example needs ``prometheus_client``, wool-pooling
does not). Add ``--serve 8000`` to keep serving
``http://localhost:8000/metrics`` until interrupted.

``statistics()`` reads the pool of the event loop it is called in, so the
snapshots are taken there, by a task, every ``interval`` seconds; a
``prometheus_client`` collector hands the latest ones to the scrape, which
runs in the HTTP server's thread. Each field of a statistics record becomes
one metric, labelled with the subscription it counts: a gauge for what
stands now (consumers, connections, seconds since the last message), a
counter for the rest. A counter starts again from zero when a new pool
entry replaces the old one (after its ``ttl``), which Prometheus reads as a
counter reset.

The demo has 50 consumers share one subscription to a discovery that
reports three workers (the last one joins late, and is replayed them),
then prints the exposition of the ``wool_pooling_``
metrics. ``RedisDiscovery.statistics()`` records export the same way:
``snapshots.add("redis", "my-namespace", discovery.statistics)``.
"""

from __future__ import annotations

import argparse
import threading
import uuid
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterator

import anyio
import attrs
from attrs import AttrsInstance

try:
    from prometheus_client import CollectorRegistry
    from prometheus_client import generate_latest
    from prometheus_client import start_http_server
    from prometheus_client.core import CounterMetricFamily
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ModuleNotFoundError as missing:
    raise SystemExit(
        f'examples/metrics.py needs {missing.name}: pip install "wool-pooling[metrics]"'
    ) from None
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import SharedSubscription
from wool_pooling import shared_subscription

#: Fields that say how things stand now; every other field only grows.
GAUGES = frozenset({"consumers", "connections", "seconds_since_last_message"})


class Snapshots(Collector):
    """The latest statistics records, taken in the event loop, for the scrape.

    ``add(kind, name, read)``: ``read()`` returns a statistics record (an
    attrs class of numbers); ``kind`` prefixes its metrics' names and
    ``name`` labels them.
    """

    def __init__(self) -> None:
        self._sources: list[tuple[str, str, Callable[[], AttrsInstance]]] = []
        self._latest: dict[tuple[str, str], AttrsInstance] = {}
        self._lock = threading.Lock()

    def add(self, kind: str, name: str, read: Callable[[], AttrsInstance]) -> None:
        self._sources.append((kind, name, read))

    def take(self) -> None:
        """Read every source; call it from the event loop of the pool."""
        taken = {(kind, name): read() for kind, name, read in self._sources}
        with self._lock:
            self._latest = taken

    async def keep_taking(self, interval: float) -> None:
        while True:
            self.take()
            await anyio.sleep(interval)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            latest = dict(self._latest)
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for (kind, name), record in latest.items():
            for field in attrs.fields(type(record)):
                value = getattr(record, field.name)
                if value is None:
                    continue  # not measured yet
                metric = f"wool_pooling_{kind}_{field.name}"
                family = families.get(metric)
                if family is None:
                    make = (
                        GaugeMetricFamily
                        if field.name in GAUGES
                        else CounterMetricFamily
                    )
                    family = families[metric] = make(
                        metric, f"{type(record).__name__}.{field.name}", labels=["name"]
                    )
                family.add_metric([name], float(value))
        yield from families.values()


@shared_subscription
class Workers:
    """A stand-in discovery subscriber: three workers, then quiet."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        for n in (1, 2, 3):
            worker = WorkerMetadata(
                uid=uuid.UUID(int=n), address=f"10.0.0.{n}:5000", pid=n, version="1"
            )
            yield DiscoveryEvent("worker-added", metadata=worker)
        await anyio.sleep_forever()


async def consume(
    subscription: SharedSubscription[DiscoveryEvent], ready: Callable[[], None]
) -> None:
    async with aiter(subscription) as consumer:
        for _ in range(3):
            await anext(consumer)
        ready()
        await anyio.sleep_forever()


async def main(serve: int | None) -> None:
    registry = CollectorRegistry()
    snapshots = Snapshots()
    registry.register(snapshots)
    subscription = Workers("prod")
    snapshots.add("subscription", "workers-prod", subscription.statistics)
    if serve is not None:
        start_http_server(serve, registry=registry)
        print(f"serving http://localhost:{serve}/metrics")
    async with anyio.create_task_group() as tg:
        done = 0
        all_read = anyio.Event()

        def ready() -> None:
            nonlocal done
            done += 1
            if done == 50:
                all_read.set()

        for _ in range(49):
            tg.start_soon(consume, subscription, ready)
        await anyio.wait_all_tasks_blocked()
        # A late joiner: replayed the three known workers, not delivered them.
        tg.start_soon(consume, subscription, ready)
        await all_read.wait()
        if serve is not None:
            await snapshots.keep_taking(interval=5.0)
        snapshots.take()
        exposition = generate_latest(registry).decode()
        for line in exposition.splitlines():
            if line.startswith("wool_pooling_"):
                print(line)
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Export a shared subscription's counters to Prometheus."
    )
    parser.add_argument("--serve", type=int, metavar="PORT", help="serve /metrics")
    anyio.run(main, parser.parse_args().serve)
