"""Nothing stops silently, nothing outlives its users.

The publisher's lease renewer is supervised: an unexpected error is logged at
once on ``wool_pooling.redis`` and raised from the publisher's next call (or
its exit). The process-wide registries of the package (the counters behind
:meth:`RedisDiscovery.statistics`, the options of live shared subscribers)
drop an entry with its last user.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import anyio
import pytest
from _loops import asyncio_options
from _redis import RedisServer
from redis.exceptions import RedisClusterException
from redis_views import admin
from redis_views import discovery
from redis_views import fake_worker

from wool_pooling import RestartPolicy
from wool_pooling.redis import RedisDiscoveryError
from wool_pooling.redis import _discovery
from wool_pooling.redis import _scripts
from wool_pooling.redis import _stream

pytestmark = pytest.mark.anyio

UNREACHABLE = "redis://127.0.0.1:1/0"


def break_the_renewal(monkeypatch: pytest.MonkeyPatch) -> anyio.Event:
    """Make the renewer's next round raise an unexpected error; the event is
    set as it does."""
    failing = anyio.Event()

    def broken(pid: int) -> bool:
        failing.set()
        raise ZeroDivisionError("a bug in the renewal")

    monkeypatch.setattr(_discovery, "_process_alive", broken)
    return failing


async def until_the_renewer_failed(publisher: Any, failing: anyio.Event) -> None:
    await publisher.publish("worker-added", fake_worker())
    with anyio.fail_after(10):
        await failing.wait()
    await anyio.wait_all_tasks_blocked()


@pytest.mark.parametrize("anyio_backend", [("asyncio", asyncio_options())])
async def test_a_failing_renewer_is_logged_at_once_and_raised_by_the_next_publish(
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unexpected error stops the lease renewer with an error logged at
    once, and the publisher's next publish and its exit raise it."""
    failing = break_the_renewal(monkeypatch)
    caplog.set_level(logging.ERROR, logger="wool_pooling.redis")
    publisher = discovery(redis_server.url, lease=0.3).publisher
    await publisher.__aenter__()
    try:
        await until_the_renewer_failed(publisher, failing)
        stopped = [r for r in caplog.records if "stopped" in r.getMessage()]
        assert len(stopped) == 1
        assert stopped[0].exc_info is not None
        with pytest.raises(RedisDiscoveryError, match="a bug in the renewal"):
            await publisher.publish("worker-added", fake_worker())
    finally:
        with pytest.raises(RedisDiscoveryError, match="ZeroDivisionError") as exited:
            await publisher.__aexit__(None, None, None)
    assert isinstance(exited.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("anyio_backend", [("asyncio", asyncio_options())])
async def test_a_renewer_that_failed_is_forgotten_by_the_next_entry(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error of one entry's renewer is raised by its exit: entering the
    publisher again starts a healthy renewer."""
    failing = break_the_renewal(monkeypatch)
    publisher = discovery(redis_server.url, lease=0.3).publisher
    await publisher.__aenter__()
    try:
        await until_the_renewer_failed(publisher, failing)
    finally:
        with pytest.raises(RedisDiscoveryError, match="a bug in the renewal"):
            await publisher.__aexit__(None, None, None)
    monkeypatch.undo()
    async with publisher:
        await publisher.publish("worker-added", fake_worker())


@pytest.mark.parametrize("anyio_backend", [("asyncio", asyncio_options())])
async def test_a_cluster_error_in_a_publish_is_a_redis_discovery_error(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's cluster errors (no seed reachable, no node for the slot),
    which are no ``RedisError``, reach the publisher's caller as the
    :exc:`RedisDiscoveryError` of the action, as a lost connection does."""

    async def no_node(*args: object) -> None:
        raise RedisClusterException("no node for the slot")

    async with discovery(redis_server.url).publisher as publisher:
        monkeypatch.setattr(_scripts, "run", no_node)
        with pytest.raises(
            RedisDiscoveryError,
            match=r"^publishing worker-added .* RedisClusterException: no node",
        ):
            await publisher.publish("worker-added", fake_worker())


async def test_the_counters_of_a_key_go_with_its_last_user(
    anyio_backend: Any,
) -> None:
    """The counters behind statistics() live while a discovery or a
    subscriber of their key does, and go with the last one."""
    first = discovery(UNREACHABLE, shared=False)
    key = first._key  # pyright: ignore[reportPrivateUsage]
    subscriber = first.subscribe()
    assert first.statistics().snapshots == 0
    assert key in _stream.by_key
    del first
    gc.collect()
    assert key in _stream.by_key  # the subscriber holds them
    del subscriber
    gc.collect()
    assert key not in _stream.by_key


async def test_the_options_of_shared_subscribers_go_with_the_last_one(
    anyio_backend: Any,
) -> None:
    """The options noted for a key (to warn a later subscriber given other
    ones) go with the subscribers, and the key with the last of them."""
    made = discovery(UNREACHABLE)
    key = made._key  # pyright: ignore[reportPrivateUsage]

    def noted() -> int:
        live = _discovery._live.values()  # pyright: ignore[reportPrivateUsage]
        return sum(each == key for each, _ in live)

    subscribers = [made.subscribe(), made.subscribe()]
    assert noted() == 2
    subscribers.pop()
    gc.collect()
    assert noted() == 1
    subscribers.clear()
    gc.collect()
    assert noted() == 0


def test_a_subscriber_collected_while_the_options_are_compared_is_forgotten() -> None:
    """A subscriber collected while a new one's options are compared with
    those noted (a collection can run at any allocation) is forgotten, and
    the new one is noted: the comparison reads a copy of the record."""

    class Dropped:
        pass

    dropped: Dropped | None = Dropped()

    class Key:
        def __eq__(self, other: object) -> bool:
            nonlocal dropped
            dropped = None  # its finaliser forgets it, mid-comparison
            return False

        def __hash__(self) -> int:
            return 0

    live = _discovery._live  # pyright: ignore[reportPrivateUsage]
    _discovery._note_options(Key(), dropped, ())  # pyright: ignore[reportPrivateUsage]
    newcomer = Dropped()
    _discovery._note_options(("other",), newcomer, ())  # pyright: ignore[reportPrivateUsage]
    assert dropped is None
    assert live.get(id(newcomer)) == (("other",), ())
    assert all(not isinstance(key, Key) for key, _ in live.values())
    live.pop(id(newcomer))


@pytest.mark.parametrize(
    ("field", "value"), [("settle", 5.0), ("restart_on_end", True)]
)
def test_a_reconnect_policy_field_that_cannot_apply_is_refused(
    field: str, value: object
) -> None:
    """A reconnect policy means what it says or is refused: ``settle`` and
    ``restart_on_end`` cannot apply to a Redis subscription, so a policy
    setting either is a ValueError naming the field, at construction."""
    policy = RestartPolicy(**{field: value})
    with pytest.raises(ValueError, match=rf"^reconnect\.{field} does not apply"):
        discovery(UNREACHABLE, reconnect=policy)


class _Restarts(logging.Handler):
    """Notes each restart the restart engine logs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.restarted = anyio.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.restarted.set()


@pytest.mark.parametrize("anyio_backend", [("asyncio", asyncio_options())])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "own"])
async def test_a_lost_connection_is_restarted_by_the_one_restart_engine(
    redis_server: RedisServer, shared: bool
) -> None:
    """A subscription whose connection is killed raises in its session, and
    the restart engine (logging on ``wool_pooling.restart``) starts the next
    session, which passes on only what changed meanwhile."""
    made = discovery(redis_server.url, shared=shared)
    first, second = fake_worker(1), fake_worker(2)
    restarts = _Restarts()
    engine = logging.getLogger("wool_pooling.restart")
    engine.addHandler(restarts)
    try:
        async with made.publisher as publisher:
            await publisher.publish("worker-added", first)
            stream = aiter(made.subscribe())
            with anyio.fail_after(20):
                assert (await anext(stream)).metadata.uid == first.uid
                server = admin(redis_server.url)
                prefix = f"wool-pooling:subscriber:{made.namespace}:"
                for entry in server.client_list():
                    if entry["name"].startswith(prefix):
                        server.client_kill_filter(_id=entry["id"])
                server.close()
                await publisher.publish("worker-added", second)
                event = await anext(stream)
                await restarts.restarted.wait()
            await stream.aclose()  # type: ignore[attr-defined]
    finally:
        engine.removeHandler(restarts)
    assert (event.type, event.metadata.uid) == ("worker-added", second.uid)
    assert any(made.namespace in message for message in restarts.messages)
    assert made.statistics().reconnects == 1
