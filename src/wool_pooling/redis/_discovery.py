"""``RedisDiscovery``: wool discovery on Redis, one subscription per process."""

import functools
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import cast
from typing import final

from wool import DiscoveryLike
from wool import DiscoveryPublisherLike
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata

from .._core.signatures import suggest_keywords
from .._pooling.restart import RestartPolicy
from .._wool.afilter import afilter
from ._connection import check_client_options
from ._connection import parse_url
from ._connection import redact
from ._errors import DEFAULT_RECONNECT
from ._publisher import RedisPublisher
from ._scripts import DEFAULT_CHANGE_LOG
from ._scripts import DEFAULT_KEY_PREFIX
from ._settings import DiscoverySettings
from ._settings import argument
from ._settings import check_change_log
from ._settings import check_flag
from ._settings import check_hosts
from ._settings import check_key_prefix
from ._settings import check_namespace
from ._settings import check_reconnect
from ._settings import check_seconds
from ._settings import rebuild
from ._statistics import Counters
from ._statistics import RedisStatistics
from ._statistics import counters
from ._stream import RedisStream
from ._stream import SharedRedisStream
from ._stream import note_options


@suggest_keywords
@final
class RedisDiscovery:
    """A wool ``DiscoveryLike`` on one Redis server, Sentinel-monitored master
    or Redis Cluster; see docs/redis.rst for its guarantees (ordering by the
    namespace's version, one shared subscription per connection, namespace
    and process, reconnects, leases; asyncio only).

    It pickles as the arguments it was built with, every one, and so do its
    publisher and subscribers. It equals a discovery whose subscribers share
    its subscription (same normalised connection, key prefix and namespace).

    :param url: The server: ``redis://``, ``rediss://``, ``unix://``,
        ``redis+sentinel://`` or ``redis+cluster://`` (docs/redis.rst,
        *Urls*). Checked here.
    :param namespace: Workers are shared between discoveries of one
        namespace only (a non-empty ``str``).
    :param bind_host: Where wool binds the workers this discovery's
        publisher announces (``"0.0.0.0"`` for other machines to reach them).
    :param advertise_host: The host announced for a worker bound to a
        wildcard; ``None``: this host's default-route address.
    :param lease: Seconds a worker's record lives without renewal (renewed
        every ``lease / 3`` by its publisher).
    :param reap_interval: Seconds between a subscription's sweeps of
        expired leases; ``None``: ``lease / 4``.
    :param connect_timeout: Bound, in seconds, on connecting, subscribing
        and taking a snapshot, and on each command.
    :param reconnect: How a subscription retries a lost connection;
        unlimited attempts by default. Its ``settle`` and ``restart_on_end``
        must be left as they are: a Redis subscription cannot apply them.
    :param shared: ``False`` gives every iteration of every subscriber its
        own connections (for comparison).
    :param client_options: Keyword arguments for redis-py's client (its
        ``ssl_*`` options, ``password``, ``sentinel_kwargs``, ...), and
        ``ssl_context``: an :class:`ssl.SSLContext` for TLS to the server.
        The url wins over them; they win over the defaults (docs/redis.rst,
        *Options and their precedence*). They must pickle for the subscriber
        to be sent to another process.
    :param key_prefix: The prefix of every key and channel, ``"wool:"`` by
        default (no braces).
    :param liveness_timeout: Seconds the pub/sub connection may stay silent
        (a ``PING`` is sent at half of it) before it is treated as lost
        (docs/redis.rst, *Dead connections*).
    :param name_connections: ``True``: each connection names itself with
        ``CLIENT SETNAME``; ``False``: no ``CLIENT`` command is sent at all,
        for servers that refuse them. Passed on to the publisher.
    :param change_log: How many changes the namespace's change log keeps
        for subscriptions resuming after a lost connection (``0``: none, a
        new snapshot every time); passed on to the publisher
        (docs/redis.rst, *Resuming*).
    :raises TypeError: if an argument has the wrong type, or
        ``client_options`` has a key redis-py does not take.
    :raises ValueError: for a ``reconnect`` that sets ``settle`` or
        ``restart_on_end``, a malformed url, an empty namespace, a duration
        that is not a finite number > 0, a negative ``change_log``, a
        reserved or TLS-only client option out of place, or braces in
        ``key_prefix``.
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
        target = parse_url(url)
        check_namespace(namespace)
        lease = check_seconds("lease", lease)
        connect_timeout = check_seconds("connect_timeout", connect_timeout)
        liveness_timeout = check_seconds("liveness_timeout", liveness_timeout)
        check_flag("name_connections", name_connections)
        reap_interval = (
            lease / 4
            if reap_interval is None
            else check_seconds("reap_interval", reap_interval)
        )
        check_reconnect(reconnect)
        options = check_client_options(client_options, target)
        check_key_prefix(key_prefix)
        # A publisher's settings, checked now rather than at first use.
        check_hosts(bind_host, advertise_host)
        self._settings: DiscoverySettings = DiscoverySettings(
            url=url,
            namespace=namespace,
            bind_host=bind_host,
            advertise_host=advertise_host,
            lease=lease,
            reap_interval=reap_interval,
            connect_timeout=connect_timeout,
            reconnect=reconnect,
            shared=shared,
            client_options=options,
            key_prefix=key_prefix,
            liveness_timeout=liveness_timeout,
            name_connections=name_connections,
            change_log=check_change_log(change_log),
        )

    url: str = argument("url")
    namespace: str = argument("namespace")
    bind_host: str = argument("bind_host")
    advertise_host: str | None = argument("advertise_host")
    lease: float = argument("lease")
    #: ``lease / 4`` unless given.
    reap_interval: float = argument("reap_interval")
    connect_timeout: float = argument("connect_timeout")
    reconnect: RestartPolicy = argument("reconnect")
    shared: bool = argument("shared")
    #: A checked copy.
    client_options: Mapping[str, Any] = argument("client_options")
    key_prefix: str = argument("key_prefix")
    liveness_timeout: float = argument("liveness_timeout")
    name_connections: bool = argument("name_connections")
    change_log: int = argument("change_log")

    @functools.cached_property
    def _key(self) -> Hashable:
        """The pool's key, resolved (DNS) when first needed."""
        return self._settings.key()

    @functools.cached_property
    def _counters(self) -> Counters:
        """The key's counters, held while this discovery lives."""
        return counters(self._key)

    @property
    def publisher(self) -> RedisPublisher:
        """A new, unentered :class:`RedisPublisher` for this namespace."""
        return rebuild(RedisPublisher, self._settings.publisher())

    @property
    def subscriber(self) -> DiscoverySubscriberLike:
        """The unfiltered subscriber; same as ``subscribe()``."""
        return self.subscribe()

    def subscribe(
        self, filter: Callable[[WorkerMetadata], bool] | None = None
    ) -> DiscoverySubscriberLike:
        """A subscriber to this namespace, filtered by ``filter`` if given.

        With ``shared=True`` the process's subscribers of one normalised
        connection, key prefix and namespace share one subscription, with
        the options of the first (docs/redis.rst, *One subscription per
        connection*); each filter applies to its own consumer. A
        subscriber given other options than a live one of its key warns
        (:exc:`RuntimeWarning`).
        """
        settings = self._settings
        self._counters  # noqa: B018  (held from the first subscriber on)
        if self.shared:
            stream: Any = SharedRedisStream(settings)
            note_options(self._key, stream, settings.options())
        else:
            stream = RedisStream(settings)
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
        return (rebuild, (RedisDiscovery, self._settings))

    def __repr__(self) -> str:
        return f"RedisDiscovery({redact(self.url)!r}, {self.namespace!r})"


if TYPE_CHECKING:  # pyright (strict, on src/) checks them against wool's protocols
    _discovery: DiscoveryLike = RedisDiscovery("redis://localhost", "namespace")
    _publisher: DiscoveryPublisherLike = RedisPublisher(
        "redis://localhost", "namespace"
    )
