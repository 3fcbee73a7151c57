"""A namespace's keys on the server: kept while it is used, gone once idle.

Documented rule (``docs/redis.rst``, *Namespace lifecycle*): every script of
a publisher or a subscriber gives the namespace's keys one shared expiry, 10
times the larger of its ``lease`` and ``reap_interval`` from now (never
shortening a later one). Publishers run one every ``lease / 3`` and
subscribers every ``reap_interval``, so the keys stay while either lives and
expire once none is left. Runs on asyncio only (redis-py's client is
asyncio-only), against a real ``redis-server``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis
from _loops import asyncio_options
from _redis import RedisServer
from redis_views import View
from redis_views import admin
from redis_views import discovery
from redis_views import eventually
from redis_views import fake_worker

pytestmark = pytest.mark.anyio

#: A short lease, so that the idle expiry (10 leases) passes within a test.
LEASE = 0.2
IDLE = 10 * LEASE


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", asyncio_options())


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    server = admin(redis_server.url)
    try:
        yield server
    finally:
        server.close()


def keys_of(client: redis.Redis, namespace: str) -> dict[str, int]:
    """The namespace's keys on the server -> their ``PTTL`` in ms."""
    found = client.scan_iter(match=f"wool:{{{namespace}}}:*")
    return {key.decode(): int(client.pttl(key)) for key in found}


async def hold_for(seconds: float, check: Any) -> None:
    """Assert ``check()`` at every step while ``seconds`` of real time pass:
    the keys must outlive their expiry while someone uses them."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        check()
        await anyio.sleep(0.05)
    check()


async def test_an_idle_namespace_leaves_no_key_behind(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    """After the last worker left and every publisher and subscriber exited,
    each key has an expiry of at most the documented time, and then none is
    left."""
    subject = discovery(redis_server.url, lease=LEASE)
    worker = fake_worker()
    view = View()
    async with subject.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, subject.subscribe())
        await view.has(worker.uid)
        await publisher.publish("worker-dropped", worker)
        await view.has()
        tg.cancel_scope.cancel()
    left = keys_of(client, subject.namespace)
    assert {name.rsplit(":", 1)[1] for name in left} == {"version", "epoch", "changes"}
    assert all(0 < ttl <= IDLE * 1000 for ttl in left.values()), left
    await eventually(lambda: keys_of(client, subject.namespace) == {})


async def test_keys_left_without_an_expiry_get_one_at_the_first_script(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    """Keys an earlier version left with no expiry get the idle expiry as
    soon as a subscriber snapshots the namespace, keeping their epoch."""
    subject = discovery(redis_server.url, lease=LEASE)
    base = f"wool:{{{subject.namespace}}}"
    client.set(f"{base}:version", 7)
    client.set(f"{base}:epoch", "old-epoch")
    assert client.pttl(f"{base}:version") == -1
    async with anyio.create_task_group() as tg:
        tg.start_soon(View().consume, subject.subscribe())
        await eventually(lambda: client.pttl(f"{base}:version") > 0)
        tg.cancel_scope.cancel()
    assert client.get(f"{base}:epoch") == b"old-epoch"
    assert client.get(f"{base}:version") == b"7"
    ttls = keys_of(client, subject.namespace)
    assert len(ttls) == 2
    assert all(0 < ttl <= IDLE * 1000 for ttl in ttls.values())


async def test_a_living_subscriber_keeps_the_keys_and_their_epoch(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    """While a subscriber lives, the version and the epoch outlive three
    times the idle expiry, unchanged: no new epoch, no resynchronisation."""
    subject = discovery(redis_server.url, lease=LEASE)
    worker = fake_worker()
    view = View()
    async with anyio.create_task_group() as tg:
        async with subject.publisher as publisher:
            await publisher.publish("worker-added", worker)
            tg.start_soon(view.consume, subject.subscribe())
            await view.has(worker.uid)
            await publisher.publish("worker-dropped", worker)
            await view.has()
        base = f"wool:{{{subject.namespace}}}"
        epoch = client.get(f"{base}:epoch")
        version = client.get(f"{base}:version")
        assert epoch is not None
        assert version is not None

        def unchanged() -> None:
            assert client.get(f"{base}:epoch") == epoch
            assert client.get(f"{base}:version") == version

        await hold_for(3 * IDLE, unchanged)
        assert subject.statistics().reconnects == 0
        assert [event.type for event in view.events] == [
            "worker-added",
            "worker-dropped",
        ]
        tg.cancel_scope.cancel()
    await eventually(lambda: keys_of(client, subject.namespace) == {})


async def test_a_living_publisher_keeps_its_workers_record_and_the_epoch(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    """With no subscriber at all, a publisher's renewals keep its worker's
    record, its lease and the namespace's counters past the idle expiry."""
    subject = discovery(redis_server.url, lease=LEASE)
    worker = fake_worker()
    base = f"wool:{{{subject.namespace}}}"
    async with subject.publisher as publisher:
        await publisher.publish("worker-added", worker)
        epoch = client.get(f"{base}:epoch")
        assert epoch is not None

        def kept() -> None:
            assert client.hexists(f"{base}:workers", str(worker.uid))
            assert client.get(f"{base}:epoch") == epoch
            ttls = keys_of(client, subject.namespace)
            assert len(ttls) == 5
            assert all(ttl > 0 for ttl in ttls.values()), ttls

        await hold_for(3 * IDLE, kept)
        await publisher.publish("worker-dropped", worker)
    await eventually(lambda: keys_of(client, subject.namespace) == {})


async def test_a_short_lease_never_shortens_a_longer_expiry(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    """A publisher with a long lease sets a long expiry; a subscriber with a
    short one, running after it, keeps the longer one (a participant's
    expiry covers its own renewals, whoever ran last)."""
    long_lease = 30.0
    subject = discovery(redis_server.url, lease=long_lease)
    async with subject.publisher as publisher:
        await publisher.publish("worker-added", fake_worker())
    short = discovery(redis_server.url, subject.namespace, lease=LEASE)
    view = View()
    async with anyio.create_task_group() as tg:
        tg.start_soon(view.consume, short.subscribe())
        await view.until(lambda workers: len(workers) == 1)
        await hold_for(LEASE, lambda: None)  # a few of its reaps
        tg.cancel_scope.cancel()
    ttls = keys_of(client, subject.namespace)
    assert len(ttls) == 5
    assert all(IDLE * 1000 < ttl <= 10 * long_lease * 1000 for ttl in ttls.values())
    client.delete(*ttls)
