"""Where ``RedisDiscovery`` marks the end of its snapshot: consumers' ``synced``.

Against a real ``redis-server`` (one per module); asyncio only, as redis-py's
client is.
"""

from __future__ import annotations

import anyio
import pytest
from _loops import asyncio_backend
from _redis import RedisServer
from redis_views import DEADLINE
from redis_views import View
from redis_views import admin
from redis_views import discovery
from redis_views import eventually
from redis_views import fake_worker
from redis_views import hash_content

from wool_pooling import SharedDiscovery
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionConsumer
from wool_pooling import SubscriptionPool
from wool_pooling import Synced

pytestmark = pytest.mark.anyio
anyio_backend = asyncio_backend


async def wait_synced(consumer: SubscriptionConsumer[object]) -> None:
    with anyio.fail_after(DEADLINE):
        await consumer.wait_synced()
    await anyio.wait_all_tasks_blocked()  # the task iterating it is handed it
    assert consumer.synced


async def test_consumers_are_synced_after_the_snapshot(
    redis_server: RedisServer,
) -> None:
    """A consumer is synced once handed the snapshot: every worker in the
    server's hash when it subscribed; ``workers()`` then reads them all, and
    no consumer is ever handed the marker."""
    redis_discovery = discovery(redis_server.url)
    workers = [fake_worker(port) for port in range(1, 4)]
    async with redis_discovery.publisher as publisher:
        for worker in workers:
            await publisher.publish("worker-added", worker)
        sub = redis_discovery.subscribe()
        assert isinstance(sub, SharedSubscription)
        view = View()
        async with SubscriptionPool(), anyio.create_task_group() as tg:
            consumer = aiter(sub)
            tg.start_soon(view.consume, consumer)
            await wait_synced(consumer)
            expected = {worker.uid for worker in workers}
            assert set(view.workers) == expected
            assert set(sub.workers()) == expected
            assert dict(sub.workers()) == hash_content(
                redis_server.url, redis_discovery.namespace
            )
            async with aiter(sub) as late:
                for _ in workers:
                    assert not late.synced
                    await anext(late)
                assert late.synced
            tg.cancel_scope.cancel()
        assert all(not isinstance(event, Synced) for event in view.events)


async def test_synced_stays_true_through_a_reconnection(
    redis_server: RedisServer,
) -> None:
    """After a lost connection the new snapshot's marker changes nothing:
    consumers stay synced, converge to the hash, and never see a marker."""
    redis_discovery = discovery(redis_server.url)
    namespace = redis_discovery.namespace
    first, second = fake_worker(1), fake_worker(2)
    async with redis_discovery.publisher as publisher:
        await publisher.publish("worker-added", first)
        sub = redis_discovery.subscribe()
        view = View()
        async with SubscriptionPool(), anyio.create_task_group() as tg:
            consumer = aiter(sub)
            tg.start_soon(view.consume, consumer)
            await wait_synced(consumer)
            reconnects = redis_discovery.statistics().reconnects
            server = admin(redis_server.url)
            killed = sum(
                server.client_kill_filter(_id=entry["id"])
                for entry in server.client_list()
                if entry["name"].startswith(f"wool-pooling:subscriber:{namespace}:")
            )
            assert killed == 1
            await publisher.publish("worker-added", second)
            await view.has(first.uid, second.uid)
            await eventually(
                lambda: redis_discovery.statistics().reconnects > reconnects
            )
            assert consumer.synced
            assert set(sub.workers()) == {first.uid, second.uid}
            tg.cancel_scope.cancel()
        assert all(not isinstance(event, Synced) for event in view.events)


async def test_a_shared_discovery_of_redis_syncs_on_its_snapshot(
    redis_server: RedisServer,
) -> None:
    """``SharedDiscovery(RedisDiscovery(...))``: its consumers are synced once
    handed the Redis snapshot (relayed from the nested shared subscription),
    and its ``workers()`` reads them."""
    redis_discovery = discovery(redis_server.url)
    workers = [fake_worker(port) for port in range(1, 3)]
    async with redis_discovery.publisher as publisher:
        for worker in workers:
            await publisher.publish("worker-added", worker)
        shared = SharedDiscovery(redis_discovery)
        view = View()
        async with SubscriptionPool(), anyio.create_task_group() as tg:
            consumer = aiter(shared.subscribe())
            tg.start_soon(view.consume, consumer)
            await wait_synced(consumer)
            expected = {worker.uid for worker in workers}
            assert set(view.workers) == expected
            assert set(shared.workers()) == expected
            tg.cancel_scope.cancel()
