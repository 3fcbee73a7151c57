"""wool discovery on Redis: ``RedisPublisher`` records workers with leases and
announces each change; ``RedisDiscovery`` makes publishers and one
subscription per process."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
import warnings
import weakref
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from typing import Any
from typing import final

import anyio
from wool import DiscoveryEventType
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata

from .._core.signatures import suggest_keywords
from .._pooling.restart import RestartPolicy
from .._wool.afilter import afilter
from . import _connection
from . import _errors
from . import _scripts
from . import _settings
from . import _stream

# By name: the reference shows a constant default as its value (docs/conf.py).
from ._errors import DEFAULT_RECONNECT
from ._scripts import DEFAULT_CHANGE_LOG
from ._scripts import DEFAULT_KEY_PREFIX

logger = logging.getLogger("wool_pooling.redis")


def _default_route_ip() -> str:
    """This host's address on its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: routing lookup only
        return str(probe.getsockname()[0])


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host and is not a zombie."""
    if pid <= 0:
        return True  # nothing to check: keep renewing
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


@suggest_keywords
@final
class RedisPublisher(_settings.PublisherSettings):
    """Announces workers in a namespace's Redis hash, each with a lease it
    renews every ``lease / 3`` seconds while entered and the worker's process
    (``metadata.pid``, on this host) is alive; an error that stops the
    renewal is logged at once and raised from the next :meth:`publish` or
    the exit (docs/redis.rst, *Leases*). Asyncio only. It pickles as its
    arguments (unentered), and equals a publisher of equal arguments.

    :param bind_host: Where wool binds the workers announced here; one bound
        to a wildcard is announced at ``advertise_host``, else at this
        host's default-route address.
    :param lease: Seconds a worker's record lives without renewal.
    :param connect_timeout: Bound, in seconds, on connecting and on each
        command (retried 3 times on a lost connection).

    ``url``, ``namespace``, ``advertise_host``, ``client_options``,
    ``key_prefix``, ``name_connections`` and ``change_log``, and the errors
    raised, are as for :class:`RedisDiscovery`. Each argument is an
    attribute of the same name, read-only.
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        lease: float = 10.0,
        connect_timeout: float = 5.0,
        client_options: Mapping[str, Any] | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        name_connections: bool = True,
        change_log: int = DEFAULT_CHANGE_LOG,
    ) -> None:
        # Every argument, ``self`` included: none left out of the record.
        _settings.PublisherSettings.__init__(**locals())
        self._target = _connection.parse_url(url)
        self.keys_for = _scripts.Keys.of(namespace, self._target.db, key_prefix)
        self._connection: _connection.Connection | None = None
        #: The publish and renew scripts, once entered.
        self._scripts: list[Any] = []
        #: uid -> (payload, pid) of the workers this publisher keeps alive.
        self._workers: dict[str, tuple[bytes, int]] = {}
        #: uids whose drop failed: retried with each renewal.
        self._pending_drops: set[str] = set()
        self._lock = asyncio.Lock()
        self._renewer: asyncio.Task[None] | None = None
        #: What stopped the renewer, raised from the next call or the exit.
        self._renewer_failed: BaseException | None = None

    async def __aenter__(self) -> RedisPublisher:
        _errors.require_asyncio("RedisPublisher")
        if self._connection is not None:
            raise RuntimeError("RedisPublisher is already entered")
        # (no I/O before the PING: the clients connect on first use)
        connection = _connection.open_client(self._target, "publisher", self, retries=3)
        try:
            with _errors.within(self.connect_timeout):
                await connection.client.ping()
        except Exception as error:
            with contextlib.suppress(Exception):
                await connection.aclose()
            raise _errors.failed(self.url, "connecting the publisher", error) from error
        self._connection = connection
        self._scripts = _scripts.register(
            connection.client, self._target.cluster, _scripts.PUBLISH, _scripts.RENEW
        )
        self._renewer_failed = None
        self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
        try:
            if exc_info[1] is None:  # (an error leaving the block wins)
                self._raise_if_renewer_failed()
            if self._pending_drops and self._connection is not None:
                with anyio.move_on_after(self.connect_timeout):
                    async with self._lock:
                        await self._retry_drops()
        finally:
            connection, self._connection = self._connection, None
            self._workers.clear()
            self._pending_drops.clear()
            if connection is not None:
                await connection.aclose()

    def _advertised(self, metadata: WorkerMetadata) -> WorkerMetadata:
        address = metadata.address
        host, sep, port = address.rpartition(":")
        if not sep or address.startswith("unix:"):
            return metadata
        if self.advertise_host is not None:
            host = self.advertise_host
        elif _settings.is_wildcard(host):
            host = _default_route_ip()
        else:
            return metadata
        return dataclasses.replace(metadata, address=_connection.address(host, port))

    async def _publish(self, type: str, uid: str, payload: bytes) -> None:
        lease_ms = max(1, round(self.lease * 1000))
        await self._run(self._scripts[0], type, uid, payload, lease_ms)

    async def _run(self, script: Any, *rest: object) -> None:
        keep, keys = _scripts.idle_expiry_ms(self.lease), self.keys_for
        await _scripts.run(script, keys, keep, self.change_log, *rest)

    async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
        """Record (or remove) ``metadata`` and announce it, in one script; a
        drop that fails is retried with each renewal and at exit.

        :raises RuntimeError: if the publisher is not entered.
        :raises ValueError: for an unknown event type.
        :raises RedisDiscoveryError: if the server cannot be reached or
            refuses the command, or the renewal stopped on an error.
        """
        if self._connection is None:
            raise RuntimeError(
                "enter the RedisPublisher (async with) before publishing"
            )
        if type not in ("worker-added", "worker-updated", "worker-dropped"):
            raise ValueError(f"unknown discovery event type: {type!r}")
        self._raise_if_renewer_failed()
        metadata = self._advertised(metadata)
        uid = str(metadata.uid)
        payload = metadata.to_protobuf().SerializeToString()
        async with self._lock:
            if type == "worker-dropped":
                # Forgotten first: a drop that fails is never undone by a
                # renewal adding the worker again.
                self._workers.pop(uid, None)
                self._pending_drops.add(uid)
            else:
                self._pending_drops.discard(uid)
            try:
                await self._publish(type, uid, payload)
            except _errors.FAILURES as error:
                failure = _errors.failed(self.url, f"publishing {type} {uid}", error)
                if type == "worker-dropped":
                    logger.warning(
                        "%s; retrying the drop with the next renewal", failure
                    )
                raise failure from error
            if type == "worker-dropped":
                self._pending_drops.discard(uid)
            else:
                self._workers[uid] = (payload, metadata.pid)

    async def _renew_forever(self) -> None:
        """Renew every ``lease / 3`` seconds until an error other than a lost
        connection, logged at once and kept for the next call."""
        try:
            while True:
                await asyncio.sleep(self.lease / 3)
                try:
                    await self._renew()
                except _errors.FAILURES as error:
                    logger.warning(
                        "renewing the leases of %s at %s failed: %s",
                        self.namespace,
                        _connection.redact(self.url),
                        _connection.reason(error),
                    )
        except Exception as error:
            self._renewer_failed = error
            logger.error(
                "renewing the leases of %s at %s stopped: %s: its workers will expire",
                self.namespace,
                _connection.redact(self.url),
                _connection.reason(error),
                exc_info=error,
            )

    def _raise_if_renewer_failed(self) -> None:
        """:raises RedisDiscoveryError: if the renewer stopped on an error."""
        error = self._renewer_failed
        if error is not None:
            raise _errors.failed(self.url, "renewing the leases", error) from error

    async def _retry_drops(self) -> None:
        for uid in list(self._pending_drops):
            await self._publish("worker-dropped", uid, b"")
            self._pending_drops.discard(uid)
            logger.info(
                "dropped worker %s at %s after all", uid, _connection.redact(self.url)
            )

    async def _renew(self) -> None:
        async with self._lock:
            try:
                await self._retry_drops()
            except _errors.FAILURES as error:
                # Never holds back the renewal of the workers still alive.
                logger.warning(
                    "retrying %d failed drops of %s at %s failed: %s",
                    len(self._pending_drops),
                    self.namespace,
                    _connection.redact(self.url),
                    _connection.reason(error),
                )
            for uid, (_, pid) in list(self._workers.items()):
                if not _process_alive(pid):
                    logger.warning(
                        "worker %s (pid %d) is gone: no longer renewing its lease",
                        uid,
                        pid,
                    )
                    del self._workers[uid]
            pairs: list[object] = []
            for uid, (payload, _) in self._workers.items():
                pairs += (uid, payload)
            await self._run(self._scripts[1], max(1, round(self.lease * 1000)), *pairs)


@suggest_keywords
@final
class RedisDiscovery(_settings.DiscoverySettings):
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
            reap_interval = _settings.check_seconds("lease", lease) / 4
        # Every argument, ``self`` included: none left out of the record.
        _settings.DiscoverySettings.__init__(**locals())

    @functools.cached_property
    def _key(self) -> Hashable:
        """The pool's key, resolved (DNS) when first needed."""
        return _settings.subscription_key(self)

    @functools.cached_property
    def _counters(self) -> _stream.Counters:
        """The key's counters, held while this discovery lives."""
        return _stream.by_key.setdefault(self._key, _stream.Counters())

    @property
    def publisher(self) -> RedisPublisher:
        """A new, unentered :class:`RedisPublisher` for this namespace."""
        return RedisPublisher(
            **_settings.arguments_of(self, _settings.PublisherSettings)
        )

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
            stream: Any = _stream.SharedRedisStream(self)
            _note_options(self._key, stream, _settings.run_options(self))
        else:
            stream = _stream.RedisStream(self)
        return stream if filter is None else afilter(filter, stream)

    def statistics(self) -> _stream.RedisStatistics:
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


#: The key and options of each live shared subscriber, by its ``id``: one
#: given other options than a live one of its key is warned about.
_live: dict[int, tuple[Hashable, tuple[object, ...]]] = {}


def _note_options(
    key: Hashable, subscriber: object, options: tuple[object, ...]
) -> None:
    # A copy: a collection during a comparison may forget a subscriber.
    if any(each == key and known != options for each, known in list(_live.values())):
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
