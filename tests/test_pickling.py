"""Pickling a ``SharedSubscription`` (and an ``afilter`` over one).

A pickled subscription is rebuilt by calling its class again, so the copy is
equal to the original and attaches to whatever pool is current where it is
iterated: in the same pool it shares the original's raw instance.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import ClassVar

import anyio
import cloudpickle
import pytest
import wool
from _loops import asyncio_only
from _redis import RedisServer
from redis_views import fake_worker
from subscribers import NamedSubscriber
from subscribers import announcement
from subscribers import first_uid
from subscribers import uid_of
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import SharedDiscovery
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import afilter
from wool_pooling import shared_subscription
from wool_pooling.redis import RedisDiscovery

# Sync tests are ignored by anyio's plugin despite this mark.
pytestmark = pytest.mark.anyio

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _fresh_instances() -> Iterator[None]:
    NamedSubscriber.instances.clear()
    yield
    NamedSubscriber.instances.clear()


def test_cloudpickle_roundtrip_is_equal() -> None:
    """A cloudpickle roundtrip returns an equal SharedSubscription."""
    sub = NamedSubscriber("a", size=2)

    copy = cloudpickle.loads(cloudpickle.dumps(sub))

    assert type(copy) is SharedSubscription
    assert copy is not sub
    assert copy == sub
    assert hash(copy) == hash(sub)
    assert copy.cls is NamedSubscriber
    assert copy.key == sub.key
    assert NamedSubscriber.instances == []


async def test_cloudpickled_copy_shares_the_raw_instance_in_the_same_pool() -> None:
    """The copy, iterated in the same pool, shares the raw instance."""
    sub = NamedSubscriber("a")
    async with SubscriptionPool() as pool, aiter(sub) as original:
        original_seen = await first_uid(original)
        copy = cloudpickle.loads(cloudpickle.dumps(sub))
        async with aiter(copy) as copied:
            assert await first_uid(copied) == original_seen
            assert len(NamedSubscriber.instances) == 1
            assert original_seen == uid_of(NamedSubscriber.instances[0])
            assert pool.statistics().entries == 1
            assert pool.statistics().consumers == 2


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(("a",), {}), (("a", 3), {}), ((), {"name": "a", "size": 3})],
    ids=["positional", "positional-default-overridden", "keywords"],
)
def test_plain_pickle_roundtrip_of_an_importable_class(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Plain ``pickle`` roundtrips a subscription whose class is importable."""
    sub = NamedSubscriber(*args, **kwargs)

    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        copy = pickle.loads(pickle.dumps(sub, protocol=protocol))
        assert type(copy) is SharedSubscription
        assert copy == sub
        assert copy.cls is NamedSubscriber
        assert copy.args == sub.args
        assert copy.kwargs == sub.kwargs
    assert NamedSubscriber.instances == []


async def test_plain_pickled_copy_shares_the_raw_instance_in_the_same_pool() -> None:
    """A plain-pickle copy iterated in the same pool shares the raw instance."""
    sub = NamedSubscriber("a")
    copy = pickle.loads(pickle.dumps(sub))
    async with SubscriptionPool(), aiter(sub) as original, aiter(copy) as copied:
        assert await first_uid(original) == await first_uid(copied)
        assert len(NamedSubscriber.instances) == 1


async def test_local_class_roundtrips_with_cloudpickle() -> None:
    """A decorated class defined inside a function roundtrips with cloudpickle."""

    @shared_subscription(key=lambda cls, name, **_: name)
    class Local:
        built: ClassVar[list[Any]] = []

        def __init__(self, name: str, *, extra: int = 0) -> None:
            self.name = name
            self.extra = extra
            Local.built.append(self)

        def __aiter__(self) -> Any:
            return self._stream()

        async def _stream(self) -> Any:
            yield announcement(self)
            await anyio.sleep_forever()

    sub = Local("a", extra=1)
    copy = cloudpickle.loads(cloudpickle.dumps(sub))

    assert type(copy) is SharedSubscription
    assert copy == sub
    assert copy.key == "a"
    assert Local.built == []
    async with SubscriptionPool(), aiter(sub) as original, aiter(copy) as copied:
        assert await first_uid(original) == await first_uid(copied)
        assert len(Local.built) == 1
        assert Local.built[0].extra == 1


def _generator() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    "make_argument",
    [threading.Lock, _generator],
    ids=["lock", "generator"],
)
@pytest.mark.parametrize(
    "dumps",
    [cloudpickle.dumps, pickle.dumps],
    ids=["cloudpickle", "pickle"],
)
def test_unpicklable_argument_raises_type_error_naming_the_class(
    make_argument: Any, dumps: Any
) -> None:
    """An unpicklable constructor argument fails at dumps time, naming the class."""
    sub = NamedSubscriber(make_argument())

    with pytest.raises(TypeError, match="NamedSubscriber"):
        dumps(sub)


def test_unpicklable_keyword_argument_raises_type_error_naming_the_class() -> None:
    """An unpicklable keyword argument fails at dumps time, naming the class."""
    sub = NamedSubscriber(name="a", size=threading.Lock())  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="NamedSubscriber"):
        cloudpickle.dumps(sub)


async def test_copy_in_a_fresh_pool_builds_its_own_raw_instance() -> None:
    """Unpickled in another pool's context, a copy builds a raw instance there."""
    sub = NamedSubscriber("a")
    data = cloudpickle.dumps(sub)
    async with SubscriptionPool() as outer, aiter(sub) as original:
        original_seen = await first_uid(original)
        async with SubscriptionPool() as inner:
            copy = cloudpickle.loads(data)
            assert copy == sub
            async with aiter(copy) as copied:
                copied_seen = await first_uid(copied)
                assert copied_seen != original_seen
                assert len(NamedSubscriber.instances) == 2
                assert copied_seen == uid_of(NamedSubscriber.instances[1])
                assert inner.statistics().entries == 1
                assert outer.statistics().entries == 1
        assert inner.statistics().entries == 0
        assert NamedSubscriber.instances[1].closed == 1
        assert NamedSubscriber.instances[0].closed == 0
        assert outer.statistics().consumers == 1


def test_unpickling_needs_no_running_event_loop() -> None:
    """Unpickling (plain or cloudpickle) works without any event loop or pool."""
    sub = NamedSubscriber("a")
    assert cloudpickle.loads(cloudpickle.dumps(sub)) == sub
    assert pickle.loads(pickle.dumps(sub)) == sub
    assert NamedSubscriber.instances == []


def test_unpickling_in_a_plain_thread() -> None:
    """Unpickling works in a thread that runs no event loop."""
    data = cloudpickle.dumps(NamedSubscriber("a"))
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(cloudpickle.loads(data)))
    thread.start()
    thread.join(timeout=5)
    assert results == [NamedSubscriber("a")]


def passes(metadata: WorkerMetadata) -> bool:
    return metadata.pid == 1


async def test_afilter_over_a_subscription_roundtrips_and_iterates() -> None:
    """``afilter(pred, sub)`` roundtrips through cloudpickle and iterates."""
    sub = NamedSubscriber("f")
    filtered = afilter(passes, sub)
    lambda_filtered = afilter(lambda metadata: metadata.pid == 1, sub)

    copy = cloudpickle.loads(cloudpickle.dumps(filtered))
    lambda_copy = cloudpickle.loads(cloudpickle.dumps(lambda_filtered))

    assert isinstance(copy, afilter)
    assert copy.inner == sub
    assert type(copy.inner) is SharedSubscription
    assert copy.predicate is passes
    assert NamedSubscriber.instances == []
    async with SubscriptionPool() as pool:
        original = aiter(filtered)
        copied = aiter(copy)
        copied_lambda = aiter(lambda_copy)
        try:
            with anyio.fail_after(5):
                events: list[DiscoveryEvent] = [
                    await original.__anext__(),
                    await copied.__anext__(),
                    await copied_lambda.__anext__(),
                ]
            assert len(NamedSubscriber.instances) == 1
            expected = uid_of(NamedSubscriber.instances[0])
            assert [(e.type, e.metadata.uid) for e in events] == [
                ("worker-added", expected)
            ] * 3
            assert pool.statistics().consumers == 3
        finally:
            await original.aclose()
            await copied.aclose()
            await copied_lambda.aclose()
        assert pool.statistics().entries == 0
        assert NamedSubscriber.instances[0].closed == 1


CHILD = """
import sys

import cloudpickle
from subscribers import NamedSubscriber

obj = cloudpickle.loads(sys.stdin.buffer.read())
print(type(obj).__name__)
print(repr(obj.key))
print(obj == NamedSubscriber("remote", size=3))
print(obj.cls is NamedSubscriber)
print(len(NamedSubscriber.instances))
"""


def test_cloudpickled_subscription_unpickles_in_a_child_process() -> None:
    """A cloudpickled subscription unpickles in another process as an equal one."""
    sub = NamedSubscriber("remote", 3)
    data = cloudpickle.dumps(sub)
    pythonpath = os.pathsep.join(
        [str(TESTS_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    )

    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=data,
        capture_output=True,
        cwd=TESTS_DIR,
        env={**os.environ, "PYTHONPATH": pythonpath},
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().split("\n")[:-1] == [
        "SharedSubscription",
        repr(sub.key),
        "True",
        "True",
        "0",
    ]


# -- a SharedDiscovery ships a recipe, never the discovery the pools entered ----

#: Run in a fresh interpreter: unpickle the file named by argv[1] with wool's
#: deserializer, counting what the unpickling creates. The counters wrap the
#: public classes and functions that an attach or a connection goes through.
UNPICKLE_AND_COUNT = r"""
import json
import multiprocessing.resource_tracker as resource_tracker
import multiprocessing.shared_memory as shared_memory
import sys

import redis.asyncio
import redis.asyncio.connection
import wool

counts = dict.fromkeys(
    ("shared_memory", "tracker_registrations", "redis_clients", "connection_pools",
     "connections"), 0)

def counting(name, function):
    def wrapper(*args, **kwargs):
        counts[name] += 1
        return function(*args, **kwargs)
    return wrapper

shared_memory.SharedMemory.__init__ = counting(
    "shared_memory", shared_memory.SharedMemory.__init__)
resource_tracker.register = counting(
    "tracker_registrations", resource_tracker.register)
for cls, name in (
    (redis.asyncio.Redis, "redis_clients"),
    (redis.asyncio.ConnectionPool, "connection_pools"),
    (redis.asyncio.connection.AbstractConnection, "connections"),
):
    cls.__init__ = counting(name, cls.__init__)

with open(sys.argv[1], "rb") as data:
    copy = wool.CloudpickleSerializer().loads(data.read())
counts["type"] = type(copy).__qualname__
print(json.dumps(counts))
"""


def unpickle_and_count(data: bytes, tmp_path: Path) -> dict[str, Any]:
    """Unpickle ``data`` in a fresh interpreter; what its unpickling created."""
    path = tmp_path / f"{uuid.uuid4().hex}.pickle"
    path.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", UNPICKLE_AND_COUNT, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def proxy_bytes(discovery: Any) -> bytes:
    """A wool proxy on ``discovery``'s subscriber, as wool pickles it into a task."""
    proxy = wool.WorkerProxy(discovery=discovery.subscriber)
    return wool.CloudpickleSerializer().dumps(proxy)


NOTHING_CREATED = {
    "shared_memory": 0,
    "tracker_registrations": 0,
    "redis_clients": 0,
    "connection_pools": 0,
    "connections": 0,
}


def test_entered_local_discovery_proxy_pickles_as_small_as_the_raw_one() -> None:
    """A proxy on an entered SharedDiscovery(LocalDiscovery) pickles within 10%
    of the raw LocalDiscovery proxy's size."""
    namespace = f"size-{uuid.uuid4().hex}"
    raw = wool.LocalDiscovery(namespace)
    shared = SharedDiscovery(wool.LocalDiscovery(namespace))
    with raw, shared:
        raw_size = len(proxy_bytes(raw))
        pooled_size = len(proxy_bytes(shared))
        shared_size = len(cloudpickle.dumps(shared))
    assert pooled_size <= raw_size * 1.1, (pooled_size, raw_size)
    # The wrapper itself: its recipe and options, nothing entered.
    assert shared_size <= raw_size, (shared_size, raw_size)


def test_unpickling_an_entered_local_discovery_proxy_attaches_nothing(
    tmp_path: Path,
) -> None:
    """Unpickling a proxy (and a SharedDiscovery) of an entered LocalDiscovery
    creates no SharedMemory and registers nothing with the resource tracker."""
    inner = wool.LocalDiscovery(f"attach-{uuid.uuid4().hex}", capacity=64)
    shared = SharedDiscovery(inner, poll_interval=0.5)
    with shared:
        proxy, wrapper = proxy_bytes(shared), cloudpickle.dumps(shared)
        assert unpickle_and_count(proxy, tmp_path) == {
            **NOTHING_CREATED,
            "type": "WorkerProxy",
        }
        assert unpickle_and_count(wrapper, tmp_path) == {
            **NOTHING_CREATED,
            "type": "SyncSharedDiscovery",
        }
        copy = cloudpickle.loads(wrapper)
    assert copy.entered == 0
    assert copy.inner == inner
    assert copy.inner is not inner
    assert copy.subscriber == shared.subscriber  # the same pool key
    assert hash(copy.subscriber) == hash(shared.subscriber)


def test_lan_discovery_travels_as_its_constructor_arguments() -> None:
    """A SharedDiscovery(LanDiscovery) pickles as an equal, fresh LanDiscovery."""
    inner = wool.LanDiscovery(f"lan-{uuid.uuid4().hex[:8]}", advertise_host="10.0.0.5")
    shared = SharedDiscovery(inner)
    for dumps in (cloudpickle.dumps, pickle.dumps):
        copy = pickle.loads(dumps(shared.subscriber))
        assert copy == shared.subscriber
        rebuilt = pickle.loads(dumps(shared)).inner
        assert rebuilt == inner
        assert rebuilt is not inner
        assert rebuilt.publisher.bind_host == inner.publisher.bind_host


class _Entered:
    """A discovery without a ``__reduce__``, whose entering opens something."""

    publisher: Any = None

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def subscribe(self, filter: Any = None) -> Any:
        raise NotImplementedError


class _Unshippable(_Entered):
    """A discovery without a ``__reduce__`` whose subscriber does not pickle."""

    def subscribe(self, filter: Any = None) -> Any:
        return self  # it holds a lock


class _Wrapper(_Entered):
    """A discovery without a ``__reduce__`` (holding a lock, so it cannot be
    pickled whole) whose subscriber pickles: wool's LocalDiscovery's."""

    def __init__(self, namespace: str) -> None:
        super().__init__()
        self.inner = wool.LocalDiscovery(namespace)

    def subscribe(self, filter: Any = None, **options: Any) -> Any:
        return self.inner.subscribe(filter, **options)


def test_a_discovery_that_cannot_be_shipped_fails_at_construction() -> None:
    """SharedDiscovery(...) of a discovery with no recipe and no __reduce__,
    whose subscribe() fails or returns what does not pickle, raises a
    TypeError naming the class and the __reduce__ to add."""
    for inner, cause in (
        (_Unshippable(), "that _Unshippable does not pickle"),
        (_Entered(), "subscribe() raised NotImplementedError()"),
    ):
        with pytest.raises(TypeError) as raised:
            SharedDiscovery(inner)  # type: ignore[arg-type]
        message = str(raised.value)
        name = type(inner).__qualname__
        assert f"SharedDiscovery cannot ship a {name} to worker processes" in message
        assert cause in message
        assert f"add a __reduce__ to {name}" in message


def test_a_discovery_without_reduce_travels_as_its_subscriber() -> None:
    """The subscriptions of a SharedDiscovery over a discovery that cannot be
    pickled carry what its subscribe() returns: copies are equal to each
    other (one upstream per process), their upstream iterates that subscriber,
    and the discovery itself is never pickled."""
    namespace = f"ship-{uuid.uuid4().hex}"
    inner = _Wrapper(namespace)
    shared = SharedDiscovery(inner, poll_interval=0.5)  # type: ignore[arg-type]
    subscriber = inner.subscribe(poll_interval=0.5)
    for dumps in (cloudpickle.dumps, pickle.dumps):
        data = dumps(shared.subscriber)
        first, second = pickle.loads(data), pickle.loads(data)
        assert first == second
        assert hash(first) == hash(second)
        assert first != shared.subscriber  # a different process's key
        (portable,), _ = first.args, first.kwargs
        options = portable.options
        assert options == (("poll_interval", 0.5),)
        # What the upstream iterates is a copy of the subscriber.
        copied = portable.discovery.subscribe(**dict(options))
        assert type(copied) is type(subscriber)
        assert copied.__reduce__() == subscriber.__reduce__()
        again = pickle.loads(dumps(first))  # and it travels on, to a nested dispatch
        assert again == first
        filtered = pickle.loads(dumps(shared.subscribe(_is_even_pid)))
        assert filtered.inner == first


def _is_even_pid(metadata: WorkerMetadata) -> bool:
    return metadata.pid % 2 == 0


def test_a_shared_discovery_that_ships_subscribers_does_not_pickle_itself() -> None:
    """Pickling the SharedDiscovery itself (never done by wool) over a
    discovery that cannot travel is a TypeError naming the class."""
    shared = SharedDiscovery(_Wrapper(f"ship-{uuid.uuid4().hex}"))  # type: ignore[arg-type]
    for dumps in (cloudpickle.dumps, pickle.dumps):
        with pytest.raises(TypeError, match="SharedDiscovery of a _Wrapper"):
            dumps(shared)


def test_a_discovery_with_its_own_reduce_travels_by_it() -> None:
    """A discovery with a __reduce__ of its own is pickled by it."""

    class Reduced(_Entered):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Reduced) and other.name == self.name

        def __hash__(self) -> int:
            return hash(self.name)

        def __reduce__(self) -> tuple[Any, ...]:
            return (Reduced, (self.name,))

    shared = SharedDiscovery(Reduced("a"))  # type: ignore[arg-type]
    copy = cloudpickle.loads(cloudpickle.dumps(shared.subscriber))
    assert copy == shared.subscriber
    assert cloudpickle.loads(cloudpickle.dumps(shared)).inner == Reduced("a")


@asyncio_only
async def test_a_live_redis_discovery_proxy_carries_no_connection(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A proxy on SharedDiscovery(RedisDiscovery), its subscription live,
    pickles without a client or connection, and unpickles opening none."""
    inner = RedisDiscovery(redis_server.url, f"pickle-{uuid.uuid4().hex[:12]}")
    shared = SharedDiscovery(inner)
    worker = fake_worker()
    with anyio.fail_after(20):
        async with inner.publisher as publisher, aiter(shared.subscriber) as live:
            await publisher.publish("worker-added", worker)
            event = await anext(live)
            assert event.metadata.uid == worker.uid  # the subscription is live
            proxy, wrapper = proxy_bytes(shared), cloudpickle.dumps(shared)
            for data in (proxy, wrapper):
                assert b"redis.asyncio" not in data
            counted = await anyio.to_thread.run_sync(
                unpickle_and_count, proxy, tmp_path
            )
            assert counted == {**NOTHING_CREATED, "type": "WorkerProxy"}
            copy = cloudpickle.loads(wrapper)
    assert copy.inner == inner
    assert copy.subscriber == shared.subscriber
