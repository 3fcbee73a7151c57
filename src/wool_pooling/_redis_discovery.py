"""``RedisDiscovery``: wool discovery on a Redis server, one subscription per process.

See :mod:`wool_pooling.redis` (the public module) for the guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import os
import socket
import time
import uuid
import warnings
import weakref
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar
from typing import cast
from typing import final

import anyio
import attrs
import redis.exceptions as redis_errors
from wool import DiscoveryEvent
from wool import DiscoveryEventType
from wool import DiscoveryLike
from wool import DiscoveryPublisherLike
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata

from ._afilter import afilter
from ._decorator import shared_subscription
from ._redis_connection import Connection
from ._redis_connection import Target
from ._redis_connection import check_client_options
from ._redis_connection import open_client
from ._redis_connection import parse_url
from ._redis_connection import reason
from ._redis_connection import redact
from ._redis_scripts import DEFAULT_KEY_PREFIX
from ._redis_scripts import PUBLISH
from ._redis_scripts import REAP
from ._redis_scripts import RENEW
from ._redis_scripts import SNAPSHOT
from ._redis_scripts import Keys
from ._redis_state import Resync
from ._redis_state import SubscriptionState
from ._restart import RestartPolicy

__all__ = [
    "RedisDiscovery",
    "RedisDiscoveryError",
    "RedisPublisher",
    "RedisStatistics",
    "redact",
]

logger = logging.getLogger("wool_pooling.redis")

T = TypeVar("T")

#: Errors that mean "the connection is gone": reconnect and resynchronise.
_CONNECTION_ERRORS = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    OSError,
    TimeoutError,
)

#: Errors a running subscription retries under its reconnect policy: a lost
#: connection, a sequence it cannot trust, a command the server refused (a
#: key holding the wrong data, an ACL changed meanwhile).
_RETRIED = (*_CONNECTION_ERRORS, Resync, redis_errors.ResponseError)

#: Shortest wait for an announcement, in seconds.
_MIN_WAIT = 0.05

#: How a subscriber reconnects after losing its connection, by default.
DEFAULT_RECONNECT = RestartPolicy(
    attempts=None, backoff=0.1, multiplier=2.0, max_backoff=5.0, jitter=0.2
)


class RedisDiscoveryError(Exception):
    """The Redis server cannot be reached, refused a command, or holds data
    in the discovery's keys that is not the discovery's.

    The message names the action, the server's url without its password, and
    the reason the server (or the OS) gave: ``connecting at redis://...
    failed: ConnectionError: Error 111 connecting to ... Connection
    refused``, ``... WRONGPASS ...``, ``... NOPERM ...``, ``... WRONGDATA
    wool:{ns}:version holds "junk", not a version number``.
    """


@attrs.frozen
class RedisStatistics:
    """What the subscribers of one (connection, namespace) in this process have met."""

    #: Records (or announcements) that were not valid worker metadata: skipped.
    invalid_records: int = 0
    #: Successful reconnections after a lost connection (or a resynchronisation).
    reconnects: int = 0


_statistics: dict[Hashable, RedisStatistics] = {}


def _count(key: Hashable, **increments: int) -> None:
    current = _statistics.get(key, RedisStatistics())
    _statistics[key] = attrs.evolve(
        current,
        **{name: getattr(current, name) + n for name, n in increments.items()},
    )


def _check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
    if not namespace:
        raise ValueError("namespace must not be empty")
    return namespace


def _check_key_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"key_prefix must be a str, got {type(prefix).__name__}")
    if "{" in prefix or "}" in prefix:
        raise ValueError(
            "key_prefix must not contain braces (the namespace's hash tag), "
            f"got {prefix!r}"
        )
    return prefix


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _require_asyncio(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"{what} runs on asyncio only (it is built on redis-py's asyncio "
            "client, and wool itself is asyncio-only), but no asyncio event "
            "loop is running here (trio?). Run it under asyncio, uvloop included."
        ) from None


async def _watched(awaitable: Awaitable[T]) -> T:
    """Await a redis-py call; re-raise a cancellation that it swallowed.

    redis-py reads under ``asyncio.timeout``: a task cancelled as that
    timeout expires can get the timeout's result (``None`` from
    ``get_message``, or a ``TimeoutError``) in place of its
    ``CancelledError``, and then go on as if never cancelled. The task's
    pending cancellation count says it was: raise ``CancelledError`` then.
    """
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    try:
        result = await awaitable
    except Exception:
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError from None
        raise
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return result


def _failure(url: str, action: str, error: BaseException) -> RedisDiscoveryError:
    return RedisDiscoveryError(f"{action} at {redact(url)} failed: {reason(error)}")


def _keys(target: Target, namespace: str, prefix: str) -> Keys:
    return Keys.of(namespace, target.db, prefix)


# -- publisher ------------------------------------------------------------------


def _is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::", "[::]")


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


@final
class RedisPublisher:
    """Announces workers in a namespace's Redis hash, with a renewed lease.

    wool enters it (``async with``) before the first ``publish`` and exits it
    after the last; publishing outside that raises :exc:`RuntimeError`.

    - ``publish("worker-added" | "worker-updated", metadata)`` stores the
      worker's protobuf bytes in the namespace's hash, sets its lease, and
      announces the change, in one Lua script (with the namespace's version
      from ``INCR``). Re-adding a worker with the same metadata only renews
      its lease; updating an unknown worker adds it.
    - ``publish("worker-dropped", metadata)`` removes the record and
      announces the drop (a no-op for an unknown worker). A drop that fails
      (the server unreachable) still raises :class:`RedisDiscoveryError`,
      but the publisher forgets the worker at once (it is never renewed, so
      never added again) and retries the drop with each renewal until the
      server takes it, and once more on exit.
    - **Lease:** while the publisher is entered, every ``lease / 3`` seconds
      it renews the lease of each worker it published whose process
      (``metadata.pid``, on this host) is still alive; a record that has
      gone (expired, or lost when the server restarted without persistence)
      is added again. It stops renewing a worker whose process has died, and
      every worker once the publisher exits or its process is killed: the
      record then expires ``lease`` seconds after its last renewal and is
      dropped (and the drop announced) by the next publisher or subscriber
      of the namespace to look.
    - ``bind_host`` is where wool binds the workers it announces here. A
      worker whose address is a wildcard (``0.0.0.0``) is announced at
      ``advertise_host`` if given, else at this host's default-route
      address, so other machines can reach it.

    Commands are retried (3 times, with jittered backoff) on a lost
    connection; a command that still fails raises :class:`RedisDiscoveryError`
    naming the action, the url without its password and the server's
    reason. ``url``, ``namespace``, ``client_options`` and ``key_prefix``
    are as for :class:`RedisDiscovery` (and checked the same way, at
    construction). Asyncio only.
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
    ) -> None:
        self._target = parse_url(url)
        _check_namespace(namespace)
        if advertise_host is not None and _is_wildcard(advertise_host):
            raise ValueError(
                f"advertise_host must not be a wildcard: {advertise_host!r}"
            )
        self.url = url
        self.namespace = namespace
        self.bind_host = bind_host
        self.advertise_host = advertise_host
        self.lease = _check_seconds("lease", lease)
        self.connect_timeout = _check_seconds("connect_timeout", connect_timeout)
        self.client_options = check_client_options(client_options, self._target)
        self.key_prefix = _check_key_prefix(key_prefix)
        self._keys = _keys(self._target, namespace, key_prefix)
        self._connection: Connection | None = None
        self._scripts: dict[str, Any] = {}
        #: uid -> (payload, pid) of the workers this publisher keeps alive.
        self._workers: dict[str, tuple[bytes, int]] = {}
        #: uids whose drop failed: retried with each renewal.
        self._pending_drops: set[str] = set()
        self._lock = asyncio.Lock()
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RedisPublisher:
        _require_asyncio("RedisPublisher")
        if self._connection is not None:
            raise RuntimeError("RedisPublisher is already entered")
        connection: Connection | None = None
        try:
            connection = open_client(
                self._target,
                "publisher",
                self.namespace,
                self.connect_timeout,
                retries=3,
                client_options=self.client_options,
            )
            try:
                with anyio.fail_after(self.connect_timeout):
                    await connection.client.ping()
            except TimeoutError as error:
                if str(error):
                    raise
                raise TimeoutError(
                    f"no answer within {self.connect_timeout:g}s"
                ) from None
        except Exception as error:
            if connection is not None:
                with contextlib.suppress(Exception):
                    await connection.aclose()
            raise _failure(self.url, "connecting the publisher", error) from error
        self._connection = connection
        client = connection.client
        self._scripts = {
            name: client.register_script(source)
            for name, source in (("publish", PUBLISH), ("renew", RENEW))
        }
        self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
        try:
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
        elif _is_wildcard(host):
            host = _default_route_ip()
        else:
            return metadata
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return dataclasses.replace(metadata, address=f"{host}:{port}")

    def _args(self, *rest: Any) -> list[Any]:
        return [self._keys.channel, uuid.uuid4().hex, *rest]

    async def _run_publish(self, type: str, uid: str, payload: bytes) -> None:
        lease_ms = max(1, round(self.lease * 1000))
        await _watched(
            self._scripts["publish"](
                keys=self._keys.keys, args=self._args(type, uid, payload, lease_ms)
            )
        )

    async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
        """Record (or remove) ``metadata`` and announce it; see the class docstring.

        :raises RuntimeError: if the publisher is not entered.
        :raises ValueError: for an unknown event type.
        :raises RedisDiscoveryError: if the server cannot be reached or
            refuses the command (a failed drop is still retried later).
        """
        if self._connection is None:
            raise RuntimeError(
                "enter the RedisPublisher (async with) before publishing"
            )
        if type not in ("worker-added", "worker-updated", "worker-dropped"):
            raise ValueError(f"unknown discovery event type: {type!r}")
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
                await self._run_publish(type, uid, payload)
            except (redis_errors.RedisError, *_CONNECTION_ERRORS) as error:
                failure = _failure(self.url, f"publishing {type} {uid}", error)
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
        interval = self.lease / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self._renew()
            except (redis_errors.RedisError, *_CONNECTION_ERRORS) as error:
                logger.warning(
                    "renewing the leases of %s at %s failed: %s",
                    self.namespace,
                    redact(self.url),
                    reason(error),
                )

    async def _retry_drops(self) -> None:
        for uid in list(self._pending_drops):
            await self._run_publish("worker-dropped", uid, b"")
            self._pending_drops.discard(uid)
            logger.info("dropped worker %s at %s after all", uid, redact(self.url))

    async def _renew(self) -> None:
        async with self._lock:
            try:
                await self._retry_drops()
            except (redis_errors.RedisError, *_CONNECTION_ERRORS) as error:
                # Never holds back the renewal of the workers still alive.
                logger.warning(
                    "retrying %d failed drops of %s at %s failed: %s",
                    len(self._pending_drops),
                    self.namespace,
                    redact(self.url),
                    reason(error),
                )
            for uid, (_, pid) in list(self._workers.items()):
                if not _process_alive(pid):
                    logger.warning(
                        "worker %s (pid %d) is gone: no longer renewing its lease",
                        uid,
                        pid,
                    )
                    del self._workers[uid]
            args = self._args(max(1, round(self.lease * 1000)))
            for uid, (payload, _) in self._workers.items():
                args += [uid, payload]
            await _watched(self._scripts["renew"](keys=self._keys.keys, args=args))


# -- subscriber -----------------------------------------------------------------


@attrs.frozen
class _Options:
    """The subscriber's settings (picklable if ``client_options`` are)."""

    connect_timeout: float
    reap_interval: float
    reconnect: RestartPolicy
    #: After the server lost its data: seconds to wait for publishers to add
    #: their workers again before dropping the ones they do not.
    settle: float
    key_prefix: str = DEFAULT_KEY_PREFIX
    client_options: Mapping[str, Any] = attrs.field(
        factory=lambda: dict[str, Any](), hash=False
    )


@final
class _Session:
    """One connection's worth of subscription: pub/sub plus a command client."""

    def __init__(self, target: Target, namespace: str, options: _Options) -> None:
        self.keys = _keys(target, namespace, options.key_prefix)
        self.command: Connection | None = None
        self.listening: Connection | None = None
        self.pubsub: Any = None
        #: What :meth:`open` is doing, for error messages.
        self.stage = "connecting"
        timeout = options.connect_timeout
        # No retries on either: a lost connection must end the session (a
        # silent reconnect would miss announcements).
        self.command = open_client(
            target,
            "subscriber-cmd",
            namespace,
            timeout,
            retries=0,
            client_options=options.client_options,
        )
        self.listening = open_client(
            target,
            "subscriber",
            namespace,
            timeout,
            retries=0,
            client_options=options.client_options,
        )
        self.pubsub = self.listening.client.pubsub()
        self.snapshot_script: Any = self.command.client.register_script(SNAPSHOT)
        self.reap_script: Any = self.command.client.register_script(REAP)

    def _args(self) -> list[str]:
        return [self.keys.channel, uuid.uuid4().hex]

    async def open(self) -> tuple[int, bytes, list[bytes]]:
        """Subscribe, wait for the confirmation, then snapshot:
        (version, epoch, flat hash)."""
        self.stage = "subscribing"
        await _watched(self.pubsub.subscribe(self.keys.channel))
        while True:
            message = await _watched(self.pubsub.get_message(timeout=None))
            if message is not None and message["type"] == "subscribe":
                break
        self.stage = "taking a snapshot"
        version, epoch, flat = await _watched(
            self.snapshot_script(keys=self.keys.keys, args=self._args())
        )
        return int(version), cast(bytes, epoch), cast(list[bytes], flat)

    async def next_message(self, wait: float) -> dict[str, Any] | None:
        """The next announcement, or None after ``wait`` seconds without one."""
        return await _watched(
            self.pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
        )

    async def reap(self) -> bytes:
        """Reap expired leases; the namespace's epoch."""
        return cast(
            bytes,
            await _watched(self.reap_script(keys=self.keys.keys, args=self._args())),
        )

    async def aclose(self) -> None:
        closers: list[Callable[[], Awaitable[Any]]] = []
        if self.pubsub is not None:
            closers.append(self.pubsub.aclose)
        closers += [c.aclose for c in (self.listening, self.command) if c is not None]
        for close in closers:
            with contextlib.suppress(Exception):
                await close()


class _RedisStream:
    """The raw subscription: one connection per iteration, reconnecting.

    Each iteration subscribes to the namespace's channel, then reads the hash
    and its version in one script (the snapshot), yields the difference
    between what it has yielded so far and the snapshot (on the first
    connection: every worker, as ``worker-added``), then every announcement
    with a version above the snapshot's, in version order; announcements at
    or below it are duplicates and skipped. A version gap, an announcement
    from another epoch or one that does not parse, or a lost connection,
    ends the session: after the reconnect policy's delay a new session
    takes a new snapshot and yields only the difference. Between
    announcements it reaps expired leases every ``reap_interval`` seconds
    (and checks the epoch: a flush is noticed even if nothing is announced).
    :class:`~wool_pooling._redis_state.SubscriptionState` turns each input
    into events.
    """

    def __init__(self, url: str, namespace: str, options: _Options) -> None:
        self.url = url
        self.namespace = namespace
        self.options = options
        self._target = parse_url(url)
        self._stats_key = _subscriber_key(type(self), url, namespace, options)

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self._events()

    async def _events(self) -> AsyncGenerator[DiscoveryEvent, None]:
        _require_asyncio("RedisDiscovery's subscriber")
        state = SubscriptionState(self.options.settle, self._invalid)
        failures = 0
        while True:
            session: _Session | None = None
            try:
                session = self._session(state)
                snapshot = await self._open(session, state)
                events, lost = state.snapshot(*snapshot, now=time.monotonic())
                if failures:
                    self._reconnected(lost)
                failures = 0
                for event in events:
                    yield event
                # Closed here, not by the garbage collector, when this
                # generator is closed while suspended in it.
                async with contextlib.aclosing(self._follow(session, state)) as follow:
                    async for event in follow:
                        yield event
            except _RETRIED as error:
                failures += 1
                await self._back_off(error, failures)
            finally:
                if session is not None:
                    with anyio.CancelScope(shield=True):
                        await session.aclose()

    def _session(self, state: SubscriptionState) -> _Session:
        try:
            return _Session(self._target, self.namespace, self.options)
        except Exception as error:
            if state.connected_before:
                raise
            raise _failure(self.url, "connecting", error) from error

    async def _open(
        self, session: _Session, state: SubscriptionState
    ) -> tuple[int, bytes, list[bytes]]:
        """Subscribe and snapshot; the first time, any failure is a
        :class:`RedisDiscoveryError` at once (within ``connect_timeout``)."""
        timeout = self.options.connect_timeout
        try:
            try:
                with anyio.fail_after(timeout):
                    return await session.open()
            except TimeoutError as error:
                if str(error):
                    raise
                raise TimeoutError(f"no answer within {timeout:g}s") from None
        except Exception as error:
            if state.connected_before:
                raise
            if isinstance(error, redis_errors.AuthenticationError):
                action = "authenticating"
            elif isinstance(error, redis_errors.ResponseError):
                action = session.stage
            else:
                action = "connecting"
            raise _failure(self.url, action, error) from error

    async def _follow(
        self, session: _Session, state: SubscriptionState
    ) -> AsyncGenerator[DiscoveryEvent, None]:
        """The session's events: announcements, settled drops, reaps."""
        options = self.options
        next_reap = time.monotonic() + options.reap_interval
        while True:
            now = time.monotonic()
            if state.held and now >= state.settle_until:
                for event in state.settle():
                    yield event
                continue
            if now >= next_reap:
                state.reaped(await session.reap())
                next_reap = time.monotonic() + options.reap_interval
                continue
            wait = next_reap - now
            if state.held:
                wait = min(wait, state.settle_until - now)
            # Never a very short read: a read cut short by its timeout
            # mid-message is what redis-py's pub/sub handles worst.
            message = await session.next_message(max(wait, _MIN_WAIT))
            if message is None:
                continue
            event = state.message(message.get("data"))
            if event is not None:
                yield event

    def _reconnected(self, lost: bool) -> None:
        _count(self._stats_key, reconnects=1)
        logger.warning(
            "reconnected to %s (namespace %s): resynchronising%s",
            redact(self.url),
            self.namespace,
            f" (the server lost its data: waiting {self.options.settle:.1f}s "
            "for publishers to renew their workers)"
            if lost
            else "",
        )

    async def _back_off(self, error: BaseException, failures: int) -> None:
        """Wait as the reconnect policy says, or raise when it is spent."""
        policy = self.options.reconnect
        if not policy.allows(failures):
            logger.error(
                "giving up on %s (namespace %s) after %d reconnects: %s",
                redact(self.url),
                self.namespace,
                failures - 1,
                reason(error),
            )
            raise _failure(self.url, "reconnecting", error) from error
        delay = policy.delay(failures)
        logger.warning(
            "lost %s (namespace %s): %s; reconnecting in %.3fs (attempt %d)",
            redact(self.url),
            self.namespace,
            reason(error),
            delay,
            failures,
        )
        await anyio.sleep(delay)

    def _invalid(self, what: bytes, error: BaseException) -> None:
        _count(self._stats_key, invalid_records=1)
        logger.warning(
            "skipping a record of namespace %s at %s that is not valid worker "
            "metadata (%r): %s",
            self.namespace,
            redact(self.url),
            what,
            reason(error),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact(self.url)!r}, {self.namespace!r})"


def _subscriber_key(cls: type, url: str, namespace: str, options: _Options) -> Hashable:
    """Subscriptions are shared by normalised connection (scheme, resolved
    host, port, database, user), key prefix and namespace."""
    return (parse_url(url).key, options.key_prefix, namespace)


@shared_subscription(key=_subscriber_key)
class _SharedRedisStream(_RedisStream):
    """The process's one subscription per (connection, namespace), shared."""


#: The options of the live shared subscribers, by key: a subscriber with
#: other options than an earlier live one of its key is warned about.
_live: dict[Hashable, list[tuple[weakref.ref[Any], _Options]]] = {}


def _note_options(key: Hashable, subscription: object, options: _Options) -> None:
    entries = [(ref, each) for ref, each in _live.get(key, []) if ref() is not None]
    if any(each != options for _, each in entries):
        warnings.warn(
            "a RedisDiscovery subscriber shares the subscription of an earlier "
            "one to the same connection and namespace but was given other "
            "options (connect_timeout, reap_interval, reconnect, lease, "
            "client_options): the earlier subscriber's apply",
            RuntimeWarning,
            stacklevel=3,
        )
    entries.append((weakref.ref(subscription), options))
    _live[key] = entries


# -- the discovery ----------------------------------------------------------------


@final
class RedisDiscovery:
    """A wool ``DiscoveryLike`` on one Redis server (or a Sentinel-monitored master).

    :mod:`wool_pooling.redis` states the guarantees in full: ordering by the
    namespace's version, one shared subscription per connection, namespace
    and process, what a reconnect does, lease semantics, asyncio only.

    :param url: The server: ``redis://[user[:password]@]host[:port][/db]``
        (``rediss://`` for TLS), ``unix:///path/to/redis.sock[?db=N]``, or
        ``redis+sentinel://[user[:password]@]host:port[,host:port...]/service_name[/db]``
        (the sentinels, and the name of the master they monitor;
        ``rediss+sentinel://`` for TLS). Checked here.
    :param namespace: Workers are shared between discoveries of one
        namespace only (a non-empty ``str``, any characters).
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
    :param reconnect: How a subscription retries a lost connection
        (``attempts``, ``backoff``, ``multiplier``, ``max_backoff`` and
        ``jitter`` apply); unlimited attempts by default.
    :param shared: ``False`` gives every iteration of every subscriber its
        own connections, as a discovery without this library would (for
        comparison).
    :param client_options: Keyword arguments for redis-py's client (its
        ``ssl_*`` options, a ``credential_provider``,
        ``health_check_interval``, ``password``, ``sentinel_kwargs`` for
        the sentinels' own connections, ...), and ``ssl_context``: an
        :class:`ssl.SSLContext` for the TLS connections to the server (a
        ``rediss://`` or ``rediss+sentinel://`` url). The url's parts and query
        parameters win over them; they win over the discovery's defaults
        (``socket_connect_timeout`` and ``socket_timeout`` from
        ``connect_timeout``, TCP keepalive). ``client_name``,
        ``decode_responses``, ``retry``, ``retry_on_error``,
        ``retry_on_timeout``, ``connection_pool``,
        ``single_connection_client``, ``url``, ``host``, ``port``, ``path``
        and ``db`` are the discovery's own. They must pickle for the
        subscriber to be sent to another process (as wool does to its
        workers): an ``ssl.SSLContext`` does not, the ``ssl_*`` file
        options do.
    :param key_prefix: The prefix of every key and channel, ``"wool:"`` by
        default (no braces).
    :raises TypeError: if ``url``, ``namespace`` or ``key_prefix`` is not a
        ``str``, ``client_options`` is not a mapping (or its ``ssl_context``
        not an ``ssl.SSLContext``), or ``reconnect`` is not a
        ``RestartPolicy``.
    :raises ValueError: for a malformed url (scheme, host or socket path,
        port, database, Sentinel service), an empty namespace, a lease,
        reap interval or timeout that is not a finite number > 0, a
        reserved client option, an ``ssl_context`` for a url without TLS,
        or braces in ``key_prefix``.
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
    ) -> None:
        target = parse_url(url)
        _check_namespace(namespace)
        lease = _check_seconds("lease", lease)
        connect_timeout = _check_seconds("connect_timeout", connect_timeout)
        reap_interval = (
            lease / 4
            if reap_interval is None
            else _check_seconds("reap_interval", reap_interval)
        )
        if not isinstance(reconnect, RestartPolicy):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"reconnect must be a RestartPolicy, got {reconnect!r}")
        options = check_client_options(client_options, target)
        _check_key_prefix(key_prefix)
        self.url = url
        self.namespace = namespace
        self.bind_host = bind_host
        self.advertise_host = advertise_host
        self.lease = lease
        self.connect_timeout = connect_timeout
        self.shared = shared
        self.client_options: Mapping[str, Any] = options
        self.key_prefix = key_prefix
        self._options = _Options(
            connect_timeout=connect_timeout,
            reap_interval=reap_interval,
            reconnect=reconnect,
            settle=lease,
            key_prefix=key_prefix,
            client_options=options,
        )
        self._target = target
        # A publisher's settings, checked now rather than at first use.
        if advertise_host is not None and _is_wildcard(advertise_host):
            raise ValueError(
                f"advertise_host must not be a wildcard: {advertise_host!r}"
            )

    @functools.cached_property
    def _key(self) -> Hashable:
        """The pool's key: resolving a host name waits for DNS, once per
        process and host, so it is done when first needed."""
        return (self._target.key, self.key_prefix, self.namespace)

    @property
    def publisher(self) -> RedisPublisher:
        """A new, unentered :class:`RedisPublisher` for this namespace."""
        return RedisPublisher(
            self.url,
            self.namespace,
            bind_host=self.bind_host,
            advertise_host=self.advertise_host,
            lease=self.lease,
            connect_timeout=self.connect_timeout,
            client_options=self.client_options,
            key_prefix=self.key_prefix,
        )

    @property
    def subscriber(self) -> DiscoverySubscriberLike:
        """The unfiltered subscriber; same as ``subscribe()``."""
        return self.subscribe()

    def subscribe(
        self, filter: Callable[[WorkerMetadata], bool] | None = None
    ) -> DiscoverySubscriberLike:
        """A subscriber to this namespace, filtered by ``filter`` if given.

        With ``shared=True`` (the default) every subscriber of the process to
        the same connection (scheme, resolved host, port, database and user:
        ``redis://127.0.0.1:6379/0``, ``redis://127.0.0.1:6379`` and
        ``redis://localhost:6379/0`` are one), key prefix and namespace
        shares one subscription, with the options of the one that started
        it: a subscriber given other options while an earlier one is alive
        gets a :exc:`RuntimeWarning` saying so. Each filter is applied to
        its own consumer by :class:`~wool_pooling.afilter`. With
        ``shared=False`` every iteration opens its own connection.
        """
        if self.shared:
            stream: Any = _SharedRedisStream(self.url, self.namespace, self._options)
            _note_options(self._key, stream, self._options)
        else:
            stream = _RedisStream(self.url, self.namespace, self._options)
        if filter is None:
            return cast(DiscoverySubscriberLike, stream)
        return afilter(filter, cast(DiscoverySubscriberLike, stream))

    def statistics(self) -> RedisStatistics:
        """Counters of this process's subscribers to this connection and namespace."""
        return _statistics.get(self._key, RedisStatistics())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RedisDiscovery):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash((RedisDiscovery, self._key))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as what it is made of: url, namespace and options.

        No connection, client or other state a subscription or publisher
        opened travels: the copy is built by calling the class again.
        """
        import functools

        rebuild = functools.partial(
            RedisDiscovery,
            self.url,
            self.namespace,
            bind_host=self.bind_host,
            advertise_host=self.advertise_host,
            lease=self.lease,
            reap_interval=self._options.reap_interval,
            connect_timeout=self.connect_timeout,
            reconnect=self._options.reconnect,
            shared=self.shared,
        )
        return (rebuild, ())

    def __repr__(self) -> str:
        return f"RedisDiscovery({redact(self.url)!r}, {self.namespace!r})"


if TYPE_CHECKING:  # pyright (strict, on src/) checks them against wool's protocols
    _discovery: DiscoveryLike = RedisDiscovery("redis://localhost", "namespace")
    _publisher: DiscoveryPublisherLike = RedisPublisher(
        "redis://localhost", "namespace"
    )
