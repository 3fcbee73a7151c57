"""Errors at the library's boundary name the subscriber class and the argument.

A broken ``__aiter__``, a failing key function, a bad ``RestartPolicy``
field and a lagging consumer of items that are not discovery events each
give an error that says which class (and which argument) is at fault, and
what to do; a pickling failure names the class, caused by the pickler's own
error.
"""

from __future__ import annotations

import gc
import pickle
import threading
import warnings
from collections.abc import AsyncIterator
from collections.abc import Iterator
from typing import Any

import anyio
import cloudpickle
import pytest

from wool_pooling import Lagged
from wool_pooling import RestartPolicy
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio


# -- a broken __aiter__ ---------------------------------------------------------


def _returns_list(self: Any) -> Any:
    return [1, 2]


def _sync_generator(self: Any) -> Iterator[int]:
    yield 1


async def _coroutine(self: Any) -> Any:
    return None


BROKEN = {
    "list": (_returns_list, "list"),
    "sync generator": (_sync_generator, "generator"),
    "coroutine": (_coroutine, "coroutine"),
}


def _broken_class(aiter_method: Any, restart: RestartPolicy | None) -> Any:
    class BrokenAiter:
        __aiter__ = aiter_method

    return shared_subscription(restart=restart)(BrokenAiter)


@pytest.mark.parametrize(
    "restart", [None, RestartPolicy(backoff=0)], ids=["plain", "restart"]
)
@pytest.mark.parametrize("kind", list(BROKEN))
async def test_broken_aiter_names_the_class_and_what_it_returned(
    kind: str, restart: RestartPolicy | None
) -> None:
    """A ``__aiter__`` returning a list, a sync generator or a coroutine fails
    every consumer with a TypeError naming the class and the returned type;
    the coroutine is closed (no "never awaited" warning), nothing restarts."""
    method, returned = BROKEN[kind]
    Broken = _broken_class(method, restart)
    gc.collect()  # only this test's leftovers below
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with SubscriptionPool():
            with pytest.raises(TypeError) as error:
                async for _ in Broken():
                    pass
        message = str(error.value)
        del error  # its traceback holds what __aiter__ returned
        gc.collect()
    assert "BrokenAiter.__aiter__()" in message
    assert f"returned {returned}" in message
    assert not [w for w in caught if "_coroutine' was never awaited" in str(w.message)]


async def test_aiter_that_is_not_a_method_names_the_class() -> None:
    """``__aiter__ = 5`` is refused at decoration, naming the class and the value;
    on a subclass of a decorated class, at iteration."""

    class Five:
        __aiter__ = 5

    with pytest.raises(TypeError, match=r"Five\.__aiter__ is 5"):
        shared_subscription(Five)

    @shared_subscription
    class Good:
        async def __aiter__(self) -> AsyncIterator[int]:
            yield 1

    class Bad(Good):  # type: ignore[misc, valid-type]
        __aiter__ = 5

    async with SubscriptionPool():
        with pytest.raises(TypeError, match=r"Bad\.__aiter__ is 5"):
            async for _ in Bad():
                pass


# -- a failing key function -----------------------------------------------------


class _Numbers:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    async def __aiter__(self) -> AsyncIterator[int]:
        yield 1


def _notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


def test_key_that_raises_keeps_its_exception_and_notes_the_class() -> None:
    """A ``KeyError`` from the key reaches the caller as that very KeyError
    (code catching its own exception still catches it), with a note naming
    the class, the key function and the call."""
    known: dict[str, str] = {}

    def by_namespace(cls: type, namespace: str) -> str:
        return known[namespace]

    class KeyedByNamespace(_Numbers):
        pass

    Keyed = shared_subscription(key=by_namespace)(KeyedByNamespace)
    with pytest.raises(KeyError) as error:
        Keyed("a")
    assert type(error.value) is KeyError
    assert error.value.args == ("a",)
    notes = _notes(error.value)
    assert "KeyedByNamespace" in notes
    assert "by_namespace" in notes
    assert "KeyedByNamespace('a')" in notes


def test_key_that_raises_value_error_is_caught_as_value_error() -> None:
    """``except ValueError`` around a construction catches the key's own
    ValueError: its type is not changed."""

    def strict(cls: type, namespace: str) -> str:
        if not namespace:
            raise ValueError("empty namespace")
        return namespace

    class Strict(_Numbers):
        pass

    Keyed = shared_subscription(key=strict)(Strict)
    caught: list[ValueError] = []
    try:
        Keyed("")
    except ValueError as error:
        caught.append(error)
    assert [str(error) for error in caught] == ["empty namespace"]
    assert "Strict" in _notes(caught[0])
    assert caught[0].__cause__ is None


def test_key_with_the_wrong_arity_names_the_class() -> None:
    """A key taking fewer arguments than a call passes (which decoration
    cannot see: ``__init__`` takes ``*names``): Python's TypeError, with a
    note saying whose key it is."""

    class WrongArity:
        def __init__(self, *names: str) -> None:
            self.names = names

        async def __aiter__(self) -> AsyncIterator[int]:
            yield 1

    Keyed = shared_subscription(key=lambda cls, namespace: namespace)(WrongArity)
    with pytest.raises(TypeError) as error:
        Keyed("a", "b")
    notes = _notes(error.value)
    assert "WrongArity" in notes
    assert "<lambda>(cls, namespace)" in notes
    assert "positional argument" in str(error.value)


# -- RestartPolicy: every field, one rule, one wording ---------------------------


@pytest.mark.parametrize(
    ("name", "bad", "rule"),
    [
        ("restart_on_end", "no", "a bool (True or False)"),
        ("restart_on_end", 1, "a bool (True or False)"),
        ("restart_on_end", None, "a bool (True or False)"),
        ("jitter", -0.1, "a number in [0, 1]"),
        ("jitter", 2, "a number in [0, 1]"),
        ("jitter", "0.1", "a number in [0, 1]"),
        ("attempts", True, "None or an int >= 1"),
        ("attempts", 0, "None or an int >= 1"),
        ("attempts", 2.0, "None or an int >= 1"),
        ("backoff", -1, "a finite number >= 0"),
        ("backoff", "1", "a finite number >= 0"),
        ("max_backoff", float("inf"), "a finite number >= 0"),
        ("settle", float("nan"), "a finite number >= 0"),
        ("settle", False, "a finite number >= 0"),
        ("multiplier", 0.5, "a finite number >= 1"),
        ("multiplier", None, "a finite number >= 1"),
    ],
)
def test_restart_policy_validates_every_field_with_one_wording(
    name: str, bad: Any, rule: str
) -> None:
    """Each field is checked, and every way of breaking its rule gives the same
    message."""
    with pytest.raises(ValueError, match=rf"^{name} must be ") as error:
        RestartPolicy(**{name: bad})
    assert str(error.value) == f"{name} must be {rule}, got {bad!r}"


def test_restart_policy_accepts_its_edges() -> None:
    """The ends of each rule are valid."""
    policy = RestartPolicy(
        attempts=None, backoff=0, multiplier=1, jitter=1, settle=0, restart_on_end=True
    )
    assert policy.restart_on_end is True
    assert RestartPolicy(jitter=0).jitter == 0


# -- lagging behind items that are not discovery events --------------------------


def _counting_class(restart: RestartPolicy | None) -> Any:
    class Counting:
        async def __aiter__(self) -> AsyncIterator[int]:
            for number in range(20):
                yield number
            await anyio.sleep_forever()

    # read_ahead=0: the fast consumer joins right after item 0 (ints have no
    # replay: a consumer joining after a batch read ahead starts past it).
    return shared_subscription(max_lag=4, restart=restart, read_ahead=0)(Counting)


@pytest.mark.parametrize(
    "restart", [None, RestartPolicy(backoff=0)], ids=["plain", "restart"]
)
async def test_lagging_consumer_of_other_items_gets_lagged(
    restart: RestartPolicy | None,
) -> None:
    """A slow consumer of a stream of ints, behind by more than max_lag, gets
    ``Lagged`` with the count it missed, then the oldest item still held:
    nothing is lost silently."""
    Counting = _counting_class(restart)
    with anyio.fail_after(10):  # before the fix, the slow consumer waited forever
        await _lag_behind(Counting)


async def _lag_behind(Counting: Any) -> None:
    async with SubscriptionPool():
        subscription = Counting()
        slow = aiter(subscription)
        fast = aiter(subscription)
        assert await anext(slow) == 0
        fast_got = [await anext(fast) for _ in range(19)]  # joined after 0
        assert fast_got == list(range(1, 20))
        with pytest.raises(Lagged) as lagged:
            await anext(slow)
        assert lagged.value.skipped == 15
        rest = [await anext(slow) for _ in range(4)]
        assert rest == [16, 17, 18, 19]
        await slow.aclose()
        await fast.aclose()


# -- pickling --------------------------------------------------------------------


def test_class_holding_a_lock_names_the_class() -> None:
    """A local class with a lock in its body fails cloudpickle with a
    TypeError naming the class, caused by cloudpickle's own error."""

    @shared_subscription
    class HoldsALock:
        lock = threading.Lock()

        async def __aiter__(self) -> AsyncIterator[int]:
            yield 1

    with pytest.raises(TypeError, match="HoldsALock subscription") as error:
        cloudpickle.dumps(HoldsALock())
    assert "lock" in str(error.value)
    assert error.value.__cause__ is not None


def test_argument_only_cloudpickle_can_pickle_fails_plain_pickle() -> None:
    """A local function argument: cloudpickle pickles the subscription, plain
    pickle fails with its own error, naming the function, every time."""
    from subscribers import NamedSubscriber

    def local() -> int:
        return 1

    subscription = NamedSubscriber(local)
    for _ in range(2):
        copy = cloudpickle.loads(cloudpickle.dumps(subscription))
        assert copy.cls is NamedSubscriber
        assert copy.args[0]() == 1
        with pytest.raises((pickle.PicklingError, AttributeError), match="local"):
            pickle.dumps(subscription)


def test_unpicklable_argument_names_the_class() -> None:
    """A lock passed by keyword: both picklers raise a TypeError naming the
    class, with the pickler's own reason."""
    from subscribers import NamedSubscriber

    subscription = NamedSubscriber("a", size=threading.Lock())  # type: ignore[arg-type]
    for dumps in (pickle.dumps, cloudpickle.dumps):
        with pytest.raises(TypeError, match=r"NamedSubscriber subscription: .*lock"):
            dumps(subscription)


def test_local_class_fails_plain_pickle_naming_it() -> None:
    """A class defined in a function: plain pickle's own error names it, and
    cloudpickle pickles it."""

    @shared_subscription
    class Local:
        async def __aiter__(self) -> AsyncIterator[int]:
            yield 1

    with pytest.raises((pickle.PicklingError, AttributeError), match="Local"):
        pickle.dumps(Local())
    assert cloudpickle.loads(cloudpickle.dumps(Local())) is not None


def test_builtin_key_without_a_signature_is_still_named() -> None:
    """A key with no inspectable signature (``max``) is named by its name."""

    class BuiltinKeyed(_Numbers):
        pass

    Keyed = shared_subscription(key=max)(BuiltinKeyed)
    with pytest.raises(TypeError) as error:
        Keyed("a")
    assert "BuiltinKeyed" in _notes(error.value)
    assert "key function max failed" in _notes(error.value)


def test_unpicklable_star_argument_names_the_class() -> None:
    """An unpicklable argument ``__init__`` collects in ``*args`` names the class."""
    from subscribers import StarSubscriber

    with pytest.raises(TypeError, match="StarSubscriber subscription"):
        pickle.dumps(StarSubscriber("a", threading.Lock()))


def test_a_cloudpickle_pickler_subclass_pickles_a_local_function_argument() -> None:
    """wool pickles with a subclass of cloudpickle's Pickler: an argument only
    cloudpickle can serialise passes there too."""
    import io

    from subscribers import NamedSubscriber

    class Subclassed(cloudpickle.Pickler):
        pass

    def local() -> int:
        return 2

    buffer = io.BytesIO()
    Subclassed(buffer).dump(NamedSubscriber(local))
    copy = cloudpickle.loads(buffer.getvalue())
    assert copy.args[0]() == 2


@shared_subscription
class _ManyInts:
    async def __aiter__(self) -> AsyncIterator[int]:
        for number in range(1100):
            yield number
        await anyio.sleep_forever()


async def test_default_max_lag_raises_lagged_for_other_items() -> None:
    """With the default bound (1024), a consumer left behind a stream of ints
    gets Lagged, as a fast/slow pair of consumers would show."""
    with anyio.fail_after(10):
        async with SubscriptionPool():
            subscription = _ManyInts()
            assert subscription.max_lag == 1024
            slow = aiter(subscription)
            fast = aiter(subscription)
            assert await anext(slow) == 0
            # The default read-ahead (64) pulled items 1..64 with item 0: a
            # stream of ints has no replay, so fast starts after them.
            joined_at = 1 + 64
            fast_got = [await anext(fast) for _ in range(1100 - joined_at)]
            assert fast_got == list(range(joined_at, 1100))
            with pytest.raises(Lagged) as lagged:
                await anext(slow)
            rest = [await anext(slow) for _ in range(1099 - lagged.value.skipped)]
            assert rest == list(range(1 + lagged.value.skipped, 1100))
            assert len(rest) == 1024
            await slow.aclose()
            await fast.aclose()


class _CountsPickling:
    """An argument that counts how often it is pickled."""

    pickled = 0

    def __reduce__(self) -> tuple[Any, ...]:
        _CountsPickling.pickled += 1
        return (_CountsPickling, ())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CountsPickling)

    def __hash__(self) -> int:
        return 0


def test_a_subscription_is_checked_once() -> None:
    """The pickling that names the class of a failing subscription runs at
    its first pickle only (wool pickles proxies often): later ones pickle
    the arguments once each, with either pickler, and copies stay equal."""
    from subscribers import NamedSubscriber

    sub = NamedSubscriber(_CountsPickling())  # type: ignore[arg-type]
    _CountsPickling.pickled = 0
    copies = [cloudpickle.loads(cloudpickle.dumps(sub))]
    assert _CountsPickling.pickled == 2  # the check, then the pickling
    copies += [cloudpickle.loads(cloudpickle.dumps(sub)) for _ in range(2)]
    copies.append(pickle.loads(pickle.dumps(sub)))
    assert _CountsPickling.pickled == 5
    assert all(copy == sub for copy in copies)
