"""A server that refuses every ``CLIENT`` command, as managed services do.

Memorystore and some proxies refuse ``CLIENT`` subcommands. With
``name_connections=False`` neither the publisher nor the subscription sends
one (no ``CLIENT SETNAME``, nor redis-py's ``CLIENT SETINFO``); with the
default, the refusal is a :class:`RedisDiscoveryError` that names
``CLIENT SETNAME`` and the option. The server here is a real one, with an
ACL user that has the documented rule less every ``CLIENT`` subcommand.
asyncio only (redis-py and wool are).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from _loops import TEST_LOOP
from _loops import asyncio_options
from _redis import RedisServer
from redis_views import View
from redis_views import discovery
from redis_views import fake_worker

from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisDiscoveryError
from wool_pooling.redis import RedisPublisher

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
USER = "managed"
PASSWORD = "managed-pw"


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """redis-py's client is asyncio-only: asyncio, as configured."""
    return ("asyncio", {} if TEST_LOOP == "eager" else asyncio_options())


def managed_rule() -> list[str]:
    """The documented ACL rule (``docs/redis.rst``), every ``CLIENT``
    subcommand denied: what a managed service allows."""
    page = (ROOT / "docs" / "redis.rst").read_text()
    match = re.search(r"ACL SETUSER wool (.+)", page)
    assert match is not None, "docs/redis.rst documents no ACL SETUSER rule"
    rule = match.group(1).strip().replace(">PASSWORD", f">{PASSWORD}").split()
    return [*rule, "-client"]


def plain(url: str) -> Any:
    """A synchronous redis-py client that sends no ``CLIENT`` command (not
    even redis-py's ``CLIENT SETINFO`` or ``CLIENT MAINT_NOTIFICATIONS``),
    on RESP2: the server's counters then show the discovery's commands only."""
    quiet: dict[str, Any] = (
        {"driver_info": None}
        if importlib.util.find_spec("redis.driver_info") is not None
        else {"lib_name": None, "lib_version": None}
    )
    return redis.Redis.from_url(url, protocol=2, **quiet)


@pytest.fixture
def managed_url(redis_server: RedisServer) -> Iterator[str]:
    """Database 1 of the server, as a user refused every ``CLIENT``
    command; the server's counters reset first."""
    server = plain(redis_server.url)
    server.execute_command("ACL", "SETUSER", USER, "reset", *managed_rule())
    server.config_resetstat()
    try:
        yield f"redis://{USER}:{PASSWORD}@127.0.0.1:{redis_server.port}/1"
    finally:
        server.execute_command("ACL", "DELUSER", USER)
        server.close()


def client_commands_and_errors(url: str) -> tuple[list[str], list[str]]:
    """Since the counters were reset: the ``CLIENT`` subcommands the server
    counted (run or refused), and the kinds of errors it answered (a
    ``CLIENT`` subcommand it does not know is an ``ERR``, counted only
    there)."""
    server = plain(url)
    try:
        commands = sorted(
            name for name in server.info("commandstats") if "client" in name.lower()
        )
        errors = sorted(server.info("errorstats"))
    finally:
        server.close()
    return commands, errors


def test_the_rule_refuses_client_setname(managed_url: str) -> None:
    """The test's user is refused ``CLIENT SETNAME`` and ``CLIENT ID``
    (the fault the option is for is really there)."""
    client = plain(managed_url)
    try:
        assert client.ping()
        for command in (("CLIENT", "SETNAME", "x"), ("CLIENT", "ID")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
    finally:
        client.close()


async def test_without_connection_names_a_client_refusing_server_works_end_to_end(
    redis_server: RedisServer, managed_url: str
) -> None:
    """``name_connections=False``: publish, subscribe (on database 1) and see
    workers added and dropped, as a user refused every ``CLIENT`` command;
    the server counted no ``CLIENT`` subcommand, and answered no error."""
    redis_discovery = discovery(managed_url, name_connections=False)
    assert redis_discovery.publisher.name_connections is False
    first, second = fake_worker(1), fake_worker(2)
    view = View()
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", first)
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await view.has(first.uid)
        await publisher.publish("worker-added", second)
        await publisher.publish("worker-dropped", first)
        await view.has(second.uid)
        tg.cancel_scope.cancel()
    commands, errors = client_commands_and_errors(redis_server.url)
    assert commands == []
    # NOSCRIPT: an EVALSHA before the script's first SCRIPT LOAD.
    assert set(errors) <= {"errorstat_NOSCRIPT"}


async def test_with_connection_names_a_client_refusing_server_is_a_clear_error(
    redis_server: RedisServer, managed_url: str
) -> None:
    """By default (``name_connections=True``) the publisher and the
    subscription fail at once with a ``RedisDiscoveryError`` naming
    ``CLIENT SETNAME`` and ``name_connections``."""
    redis_discovery = discovery(managed_url)
    expected = r"CLIENT SETNAME.*name_connections=False"
    with pytest.raises(RedisDiscoveryError, match=expected) as publishing:
        async with redis_discovery.publisher:
            pass  # pragma: no cover - never reached
    assert "NOPERM" in str(publishing.value)
    with pytest.raises(RedisDiscoveryError, match=expected) as subscribing:
        async for _ in redis_discovery.subscribe():
            pass  # pragma: no cover - never reached
    assert "NOPERM" in str(subscribing.value)
    commands, errors = client_commands_and_errors(redis_server.url)
    assert commands  # refused: cmdstat_client|setname (cmdstat_client on Redis 6)
    assert "errorstat_NOPERM" in errors


def test_name_connections_is_checked_and_kept() -> None:
    """``name_connections`` must be a ``bool``; the discovery passes it on
    to its publisher, and the default names connections."""
    url = "redis://127.0.0.1:1/0"
    with pytest.raises(TypeError, match="name_connections"):
        RedisDiscovery(url, "ns", name_connections="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name_connections"):
        RedisPublisher(url, "ns", name_connections=0)  # type: ignore[arg-type]
    assert RedisDiscovery(url, "ns").name_connections is True
    assert RedisPublisher(url, "ns").name_connections is True
    off = RedisDiscovery(url, "ns", name_connections=False)
    assert off.publisher.name_connections is False
    assert off.publisher != RedisDiscovery(url, "ns").publisher
