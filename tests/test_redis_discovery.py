"""``wool_pooling.redis.RedisDiscovery`` against a real ``redis-server``.

One server per module (the ``redis_server`` fixture: free loopback port,
persistence off); every test uses a namespace of its own. No mocks: the
connection counts are read from the server's ``CLIENT LIST``, connections
are cut with ``CLIENT KILL`` and by restarting the server.

redis-py's client runs on asyncio only, so these tests run on asyncio only;
:func:`test_a_subscriber_and_a_publisher_refuse_trio_clearly` pins the clear
error trio gets instead.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable

import anyio
import pytest
from _loops import asyncio_backend
from _redis import RedisServer
from redis_views import CONNECT_ONLY
from redis_views import LEASE
from redis_views import View
from redis_views import add_user
from redis_views import admin
from redis_views import connections
from redis_views import discovery
from redis_views import eventually
from redis_views import fake_worker
from redis_views import hash_content
from redis_views import published

from wool_pooling import RestartPolicy
from wool_pooling import SharedSubscription
from wool_pooling import current_pool
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisDiscoveryError
from wool_pooling.redis import redact

pytestmark = pytest.mark.anyio
anyio_backend = asyncio_backend

# -- pooling, measured on the server --


def test_a_redis_discoverys_subscriber_is_a_shared_subscription_already() -> None:
    """docs/redis.rst: ``RedisDiscovery`` shares without ``SharedDiscovery``:
    its subscriber is a shared subscription, equal for equal discoveries."""
    url = "redis://127.0.0.1:6379/0"
    subscriber = RedisDiscovery(url, "prod").subscriber
    assert isinstance(subscriber, SharedSubscription)
    assert subscriber == RedisDiscovery(url, "prod").subscriber
    assert subscriber != RedisDiscovery(url, "other").subscriber


@pytest.mark.parametrize("shared", [True, False], ids=["pooled", "unpooled"])
async def test_fifty_consumers_hold_one_subscription_connection(
    redis_server: RedisServer, shared: bool
) -> None:
    """50 concurrent consumers of the discovery in one process: one pub/sub
    connection for the namespace when pooled, 50 without the decorator."""
    redis_discovery = discovery(redis_server.url, shared=shared)
    workers = [fake_worker(port) for port in range(1, 4)]
    async with published(redis_discovery, *workers, views=50):
        expected = 1 if shared else 50
        namespace = redis_discovery.namespace
        assert connections(redis_server.url, "subscriber", namespace) == expected
        assert connections(redis_server.url, "subscriber-cmd", namespace) == expected
        assert connections(redis_server.url, "publisher", namespace) == 1
    # Every consumer gone: the shared subscription closed its connections.
    await eventually(lambda: not connections(redis_server.url, "subscriber", namespace))


async def test_filtered_and_unfiltered_proxies_share_the_connection(
    redis_server: RedisServer,
) -> None:
    """A filter applies per consumer on top of the one shared subscription."""
    redis_discovery = discovery(redis_server.url)
    gpu, cpu = fake_worker(1, tag="gpu"), fake_worker(2)
    everyone, gpus = View(), View()
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", gpu)
        await publisher.publish("worker-added", cpu)
        tg.start_soon(everyone.consume, redis_discovery.subscriber)
        tg.start_soon(
            gpus.consume, redis_discovery.subscribe(lambda worker: "gpu" in worker.tags)
        )
        await everyone.has(gpu.uid, cpu.uid)
        await gpus.has(gpu.uid)
        assert current_pool().statistics().entries == 1
        ns = redis_discovery.namespace
        assert connections(redis_server.url, "subscriber", ns) == 1
        tg.cancel_scope.cancel()


# -- ordering and duplicates --


async def test_events_arrive_in_order_and_duplicates_are_skipped(
    redis_server: RedisServer,
) -> None:
    """Added, updated, dropped in publication order; an announcement replayed
    with an old version is skipped; a re-add with the same metadata only
    renews; an update of an unknown worker adds it."""
    redis_discovery = discovery(redis_server.url)
    first, second = fake_worker(1), fake_worker(2)
    moved = fake_worker(3)
    moved = type(moved)(uid=first.uid, address="127.0.0.1:9", pid=0, version="test")
    view = View()
    server = admin(redis_server.url)
    channel = f"wool:{{{redis_discovery.namespace}}}:events:0"
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await publisher.publish("worker-added", first)
        await view.has(first.uid)
        await publisher.publish("worker-added", first)  # same metadata: no event
        await publisher.publish("worker-updated", moved)
        # A replay of version 1 (first's add): already applied, skipped.
        epoch = server.get(f"wool:{{{redis_discovery.namespace}}}:epoch")
        server.publish(
            channel,
            b"1 "
            + epoch
            + b" worker-added "
            + str(first.uid).encode()
            + b" "
            + bytes(first.to_protobuf().SerializeToString()),
        )
        await publisher.publish("worker-updated", second)  # unknown: an add
        await publisher.publish("worker-dropped", moved)
        await publisher.publish("worker-dropped", moved)  # unknown now: nothing
        await view.has(second.uid)
        tg.cancel_scope.cancel()
    server.close()
    assert [(event.type, event.metadata.uid) for event in view.events] == [
        ("worker-added", first.uid),
        ("worker-updated", first.uid),
        ("worker-added", second.uid),
        ("worker-dropped", first.uid),
    ]
    assert view.events[1].metadata.address == "127.0.0.1:9"
    assert redis_discovery.statistics().reconnects == 0


async def test_a_version_gap_resynchronises(redis_server: RedisServer) -> None:
    """An announcement missing from the sequence makes the subscription take a
    new snapshot: the view is the hash's, nothing duplicated."""
    redis_discovery = discovery(redis_server.url)
    namespace = redis_discovery.namespace
    keys = f"wool:{{{namespace}}}"
    first, hidden = fake_worker(1), fake_worker(2)
    view = View()
    server = admin(redis_server.url)
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", first)
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await view.has(first.uid)
        # Behind the subscription's back: a record and a version bump, never
        # announced; the next announcement then skips a version.
        server.hset(
            f"{keys}:workers", str(hidden.uid), hidden.to_protobuf().SerializeToString()
        )
        server.zadd(f"{keys}:leases", {str(hidden.uid): 1e15})
        server.incr(f"{keys}:version")
        late = fake_worker(3)
        await publisher.publish("worker-added", late)
        await view.has(first.uid, hidden.uid, late.uid)
        assert redis_discovery.statistics().reconnects == 1
        tg.cancel_scope.cancel()
    server.delete(f"{keys}:workers", f"{keys}:leases")
    server.close()


# -- connection loss --


async def test_client_kill_and_server_restart_converge_to_the_hash(
    redis_server: RedisServer,
) -> None:
    """``CLIENT KILL`` of the subscription mid-stream, then a server restart
    (its data lost): every consumer's view converges to the hash's content,
    with no duplicate ``worker-added`` and no missed drop (each view checks
    every event as it arrives), and no flapping of the workers that their
    publisher renews after the restart."""
    redis_discovery = discovery(redis_server.url)
    namespace = redis_discovery.namespace
    url = redis_server.url
    workers = [fake_worker(port) for port in range(1, 6)]

    async def converged() -> None:
        for view in views:
            await view.until(lambda seen: seen == hash_content(url, namespace))

    async with published(redis_discovery, *workers[:3], views=5) as (
        publisher,
        views,
    ):
        # Mid-stream: kill the subscription's connections, then change the
        # hash while it reconnects (a drop and an add it must not miss).
        server = admin(url)
        killed = sum(
            server.client_kill_filter(_id=entry["id"])
            for entry in server.client_list()
            if entry["name"].startswith(f"wool-pooling:subscriber:{namespace}:")
        )
        assert killed == 1
        await publisher.publish("worker-dropped", workers[0])
        await publisher.publish("worker-added", workers[3])
        await converged()
        await anyio.wait_all_tasks_blocked()
        assert views[0].workers.keys() == {w.uid for w in workers[1:4]}

        # The server restarts empty; the publisher's next renewal adds its
        # workers again; one is dropped meanwhile.
        server.close()
        reconnects = redis_discovery.statistics().reconnects
        redis_server.restart()
        await publisher.publish("worker-dropped", workers[1])
        await publisher.publish("worker-added", workers[4])
        for view in views:
            await view.has(workers[2].uid, workers[3].uid, workers[4].uid)
        await converged()
        assert redis_discovery.statistics().reconnects > reconnects
        assert all(view.workers.keys() == views[0].workers.keys() for view in views)
        # The server lost its data: the subscription waited for the publisher
        # to renew, so the workers it re-added were never dropped meanwhile.
        for view in views:
            assert view.added[workers[2].uid] == 1
            assert view.added[workers[3].uid] == 1


async def test_unreachable_during_reconnect_gives_up_after_the_attempts(
    own_redis_server: Callable[..., RedisServer],
) -> None:
    """With a bounded reconnect policy, a server that stays down ends every
    consumer with a ``RedisDiscoveryError`` after the last attempt."""
    own = own_redis_server()
    redis_discovery = RedisDiscovery(
        own.url,
        "gives-up",
        reconnect=RestartPolicy(attempts=2, backoff=0.01, jitter=0),
        connect_timeout=1.0,
    )
    worker = fake_worker(1)
    async with redis_discovery.publisher as publisher:
        await publisher.publish("worker-added", worker)
        stream = aiter(redis_discovery.subscribe())
        event = await anext(stream)
        assert event.metadata.uid == worker.uid
        own.stop()
        with pytest.raises(RedisDiscoveryError, match="reconnecting"):
            await anext(stream)


# -- late joiners --


async def test_late_joiner_receives_a_thousand_workers_then_live_changes(
    redis_server: RedisServer,
) -> None:
    """A proxy that starts after 1,000 workers are registered receives all
    1,000 (the snapshot) before any live change."""
    redis_discovery = discovery(redis_server.url, lease=60.0)
    workers = [fake_worker(port) for port in range(1, 1001)]
    async with redis_discovery.publisher as publisher:
        for worker in workers:
            await publisher.publish("worker-added", worker)
        stream = aiter(redis_discovery.subscribe())
        first = [await anext(stream) for _ in workers]
        assert {event.type for event in first} == {"worker-added"}
        assert {event.metadata.uid for event in first} == {w.uid for w in workers}
        # A second proxy joining now is replayed the 1,000 by the pool.
        second = aiter(redis_discovery.subscribe())
        replay = [await anext(second) for _ in workers]
        assert {event.metadata.uid for event in replay} == {w.uid for w in workers}
        live = fake_worker(2000)
        await publisher.publish("worker-added", live)
        await publisher.publish("worker-dropped", workers[0])
        for each in (stream, second):
            added, dropped = await anext(each), await anext(each)
            assert (added.type, added.metadata.uid) == ("worker-added", live.uid)
            assert (dropped.type, dropped.metadata.uid) == (
                "worker-dropped",
                workers[0].uid,
            )
        await stream.aclose()  # type: ignore[attr-defined]
        await second.aclose()  # type: ignore[attr-defined]


# -- leases --

PUBLISH_THEN_HANG = textwrap.dedent(
    """
    import asyncio, sys, uuid
    from wool import WorkerMetadata
    from wool_pooling.redis import RedisDiscovery

    async def main():
        discovery = RedisDiscovery(sys.argv[1], sys.argv[2], lease=float(sys.argv[3]))
        worker = WorkerMetadata(uid=uuid.UUID(sys.argv[4]), address="127.0.0.1:1",
                                pid=0, version="test")
        async with discovery.publisher as publisher:
            await publisher.publish("worker-added", worker)
            print("published", flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
    """
)


async def test_a_killed_publisher_s_worker_leaves_every_view_within_the_lease(
    redis_server: RedisServer,
) -> None:
    """SIGKILL the process that published a worker (no drop published): its
    lease is no longer renewed, and every consumer drops it once it expires."""
    redis_discovery = discovery(redis_server.url)
    uid = uuid.uuid4()
    process = subprocess.Popen(  # noqa: ASYNC220 - starts it, waits for nothing
        [
            sys.executable,
            "-c",
            PUBLISH_THEN_HANG,
            redis_server.url,
            redis_discovery.namespace,
            str(LEASE),
            str(uid),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await anyio.to_thread.run_sync(process.stdout.readline)
        assert line == b"published\n"
        views = [View() for _ in range(3)]
        async with anyio.create_task_group() as tg:
            for view in views:
                tg.start_soon(view.consume, redis_discovery.subscribe())
            for view in views:
                await view.has(uid)
            # Renewed while alive: the lease moves on past its first expiry.
            server = admin(redis_server.url)
            leases = f"wool:{{{redis_discovery.namespace}}}:leases"
            first = server.zscore(leases, str(uid))
            await eventually(lambda: server.zscore(leases, str(uid)) != first)
            process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            for view in views:
                await view.has()
            elapsed = time.monotonic() - killed
            tg.cancel_scope.cancel()
        assert (
            server.hget(f"wool:{{{redis_discovery.namespace}}}:workers", str(uid))
            is None
        )
        server.close()
        # Expired at most one lease after the kill, reaped within a reap
        # interval (lease / 4) of that; the rest is this shared machine.
        assert elapsed < LEASE + LEASE / 4 + 5
    finally:
        process.kill()
        process.wait()


async def test_a_dead_worker_process_is_no_longer_renewed(
    redis_server: RedisServer,
) -> None:
    """A worker whose process died (here: a zombie, killed and not yet
    reaped) while its publisher lives on is dropped once its lease expires."""
    redis_discovery = discovery(redis_server.url)
    sleeper = subprocess.Popen(  # noqa: ASYNC220 - starts it, waits for nothing
        [sys.executable, "-c", "import time; time.sleep(600)"]
    )
    try:
        dead, alive = fake_worker(1, pid=sleeper.pid), fake_worker(2, pid=os.getpid())
        async with published(redis_discovery, dead, alive) as (_, [view]):
            os.kill(sleeper.pid, signal.SIGKILL)  # a zombie until waited for
            await view.has(alive.uid)
    finally:
        sleeper.kill()
        sleeper.wait()


# -- bad input --


async def test_unreachable_url_fails_within_the_connect_timeout(
    redis_server: RedisServer,
) -> None:
    """A server that accepts the connection and never answers, and a port
    nobody listens on: a clear error within ``connect_timeout``, not a hang."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        url = f"redis://user:hunter2@127.0.0.1:{port}/0"
        started = time.monotonic()
        with pytest.raises(RedisDiscoveryError) as raised:
            async for _ in RedisDiscovery(url, "x", connect_timeout=0.5).subscribe():
                pass  # pragma: no cover - never reached
        assert time.monotonic() - started < 0.5 + 3
        assert f"redis://user@127.0.0.1:{port}/0" in str(raised.value)
        assert "hunter2" not in str(raised.value)
        with pytest.raises(RedisDiscoveryError, match="connecting the publisher"):
            async with RedisDiscovery(url, "x", connect_timeout=0.5).publisher:
                pass  # pragma: no cover - never reached
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
    with pytest.raises(RedisDiscoveryError, match="connecting"):
        async for _ in RedisDiscovery(refused, "x", connect_timeout=0.5).subscribe():
            pass  # pragma: no cover - never reached


async def test_invalid_records_are_skipped_with_a_warning_and_counted(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage in the hash and on the channel: each skipped with a warning and
    counted; the valid workers still arrive, the subscription goes on."""
    redis_discovery = discovery(redis_server.url)
    keys = f"wool:{{{redis_discovery.namespace}}}"
    server = admin(redis_server.url)
    server.hset(f"{keys}:workers", "not-a-uid", b"\xff\xff not protobuf")
    good, later = fake_worker(1), fake_worker(2)
    caplog.set_level(logging.WARNING, logger="wool_pooling.redis")
    async with published(redis_discovery, good) as (publisher, [view]):
        assert redis_discovery.statistics().invalid_records == 1
        # An announcement that is not worker metadata, with the next version,
        # then one that is not an announcement at all: each is counted (and
        # makes the subscription take a new snapshot).
        version = int(server.get(f"{keys}:version"))
        epoch = server.get(f"{keys}:epoch").decode()
        server.publish(
            f"{keys}:events:0", f"{version + 1} {epoch} worker-added abc junk"
        )
        await eventually(lambda: redis_discovery.statistics().invalid_records == 2)
        await eventually(lambda: redis_discovery.statistics().reconnects == 1)
        server.publish(f"{keys}:events:0", b"garbage")
        await publisher.publish("worker-added", later)
        await view.has(good.uid, later.uid)
    server.close()
    assert redis_discovery.statistics().invalid_records == 3
    skipped = [r for r in caplog.records if "not valid worker metadata" in r.message]
    assert len(skipped) == 3


async def test_a_refusing_server_names_the_url_without_the_password(
    redis_server: RedisServer,
) -> None:
    """A wrong password, and a user the ACL forbids to subscribe: an error
    naming the URL, without the password, at once (no reconnect loop)."""
    add_user(redis_server.url, "alice", "right")
    add_user(redis_server.url, "bob", "secret", CONNECT_ONLY, channels=())
    base = f"127.0.0.1:{redis_server.port}/0"
    wrong = f"redis://alice:wrong-password@{base}"
    with pytest.raises(RedisDiscoveryError) as raised:
        async for _ in RedisDiscovery(wrong, "acl").subscribe():
            pass  # pragma: no cover - never reached
    assert f"redis://alice@{base}" in str(raised.value)
    assert "wrong-password" not in str(raised.value)
    with pytest.raises(RedisDiscoveryError) as raised:
        async with RedisDiscovery(wrong, "acl").publisher:
            pass  # pragma: no cover - never reached
    assert "wrong-password" not in str(raised.value)
    forbidden = f"redis://bob:secret@{base}"
    with pytest.raises(RedisDiscoveryError, match="subscribing") as raised:
        async for _ in RedisDiscovery(forbidden, "acl").subscribe():
            pass  # pragma: no cover - never reached
    assert f"redis://bob@{base}" in str(raised.value)
    assert "secret" not in str(raised.value)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="lease"):
        RedisDiscovery("redis://localhost", "ns", lease=0)
    with pytest.raises(ValueError, match="connect_timeout"):
        RedisDiscovery("redis://localhost", "ns", connect_timeout=float("inf"))
    with pytest.raises(ValueError, match="reap_interval"):
        RedisDiscovery("redis://localhost", "ns", reap_interval=-1)
    with pytest.raises(ValueError, match="namespace"):
        RedisDiscovery("redis://localhost", "")
    with pytest.raises(TypeError, match="RestartPolicy"):
        RedisDiscovery("redis://localhost", "ns", reconnect=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wildcard"):
        RedisDiscovery("redis://localhost", "ns", advertise_host="0.0.0.0").publisher  # noqa: B018


async def test_publisher_misuse_is_refused(redis_server: RedisServer) -> None:
    redis_discovery = discovery(redis_server.url)
    publisher = redis_discovery.publisher
    with pytest.raises(RuntimeError, match="before publishing"):
        await publisher.publish("worker-added", fake_worker())
    async with publisher:
        with pytest.raises(ValueError, match="unknown discovery event type"):
            await publisher.publish("worker-moved", fake_worker())  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="already entered"):
            await publisher.__aenter__()


async def test_wildcard_bind_is_announced_at_a_reachable_address(
    redis_server: RedisServer,
) -> None:
    """``bind_host="0.0.0.0"``: wool binds workers there; the announced
    address is ``advertise_host`` (or the default-route address)."""
    advertised = discovery(
        redis_server.url, bind_host="0.0.0.0", advertise_host="10.1.2.3"
    )
    assert advertised.publisher.bind_host == "0.0.0.0"
    worker = fake_worker(4242)
    wildcard = type(worker)(uid=worker.uid, address="0.0.0.0:4242", pid=0, version="t")
    async with advertised.publisher as publisher:
        await publisher.publish("worker-added", wildcard)
        stream = aiter(advertised.subscribe())
        event = await anext(stream)
        assert event.metadata.address == "10.1.2.3:4242"
        await stream.aclose()  # type: ignore[attr-defined]
    assert discovery(redis_server.url).publisher.bind_host == "127.0.0.1"


def test_subscriptions_pickle_and_share_by_url_and_namespace() -> None:
    """wool ships subscribers to workers: they pickle, and equal (connection,
    namespace) means one shared entry whatever the other options (with a
    warning that the first one's apply)."""
    one = RedisDiscovery("redis://h:1/0", "ns").subscribe()
    with pytest.warns(RuntimeWarning, match="the earlier subscriber's apply"):
        other = RedisDiscovery("redis://h:1/0", "ns", lease=3.0).subscribe()
    assert isinstance(one, SharedSubscription)
    assert one == other == pickle.loads(pickle.dumps(one))
    assert one != RedisDiscovery("redis://h:1/0", "other").subscribe()
    assert not isinstance(
        RedisDiscovery("redis://h:1/0", "ns", shared=False).subscribe(),
        SharedSubscription,
    )
    assert RedisDiscovery("redis://h:1/0", "ns") == RedisDiscovery(
        "redis://h:1/0", "ns"
    )
    assert "secret" not in repr(RedisDiscovery("redis://u:secret@h:1/0", "ns"))


def test_redact_removes_only_the_password() -> None:
    assert redact("redis://u:pw@host:6379/0") == "redis://u@host:6379/0"
    assert redact("rediss://:pw@[::1]:6380") == "rediss://[::1]:6380"
    assert redact("redis://host:6379/0") == "redis://host:6379/0"


def test_import_without_redis_says_how_to_install_it() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['redis'] = None; import wool_pooling.redis",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 1
    assert "ImportError" in completed.stderr
    assert 'pip install "wool-pooling[redis]"' in completed.stderr


@pytest.mark.parametrize("swallowed_as", [None, TimeoutError], ids=["result", "error"])
def test_a_cancellation_that_redis_py_swallows_is_raised_again(
    swallowed_as: type[Exception] | None,
) -> None:
    """redis-py can turn a cancellation into its read timeout's outcome;
    ``watched`` notices the pending cancellation and raises it again."""
    import asyncio

    from wool_pooling.redis._errors import watched

    async def swallow() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            if swallowed_as is not None:
                raise swallowed_as from None

    async def main() -> None:
        task = asyncio.ensure_future(watched(swallow()))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
