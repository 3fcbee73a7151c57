"""``@shared_subscription`` on classes of every shape: dataclasses, ``__slots__``
without ``__weakref__``, ``__eq__`` without ``__hash__``, their own ``__new__``,
subclasses of decorated classes and of wool's own subscriber; a rebuilt entry
uses the arguments of the construction that rebuilt it."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import ClassVar

import pytest
import wool
from subscribers import Announcer
from subscribers import first_uid
from subscribers import uid_of
from wool import DiscoverySubscriberLike

from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio


async def test_dataclass_generated_init_runs_on_the_raw_instance() -> None:
    """A dataclass's generated ``__init__`` builds the raw instance's fields."""

    @shared_subscription
    @dataclasses.dataclass
    class Config(Announcer):
        name: str
        size: int = 3
        tags: tuple[str, ...] = ()

        def __post_init__(self) -> None:
            self.register()

    sub = Config("a", tags=("x",))
    assert isinstance(sub, SharedSubscription)
    assert sub == Config(name="a", size=3, tags=("x",))
    assert Config.created == []
    async with SubscriptionPool(), aiter(sub) as consumer:
        await first_uid(consumer)
        (raw,) = Config.created
        assert type(raw) is Config
        assert (raw.name, raw.size, raw.tags) == ("a", 3, ("x",))


async def test_slots_class_without_weakref_works() -> None:
    """A ``__slots__`` class without ``__weakref__`` can be pooled and iterated."""

    @shared_subscription
    class Slotted(Announcer):
        __slots__ = ("name",)

        def __init__(self, name: str) -> None:
            self.name = name
            self.register()

    assert not hasattr(Slotted, "__weakref__")
    async with (
        SubscriptionPool() as pool,
        aiter(Slotted("a")) as first,
        aiter(Slotted("a")) as second,
    ):
        assert await first_uid(first) == await first_uid(second)
        (raw,) = Slotted.created
        assert raw.name == "a"
        assert not hasattr(raw, "__dict__")
        assert pool.statistics().entries == 1
    assert pool.statistics().entries == 0


async def test_class_with_eq_but_no_hash_works() -> None:
    """A class with ``__eq__`` and no ``__hash__`` (unhashable instances) works."""

    @shared_subscription
    class EqOnly(Announcer):
        def __init__(self, name: str) -> None:
            self.name = name
            self.register()

        def __eq__(self, other: object) -> bool:
            return isinstance(other, EqOnly) and other.name == self.name

    assert EqOnly.__hash__ is None
    async with (
        SubscriptionPool() as pool,
        aiter(EqOnly("a")) as first,
        aiter(EqOnly("a")) as second,
    ):
        assert await first_uid(first) == await first_uid(second)
        (raw,) = EqOnly.created
        with pytest.raises(TypeError):
            hash(raw)
        assert pool.statistics().entries == 1
    assert pool.statistics().entries == 0


async def test_class_with_its_own_new_builds_the_raw_instance_with_it() -> None:
    """A class's own ``__new__`` (receiving the arguments) builds the raw instance."""

    @shared_subscription
    class Custom(Announcer):
        new_calls: ClassVar[list[tuple[Any, ...]]] = []

        def __new__(cls, name: str, *, size: int = 1) -> Any:
            cls.new_calls.append((cls, name, size))
            instance = super().__new__(cls)
            instance.made_by_new = True
            return instance

        def __init__(self, name: str, *, size: int = 1) -> None:
            self.name = name
            self.size = size
            self.register()

    sub = Custom("a", size=2)
    assert isinstance(sub, SharedSubscription)
    assert Custom.new_calls == []
    async with SubscriptionPool(), aiter(sub) as consumer:
        await first_uid(consumer)
        (raw,) = Custom.created
        assert type(raw) is Custom
        assert raw.made_by_new is True
        assert (raw.name, raw.size) == ("a", 2)
        assert Custom.new_calls == [(Custom, "a", 2)]


async def test_subclass_of_decorated_class_is_keyed_and_built_by_the_subclass() -> None:
    """A subclass of a decorated class pools under its own class and ``__init__``."""

    @shared_subscription
    class Base(Announcer):
        def __init__(self, name: str) -> None:
            self.name = name
            self.built_by = "Base"
            self.register()

    class Derived(Base):
        def __init__(self, name: str) -> None:
            super().__init__(name)
            self.built_by = "Derived"

    sub = Derived("a")
    assert isinstance(sub, SharedSubscription)
    assert sub.cls is Derived
    assert sub != Base("a")
    assert sub == Derived("a")
    async with (
        SubscriptionPool() as pool,
        aiter(sub) as derived,
        aiter(Base("a")) as base,
    ):
        derived_seen = await first_uid(derived)
        base_seen = await first_uid(base)
        assert derived_seen != base_seen
        (raw_derived,) = Derived.created
        (raw_base,) = Base.created
        assert type(raw_derived) is Derived
        assert raw_derived.built_by == "Derived"
        assert type(raw_base) is Base
        assert raw_base.built_by == "Base"
        assert derived_seen == uid_of(raw_derived)
        assert pool.statistics().entries == 2


def test_subclass_of_wool_local_discovery_subscriber() -> None:
    """A decorated subclass of wool's metaclass-pooled subscriber builds a real raw."""

    @shared_subscription
    class Watched(wool.LocalDiscovery.Subscriber):
        def __init__(
            self, namespace: str, *, poll_interval: float | None = None
        ) -> None:
            super().__init__(namespace, poll_interval=poll_interval)
            self.label = f"watched:{namespace}"

    sub = Watched("ns-1")
    assert type(sub) is SharedSubscription
    assert sub.cls is Watched
    assert sub == Watched(namespace="ns-1")
    assert sub != Watched("ns-2")
    assert isinstance(sub, DiscoverySubscriberLike)

    raw = sub._build_raw()
    assert type(raw) is Watched
    assert isinstance(raw, wool.LocalDiscovery.Subscriber)
    assert raw._namespace == "ns-1"
    assert raw.label == "watched:ns-1"
    # Each build is a fresh instance: wool's singleton cache was not consulted.
    assert sub._build_raw() is not raw


async def test_rebuild_after_finalization_uses_the_triggering_arguments() -> None:
    """A rebuilt entry's raw instance comes from the construction that rebuilt it."""

    @shared_subscription(key=lambda cls, name, tag: name)
    class Tagged(Announcer):
        def __init__(self, name: str, tag: str) -> None:
            self.name = name
            self.tag = tag
            self.register()

    async with SubscriptionPool() as pool:
        first_sub = Tagged("x", "one")
        second_sub = Tagged("x", "two")
        assert first_sub == second_sub

        first = aiter(first_sub)
        await first_uid(first)
        await first.aclose()
        assert pool.statistics().entries == 0

        async with aiter(second_sub) as second:
            assert await first_uid(second) == uid_of(Tagged.created[1])
        assert [raw.tag for raw in Tagged.created] == ["one", "two"]
