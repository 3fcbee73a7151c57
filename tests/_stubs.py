"""Shared test helpers: stub raw subscribers, gated sources, reading helpers.

Stub raw subscribers for the subscription and pool tests: each test gets
classes of its own from :func:`make_stub`, so the class-level ``instances``
list (every raw instance built, in order) is not shared between tests. The
raw instance creates a memory object stream in ``__init__``; the test decides
when each event arrives with :meth:`StreamStub.push`, makes the stream fail
with :meth:`StreamStub.fail` and ends it with :meth:`StreamStub.end`.

Sources for the fan-out tests (:class:`Probe`, :class:`Feed`,
:class:`PullTasks`), the helpers that read consumers (:func:`take`,
:func:`drain`, the ``async for`` helpers) and those that wait for the other
tasks (:func:`settle`, :func:`wait_until_waiting`) live here too, one copy
each.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import deque
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any
from typing import ClassVar
from typing import Literal
from typing import TypeVar
from typing import cast

import anyio
import anyio.lowlevel
import attrs
import pytest
import sniffio
from _loops import WITH_TRIO
from _loops import asyncio_options
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

T = TypeVar("T")

EventType = Literal["worker-added", "worker-updated", "worker-dropped"]
Pair = tuple[str, WorkerMetadata]

#: Seconds any one read or wait of a test may take before it fails.
TIMEOUT = 5

#: More items than any test expects from one loop.
RUNAWAY = 1000


def meta(
    uid: uuid.UUID | None = None, *, pid: int = 1, tags: frozenset[str] = frozenset()
) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uid or uuid.uuid4(), address="127.0.0.1:1", pid=pid, version="1", tags=tags
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


def make_stub(
    *, ttl: float = 0.0, shutdown: bool = False, **options: Any
) -> type[StreamStub]:
    """A fresh decorated stub class with its own ``instances`` list
    (``options``: more arguments of ``@shared_subscription``)."""
    base: type[StreamStub] = ShutdownStub if shutdown else AcloseStub
    cls = type(base.__name__, (base,), {"instances": []})
    return shared_subscription(ttl=ttl, **options)(cls)


def subscribe(cls: type[StreamStub], name: str = "a") -> SharedSubscription:
    """``cls(name)``, typed as what the decorator makes it return."""
    return cast(SharedSubscription, cls(name))


def added(n: int) -> DiscoveryEvent:
    """A ``worker-added`` event of a worker with pid ``n``."""
    return ev("worker-added", meta(pid=n))


async def first_read(consumer: AsyncIterator[T], feed: Callable[[], object]) -> T:
    """Start ``consumer``'s first read (it joins, building the raw instance
    if need be), then ``feed()`` the raw instance; the item read."""
    got: list[T] = []

    async def read() -> None:
        got.append(await anext(consumer))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            feed()
    return got[0]


class Endless:
    """A raw subscriber of ints that always has the next one ready."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def __aiter__(self) -> AsyncIterator[int]:
        n = 0
        while True:
            yield n
            n += 1


def entry_of(pool: SubscriptionPool, sub: SharedSubscription) -> Any:
    """The pool's entry for ``sub``'s class and key."""
    return pool._entries[(sub.cls, sub.key)]  # pyright: ignore[reportPrivateUsage]


async def take(iterator: AsyncIterator[T], n: int) -> list[T]:
    """Read exactly ``n`` items with ``anext`` (failing instead of hanging)."""
    with anyio.fail_after(TIMEOUT):
        return [await anext(iterator) for _ in range(n)]


async def drain(iterator: AsyncIterator[T]) -> list[T]:
    """Read until the consumer ends (failing instead of hanging)."""
    with anyio.fail_after(TIMEOUT):
        return [item async for item in iterator]


async def expect_end(iterator: AsyncIterator[Any]) -> None:
    """The next ``__anext__`` raises StopAsyncIteration."""
    with pytest.raises(StopAsyncIteration):
        await anext(iterator)


async def ended(it: AsyncIterator[DiscoveryEvent]) -> bool:
    """Whether the next ``__anext__`` raises StopAsyncIteration."""
    with anyio.fail_after(TIMEOUT):
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


#: For the tests whose subject is which task runs the source's code: the same
#: tests on uvloop's event loop as well (its tasks are asyncio's, its loop is not).
WITH_UVLOOP = [
    pytest.param(("asyncio", asyncio_options()), id="asyncio"),
    *_uvloop_param(),
    *([pytest.param("trio", id="trio")] if WITH_TRIO else []),
]

#: Runs the test it marks on :data:`WITH_UVLOOP` instead of the conftest's
#: ``anyio_backend`` (direct parametrisation overrides that fixture).
uvloop_too = pytest.mark.parametrize("anyio_backend", WITH_UVLOOP)


# --- waiting for the other tasks ----------------------------------------------


async def settle() -> None:
    """Return once every other task is blocked.

    The checkpoints only let freshly started tasks reach their first wait, so
    that asyncio's ``wait_all_tasks_blocked`` rarely needs its 0.1 s retry;
    the synchronisation itself is ``wait_all_tasks_blocked``.
    """
    for _ in range(5):
        await anyio.lowlevel.checkpoint()
    await anyio.wait_all_tasks_blocked()


async def wait_until_waiting(fanout: Fanout[Any], n: int) -> None:
    """Let other tasks run until ``n`` consumers wait for the next item.

    Checkpoints rather than ``wait_all_tasks_blocked``: a busy polling pull
    never lets every task block.
    """
    while fanout.statistics().waiting < n:
        await anyio.lowlevel.checkpoint()


async def checkpoints(n: int) -> None:
    """Pass ``n`` checkpoints."""
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


class PollGaveUp(Exception):
    """A busy poll inside a pull outlived the test's timeout."""


async def poll(give_up_at: float) -> None:
    """One step of a busy poll inside a pull: a checkpoint.

    Raises once ``give_up_at`` has passed, so that a bug that keeps a pull
    polling regardless of cancellation fails the test instead of hanging it.
    """
    await anyio.lowlevel.checkpoint()
    if anyio.current_time() > give_up_at:
        raise PollGaveUp


# --- sources for the fan-out tests --------------------------------------------


class Boom(Exception):
    """The source's error."""


class _Exhausted(Exception):
    """Raised by :meth:`CountingSource._next_item` where the source ends."""


class CountingSource:
    """An async iterable of ints that records every pull.

    ``aiter_calls`` counts ``__aiter__`` calls, ``pulls`` the pulls started
    (one per ``__anext__``), ``active`` those in progress, ``max_active`` the
    most ever in progress at once, ``finally_runs`` how often the generator's
    ``finally`` ran. Subclasses say how a pull gets its item.
    """

    def __init__(self) -> None:
        self.aiter_calls = 0
        self.pulls = 0
        self.active = 0
        self.max_active = 0
        self.finally_runs = 0

    async def _next_item(self) -> int:
        """The pull's item; raises :exc:`_Exhausted` where the source ends."""
        raise NotImplementedError

    def __aiter__(self) -> AsyncGenerator[int, None]:
        self.aiter_calls += 1
        return self._generate()

    async def _generate(self) -> AsyncGenerator[int, None]:
        try:
            while True:
                self.pulls += 1
                self.active += 1
                self.max_active = max(self.max_active, self.active)
                try:
                    item = await self._next_item()
                except _Exhausted:
                    return
                finally:
                    self.active -= 1
                yield item
        finally:
            self.finally_runs += 1


class Probe(CountingSource):
    """A gated source: yields the ints the test feeds it, recording every pull.

    Every pull waits on a memory object stream, so it suspends at least once
    even when an item is there; ``active`` counts the pulls blocked on it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._send, self._receive = anyio.create_memory_object_stream[int](math.inf)

    def feed(self, *items: int) -> None:
        for item in items:
            self._send.send_nowait(item)

    def end(self) -> None:
        """Make the source exhausted once the fed items are consumed."""
        self._send.close()

    def close(self) -> None:
        self._send.close()
        self._receive.close()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _next_item(self) -> int:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            raise _Exhausted from None


class Feed(CountingSource):
    """A source fed by the test: a fed item is pulled without suspending.

    With ``checkpoints``, every pull first passes that many checkpoints (so it
    suspends several times even when an item is ready). A fed exception is
    raised by its pull.
    """

    def __init__(self, *, checkpoints: int = 0) -> None:
        super().__init__()
        self.checkpoints = checkpoints
        self._queue: deque[int | BaseException] = deque()
        self._arrived: anyio.Event | None = None
        self._ended = False

    def feed(self, *items: int | BaseException) -> None:
        self._queue.extend(items)
        self._wake()

    def end(self) -> None:
        """Exhaust the source once the fed items are pulled."""
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        arrived, self._arrived = self._arrived, None
        if arrived is not None:
            arrived.set()

    async def _next_item(self) -> int:
        for _ in range(self.checkpoints):
            await anyio.lowlevel.checkpoint()
        while not self._queue:
            if self._ended:
                raise _Exhausted
            arrived = self._arrived = anyio.Event()
            await arrived.wait()
        item = self._queue.popleft()
        if isinstance(item, BaseException):
            raise item
        return item


class PullTasks:
    """Which task ran each step of each pull, as the source reports it.

    The source calls :meth:`begin` where a pull begins (the generator's start
    and right after each ``yield``) and :meth:`step` after each suspension.
    """

    def __init__(self) -> None:
        #: Per pull, the task of each of its steps, in order.
        self.pulls: list[list[object]] = []

    def begin(self) -> None:
        self.pulls.append([current_task()])

    def step(self) -> None:
        self.pulls[-1].append(current_task())

    @property
    def current(self) -> object:
        """The task of the pull the source is in (or was last in)."""
        return self.pulls[-1][0]

    def check(self, consumer_tasks: Iterable[object], pulls: int) -> None:
        """Assert that there were ``pulls`` pulls, each of whose steps ran in
        one task, which is none of ``consumer_tasks``."""
        assert len(self.pulls) == pulls
        split = [
            index
            for index, tasks in enumerate(self.pulls)
            if any(task is not tasks[0] for task in tasks)
        ]
        assert split == []  # no pull changed task between its steps
        consumers = {id(task) for task in consumer_tasks}
        in_a_consumer = [
            index for index, tasks in enumerate(self.pulls) if id(tasks[0]) in consumers
        ]
        assert in_a_consumer == []


async def counting_source(n: int) -> AsyncGenerator[int, None]:
    for item in range(n):
        await anyio.lowlevel.checkpoint()
        yield item


@attrs.define
class NumbersIterator:
    """A class-based async iterator (not a generator) recording ``aclose`` calls."""

    owner: NumbersIterable
    next_item: int = 0

    def __aiter__(self) -> NumbersIterator:
        return self

    async def __anext__(self) -> int:
        await anyio.lowlevel.checkpoint()
        if self.next_item >= self.owner.n:
            raise StopAsyncIteration
        self.next_item += 1
        return self.next_item - 1

    async def aclose(self) -> None:
        self.owner.aclose_calls += 1


@attrs.define
class NumbersIterable:
    """An async iterable class yielding ``range(n)`` from a fresh iterator each time."""

    n: int
    aiter_calls: int = 0
    aclose_calls: int = 0

    def __aiter__(self) -> AsyncIterator[int]:
        self.aiter_calls += 1
        return NumbersIterator(self)


# --- async for ----------------------------------------------------------------


Leaving = Literal["break", "raise", "cancel"]
LEAVING: list[Leaving] = ["break", "raise", "cancel"]


class Leave(Exception):
    """Raised in an ``async for`` body to leave the loop with an exception."""


async def loop_take(
    consumer: AsyncIterable[T], n: int, leave: Leaving = "break"
) -> list[T]:
    """Read ``n`` items with one ``async for`` loop, then leave it as ``leave`` says:
    ``break``, raise from the body, or cancel the loop's scope from the body
    (the loop is left by the cancellation, at the body's next checkpoint)."""
    got: list[T] = []
    with anyio.fail_after(TIMEOUT):
        with anyio.CancelScope() as scope:
            try:
                async for item in consumer:
                    got.append(item)
                    if len(got) == n:
                        if leave == "raise":
                            raise Leave
                        if leave == "cancel":
                            scope.cancel()
                            await anyio.lowlevel.checkpoint()
                            pytest.fail("the cancellation did not leave the loop")
                        break
            except Leave:
                pass
        assert scope.cancelled_caught == (leave == "cancel")
    return got


async def read_until_raises(
    iterable: AsyncIterable[T],
    on_item: Callable[[T], Awaitable[None]] | None = None,
) -> tuple[list[T], Exception]:
    """Iterate with one ``async for`` loop until it raises: the items, the error.

    ``on_item`` runs in the loop's body after each item. Fails if the loop
    ends without an exception, or runs away (``fail_after`` cannot stop a loop
    that never suspends).
    """
    got: list[T] = []
    with anyio.fail_after(TIMEOUT):
        try:
            async for item in iterable:
                got.append(item)
                if len(got) > RUNAWAY:
                    pytest.fail(f"the loop ran away: {got[:5]}...")
                if on_item is not None:
                    await on_item(item)
        except Exception as error:
            return got, error
    pytest.fail(f"the loop ended without an error, after {got}")


async def read_in_loops(
    consumer: AsyncIterable[T], n: int, every: int, into: list[T], pace: int = 0
) -> None:
    """Append ``n`` items to ``into``, with ``async for`` loops left every
    ``every`` items; after each item, pass ``pace`` checkpoints."""
    while len(into) < n:
        size = min(every, n - len(into))
        async for item in consumer:
            into.append(item)
            for _ in range(pace):
                await anyio.lowlevel.checkpoint()
            size -= 1
            if size == 0:
                break


async def join(stub: type[StreamStub], *consumers: Any, first: DiscoveryEvent) -> None:
    """Make the consumers join: each reads ``first``, pushed once all of them wait."""
    got: list[list[DiscoveryEvent]] = []

    async def read(consumer: Any) -> None:
        got.append(await take(consumer, 1))

    async with anyio.create_task_group() as tg:
        for consumer in consumers:
            tg.start_soon(read, consumer)
        await anyio.wait_all_tasks_blocked()
        stub.instances[-1].push(first)
    assert [pairs(events) for events in got] == [pairs([first])] * len(consumers)
