"""A typed program using every public name of wool_pooling, as a user writes it.

Not collected by pytest: ``tests/test_typecheck.py`` runs ``pyright`` in
strict mode over it and requires zero errors, with no comment silencing it.
The ``assert_type`` calls make a wrong inferred type an error too.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from collections.abc import Hashable
from collections.abc import Mapping
from typing import assert_type

import anyio
import wool
from wool import DiscoveryEvent
from wool import DiscoveryLike
from wool import DiscoveryPublisherLike
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer
from wool_pooling import FanoutStatistics
from wool_pooling import Lagged
from wool_pooling import LagPolicy
from wool_pooling import PoolStatistics
from wool_pooling import PoolTotals
from wool_pooling import RestartPolicy
from wool_pooling import SharedDiscovery
from wool_pooling import SharedDiscoveryStatistics
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionConsumer
from wool_pooling import SubscriptionPool
from wool_pooling import SubscriptionStatistics
from wool_pooling import Synced
from wool_pooling import SyncSharedDiscovery
from wool_pooling import View
from wool_pooling import afilter
from wool_pooling import current_pool
from wool_pooling import mark_synced
from wool_pooling import shared_subscription
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisPublisher


def worker(number: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=number),
        address=f"127.0.0.1:{50050 + number}",
        pid=1000 + number,
        version="1.0",
    )


def by_namespace(cls: type, namespace: str) -> Hashable:
    return namespace


@shared_subscription(key=by_namespace, ttl=0.5, restart=RestartPolicy(attempts=3))
class Keyed:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        yield DiscoveryEvent("worker-added", metadata=worker(1))


@shared_subscription
class Numbers:
    def __init__(self, stop: int, *, step: int = 1) -> None:
        self.stop = stop
        self.step = step

    async def __aiter__(self) -> AsyncIterator[int]:
        for number in range(0, self.stop, self.step):
            yield number


@shared_subscription
class Listed:
    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        yield DiscoveryEvent("worker-added", metadata=worker(2))
        marked: bool = mark_synced()  # the first listing is complete
        print(marked)
        yield DiscoveryEvent("worker-added", metadata=worker(3))


class Last(View[str]):
    def __init__(self, raw: object) -> None:
        self.last: str | None = None

    def record(self, item: str) -> None:
        self.last = item


@shared_subscription(max_lag=None, view=Last)
class Unbounded:
    async def __aiter__(self) -> AsyncIterator[str]:
        yield "a"


async def items() -> AsyncIterator[int]:
    for number in range(3):
        yield number


async def use_subscriptions() -> None:
    keyed = Keyed("prod")
    assert_type(keyed, SharedSubscription[DiscoveryEvent])
    numbers = Numbers(3, step=1)
    assert_type(numbers, SharedSubscription[int])
    assert_type(Unbounded(), SharedSubscription[str])
    subscriber: DiscoverySubscriberLike = keyed  # what wool accepts
    print(subscriber, keyed.cls, keyed.key, keyed.args, keyed.kwargs)
    print(keyed.ttl, keyed.max_lag, keyed.restart)
    async with SubscriptionPool() as pool:
        assert_type(current_pool(), SubscriptionPool)
        async with aiter(numbers) as consumer:
            assert_type(consumer, SubscriptionConsumer[int])
            async for number in consumer:
                assert_type(number, int)
            synced: bool = consumer.synced
            print(synced)
            await consumer.wait_synced()
        view: Mapping[uuid.UUID, WorkerMetadata] = keyed.workers()
        print(len(view))
        last = Unbounded().view(pool)
        if isinstance(last, Last):
            print(last.last)
        async for event in keyed:
            assert_type(event, DiscoveryEvent)
            break
        listed_workers = Listed()
        assert_type(listed_workers, SharedSubscription[DiscoveryEvent])
        await listed_workers.wait_synced()  # the shared view, not iterated
        print(len(listed_workers.workers()))
        async with aiter(listed_workers) as listed:
            assert_type(listed, SubscriptionConsumer[DiscoveryEvent])
            await listed.wait_synced()
            async for item in listed:
                print(item.metadata.address, item.type, listed.synced)
        print(Synced() == Synced())  # the marker a source may yield instead
        statistics: PoolStatistics = pool.statistics()
        print(statistics.entries, statistics.consumers, statistics.idle)
        totals: PoolTotals = pool.totals()
        print(totals.opened, totals.closed, totals.delivered, totals.skipped)
        print(totals.replays, totals.lagged, totals.resyncs, totals.restarts)
        lag: int = consumer.lag
        print(totals.source_errors, lag, consumer.skipped)
        counted = keyed.statistics(pool)
        assert_type(counted, SubscriptionStatistics)
        print(counted.consumers, counted.delivered, counted.replays, counted.lagged)
        print(counted.resyncs, counted.restarts, counted.source_errors)
        filtered = afilter(lambda metadata: metadata.pid > 0, keyed)
        async for event in filtered:
            print(event.type)
            break


async def use_fanout() -> None:
    policy: LagPolicy = "error"
    fanout = Fanout(items(), max_lag=8, on_lag=policy)
    assert_type(fanout, Fanout[int])
    consumer: FanoutConsumer[int] = fanout.consumer()
    try:
        async for number in consumer:
            assert_type(number, int)
    except Lagged as lagged:
        print(lagged.skipped)
    statistics: FanoutStatistics = fanout.statistics()
    print(statistics.pulled, statistics.buffered)
    await fanout.aclose()


async def use_discovery() -> None:
    discovery = SharedDiscovery(wool.LocalDiscovery("ns"), poll_interval=0.2)
    assert_type(discovery, SyncSharedDiscovery)
    like: DiscoveryLike = discovery
    shared = discovery.subscribe()
    assert_type(shared, SharedSubscription[DiscoveryEvent])
    print(like, discovery.subscribe(lambda metadata: metadata.version == "1.0"))
    known: Mapping[uuid.UUID, WorkerMetadata] = discovery.workers()

    def running(metadata: WorkerMetadata) -> bool:
        return metadata.pid > 0

    some = discovery.workers(filter=running)
    print(len(known), len(some))
    async with wool.WorkerPool(spawn=1, discovery=discovery):
        upstream: SharedDiscoveryStatistics = discovery.statistics()
        print(upstream.restarts, upstream.rescans)


async def main() -> None:
    await use_subscriptions()
    await use_fanout()
    await use_discovery()


if __name__ == "__main__":
    anyio.run(main)


def use_redis() -> None:
    """RedisDiscovery and RedisPublisher are what wool's protocols declare."""
    discovery: DiscoveryLike = RedisDiscovery("redis://localhost", "namespace")
    publisher: DiscoveryPublisherLike = RedisPublisher("redis://localhost", "ns")
    print(discovery, publisher)
