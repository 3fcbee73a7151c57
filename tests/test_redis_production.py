"""``RedisDiscovery`` as a production deployment meets it, against a real server.

Databases on one server, flushes, junk on the channel and in the keys, a
drop published during an outage, unicode namespaces, unix sockets, error
messages and passwords in query strings. Each test starts from the
``redis_server`` fixture (a real ``redis-server``, persistence off) or a
server of its own; the configuration a deployment passes (urls, options,
prefixes, ACL users, TLS) is in ``test_redis_configuration.py``.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable

import anyio
import pytest
from _loops import asyncio_backend
from _redis import RedisServer
from redis_views import CONNECT_ONLY
from redis_views import View
from redis_views import add_user
from redis_views import admin
from redis_views import discovery
from redis_views import eventually
from redis_views import fake_worker
from redis_views import hash_content
from redis_views import namespace
from redis_views import published

from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisDiscoveryError
from wool_pooling.redis import redact

pytestmark = pytest.mark.anyio
anyio_backend = asyncio_backend


def on_db(server: RedisServer, db: int) -> str:
    return f"redis://127.0.0.1:{server.port}/{db}"


# -- 1. databases --


async def test_two_databases_of_one_server_do_not_see_each_other(
    redis_server: RedisServer,
) -> None:
    """Same namespace in ``/1`` and ``/2`` of one server: each consumer sees
    only its own database's workers (pub/sub ignores databases)."""
    name = namespace()
    one, two = (
        discovery(on_db(redis_server, 1), name),
        discovery(on_db(redis_server, 2), name),
    )
    warm_one, warm_two = fake_worker(10), fake_worker(20)
    first, second = fake_worker(1), fake_worker(2)
    view_one, view_two = View(), View()
    async with (
        one.publisher as publisher_one,
        two.publisher as publisher_two,
        anyio.create_task_group() as tg,
    ):
        await publisher_one.publish("worker-added", warm_one)
        await publisher_two.publish("worker-added", warm_two)
        tg.start_soon(view_one.consume, one.subscribe())
        tg.start_soon(view_two.consume, two.subscribe())
        # Each has its snapshot: both are subscribed.
        await view_one.has(warm_one.uid)
        await view_two.has(warm_two.uid)
        await publisher_one.publish("worker-added", first)
        await publisher_two.publish("worker-added", second)
        await view_one.has(warm_one.uid, first.uid)
        await view_two.has(warm_two.uid, second.uid)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert [event.metadata.uid for event in view_two.events] == [
        warm_two.uid,
        second.uid,
    ]
    assert [event.metadata.uid for event in view_one.events] == [
        warm_one.uid,
        first.uid,
    ]


# -- 2. flushes --


@pytest.mark.parametrize("command", ["flushdb", "flushall"])
async def test_a_flush_while_consumers_stay_connected_resynchronises_them(
    redis_server: RedisServer, command: str
) -> None:
    """After ``FLUSHDB``/``FLUSHALL`` the version counter starts again at 1:
    consumers notice the new epoch, resynchronise, and see every later add
    and drop (the renewed workers are never dropped meanwhile)."""
    redis_discovery = discovery(redis_server.url)
    name = redis_discovery.namespace
    kept = [fake_worker(port) for port in range(1, 4)]
    views = [View() for _ in range(3)]
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        for view in views:
            tg.start_soon(view.consume, redis_discovery.subscribe())
        for worker in kept:
            await publisher.publish("worker-added", worker)
        for round_ in range(4):  # move the version well past what follows
            for worker in kept:
                moved = type(worker)(
                    uid=worker.uid,
                    address=f"127.0.0.1:{100 + round_}",
                    pid=0,
                    version="test",
                )
                await publisher.publish("worker-updated", moved)
        for view in views:
            await view.until(lambda seen: len(seen) == 3)
        getattr(admin(redis_server.url), command)()
        new = fake_worker(50)
        await publisher.publish("worker-added", new)
        await publisher.publish("worker-dropped", kept[0])
        for view in views:
            await view.has(kept[1].uid, kept[2].uid, new.uid)
            await view.until(lambda seen: seen == hash_content(redis_server.url, name))
            assert view.added[kept[1].uid] == 1
        tg.cancel_scope.cancel()


async def test_a_flush_with_nothing_announced_is_noticed_by_the_reaper(
    redis_server: RedisServer,
) -> None:
    """A flush, then a record written behind the subscription's back: the
    periodic reap sees the new epoch and the view converges to the hash."""
    redis_discovery = discovery(redis_server.url, lease=60.0, reap_interval=0.1)
    name = redis_discovery.namespace
    worker, hidden = fake_worker(1), fake_worker(2)
    async with published(redis_discovery, worker) as (_, [view]):
        server = admin(redis_server.url)
        server.flushdb()
        server.hset(
            f"wool:{{{name}}}:workers",
            str(hidden.uid),
            hidden.to_protobuf().SerializeToString(),
        )
        await view.until(lambda seen: hidden.uid in seen)
        server.close()


# -- 3. junk on the channel --


async def test_a_junk_announcement_with_the_next_version_hides_no_event(
    redis_server: RedisServer,
) -> None:
    """Another client publishes junk carrying the next version: it is counted,
    the subscription takes a snapshot, and the real add that follows reaches
    the connected consumers."""
    redis_discovery = discovery(redis_server.url)
    keys = f"wool:{{{redis_discovery.namespace}}}"
    first, real = fake_worker(1), fake_worker(2)
    server = admin(redis_server.url)
    async with published(redis_discovery, first, views=3) as (publisher, views):
        version = int(server.get(f"{keys}:version"))
        for channel in (f"{keys}:events", f"{keys}:events:0"):
            server.publish(channel, f"{version + 1} worker-added junk".encode())
        await publisher.publish("worker-added", real)
        for view in views:
            await view.has(first.uid, real.uid)
        assert redis_discovery.statistics().invalid_records >= 1
    server.close()


# -- 4. a drop during an outage --


@pytest.mark.parametrize("persistent", [False, True], ids=["empty", "persistent"])
async def test_a_drop_that_failed_during_an_outage_is_not_undone(
    own_redis_server: Callable[..., RedisServer], persistent: bool
) -> None:
    """``publish("worker-dropped")`` raising while the server is down: the
    worker is forgotten at once (a restart without data does not see it
    re-added) and its drop is retried once the server is back (a restart
    with its data loses the record too)."""
    extra = ("--appendonly", "yes", "--appendfsync", "always") if persistent else ()
    own = own_redis_server(*extra)
    redis_discovery = discovery(own.url, connect_timeout=0.5)
    name = redis_discovery.namespace
    dropped, keeper = fake_worker(1), fake_worker(2)
    async with published(redis_discovery, dropped, keeper) as (publisher, [view]):
        own.stop()
        with pytest.raises(RedisDiscoveryError, match="publishing worker-dropped"):
            await publisher.publish("worker-dropped", dropped)
        own.start()
        # The keeper is renewed (and, without the data, added again); the
        # dropped worker is not, and its record is deleted.
        await eventually(lambda: set(hash_content(own.url, name)) == {keeper.uid})
        await view.has(keeper.uid)


# -- 5. unicode namespaces --


async def test_a_non_ascii_namespace_connects_and_keeps_its_keys(
    redis_server: RedisServer,
) -> None:
    """``"ünïcødé"``: connections name themselves with the namespace escaped
    (``CLIENT SETNAME`` takes only ``!``..``~``); the keys hold it as is."""
    name = f"ünïcødé {uuid.uuid4().hex[:6]}"
    redis_discovery = discovery(redis_server.url, name)
    worker = fake_worker(1)
    async with published(redis_discovery, worker):
        server = admin(redis_server.url)
        names = [entry["name"] for entry in server.client_list()]
        escaped = name.encode().decode("ascii", "ignore")  # the ASCII letters kept
        assert any(
            each.startswith("wool-pooling:subscriber:%C3%BCn%C3%AF") for each in names
        ), names
        assert all(re.fullmatch(r"[!-~]*", each) for each in names)
        assert escaped
        assert server.hexists(f"wool:{{{name}}}:workers", str(worker.uid))
        server.close()


# -- 6. and 8. unix sockets, passwords in the query string --


async def test_unix_socket_urls_work_for_subscribers_and_publishers(
    redis_server: RedisServer,
) -> None:
    """``unix:///path/redis.sock`` (with ``?db=3``): publish and subscribe
    through the socket; the database is honoured."""
    url = f"unix://{redis_server.socket_path}?db=3"
    redis_discovery = discovery(url)
    worker = fake_worker(1)
    async with published(redis_discovery, worker):
        pass  # published, and seen by a subscriber
    assert worker.uid in hash_content(on_db(redis_server, 3), redis_discovery.namespace)


async def test_a_password_in_the_query_string_is_redacted_everywhere(
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``?password=...`` (redis-py's form for unix sockets) works, and never
    appears in ``redact()``, ``repr``, errors or log lines."""
    add_user(redis_server.url, "carol", "s3cr3t-pw")
    url = f"unix://{redis_server.socket_path}?db=0&username=carol&password=s3cr3t-pw"
    assert "s3cr3t-pw" not in redact(url)
    assert "db=0" in redact(url)
    assert "s3cr3t-pw" not in redact("redis://h:1/0?password=s3cr3t-pw&db=2")
    redis_discovery = discovery(url)
    assert "s3cr3t-pw" not in repr(redis_discovery)
    assert "s3cr3t-pw" not in repr(redis_discovery.subscribe())
    caplog.set_level(logging.INFO, logger="wool_pooling.redis")
    async with published(redis_discovery, fake_worker(1)):
        admin(redis_server.url).client_kill_filter(_type="pubsub")
        await eventually(lambda: redis_discovery.statistics().reconnects >= 1)
    wrong = url.replace("s3cr3t-pw", "wr0ng-pw")
    with pytest.raises(RedisDiscoveryError) as raised:
        async for _ in RedisDiscovery(wrong, "x").subscribe():
            pass  # pragma: no cover - never reached
    assert "wr0ng-pw" not in str(raised.value)
    assert "WRONGPASS" in str(raised.value)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "lost unix://" in logged
    assert "s3cr3t-pw" not in logged


# -- 7. error messages --


async def test_errors_name_the_action_the_url_and_the_server_s_reason(
    redis_server: RedisServer,
) -> None:
    """Connection refused, a wrong password, a forbidden command: each
    ``RedisDiscoveryError`` names what was being done, the redacted url and
    what the server (or the OS) said."""
    add_user(redis_server.url, "dave", "pw", CONNECT_ONLY, channels=())
    closed = RedisServer(redis_server.executable)  # never started: refused
    refused = f"redis://127.0.0.1:{closed.port}/0"
    with pytest.raises(RedisDiscoveryError) as raised:
        async for _ in RedisDiscovery(refused, "x", connect_timeout=1).subscribe():
            pass  # pragma: no cover - never reached
    message = str(raised.value)
    assert message.startswith(f"connecting at {refused} failed: ConnectionError: ")
    assert re.search(r"refused|Connect call failed", message), message
    with pytest.raises(RedisDiscoveryError) as raised:
        async with RedisDiscovery(refused, "x", connect_timeout=1).publisher:
            pass  # pragma: no cover - never reached
    assert re.search(r"refused|Connect call failed", str(raised.value))
    base = f"127.0.0.1:{redis_server.port}/0"
    with pytest.raises(RedisDiscoveryError) as raised:
        async for _ in RedisDiscovery(f"redis://dave:nope@{base}", "x").subscribe():
            pass  # pragma: no cover - never reached
    assert str(raised.value).startswith(f"authenticating at redis://dave@{base} failed")
    assert "WRONGPASS" in str(raised.value)
    with pytest.raises(RedisDiscoveryError) as raised:
        async for _ in RedisDiscovery(f"redis://dave:pw@{base}", "x").subscribe():
            pass  # pragma: no cover - never reached
    assert str(raised.value).startswith(f"subscribing at redis://dave@{base} failed")
    assert "NOPERM" in str(raised.value)


# -- 9. wrong data in our keys --


async def test_a_junk_version_key_fails_a_new_subscriber_naming_the_key(
    redis_server: RedisServer,
) -> None:
    """A version key holding ``"junk"``: a ``RedisDiscoveryError`` naming the
    key and what it holds, for a new subscriber and for a publisher."""
    redis_discovery = discovery(redis_server.url)
    key = f"wool:{{{redis_discovery.namespace}}}:version"
    server = admin(redis_server.url)
    server.set(key, "junk")
    with pytest.raises(RedisDiscoveryError) as raised:
        async for _ in redis_discovery.subscribe():
            pass  # pragma: no cover - never reached
    assert key in str(raised.value)
    assert '"junk"' in str(raised.value)
    async with redis_discovery.publisher as publisher:
        with pytest.raises(RedisDiscoveryError, match=re.escape(key)):
            await publisher.publish("worker-added", fake_worker())
    server.delete(key)
    server.close()


async def test_a_lease_key_replaced_while_consumers_run_is_retried(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease key replaced by a string under running consumers: they stay
    alive, the subscription retries under its reconnect policy (logging the
    key and what it holds), and resumes once the key is repaired."""
    redis_discovery = discovery(redis_server.url, reap_interval=0.05)
    leases = f"wool:{{{redis_discovery.namespace}}}:leases"
    caplog.set_level(logging.WARNING, logger="wool_pooling.redis")
    worker, later = fake_worker(1), fake_worker(2)
    server = admin(redis_server.url)
    async with published(redis_discovery, worker, views=3) as (publisher, views):
        server.delete(leases)
        server.set(leases, "a string")
        await eventually(
            lambda: any(
                leases in record.getMessage() and "a string" in record.getMessage()
                for record in caplog.records
            )
        )
        server.delete(leases)
        await publisher.publish("worker-added", later)
        for view in views:
            await view.has(worker.uid, later.uid)
    server.close()
