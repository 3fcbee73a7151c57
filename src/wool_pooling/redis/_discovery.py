"""``RedisDiscovery``: wool discovery on Redis, one subscription per process."""

import functools
import warnings
import weakref
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from typing import Any
from typing import cast
from typing import final

from wool import DiscoverySubscriberLike
from wool import WorkerMetadata

from .._core.signatures import suggest_keywords
from .._pooling.restart import RestartPolicy
from .._wool.afilter import afilter
from ._connection import redact
from ._errors import DEFAULT_RECONNECT
from ._publisher import RedisPublisher
from ._scripts import DEFAULT_CHANGE_LOG
from ._scripts import DEFAULT_KEY_PREFIX
from ._settings import DiscoverySettings
from ._settings import PublisherSettings
from ._settings import arguments_of
from ._settings import check_seconds
from ._settings import run_options
from ._settings import subscription_key
from ._stream import Counters
from ._stream import RedisStatistics
from ._stream import RedisStream
from ._stream import SharedRedisStream
from ._stream import by_key


@suggest_keywords
@final
class RedisDiscovery(DiscoverySettings):
    """A wool ``DiscoveryLike`` on a Redis server, Sentinel-monitored master
    or Redis Cluster, with one shared subscription per connection, namespace
    and process; asyncio only. It pickles as its arguments, every one, and
    equals a discovery whose subscribers share its subscription. See
    docs/redis.rst for its guarantees.

    :param url: ``redis://``, ``rediss://``, ``unix://``,
        ``redis+sentinel://`` or ``redis+cluster://`` (docs/redis.rst, *Urls*).
    :param namespace: Workers are shared within one namespace only.
    :param bind_host: Where wool binds the workers its publisher announces.
    :param advertise_host: The host announced for a worker bound to a
        wildcard; ``None``: this host's default-route address.
    :param lease: Seconds a worker's record lives without renewal.
    :param reap_interval: Seconds between sweeps of expired leases;
        ``None``: ``lease / 4``.
    :param connect_timeout: Bound, in seconds, on connecting, subscribing,
        taking a snapshot and each command.
    :param reconnect: How a subscription retries a lost connection
        (``settle`` and ``restart_on_end`` cannot apply).
    :param shared: ``False`` gives every iteration its own connections.
    :param client_options: Keyword arguments for redis-py's client, and
        ``ssl_context`` (docs/redis.rst, *Options and their precedence*).
    :param key_prefix: The prefix of every key and channel (no braces).
    :param liveness_timeout: Seconds the pub/sub connection may stay silent
        before it is treated as lost (docs/redis.rst, *Dead connections*).
    :param name_connections: ``False``: send no ``CLIENT`` command at all
        (docs/redis.rst, *Managed services*); passed on to the publisher.
    :param change_log: How many changes the namespace's change log keeps for
        subscriptions resuming after a lost connection (``0``: none, a
        snapshot every time); passed on to the publisher (docs/redis.rst,
        *Resuming*).
    :raises TypeError: if an argument has the wrong type, or
        ``client_options`` has a key redis-py does not take.
    :raises ValueError: if an argument is out of range or malformed, a
        reserved or TLS-only client option is given, or ``reconnect`` sets
        ``settle`` or ``restart_on_end``.

    Each argument is an attribute of the same name, read-only
    (``reap_interval``: ``lease / 4`` unless given).
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        lease: float = 10.0,
        reap_interval: float | None = None,
        connect_timeout: float = 5.0,
        reconnect: RestartPolicy = DEFAULT_RECONNECT,
        shared: bool = True,
        client_options: Mapping[str, Any] | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        liveness_timeout: float = 10.0,
        name_connections: bool = True,
        change_log: int = DEFAULT_CHANGE_LOG,
    ) -> None:
        if reap_interval is None:
            reap_interval = check_seconds("lease", lease) / 4
        arguments = locals().copy()  # every argument: none left out of the record
        del arguments["self"]
        DiscoverySettings.__init__(self, **arguments)

    @functools.cached_property
    def _key(self) -> Hashable:
        """The pool's key, resolved (DNS) when first needed."""
        return subscription_key(self)

    @functools.cached_property
    def _counters(self) -> Counters:
        """The key's counters, held while this discovery lives."""
        return by_key.setdefault(self._key, Counters())

    @property
    def publisher(self) -> RedisPublisher:
        """A new, unentered :class:`RedisPublisher` for this namespace."""
        return RedisPublisher(**arguments_of(self, PublisherSettings))

    @property
    def subscriber(self) -> DiscoverySubscriberLike:
        """The unfiltered subscriber; same as ``subscribe()``."""
        return self.subscribe()

    def subscribe(
        self, filter: Callable[[WorkerMetadata], bool] | None = None
    ) -> DiscoverySubscriberLike:
        """A subscriber to this namespace, filtered by ``filter`` if given;
        a shared one warns (:exc:`RuntimeWarning`) if given other options
        than a live one of its key (docs/redis.rst, *One subscription per
        connection*)."""
        self._counters  # noqa: B018  (held from the first subscriber on)
        if self.shared:
            stream: Any = SharedRedisStream(self)
            _note_options(self._key, stream, run_options(self))
        else:
            stream = RedisStream(self)
        if filter is None:
            return cast(DiscoverySubscriberLike, stream)
        return afilter(filter, cast(DiscoverySubscriberLike, stream))

    def statistics(self) -> RedisStatistics:
        """Counters of this process's subscribers to this connection and
        namespace (docs/metrics.rst exports them)."""
        return self._counters.statistics()

    def __eq__(self, other: object) -> bool:
        """Equal to a discovery whose subscribers share this one's subscription."""
        if not isinstance(other, RedisDiscovery):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash((RedisDiscovery, self._key))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as its arguments, every one (checked again when unpickled)."""
        return (functools.partial(RedisDiscovery, **arguments_of(self)), ())

    def __repr__(self) -> str:
        return f"RedisDiscovery({redact(self.url)!r}, {self.namespace!r})"


#: The key and options of each live shared subscriber, by its ``id``: one
#: given other options than a live one of its key is warned about.
_live: dict[int, tuple[Hashable, tuple[object, ...]]] = {}


def _note_options(
    key: Hashable, subscriber: object, options: tuple[object, ...]
) -> None:
    if any(each == key and known != options for each, known in _live.values()):
        warnings.warn(
            "a RedisDiscovery subscriber shares the subscription of an earlier "
            "one to the same connection and namespace but was given other "
            "options (connect_timeout, reap_interval, reconnect, lease, "
            "client_options, liveness_timeout, name_connections, change_log): "
            "the earlier subscriber's apply",
            RuntimeWarning,
            stacklevel=3,
        )
    _live[id(subscriber)] = (key, options)
    weakref.finalize(subscriber, _live.pop, id(subscriber), None)
