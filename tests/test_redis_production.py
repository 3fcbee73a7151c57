"""``RedisDiscovery`` as a production deployment meets it, against a real server.

Databases on one server, flushes, junk on the channel and in the keys, a
drop published during an outage, unicode namespaces, unix sockets, error
messages, passwords in query strings, bad arguments, one server spelled
several ways, client options, key prefixes and a least-privilege ACL user.
Each test starts from the ``redis_server`` fixture (a real ``redis-server``,
persistence off) or a server of its own.
"""

from __future__ import annotations

import logging
import re
import ssl
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from _redis import RedisServer
from _redis import free_port
from redis.credentials import UsernamePasswordCredentialProvider
from redis_views import View
from redis_views import admin
from redis_views import eventually
from redis_views import fake_worker
from redis_views import hash_content
from redis_views import refused_on_trio

from wool_pooling import RestartPolicy
from wool_pooling import current_pool
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisDiscoveryError
from wool_pooling.redis import RedisPublisher
from wool_pooling.redis import redact

pytestmark = pytest.mark.anyio

LEASE = 1.0
FAST = RestartPolicy(attempts=None, backoff=0.02, max_backoff=0.2, jitter=0.2)
ROOT = Path(__file__).resolve().parent.parent


def namespace() -> str:
    return f"prod-{uuid.uuid4().hex[:12]}"


def discovery(url: str, name: str | None = None, **options: Any) -> RedisDiscovery:
    options.setdefault("lease", LEASE)
    options.setdefault("reconnect", FAST)
    return RedisDiscovery(url, name or namespace(), **options)


def on_db(server: RedisServer, db: int) -> str:
    return f"redis://127.0.0.1:{server.port}/{db}"


# -- 1. databases --


async def test_two_databases_of_one_server_do_not_see_each_other(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """Same namespace in ``/1`` and ``/2`` of one server: each consumer sees
    only its own database's workers (pub/sub ignores databases)."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
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
    redis_server: RedisServer, anyio_backend_name: str, command: str
) -> None:
    """After ``FLUSHDB``/``FLUSHALL`` the version counter starts again at 1:
    consumers notice the new epoch, resynchronise, and see every later add
    and drop (the renewed workers are never dropped meanwhile)."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
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
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """A flush, then a record written behind the subscription's back: the
    periodic reap sees the new epoch and the view converges to the hash."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    redis_discovery = discovery(redis_server.url, lease=60.0, reap_interval=0.1)
    name = redis_discovery.namespace
    view = View()
    worker, hidden = fake_worker(1), fake_worker(2)
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await view.has(worker.uid)
        server = admin(redis_server.url)
        server.flushdb()
        server.hset(
            f"wool:{{{name}}}:workers",
            str(hidden.uid),
            hidden.to_protobuf().SerializeToString(),
        )
        await view.until(lambda seen: hidden.uid in seen)
        server.close()
        tg.cancel_scope.cancel()


# -- 3. junk on the channel --


async def test_a_junk_announcement_with_the_next_version_hides_no_event(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """Another client publishes junk carrying the next version: it is counted,
    the subscription takes a snapshot, and the real add that follows reaches
    the connected consumers."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    redis_discovery = discovery(redis_server.url)
    keys = f"wool:{{{redis_discovery.namespace}}}"
    first, real = fake_worker(1), fake_worker(2)
    views = [View() for _ in range(3)]
    server = admin(redis_server.url)
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", first)
        for view in views:
            tg.start_soon(view.consume, redis_discovery.subscribe())
        for view in views:
            await view.has(first.uid)
        version = int(server.get(f"{keys}:version"))
        for channel in (f"{keys}:events", f"{keys}:events:0"):
            server.publish(channel, f"{version + 1} worker-added junk".encode())
        await publisher.publish("worker-added", real)
        for view in views:
            await view.has(first.uid, real.uid)
        assert redis_discovery.statistics().invalid_records >= 1
        tg.cancel_scope.cancel()
    server.close()


# -- 4. a drop during an outage --


@pytest.mark.parametrize("persistent", [False, True], ids=["empty", "persistent"])
async def test_a_drop_that_failed_during_an_outage_is_not_undone(
    redis_server: RedisServer, anyio_backend_name: str, persistent: bool
) -> None:
    """``publish("worker-dropped")`` raising while the server is down: the
    worker is forgotten at once (a restart without data does not see it
    re-added) and its drop is retried once the server is back (a restart
    with its data loses the record too)."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    extra = ("--appendonly", "yes", "--appendfsync", "always") if persistent else ()
    own = RedisServer(redis_server.executable)
    own.extra = extra
    own.start()
    try:
        redis_discovery = RedisDiscovery(
            own.url, namespace(), lease=LEASE, reconnect=FAST, connect_timeout=0.5
        )
        name = redis_discovery.namespace
        dropped, keeper = fake_worker(1), fake_worker(2)
        view = View()
        async with (
            redis_discovery.publisher as publisher,
            anyio.create_task_group() as tg,
        ):
            await publisher.publish("worker-added", dropped)
            await publisher.publish("worker-added", keeper)
            tg.start_soon(view.consume, redis_discovery.subscribe())
            await view.has(dropped.uid, keeper.uid)
            own.stop()
            with pytest.raises(RedisDiscoveryError, match="publishing worker-dropped"):
                await publisher.publish("worker-dropped", dropped)
            own.start()
            # The keeper is renewed (and, without the data, added again); the
            # dropped worker is not, and its record is deleted.
            await eventually(lambda: set(hash_content(own.url, name)) == {keeper.uid})
            await view.has(keeper.uid)
            tg.cancel_scope.cancel()
    finally:
        own.cleanup()


# -- 5. unicode namespaces --


async def test_a_non_ascii_namespace_connects_and_keeps_its_keys(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """``"ünïcødé"``: connections name themselves with the namespace escaped
    (``CLIENT SETNAME`` takes only ``!``..``~``); the keys hold it as is."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    name = f"ünïcødé {uuid.uuid4().hex[:6]}"
    redis_discovery = discovery(redis_server.url, name)
    worker = fake_worker(1)
    view = View()
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await view.has(worker.uid)
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
        tg.cancel_scope.cancel()


# -- 6. and 8. unix sockets, passwords in the query string --


async def test_unix_socket_urls_work_for_subscribers_and_publishers(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """``unix:///path/redis.sock`` (with ``?db=3``): publish and subscribe
    through the socket; the database is honoured."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    url = f"unix://{redis_server.socket_path}?db=3"
    redis_discovery = discovery(url)
    worker = fake_worker(1)
    view = View()
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await view.has(worker.uid)
        tg.cancel_scope.cancel()
    assert worker.uid in hash_content(on_db(redis_server, 3), redis_discovery.namespace)


async def test_a_password_in_the_query_string_is_redacted_everywhere(
    redis_server: RedisServer,
    anyio_backend_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``?password=...`` (redis-py's form for unix sockets) works, and never
    appears in ``redact()``, ``repr``, errors or log lines."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    server = admin(redis_server.url)
    server.acl_setuser(
        "carol",
        enabled=True,
        passwords=["+s3cr3t-pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    server.close()
    url = f"unix://{redis_server.socket_path}?db=0&username=carol&password=s3cr3t-pw"
    assert "s3cr3t-pw" not in redact(url)
    assert "db=0" in redact(url)
    assert "s3cr3t-pw" not in redact("redis://h:1/0?password=s3cr3t-pw&db=2")
    redis_discovery = discovery(url)
    assert "s3cr3t-pw" not in repr(redis_discovery)
    assert "s3cr3t-pw" not in repr(redis_discovery.subscribe())
    caplog.set_level(logging.INFO, logger="wool_pooling.redis")
    worker = fake_worker(1)
    view = View()
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await view.has(worker.uid)
        admin(redis_server.url).client_kill_filter(_type="pubsub")
        await eventually(lambda: redis_discovery.statistics().reconnects >= 1)
        tg.cancel_scope.cancel()
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
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """Connection refused, a wrong password, a forbidden command: each
    ``RedisDiscoveryError`` names what was being done, the redacted url and
    what the server (or the OS) said."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    server = admin(redis_server.url)
    server.acl_setuser(
        "dave",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        commands=["-@all", "+ping", "+client", "+hello", "+evalsha", "+eval"],
    )
    server.close()
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
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """A version key holding ``"junk"``: a ``RedisDiscoveryError`` naming the
    key and what it holds, for a new subscriber and for a publisher."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
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
    redis_server: RedisServer, anyio_backend_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease key replaced by a string under running consumers: they stay
    alive, the subscription retries under its reconnect policy (logging the
    key and what it holds), and resumes once the key is repaired."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    redis_discovery = discovery(redis_server.url, reap_interval=0.05)
    leases = f"wool:{{{redis_discovery.namespace}}}:leases"
    caplog.set_level(logging.WARNING, logger="wool_pooling.redis")
    worker, later = fake_worker(1), fake_worker(2)
    views = [View() for _ in range(3)]
    server = admin(redis_server.url)
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        for view in views:
            tg.start_soon(view.consume, redis_discovery.subscribe())
        for view in views:
            await view.has(worker.uid)
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
        tg.cancel_scope.cancel()
    server.close()


# -- 10. bad arguments --


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("redis://[::1", ValueError),
        ("http://127.0.0.1:6379/0", ValueError),
        ("redis://", ValueError),
        ("redis://:6379/0", ValueError),
        ("redis://127.0.0.1:notaport/0", ValueError),
        ("redis://127.0.0.1:6379/zero", ValueError),
        ("unix://relative.sock", ValueError),
        ("redis+sentinel://127.0.0.1:26379", ValueError),
        (6379, TypeError),
        (b"redis://127.0.0.1", TypeError),
    ],
)
def test_a_malformed_url_is_refused_at_construction(url: object, error: type) -> None:
    """The url's scheme, host (or socket path, or Sentinel service), port and
    database are checked by the constructors, never first by ``repr``."""
    with pytest.raises(error, match="url"):
        RedisDiscovery(url, "ns")  # type: ignore[arg-type]
    with pytest.raises(error, match="url"):
        RedisPublisher(url, "ns")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "error"), [(b"ns", TypeError), (3, TypeError), ("", ValueError)]
)
def test_a_namespace_that_is_not_a_non_empty_str_is_refused(
    name: object, error: type
) -> None:
    """``b"ns"`` never silently becomes ``"b'ns'"``."""
    with pytest.raises(error, match="namespace"):
        RedisDiscovery("redis://127.0.0.1", name)  # type: ignore[arg-type]
    with pytest.raises(error, match="namespace"):
        RedisPublisher("redis://127.0.0.1", name)  # type: ignore[arg-type]


def test_valid_urls_of_every_scheme_are_accepted_and_logged_safely() -> None:
    """Every documented form constructs, and its ``repr`` has no password."""
    for url in (
        "redis://127.0.0.1",
        "redis://u:pw@[::1]:6380/2",
        "rediss://u:pw@cache.example:6380/0",
        "unix:///run/redis/redis.sock?db=1&password=pw",
        "redis+sentinel://u:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/1",
        "rediss+sentinel://10.0.0.1/mymaster",
    ):
        assert "pw" not in repr(RedisDiscovery(url, "ns"))


# -- 11. one server, one subscription --


async def test_one_server_spelled_three_ways_is_one_subscription(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """``redis://127.0.0.1:p/0``, ``redis://127.0.0.1:p`` and
    ``redis://localhost:p/0``: one pool entry, one pub/sub connection."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    name = namespace()
    port = redis_server.port
    urls = [
        f"redis://127.0.0.1:{port}/0",
        f"redis://127.0.0.1:{port}",
        f"redis://localhost:{port}/0",
    ]
    discoveries = [discovery(url, name) for url in urls]
    assert discoveries[0] == discoveries[1] == discoveries[2]
    assert discovery(f"redis://127.0.0.1:{port}/1", name) != discoveries[0]
    worker = fake_worker(1)
    views = [View() for _ in urls]
    async with discoveries[0].publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        for view, each in zip(views, discoveries, strict=True):
            tg.start_soon(view.consume, each.subscribe())
        for view in views:
            await view.has(worker.uid)
        assert current_pool().statistics().entries == 1
        server = admin(redis_server.url)
        pubsub = [
            e
            for e in server.client_list()
            if e["name"].startswith(f"wool-pooling:subscriber:{name}:")
        ]
        assert len(pubsub) == 1
        server.close()
        tg.cancel_scope.cancel()


def test_a_subscriber_with_other_options_than_the_live_one_is_warned() -> None:
    """Same connection and namespace, another lease: a ``RuntimeWarning``
    says the first subscriber's options apply; equal options, no warning."""
    import warnings

    first = RedisDiscovery("redis://127.0.0.1:1/0", "warned").subscribe()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = RedisDiscovery("redis://localhost:1", "warned").subscribe()
    with pytest.warns(RuntimeWarning, match="other options"):
        other = RedisDiscovery("redis://127.0.0.1:1/0", "warned", lease=2).subscribe()
    assert first == same == other


# -- client options, key prefix --


async def test_client_options_reach_redis_py_and_the_url_wins_over_them(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """A password and ``health_check_interval`` given as client options are
    used, and so is a ``credential_provider``; a password in the url wins
    over the one in the options; a reserved option is refused."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    server = admin(redis_server.url)
    server.acl_setuser(
        "erin",
        enabled=True,
        passwords=["+opt-pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    server.close()
    url = f"redis://erin@127.0.0.1:{redis_server.port}/0"
    options = {"password": "opt-pw", "health_check_interval": 1}
    redis_discovery = discovery(url, client_options=options)
    worker = fake_worker(1)
    view = View()
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await view.has(worker.uid)
        tg.cancel_scope.cancel()
    # A credential provider (rotating tokens) in place of any password: the
    # wrong one is refused, so it is the one used.
    bare = f"redis://127.0.0.1:{redis_server.port}/0"
    for password, works in (("opt-pw", True), ("not-it", False)):
        provider = UsernamePasswordCredentialProvider("erin", password)
        with_provider = discovery(
            bare, client_options={"credential_provider": provider}
        )
        if works:
            async with with_provider.publisher as publisher:
                await publisher.publish("worker-added", fake_worker(2))
        else:
            with pytest.raises(RedisDiscoveryError, match="WRONGPASS"):
                async with with_provider.publisher:
                    pass  # pragma: no cover - never reached
    overridden = f"redis://erin:wrong@127.0.0.1:{redis_server.port}/0"
    with pytest.raises(RedisDiscoveryError, match="WRONGPASS"):
        async with discovery(overridden, client_options=options).publisher:
            pass  # pragma: no cover - never reached
    with pytest.raises(ValueError, match="decode_responses"):
        RedisDiscovery(url, "ns", client_options={"decode_responses": True})
    with pytest.raises(TypeError, match="client_options"):
        RedisDiscovery(url, "ns", client_options=[("password", "x")])  # type: ignore[arg-type]


async def test_a_key_prefix_moves_every_key_and_the_channel(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """``key_prefix="tenant-a:"``: the records live under it, nothing under
    ``wool:``; a discovery with another prefix does not see them."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    name = namespace()
    prefixed = discovery(redis_server.url, name, key_prefix="tenant-a:")
    plain = discovery(redis_server.url, name)
    worker, other = fake_worker(1), fake_worker(2)
    mine, theirs = View(), View()
    async with (
        prefixed.publisher as publisher,
        plain.publisher as plain_publisher,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(mine.consume, prefixed.subscribe())
        tg.start_soon(theirs.consume, plain.subscribe())
        await mine.has()
        await theirs.has()
        await publisher.publish("worker-added", worker)
        await plain_publisher.publish("worker-added", other)
        await mine.has(worker.uid)
        await theirs.has(other.uid)
        tg.cancel_scope.cancel()
    server = admin(redis_server.url)
    keys = {key.decode() for key in server.keys(f"*{{{name}}}*")}
    server.close()
    assert f"tenant-a:{{{name}}}:workers" in keys
    assert {key for key in keys if key.startswith("tenant-a:")} == {
        f"tenant-a:{{{name}}}:{part}"
        for part in ("workers", "leases", "version", "epoch")
    }
    with pytest.raises(ValueError, match="braces"):
        RedisDiscovery(redis_server.url, name, key_prefix="{x}")


# -- the documented ACL rule --


def documented_acl_rule() -> str:
    """The ``ACL SETUSER`` rule ``docs/redis.rst`` gives, for user ``wool``."""
    page = (ROOT / "docs" / "redis.rst").read_text()
    match = re.search(r"ACL SETUSER wool (.+)", page)
    assert match is not None, "docs/redis.rst documents no ACL SETUSER rule"
    return match.group(1).strip()


async def test_a_user_limited_to_the_documented_acl_rule_works(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """A user with exactly the rule of ``docs/redis.rst`` (password swapped
    in) publishes, subscribes on database 1, reaps, reconnects; a user with
    one command less cannot."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    rule = documented_acl_rule()
    assert ">PASSWORD" in rule
    server = admin(redis_server.url)
    server.execute_command(
        "ACL", "SETUSER", "wool", "reset", *rule.replace(">PASSWORD", ">acl-pw").split()
    )
    url = f"redis://wool:acl-pw@127.0.0.1:{redis_server.port}/1"
    redis_discovery = discovery(url, reap_interval=0.05)
    worker, later = fake_worker(1), fake_worker(2)
    view = View()
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await view.has(worker.uid)
        server.client_kill_filter(_type="pubsub")
        await eventually(lambda: redis_discovery.statistics().reconnects >= 1)
        await publisher.publish("worker-added", later)
        await publisher.publish("worker-dropped", worker)
        await view.has(later.uid)
        tg.cancel_scope.cancel()
    server.execute_command("ACL", "SETUSER", "wool", "-subscribe")
    with pytest.raises(RedisDiscoveryError, match="NOPERM"):
        async for _ in discovery(url).subscribe():
            pass  # pragma: no cover - never reached
    server.close()


async def test_an_option_redis_py_refuses_is_a_redis_discovery_error(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """A client option redis-py's connection does not take (here
    ``socket_keepalive`` on a unix socket): a ``RedisDiscoveryError`` from
    ``__aenter__`` and from the first subscription, never a raw ``TypeError``."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    url = f"unix://{redis_server.socket_path}"
    redis_discovery = discovery(url, client_options={"socket_keepalive": True})
    with pytest.raises(RedisDiscoveryError, match="socket_keepalive"):
        async with redis_discovery.publisher:
            pass  # pragma: no cover - never reached
    with pytest.raises(RedisDiscoveryError, match="socket_keepalive"):
        async for _ in redis_discovery.subscribe():
            pass  # pragma: no cover - never reached


TLS = ROOT / "tests" / "tls"


async def test_an_ssl_context_in_client_options_is_used_for_tls(
    redis_server: RedisServer, anyio_backend_name: str
) -> None:
    """``rediss://`` with ``client_options={"ssl_context": context}``: the
    given context (trusting the test server's self-signed certificate) is
    the one used; without it, the certificate is refused."""
    if await refused_on_trio(anyio_backend_name, redis_server.url):
        return
    tls_port = free_port()
    own = RedisServer(
        redis_server.executable,
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(TLS / "server.crt"),
        "--tls-key-file",
        str(TLS / "server.key"),
        "--tls-ca-cert-file",
        str(TLS / "server.crt"),
        "--tls-auth-clients",
        "no",
    )
    own.start()
    try:
        context = ssl.create_default_context(cafile=str(TLS / "server.crt"))
        url = f"rediss://127.0.0.1:{tls_port}/0"
        redis_discovery = discovery(url, client_options={"ssl_context": context})
        worker = fake_worker(1)
        view = View()
        async with (
            redis_discovery.publisher as publisher,
            anyio.create_task_group() as tg,
        ):
            await publisher.publish("worker-added", worker)
            tg.start_soon(view.consume, redis_discovery.subscribe())
            await view.has(worker.uid)
            tg.cancel_scope.cancel()
        assert worker.uid in hash_content(own.url, redis_discovery.namespace)
        with pytest.raises(RedisDiscoveryError, match="CERTIFICATE_VERIFY_FAILED"):
            async with discovery(url).publisher:
                pass  # pragma: no cover - never reached
    finally:
        own.cleanup()
    with pytest.raises(ValueError, match="TLS url"):
        RedisDiscovery(redis_server.url, "ns", client_options={"ssl_context": context})
    with pytest.raises(TypeError, match="SSLContext"):
        RedisDiscovery(url, "ns", client_options={"ssl_context": "yes"})
