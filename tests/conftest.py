from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import pytest
from _loops import BACKENDS
from _redis import RedisServer
from _redis import require_redis_server
from _stubs import Probe

#: Fixtures that start a real redis-server: a test using one is a ``redis`` test.
_REDIS_FIXTURES = frozenset({"redis_server", "own_redis_server"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark as ``redis`` every test that needs a real redis-server: those of
    the Redis test modules (``test_redis_*.py``, which start servers of their
    own too) and any other that uses a server fixture. The other markers
    (``docs``, ``benchmarks``, ``wool_processes``) are set by each module."""
    for item in items:
        if item.path.name.startswith("test_redis_") or _REDIS_FIXTURES.intersection(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.redis)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test of a module that lacks a tool CI requires fails (see ``_tools``)."""
    missing = getattr(getattr(item, "module", None), "MISSING_TOOLS", None)
    if missing:
        pytest.fail(missing, pytrace=False)


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Run every ``anyio``-marked test under asyncio (see ``_loops``) and trio."""
    return request.param


@pytest.fixture
def probe() -> Iterator[Probe]:
    """A gated :class:`~_stubs.Probe` source, closed after the test."""
    with Probe() as source:
        yield source


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A real ``redis-server`` on a free loopback port, persistence off, one per
    test module (see ``_redis``: skips, or fails under
    ``WOOL_POOLING_REQUIRE_REDIS=1``, without one)."""
    server = RedisServer(require_redis_server())
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def own_redis_server(redis_server: RedisServer) -> Iterator[Callable[..., RedisServer]]:
    """Starts a ``redis-server`` of the test's own (one it may stop and
    restart, or run with ``extra`` arguments): ``own_redis_server(*extra)``,
    the same executable as ``redis_server``; each is cleaned up after the
    test."""
    started: list[RedisServer] = []

    def start(*extra: str) -> RedisServer:
        server = RedisServer(redis_server.executable, *extra)
        started.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.cleanup()
