"""A subscription that reconnects to a server that kept its data resumes from
the namespace's change log: it reads only the changes it missed, not a
snapshot (docs/redis.rst, *Resuming*), and falls back to a snapshot when the
log cannot tell it everything. (On a Cluster, tests/test_redis_cluster.py's
failover resumes.)

redis-py's client runs on asyncio only, so these tests run on asyncio only.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import anyio
import pytest
import redis.asyncio
from _loops import asyncio_backend
from _redis import RedisServer
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from redis_views import View
from redis_views import add_user
from redis_views import admin
from redis_views import discovery
from redis_views import eventually
from redis_views import fake_worker
from redis_views import namespace
from wool import WorkerMetadata
from wool import protocol

from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisPublisher
from wool_pooling.redis._scripts import PUBLISH
from wool_pooling.redis._scripts import RENEW
from wool_pooling.redis._scripts import Keys

pytestmark = pytest.mark.anyio
anyio_backend = asyncio_backend


async def away(
    server: RedisServer, subscriber: RedisDiscovery, publish: Any, user: str = "sub"
) -> None:
    """Cut the subscription (``CLIENT KILL TYPE pubsub``) and keep it from
    reconnecting (its user disabled) while ``publish()`` runs: the changes
    it makes are all missed, none heard live."""
    client = admin(server.url)
    client.execute_command("ACL", "SETUSER", user, "off")
    client.client_kill_filter(_type="pubsub")
    try:
        await publish()
    finally:
        client.execute_command("ACL", "SETUSER", user, "on")
        client.close()
    await eventually(lambda: subscriber.statistics().reconnects == 1)


def subscriber_url(server: RedisServer) -> str:
    add_user(server.url, "sub", "sub-pw")
    return f"redis://sub:sub-pw@127.0.0.1:{server.port}"


async def test_a_blip_resumes_from_the_change_log(redis_server: RedisServer) -> None:
    """Changes published while the subscription was cut reach it from the
    change log: no second snapshot, one resume that read exactly those
    changes, and the view equals the server's."""
    found = discovery(subscriber_url(redis_server))
    workers = [fake_worker(port) for port in range(1, 7)]
    updated = dataclasses.replace(workers[1], tags=frozenset({"updated"}))
    view = View()
    publisher = RedisPublisher(redis_server.url, found.namespace, lease=10.0)
    async with publisher, anyio.create_task_group() as tg:
        for worker in workers[:4]:
            await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, found.subscribe())
        await view.has(*(worker.uid for worker in workers[:4]))

        async def publish() -> None:
            await publisher.publish("worker-dropped", workers[0])
            await publisher.publish("worker-added", workers[4])
            await publisher.publish("worker-updated", updated)

        await away(redis_server, found, publish)
        await view.has(*(worker.uid for worker in workers[1:5]))
        stats = found.statistics()
        assert (stats.snapshots, stats.resumes, stats.changes_read) == (1, 1, 3)
        await publisher.publish("worker-added", workers[5])
        await view.has(*(worker.uid for worker in workers[1:]))
        assert view.workers[updated.uid] == updated
        assert [e.type for e in view.events[4:]] == [
            "worker-dropped",
            "worker-added",
            "worker-updated",
            "worker-added",
        ]
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("fault", ["trimmed", "no log", "new epoch", "flushall"])
async def test_a_reconnect_the_log_cannot_serve_takes_a_snapshot(
    redis_server: RedisServer, fault: str
) -> None:
    """A log trimmed past the last change applied, no log
    (``change_log=0``), a new epoch, or a server that lost every key: the
    reconnection takes a full snapshot, and the view ends equal to the
    server's."""
    log = 0 if fault == "no log" else 2
    found = discovery(subscriber_url(redis_server), change_log=log)
    workers = [fake_worker(port) for port in range(1, 5)]
    view = View()
    publisher = RedisPublisher(
        redis_server.url, found.namespace, lease=10.0, change_log=log
    )
    keys = Keys.of(found.namespace)
    expected = workers[:2] if fault in ("new epoch", "flushall") else workers
    async with publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", workers[0])
        tg.start_soon(view.consume, found.subscribe())
        await view.has(workers[0].uid)

        async def publish() -> None:
            client = admin(redis_server.url)
            if fault == "new epoch":
                client.set(keys.epoch, "another")
            elif fault == "flushall":
                client.flushall()
            client.close()
            for worker in workers[1:] if expected is workers else workers[1:2]:
                await publisher.publish("worker-added", worker)

        await away(redis_server, found, publish)
        # (after a flush, worker 0 is held, then added again by its renewal)
        await view.has(*(worker.uid for worker in expected))
        stats = found.statistics()
        assert (stats.snapshots, stats.resumes) == (2, 0)
        assert stats.epoch_changes == (fault in ("new epoch", "flushall"))
        tg.cancel_scope.cancel()


async def test_a_server_that_lost_the_last_change_applied_takes_a_snapshot(
    redis_server: RedisServer,
) -> None:
    """A server of the same epoch that lacks the last change the
    subscription applied, and has since given its version to another change
    (a failover to a replica that had not received the master's last
    write): the log's entry differs from the change applied, so the
    reconnection takes a snapshot rather than trusting the version."""
    found = discovery(subscriber_url(redis_server))
    lost, other = fake_worker(1), fake_worker(2)
    view = View()
    # (a long lease: no renewal adds the lost worker back within the test)
    publisher = RedisPublisher(redis_server.url, found.namespace, lease=600.0)
    keys = Keys.of(found.namespace)
    async with publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", lost)
        tg.start_soon(view.consume, found.subscribe())
        await view.has(lost.uid)

        async def publish() -> None:
            client = admin(redis_server.url)  # the state before that write
            client.delete(keys.changes, keys.workers, keys.leases)
            client.set(keys.version, 0)
            client.close()
            await publisher.publish("worker-added", other)  # version 1 again

        await away(redis_server, found, publish)
        await view.has(other.uid)
        stats = found.statistics()
        assert (stats.snapshots, stats.resumes, stats.epoch_changes) == (2, 0, 0)
        tg.cancel_scope.cancel()


async def test_an_invalid_change_in_the_log_ends_the_resume_with_a_snapshot(
    redis_server: RedisServer,
) -> None:
    """A logged change that is not valid worker metadata (warned about and
    counted): the changes before it are passed on, and the rest comes from
    a snapshot in the same session, so the view still equals the server's
    valid records."""
    found = discovery(subscriber_url(redis_server))
    workers = [fake_worker(port) for port in range(1, 6)]
    view = View()
    publisher = RedisPublisher(redis_server.url, found.namespace, lease=10.0)
    keys = Keys.of(found.namespace)
    async with publisher, anyio.create_task_group() as tg:
        for worker in workers[:3]:
            await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, found.subscribe())
        await view.has(*(worker.uid for worker in workers[:3]))

        async def publish() -> None:
            await publisher.publish("worker-added", workers[3])
            client = admin(redis_server.url)
            garbage = [keys.channel, "e", 600_000, 10_000, "worker-added"]
            client.register_script(PUBLISH)(
                keys=keys.keys, args=[*garbage, str(uuid.uuid4()), b"?", 600_000]
            )
            client.close()
            await publisher.publish("worker-added", workers[4])

        await away(redis_server, found, publish)
        await view.has(*(worker.uid for worker in workers))
        stats = found.statistics()
        assert (stats.resumes, stats.snapshots) == (1, 2)
        assert stats.invalid_records >= 1
        tg.cancel_scope.cancel()


# -- the model: random interleavings against a real server --

#: Workers the programs change; and as many more, added first and left
#: alone, so that a resume is the cheaper read (fewer changes than records).
WORKERS = 6
Step = tuple[str, int]
steps = st.tuples(
    st.sampled_from(["add", "update", "drop", "expire", "cut", "cut", "settle"]),
    st.integers(0, WORKERS - 1),
)


async def run_model(url: str, program: list[Step], log: int) -> None:
    """Run ``program`` (publishes, drops, lease expiries, cut connections)
    by the discovery's own scripts against a subscription; at each settle,
    and at the end, once the subscription has reconnected after the last
    cut, its view must equal the server's records. The view itself refuses
    a second add and a drop of a worker it does not know."""
    name = namespace()
    keys = Keys.of(name)
    client = redis.asyncio.Redis.from_url(url)
    publish, renew = client.register_script(PUBLISH), client.register_script(RENEW)
    found = discovery(url, name, lease=600.0, change_log=log)
    base = [keys.channel, uuid.uuid4().hex, 600_000, log]
    uids = [str(uuid.uuid4()) for _ in range(2 * WORKERS)]
    tags = iter(range(1_000_000))
    view = View()

    async def truth() -> dict[uuid.UUID, WorkerMetadata]:
        records = await client.hgetall(keys.workers)
        return {
            uuid.UUID(uid.decode()): WorkerMetadata.from_protobuf(
                protocol.WorkerMetadata.FromString(payload)
            )
            for uid, payload in records.items()
        }

    #: The reconnect count just after the last cut, if not yet followed by
    #: a reconnect: a settle waits for one.
    cut: list[int] = []

    async def settle() -> None:
        if cut:
            await eventually(lambda: found.statistics().reconnects > cut[-1])
            cut.clear()
        expected = await truth()
        await view.until(lambda workers: workers == expected)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(view.consume, found.subscribe())
            await eventually(lambda: found.statistics().snapshots == 1)
            program = [
                ("add", index) for index in range(WORKERS, 2 * WORKERS)
            ] + program
            for action, index in program:
                uid = uids[index]
                if action in ("add", "update", "drop"):
                    metadata = WorkerMetadata(
                        uid=uuid.UUID(uid),
                        address=f"127.0.0.1:{index + 1}",
                        pid=0,
                        version="test",
                        tags=frozenset({f"t{next(tags)}"}),
                    )
                    kind = {"add": "worker-added", "update": "worker-updated"}
                    payload = metadata.to_protobuf().SerializeToString()
                    args = [kind.get(action, "worker-dropped"), uid, payload, 600_000]
                    await publish(keys=keys.keys, args=[*base, *args])
                elif action == "expire":
                    await client.zadd(keys.leases, {uid: 0})
                    await renew(keys=keys.keys, args=[*base, 600_000])  # reaps
                elif action == "cut":
                    if await client.client_kill_filter(_type="pubsub"):
                        cut.append(found.statistics().reconnects)
                else:
                    await settle()
            await settle()
            stats = found.statistics()
            assert stats.snapshots + stats.resumes == 1 + stats.reconnects
            assert stats.gaps == stats.epoch_changes == 0
            tg.cancel_scope.cancel()
    finally:
        await client.aclose()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(program=st.lists(steps, min_size=4, max_size=25), log=st.sampled_from([2, 1000]))
def test_resumes_keep_every_view_equal_to_the_server(
    redis_server: RedisServer, program: list[Step], log: int
) -> None:
    anyio.run(run_model, redis_server.url, program, log, backend="asyncio")


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_change_log_is_a_count(value: object, error: type[Exception]) -> None:
    """``change_log`` is an int >= 0 (0: no log, a snapshot at every
    reconnection), checked at construction by the discovery and the
    publisher alike."""
    for cls in (RedisDiscovery, RedisPublisher):
        with pytest.raises(error, match="change_log"):
            cls("redis://127.0.0.1", "ns", change_log=value)
