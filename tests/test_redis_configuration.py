"""``RedisDiscovery``'s configuration, against a real server.

Bad arguments, one server spelled several ways, client options, key
prefixes, a least-privilege ACL user and TLS. Each test starts from the
``redis_server`` fixture (a real ``redis-server``, persistence off) or a
server of its own.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from _loops import asyncio_backend
from _redis import RedisServer
from _redis import free_port
from redis.asyncio.client import PubSub
from redis.credentials import UsernamePasswordCredentialProvider
from redis_views import View
from redis_views import add_user
from redis_views import admin
from redis_views import discovery
from redis_views import eventually
from redis_views import fake_worker
from redis_views import hash_content
from redis_views import namespace
from redis_views import published

from wool_pooling import current_pool
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisDiscoveryError
from wool_pooling.redis import RedisPublisher

pytestmark = pytest.mark.anyio
anyio_backend = asyncio_backend

ROOT = Path(__file__).resolve().parent.parent


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
        ("redis://127.0.0.1:6379/0?socket_timeout=soon", ValueError),
        ("unix:///tmp/redis.sock?db=first", ValueError),
        ("unix://relative.sock", ValueError),
        ("redis+sentinel://127.0.0.1:26379", ValueError),
        (6379, TypeError),
        (b"redis://127.0.0.1", TypeError),
    ],
)
def test_a_malformed_url_is_refused_at_construction(url: object, error: type) -> None:
    """The url's scheme, host (or socket path, or Sentinel service), port,
    database and query options are checked by the constructors, never first
    by ``repr`` or at the first connection."""
    with pytest.raises(error, match="url"):
        RedisDiscovery(url, "ns")  # type: ignore[arg-type]
    with pytest.raises(error, match="url"):
        RedisPublisher(url, "ns")  # type: ignore[arg-type]


def test_a_cluster_url_without_asyncio_sharded_pub_sub_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A redis-py before 8.0 has no asyncio ``ssubscribe``, which a Cluster's
    announcements need: its url is refused at construction, saying so."""
    RedisDiscovery("redis+cluster://127.0.0.1:7000", "ns")
    monkeypatch.delattr(PubSub, "ssubscribe")
    for url in ("redis+cluster://127.0.0.1:7000", "rediss+cluster://h:7000"):
        with pytest.raises(ValueError, match=r"Cluster url needs redis-py 8\.0"):
            RedisDiscovery(url, "ns")
        with pytest.raises(ValueError, match=r"Cluster url needs redis-py 8\.0"):
            RedisPublisher(url, "ns")
    RedisDiscovery("redis://127.0.0.1", "ns")  # other urls need none


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


def test_a_publisher_shows_its_url_without_the_password() -> None:
    """A publisher's ``repr``, like its discovery's, names its class, url
    (without the password) and namespace."""
    publisher = RedisDiscovery("redis://u:pw@10.0.0.1:6380/2", "ns").publisher
    assert repr(publisher) == "RedisPublisher('redis://u@10.0.0.1:6380/2', 'ns')"


# -- 11. one server, one subscription --


async def test_one_server_spelled_three_ways_is_one_subscription(
    redis_server: RedisServer,
) -> None:
    """``redis://127.0.0.1:p/0``, ``redis://127.0.0.1:p`` and
    ``redis://localhost:p/0``: one pool entry, one pub/sub connection."""
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
    redis_server: RedisServer,
) -> None:
    """A password and ``health_check_interval`` given as client options are
    used, and so is a ``credential_provider``; a password in the url wins
    over the one in the options; a reserved option is refused."""
    add_user(redis_server.url, "erin", "opt-pw")
    url = f"redis://erin@127.0.0.1:{redis_server.port}/0"
    options = {"password": "opt-pw", "health_check_interval": 1}
    redis_discovery = discovery(url, client_options=options)
    async with published(redis_discovery, fake_worker(1)):
        pass  # published, and seen by a subscriber
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
    redis_server: RedisServer,
) -> None:
    """``key_prefix="tenant-a:"``: the records live under it, nothing under
    ``wool:``; a discovery with another prefix does not see them."""
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
        for part in ("workers", "leases", "version", "epoch", "changes")
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
    redis_server: RedisServer,
) -> None:
    """A user with exactly the rule of ``docs/redis.rst`` (password swapped
    in) publishes, subscribes on database 1, reaps, reconnects; a user with
    one command less cannot."""
    rule = documented_acl_rule()
    assert ">PASSWORD" in rule
    server = admin(redis_server.url)
    server.execute_command(
        "ACL", "SETUSER", "wool", "reset", *rule.replace(">PASSWORD", ">acl-pw").split()
    )
    url = f"redis://wool:acl-pw@127.0.0.1:{redis_server.port}/1"
    redis_discovery = discovery(url, reap_interval=0.05)
    worker, later = fake_worker(1), fake_worker(2)
    async with published(redis_discovery, worker) as (publisher, [view]):
        server.client_kill_filter(_type="pubsub")
        await eventually(lambda: redis_discovery.statistics().reconnects >= 1)
        await publisher.publish("worker-added", later)
        await publisher.publish("worker-dropped", worker)
        await view.has(later.uid)
    server.execute_command("ACL", "SETUSER", "wool", "-subscribe")
    with pytest.raises(RedisDiscoveryError, match="NOPERM"):
        async for _ in discovery(url).subscribe():
            pass  # pragma: no cover - never reached
    server.close()


async def test_an_option_redis_py_refuses_is_a_redis_discovery_error(
    redis_server: RedisServer,
) -> None:
    """A client option redis-py's connection refuses only as it connects
    (here an ``encoder_class`` that is not a class; a name it does not take
    fails at construction): a ``RedisDiscoveryError`` from ``__aenter__`` and
    from the first subscription, never a raw ``TypeError``."""
    url = f"unix://{redis_server.socket_path}"
    redis_discovery = discovery(url, client_options={"encoder_class": 5})
    with pytest.raises(RedisDiscoveryError, match="not callable"):
        async with redis_discovery.publisher:
            pass  # pragma: no cover - never reached
    with pytest.raises(RedisDiscoveryError, match="not callable"):
        async for _ in redis_discovery.subscribe():
            pass  # pragma: no cover - never reached


TLS = ROOT / "tests" / "tls"


async def test_an_ssl_context_in_client_options_is_used_for_tls(
    redis_server: RedisServer, own_redis_server: Callable[..., RedisServer]
) -> None:
    """``rediss://`` with ``client_options={"ssl_context": context}``: the
    given context (trusting the test server's self-signed certificate) is
    the one used; without it, the certificate is refused."""
    tls_port = free_port()
    own = own_redis_server(
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
    context = ssl.create_default_context(cafile=str(TLS / "server.crt"))
    url = f"rediss://127.0.0.1:{tls_port}/0"
    redis_discovery = discovery(url, client_options={"ssl_context": context})
    worker = fake_worker(1)
    async with published(redis_discovery, worker):
        pass  # published, and seen by a subscriber
    assert worker.uid in hash_content(own.url, redis_discovery.namespace)
    with pytest.raises(RedisDiscoveryError, match="CERTIFICATE_VERIFY_FAILED"):
        async with discovery(url).publisher:
            pass  # pragma: no cover - never reached
    with pytest.raises(ValueError, match="TLS url"):
        RedisDiscovery(redis_server.url, "ns", client_options={"ssl_context": context})
    with pytest.raises(TypeError, match="SSLContext"):
        RedisDiscovery(url, "ns", client_options={"ssl_context": "yes"})
