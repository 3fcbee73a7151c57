"""Export the counters of a pool and of a shared subscription to Prometheus.

Run it with ``python examples/metrics.py`` (first ``pip install
"wool-pooling[metrics]"``: the example needs ``prometheus_client``, wool-pooling
does not). Add ``--serve 8000`` to keep serving
``http://localhost:8000/metrics`` until interrupted.

``statistics()`` reads the pool of the event loop it is called in, so the
snapshots are taken there, by a task, every ``interval`` seconds; a
``prometheus_client`` collector hands the latest ones to the scrape, which
runs in the HTTP server's thread. Each field of a record becomes one metric,
labelled with what it counts: a gauge for what stands now (consumers,
entries, lag, ...), a counter for the rest. Three records: the pool's
``totals()``, running totals that survive its entries' close; the
subscription's ``statistics()``, which start again from zero when a new
pool entry replaces the old one (Prometheus reads a counter reset); and the
consumers' own figures, the slowest one's ``lag`` and what they ``skipped``.

The demo reads a "staging" subscription whose entry closes before the
scrape (its counts stay in the pool's totals), then has 50 consumers share
one subscription to a discovery that reports three workers (the last one
joins late, and is replayed them), then prints the exposition of the
``wool_pooling_`` metrics. ``RedisDiscovery.statistics()`` records export
the same way: ``snapshots.add("redis", "my-namespace", discovery.statistics)``.
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
from wool_pooling import SubscriptionConsumer
from wool_pooling import current_pool
from wool_pooling import shared_subscription

#: Fields that say how things stand now; every other field only grows.
GAUGES = frozenset(
    {"consumers", "entries", "idle", "lag", "connections", "seconds_since_last_message"}
)


@attrs.frozen
class Consumers:
    """What the consumers this program holds show: the slowest one's ``lag``
    (items of the shared stream it has yet to read), and the items they
    ``skipped`` because they fell behind."""

    lag: int
    skipped: int

    @classmethod
    def of(cls, consumers: list[SubscriptionConsumer[DiscoveryEvent]]) -> Consumers:
        return cls(
            lag=max((consumer.lag for consumer in consumers), default=0),
            skipped=sum(consumer.skipped for consumer in consumers),
        )


class Snapshots(Collector):
    """The latest statistics records, taken in the event loop, for the scrape.

    ``add(kind, name, read)``: ``read()`` returns a statistics record (an
    attrs class of numbers); ``kind`` prefixes its metrics' names and
    ``name`` labels them.
    """

    def __init__(self) -> None:
        self._sources: list[tuple[str, str, Callable[[], AttrsInstance]]] = []
        self._latest: list[tuple[str, str, AttrsInstance]] = []
        self._lock = threading.Lock()

    def add(self, kind: str, name: str, read: Callable[[], AttrsInstance]) -> None:
        self._sources.append((kind, name, read))

    def take(self) -> None:
        """Read every source; call it from the event loop of the pool."""
        taken = [(kind, name, read()) for kind, name, read in self._sources]
        with self._lock:
            self._latest = taken

    async def keep_taking(self, interval: float) -> None:
        while True:
            self.take()
            await anyio.sleep(interval)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            latest = self._latest
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for kind, name, record in latest:
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
    subscription: SharedSubscription[DiscoveryEvent],
    held: list[SubscriptionConsumer[DiscoveryEvent]],
    ready: Callable[[], None],
) -> None:
    async with aiter(subscription) as consumer:
        held.append(consumer)
        for _ in range(3):
            await anext(consumer)
        ready()
        await anyio.sleep_forever()


async def main(serve: int | None) -> None:
    registry = CollectorRegistry()
    snapshots = Snapshots()
    registry.register(snapshots)
    pool = current_pool()  # the event loop's default pool
    # An entry that closes before the scrape: its counts stay in the totals.
    async with aiter(Workers("staging")) as staging:
        for _ in range(3):
            await anext(staging)
    subscription = Workers("prod")
    held: list[SubscriptionConsumer[DiscoveryEvent]] = []
    snapshots.add("pool", "default", pool.totals)
    snapshots.add("pool", "default", pool.statistics)
    snapshots.add("subscription", "workers-prod", subscription.statistics)
    snapshots.add("consumers", "workers-prod", lambda: Consumers.of(held))
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
            tg.start_soon(consume, subscription, held, ready)
        await anyio.wait_all_tasks_blocked()
        # A late joiner: replayed the three known workers, not delivered them.
        tg.start_soon(consume, subscription, held, ready)
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
        description="Export a pool's and a subscription's counters to Prometheus."
    )
    parser.add_argument("--serve", type=int, metavar="PORT", help="serve /metrics")
    anyio.run(main, parser.parse_args().serve)
