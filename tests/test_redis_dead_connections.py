"""A subscription notices a connection whose peer stopped answering.

A NAT or load balancer that drops a connection's state, or a stalled
server, leaves the pub/sub connection open and silent: without a deadline
the subscription would wait for ever. ``liveness_timeout`` bounds it: a
PING on the quiet connection, and the connection treated as lost when
nothing answers in time (reconnect, new snapshot, only the changes). The
faults here are a loopback TCP proxy of the test's own that stops
forwarding an open subscription without closing either side, and a
SIGSTOPped ``redis-server``. asyncio only (redis-py and wool are).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from _loops import TEST_LOOP
from _loops import asyncio_options
from _redis import RedisServer
from _redis import require_redis_server
from redis_views import View
from redis_views import discovery
from redis_views import fake_worker

pytestmark = pytest.mark.anyio

#: The liveness timeout the tests run with, in seconds.
LIVENESS = 2.0
#: What a loaded 2-core machine may add to the bound, in seconds.
MARGIN = 8.0
#: Long leases: no worker expires while the server is stopped.
LEASE = 30.0
#: Far above the bound: no other deadline (a command's ``socket_timeout``)
#: may be what notices the fault.
SLOW = 60.0


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """redis-py's client is asyncio-only: asyncio, as configured."""
    return ("asyncio", {} if TEST_LOOP == "eager" else asyncio_options())


#: A ``SUBSCRIBE`` command, as the client sends it (RESP).
_SUBSCRIBE = b"\r\n$9\r\nSUBSCRIBE\r\n"


class _Pipe:
    """One proxied connection: the client's side and the server's."""

    def __init__(self, writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]):
        self.writers = writers
        #: Set while bytes are forwarded; cleared, they are held (neither
        #: side is closed, nothing is answered).
        self.flowing = asyncio.Event()
        self.flowing.set()
        #: Whether the client sent ``SUBSCRIBE`` on it.
        self.subscriber = False


class StallingProxy:
    """Forwards loopback TCP connections to a server, until told to stall.

    :meth:`stall_subscriptions` stops forwarding, both ways, on every open
    connection that has sent ``SUBSCRIBE``, without closing either side: the
    client's connection stays open and silent, as behind a NAT that dropped
    its state. Connections opened later are forwarded.
    """

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = 0
        self.pipes: list[_Pipe] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stall_subscriptions(self) -> int:
        """Stop forwarding on the open subscribing connections; how many."""
        stalled = [pipe for pipe in self.pipes if pipe.subscriber]
        for pipe in stalled:
            pipe.flowing.clear()
        return len(stalled)

    async def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            upstream = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        pipe = _Pipe((writer, upstream[1]))
        self.pipes.append(pipe)
        for source, sink, client in (
            (reader, upstream[1], True),
            (upstream[0], writer, False),
        ):
            task = asyncio.get_running_loop().create_task(
                self._forward(pipe, source, sink, client)
            )
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _forward(
        self,
        pipe: _Pipe,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        client: bool,
    ) -> None:
        try:
            while data := await source.read(65536):
                if client and _SUBSCRIBE in data:
                    pipe.subscriber = True
                await pipe.flowing.wait()
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            if pipe.flowing.is_set():
                for each in pipe.writers:
                    each.close()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        for pipe in self.pipes:
            for writer in pipe.writers:
                writer.close()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def proxy_to(port: int) -> AsyncIterator[StallingProxy]:
    proxy = StallingProxy(port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()


class LostConnections(logging.Handler):
    """Notes when a subscription logs a lost connection."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lost = anyio.Event()
        self.messages: list[str] = []

    def reset(self) -> None:
        """Forget what was noted: only what follows counts."""
        self.lost = anyio.Event()
        self.messages.clear()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("lost "):
            self.messages.append(message)
            self.lost.set()


@pytest.fixture
def lost() -> Iterator[LostConnections]:
    handler = LostConnections()
    logger = logging.getLogger("wool_pooling.redis")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of the test's own: it is stopped and continued."""
    server = RedisServer(require_redis_server())
    server.start()
    try:
        yield server
    finally:
        process = server.process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
        server.cleanup()


async def test_a_subscription_a_proxy_stopped_forwarding_is_noticed_in_time(
    redis_server: RedisServer, lost: LostConnections
) -> None:
    """A proxy that stops forwarding the open subscription (a NAT that
    dropped its state): the subscription treats it as lost within
    ``liveness_timeout``, reconnects, and sees a worker added meanwhile,
    with no duplicate."""
    async with proxy_to(redis_server.port) as proxy:
        # The publisher goes straight to the server; the subscriber through
        # the proxy. Reaps (on the command connection, forwarded) succeed
        # throughout: only the liveness deadline can notice.
        name = f"dead-{os.getpid()}-{time.monotonic_ns()}"
        publishing = discovery(redis_server.url, name, lease=LEASE)
        subscribing = discovery(
            proxy.url,
            name,
            lease=LEASE,
            reap_interval=0.2,
            liveness_timeout=LIVENESS,
            connect_timeout=SLOW,
        )
        first, missed = fake_worker(1), fake_worker(2)
        view = View()
        async with publishing.publisher as publisher, anyio.create_task_group() as tg:
            await publisher.publish("worker-added", first)
            tg.start_soon(view.consume, subscribing.subscribe())
            await view.has(first.uid)
            lost.reset()
            assert proxy.stall_subscriptions() == 1
            stalled = time.monotonic()
            await publisher.publish("worker-added", missed)
            with anyio.fail_after(LIVENESS + MARGIN):
                await lost.lost.wait()
            noticed = time.monotonic() - stalled
            await view.has(first.uid, missed.uid)
            tg.cancel_scope.cancel()
    assert noticed <= LIVENESS + MARGIN
    assert any("liveness_timeout" in message for message in lost.messages)
    assert subscribing.statistics().reconnects >= 1
    assert view.added[missed.uid] == 1
    assert view.added[first.uid] == 1


async def test_a_stopped_server_is_noticed_and_its_changes_seen_once_it_continues(
    own_server: RedisServer, lost: LostConnections
) -> None:
    """A SIGSTOPped server (every connection open, nothing answered): the
    subscription notices within ``liveness_timeout``; once the server is
    continued, it reconnects and sees a worker added meanwhile."""
    process = own_server.process
    assert process is not None
    name = f"stopped-{os.getpid()}-{time.monotonic_ns()}"
    # connect_timeout far above the bound: the reaps' and the reconnects'
    # own timeouts cannot be what notices.
    redis_discovery = discovery(
        own_server.url,
        name,
        lease=LEASE,
        liveness_timeout=LIVENESS,
        connect_timeout=SLOW,
    )
    first, later = fake_worker(1), fake_worker(2)
    view = View()
    async with redis_discovery.publisher as publisher, anyio.create_task_group() as tg:
        await publisher.publish("worker-added", first)
        tg.start_soon(view.consume, redis_discovery.subscribe())
        await view.has(first.uid)
        lost.reset()
        os.kill(process.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            with anyio.fail_after(LIVENESS + MARGIN):
                await lost.lost.wait()
            noticed = time.monotonic() - stopped
        finally:
            os.kill(process.pid, signal.SIGCONT)
        await publisher.publish("worker-added", later)
        await view.has(first.uid, later.uid)
        tg.cancel_scope.cancel()
    assert noticed <= LIVENESS + MARGIN
    assert any("liveness_timeout" in message for message in lost.messages)
    assert view.added[later.uid] == 1
    assert view.added[first.uid] == 1
