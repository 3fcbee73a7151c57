"""``SharedDiscovery``: the wrapper, against fake inner discoveries.

The fakes stand in for a wool discovery: ``subscribe(**options)`` records its
options and returns a :class:`~_stubs.StreamStub` the test feeds, so each test
sees how many upstreams were built and decides when each event arrives.
Everything here runs on asyncio and on trio (real wool pools, asyncio-only,
are exercised by ``test_wool_e2e.py``).
"""

from __future__ import annotations

import contextlib
import pickle
import uuid
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any
from typing import ClassVar

import anyio
import cloudpickle
import pytest
import wool
from _stubs import StreamStub
from _stubs import ev
from _stubs import meta
from _stubs import pairs
from wool import DiscoveryEvent
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata

from wool_pooling import SharedDiscovery
from wool_pooling import SharedDiscoveryStatistics
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import SubscriptionStatistics
from wool_pooling import SyncSharedDiscovery
from wool_pooling import afilter
from wool_pooling._wool.shared_discovery import merge

pytestmark = pytest.mark.anyio


class FakePublisher:
    bind_host = "127.0.0.1"

    async def publish(self, type: str, metadata: WorkerMetadata) -> None:
        raise NotImplementedError


class FakeDiscovery:
    """A picklable fake discovery, equal by name; its state lives in a registry."""

    subscribe_calls: ClassVar[dict[str, list[dict[str, Any]]]] = {}
    upstreams: ClassVar[dict[str, list[StreamStub]]] = {}
    publishers: ClassVar[dict[str, FakePublisher]] = {}

    def __init__(self, name: str | None = None) -> None:
        self.name = name or uuid.uuid4().hex
        self.subscribe_calls.setdefault(self.name, [])
        self.upstreams.setdefault(self.name, [])
        self.publishers.setdefault(self.name, FakePublisher())

    @property
    def calls(self) -> list[dict[str, Any]]:
        return self.subscribe_calls[self.name]

    @property
    def built(self) -> list[StreamStub]:
        return self.upstreams[self.name]

    @property
    def publisher(self) -> FakePublisher:
        return self.publishers[self.name]

    @property
    def subscriber(self) -> Any:
        return self.subscribe()

    def subscribe(self, filter: Any = None, **options: Any) -> Any:
        assert filter is None, "SharedDiscovery subscribes its upstream unfiltered"
        self.calls.append(options)
        return self._make(StreamStub(self.name))

    def _make(self, upstream: StreamStub) -> Any:
        self.built.append(upstream)
        return upstream

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.name == self.name  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.name))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name,))


class UnhashableDiscovery(FakeDiscovery):
    """Equal by name but unhashable: shared by identity only."""

    __hash__ = None  # type: ignore[assignment]


class AsyncContextSubscriberDiscovery(FakeDiscovery):
    """``subscribe()`` returns an async context manager yielding the stream."""

    entered: ClassVar[int] = 0
    exited: ClassVar[int] = 0

    def _make(self, upstream: StreamStub) -> Any:
        discovery = self

        class Context:
            async def __aenter__(self) -> StreamStub:
                type(discovery).entered += 1
                return FakeDiscovery._make(discovery, upstream)

            async def __aexit__(self, *exc_info: object) -> None:
                # A real await first: an exit cut short by cancellation is seen.
                await anyio.lowlevel.checkpoint()
                type(discovery).exited += 1

        return Context()


class FactorySubscriberDiscovery(FakeDiscovery):
    """``subscribe()`` returns a callable returning the stream (a wool Factory)."""

    def _make(self, upstream: StreamStub) -> Any:
        return lambda: FakeDiscovery._make(self, upstream)


class SyncContextSubscriberDiscovery(FakeDiscovery):
    """``subscribe()`` returns a synchronous context manager yielding the stream."""

    def _make(self, upstream: StreamStub) -> Any:
        @contextlib.contextmanager
        def context() -> Iterator[StreamStub]:
            yield FakeDiscovery._make(self, upstream)

        return context()


class AwaitableSubscriberDiscovery(FakeDiscovery):
    """``subscribe()`` returns a coroutine resolving to the stream."""

    def _make(self, upstream: StreamStub) -> Any:
        async def resolve() -> StreamStub:
            return FakeDiscovery._make(self, upstream)

        return resolve()


class SyncContextDiscovery(FakeDiscovery):
    """A discovery that is a synchronous context manager, like LocalDiscovery."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.enters = 0
        self.exits: list[type[BaseException] | None] = []

    def __enter__(self) -> SyncContextDiscovery:
        self.enters += 1
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self.exits.append(exc_type)


class AsyncContextDiscovery(FakeDiscovery):
    """A discovery that is an async context manager; its enter waits for ``gate``."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.enters = 0
        self.exits = 0
        self.gate: anyio.Event | None = None
        self.failures: list[BaseException] = []

    async def __aenter__(self) -> AsyncContextDiscovery:
        self.enters += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.exits += 1
        await anyio.lowlevel.checkpoint()


def assert_one_upstream(inner: FakeDiscovery) -> None:
    """One upstream served every consumer; any other was a rescan, now closed.

    Consumers started together share the first upstream; one that joins once
    its first scan has begun (with tasks started eagerly, the next one does)
    has the inner discovery scanned once more, for a moment.
    """
    first, *rescans = inner.built
    assert first.finally_runs == 1
    assert all(rescan.finally_runs == 1 for rescan in rescans)
    assert len(rescans) <= 1


async def take(
    subscription: Any, count: int, into: dict[str, list[DiscoveryEvent]], name: str
) -> None:
    """Read ``count`` events from a new iteration of ``subscription``; close it."""
    iterator = aiter(subscription)
    try:
        into[name] = [await anext(iterator) for _ in range(count)]
    finally:
        await iterator.aclose()


async def step(iterator: AsyncIterator[DiscoveryEvent]) -> None:
    """Take one event (the first ``__anext__`` joins the shared upstream)."""
    await anext(iterator)


def even_pid(metadata: WorkerMetadata) -> bool:
    return metadata.pid % 2 == 0


async def test_filtered_subscribers_share_one_unfiltered_upstream() -> None:
    """Subscribers with different filters share one upstream; each sees its view."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner, poll_interval=0.5)
    one, two = meta(pid=1), meta(pid=2)
    got: dict[str, list[DiscoveryEvent]] = {}
    with anyio.fail_after(5):
        async with SubscriptionPool() as pool, anyio.create_task_group() as tg:
            tg.start_soon(take, shared.subscriber, 3, got, "all")
            tg.start_soon(take, shared.subscribe(), 3, got, "all again")
            tg.start_soon(take, shared.subscribe(even_pid), 2, got, "even")
            await anyio.wait_all_tasks_blocked()
            assert inner.calls[0] == {"poll_interval": 0.5}
            assert all(call == inner.calls[0] for call in inner.calls)
            assert (pool.statistics().entries, pool.statistics().consumers) == (1, 3)
            inner.built[0].push(
                ev("worker-added", one),
                ev("worker-added", two),
                ev("worker-dropped", two),
            )
    everything = [("worker-added", one), ("worker-added", two), ("worker-dropped", two)]
    assert pairs(got["all"]) == everything
    assert pairs(got["all again"]) == everything
    assert pairs(got["even"]) == [("worker-added", two), ("worker-dropped", two)]
    assert_one_upstream(inner)


async def test_late_filtered_subscriber_gets_the_replay() -> None:
    """A filtered subscriber joining late first gets the known workers it admits."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    one, two = meta(pid=1), meta(pid=2)
    with anyio.fail_after(5):
        async with SubscriptionPool():
            early = aiter(shared.subscriber)
            first: list[DiscoveryEvent] = []

            async def read_first() -> None:
                first.append(await anext(early))

            async with anyio.create_task_group() as tg:
                tg.start_soon(read_first)
                await anyio.wait_all_tasks_blocked()
                inner.built[0].push(ev("worker-added", one), ev("worker-added", two))
            assert pairs(first) == [("worker-added", one)]
            assert pairs([await anext(early)]) == [("worker-added", two)]

            late = aiter(shared.subscribe(even_pid))
            assert pairs([await anext(late)]) == [("worker-added", two)]
            inner.built[0].push(ev("worker-dropped", two))
            assert pairs([await anext(late)]) == [("worker-dropped", two)]
            assert pairs([await anext(early)]) == [("worker-dropped", two)]
            await late.aclose()
            await early.aclose()
    # The late subscriber had the inner discovery scanned afresh once.
    assert inner.calls == [{}, {}]


async def test_upstream_is_closed_after_the_last_subscriber() -> None:
    """The upstream closes when its last subscriber ends; the next one starts fresh."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    with anyio.fail_after(5):
        async with SubscriptionPool() as pool:
            first, second = aiter(shared.subscriber), aiter(shared.subscribe(even_pid))
            worker = meta(pid=2)
            async with anyio.create_task_group() as tg:
                tg.start_soon(step, first)
                tg.start_soon(step, second)
                await anyio.wait_all_tasks_blocked()
                inner.built[0].push(ev("worker-added", worker))
            upstream = inner.built[0]
            await first.aclose()
            assert upstream.finally_runs == 0
            assert pool.statistics().entries == 1
            await second.aclose()
            assert upstream.finally_runs == 1
            assert (pool.statistics().entries, pool.statistics().consumers) == (0, 0)

            again = aiter(shared.subscriber)
            async with anyio.create_task_group() as tg:
                tg.start_soon(step, again)
                await anyio.wait_all_tasks_blocked()
                assert len(inner.built) == 2
                inner.built[1].push(ev("worker-added", worker))
            await again.aclose()
    assert inner.calls == [{}, {}]


@pytest.mark.parametrize(
    "kind",
    [
        AsyncContextSubscriberDiscovery,
        SyncContextSubscriberDiscovery,
        FactorySubscriberDiscovery,
        AwaitableSubscriberDiscovery,
    ],
)
async def test_inner_subscriber_is_resolved_like_wool_does(
    kind: type[FakeDiscovery],
) -> None:
    """A subscriber that is a context manager or factory is resolved as wool does."""
    AsyncContextSubscriberDiscovery.entered = AsyncContextSubscriberDiscovery.exited = 0
    inner = kind()
    shared = SharedDiscovery(inner)
    worker = meta()
    got: dict[str, list[DiscoveryEvent]] = {}
    with anyio.fail_after(5):
        async with SubscriptionPool() as pool:
            async with anyio.create_task_group() as tg:
                tg.start_soon(take, shared.subscriber, 1, got, "a")
                tg.start_soon(take, shared.subscribe(lambda m: True), 1, got, "b")
                await anyio.wait_all_tasks_blocked()
                inner.built[0].push(ev("worker-added", worker))
            assert pool.statistics().entries == 0
    assert pairs(got["a"]) == pairs(got["b"]) == [("worker-added", worker)]
    assert len(inner.built) == 1
    assert inner.built[0].finally_runs == 1
    if kind is AsyncContextSubscriberDiscovery:
        assert (kind.entered, kind.exited) == (1, 1)  # type: ignore[attr-defined]


async def test_inner_subscriber_is_closed_when_its_pull_is_cancelled() -> None:
    """Closing the pool mid-pull still closes the inner stream and exits its context."""
    AsyncContextSubscriberDiscovery.entered = AsyncContextSubscriberDiscovery.exited = 0
    inner = AsyncContextSubscriberDiscovery()
    shared = SharedDiscovery(inner)
    received: list[DiscoveryEvent] = []

    async def consume() -> None:
        async for event in shared.subscriber:  # ends when the pool closes
            received.append(event)  # pragma: no cover - nothing is pushed

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg, SubscriptionPool() as pool:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            assert pool.statistics().consumers == 1
            assert AsyncContextSubscriberDiscovery.entered == 1
    assert received == []
    assert inner.built[0].finally_runs == 1
    assert AsyncContextSubscriberDiscovery.exited == 1


def test_publisher_passes_through() -> None:
    """``publisher`` is the inner discovery's publisher."""
    inner = FakeDiscovery()
    assert SharedDiscovery(inner).publisher is inner.publisher


def test_is_a_wool_discovery() -> None:
    """The wrapper is a wool DiscoveryLike and hands out DiscoverySubscriberLikes."""
    shared = SharedDiscovery(FakeDiscovery())
    assert isinstance(shared, wool.DiscoveryLike)
    assert isinstance(shared.subscriber, SharedSubscription)
    assert isinstance(shared.subscriber, DiscoverySubscriberLike)
    assert shared.subscriber == shared.subscribe()
    filtered = shared.subscribe(even_pid)
    assert isinstance(filtered, afilter)
    assert isinstance(filtered, DiscoverySubscriberLike)
    assert filtered.inner == shared.subscriber


def test_bad_input_is_a_type_error() -> None:
    """An inner without ``subscribe`` or an unhashable option is a TypeError."""
    with pytest.raises(TypeError, match="wraps a wool discovery"):
        SharedDiscovery(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options must be hashable"):
        SharedDiscovery(FakeDiscovery(), tags=["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="synchronous context manager"):
        SyncSharedDiscovery(FakeDiscovery())


async def test_sync_inner_is_entered_on_first_enter_and_exited_on_last() -> None:
    """With a sync-CM inner, sync and async enters are counted together."""
    inner = SyncContextDiscovery()
    shared = SharedDiscovery(inner)
    assert isinstance(shared, SyncSharedDiscovery)
    assert isinstance(shared, AbstractContextManager)
    with shared as entered:
        assert entered is shared
        assert inner.enters == 1
        async with shared:
            with shared:
                assert (inner.enters, shared.entered) == (1, 3)
            assert inner.exits == []
        assert inner.exits == []
    assert (inner.enters, inner.exits, shared.entered) == (1, [None], 0)
    with pytest.raises(RuntimeError, match="exited more often than entered"):
        shared.__exit__(None, None, None)


async def test_last_sync_exit_passes_the_exception_on() -> None:
    """The exit that exits the inner passes it the exception, never suppressing it."""
    inner = SyncContextDiscovery()
    shared = SharedDiscovery(inner)

    async def fail_inside() -> None:
        with shared:
            async with shared:
                pass
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await fail_inside()
    assert inner.exits == [KeyError]


async def test_async_inner_is_entered_once_by_concurrent_enters() -> None:
    """Concurrent enters of an async-CM inner enter it once; the last exit exits it."""
    inner = AsyncContextDiscovery()
    shared = SharedDiscovery(inner)
    assert not isinstance(shared, AbstractContextManager)
    inner.gate = anyio.Event()
    entered = 0
    leave = anyio.Event()

    async def hold() -> None:
        nonlocal entered
        async with shared:
            entered += 1
            await leave.wait()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(hold)
            await anyio.wait_all_tasks_blocked()
            assert (inner.enters, entered, shared.entered) == (1, 0, 0)
            inner.gate.set()
            await anyio.wait_all_tasks_blocked()
            assert (inner.enters, entered, shared.entered) == (1, 3, 3)
            assert inner.exits == 0
            leave.set()
    assert (inner.enters, inner.exits, shared.entered) == (1, 1, 0)
    with pytest.raises(RuntimeError, match="exited more often than entered"):
        await shared.__aexit__(None, None, None)


async def test_failed_inner_enter_leaves_it_unentered() -> None:
    """If entering the inner fails, the enter raises and the next enter retries."""
    inner = AsyncContextDiscovery()
    inner.failures.append(OSError("no segment"))
    shared = SharedDiscovery(inner)
    with pytest.raises(OSError, match="no segment"):
        await shared.__aenter__()
    assert shared.entered == 0
    async with shared:
        assert (inner.enters, shared.entered) == (2, 1)
    assert inner.exits == 1


async def test_a_plain_inner_gives_a_counting_async_context_manager() -> None:
    """An inner that is no context manager still lets pools enter the wrapper."""
    shared = SharedDiscovery(FakeDiscovery())
    assert not isinstance(shared, AbstractContextManager)
    async with shared as entered, shared:
        assert entered is shared
        assert shared.entered == 2
    assert shared.entered == 0


@pytest.mark.parametrize("dumps", [cloudpickle.dumps, pickle.dumps])
async def test_pickled_copy_is_unentered_and_shares_the_upstream(
    dumps: Callable[[Any], bytes],
) -> None:
    """A pickled SharedDiscovery starts unentered; its subscribers share upstreams."""
    inner = SyncContextDiscovery()
    shared = SharedDiscovery(inner, poll_interval=0.25)
    with shared:
        copy = pickle.loads(dumps(shared))
    assert type(copy) is SyncSharedDiscovery
    assert copy.entered == 0
    assert copy.inner == inner
    assert copy.subscribe_options == {"poll_interval": 0.25}
    assert copy.subscriber == shared.subscriber
    with anyio.fail_after(5):
        async with SubscriptionPool() as pool, anyio.create_task_group() as tg:
            tg.start_soon(step, aiter(shared.subscriber))
            tg.start_soon(step, aiter(copy.subscriber))
            await anyio.wait_all_tasks_blocked()
            assert (pool.statistics().entries, pool.statistics().consumers) == (1, 2)
            inner.built[0].push(ev("worker-added", meta()))
    assert inner.calls == [{"poll_interval": 0.25}]


async def test_pickled_subscriptions_share_the_original_upstream() -> None:
    """Filtered subscriptions pickled with cloudpickle re-attach to the upstream."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    original = shared.subscribe(even_pid)
    copy = cloudpickle.loads(cloudpickle.dumps(original))
    assert isinstance(copy, afilter)
    assert copy.inner == original.inner
    got: dict[str, list[DiscoveryEvent]] = {}
    worker = meta(pid=4)
    with anyio.fail_after(5):
        async with SubscriptionPool() as pool, anyio.create_task_group() as tg:
            tg.start_soon(take, original, 1, got, "original")
            tg.start_soon(take, copy, 1, got, "copy")
            await anyio.wait_all_tasks_blocked()
            assert (pool.statistics().entries, pool.statistics().consumers) == (1, 2)
            inner.built[0].push(
                ev("worker-added", meta(pid=3)), ev("worker-added", worker)
            )
    assert pairs(got["original"]) == pairs(got["copy"]) == [("worker-added", worker)]
    assert_one_upstream(inner)


async def test_unhashable_inner_is_shared_by_identity() -> None:
    """An unhashable inner shares one upstream per instance, even with equal peers."""
    name = uuid.uuid4().hex
    first, twin = UnhashableDiscovery(name), UnhashableDiscovery(name)
    assert first == twin
    subscriptions = [
        SharedDiscovery(first).subscriber,
        SharedDiscovery(first).subscribe(even_pid),
        SharedDiscovery(twin).subscriber,
    ]
    with anyio.fail_after(5):
        async with SubscriptionPool() as pool, anyio.create_task_group() as tg:
            for subscription in subscriptions:
                tg.start_soon(step, aiter(subscription))
            await anyio.wait_all_tasks_blocked()
            assert (pool.statistics().entries, pool.statistics().consumers) == (2, 3)
            for upstream in first.built:
                upstream.push(ev("worker-added", meta(pid=2)))
    assert len(first.built) == 2


def test_equality_is_by_upstream_and_class() -> None:
    """Wrappers of equal discoveries with equal options are equal and hash
    alike; other options, or anything else, are not equal."""
    name = uuid.uuid4().hex
    shared = SharedDiscovery(FakeDiscovery(name), poll_interval=0.5)
    twin = SharedDiscovery(FakeDiscovery(name), poll_interval=0.5)
    assert shared == twin
    assert hash(shared) == hash(twin)
    assert shared != SharedDiscovery(FakeDiscovery(name), poll_interval=1.0)
    assert shared != object()
    assert shared.subscribe(even_pid) != object()


def test_a_local_discovery_whose_arguments_cannot_be_read_is_refused() -> None:
    """A wool discovery whose constructor arguments cannot be read back (a
    wool version storing them elsewhere) is a TypeError at construction."""
    inner = wool.LocalDiscovery(f"unread-{uuid.uuid4().hex[:8]}")
    del inner._capacity  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="cannot read 'capacity' back from"):
        SharedDiscovery(inner)


async def test_a_fresh_scan_passes_on_only_changes() -> None:
    """What the first iteration yields besides discovery events is passed on
    as it is; a joiner's fresh scan passes on only what changes the known
    workers."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    worker = meta(pid=2)
    with anyio.fail_after(5):
        async with SubscriptionPool():
            early, late = await early_and_late(shared, inner)
            got: dict[str, list[DiscoveryEvent]] = {}
            async with anyio.create_task_group() as tg:
                tg.start_soon(read, late, got, "late")
                tg.start_soon(read, early, got, "early")
                await anyio.wait_all_tasks_blocked()
                inner.built[1].push("from the scan", ev("worker-added", worker))  # type: ignore[arg-type]
            assert (
                pairs(got["late"]) == pairs(got["early"]) == [("worker-added", worker)]
            )
            inner.built[0].push("from the upstream")  # type: ignore[arg-type]
            assert await anext(late) == await anext(early) == "from the upstream"
            await late.aclose()
            await early.aclose()


def test_repr_shows_inner_options_and_enters() -> None:
    """The repr names the inner discovery, the options and the enter count."""
    inner = SyncContextDiscovery()
    shared = SharedDiscovery(inner, poll_interval=0.5)
    with shared:
        text = repr(shared)
    assert text.startswith("<SyncSharedDiscovery(")
    assert "poll_interval=0.5" in text
    assert text.endswith("[entered: 1]>")


async def read(
    iterator: AsyncIterator[DiscoveryEvent],
    into: dict[str, list[DiscoveryEvent]],
    name: str,
) -> None:
    """Read one event from a running iteration into ``into[name]``."""
    into[name] = [await anext(iterator)]


async def early_and_late(
    shared: SharedDiscovery, inner: FakeDiscovery
) -> tuple[AsyncIterator[DiscoveryEvent], AsyncIterator[DiscoveryEvent]]:
    """An early consumer of a running upstream that has reported one worker,
    and a late one that has had its replay of it (and so asked for a rescan)."""
    early = aiter(shared.subscriber)
    async with anyio.create_task_group() as tg:
        tg.start_soon(step, early)
        await anyio.wait_all_tasks_blocked()
        inner.built[0].push(ev("worker-added", meta()))
    late = aiter(shared.subscriber)
    await anext(late)
    return early, late


async def until(check: Callable[[], bool]) -> None:
    """Wait, polling, for what a background task does in real time (a rescan
    closing after its settle time)."""
    with anyio.fail_after(5):
        while not check():  # noqa: ASYNC110 - nothing to wait on: time passes
            await anyio.sleep(0.01)


async def test_a_joiner_sees_a_worker_the_upstream_never_reported() -> None:
    """A consumer joining a running upstream has the inner discovery scanned
    afresh, and gets the workers that scan finds even if the upstream's own
    iteration never reports them; the others get them once, no duplicate."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    one, two = meta(pid=1), meta(pid=2)
    with anyio.fail_after(5):
        async with SubscriptionPool():
            early = aiter(shared.subscriber)
            async with anyio.create_task_group() as tg:
                tg.start_soon(step, early)
                await anyio.wait_all_tasks_blocked()
                inner.built[0].push(ev("worker-added", one))
            # Worker two now exists; the first iteration does not notice it.
            late = aiter(shared.subscriber)
            assert pairs([await anext(late)]) == [("worker-added", one)]
            got: dict[str, list[DiscoveryEvent]] = {}
            async with anyio.create_task_group() as tg:
                tg.start_soon(read, late, got, "late")
                tg.start_soon(read, early, got, "early")
                await anyio.wait_all_tasks_blocked()
                assert len(inner.built) == 2  # the joiner's fresh scan
                inner.built[1].push(ev("worker-added", one), ev("worker-added", two))
            assert pairs(got["late"]) == [("worker-added", two)]
            assert pairs(got["early"]) == [("worker-added", two)]
            # The first iteration catching up later repeats nothing.
            inner.built[0].push(ev("worker-added", two), ev("worker-dropped", one))
            assert pairs([await anext(late)]) == [("worker-dropped", one)]
            assert pairs([await anext(early)]) == [("worker-dropped", one)]
            # The fresh scan is closed once settled; the first iteration goes on.
            await until(lambda: inner.built[1].finally_runs == 1)
            assert inner.built[0].finally_runs == 0
            await late.aclose()
            await early.aclose()
    assert inner.built[0].finally_runs == 1


async def test_statistics_count_the_rescans_of_joiners() -> None:
    """``statistics()`` is a ``SharedDiscoveryStatistics``: the upstream's
    counters, filtered consumers included, and the fresh scans joins started."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    with anyio.fail_after(5):
        async with SubscriptionPool() as pool:
            assert shared.statistics() == SharedDiscoveryStatistics()
            early, late = await early_and_late(shared, inner)
            await anyio.wait_all_tasks_blocked()  # the late one's scan started
            filtered = aiter(shared.subscribe(even_pid))
            async with anyio.create_task_group() as tg:
                tg.start_soon(step, filtered)
                await anyio.wait_all_tasks_blocked()
                inner.built[0].push(ev("worker-added", meta(pid=2)))
            counted = shared.statistics(pool)
            assert isinstance(counted, SubscriptionStatistics)
            assert (counted.consumers, counted.replays, counted.rescans) == (3, 2, 2)
            assert len(inner.built) == 3
            for iterator in (filtered, late, early):
                await iterator.aclose()


async def test_joiners_before_a_rescan_starts_share_it() -> None:
    """Consumers joining together, once the upstream runs, share one rescan."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    with anyio.fail_after(5):
        async with SubscriptionPool(), anyio.create_task_group() as tg:
            tg.start_soon(step, aiter(shared.subscriber))
            await anyio.wait_all_tasks_blocked()
            for _ in range(3):
                tg.start_soon(step, aiter(shared.subscriber))
            await anyio.wait_all_tasks_blocked()
            assert len(inner.built) == 2
            inner.built[0].push(ev("worker-added", meta()))


async def test_an_event_that_changes_nothing_is_not_passed_on() -> None:
    """A re-add with equal metadata is left out, one with new metadata is an
    update, and a drop of an unknown worker is left out."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    worker = meta(pid=1)
    moved = WorkerMetadata(
        uid=worker.uid, address="127.0.0.1:2", pid=1, version=worker.version
    )
    got: dict[str, list[DiscoveryEvent]] = {}
    with anyio.fail_after(5):
        async with SubscriptionPool(), anyio.create_task_group() as tg:
            tg.start_soon(take, shared.subscriber, 3, got, "all")
            await anyio.wait_all_tasks_blocked()
            inner.built[0].push(
                ev("worker-added", worker),
                ev("worker-updated", worker),
                ev("worker-added", worker),
                ev("worker-dropped", meta(pid=3)),
                ev("worker-added", moved),
                ev("worker-dropped", moved),
            )
    assert pairs(got["all"]) == [
        ("worker-added", worker),
        ("worker-updated", moved),
        ("worker-dropped", moved),
    ]


async def test_a_failing_rescan_disturbs_no_consumer() -> None:
    """A rescan whose iteration fails is logged and dropped; the upstream goes on."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    worker = meta()
    with anyio.fail_after(5):
        async with SubscriptionPool():
            early, late = await early_and_late(shared, inner)
            got: dict[str, list[DiscoveryEvent]] = {}
            async with anyio.create_task_group() as tg:
                tg.start_soon(read, late, got, "late")
                tg.start_soon(read, early, got, "early")
                await anyio.wait_all_tasks_blocked()
                inner.built[1].fail(OSError("scan failed"))
                await anyio.wait_all_tasks_blocked()
                inner.built[0].push(ev("worker-added", worker))
            assert pairs(got["late"]) == [("worker-added", worker)]
            assert pairs(got["early"]) == [("worker-added", worker)]
            await late.aclose()
            await early.aclose()


async def test_closing_while_a_rescan_waits_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A rescan waiting to hand on a change when the upstream closes ends
    quietly: only a failure while the upstream runs is logged."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    with anyio.fail_after(5):
        async with SubscriptionPool():
            early, late = await early_and_late(shared, inner)
            async with anyio.create_task_group() as tg:
                tg.start_soon(step, early)
                await anyio.wait_all_tasks_blocked()
                inner.built[1].push(*(ev("worker-added", meta()) for _ in range(200)))
                await anyio.wait_all_tasks_blocked()
            await late.aclose()
            await early.aclose()
    assert inner.built[1].finally_runs == 1
    assert caplog.records == []


class RepeatingDiscovery(FakeDiscovery):
    """Its one scan reports a worker, then repeats it unchanged ``REPEATS``
    times, as ``LocalDiscovery`` repeats every known worker at every scan,
    without a checkpoint in between (as it does); then marks the scan done
    and waits for the next one, which never comes."""

    REPEATS = 1000
    scanned: ClassVar[dict[str, bool]] = {}

    def subscribe(self, filter: Any = None, **options: Any) -> Any:
        self.calls.append(options)
        self.scanned[self.name] = False
        return self._scan()

    async def _scan(self) -> AsyncIterator[DiscoveryEvent]:
        worker = meta(pid=1)
        yield ev("worker-added", worker)
        for _ in range(self.REPEATS):
            yield ev("worker-updated", worker)
        self.scanned[self.name] = True
        await anyio.sleep_forever()


async def test_a_scan_is_read_through_before_its_change_reaches_a_consumer() -> None:
    """What changes nothing never waits in the upstream's buffer: by the time
    a consumer has the change a scan began with, the inner discovery has been
    read through the scan's unchanged repeats (far more than the buffer
    holds), so it is back to watching for the next change."""
    inner = RepeatingDiscovery()
    shared = SharedDiscovery(inner)
    with anyio.fail_after(5):
        async with SubscriptionPool():
            iterator = aiter(shared.subscriber)
            first = await anext(iterator)
            assert inner.scanned[inner.name]
            assert first.type == "worker-added"
            await iterator.aclose()
    assert len(inner.calls) == 1


async def test_a_change_a_closing_rescan_merged_still_reaches_every_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rescan is closed while it waits to hand on a change it has merged
    into the known workers (the buffer is full: no consumer reads): the
    change is handed on all the same, so when the first reader repeats those
    workers unchanged, as its next scan does, no consumer is left without
    one of them."""
    # The rescan stays open until closed on cue, once it waits on the buffer.
    monkeypatch.setattr(merge, "RESCAN_SETTLE", 60.0)
    readers: list[Any] = []
    reader = merge._Reader

    def recorded(main: bool) -> Any:
        readers.append(reader(main))
        return readers[-1]

    monkeypatch.setattr(merge, "_Reader", recorded)
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    found = [meta(pid=index) for index in range(200)]
    last = meta(pid=1000)
    with anyio.fail_after(10):
        async with SubscriptionPool():
            early, late = await early_and_late(shared, inner)
            got: dict[str, list[DiscoveryEvent]] = {}
            async with anyio.create_task_group() as tg:
                # A consumer waits: the upstream is pulled, the rescan starts.
                tg.start_soon(read, early, got, "early")
                await anyio.wait_all_tasks_blocked()
                assert len(inner.built) == 2
                inner.built[1].push(*(ev("worker-added", w) for w in found))
            await anyio.wait_all_tasks_blocked()
            readers[1].scope.cancel()  # it waits to hand on a change: close it
            await anyio.wait_all_tasks_blocked()
            inner.built[0].push(
                *(ev("worker-updated", worker) for worker in found),
                ev("worker-added", last),
            )
            for iterator, seen in (
                (early, {got["early"][0].metadata.uid}),
                (late, set[uuid.UUID]()),
            ):
                while last.uid not in seen:
                    event = await anext(iterator)
                    assert event.type == "worker-added"
                    seen.add(event.metadata.uid)
                assert {worker.uid for worker in found} <= seen
                await iterator.aclose()
            assert inner.built[1].finally_runs == 1


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("scan failed"),
        anyio.BrokenResourceError("inner stream broken"),
        anyio.ClosedResourceError("inner stream closed"),
        anyio.BusyResourceError("receiving from"),
        anyio.EndOfStream(),
        anyio.WouldBlock(),
    ],
    ids=lambda error: type(error).__name__,
)
async def test_a_failing_upstream_fails_every_consumer(error: Exception) -> None:
    """The inner subscriber's failure reaches every consumer, filtered or not,
    whatever its type (anyio's own exceptions included): never a clean end."""
    inner = FakeDiscovery()
    shared = SharedDiscovery(inner)
    worker = meta(pid=2)
    failures: dict[str, BaseException] = {}
    seen: dict[str, list[DiscoveryEvent]] = {}

    async def consume(name: str, subscription: Any) -> None:
        seen[name] = []
        try:
            async for event in subscription:
                seen[name].append(event)
        except Exception as failure:
            failures[name] = failure

    with anyio.fail_after(5):
        async with SubscriptionPool(), anyio.create_task_group() as tg:
            tg.start_soon(consume, "all", shared.subscriber)
            tg.start_soon(consume, "even", shared.subscribe(even_pid))
            await anyio.wait_all_tasks_blocked()
            inner.built[0].push(ev("worker-added", worker))
            inner.built[0].fail(error)
    assert pairs(seen["all"]) == pairs(seen["even"]) == [("worker-added", worker)]
    assert failures == {"all": error, "even": error}
    assert inner.built[0].finally_runs == 1
