"""Real ``wool.WorkerPool``s on pooled subscriptions, across processes.

Every pool here discovers its workers through
``SharedDiscovery(wool.LocalDiscovery(namespace), poll_interval=POLL)``
(polling, because some filesystems report the notification file's touch as
an attribute change that wool 0.15.7 ignores) and builds its proxy eagerly
(``lazy=False``), so every pool really subscribes when it is entered.

These tests run on asyncio only: wool itself is asyncio-only (its
``LocalDiscovery.Subscriber`` and ``WorkerProxy`` use asyncio primitives), so
this module overrides ``anyio_backend``. The fixture is module-scoped so that
one worker process, started once, serves every test that can share it.

Nothing waits on timing: where a test must know that a pool has taken in a
change made in another process (a worker published or dropped through
shared memory), the pool's subscription is observed (:class:`Observed`),
and the test waits for the proxy to have handled that event.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import wool
from _loops import TEST_LOOP
from _loops import asyncio_options
from anyio.abc import TaskStatus
from e2e_routines import add
from e2e_routines import nested_add
from e2e_routines import nested_then_pool_statistics
from e2e_routines import ticks
from e2e_routines import worker_pid
from watchdog.observers.api import BaseObserver
from wool import DiscoveryEvent

from wool_pooling import SharedDiscovery
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import current_pool

pytestmark = [pytest.mark.wool_processes, pytest.mark.anyio]

#: Seconds between scans of the namespace by every LocalDiscovery subscriber.
POLL = 0.05
#: Bound on any single wait in these tests.
DEADLINE = 20


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """wool is asyncio-only: run this module on asyncio (see ``_loops``), in
    one loop.

    Under ``WOOL_POOLING_TEST_LOOP=eager`` this module runs on a plain loop:
    wool 0.15.7 itself fails under ``asyncio.eager_task_factory`` (its own
    task factory wraps every task, and a bare ``wool.WorkerPool`` dispatch
    inside an anyio task group raises "Attempted to exit a cancel scope that
    isn't the current task's current cancel scope", without this library).
    """
    if TEST_LOOP == "eager":
        return ("asyncio", {})
    return ("asyncio", asyncio_options())


@pytest.fixture(scope="module")
async def worker() -> AsyncIterator[wool.LocalWorker]:
    """One worker process shared by the tests that do not inspect its state."""
    async with running_worker() as started:
        yield started


@asynccontextmanager
async def running_worker() -> AsyncIterator[wool.LocalWorker]:
    """Start a worker process; stop it on exit."""
    started = wool.LocalWorker()
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


@asynccontextmanager
async def namespace_with(
    *workers: wool.LocalWorker,
) -> AsyncIterator[tuple[SharedDiscovery, Any]]:
    """A fresh namespace, entered, with ``workers`` published; drops them on exit.

    Yields the shared discovery and an entered publisher of it.
    """
    shared = SharedDiscovery(
        wool.LocalDiscovery(f"e2e-{uuid.uuid4().hex}"), poll_interval=POLL
    )
    async with shared:
        publisher: Any = shared.publisher
        async with publisher:
            for each in workers:
                await publisher.publish("worker-added", each.metadata)
            try:
                yield shared, publisher
            finally:
                for each in workers:
                    await publisher.publish("worker-dropped", each.metadata)


def pool_on(shared: SharedDiscovery) -> wool.WorkerPool:
    """A discovery-only pool with an eager proxy."""
    return wool.WorkerPool(discovery=shared, lazy=False)


async def hold_pool(
    shared: SharedDiscovery,
    leave: anyio.Event,
    left: anyio.Event,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Enter a pool in a task of its own; report when entered; exit on ``leave``."""
    try:
        async with pool_on(shared):
            task_status.started()
            await leave.wait()
    finally:
        left.set()


async def stream_through_own_pool(
    shared: SharedDiscovery,
    left: anyio.Event,
    *,
    task_status: TaskStatus[anyio.CancelScope] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Enter a pool and hang in a routine stream dispatched through it.

    Reports a cancel scope around the pool once the stream is running; sets
    ``left`` once the pool has exited.
    """
    try:
        with anyio.CancelScope() as scope:
            async with pool_on(shared):
                async for _ in ticks():
                    task_status.started(scope)
    finally:
        left.set()


def current_proxy() -> wool.WorkerProxy:
    """The proxy of the innermost pool entered in this context."""
    proxy = wool.__proxy__.get()
    assert proxy is not None
    return proxy


def known_uids() -> set[uuid.UUID]:
    """Uids of the workers the current proxy can dispatch to."""
    return {metadata.uid for metadata in current_proxy().workers}


class Observed:
    """A pool's discovery subscription that reports each event its proxy handled.

    Iterating it iterates the pooled subscription (no extra consumer). An
    event is reported when the proxy asks for the next one, that is once
    its sentinel has handled it (the sentinel handles an event without
    awaiting). Pickles as the bare pooled subscription, for worker processes.
    """

    def __init__(self, subscription: SharedSubscription) -> None:
        self.subscription = subscription
        self.send, self.handled = anyio.create_memory_object_stream[DiscoveryEvent](
            math.inf
        )

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self._events()

    async def _events(self) -> AsyncGenerator[DiscoveryEvent, None]:
        async for event in self.subscription:
            yield event
            self.send.send_nowait(event)

    def __reduce__(self) -> str | tuple[Any, ...]:
        return self.subscription.__reduce__()

    async def wait_handled(self, type: str, uid: uuid.UUID) -> None:
        """Wait until the proxy has handled a ``type`` event about worker ``uid``."""
        with anyio.fail_after(DEADLINE):
            async for event in self.handled:
                if (event.type, event.metadata.uid) == (type, uid):
                    return


class ObservedDiscovery:
    """``shared`` as one pool sees it: same publisher, entered with it, observed."""

    def __init__(self, shared: SharedDiscovery) -> None:
        self.shared: Any = shared
        self.observed = Observed(shared.subscriber)

    @property
    def publisher(self) -> Any:
        return self.shared.publisher

    @property
    def subscriber(self) -> Observed:
        return self.observed

    def subscribe(self, filter: Callable[..., bool] | None = None) -> Observed:
        assert filter is None
        return self.observed

    def __enter__(self) -> ObservedDiscovery:
        self.shared.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shared.__exit__(*exc_info)


def watchdog_observers() -> list[threading.Thread]:
    """The watchdog observers alive here: one per LocalDiscovery iteration."""
    return [
        thread
        for thread in threading.enumerate()
        if isinstance(thread, BaseObserver) and thread.is_alive()
    ]


def statistics() -> tuple[int, int]:
    """``(entries, consumers)`` of the current subscription pool."""
    stats = current_pool().statistics()
    return stats.entries, stats.consumers


async def test_two_pools_share_one_upstream(worker: wool.LocalWorker) -> None:
    """Two pools on one SharedDiscovery hold one entry, two consumers, and dispatch."""
    async with SubscriptionPool(), namespace_with(worker) as (shared, _):
        assert statistics() == (0, 0)
        async with pool_on(shared):
            assert statistics() == (1, 1)
            async with pool_on(shared):
                assert statistics() == (1, 2)
                # One LocalDiscovery iteration in this process: one watchdog,
                # once the second pool's fresh scan (its join's) has closed.
                with anyio.fail_after(DEADLINE):
                    while len(watchdog_observers()) != 1:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                # The namespace was entered once, by the first of three enters.
                assert shared.entered == 3
                with anyio.fail_after(DEADLINE):
                    assert await add(19, 23) == 42
                    assert await worker_pid() == worker.metadata.pid
                assert known_uids() == {worker.metadata.uid}
            assert statistics() == (1, 1)
        assert statistics() == (0, 0)
        assert shared.entered == 1


async def test_survivor_keeps_a_live_view(worker: wool.LocalWorker) -> None:
    """After the first subscriber's pool exits, the other still tracks workers."""
    async with (
        SubscriptionPool(),
        namespace_with(worker) as (shared, publisher),
        anyio.create_task_group() as tg,
    ):
        leave, left = anyio.Event(), anyio.Event()
        # The first pool's proxy subscribes first (eagerly, at its enter).
        await tg.start(hold_pool, shared, leave, left)
        assert statistics() == (1, 1)
        survivor = ObservedDiscovery(shared)
        async with wool.WorkerPool(discovery=survivor, lazy=False):
            assert statistics() == (1, 2)
            assert shared.entered == 3
            leave.set()
            with anyio.fail_after(DEADLINE):
                await left.wait()
            assert statistics() == (1, 1)
            assert shared.entered == 2

            async with running_worker() as newcomer:
                uid = newcomer.metadata.uid
                await publisher.publish("worker-added", newcomer.metadata)
                await survivor.observed.wait_handled("worker-added", uid)
                assert known_uids() == {worker.metadata.uid, uid}
                # Round robin over both workers reaches the new one.
                with anyio.fail_after(DEADLINE):
                    pids = {await worker_pid() for _ in range(2)}
                assert pids == {worker.metadata.pid, newcomer.metadata.pid}

                await publisher.publish("worker-dropped", newcomer.metadata)
                await survivor.observed.wait_handled("worker-dropped", uid)
                assert known_uids() == {worker.metadata.uid}
                with anyio.fail_after(DEADLINE):
                    pids = {await worker_pid() for _ in range(2)}
                assert pids == {worker.metadata.pid}
            assert statistics() == (1, 1)
        assert statistics() == (0, 0)


async def test_nested_dispatch_shares_one_upstream_on_the_worker() -> None:
    """Proxies of two client pools, carried into one worker, share its one upstream."""
    async with (
        running_worker() as fresh,
        SubscriptionPool(),
        namespace_with(fresh) as (shared, _),
    ):
        token = uuid.uuid4().hex
        results: dict[str, tuple[int, int, int, int]] = {}

        async def client(name: str, a: int) -> None:
            async with pool_on(shared):
                # Plain nesting first: the carried subscription finds the worker.
                assert await nested_add(a, 1) == (a + 1, fresh.metadata.pid)
                results[name] = await nested_then_pool_statistics(token, 2, a, 2)

        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client, "first", 10)
                tg.start_soon(client, "second", 20)

        # On the worker: one entry (one upstream), two consumers (two proxies).
        assert results == {
            "first": (12, fresh.metadata.pid, 1, 2),
            "second": (22, fresh.metadata.pid, 1, 2),
        }
        assert statistics() == (0, 0)


async def test_cancellation_and_exit_leave_no_orphaned_upstream(
    worker: wool.LocalWorker,
) -> None:
    """A cancelled dispatch and a pool exiting mid-stream leave no upstream behind."""
    async with (
        SubscriptionPool(),
        namespace_with(worker) as (shared, _),
        anyio.create_task_group() as tg,
    ):
        left = anyio.Event()
        # The first subscriber: a pool whose task hangs mid-stream in a routine.
        first: anyio.CancelScope = await tg.start(stream_through_own_pool, shared, left)
        async with pool_on(shared):
            assert statistics() == (1, 2)

            # Cancel a task of this pool while its dispatch is in flight.
            running = anyio.Event()

            async def dispatch_until_cancelled() -> None:
                async for _ in ticks():
                    running.set()

            with anyio.fail_after(DEADLINE):
                async with anyio.create_task_group() as dispatchers:
                    dispatchers.start_soon(dispatch_until_cancelled)
                    await running.wait()
                    dispatchers.cancel_scope.cancel()
            assert statistics() == (1, 2)
            with anyio.fail_after(DEADLINE):
                assert await add(2, 3) == 5

            # Cancel the first pool's task mid-stream: its pool exits under
            # cancellation, with a routine stream and its discovery stream live.
            first.cancel()
            with anyio.fail_after(DEADLINE):
                await left.wait()
            assert statistics() == (1, 1)
            assert shared.entered == 2
            with anyio.fail_after(DEADLINE):
                assert await add(3, 4) == 7
        assert statistics() == (0, 0)
        assert shared.entered == 1


# -- drop-in differences against wool's own per-context subscribers ----------


async def hold_tagged_pool(
    shared: SharedDiscovery,
    tag: str,
    leave: anyio.Event,
    left: anyio.Event | None = None,
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Enter ``WorkerPool(tag, spawn=1)`` on ``shared``; report its worker's pid
    once a dispatch reached it; exit on ``leave``; set ``left`` once exited."""
    try:
        async with wool.WorkerPool(tag, spawn=1, discovery=shared):
            with anyio.fail_after(DEADLINE):
                pid = await worker_pid()
            task_status.started(pid)
            await leave.wait()
    finally:
        if left is not None:
            left.set()


@pytest.mark.parametrize(
    ("options", "wool_cache"),
    [({}, False), ({"poll_interval": 3 * DEADLINE}, False), ({}, True)],
    ids=[
        "notifications-only",
        "polling-slower-than-the-deadline",
        "under-wool-s-own-subscriber-cache",
    ],
)
async def test_a_pool_started_later_sees_its_own_worker(
    options: dict[str, float], wool_cache: bool
) -> None:
    """Pool B, started in another task after pool A's upstream is running, on
    the same SharedDiscovery, dispatches to the worker it published after A
    subscribed, without waiting for the inner discovery to notice it (also
    where wool's own per-context subscriber cache is set up around both)."""
    if wool_cache:
        # wool sets up its subscriber cache in this context, for every task
        # started from it, at the first subscriber made here.
        wool.LocalDiscovery(f"e2e-{uuid.uuid4().hex}").subscribe()
    shared = SharedDiscovery(wool.LocalDiscovery(f"e2e-{uuid.uuid4().hex}"), **options)
    pids: dict[str, int] = {}

    async def second_pool(done: anyio.Event) -> None:
        async with wool.WorkerPool("b", spawn=1, discovery=shared):
            with anyio.fail_after(DEADLINE):
                pids["b"] = await worker_pid()
                pids["b again"] = await worker_pid()
        done.set()

    async with SubscriptionPool(), anyio.create_task_group() as tg:
        leave = anyio.Event()
        pids["a"] = await tg.start(hold_tagged_pool, shared, "a", leave)
        assert statistics() == (1, 1)  # A's upstream is running
        done = anyio.Event()
        tg.start_soon(second_pool, done)
        with anyio.fail_after(2 * DEADLINE):
            await done.wait()
        leave.set()
    assert pids["b"] == pids["b again"] != pids["a"]


async def test_the_pool_that_entered_first_exits_while_another_dispatches() -> None:
    """When the pool whose discovery created the namespace's segment exits
    first, another pool of that namespace keeps dispatching: no task carries
    the segment it unlinked."""
    namespace = f"e2e-{uuid.uuid4().hex}"
    owner = SharedDiscovery(wool.LocalDiscovery(namespace), poll_interval=POLL)
    other = SharedDiscovery(wool.LocalDiscovery(namespace), poll_interval=POLL)
    async with SubscriptionPool(), anyio.create_task_group() as tg:
        leave, left = anyio.Event(), anyio.Event()
        owner_pid = await tg.start(hold_tagged_pool, owner, "owner", leave, left)
        async with wool.WorkerPool("other", spawn=1, discovery=other):
            with anyio.fail_after(DEADLINE):
                other_pid = await worker_pid()
            assert other_pid != owner_pid
            leave.set()  # the owner pool exits, unlinking the segment
            with anyio.fail_after(DEADLINE):
                await left.wait()
            assert owner.entered == 0
            with anyio.fail_after(DEADLINE):
                for a in range(5):
                    assert await add(a, 1) == a + 1
                assert await worker_pid() == other_pid


class DirectDiscovery:
    """A discovery around an entered one, as a plain object: no context
    manager, no ``__reduce__``, and a lock (so it cannot be pickled whole)."""

    def __init__(self, discovery: Any) -> None:
        self._discovery = discovery
        self._lock = threading.Lock()

    @property
    def publisher(self) -> Any:
        return self._discovery.publisher

    @property
    def subscriber(self) -> Any:
        return self._discovery.subscriber

    def subscribe(self, filter: Callable[..., bool] | None = None) -> Any:
        return self._discovery.subscribe(filter)


class NamespaceDiscovery:
    """A discovery of a LocalDiscovery namespace that never enters one: no
    context manager and no ``__reduce__``, and a lock, so only what its
    ``subscribe`` returns can travel."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._lock = threading.Lock()

    @property
    def publisher(self) -> Any:
        return wool.LocalDiscovery(self.namespace).publisher

    @property
    def subscriber(self) -> Any:
        return self.subscribe()

    def subscribe(
        self, filter: Callable[..., bool] | None = None, **options: Any
    ) -> Any:
        return wool.LocalDiscovery(self.namespace).subscribe(filter, **options)


async def test_a_wrapped_entered_discovery_is_shipped_as_its_subscriber() -> None:
    """SharedDiscovery around a plain wrapper of an entered discovery (no
    ``__reduce__``) works in real pools: nested dispatch from two client
    pools finds the worker, and on the worker both proxies share one upstream."""
    namespace = f"e2e-{uuid.uuid4().hex}"
    async with running_worker() as fresh, SubscriptionPool():
        with wool.LocalDiscovery(namespace) as local:
            shared = SharedDiscovery(DirectDiscovery(local))
            publisher: Any = shared.publisher
            async with publisher:
                await publisher.publish("worker-added", fresh.metadata)
                try:
                    token = uuid.uuid4().hex
                    results: dict[str, tuple[int, int, int, int]] = {}

                    async def client(name: str, a: int) -> None:
                        async with pool_on(shared):
                            assert await nested_add(a, 1) == (a + 1, fresh.metadata.pid)
                            results[name] = await nested_then_pool_statistics(
                                token, 2, a, 2
                            )

                    with anyio.fail_after(DEADLINE):
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(client, "first", 10)
                            tg.start_soon(client, "second", 20)
                finally:
                    await publisher.publish("worker-dropped", fresh.metadata)
        # On the worker: one entry (one upstream), two consumers (two proxies).
        assert results == {
            "first": (12, fresh.metadata.pid, 1, 2),
            "second": (22, fresh.metadata.pid, 1, 2),
        }
        assert shared.entered == 0
        assert statistics() == (0, 0)


async def test_a_discovery_without_reduce_is_shipped_as_its_subscriber(
    worker: wool.LocalWorker,
) -> None:
    """SharedDiscovery around a discovery class with no ``__reduce__`` and
    subscribe options works in a real pool: a routine dispatched through it
    dispatches a nested routine from inside the worker, which finds the worker."""
    namespace = f"e2e-{uuid.uuid4().hex}"
    shared = SharedDiscovery(NamespaceDiscovery(namespace), poll_interval=POLL)
    async with SubscriptionPool():
        with wool.LocalDiscovery(namespace):
            publisher: Any = shared.publisher
            async with publisher:
                await publisher.publish("worker-added", worker.metadata)
                try:
                    async with pool_on(shared):
                        with anyio.fail_after(DEADLINE):
                            assert await nested_add(2, 3) == (5, worker.metadata.pid)
                            assert await add(1, 1) == 2
                finally:
                    await publisher.publish("worker-dropped", worker.metadata)
        assert statistics() == (0, 0)
