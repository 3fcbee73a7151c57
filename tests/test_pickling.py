"""Pickling a ``SharedSubscription`` (and an ``afilter`` over one).

A pickled subscription is rebuilt by calling its class again, so the copy is
equal to the original and attaches to whatever pool is current where it is
iterated: in the same pool it shares the original's raw instance.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import ClassVar

import anyio
import cloudpickle
import pytest
from subscribers import NamedSubscriber
from subscribers import announcement
from subscribers import first_uid
from subscribers import uid_of
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import afilter
from wool_pooling import shared_subscription

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
