"""``RedisDiscovery``, ``RedisPublisher`` and their subscribers pickle whole.

wool ships a discovery's subscriber (and ``SharedDiscovery`` ships the
discovery itself) to every worker process: a copy that lost an argument
watches other keys, or connects otherwise, with no error. These properties
build each object from arbitrary valid arguments (every constructor
argument, urls of every scheme) and check that a copy made by ``pickle``
or ``cloudpickle`` equals the original and has every argument equal.
"""

from __future__ import annotations

import inspect
import pickle
import types
from collections.abc import Mapping
from typing import Any

import cloudpickle
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from wool import WorkerMetadata

from wool_pooling import RestartPolicy
from wool_pooling import SharedSubscription
from wool_pooling import afilter
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisPublisher

PICKLERS = pytest.mark.parametrize(
    "pickler", [pickle, cloudpickle], ids=["pickle", "cloudpickle"]
)

# Literal addresses and ``localhost``: the pool key resolves host names, and
# a property test must not wait for DNS.
_hosts = st.sampled_from(["127.0.0.1", "10.1.2.3", "192.0.2.7", "[::1]", "localhost"])
_ports = st.integers(min_value=1, max_value=65535)
_dbs = st.integers(min_value=0, max_value=15)
_words = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
_credentials = st.one_of(
    st.just(""),
    st.builds(lambda user: f"{user}@", _words),
    st.builds(lambda user, password: f"{user}:{password}@", _words, _words),
    st.builds(lambda password: f":{password}@", _words),
)


def _tcp(scheme: str, credentials: str, host: str, port: int, db: int) -> str:
    return f"{scheme}://{credentials}{host}:{port}/{db}"


def _unix(credentials: str, name: str, db: int) -> str:
    return f"unix://{credentials}/run/redis/{name}.sock?db={db}"


def _sentinel(
    scheme: str,
    credentials: str,
    sentinels: list[tuple[str, int]],
    service: str,
    db: int,
) -> str:
    where = ",".join(f"{host}:{port}" for host, port in sentinels)
    return f"{scheme}://{credentials}{where}/{service}/{db}"


urls = st.one_of(
    st.builds(
        _tcp, st.sampled_from(["redis", "rediss"]), _credentials, _hosts, _ports, _dbs
    ),
    st.builds(_unix, _credentials, _words, _dbs),
    st.builds(
        _sentinel,
        st.sampled_from(["redis+sentinel", "rediss+sentinel"]),
        _credentials,
        st.lists(st.tuples(_hosts, _ports), min_size=1, max_size=3),
        _words,
        _dbs,
    ),
)
namespaces = st.text(min_size=1, max_size=20)
key_prefixes = st.text(
    alphabet=st.characters(blacklist_characters="{}", blacklist_categories=["Cs"]),
    max_size=12,
)
seconds = st.floats(min_value=0.001, max_value=1e6, allow_nan=False) | st.integers(
    min_value=1, max_value=10**6
)
bind_hosts = st.sampled_from(["127.0.0.1", "0.0.0.0", "::", "10.0.0.5", "worker-a"])
advertise_hosts = st.none() | st.sampled_from(["10.0.0.9", "::1", "node.example"])
reconnects = st.builds(
    RestartPolicy,
    attempts=st.none() | st.integers(min_value=1, max_value=100),
    backoff=st.floats(min_value=0, max_value=60),
    multiplier=st.floats(min_value=1, max_value=10),
    max_backoff=st.floats(min_value=0, max_value=600),
    jitter=st.floats(min_value=0, max_value=1),
)
#: Options of redis-py's client that pickle (an ``ssl.SSLContext`` does not).
client_options = st.fixed_dictionaries(
    {},
    optional={
        "health_check_interval": st.integers(min_value=1, max_value=60),
        "socket_keepalive": st.booleans(),
        "password": _words,
        "username": _words,
        "max_connections": st.integers(min_value=1, max_value=100),
        "ssl_certfile": st.just("/etc/ssl/client.pem"),
        "ssl_cert_reqs": st.sampled_from(["required", "none"]),
        "sentinel_kwargs": st.fixed_dictionaries({"password": _words}),
    },
)

#: One value per optional argument of RedisPublisher.
publisher_options = st.fixed_dictionaries(
    {
        "bind_host": bind_hosts,
        "advertise_host": advertise_hosts,
        "lease": seconds,
        "connect_timeout": seconds,
        "client_options": client_options,
        "key_prefix": key_prefixes,
        "name_connections": st.booleans(),
        "change_log": st.integers(min_value=0, max_value=10**6),
    }
)
#: One value per optional argument of RedisDiscovery.
discovery_options = st.fixed_dictionaries(
    {
        "bind_host": bind_hosts,
        "advertise_host": advertise_hosts,
        "lease": seconds,
        "reap_interval": st.none() | seconds,
        "connect_timeout": seconds,
        "reconnect": reconnects,
        "shared": st.booleans(),
        "client_options": client_options,
        "key_prefix": key_prefixes,
        "liveness_timeout": seconds,
        "name_connections": st.booleans(),
        "change_log": st.integers(min_value=0, max_value=10**6),
    }
)


def _fitting(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with only the client options redis-py takes for ``url``
    (the others are refused at construction): ``sentinel_kwargs`` for
    Sentinel, ``ssl_*`` with TLS, ``socket_keepalive`` over TCP."""
    scheme = url.partition("://")[0]
    fitting = {
        name: value
        for name, value in options["client_options"].items()
        if not (name == "sentinel_kwargs" and not scheme.endswith("+sentinel"))
        and not (name.startswith("ssl_") and not scheme.startswith("rediss"))
        and not (name == "socket_keepalive" and scheme == "unix")
    }
    return {**options, "client_options": fitting}


def _checked(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as the constructor keeps them: seconds as floats, and
    ``reap_interval`` resolved (``lease / 4`` when not given)."""
    kept = dict(arguments)
    for name in ("lease", "connect_timeout", "reap_interval", "liveness_timeout"):
        if kept.get(name) is not None:
            kept[name] = float(kept[name])
    if "reap_interval" in kept and kept["reap_interval"] is None:
        kept["reap_interval"] = kept["lease"] / 4
    return kept


def _every_argument(cls: type, arguments: Mapping[str, Any]) -> None:
    """``arguments`` names every parameter of ``cls``: a new one must be
    generated here too."""
    assert set(arguments) == set(inspect.signature(cls).parameters)


def _round_trip(pickler: types.ModuleType, value: object) -> Any:
    return pickle.loads(pickler.dumps(value))


def _subscriber_settings(subscriber: object) -> Any:
    """The settings record a (shared or own) subscriber is built from."""
    if isinstance(subscriber, SharedSubscription):
        (settings,) = subscriber.args
        assert subscriber.kwargs == {}
        return settings
    return subscriber.settings  # type: ignore[attr-defined]


def accept_every_worker(metadata: WorkerMetadata) -> bool:
    return True


@PICKLERS
@settings(max_examples=100, deadline=None)
@given(url=urls, namespace=namespaces, options=discovery_options)
def test_a_redis_discovery_pickles_with_every_argument(
    pickler: types.ModuleType, url: str, namespace: str, options: dict[str, Any]
) -> None:
    """A copy of a discovery equals it and has every argument it was given."""
    options = _fitting(url, options)
    arguments = {"url": url, "namespace": namespace, **options}
    _every_argument(RedisDiscovery, arguments)
    discovery = RedisDiscovery(url, namespace, **options)
    copy = _round_trip(pickler, discovery)
    assert type(copy) is RedisDiscovery
    assert copy == discovery
    assert hash(copy) == hash(discovery)
    for name, value in _checked(arguments).items():
        assert getattr(copy, name) == value, name
    assert copy.statistics() == discovery.statistics()


@PICKLERS
@settings(max_examples=100, deadline=None)
@given(url=urls, namespace=namespaces, options=publisher_options)
def test_a_redis_publisher_pickles_with_every_argument(
    pickler: types.ModuleType, url: str, namespace: str, options: dict[str, Any]
) -> None:
    """A copy of a publisher equals it and has every argument it was given."""
    options = _fitting(url, options)
    arguments = {"url": url, "namespace": namespace, **options}
    _every_argument(RedisPublisher, arguments)
    publisher = RedisPublisher(url, namespace, **options)
    copy = _round_trip(pickler, publisher)
    assert type(copy) is RedisPublisher
    assert copy == publisher
    assert hash(copy) == hash(publisher)
    for name, value in _checked(arguments).items():
        assert getattr(copy, name) == value, name
    assert copy.keys_for == publisher.keys_for


@settings(max_examples=100, deadline=None)
@given(url=urls, namespace=namespaces, options=discovery_options)
def test_a_discovery_builds_its_publisher_from_every_publisher_argument(
    url: str, namespace: str, options: dict[str, Any]
) -> None:
    """``discovery.publisher`` is the publisher made of the discovery's
    arguments that a publisher takes, every one."""
    options = _fitting(url, options)
    discovery = RedisDiscovery(url, namespace, **options)
    shared = set(inspect.signature(RedisPublisher).parameters)
    arguments = {
        name: value
        for name, value in {"url": url, "namespace": namespace, **options}.items()
        if name in shared
    }
    _every_argument(RedisPublisher, arguments)
    assert discovery.publisher == RedisPublisher(**arguments)
    for name, value in _checked(arguments).items():
        assert getattr(discovery.publisher, name) == value, name


@PICKLERS
@pytest.mark.filterwarnings("ignore:a RedisDiscovery subscriber shares:RuntimeWarning")
@settings(max_examples=100, deadline=None)
@given(url=urls, namespace=namespaces, options=discovery_options)
def test_a_redis_subscriber_pickles_with_every_setting(
    pickler: types.ModuleType, url: str, namespace: str, options: dict[str, Any]
) -> None:
    """A copy of ``subscribe()``'s subscriber (shared or not, filtered or
    not) equals it and is built from equal settings: the discovery's url,
    namespace, key prefix, timeouts, reconnect policy, lease and client
    options."""
    options = _fitting(url, options)
    discovery = RedisDiscovery(url, namespace, **options)
    kept = _checked({"url": url, "namespace": namespace, **options})
    subscriber = discovery.subscribe()
    assert isinstance(subscriber, SharedSubscription) == kept["shared"]
    copy = _round_trip(pickler, subscriber)
    assert copy == subscriber
    assert hash(copy) == hash(subscriber)
    settings = _subscriber_settings(copy)
    assert settings == _subscriber_settings(subscriber)
    assert (settings.url, settings.namespace) == (url, namespace)
    assert settings.key_prefix == kept["key_prefix"]
    assert settings.client_options == kept["client_options"]
    assert settings.connect_timeout == kept["connect_timeout"]
    assert settings.reap_interval == kept["reap_interval"]
    assert settings.reconnect == kept["reconnect"]
    assert settings.lease == kept["lease"]
    assert settings.liveness_timeout == kept["liveness_timeout"]
    assert settings.name_connections == kept["name_connections"]

    filtered = discovery.subscribe(accept_every_worker)
    assert isinstance(filtered, afilter)
    filtered_copy = _round_trip(pickler, filtered)
    assert filtered_copy.inner == filtered.inner
    assert _subscriber_settings(filtered_copy.inner) == settings


def test_the_records_name_every_constructor_argument() -> None:
    """Each constructor argument has a public attribute of the same name
    (what a copy is compared by above)."""
    discovery = RedisDiscovery("redis://127.0.0.1:1/0", "ns")
    publisher = discovery.publisher
    for cls, value in ((RedisDiscovery, discovery), (RedisPublisher, publisher)):
        for name in inspect.signature(cls).parameters:
            assert hasattr(value, name), f"{cls.__name__}.{name}"
