"""``RedisDiscovery`` on a Sentinel-monitored master, through a real failover.

The fixture starts a master, one replica and three sentinels
(``redis-server --sentinel``) on loopback, tuned to fail over within about a
second. Without ``redis-server`` the test skips, or fails under
``WOOL_POOLING_REQUIRE_REDIS=1`` (CI), as every Redis test does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anyio
import pytest
import redis
from _loops import asyncio_backend
from _redis import SentinelSet
from _redis import require_redis_server
from redis_views import eventually
from redis_views import fake_worker
from redis_views import published

from wool_pooling import RestartPolicy
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisDiscoveryError

pytestmark = pytest.mark.anyio
anyio_backend = asyncio_backend

FAST = RestartPolicy(attempts=None, backoff=0.05, max_backoff=0.3, jitter=0.2)


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSet]:
    """A master, a replica and three sentinels, started for the module."""
    group = SentinelSet(require_redis_server())
    try:
        group.start()
        yield group
    finally:
        group.cleanup()


def records(host: str, port: int, namespace: str) -> set[uuid.UUID]:
    client = redis.Redis(host=host, port=port)
    try:
        return {
            uuid.UUID(uid.decode())
            for uid in client.hkeys(f"wool:{{{namespace}}}:workers")
        }
    finally:
        client.close()


async def publish_until_taken(publisher: object, *call: object) -> None:
    """Publish, retrying while the failover is under way."""
    with anyio.fail_after(30):
        while True:
            try:
                await publisher.publish(*call)  # type: ignore[attr-defined]
                return
            except RedisDiscoveryError:
                await anyio.sleep(0.1)


async def test_a_failover_is_a_reconnect_views_converge_without_duplicates(
    sentinels: SentinelSet,
) -> None:
    """``redis+sentinel://...``: SIGKILL the master, the replica is promoted;
    every view converges to the new master's records, with no duplicate add
    and no missed drop (each view checks every event as it arrives)."""
    namespace = f"sentinel-{uuid.uuid4().hex[:10]}"
    # A lease longer than the failover: no worker expires meanwhile, so none
    # is dropped and added again (that would be right, but not this test).
    discovery = RedisDiscovery(
        sentinels.url, namespace, lease=10.0, reconnect=FAST, connect_timeout=1.0
    )
    workers = [fake_worker(port) for port in range(1, 5)]
    async with published(discovery, *workers[:3], views=3) as (publisher, views):
        old = sentinels.current_master()
        assert old == ("127.0.0.1", sentinels.master.port)
        replica = ("127.0.0.1", sentinels.replica.port)
        await eventually(
            lambda: records(*replica, namespace) == {w.uid for w in workers[:3]}
        )

        sentinels.kill_master()
        await eventually(lambda: sentinels.current_master() == replica)
        await publish_until_taken(publisher, "worker-dropped", workers[0])
        await publish_until_taken(publisher, "worker-added", workers[3])
        expected = {worker.uid for worker in workers[1:]}
        for view in views:
            await view.has(*expected)
        await eventually(lambda: records(*replica, namespace) == expected)
        assert discovery.statistics().reconnects >= 1
        for view in views:
            assert all(count == 1 for count in view.added.values())
            assert [
                e.metadata.uid for e in view.events if e.type == "worker-dropped"
            ] == [workers[0].uid]


def test_sentinel_urls_are_parsed_and_redacted() -> None:
    """Several sentinels, a service name, a database; the password is the
    master's and never shown."""
    discovery = RedisDiscovery(
        "redis+sentinel://u:pw@127.0.0.1:26379,127.0.0.1:26380/mymaster/2", "ns"
    )
    assert repr(discovery) == (
        "RedisDiscovery('redis+sentinel://u@127.0.0.1:26379,127.0.0.1:26380"
        "/mymaster/2', 'ns')"
    )
    with pytest.raises(ValueError, match="service_name"):
        RedisDiscovery("redis+sentinel://127.0.0.1:26379/", "ns")
