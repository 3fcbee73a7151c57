"""Stub raw subscribers for the subscription and pool tests.

Each test gets classes of its own from :func:`make_stub`, so the class-level
``instances`` list (every raw instance built, in order) is not shared between
tests. The raw instance creates a memory object stream in ``__init__``; the
test decides when each event arrives with :meth:`StreamStub.push`, makes the
stream fail with :meth:`StreamStub.fail` and ends it with :meth:`StreamStub.end`.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Iterable
from typing import ClassVar
from typing import Literal
from typing import cast

import anyio
import anyio.lowlevel
import pytest
import sniffio
from _loops import asyncio_options
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import SharedSubscription
from wool_pooling import shared_subscription

EventType = Literal["worker-added", "worker-updated", "worker-dropped"]
Pair = tuple[str, WorkerMetadata]


def meta(uid: uuid.UUID | None = None, *, pid: int = 1) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uid or uuid.uuid4(), address="127.0.0.1:1", pid=pid, version="1"
    )


def ev(type_: EventType, metadata: WorkerMetadata) -> DiscoveryEvent:
    return DiscoveryEvent(type_, metadata=metadata)


def pairs(events: Iterable[DiscoveryEvent]) -> list[Pair]:
    """``DiscoveryEvent`` has no ``__eq__``: compare (type, metadata) pairs."""
    return [(event.type, event.metadata) for event in events]


class Failure:
    """Pushed into a stub's stream: the raw generator raises ``error`` there."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class StreamStub:
    """Undecorated raw subscriber fed by the test through a memory object stream.

    ``__aiter__`` returns an async generator reading the stream; it counts its
    calls, and the generator counts how often its ``finally`` ran.
    """

    instances: ClassVar[list[StreamStub]] = []

    def __init__(self, name: str = "a") -> None:
        self.name = name
        self.send, self.receive = anyio.create_memory_object_stream[
            DiscoveryEvent | Failure
        ](math.inf)
        self.aiter_calls = 0
        self.finally_runs = 0
        #: Calls of aclose() / _shutdown(), and how many of them completed.
        self.close_calls = 0
        self.closes_done = 0
        type(self).instances.append(self)

    def push(self, *events: DiscoveryEvent) -> None:
        for event in events:
            self.send.send_nowait(event)

    def fail(self, error: BaseException) -> None:
        self.send.send_nowait(Failure(error))

    def end(self) -> None:
        self.send.close()

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        self.aiter_calls += 1
        return self._events()

    async def _events(self) -> AsyncGenerator[DiscoveryEvent, None]:
        try:
            async for item in self.receive:
                if isinstance(item, Failure):
                    raise item.error
                yield item
        finally:
            self.finally_runs += 1

    async def _close(self) -> None:
        self.close_calls += 1
        # A real await: finalisation must await the close, not just call it.
        await anyio.lowlevel.checkpoint()
        self.send.close()
        self.receive.close()
        self.closes_done += 1


class AcloseStub(StreamStub):
    """Raw subscriber closed with ``aclose()``."""

    async def aclose(self) -> None:
        await self._close()


class ShutdownStub(StreamStub):
    """Raw subscriber with only wool's ``_shutdown()`` convention."""

    async def _shutdown(self) -> None:
        await self._close()


def make_stub(*, ttl: float = 0.0, shutdown: bool = False) -> type[StreamStub]:
    """A fresh decorated stub class with its own ``instances`` list."""
    base: type[StreamStub] = ShutdownStub if shutdown else AcloseStub
    cls = type(base.__name__, (base,), {"instances": []})
    return shared_subscription(ttl=ttl)(cls)


def subscribe(cls: type[StreamStub], name: str = "a") -> SharedSubscription:
    """``cls(name)``, typed as what the decorator makes it return."""
    return cast(SharedSubscription, cls(name))


async def take(it: AsyncIterator[DiscoveryEvent], n: int) -> list[DiscoveryEvent]:
    """Read exactly ``n`` events (failing instead of hanging)."""
    with anyio.fail_after(5):
        return [await anext(it) for _ in range(n)]


async def ended(it: AsyncIterator[DiscoveryEvent]) -> bool:
    """Whether the next ``__anext__`` raises StopAsyncIteration."""
    with anyio.fail_after(5):
        try:
            await anext(it)
        except StopAsyncIteration:
            return True
    return False


def current_task() -> object:
    """The task object running the caller (asyncio's or trio's own)."""
    if sniffio.current_async_library() == "asyncio":
        task: object = asyncio.current_task()
    else:
        import trio

        task = trio.lowlevel.current_task()
    assert task is not None
    return task


def running_tasks() -> int:
    """Count every task alive in the current event loop / trio run (a pump too)."""
    if sniffio.current_async_library() == "asyncio":
        return len(asyncio.all_tasks())
    import trio

    count = 0
    root = trio.lowlevel.current_root_task()
    assert root is not None
    stack = [root]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


def _uvloop_param() -> list[object]:
    try:
        import uvloop  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        return []
    return [pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")]


#: For the modules whose subject is asyncio's internals (the inline pull swaps
#: the current task): the same tests on uvloop's event loop as well.
WITH_UVLOOP = [
    pytest.param(("asyncio", asyncio_options()), id="asyncio"),
    *_uvloop_param(),
    pytest.param("trio", id="trio"),
]
