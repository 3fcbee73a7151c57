"""Every public object that pickles travels whole: built with arbitrary valid
arguments (each one away from its default), a pickled copy, with ``pickle``
and with cloudpickle, is equal to the original and has every argument equal.

Each pickles, compares and hashes from one record of its constructor
arguments, so an argument added later cannot be left out of one of them;
for :class:`~wool_pooling.SharedDiscovery` (whose inner discovery does not
expose every argument) the test also pins that equality reads every argument,
so that an equal copy is a copy with every argument equal.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import attrs
import cloudpickle
import pytest
import wool
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from subscribers import NamedSubscriber
from subscribers import StarSubscriber
from wool import WorkerMetadata

from wool_pooling import RestartPolicy
from wool_pooling import SharedDiscovery
from wool_pooling import SharedSubscription
from wool_pooling import SyncSharedDiscovery
from wool_pooling import afilter
from wool_pooling.redis import RedisDiscovery


def passes_every_worker(metadata: WorkerMetadata) -> bool:
    return True


def passes_no_worker(metadata: WorkerMetadata) -> bool:
    return False


def passes_even_pids(metadata: WorkerMetadata) -> bool:
    return metadata.pid % 2 == 0


PREDICATES = (passes_every_worker, passes_no_worker, passes_even_pids)

DUMPS: dict[str, Callable[[Any], bytes]] = {
    "pickle": pickle.dumps,
    "cloudpickle": cloudpickle.dumps,  # pyright: ignore[reportUnknownMemberType]
}

examples = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

predicates = st.sampled_from(PREDICATES)
#: Hashable values that survive pickling equal (no NaN).
plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.tuples(inner, inner),
    max_leaves=4,
)
namespaces = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=16
).map(lambda name: f"records-{name}")
seconds = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)


def round_trip(value: Any, pickler: str) -> Any:
    return pickle.loads(DUMPS[pickler](value))


pytestmark = pytest.mark.parametrize("pickler", sorted(DUMPS))


# -- RestartPolicy -------------------------------------------------------------


@st.composite
def restart_policies(draw: st.DrawFn) -> RestartPolicy:
    default = RestartPolicy()
    finite = st.floats(min_value=0, max_value=1e9, allow_nan=False)
    arguments = {
        "attempts": draw(st.none() | st.integers(min_value=1, max_value=10**6)),
        "backoff": draw(finite),
        "multiplier": draw(st.floats(min_value=1, max_value=1e3)),
        "max_backoff": draw(finite),
        "jitter": draw(st.floats(min_value=0, max_value=1)),
        "settle": draw(finite),
        "restart_on_end": True,
    }
    for name, value in arguments.items():
        if value == getattr(default, name):
            arguments[name] = None if name == "attempts" else value + 0.5
    return RestartPolicy(**arguments)


@examples
@given(policy=restart_policies())
def test_restart_policy_travels_whole(pickler: str, policy: RestartPolicy) -> None:
    """A pickled RestartPolicy equals the original, every field equal."""
    copy = round_trip(policy, pickler)
    assert copy == policy
    assert hash(copy) == hash(policy)
    default = RestartPolicy()
    for field in attrs.fields(RestartPolicy):
        assert getattr(policy, field.name) != getattr(default, field.name)
        assert getattr(copy, field.name) == getattr(policy, field.name)


# -- SharedSubscription --------------------------------------------------------


@st.composite
def subscriptions(draw: st.DrawFn) -> SharedSubscription[Any]:
    name, size = draw(plain), draw(st.integers().filter(lambda size: size != 1))
    shape = draw(st.sampled_from(("positional", "keyword", "star")))
    if shape == "positional":
        return NamedSubscriber(name, size)
    if shape == "keyword":
        return NamedSubscriber(name=name, size=size)
    return StarSubscriber(*draw(st.lists(plain, min_size=1, max_size=4)))


@examples
@given(subscription=subscriptions())
def test_shared_subscription_travels_whole(
    pickler: str, subscription: SharedSubscription[Any]
) -> None:
    """A pickled SharedSubscription equals the original: same class, key and
    every constructor argument."""
    copy = round_trip(subscription, pickler)
    assert copy == subscription
    assert hash(copy) == hash(subscription)
    assert copy.cls is subscription.cls
    assert copy.key == subscription.key
    assert copy.args == subscription.args
    assert copy.kwargs == subscription.kwargs


# -- afilter -------------------------------------------------------------------


@examples
@given(predicate=predicates, inner=subscriptions())
def test_afilter_travels_whole(
    pickler: str,
    predicate: Callable[[WorkerMetadata], bool],
    inner: SharedSubscription[Any],
) -> None:
    """A pickled afilter equals the original: the same predicate, an equal inner."""
    filtered = afilter(predicate, inner)
    copy = round_trip(filtered, pickler)
    assert copy == filtered
    assert hash(copy) == hash(filtered)
    assert copy.predicate is predicate
    assert copy.inner == inner
    assert copy != afilter(predicate, NamedSubscriber(("other", inner.key)))
    others = [each for each in PREDICATES if each is not predicate]
    assert all(copy != afilter(other, inner) for other in others)


# -- SharedDiscovery -----------------------------------------------------------

#: Every argument of a SharedDiscovery of a LocalDiscovery, none its default.
local_arguments = st.fixed_dictionaries(
    {
        "namespace": namespaces,
        "filter": predicates,
        "capacity": st.integers(min_value=1, max_value=10**6).filter(
            lambda capacity: capacity != 128
        ),
        "block_size": st.integers(min_value=1, max_value=10**6).filter(
            lambda size: size != 1024
        ),
        "lock_timeout": seconds.filter(lambda timeout: timeout != 30.0),
        "poll_interval": seconds,
    }
)

#: Every argument of a SharedDiscovery of a LanDiscovery, none its default.
lan_arguments = st.fixed_dictionaries(
    {
        "namespace": namespaces,
        "advertise_host": st.integers(min_value=1, max_value=254).map(
            lambda last: f"10.0.0.{last}"
        ),
        "filter": predicates,
    }
)


def local_discovery(arguments: dict[str, Any]) -> SharedDiscovery:
    inner = {
        name: value for name, value in arguments.items() if name != "poll_interval"
    }
    return SharedDiscovery(
        wool.LocalDiscovery(**inner), poll_interval=arguments["poll_interval"]
    )


def lan_discovery(arguments: dict[str, Any]) -> SharedDiscovery:
    return SharedDiscovery(wool.LanDiscovery(**arguments))


def changed(name: str, value: Any) -> Any:
    """A valid value for argument ``name`` other than ``value``."""
    if name in ("namespace", "advertise_host"):
        return value + "0"
    if name == "filter":
        return next(each for each in PREDICATES if each is not value)
    return value + 1


@examples
@given(
    kind=st.sampled_from(("local", "lan")),
    local=local_arguments,
    lan=lan_arguments,
)
def test_shared_discovery_travels_whole(
    pickler: str, kind: str, local: dict[str, Any], lan: dict[str, Any]
) -> None:
    """A pickled SharedDiscovery of wool's discoveries equals the original, of
    the same class, with equal options and inner; and equality reads every
    argument (changing any one makes it, and its upstream, another), so
    every argument is equal."""
    build, arguments = (
        (local_discovery, local) if kind == "local" else (lan_discovery, lan)
    )
    shared = build(arguments)
    copy = round_trip(shared, pickler)
    assert copy == shared
    assert hash(copy) == hash(shared)
    assert type(copy) is type(shared)
    assert copy.entered == 0
    assert copy.subscribe_options == shared.subscribe_options
    assert copy.inner == shared.inner
    assert copy.inner is not shared.inner
    assert copy.subscriber == shared.subscriber
    assert round_trip(shared.subscriber, pickler) == shared.subscriber
    for name, value in arguments.items():
        other = build({**arguments, name: changed(name, value)})
        assert other != shared, name
        assert other.subscriber != shared.subscriber, name  # another upstream


def test_shared_discovery_of_a_sync_inner_is_sync(pickler: str) -> None:
    """The copy of a SyncSharedDiscovery is a SyncSharedDiscovery."""
    shared = SharedDiscovery(wool.LocalDiscovery("records-sync"))
    assert isinstance(round_trip(shared, pickler), SyncSharedDiscovery)


#: Every argument of a RedisDiscovery, none its default (no connection is made).
redis_arguments = st.fixed_dictionaries(
    {
        "url": st.tuples(
            st.integers(min_value=1024, max_value=65535), st.integers(0, 15)
        ).map(lambda port_db: f"redis://127.0.0.1:{port_db[0]}/{port_db[1]}"),
        "namespace": namespaces,
        "bind_host": st.just("127.0.0.2"),
        "advertise_host": st.integers(1, 254).map(lambda last: f"10.0.0.{last}"),
        "lease": seconds.filter(lambda lease: lease != 10.0),
        "reap_interval": seconds,
        "connect_timeout": seconds.filter(lambda timeout: timeout != 5.0),
        # A Redis subscription refuses settle and restart_on_end.
        "reconnect": restart_policies().map(
            lambda policy: attrs.evolve(policy, settle=1.0, restart_on_end=False)
        ),
        "shared": st.just(False),
        "client_options": st.fixed_dictionaries(
            {"health_check_interval": st.integers(1, 60)}
        ),
        "key_prefix": st.text(alphabet="abcxyz:", min_size=1, max_size=8).filter(
            lambda prefix: prefix != "wool:"
        ),
    }
)


#: The RedisDiscovery arguments it keeps as public attributes.
PUBLIC_REDIS_ARGUMENTS = (
    "url",
    "namespace",
    "bind_host",
    "advertise_host",
    "lease",
    "connect_timeout",
    "shared",
    "client_options",
    "key_prefix",
)


@examples
@given(arguments=redis_arguments, predicate=predicates)
def test_shared_discovery_of_a_redis_discovery_adds_and_loses_nothing(
    pickler: str,
    arguments: dict[str, Any],
    predicate: Callable[[WorkerMetadata], bool],
) -> None:
    """A pickled SharedDiscovery of a RedisDiscovery is the SharedDiscovery of
    the RedisDiscovery's own pickled copy, with equal options (``filter``,
    the one its ``subscribe`` takes): the wrapper loses no argument on the
    way (RedisDiscovery's own round trip is pinned with the redis package)."""
    inner = RedisDiscovery(**arguments)
    shared = SharedDiscovery(inner, filter=predicate)
    copy = round_trip(shared, pickler)
    alone = round_trip(inner, pickler)
    assert type(copy) is type(shared)
    assert copy.subscribe_options == {"filter": predicate}
    assert type(copy.inner) is RedisDiscovery
    for name in PUBLIC_REDIS_ARGUMENTS:
        assert getattr(copy.inner, name) == getattr(alone, name), name
    assert copy == SharedDiscovery(alone, filter=predicate)
    assert round_trip(shared.subscriber, pickler) == (
        SharedDiscovery(alone, filter=predicate).subscriber
    )
