"""``RedisDiscovery`` on a real Redis Cluster: sharded pub/sub, failover, migration.

Each test gets its own cluster of 3 masters and 3 replicas on loopback
(``_redis_cluster``), so a SIGKILLed master or a moved slot never leaks into
another test. Asyncio only: redis-py's client (and wool) are, and the trio
refusal is pinned by the single-server tests.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from _loops import asyncio_options
from _redis_cluster import CERTIFICATE
from _redis_cluster import ClusterNode
from _redis_cluster import RedisCluster
from redis_views import View
from redis_views import eventually
from redis_views import fake_worker

from wool_pooling import RestartPolicy
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisDiscoveryError
from wool_pooling.redis import RedisPublisher
from wool_pooling.redis._scripts import PUBLISH
from wool_pooling.redis._scripts import RENEW
from wool_pooling.redis._scripts import SNAPSHOT
from wool_pooling.redis._scripts import sharded

pytestmark = pytest.mark.anyio

FAST = RestartPolicy(attempts=None, backoff=0.05, max_backoff=0.3, jitter=0.2)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """Asyncio only (as configured for the run: plain, eager or uvloop)."""
    return ("asyncio", asyncio_options())


@pytest.fixture
def cluster() -> Iterator[RedisCluster]:
    """A fresh cluster (3 masters, 3 replicas) for one test."""
    group = RedisCluster()
    try:
        yield group
    finally:
        group.cleanup()


def discovery(url: str, namespace: str, **options: Any) -> RedisDiscovery:
    # A lease longer than any fault in these tests: no worker expires
    # meanwhile, so every drop seen is one that was published.
    options.setdefault("lease", 10.0)
    options.setdefault("reconnect", FAST)
    options.setdefault("connect_timeout", 2.0)
    return RedisDiscovery(url, namespace, **options)


def new_namespace() -> str:
    return f"cluster-{uuid.uuid4().hex[:10]}"


def channel(namespace: str) -> str:
    return f"wool:{{{namespace}}}:events:0"


def shard_subscribers(node: ClusterNode, namespace: str) -> int:
    """How many connections ``node`` has subscribed to the namespace's
    shard channel."""
    return int(node.command("PUBSUB", "SHARDNUMSUB", channel(namespace)).split()[1])


async def publish_until_taken(publisher: RedisPublisher, *call: Any) -> None:
    """Publish, retrying while the cluster moves the slot over."""
    with anyio.fail_after(30):
        while True:
            try:
                await publisher.publish(*call)
                return
            except RedisDiscoveryError:
                await anyio.sleep(0.1)


def assert_no_repeats(view: View, dropped: list[uuid.UUID]) -> None:
    assert all(count == 1 for count in view.added.values()), view.added
    assert [e.metadata.uid for e in view.events if e.type == "worker-dropped"] == (
        dropped
    )


async def test_cluster_announcements_are_sharded_and_reach_subscribers(
    cluster: RedisCluster,
) -> None:
    """On a ``redis+cluster://`` url, workers published are seen by every
    subscriber; announcements go by ``SPUBLISH`` to the shard channel on the
    slot's master (``SSUBSCRIBE``d there), never by classic ``PUBLISH``."""
    namespace = new_namespace()
    found = discovery(cluster.url(seeds=1), namespace)
    owner = cluster.owner(cluster.slot_of(channel(namespace)))
    workers = [fake_worker(port) for port in range(1, 4)]
    views = [View() for _ in range(2)]
    async with found.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", workers[0])
        for view in views:
            tg.start_soon(view.consume, found.subscribe())
        for view in views:
            await view.has(workers[0].uid)
        await eventually(lambda: shard_subscribers(owner, namespace) == 1)
        assert owner.command("PUBSUB", "NUMSUB", channel(namespace)).split()[1] == "0"
        await publisher.publish("worker-added", workers[1])
        await publisher.publish("worker-added", workers[2])
        await publisher.publish("worker-dropped", workers[1])
        for view in views:
            await view.has(workers[0].uid, workers[2].uid)
            assert_no_repeats(view, [workers[1].uid])
        assert found.statistics().reconnects == 0
        tg.cancel_scope.cancel()
    assert "cmdstat_spublish:" in owner.command("INFO", "commandstats")
    for node in cluster.nodes:
        assert "cmdstat_publish:" not in node.command("INFO", "commandstats")


async def test_a_late_joiner_gets_the_snapshot_then_the_changes(
    cluster: RedisCluster,
) -> None:
    """A subscriber that joins after workers were published gets them all
    (the snapshot, read on the slot's master), then each later change once."""
    namespace = new_namespace()
    workers = [fake_worker(port) for port in range(1, 5)]
    early, late = View(), View()
    found = discovery(cluster.url(), namespace)
    async with found.publisher as publisher, anyio.create_task_group() as tg:
        tg.start_soon(early.consume, found.subscribe())
        for worker in workers[:3]:
            await publisher.publish("worker-added", worker)
        await early.has(*(worker.uid for worker in workers[:3]))
        await publisher.publish("worker-dropped", workers[0])
        await early.has(workers[1].uid, workers[2].uid)
        # Its own connections: another process, as far as the server sees;
        # with options only a cluster client takes.
        options = {"reinitialize_steps": 3, "require_full_coverage": True}
        joiner = discovery(
            cluster.url(seeds=2), namespace, shared=False, client_options=options
        )
        tg.start_soon(late.consume, joiner.subscribe())
        await late.has(workers[1].uid, workers[2].uid)
        assert [e.type for e in late.events] == ["worker-added"] * 2
        await publisher.publish("worker-added", workers[3])
        await publisher.publish("worker-dropped", workers[2])
        for view in (early, late):
            await view.has(workers[1].uid, workers[3].uid)
        assert_no_repeats(early, [workers[0].uid, workers[2].uid])
        assert_no_repeats(late, [workers[2].uid])
        tg.cancel_scope.cancel()


async def test_a_master_killed_mid_stream_fails_over_and_views_converge(
    cluster: RedisCluster,
) -> None:
    """SIGKILL the master of the namespace's slot while subscribers stream:
    its replica takes over, the subscription reconnects to it and resumes
    from its copy of the change log (no second snapshot), and every view
    converges with no duplicate add and no missed drop."""
    namespace = new_namespace()
    found = discovery(cluster.url(), namespace)
    slot = cluster.slot_of(channel(namespace))
    workers = [fake_worker(port) for port in range(1, 6)]
    views = [View() for _ in range(3)]
    async with found.publisher as publisher, anyio.create_task_group() as tg:
        for worker in workers[:3]:
            await publisher.publish("worker-added", worker)
        for view in views:
            tg.start_soon(view.consume, found.subscribe())
        for view in views:
            await view.has(*(worker.uid for worker in workers[:3]))
        old = cluster.owner(slot)
        # Replicated before the kill: the replica holds what the views hold.
        await eventually(lambda: cluster.replicated(old))
        old.kill()
        new = await anyio.to_thread.run_sync(cluster.wait_promoted, slot, old)
        assert new is not old
        await publish_until_taken(publisher, "worker-dropped", workers[0])
        await publish_until_taken(publisher, "worker-added", workers[3])
        await publish_until_taken(publisher, "worker-updated", workers[1])
        await publish_until_taken(publisher, "worker-added", workers[4])
        expected = {worker.uid for worker in workers[1:]}
        for view in views:
            await view.has(*expected)
        stats = found.statistics()
        assert stats.reconnects >= 1
        assert (stats.snapshots, stats.resumes) == (1, stats.reconnects)
        for view in views:
            assert_no_repeats(view, [workers[0].uid])
        await eventually(
            lambda: new.command("HLEN", f"wool:{{{namespace}}}:workers").strip() == "4"
        )
        tg.cancel_scope.cancel()


async def test_a_migrated_slot_is_a_reconnect_to_its_new_master(
    cluster: RedisCluster,
) -> None:
    """Migrate the namespace's slot to another master (IMPORTING, MIGRATING,
    MIGRATE, SETSLOT NODE), a worker published mid-migration (``ASK``): the
    old master's unsolicited ``sunsubscribe`` ends the session at once (not
    at the next reap, an hour away), the subscription re-subscribes on the
    new master with a new snapshot, and every change reaches every view,
    once."""
    namespace = new_namespace()
    found = discovery(cluster.url(), namespace, reap_interval=3600.0)
    slot = cluster.slot_of(channel(namespace))
    workers = [fake_worker(port) for port in range(1, 6)]
    views = [View() for _ in range(2)]
    async with found.publisher as publisher, anyio.create_task_group() as tg:
        for worker in workers[:2]:
            await publisher.publish("worker-added", worker)
        for view in views:
            tg.start_soon(view.consume, found.subscribe())
        for view in views:
            await view.has(workers[0].uid, workers[1].uid)
        source = cluster.owner(slot)
        target = next(node for node in cluster.masters() if node is not source)
        await eventually(lambda: shard_subscribers(source, namespace) == 1)
        await anyio.to_thread.run_sync(cluster.move_keys, slot, source, target)
        # The keys are on the target, the slot still the source's: ASK.
        await publisher.publish("worker-added", workers[2])
        await anyio.to_thread.run_sync(cluster.assign, slot, source, target)
        assert cluster.owner(slot) is target
        await eventually(lambda: found.statistics().reconnects >= 1)
        await eventually(lambda: shard_subscribers(target, namespace) == 1)
        for view in views:
            await view.has(*(worker.uid for worker in workers[:3]))
        await publish_until_taken(publisher, "worker-added", workers[3])
        await publish_until_taken(publisher, "worker-dropped", workers[0])
        await publish_until_taken(publisher, "worker-added", workers[4])
        for view in views:
            await view.has(*(worker.uid for worker in workers[1:]))
            assert_no_repeats(view, [workers[0].uid])
        assert shard_subscribers(source, namespace) == 0
        tg.cancel_scope.cancel()


async def test_a_tls_cluster_carries_publishers_and_subscribers_through_failover() -> (
    None
):
    """``rediss+cluster://`` with redis-py's ``ssl_*`` options (and
    ``RedisCluster``'s own ``ssl``, which no node connection takes): the
    layout, the scripts and the sharded subscription all go over TLS, before
    and after the namespace's master is SIGKILLed."""
    tls = RedisCluster(tls=True)
    try:
        namespace = new_namespace()
        found = discovery(
            tls.url(),
            namespace,
            client_options={"ssl_ca_certs": str(CERTIFICATE), "ssl": True},
        )
        slot = tls.slot_of(channel(namespace))
        workers = [fake_worker(port) for port in range(1, 4)]
        view = View()
        async with found.publisher as publisher, anyio.create_task_group() as tg:
            await publisher.publish("worker-added", workers[0])
            tg.start_soon(view.consume, found.subscribe())
            await view.has(workers[0].uid)
            await publisher.publish("worker-added", workers[1])
            await view.has(workers[0].uid, workers[1].uid)
            old = tls.owner(slot)
            await eventually(lambda: tls.replicated(old))
            old.kill()
            await anyio.to_thread.run_sync(tls.wait_promoted, slot, old)
            await publish_until_taken(publisher, "worker-dropped", workers[0])
            await publish_until_taken(publisher, "worker-added", workers[2])
            await view.has(workers[1].uid, workers[2].uid)
            assert found.statistics().reconnects >= 1
            assert_no_repeats(view, [workers[0].uid])
            tg.cancel_scope.cancel()
    finally:
        tls.cleanup()


def cluster_acl_rule() -> list[str]:
    """The cluster's ``ACL SETUSER`` rule ``docs/redis.rst`` gives (its
    second), for user ``wool``, split into arguments."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "redis.rst").read_text()
    rules = re.findall(r"ACL SETUSER wool (.+)", page)
    assert len(rules) == 2, "docs/redis.rst gives no cluster ACL rule"
    return rules[1].split()


async def test_a_user_limited_to_the_documented_cluster_acl_rule_suffices(
    cluster: RedisCluster,
) -> None:
    """With exactly the cluster ACL rule of the docs on every node (and the
    password in the url), publishers and subscribers work, slot moves
    included."""
    arguments = [
        "secret-pw" if part == ">PASSWORD" else part for part in cluster_acl_rule()
    ]
    arguments = [">secret-pw" if part == "secret-pw" else part for part in arguments]
    for node in cluster.nodes:
        node.command("ACL", "SETUSER", "wool", *arguments)
    seeds = ",".join(f"127.0.0.1:{node.port}" for node in cluster.nodes[:2])
    namespace = new_namespace()
    found = discovery(f"redis+cluster://wool:secret-pw@{seeds}", namespace)
    slot = cluster.slot_of(channel(namespace))
    workers = [fake_worker(port) for port in range(1, 4)]
    view = View()
    async with found.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", workers[0])
        tg.start_soon(view.consume, found.subscribe())
        await view.has(workers[0].uid)
        await publisher.publish("worker-added", workers[1])
        await view.has(workers[0].uid, workers[1].uid)
        source = cluster.owner(slot)
        target = next(node for node in cluster.masters() if node is not source)
        await anyio.to_thread.run_sync(cluster.migrate_slot, slot, target)
        await eventually(lambda: found.statistics().reconnects >= 1)
        await publish_until_taken(publisher, "worker-added", workers[2])
        await publish_until_taken(publisher, "worker-dropped", workers[0])
        await view.has(workers[1].uid, workers[2].uid)
        assert_no_repeats(view, [workers[0].uid])
        tg.cancel_scope.cancel()
    refused = discovery(f"redis+cluster://wool:wrong@{seeds}", namespace)
    with pytest.raises(RedisDiscoveryError, match="invalid username-password"):
        async with refused.publisher:
            pass  # pragma: no cover - never reached
    with pytest.raises(RedisDiscoveryError, match="invalid username-password"):
        async for _ in refused.subscribe():
            pass  # pragma: no cover - never reached


def test_cluster_urls_are_parsed_redacted_and_keyed_by_their_seeds() -> None:
    """Seed nodes (port 6379 by default), the password never shown, one
    subscription key whatever the seeds' order; database 0 only."""
    found = RedisDiscovery(
        "redis+cluster://u:pw@127.0.0.1:7000,127.0.0.1:7001?socket_timeout=3", "ns"
    )
    assert repr(found) == (
        "RedisDiscovery('redis+cluster://u@127.0.0.1:7000,127.0.0.1:7001"
        "?socket_timeout=3', 'ns')"
    )
    assert found == RedisDiscovery(
        "redis+cluster://u:other@127.0.0.1:7001,127.0.0.1:7000", "ns"
    )
    assert found != RedisDiscovery("redis+cluster://127.0.0.1:7000", "ns")
    assert RedisPublisher("rediss+cluster://a.example,b.example:7001", "ns")
    for url, message in [
        ("redis+cluster://127.0.0.1:7000/1", "database 0 only"),
        ("redis+cluster://127.0.0.1:7000?db=2", "database 0 only"),
        ("redis+cluster://127.0.0.1:7000?socket_timeout=soon", "socket_timeout"),
        ("redis+cluster://", "needs a host"),
        ("redis+cluster://127.0.0.1:99999", "[Pp]ort"),
    ]:
        with pytest.raises(ValueError, match=message):
            RedisDiscovery(url, "ns")


def test_cluster_client_options_exclude_an_ssl_context_and_seeds() -> None:
    """redis-py's ``RedisCluster`` builds its own TLS connections and takes
    its seeds from the url: both are refused at construction, saying so."""
    import ssl

    with pytest.raises(ValueError, match="ssl_\\* options"):
        RedisDiscovery(
            "rediss+cluster://127.0.0.1:7000",
            "ns",
            client_options={"ssl_context": ssl.create_default_context()},
        )
    with pytest.raises(ValueError, match="seed nodes"):
        RedisPublisher(
            "redis+cluster://127.0.0.1:7000",
            "ns",
            client_options={"startup_nodes": []},
        )


def test_every_script_announces_on_the_shard_channel_in_a_cluster() -> None:
    """Each script's one ``PUBLISH`` becomes ``SPUBLISH``; nothing else
    changes."""
    for script in (PUBLISH, RENEW, SNAPSHOT):
        variant = sharded(script)
        assert "redis.call('PUBLISH'" not in variant
        assert variant.count("redis.call('SPUBLISH', channel,") == 1
        assert variant.replace("SPUBLISH", "PUBLISH") == script
