"""``@shared_subscription``: decoration, keys, construction and raw-instance builds.

Pins ``shared_subscription(cls=None, /, *, key=None, ttl=0.0)``: what it
accepts, how keys are made, that construction returns a ``SharedSubscription``
wrapping one raw object per key, and that constructing needs no running loop
and creates no pool (the pool is looked up at the first ``__anext__``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from typing import ClassVar

import anyio
import pytest
from subscribers import Announcer
from subscribers import first_uid
from subscribers import uid_of
from wool import DiscoverySubscriberLike

from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import current_pool
from wool_pooling import shared_subscription

# Sync tests are ignored by anyio's plugin despite this mark.
pytestmark = pytest.mark.anyio


class Boom(Exception):
    """Raised on purpose by test subscribers."""


def make_named(**options: Any) -> Any:
    """A fresh decorated class ``Named(name, size=1)`` counting ``__init__`` runs."""

    @shared_subscription(**options)
    class Named(Announcer):
        inits: ClassVar[int] = 0

        def __init__(self, name: Any, size: int = 1) -> None:
            type(self).inits += 1
            self.name = name
            self.size = size
            self.register()

    return Named


# -- decoration ---------------------------------------------------------------


def _decorate_bare(cls: type) -> Any:
    return shared_subscription(cls)


def _decorate_called(cls: type) -> Any:
    return shared_subscription()(cls)


def _decorate_with_key(cls: type) -> Any:
    return shared_subscription(key=lambda cls, name, size=1: name)(cls)


@pytest.mark.parametrize(
    "decorate",
    [_decorate_bare, _decorate_called, _decorate_with_key],
    ids=["bare", "called", "with-key"],
)
def test_each_usage_form_makes_construction_return_a_subscription(
    decorate: Callable[[type], Any],
) -> None:
    """All three decorator forms return the class itself, with no metaclass added."""

    class Plain(Announcer):
        def __init__(self, name: str, size: int = 1) -> None:
            self.name = name

    decorated = decorate(Plain)

    assert decorated is Plain
    assert type(Plain) is type
    sub = Plain("a")
    assert type(sub) is SharedSubscription
    assert sub.cls is Plain
    assert sub == Plain("a")
    assert sub != Plain("b")


def test_bare_decorator_syntax() -> None:
    """``@shared_subscription`` with no parentheses decorates the class below it."""

    @shared_subscription
    class Bare(Announcer):
        def __init__(self, name: str) -> None:
            self.name = name

    assert isinstance(Bare("a"), SharedSubscription)


def test_key_and_ttl_are_keyword_only() -> None:
    """A second positional argument is rejected: key and ttl are keyword-only."""

    class Plain(Announcer):
        pass

    with pytest.raises(TypeError):
        shared_subscription(Plain, lambda cls: 1)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        shared_subscription(None, lambda cls: 1)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        shared_subscription(Plain, None, 1.0)  # type: ignore[call-overload]
    # Nothing was installed on the class by the failed calls.
    assert not isinstance(Plain(), SharedSubscription)


def _function() -> None:
    pass


class _NoAiter:
    def __iter__(self) -> Any:
        return iter(())


class _AiterNotCallable:
    __aiter__ = None


@pytest.mark.parametrize(
    "target",
    [_function, Announcer.__new__(Announcer), _NoAiter, _AiterNotCallable, 42],
    ids=["function", "instance", "class-without-aiter", "aiter-not-callable", "int"],
)
@pytest.mark.parametrize("form", ["bare", "called"])
def test_decorating_a_non_subscriber_class_raises_type_error(
    target: Any, form: str
) -> None:
    """Only classes with ``__aiter__`` can be decorated; anything else is TypeError."""
    decorate = shared_subscription if form == "bare" else shared_subscription()
    with pytest.raises(TypeError):
        decorate(target)


def test_decorating_a_class_without_aiter_leaves_it_untouched() -> None:
    """The failed decoration of a class without ``__aiter__`` installs nothing."""

    class NoAiter:
        def __init__(self) -> None:
            self.ran = True

    with pytest.raises(TypeError, match="NoAiter"):
        shared_subscription(NoAiter)
    instance = NoAiter()
    assert isinstance(instance, NoAiter)
    assert instance.ran


@pytest.mark.parametrize(
    ("ttl", "error"),
    [
        (-1, ValueError),
        (-0.5, ValueError),
        (float("nan"), ValueError),
        ("1", TypeError),
        (None, TypeError),
    ],
    ids=["negative-int", "negative-float", "nan", "string", "none"],
)
@pytest.mark.parametrize("form", ["bare", "called"])
def test_bad_ttl_is_rejected(ttl: Any, error: type[Exception], form: str) -> None:
    """A negative or NaN ttl raises ValueError; a non-number raises TypeError."""

    class Plain(Announcer):
        pass

    def decorate() -> Any:
        if form == "bare":
            return shared_subscription(Plain, ttl=ttl)
        return shared_subscription(ttl=ttl)(Plain)

    with pytest.raises(error):
        decorate()


@pytest.mark.parametrize("name", ["key", "view"])
def test_a_key_or_view_that_is_not_callable_is_refused(name: str) -> None:
    """``key`` and ``view`` must be callable: anything else is a TypeError
    naming the parameter, before any class is decorated."""
    with pytest.raises(
        TypeError, match=rf"^shared_subscription {name} must be callable, got 5$"
    ):
        shared_subscription(**{name: 5})


@pytest.mark.parametrize("ttl", [0, 0.0, 1, 2.5])
def test_valid_ttl_is_accepted(ttl: float) -> None:
    """Zero and positive int or float ttls are accepted and reported."""
    Named = make_named(ttl=ttl)
    sub = Named("a")
    assert sub.ttl == ttl


# -- construction -------------------------------------------------------------


def test_construction_returns_a_subscription_without_running_init() -> None:
    """``Cls(...)`` returns a SharedSubscription and runs no ``__init__``."""
    Named = make_named()

    sub = Named("a", 2)

    assert isinstance(sub, SharedSubscription)
    assert not isinstance(sub, Named)
    assert Named.inits == 0
    assert Named.created == []
    assert sub.cls is Named
    assert sub.args == ("a", 2)
    assert sub.kwargs == {}


def test_subscription_is_a_discovery_subscriber() -> None:
    """A constructed subscription satisfies ``wool.DiscoverySubscriberLike``."""
    Named = make_named()
    assert isinstance(Named("a"), DiscoverySubscriberLike)


def test_key_callable_receives_class_and_arguments() -> None:
    """The key callable gets ``(cls, *args, **kwargs)``; ``sub.key`` is its result."""
    calls: list[tuple[Any, ...]] = []
    marker = object()

    def key(cls: type, *args: Any, **kwargs: Any) -> Any:
        calls.append((cls, args, kwargs))
        return ("key", marker)

    Named = make_named(key=key)
    sub = Named("a", size=3)

    assert calls == [(Named, ("a",), {"size": 3})]
    assert sub.key == ("key", marker)
    assert sub.key[1] is marker
    assert Named.inits == 0


def test_default_key_binds_positional_and_keyword_spellings_equally() -> None:
    """Without a key, ``Cls("a")`` and ``Cls(name="a")`` are equal subscriptions."""
    Named = make_named()
    assert Named("a") == Named(name="a")
    assert hash(Named("a")) == hash(Named(name="a"))
    assert Named("a", size=2) == Named(size=2, name="a")
    assert Named("a").key == Named(name="a").key


def test_default_key_applies_defaults() -> None:
    """Without a key, omitted defaults count: ``Cls("a") == Cls("a", 1)``."""
    Named = make_named()
    assert Named("a") == Named("a", 1)
    assert Named("a") == Named("a", size=1)
    assert Named("a") != Named("a", 2)


def test_default_key_rejects_arguments_that_do_not_fit_init() -> None:
    """Without a key, arguments that do not bind to ``__init__`` raise TypeError."""
    Named = make_named()
    with pytest.raises(TypeError):
        Named()
    with pytest.raises(TypeError):
        Named("a", 1, 2)
    with pytest.raises(TypeError):
        Named("a", colour="red")


async def test_positional_and_keyword_spellings_share_one_raw_instance() -> None:
    """``Cls("a")`` and ``Cls(name="a")`` iterated in one pool build one instance."""
    Named = make_named()
    async with (
        SubscriptionPool() as pool,
        aiter(Named("a")) as positional,
        aiter(Named(name="a")) as keyword,
    ):
        first = await first_uid(positional)
        second = await first_uid(keyword)
        assert Named.inits == 1
        assert first == second == uid_of(Named.created[0])
        assert pool.statistics().entries == 1
        assert pool.statistics().consumers == 2


async def test_same_arguments_share_one_raw_instance() -> None:
    """Two constructions with the same arguments wrap the same raw object."""
    Named = make_named()
    first_sub, second_sub = Named("a"), Named("a")
    assert first_sub is not second_sub
    async with (
        SubscriptionPool() as pool,
        aiter(first_sub) as first,
        aiter(second_sub) as second,
    ):
        assert await first_uid(first) == await first_uid(second)
        assert len(Named.created) == 1
        raw = Named.created[0]
        third = aiter(Named("a"))
        assert await first_uid(third) == uid_of(raw)
        await third.aclose()
        assert len(Named.created) == 1
        assert Named.created[0] is raw
        assert pool.statistics().entries == 1


async def test_different_arguments_get_different_raw_instances() -> None:
    """Constructions with different keys wrap different raw objects."""
    Named = make_named()
    assert Named("a") != Named("b")
    async with (
        SubscriptionPool() as pool,
        aiter(Named("a")) as first,
        aiter(Named("b")) as second,
    ):
        first_seen = await first_uid(first)
        second_seen = await first_uid(second)
        assert len(Named.created) == 2
        raw_a, raw_b = Named.created
        assert raw_a is not raw_b
        assert (raw_a.name, raw_b.name) == ("a", "b")
        assert first_seen == uid_of(raw_a)
        assert second_seen == uid_of(raw_b)
        assert pool.statistics().entries == 2


async def test_classes_with_the_same_key_never_share() -> None:
    """Keys are namespaced by class: equal keys of two classes are two entries."""
    One = make_named(key=lambda cls, name, size=1: name)
    Two = make_named(key=lambda cls, name, size=1: name)
    assert One("x").key == Two("x").key
    assert One("x") != Two("x")
    async with (
        SubscriptionPool() as pool,
        aiter(One("x")) as first,
        aiter(Two("x")) as second,
    ):
        first_seen = await first_uid(first)
        second_seen = await first_uid(second)
        assert first_seen != second_seen
        assert len(One.created) == 1
        assert len(Two.created) == 1
        assert first_seen == uid_of(One.created[0])
        assert second_seen == uid_of(Two.created[0])
        assert pool.statistics().entries == 2


def test_equality_and_hash_follow_class_and_key() -> None:
    """Subscriptions are equal, with equal hashes, exactly when class and key match."""
    One = make_named(key=lambda cls, name, size=1: name)
    Two = make_named(key=lambda cls, name, size=1: name)

    # Different arguments, same key: equal.
    assert One("x", 1) == One("x", 2)
    assert hash(One("x", 1)) == hash(One("x", 2))
    assert len({One("x", 1), One("x", 2), One("y")}) == 2
    # Same key, different class: unequal.
    assert len({One("x"), Two("x")}) == 2
    assert One("x") != Two("x")
    # Not equal to non-subscriptions.
    assert One("x") != "x"
    assert One("x") != ("x",)
    assert {One("x"): 1}[One("x", 5)] == 1


def test_unhashable_key_raises_type_error_naming_the_class() -> None:
    """An unhashable key raises TypeError at construction, naming the class."""

    @shared_subscription(key=lambda cls, x: [x])
    class UnhashableKeyed(Announcer):
        def __init__(self, x: Any) -> None:
            self.x = x

    with pytest.raises(TypeError, match="UnhashableKeyed"):
        UnhashableKeyed(1)


def test_unhashable_default_key_raises_type_error_naming_the_class() -> None:
    """An unhashable argument under the default key fails at construction, too."""
    Named = make_named()
    with pytest.raises(TypeError, match="Named"):
        Named(["a"])


def test_key_callable_exception_propagates_unchanged_with_a_note() -> None:
    """An exception from the key callable is raised as that same object, its
    type kept, with a note naming the class whose key failed; nothing is
    built."""
    error = Boom("bad key")

    def key(cls: type, *args: Any, **kwargs: Any) -> Any:
        raise error

    Named = make_named(key=key)
    with pytest.raises(Boom) as caught:
        Named("a")
    assert caught.value is error
    assert str(caught.value) == "bad key"
    assert any("Named" in note for note in caught.value.__notes__)
    assert Named.inits == 0


# -- lazy construction --------------------------------------------------------


def test_construction_needs_no_running_event_loop() -> None:
    """Constructing, and ``__aiter__()``, work with no loop and no pool."""
    Named = make_named()
    with pytest.raises(RuntimeError):
        current_pool()  # so construction cannot have looked a pool up

    sub = Named("a")
    consumer = aiter(sub)

    assert isinstance(sub, SharedSubscription)
    assert consumer is not None
    assert Named.inits == 0


def test_construction_works_in_a_plain_thread() -> None:
    """A subscription can be constructed in a thread that runs no event loop."""
    Named = make_named()
    built: list[SharedSubscription] = []
    errors: list[BaseException] = []

    def construct() -> None:
        try:
            built.append(Named("a"))
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    thread = threading.Thread(target=construct)
    thread.start()
    thread.join(timeout=5)

    assert errors == []
    assert built == [Named("a")]
    assert Named.inits == 0


async def test_subscription_built_in_another_thread_iterates_here() -> None:
    """A subscription built in a loop-less worker thread iterates in this loop."""
    Named = make_named()
    sub = await anyio.to_thread.run_sync(Named, "a")
    assert Named.inits == 0
    async with SubscriptionPool() as pool, aiter(sub) as consumer:
        assert await first_uid(consumer) == uid_of(Named.created[0])
        assert pool.statistics().entries == 1


async def test_pool_is_looked_up_at_first_anext() -> None:
    """The entry lands in the pool current at ``__anext__``, not earlier."""
    Named = make_named()
    async with SubscriptionPool() as constructed_in:
        sub = Named("a")
        consumer = aiter(sub)
    assert constructed_in.statistics().entries == 0
    async with SubscriptionPool() as iterated_in:
        async with consumer:
            await first_uid(consumer)
            assert iterated_in.statistics().entries == 1
            assert iterated_in.statistics().consumers == 1
        assert iterated_in.statistics().entries == 0


async def test_raw_instance_is_built_when_a_consumer_joins() -> None:
    """The raw instance is built when a consumer joins (``async with``), not
    at construction nor at ``aiter()``."""
    Named = make_named()
    async with SubscriptionPool() as pool:
        sub = Named("a")
        assert Named.created == []
        consumer = aiter(sub)
        other = aiter(sub)
        assert Named.created == []
        assert Named.inits == 0
        assert pool.statistics().entries == 0
        async with consumer, other:
            assert Named.inits == 1
            assert len(Named.created) == 1
            assert pool.statistics().entries == 1
            assert pool.statistics().consumers == 2
            await first_uid(consumer)
            assert Named.inits == 1


async def test_init_failure_reaches_the_triggering_consumer_and_leaves_no_entry() -> (
    None
):
    """An ``__init__`` error reaches the consumer; no entry is left; a retry works."""

    @shared_subscription
    class Flaky(Announcer):
        failures: ClassVar[int] = 1
        attempts: ClassVar[int] = 0

        def __init__(self, name: str) -> None:
            type(self).attempts += 1
            if type(self).failures:
                type(self).failures -= 1
                raise Boom(f"cannot build {name}")
            self.name = name
            self.register()

    sub = Flaky("a")
    async with SubscriptionPool() as pool:
        failing = aiter(sub)
        with anyio.fail_after(5), pytest.raises(Boom, match="cannot build a"):
            await failing.__anext__()
        assert Flaky.attempts == 1
        assert pool.statistics().entries == 0
        assert pool.statistics().consumers == 0

        async with aiter(Flaky("a")) as retry:
            assert await first_uid(retry) == uid_of(Flaky.created[0])
            assert Flaky.attempts == 2
            assert pool.statistics().entries == 1
        assert pool.statistics().entries == 0


async def test_persistent_init_failure_reaches_every_triggering_consumer() -> None:
    """Each consumer that triggers a failing build gets the error; nothing is kept."""

    @shared_subscription
    class Broken(Announcer):
        attempts: ClassVar[int] = 0

        def __init__(self, name: str) -> None:
            type(self).attempts += 1
            raise Boom(name)

    async with SubscriptionPool() as pool:
        for expected in (1, 2):
            with anyio.fail_after(5), pytest.raises(Boom):
                await aiter(Broken("a")).__anext__()
            assert Broken.attempts == expected
            assert pool.statistics().entries == 0
