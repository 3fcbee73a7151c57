"""``python -m wool_pooling.redis URL NAMESPACE``, run as a subprocess against
a real ``redis-server`` (the ``redis_server`` fixtures), on a TLS server, a
Sentinel-monitored master and a Cluster.

Each test publishes with :class:`RedisPublisher` (asyncio only, as redis-py's
client is) and reads what the command prints; ``--watch`` is read line by
line under a deadline.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from _loops import asyncio_backend
from _redis import RedisServer
from _redis import SentinelSet
from _redis import free_port
from _redis import require_redis_server
from _redis_cluster import CERTIFICATE
from _redis_cluster import KEY
from _redis_cluster import RedisCluster
from anyio.streams.buffered import BufferedByteReceiveStream
from redis_views import DEADLINE
from redis_views import LEASE
from redis_views import View
from redis_views import admin
from redis_views import connections
from redis_views import discovery
from redis_views import eventually
from redis_views import fake_worker

pytestmark = pytest.mark.anyio
anyio_backend = asyncio_backend

COMMAND = [sys.executable, "-m", "wool_pooling.redis"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The command's exit status and output."""
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, timeout=DEADLINE
    )


async def listed(*args: str) -> dict[str, list[str]]:
    """The listing's lines by their first word (a worker's: its uid),
    each split in words; the command must succeed with nothing on stderr."""
    done = await anyio.to_thread.run_sync(run, *args, "--lease", str(LEASE))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return {line.split()[0]: line.split() for line in done.stdout.splitlines()}


def one_line(done: subprocess.CompletedProcess[str], status: int) -> str:
    """The one line on stderr of a command that exited ``status``, printing
    nothing on stdout (and no traceback)."""
    assert done.returncode == status, (done.returncode, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("python -m wool_pooling.redis: error: ")
    return lines[0]


async def assert_lists_worker(url: str, namespace: str, *options: str) -> None:
    """A worker ``url``'s publisher holds is listed with its record, a lease
    renewed within the lease, and the namespace's version and epoch."""
    found = discovery(url, namespace, connect_timeout=5.0)
    worker = fake_worker(4242, pid=0)
    async with found.publisher as publisher:
        await publisher.publish("worker-added", worker)
        lines = await listed(url, namespace, *options)
    assert lines["namespace"] == ["namespace", namespace]
    assert lines["version"] == ["version", "1"]
    assert len(lines["epoch"][1]) == 32  # a new namespace's epoch: a uuid's hex
    assert lines["workers"] == ["workers", "1"]
    assert lines["UID"] == [
        "UID",
        "ADDRESS",
        "PID",
        "VERSION",
        "LEASE-AGE",
        "EXPIRES-IN",
    ]
    uid, address, pid, version, age, left = lines[str(worker.uid)]
    assert (uid, address, pid, version) == (
        str(worker.uid),
        "127.0.0.1:4242",
        "0",
        "test",
    )
    age_s, left_s = float(age.removesuffix("s")), float(left.removesuffix("s"))
    assert 0 <= age_s <= LEASE
    assert 0 < left_s <= LEASE
    assert abs(age_s + left_s - LEASE) <= 0.11  # each rounded to 0.1 s


# -- the listing --


async def test_the_listing_shows_a_published_worker_version_and_epoch(
    redis_server: RedisServer,
) -> None:
    """A worker a RedisPublisher published, with its address, pid, version,
    lease age and time left; the namespace's version and epoch as stored."""
    namespace = f"cmd-{uuid.uuid4().hex[:8]}"
    await assert_lists_worker(redis_server.url, namespace)
    epoch = admin(redis_server.url).get(f"wool:{{{namespace}}}:epoch")
    lines = await listed(redis_server.url, namespace)
    assert lines["epoch"] == ["epoch", epoch.decode()]


async def test_the_subscriber_count_follows_a_subscription(
    redis_server: RedisServer,
) -> None:
    """``subscribers`` counts the connections subscribed to the namespace's
    channel: 0, 1 while a subscription is open, 0 once it closed."""
    found = discovery(redis_server.url)
    namespace = found.namespace
    assert (await listed(redis_server.url, namespace))["subscribers"][1] == "0"
    view = View()
    worker = fake_worker(1)
    async with found.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", worker)
        tg.start_soon(view.consume, found.subscribe())
        await view.has(worker.uid)
        assert (await listed(redis_server.url, namespace))["subscribers"][1] == "1"
        tg.cancel_scope.cancel()
    await eventually(lambda: not connections(redis_server.url, "subscriber", namespace))
    assert (await listed(redis_server.url, namespace))["subscribers"][1] == "0"


def acl_rule(extra: str) -> list[str]:
    """docs/redis.rst's first ``ACL SETUSER`` rule, for user ``wool``, with
    ``extra`` (what docs/command.rst says the listing needs besides)."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "redis.rst").read_text()
    rule = re.findall(r"ACL SETUSER wool (.+)", page)[0]
    return [*rule.replace(">PASSWORD", ">s3cret").split(), extra]


async def test_an_acl_user_of_the_documented_rule_lists(
    redis_server: RedisServer,
) -> None:
    """``redis://user:password@host`` authenticates as that ACL user, and the
    discovery's documented rule plus ``+pubsub|numsub`` is enough."""
    admin(redis_server.url).execute_command(
        "ACL", "SETUSER", "wool", *acl_rule("+pubsub|numsub")
    )
    url = redis_server.url.replace("redis://", "redis://wool:s3cret@")
    await assert_lists_worker(url, f"cmd-{uuid.uuid4().hex[:8]}")


async def test_a_key_prefix_lists_the_namespace_under_it(
    redis_server: RedisServer,
) -> None:
    """``--key-prefix`` reads the keys a discovery of that ``key_prefix`` wrote."""
    found = discovery(redis_server.url, key_prefix="fleet:")
    async with found.publisher as publisher:
        await publisher.publish("worker-added", fake_worker(3))
        under = await listed(
            redis_server.url, found.namespace, "--key-prefix", "fleet:"
        )
        default = await listed(redis_server.url, found.namespace)
    assert (under["workers"], default["workers"]) == (
        ["workers", "1"],
        ["workers", "0"],
    )


# -- --watch --


async def test_watch_prints_an_added_then_a_dropped_worker_and_exits_0_on_ctrl_c(
    redis_server: RedisServer,
) -> None:
    """``--watch`` prints one line per event, as the library delivers it:
    an added worker, then its drop; SIGINT ends it with status 0, quietly."""
    found = discovery(redis_server.url)
    worker = fake_worker(7)
    expected = f"{worker.uid} 127.0.0.1:7 0 test"
    command = [*COMMAND, redis_server.url, found.namespace, "--watch"]
    process = await anyio.open_process(command)
    try:
        assert process.stdout is not None
        assert process.stderr is not None
        lines = BufferedByteReceiveStream(process.stdout)
        async with found.publisher as publisher:
            await publisher.publish("worker-added", worker)
            with anyio.fail_after(DEADLINE):
                line = await lines.receive_until(b"\n", 1000)
            assert line.decode() == f"worker-added {expected}"
            await publisher.publish("worker-dropped", worker)
            with anyio.fail_after(DEADLINE):
                line = await lines.receive_until(b"\n", 1000)
            assert line.decode() == f"worker-dropped {expected}"
        process.send_signal(signal.SIGINT)
        with anyio.fail_after(DEADLINE):
            assert await process.wait() == 0
            assert b"".join([chunk async for chunk in process.stderr]) == b""
    finally:
        if process.returncode is None:
            process.kill()
        await process.aclose()


async def test_watch_ends_quietly_when_its_reader_leaves(
    redis_server: RedisServer,
) -> None:
    """Piped into ``head -n 1``, ``--watch`` ends at its first line after
    ``head`` left, with status 0 and nothing on stderr."""
    found = discovery(redis_server.url)
    pipeline = '"$@" | head -n 1; exit "${PIPESTATUS[0]}"'
    command = ["bash", "-c", pipeline, "bash", *COMMAND, redis_server.url]
    process = await anyio.open_process([*command, found.namespace, "--watch"])
    try:
        assert process.stdout is not None
        assert process.stderr is not None
        async with found.publisher as publisher:
            with anyio.fail_after(DEADLINE):
                await publisher.publish("worker-added", fake_worker(1))
                assert (await process.stdout.receive()).startswith(b"worker-added")
                while process.returncode is None:  # a line per worker, until EPIPE
                    await publisher.publish("worker-added", fake_worker(2))
                    with anyio.move_on_after(0.2):
                        await process.wait()
                assert process.returncode == 0
                assert b"".join([chunk async for chunk in process.stderr]) == b""
    finally:
        if process.returncode is None:
            process.kill()
        await process.aclose()


# -- errors: one line on stderr --


@pytest.mark.parametrize("watch", [(), ("--watch",)], ids=["list", "watch"])
def test_a_malformed_url_exits_2_with_one_line(watch: tuple[str, ...]) -> None:
    line = one_line(run("redis:/127.0.0.1:6379", "ns", *watch), 2)
    assert "a Redis url starts with redis://" in line


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--timeout", "0"), "--timeout must be a finite number > 0"),
        (("-o", "sockt_timeout=1"), "did you mean 'socket_timeout'?"),
        (("-o", "ssl_ca_certs"), "a client option is NAME=VALUE"),
    ],
)
def test_a_bad_option_exits_2_with_one_line(args: tuple[str, ...], said: str) -> None:
    assert said in one_line(run("redis://127.0.0.1:6379/0", "ns", *args), 2)


@pytest.mark.parametrize("watch", [(), ("--watch",)], ids=["list", "watch"])
def test_a_wrong_password_exits_1_with_one_line_naming_auth(
    own_redis_server: Callable[..., RedisServer], watch: tuple[str, ...]
) -> None:
    server = own_redis_server("--requirepass", "right")
    url = server.url.replace("redis://", "redis://:wrong@")
    line = one_line(run(url, "ns", *watch), 1)
    assert "AuthenticationError: WRONGPASS" in line
    assert ":wrong@" not in line


@pytest.mark.parametrize("watch", [(), ("--watch",)], ids=["list", "watch"])
@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:{port}/0",
        "redis+sentinel://127.0.0.1:{port}/service",
        "redis+cluster://127.0.0.1:{port}",
        "unix:///nonexistent/redis.sock",
    ],
)
def test_an_unreachable_server_exits_1_with_one_line(
    url: str, watch: tuple[str, ...]
) -> None:
    line = one_line(run(url.format(port=free_port()), "ns", *watch), 1)
    assert "Error" in line


def test_a_server_that_never_answers_fails_within_the_timeout() -> None:
    """A port that accepts connections but never answers: status 1 after
    about ``--timeout`` seconds, not a hang."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        started = time.monotonic()
        line = one_line(run(url, "ns", "--timeout", "0.5"), 1)
    assert time.monotonic() - started < 5
    assert "Timeout" in line


def test_help_describes_every_option() -> None:
    done = run("--help")
    assert done.returncode == 0
    for option in (
        "--watch",
        "--timeout",
        "--lease",
        "--key-prefix",
        "--client-option",
    ):
        assert option in done.stdout
    assert "Exit status: 2 for a usage error" in " ".join(done.stdout.split())


# -- TLS, Sentinel, Cluster --


async def test_a_tls_server_lists(own_redis_server: Callable[..., RedisServer]) -> None:
    """``rediss://`` with the CA given as ``-o ssl_ca_certs=...``."""
    port = free_port()
    own_redis_server(
        *("--tls-port", str(port), "--tls-cert-file", str(CERTIFICATE)),
        *("--tls-key-file", str(KEY), "--tls-ca-cert-file", str(CERTIFICATE)),
        *("--tls-auth-clients", "no"),
    )
    url = f"rediss://127.0.0.1:{port}/0"
    namespace = f"cmd-{uuid.uuid4().hex[:8]}"
    found = discovery(url, namespace, client_options={"ssl_ca_certs": str(CERTIFICATE)})
    worker = fake_worker(4242)
    async with found.publisher as publisher:
        await publisher.publish("worker-added", worker)
        lines = await listed(url, namespace, "-o", f"ssl_ca_certs={CERTIFICATE}")
    assert lines[str(worker.uid)][1] == "127.0.0.1:4242"
    refused = await anyio.to_thread.run_sync(run, url, namespace)
    assert "CERTIFICATE_VERIFY_FAILED" in one_line(refused, 1)


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    group = SentinelSet(require_redis_server())
    try:
        group.start()
        yield group
    finally:
        group.cleanup()


async def test_a_sentinel_url_lists(sentinels: SentinelSet) -> None:
    await assert_lists_worker(sentinels.url, f"cmd-{uuid.uuid4().hex[:8]}")


async def test_a_cluster_url_lists_with_the_shard_channel_s_subscribers() -> None:
    """``redis+cluster://``: the records from the namespace's master, and
    the subscribers of its shard channel."""
    cluster = RedisCluster()
    try:
        namespace = f"cmd-{uuid.uuid4().hex[:8]}"
        await assert_lists_worker(cluster.url(), namespace)
        found = discovery(cluster.url(), namespace)
        view = View()
        worker = fake_worker(1)
        async with found.publisher as publisher, anyio.create_task_group() as tg:
            await publisher.publish("worker-added", worker)
            tg.start_soon(view.consume, found.subscribe())
            await view.has(worker.uid)
            lines = await listed(cluster.url(), namespace)
            assert lines["subscribers"][1] == "1"
            tg.cancel_scope.cancel()
    finally:
        cluster.cleanup()
