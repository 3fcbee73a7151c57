"""Helpers for the Redis discovery tests: consumer views, fake workers, the admin.

A :class:`View` applies one consumer's events and fails the test at once on
a ``worker-added`` for a worker it already has, or an update or a drop of
one it does not have. Waits are on events, bounded by a deadline, never on
sleeps.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import redis
from wool import DiscoveryEvent
from wool import WorkerMetadata
from wool import protocol

from wool_pooling import RestartPolicy
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisPublisher

#: Bound on any single wait.
DEADLINE = 20
#: A short lease and quick reconnects, so that faults show within a test.
LEASE = 1.0
FAST = RestartPolicy(attempts=None, backoff=0.02, max_backoff=0.2, jitter=0.2)


def namespace() -> str:
    """A namespace no other test uses."""
    return f"prod-{uuid.uuid4().hex[:12]}"


def discovery(url: str, name: str | None = None, **options: Any) -> RedisDiscovery:
    """A discovery of ``name`` (a fresh namespace if none) with :data:`LEASE`
    and :data:`FAST` unless ``options`` say otherwise."""
    options.setdefault("lease", LEASE)
    options.setdefault("reconnect", FAST)
    return RedisDiscovery(url, name or namespace(), **options)


def fake_worker(port: int = 1, pid: int = 0, tag: str = "") -> WorkerMetadata:
    """Metadata of a worker that does not exist (``pid=0``: never checked)."""
    return WorkerMetadata(
        uid=uuid.uuid4(),
        address=f"127.0.0.1:{port}",
        pid=pid,
        version="test",
        tags=frozenset({tag} if tag else ()),
    )


class View:
    """The workers one consumer knows, from its events."""

    def __init__(self) -> None:
        self.workers: dict[uuid.UUID, WorkerMetadata] = {}
        self.events: list[DiscoveryEvent] = []
        self.added: Counter[uuid.UUID] = Counter()
        self._changed = anyio.Event()

    def apply(self, event: DiscoveryEvent) -> None:
        uid = event.metadata.uid
        if event.type == "worker-added":
            assert uid not in self.workers, f"duplicate worker-added for {uid}"
            self.added[uid] += 1
        else:
            assert uid in self.workers, f"{event.type} for unknown worker {uid}"
        if event.type == "worker-dropped":
            del self.workers[uid]
        else:
            self.workers[uid] = event.metadata
        self.events.append(event)
        self._changed.set()
        self._changed = anyio.Event()

    async def until(
        self, predicate: Callable[[dict[uuid.UUID, WorkerMetadata]], bool]
    ) -> None:
        with anyio.fail_after(DEADLINE):
            while not predicate(self.workers):
                await self._changed.wait()

    async def has(self, *uids: uuid.UUID) -> None:
        await self.until(lambda workers: set(workers) == set(uids))

    async def consume(self, subscription: AsyncIterable[DiscoveryEvent]) -> None:
        async for event in subscription:
            self.apply(event)


@asynccontextmanager
async def published(
    discovery: RedisDiscovery, *workers: WorkerMetadata, views: int = 1
) -> AsyncIterator[tuple[RedisPublisher, list[View]]]:
    """Within ``discovery``'s publisher, once ``worker-added`` is published
    for each of ``workers``: that publisher, and ``views`` views, each
    consuming a subscription of its own and holding exactly ``workers``.
    The consumers are cancelled on exit."""
    consumers = [View() for _ in range(views)]
    async with discovery.publisher as publisher, anyio.create_task_group() as tg:
        for worker in workers:
            await publisher.publish("worker-added", worker)
        for view in consumers:
            tg.start_soon(view.consume, discovery.subscribe())
        for view in consumers:
            await view.has(*(worker.uid for worker in workers))
        yield publisher, consumers
        tg.cancel_scope.cancel()


def admin(url: str) -> Any:
    """A plain (synchronous) redis-py client for inspecting the server."""
    return redis.Redis.from_url(url)


#: ACL commands for a user that may connect and call scripts, and run
#: nothing else (no ``SUBSCRIBE``, no command a script calls).
CONNECT_ONLY = ("-@all", "+ping", "+client", "+hello", "+evalsha", "+eval")


def add_user(
    url: str,
    name: str,
    password: str,
    commands: tuple[str, ...] = ("+@all",),
    channels: tuple[str, ...] = ("*",),
) -> None:
    """Add ACL user ``name`` with ``password``, every key, and ``commands``
    and ``channels`` (by default every right)."""
    server = admin(url)
    server.acl_setuser(
        name,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["*"],
        channels=list(channels),
        commands=list(commands),
    )
    server.close()


def connections(url: str, role: str, namespace: str) -> int:
    """How many connections named ``wool-pooling:<role>:<namespace>:...`` exist."""
    prefix = f"wool-pooling:{role}:{namespace}:"
    client = admin(url)
    try:
        return sum(
            1 for entry in client.client_list() if entry["name"].startswith(prefix)
        )
    finally:
        client.close()


def hash_content(url: str, namespace: str) -> dict[uuid.UUID, WorkerMetadata]:
    """The namespace's records, decoded as wool does."""
    client = admin(url)
    try:
        records = client.hgetall(f"wool:{{{namespace}}}:workers")
    finally:
        client.close()
    return {
        uuid.UUID(uid.decode()): WorkerMetadata.from_protobuf(
            protocol.WorkerMetadata.FromString(payload)
        )
        for uid, payload in records.items()
    }


async def eventually(check: Callable[[], bool]) -> None:
    """Poll ``check`` (state held by the server, which sends no event) until
    it holds, within the deadline."""
    with anyio.fail_after(DEADLINE):
        while True:
            if check():
                return
            await anyio.sleep(0.02)
