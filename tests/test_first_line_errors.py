"""An argument that cannot work fails where it is given, naming itself.

Options, key functions, predicates and callbacks are stored to be used
later (at a pool's first dispatch, in a subscription's task, in a worker
process). Each is checked against what will receive it when it is given:
a misspelt name, or a callable that cannot take the arguments it will be
called with, raises at construction or decoration, with a message naming
the argument (and, for a misspelt name, the closest accepted one).
"""

from __future__ import annotations

import functools
import inspect
import math
import uuid
from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any

import cloudpickle
import pytest
import wool
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import SharedDiscovery
from wool_pooling import SyncSharedDiscovery
from wool_pooling import afilter
from wool_pooling import shared_subscription
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisPublisher

# -- SharedDiscovery options, against the inner discovery's subscribe ------------


def test_a_misspelt_option_fails_at_construction_naming_the_closest() -> None:
    """``poll_intervall`` for ``LocalDiscovery``: a TypeError at construction
    (not at the first dispatch, 60 s later) naming it, the closest parameter
    and every accepted one."""
    with pytest.raises(
        TypeError,
        match=(
            r"^SharedDiscovery: LocalDiscovery\.subscribe\(\) has no parameter "
            r"'poll_intervall' \(did you mean 'poll_interval'\?\); "
            r"it takes filter, poll_interval$"
        ),
    ):
        SharedDiscovery(wool.LocalDiscovery("ns"), poll_intervall=0.2)


def test_a_misspelt_option_is_refused_after_good_ones_were_accepted() -> None:
    """What was found to bind is remembered by the options' names: another
    name, or one missing, is still checked."""
    SharedDiscovery(wool.LocalDiscovery("ns"), poll_interval=0.2)
    SharedDiscovery(wool.LocalDiscovery("ns"))
    with pytest.raises(TypeError, match=r"has no parameter 'poll_intervall'"):
        SharedDiscovery(wool.LocalDiscovery("ns"), poll_intervall=0.2)
    with pytest.raises(TypeError, match=r"has no parameter 'timeout'"):
        SharedDiscovery(wool.LocalDiscovery("ns"), poll_interval=0.2, timeout=1)


@pytest.fixture
def signature_reads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What ``inspect.signature`` is called with, from now on."""
    reads: list[object] = []
    signature = inspect.signature

    def counted(function: Any, **options: Any) -> inspect.Signature:
        reads.append(function)
        return signature(function, **options)

    monkeypatch.setattr(inspect, "signature", counted)
    return reads


def test_an_unpickled_shared_discovery_reads_no_signature(
    signature_reads: list[object],
) -> None:
    """Every task wool dispatches unpickles its pool's discovery: rebuilding
    one whose kind was already checked reads no signature (each read costs
    tens of microseconds), and rebuilds it with its arguments."""
    shared = SharedDiscovery(
        wool.LocalDiscovery("ns-read-once", capacity=64), poll_interval=0.3
    )
    blob = cloudpickle.dumps(shared)
    signature_reads.clear()  # what wrapping the discovery read
    copies = [cloudpickle.loads(blob) for _ in range(3)]
    assert signature_reads == []
    assert copies == [shared] * 3


def test_sync_shared_discovery_checks_its_options_too() -> None:
    """``SyncSharedDiscovery`` constructed directly checks them the same way."""
    with pytest.raises(
        TypeError,
        match=r"has no parameter 'pol_interval' \(did you mean 'poll_interval'",
    ):
        SyncSharedDiscovery(wool.LocalDiscovery("ns"), pol_interval=0.2)


def test_an_option_subscribe_does_not_take_at_all_lists_what_it_takes() -> None:
    """An option of a discovery whose ``subscribe`` takes none but ``filter``
    (``LanDiscovery``): no close name, the accepted ones listed."""
    with pytest.raises(
        TypeError,
        match=(
            r"^SharedDiscovery: LanDiscovery\.subscribe\(\) has no parameter "
            r"'timeout'; it takes filter$"
        ),
    ):
        SharedDiscovery(wool.LanDiscovery(), timeout=1)


class _Recording:
    """A discovery with no ``__reduce__``: its ``subscribe`` is called at
    construction (what travels in its place), and records each call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @property
    def publisher(self) -> Any:
        raise NotImplementedError

    def subscribe(self, *, interval: float = 1.0) -> Any:
        self.calls.append({"interval": interval})
        return ()


def test_options_are_checked_before_subscribe_is_called() -> None:
    """For a discovery whose subscriber is what travels, a misspelt option is
    refused before ``subscribe`` is called with it."""
    inner = _Recording()
    with pytest.raises(
        TypeError,
        match=r"_Recording\.subscribe\(\) has no parameter 'intervall' "
        r"\(did you mean 'interval'\?\)",
    ):
        SharedDiscovery(inner, intervall=2)  # type: ignore[arg-type]
    assert inner.calls == []


class _PositionalOnly:
    """A discovery whose ``subscribe`` takes its option by position only."""

    def __reduce__(self) -> Any:
        return (_PositionalOnly, ())

    @property
    def publisher(self) -> Any:
        raise NotImplementedError

    def subscribe(self, interval: float = 1.0, /) -> Any:
        return ()


class _Required:
    """A discovery whose ``subscribe`` needs an option."""

    def __reduce__(self) -> Any:
        return (_Required, ())

    @property
    def publisher(self) -> Any:
        raise NotImplementedError

    def subscribe(self, *, region: str) -> Any:
        return ()


def test_a_positional_only_parameter_given_by_name_is_refused() -> None:
    """The options are passed by name: one ``subscribe`` takes by position
    only cannot be given."""
    with pytest.raises(
        TypeError,
        match=(
            r"^SharedDiscovery: _PositionalOnly\.subscribe\(\) cannot be called "
            r"with \(interval=2\): .*positional.only"
        ),
    ):
        SharedDiscovery(_PositionalOnly(), interval=2)  # type: ignore[arg-type]


def test_a_required_option_left_out_is_refused() -> None:
    """A ``subscribe`` with a required keyword and no option for it."""
    with pytest.raises(
        TypeError,
        match=(
            r"^SharedDiscovery: _Required\.subscribe\(\) cannot be called with "
            r"\(\): missing a required (keyword-only )?argument: 'region'$"
        ),
    ):
        SharedDiscovery(_Required())  # type: ignore[arg-type]
    assert SharedDiscovery(_Required(), region="eu").subscribe_options == {  # type: ignore[arg-type]
        "region": "eu"
    }


class _AnyOptions:
    """A discovery whose ``subscribe`` takes ``**options``."""

    def __reduce__(self) -> Any:
        return (_AnyOptions, ())

    @property
    def publisher(self) -> Any:
        raise NotImplementedError

    def subscribe(self, **options: Any) -> Any:
        return ()


def test_a_subscribe_taking_kwargs_accepts_any_option() -> None:
    """``subscribe(**options)`` takes every name: nothing is refused."""
    shared = SharedDiscovery(_AnyOptions(), anything=1, whatever="x")  # type: ignore[arg-type]
    assert shared.subscribe_options == {"anything": 1, "whatever": "x"}


# -- @shared_subscription(key=...), against the class's __init__ ---------------


class _Named:
    def __init__(self, namespace: str, size: int = 1) -> None:
        self.namespace = namespace

    async def __aiter__(self) -> AsyncIterator[int]:
        yield 1


def test_a_key_without_the_cls_parameter_fails_at_decoration() -> None:
    """``key=lambda namespace: ...``: refused at decoration, naming the class,
    the key and the call ``Cls(...)`` would make of it."""

    class NoCls(_Named):
        pass

    with pytest.raises(
        TypeError,
        match=(
            r"^@shared_subscription: .*NoCls's key function .*<lambda>\(namespace\) "
            r"cannot take key\(cls, namespace\), the call .*NoCls\(\.\.\.\) makes "
            r"\(too many positional arguments\); a key takes the class first"
        ),
    ):
        shared_subscription(key=lambda namespace: namespace)(NoCls)


def test_a_key_without_a_required_keyword_fails_at_decoration() -> None:
    """``__init__`` has a required keyword-only ``region``: a key with no
    parameter of that name (and no ``**kwargs``) could never be called."""

    class Regional:
        def __init__(self, *, region: str) -> None:
            self.region = region

        async def __aiter__(self) -> AsyncIterator[int]:
            yield 1

    def by_zone(cls: type, *, zone: str) -> str:
        return zone

    with pytest.raises(
        TypeError,
        match=(
            r"key function .*by_zone\(cls: 'type', \*, zone: 'str'\) -> 'str' "
            r"cannot take key\(cls, region=\).*unexpected keyword argument 'region'"
        ),
    ):
        shared_subscription(key=by_zone)(Regional)


def test_a_key_that_some_call_fits_is_accepted() -> None:
    """A key taking the required argument by name only: ``Cls(namespace=...)``
    fits it, so decoration accepts it, and so does such a call."""

    class ByName(_Named):
        pass

    def by_name(cls: type, *, namespace: str, size: int = 1) -> str:
        return namespace

    Keyed = shared_subscription(key=by_name)(ByName)
    assert Keyed(namespace="a").key == "a"


def test_arguments_that_do_not_fit_init_fail_at_construction_with_a_key() -> None:
    """With a key taking anything, ``Cls(...)`` with arguments ``__init__``
    does not take fails at construction (as without a key), not when the
    first consumer builds the raw instance; the key is not called."""
    called: list[object] = []

    def by_anything(cls: type, *args: Any, **kwargs: Any) -> str:
        called.append(args)
        return "one"

    class Anything(_Named):
        pass

    Keyed = shared_subscription(key=by_anything)(Anything)
    with pytest.raises(
        TypeError,
        match=r"^.*Anything\(\): got an unexpected keyword argument 'sise'$",
    ):
        Keyed("a", sise=2)
    with pytest.raises(TypeError, match=r"Anything\(\): too many positional"):
        Keyed("a", 2, 3)
    assert called == []
    assert Keyed("a", size=2).key == "one"


# -- afilter's predicate, and Fanout's on_skip ----------------------------------


class _Stream:
    def __aiter__(self) -> AsyncIterator[Any]:
        raise NotImplementedError


def test_an_afilter_predicate_that_takes_no_argument_is_refused() -> None:
    """A predicate is called with a worker's metadata: one that takes no
    argument fails at construction, not at the first event."""

    def always() -> bool:
        return True

    with pytest.raises(
        TypeError,
        match=(
            r"^afilter predicate <function .*always at .*> must take 1 positional "
            r"argument: too many positional arguments$"
        ),
    ):
        afilter(always, _Stream())  # type: ignore[arg-type]


def test_an_afilter_predicate_that_needs_two_arguments_is_refused() -> None:
    """A predicate needing a second argument the filter never passes."""

    def matches(metadata: WorkerMetadata, tag: str) -> bool:
        return True

    with pytest.raises(
        TypeError,
        match=r"must take 1 positional argument: missing a required argument: 'tag'$",
    ):
        afilter(matches, _Stream())  # type: ignore[arg-type]


def test_a_filter_unpickled_anew_has_no_signature_read(
    signature_reads: list[object],
) -> None:
    """wool ships a proxy's filter with every task, and a worker unpickles it
    as a new function each time: once one function of its shape was checked,
    filtering a ``SharedDiscovery`` with a fresh copy reads no signature
    (each read costs tens of microseconds), and still filters with it."""
    version = "1.2"

    def accepts(metadata: WorkerMetadata) -> bool:  # pickled by value: local
        return metadata.version == version

    shared = SharedDiscovery(wool.LocalDiscovery("ns-filter-read-once"))
    blob = cloudpickle.dumps(shared.subscribe(accepts))
    first = cloudpickle.loads(blob)
    signature_reads.clear()
    copies = [cloudpickle.loads(blob) for _ in range(3)]
    assert signature_reads == []
    assert all(type(copy) is afilter for copy in copies)
    assert {copy.predicate for copy in copies}.isdisjoint({first.predicate})
    same = WorkerMetadata(uid=uuid.uuid4(), address="127.0.0.1:1", pid=1, version="1.2")
    assert all(copy.predicate(same) for copy in copies)


@functools.wraps(lambda a, b: True)
def _wraps_two(*args):  # type: ignore[no-untyped-def]
    return True


@pytest.mark.parametrize(
    ("predicate", "accepted"),
    [
        (lambda: True, False),
        (lambda a: True, True),
        (lambda a, b: True, False),
        (lambda a, b=1: True, True),
        (lambda *a: True, True),
        (lambda a, *, k: True, False),
        (lambda a, *, k=1: True, True),
        (lambda a, /, b=1: True, True),
        (lambda a, **k: True, True),
    ],
)
def test_a_predicate_is_judged_by_its_parameters_checked_or_remembered(
    predicate: Callable[..., bool], accepted: bool
) -> None:
    """Whether a plain function takes one argument is remembered by what
    decides it (its parameters and how many have defaults), so a copy is
    judged as its original was, twice over: never accepted for having the
    shape of another that was."""
    for function in (predicate, cloudpickle.loads(cloudpickle.dumps(predicate))):
        for _ in range(2):
            if accepted:
                afilter(function, _Stream())  # type: ignore[arg-type]
            else:
                with pytest.raises(TypeError, match=r"must take 1 positional"):
                    afilter(function, _Stream())  # type: ignore[arg-type]


def test_a_wrapper_is_judged_by_what_it_wraps_not_by_its_own_shape() -> None:
    """``functools.wraps`` gives a function the signature of what it wraps:
    a ``(*args)`` wrapper around a two-argument function is refused, even
    once a plain ``(*args)`` function was accepted."""
    afilter(lambda *args: True, _Stream())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"missing a required argument: 'b'$"):
        afilter(_wraps_two, _Stream())  # type: ignore[arg-type]


def test_a_fanout_on_skip_that_is_not_callable_is_refused() -> None:
    """``on_skip`` is called as a consumer is moved past items; one that is
    not callable would fail there, logged only."""
    fanout = Fanout(_Stream(), max_lag=2, on_lag="error")
    with pytest.raises(TypeError, match=r"^on_skip must be callable or None, got 5$"):
        fanout.consumer(on_skip=5)  # type: ignore[arg-type]
    assert fanout.statistics().consumers == 0


def test_a_fanout_on_skip_that_takes_no_argument_is_refused() -> None:
    """``on_skip`` gets the count of items logged before the first missed."""

    def skipped() -> None:
        pass

    fanout = Fanout(_Stream(), max_lag=2, on_lag="error")
    with pytest.raises(
        TypeError,
        match=r"^on_skip <function .*skipped at .*> must take 1 positional argument",
    ):
        fanout.consumer(on_skip=skipped)  # type: ignore[arg-type]
    assert fanout.statistics().consumers == 0


class _SkipCounter:
    def __init__(self) -> None:
        self.skipped: list[int] = []

    def __call__(self, logged: int) -> None:
        self.skipped.append(logged)


class _TakesNothing:
    def __call__(self) -> None:
        pass


def test_a_fanout_on_skip_object_whose_call_takes_no_argument_is_refused() -> None:
    """A callable object is checked as its class's ``__call__``."""
    fanout = Fanout(_Stream(), max_lag=2, on_lag="error")
    with pytest.raises(
        TypeError, match=r"^on_skip <.*_TakesNothing object at .*> must take 1"
    ):
        fanout.consumer(on_skip=_TakesNothing())  # type: ignore[arg-type]
    assert fanout.statistics().consumers == 0


def test_on_skip_objects_of_one_class_have_their_signature_read_once(
    signature_reads: list[object],
) -> None:
    """A consumer per join, each with a new callable object: the signature of
    their class's ``__call__`` is read at the first only (reading one costs
    tens of microseconds, a join otherwise a few)."""
    fanout = Fanout(_Stream(), max_lag=2, on_lag="error")
    consumers = [fanout.consumer(on_skip=_SkipCounter()) for _ in range(5)]
    assert fanout.statistics().consumers == len(consumers)
    assert len(signature_reads) <= 1, signature_reads


# -- @shared_subscription's numbers: checked already, every kind of bad value ----


@pytest.mark.parametrize("bad", [True, "1", float("nan"), math.inf, -1.0])
def test_a_bad_ttl_is_refused_at_decoration(bad: Any) -> None:
    """``ttl``: a finite number >= 0; a bool, str, nan, inf or negative is not."""
    with pytest.raises((TypeError, ValueError), match=r"^shared_subscription ttl must"):
        shared_subscription(ttl=bad)(_Named)


@pytest.mark.parametrize("bad", [True, 2.0, "2", float("nan"), math.inf, 0])
def test_a_bad_max_lag_is_refused_at_decoration(bad: Any) -> None:
    """``max_lag``: ``None`` or an int >= 1."""
    with pytest.raises(
        ValueError, match=rf"^max_lag must be None or an int >= 1, got {bad!r}$"
    ):
        shared_subscription(max_lag=bad)(_Named)


@pytest.mark.parametrize("bad", [True, 1.0, "1", float("nan"), math.inf, -1, None])
def test_a_bad_read_ahead_is_refused_at_decoration(bad: Any) -> None:
    """``read_ahead``: an int >= 0."""
    with pytest.raises(
        ValueError, match=rf"^read_ahead must be an int >= 0, got {bad!r}$"
    ):
        shared_subscription(read_ahead=bad)(_Named)


# -- Redis: client_options against redis-py's signatures, hosts -----------------

REDIS_CLASSES = pytest.mark.parametrize(
    "cls", [RedisDiscovery, RedisPublisher], ids=["discovery", "publisher"]
)


@REDIS_CLASSES
def test_a_misspelt_client_option_names_the_closest(cls: Any) -> None:
    """A name redis-py's client does not take (it would refuse it at the
    first connection) is refused at construction, with the closest name."""
    with pytest.raises(
        TypeError,
        match=(
            r"^client_options sockt_timeout is not a keyword of redis-py's client "
            r"for a redis:// url \(did you mean 'socket_timeout'\?\)$"
        ),
    ):
        cls("redis://127.0.0.1:1/0", "ns", client_options={"sockt_timeout": 1})


@REDIS_CLASSES
def test_a_client_option_the_scheme_does_not_take_is_refused(cls: Any) -> None:
    """``socket_keepalive`` over a unix socket (redis-py's unix connection
    does not take it), and ``sentinel_kwargs`` without Sentinel."""
    with pytest.raises(
        TypeError, match=r"^client_options socket_keepalive is not a keyword .* unix://"
    ):
        cls("unix:///tmp/redis.sock", "ns", client_options={"socket_keepalive": True})
    with pytest.raises(
        TypeError, match=r"^client_options sentinel_kwargs is not a keyword .* redis://"
    ):
        cls("redis://127.0.0.1:1/0", "ns", client_options={"sentinel_kwargs": {}})
    assert cls(
        "redis+sentinel://127.0.0.1:1/master",
        "ns",
        client_options={"sentinel_kwargs": {}, "min_other_sentinels": 1},
    ).client_options == {"sentinel_kwargs": {}, "min_other_sentinels": 1}


@REDIS_CLASSES
@pytest.mark.parametrize("name", ["ssl", "ssl_certfile"])
def test_a_tls_client_option_needs_a_tls_url(cls: Any, name: str) -> None:
    """``ssl`` or an ``ssl_*`` option with ``redis://``: the url says TLS."""
    with pytest.raises(
        ValueError,
        match=(
            rf"^client_options {name} needs a TLS url \(rediss:// or "
            r"rediss\+sentinel://\), got 'redis://127\.0\.0\.1:1/0'$"
        ),
    ):
        cls("redis://127.0.0.1:1/0", "ns", client_options={name: "x"})
    options = {"ssl_certfile": "/etc/ssl/client.pem"}
    assert cls("rediss://127.0.0.1:1/0", "ns", client_options=options).client_options


@REDIS_CLASSES
def test_a_bind_host_that_is_not_a_str_is_refused(cls: Any) -> None:
    """``bind_host`` goes into the address a worker is bound to."""
    with pytest.raises(TypeError, match=r"^bind_host must be a str, got int$"):
        cls("redis://127.0.0.1:1/0", "ns", bind_host=8080)


@REDIS_CLASSES
def test_an_advertise_host_that_is_not_a_str_is_refused(cls: Any) -> None:
    """``advertise_host`` goes into the address a worker is announced at."""
    with pytest.raises(
        TypeError, match=r"^advertise_host must be a str or None, got bytes$"
    ):
        cls("redis://127.0.0.1:1/0", "ns", advertise_host=b"10.0.0.1")


@pytest.mark.parametrize("cls", [RedisDiscovery, RedisPublisher])
@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", ""])
def test_a_wildcard_advertise_host_is_refused(cls: Any, wildcard: str) -> None:
    """``advertise_host`` is announced to every subscriber: a wildcard, which
    no client can connect to, is refused at construction."""
    with pytest.raises(ValueError, match=r"^advertise_host must not be a wildcard"):
        cls("redis://127.0.0.1:6379/0", "ns", advertise_host=wildcard)
