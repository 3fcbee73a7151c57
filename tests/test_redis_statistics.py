"""``RedisDiscovery.statistics()`` against a real ``redis-server``: what an
operator reads instead of the server's ``CLIENT LIST``.

redis-py's client runs on asyncio only, so these tests run on asyncio only.
"""

from __future__ import annotations

import anyio
import pytest
from _loops import asyncio_backend
from _redis import RedisServer
from redis_views import admin
from redis_views import connections
from redis_views import discovery
from redis_views import eventually
from redis_views import fake_worker
from redis_views import published

from wool_pooling.redis import RedisStatistics

pytestmark = pytest.mark.anyio
anyio_backend = asyncio_backend


async def test_many_consumers_hold_the_two_connections_the_server_lists(
    redis_server: RedisServer,
) -> None:
    """200 consumers of one namespace: ``connections`` is 2, as ``CLIENT LIST``
    shows, after one snapshot; 0 once every consumer is gone."""
    redis_discovery = discovery(redis_server.url)
    namespace = redis_discovery.namespace
    assert redis_discovery.statistics() == RedisStatistics()
    async with published(redis_discovery, fake_worker(1), views=200):
        stats = redis_discovery.statistics()
        listed = connections(redis_server.url, "subscriber", namespace)
        listed += connections(redis_server.url, "subscriber-cmd", namespace)
        assert stats.connections == listed == 2
        assert stats.snapshots == 1
        assert (stats.reconnects, stats.gaps, stats.epoch_changes) == (0, 0, 0)
    await eventually(lambda: redis_discovery.statistics().connections == 0)


async def test_announcements_are_counted_and_the_last_message_timed(
    redis_server: RedisServer,
) -> None:
    """Each announcement received is counted, and ``seconds_since_last_message``
    is measured from the last one (``None`` before any message)."""
    # No liveness PING (and its answer) within the test.
    redis_discovery = discovery(redis_server.url, liveness_timeout=60)
    later = [fake_worker(port) for port in range(2, 5)]
    async with published(redis_discovery, fake_worker(1)) as (publisher, [view]):
        before = redis_discovery.statistics()
        assert before.announcements == 0  # worker 1 came in the snapshot
        for worker in later:
            await publisher.publish("worker-added", worker)
        await view.until(lambda workers: len(workers) == 4)
        stats = redis_discovery.statistics()
        assert stats.announcements == 3
        assert stats.seconds_since_last_message is not None
        assert 0 <= stats.seconds_since_last_message < 5
        await anyio.sleep(0.05)  # the clock, not a synchronisation
        after = redis_discovery.statistics().seconds_since_last_message
        assert after is not None
        assert after > stats.seconds_since_last_message


async def test_a_version_gap_is_counted_with_its_new_snapshot(
    redis_server: RedisServer,
) -> None:
    """An announcement found missing counts one gap, one reconnect and one more
    snapshot, and no epoch change."""
    redis_discovery = discovery(redis_server.url)
    keys = f"wool:{{{redis_discovery.namespace}}}"
    server = admin(redis_server.url)
    async with published(redis_discovery, fake_worker(1)) as (publisher, [view]):
        server.incr(f"{keys}:version")  # behind the subscription's back
        late = fake_worker(3)
        await publisher.publish("worker-added", late)
        await view.until(lambda workers: late.uid in workers)
        await eventually(lambda: redis_discovery.statistics().snapshots == 2)
        stats = redis_discovery.statistics()
        assert (stats.gaps, stats.reconnects, stats.epoch_changes) == (1, 1, 0)
    server.close()


async def test_lost_server_data_is_counted_as_an_epoch_change(
    redis_server: RedisServer,
) -> None:
    """The namespace's keys deleted under a live subscription (the server lost
    its data): the next snapshot finds a new epoch, counted once."""
    redis_discovery = discovery(redis_server.url)
    keys = f"wool:{{{redis_discovery.namespace}}}"
    server = admin(redis_server.url)
    worker = fake_worker(1)
    async with published(redis_discovery, worker) as (publisher, [view]):
        server.delete(
            *(f"{keys}:{part}" for part in ("workers", "leases", "version", "epoch"))
        )
        await eventually(lambda: redis_discovery.statistics().epoch_changes == 1)
        assert redis_discovery.statistics().gaps == 0
        await publisher.publish("worker-added", fake_worker(2))
        await view.until(lambda workers: len(workers) == 2)
    server.close()
    assert redis_discovery.statistics().epoch_changes == 1


async def test_an_unshared_view_opens_its_own_connections(
    redis_server: RedisServer,
) -> None:
    """Without pooling every consumer holds its own two connections, and
    ``connections`` says so."""
    redis_discovery = discovery(redis_server.url, shared=False)
    async with published(redis_discovery, fake_worker(1), views=3):
        assert redis_discovery.statistics().connections == 6
        assert redis_discovery.statistics().snapshots == 3
    await eventually(lambda: redis_discovery.statistics().connections == 0)
