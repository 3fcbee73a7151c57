"""``RedisDiscovery``: wool discovery on a Redis server, one subscription per process.

See :mod:`wool_pooling.redis` (the public module) for the guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import socket
import time
import urllib.parse
import uuid
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar
from typing import cast
from typing import final

import anyio
import attrs
import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff
from redis.backoff import NoBackoff
from wool import DiscoveryEvent
from wool import DiscoveryEventType
from wool import DiscoveryLike
from wool import DiscoveryPublisherLike
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata
from wool import protocol

from ._afilter import afilter
from ._decorator import shared_subscription
from ._redis_scripts import PUBLISH
from ._redis_scripts import REAP
from ._redis_scripts import RENEW
from ._redis_scripts import SNAPSHOT
from ._redis_scripts import Keys
from ._restart import RestartPolicy

__all__ = [
    "RedisDiscovery",
    "RedisDiscoveryError",
    "RedisPublisher",
    "RedisStatistics",
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

#: Shortest wait for an announcement, in seconds.
_MIN_WAIT = 0.05

#: How a subscriber reconnects after losing its connection, by default.
DEFAULT_RECONNECT = RestartPolicy(
    attempts=None, backoff=0.1, multiplier=2.0, max_backoff=5.0, jitter=0.2
)


class RedisDiscoveryError(Exception):
    """The Redis server cannot be reached or refused a command.

    The message names the server's URL with any password removed.
    """


@attrs.frozen
class RedisStatistics:
    """What the subscribers of one (url, namespace) in this process have met."""

    #: Records (or announcements) that were not valid worker metadata: skipped.
    invalid_records: int = 0
    #: Successful reconnections after a lost connection.
    reconnects: int = 0


_statistics: dict[tuple[str, str], RedisStatistics] = {}


def _count(url: str, namespace: str, **increments: int) -> None:
    current = _statistics.get((url, namespace), RedisStatistics())
    _statistics[url, namespace] = attrs.evolve(
        current,
        **{name: getattr(current, name) + n for name, n in increments.items()},
    )


def redact(url: str) -> str:
    """``url`` with its password (if any) removed, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urllib.parse.urlunsplit(
        (parts.scheme, f"{user}{host}", parts.path, parts.query, parts.fragment)
    )


def _require_asyncio(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"{what} runs on asyncio only (it is built on redis-py's asyncio "
            "client, and wool itself is asyncio-only), but no asyncio event "
            "loop is running here (trio?). Run it under asyncio, uvloop included."
        ) from None


def _client_name(role: str, namespace: str) -> str:
    """``CLIENT SETNAME`` value: who holds the connection, for ``CLIENT LIST``."""

    def clean(text: str) -> str:
        return "".join(c if c.isprintable() and not c.isspace() else "_" for c in text)

    host = clean(socket.gethostname())
    return f"wool-pooling:{role}:{clean(namespace)}:{host}:{os.getpid()}"


def _connect(
    url: str, role: str, namespace: str, timeout: float, *, retries: int
) -> Any:
    """A redis-py asyncio client whose connections name themselves."""
    retry = (
        Retry(EqualJitterBackoff(cap=timeout, base=0.05), retries)
        if retries
        else Retry(NoBackoff(), 0)
    )
    return aioredis.Redis.from_url(  # pyright: ignore[reportUnknownMemberType]
        url,
        client_name=_client_name(role, namespace),
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        socket_keepalive=True,
        retry=retry,
        retry_on_error=[redis_errors.ConnectionError, redis_errors.TimeoutError],
    )


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
    return RedisDiscoveryError(f"{action} at {redact(url)} failed: {error!r}")


def _decode(uid: bytes, payload: bytes) -> WorkerMetadata:
    metadata = WorkerMetadata.from_protobuf(protocol.WorkerMetadata.FromString(payload))
    if str(metadata.uid) != uid.decode():
        raise ValueError(f"record {uid!r} holds the metadata of worker {metadata.uid}")
    return metadata


def _version_of(data: object) -> int | None:
    """The version an announcement carries, or None if it has none."""
    if not isinstance(data, bytes):
        return None
    head = data.split(b" ", 1)[0]
    return int(head) if head.isdigit() else None


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
      announces the drop (a no-op for an unknown worker).
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
    naming the URL without its password. Asyncio only.
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
    ) -> None:
        if advertise_host is not None and _is_wildcard(advertise_host):
            raise ValueError(
                f"advertise_host must not be a wildcard: {advertise_host!r}"
            )
        self.url = url
        self.namespace = namespace
        self.bind_host = bind_host
        self.advertise_host = advertise_host
        self.lease = lease
        self.connect_timeout = connect_timeout
        self._keys = Keys.of(namespace)
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        #: uid -> (payload, pid) of the workers this publisher keeps alive.
        self._workers: dict[str, tuple[bytes, int]] = {}
        self._lock = asyncio.Lock()
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RedisPublisher:
        _require_asyncio("RedisPublisher")
        if self._client is not None:
            raise RuntimeError("RedisPublisher is already entered")
        client = _connect(
            self.url, "publisher", self.namespace, self.connect_timeout, retries=3
        )
        try:
            with anyio.fail_after(self.connect_timeout):
                await client.ping()
        except (*_CONNECTION_ERRORS, redis_errors.RedisError) as error:
            await client.aclose()
            raise _failure(self.url, "connecting the publisher", error) from error
        self._client = client
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
        client, self._client = self._client, None
        self._workers.clear()
        if client is not None:
            await client.aclose()

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

    async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
        """Record (or remove) ``metadata`` and announce it; see the class docstring.

        :raises RuntimeError: if the publisher is not entered.
        :raises ValueError: for an unknown event type.
        :raises RedisDiscoveryError: if the server cannot be reached or
            refuses the command.
        """
        client = self._client
        if client is None:
            raise RuntimeError(
                "enter the RedisPublisher (async with) before publishing"
            )
        if type not in ("worker-added", "worker-updated", "worker-dropped"):
            raise ValueError(f"unknown discovery event type: {type!r}")
        metadata = self._advertised(metadata)
        uid = str(metadata.uid)
        payload = metadata.to_protobuf().SerializeToString()
        lease_ms = max(1, round(self.lease * 1000))
        async with self._lock:
            try:
                await _watched(
                    self._scripts["publish"](
                        keys=self._keys.keys,
                        args=[self._keys.channel, type, uid, payload, lease_ms],
                    )
                )
            except redis_errors.RedisError as error:
                raise _failure(self.url, f"publishing {type} {uid}", error) from error
            if type == "worker-dropped":
                self._workers.pop(uid, None)
            else:
                self._workers[uid] = (payload, metadata.pid)

    async def _renew_forever(self) -> None:
        interval = self.lease / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self._renew()
            except redis_errors.RedisError as error:
                logger.warning(
                    "renewing the leases of %s at %s failed: %r",
                    self.namespace,
                    redact(self.url),
                    error,
                )

    async def _renew(self) -> None:
        async with self._lock:
            for uid, (_, pid) in list(self._workers.items()):
                if not _process_alive(pid):
                    logger.warning(
                        "worker %s (pid %d) is gone: no longer renewing its lease",
                        uid,
                        pid,
                    )
                    del self._workers[uid]
            args: list[Any] = [self._keys.channel, max(1, round(self.lease * 1000))]
            for uid, (payload, _) in self._workers.items():
                args += [uid, payload]
            await self._scripts["renew"](keys=self._keys.keys, args=args)


# -- subscriber -----------------------------------------------------------------


@attrs.frozen
class _Options:
    """The subscriber's settings (picklable, hashable)."""

    connect_timeout: float
    reap_interval: float
    reconnect: RestartPolicy
    #: After the server lost its data: seconds to wait for publishers to add
    #: their workers again before dropping the ones they do not.
    settle: float


class _Gap(Exception):
    """An announcement is missing: take a new snapshot."""


@final
class _Session:
    """One connection's worth of subscription: pub/sub plus a command client."""

    def __init__(self, url: str, namespace: str, options: _Options) -> None:
        self.url = url
        self.keys = Keys.of(namespace)
        timeout = options.connect_timeout
        # No retries on either: a lost connection must end the session (a
        # silent reconnect would miss announcements).
        self.client: Any = _connect(
            url, "subscriber-cmd", namespace, timeout, retries=0
        )
        self.listener: Any = _connect(url, "subscriber", namespace, timeout, retries=0)
        self.pubsub: Any = self.listener.pubsub()
        self.snapshot_script: Any = self.client.register_script(SNAPSHOT)
        self.reap_script: Any = self.client.register_script(REAP)

    async def open(self) -> tuple[int, bytes, list[bytes]]:
        """Subscribe, wait for the confirmation, then snapshot:
        (version, epoch, flat hash)."""
        await _watched(self.pubsub.subscribe(self.keys.channel))
        while True:
            message = await _watched(self.pubsub.get_message(timeout=None))
            if message is not None and message["type"] == "subscribe":
                break
        version, epoch, flat = await _watched(
            self.snapshot_script(
                keys=self.keys.snapshot_keys,
                args=[self.keys.channel, uuid.uuid4().hex],
            )
        )
        return int(version), cast(bytes, epoch), cast(list[bytes], flat)

    async def next_message(self, wait: float) -> dict[str, Any] | None:
        """The next announcement, or None after ``wait`` seconds without one."""
        return await _watched(
            self.pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
        )

    async def reap(self) -> None:
        await _watched(self.reap_script(keys=self.keys.keys, args=[self.keys.channel]))

    async def aclose(self) -> None:
        for close in (self.pubsub.aclose, self.listener.aclose, self.client.aclose):
            with contextlib.suppress(Exception):
                await close()


class _RedisStream:
    """The raw subscription: one connection per iteration, reconnecting.

    Each iteration subscribes to the namespace's channel, then reads the hash
    and its version in one script (the snapshot), yields the difference
    between what it has yielded so far and the snapshot (on the first
    connection: every worker, as ``worker-added``), then every announcement
    with a version above the snapshot's, in version order; announcements at
    or below it are duplicates and skipped. A version gap, or a lost
    connection, ends the session: after the reconnect policy's delay a new
    session takes a new snapshot and yields only the difference. Between
    announcements it reaps expired leases every ``reap_interval`` seconds.
    """

    def __init__(self, url: str, namespace: str, options: _Options) -> None:
        self.url = url
        self.namespace = namespace
        self.options = options

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self._events()

    async def _events(self) -> AsyncGenerator[DiscoveryEvent, None]:
        _require_asyncio("RedisDiscovery's subscriber")
        options = self.options
        known: dict[uuid.UUID, tuple[bytes, WorkerMetadata]] = {}
        failures = 0
        connected = False
        epoch_seen: bytes | None = None
        # Workers held after the server lost its data, until `settle_until`.
        held: set[uuid.UUID] = set()
        settle_until = 0.0
        while True:
            session = _Session(self.url, self.namespace, options)
            try:
                try:
                    with anyio.fail_after(options.connect_timeout):
                        version, epoch, flat = await session.open()
                except redis_errors.ResponseError as error:
                    raise _failure(self.url, "subscribing", error) from error
                except redis_errors.AuthenticationError as error:
                    raise _failure(self.url, "authenticating", error) from error
                except _CONNECTION_ERRORS as error:
                    if not connected:
                        raise _failure(self.url, "connecting", error) from error
                    raise
                lost = epoch_seen is not None and epoch != epoch_seen
                epoch_seen = epoch
                if connected:
                    _count(self.url, self.namespace, reconnects=1)
                    logger.warning(
                        "reconnected to %s (namespace %s): resynchronising%s",
                        redact(self.url),
                        self.namespace,
                        f" (the server lost its data: waiting {options.settle:.1f}s "
                        "for publishers to renew their workers)"
                        if lost
                        else "",
                    )
                connected = True
                failures = 0
                events, held = self._resync(known, flat, hold=lost)
                settle_until = time.monotonic() + options.settle
                for event in events:
                    yield event
                last = version
                next_reap = time.monotonic() + options.reap_interval
                while True:
                    now = time.monotonic()
                    if held and now >= settle_until:
                        for uid in list(held):
                            before = known.pop(uid, None)
                            if before is not None:
                                yield DiscoveryEvent(
                                    "worker-dropped", metadata=before[1]
                                )
                        held.clear()
                        continue
                    if now >= next_reap:
                        await session.reap()
                        next_reap = time.monotonic() + options.reap_interval
                        continue
                    wait = next_reap - now
                    if held:
                        wait = min(wait, settle_until - now)
                    # Never a very short read: a read cut short by its timeout
                    # mid-message is what redis-py's pub/sub handles worst.
                    message = await session.next_message(max(wait, _MIN_WAIT))
                    if message is None:
                        continue
                    data = message.get("data")
                    number = _version_of(data)
                    if number is not None and number <= last:
                        continue  # already in the snapshot, or a duplicate
                    if number is not None and number != last + 1:
                        raise _Gap(f"expected version {last + 1}, got {number}")
                    if number is not None:
                        last = number
                    parsed = self._parse(data)
                    if parsed is None:
                        continue
                    kind, uid, metadata, payload = parsed
                    held.discard(metadata.uid)
                    event = self._apply(known, kind, uid, metadata, payload)
                    if event is not None:
                        yield event
            except (*_CONNECTION_ERRORS, _Gap) as error:
                failures += 1
                policy = options.reconnect
                if not policy.allows(failures):
                    logger.error(
                        "giving up on %s (namespace %s) after %d reconnects: %r",
                        redact(self.url),
                        self.namespace,
                        failures - 1,
                        error,
                    )
                    raise _failure(self.url, "reconnecting", error) from error
                delay = policy.delay(failures)
                logger.warning(
                    "lost %s (namespace %s): %r; reconnecting in %.3fs (attempt %d)",
                    redact(self.url),
                    self.namespace,
                    error,
                    delay,
                    failures,
                )
                await anyio.sleep(delay)
            finally:
                with anyio.CancelScope(shield=True):
                    await session.aclose()

    def _resync(
        self,
        known: dict[uuid.UUID, tuple[bytes, WorkerMetadata]],
        flat: list[bytes],
        *,
        hold: bool,
    ) -> tuple[list[DiscoveryEvent], set[uuid.UUID]]:
        """Events turning ``known`` into the snapshot ``flat``; updates ``known``.

        With ``hold``, the known workers missing from the snapshot are not
        dropped but kept, and returned (the caller drops those that are not
        announced again in time).
        """
        current: dict[uuid.UUID, tuple[bytes, WorkerMetadata]] = {}
        for index in range(0, len(flat), 2):
            uid, payload = flat[index], flat[index + 1]
            try:
                metadata = _decode(uid, payload)
            except Exception as error:
                self._invalid(uid, error)
                continue
            current[metadata.uid] = (payload, metadata)
        events: list[DiscoveryEvent] = []
        for uid, (payload, metadata) in current.items():
            before = known.get(uid)
            if before is None:
                events.append(DiscoveryEvent("worker-added", metadata=metadata))
            elif before[0] != payload:
                events.append(DiscoveryEvent("worker-updated", metadata=metadata))
        missing = {uid: value for uid, value in known.items() if uid not in current}
        if not hold:
            for _, metadata in missing.values():
                events.append(DiscoveryEvent("worker-dropped", metadata=metadata))
        known.clear()
        known.update(current)
        if hold:
            known.update(missing)
        return events, set(missing) if hold else set()

    def _parse(self, data: object) -> tuple[str, bytes, WorkerMetadata, bytes] | None:
        """``(type, uid, metadata, payload)``, or None (warned, counted).

        An announcement whose version is readable but whose rest is not
        still takes its place in the sequence (the caller advanced it).
        """
        try:
            _, kind, uid, payload = cast(bytes, data).split(b" ", 3)
            text = kind.decode()
            if text not in ("worker-added", "worker-updated", "worker-dropped"):
                raise ValueError(f"unknown event type {text!r}")
            return text, uid, _decode(uid, payload), payload
        except Exception as error:
            self._invalid(data[:60] if isinstance(data, bytes) else b"?", error)
            return None

    def _apply(
        self,
        known: dict[uuid.UUID, tuple[bytes, WorkerMetadata]],
        kind: str,
        uid: bytes,
        metadata: WorkerMetadata,
        payload: bytes,
    ) -> DiscoveryEvent | None:
        """The event for consumers (never a second add, never an unknown drop)."""
        before = known.get(metadata.uid)
        if kind == "worker-dropped":
            if before is None:
                return None
            del known[metadata.uid]
            return DiscoveryEvent("worker-dropped", metadata=before[1])
        known[metadata.uid] = (payload, metadata)
        if before is None:
            return DiscoveryEvent("worker-added", metadata=metadata)
        if before[0] == payload:
            return None
        return DiscoveryEvent("worker-updated", metadata=metadata)

    def _invalid(self, what: bytes, error: BaseException) -> None:
        _count(self.url, self.namespace, invalid_records=1)
        logger.warning(
            "skipping a record of namespace %s at %s that is not valid worker "
            "metadata (%r): %r",
            self.namespace,
            redact(self.url),
            what,
            error,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact(self.url)!r}, {self.namespace!r})"


def _subscriber_key(cls: type, url: str, namespace: str, options: _Options) -> object:
    return (url, namespace)


@shared_subscription(key=_subscriber_key)
class _SharedRedisStream(_RedisStream):
    """The process's one subscription per (url, namespace), shared by every proxy."""


# -- the discovery ----------------------------------------------------------------


@final
class RedisDiscovery:
    """A wool ``DiscoveryLike`` on one Redis server.

    :mod:`wool_pooling.redis` states the guarantees in full: ordering by the
    namespace's version, one shared subscription per (url, namespace) and
    process, what a reconnect does, lease semantics, asyncio only.

    :param url: The server, as redis-py takes it
        (``redis://[user:password@]host:port/db``, ``rediss://`` for TLS).
    :param namespace: Workers are shared between discoveries of one
        namespace only.
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
    :raises ValueError: for a lease, reap interval or timeout that is not a
        finite number > 0, or an empty namespace.
    :raises TypeError: if ``reconnect`` is not a ``RestartPolicy``.
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
    ) -> None:
        for name, value in (("lease", lease), ("connect_timeout", connect_timeout)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if reap_interval is None:
            reap_interval = lease / 4
        elif not (math.isfinite(reap_interval) and reap_interval > 0):
            raise ValueError(
                f"reap_interval must be a finite number > 0, got {reap_interval!r}"
            )
        if not namespace:
            raise ValueError("namespace must not be empty")
        if not isinstance(reconnect, RestartPolicy):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"reconnect must be a RestartPolicy, got {reconnect!r}")
        self.url = url
        self.namespace = namespace
        self.bind_host = bind_host
        self.advertise_host = advertise_host
        self.lease = float(lease)
        self.connect_timeout = float(connect_timeout)
        self.shared = shared
        self._options = _Options(
            connect_timeout=float(connect_timeout),
            reap_interval=float(reap_interval),
            reconnect=reconnect,
            settle=float(lease),
        )

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
        the same (url, namespace) shares one connection; each filter is
        applied to its own consumer by :class:`~wool_pooling.afilter`. With
        ``shared=False`` every iteration opens its own connection.
        """
        stream_type = _SharedRedisStream if self.shared else _RedisStream
        stream = cast(
            DiscoverySubscriberLike,
            stream_type(self.url, self.namespace, self._options),
        )
        if filter is None:
            return stream
        return afilter(filter, stream)

    def statistics(self) -> RedisStatistics:
        """Counters of this process's subscribers to this (url, namespace)."""
        return _statistics.get((self.url, self.namespace), RedisStatistics())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RedisDiscovery):
            return NotImplemented
        return (self.url, self.namespace) == (other.url, other.namespace)

    def __hash__(self) -> int:
        return hash((RedisDiscovery, self.url, self.namespace))

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
