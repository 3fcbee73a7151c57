"""The reconnecting subscription: one session at a time, snapshot then changes."""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
import weakref
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Generator
from collections.abc import Hashable
from typing import Any
from typing import cast
from typing import final

import anyio
import redis.exceptions as redis_errors
from wool import DiscoveryEvent

from .._core.synced import Synced
from .._wool.view import shared_subscription
from ._cluster import ClusterSession
from ._connection import Connection
from ._connection import Target
from ._connection import open_client
from ._connection import parse_url
from ._connection import reason
from ._connection import redact
from ._errors import MIN_WAIT
from ._errors import RETRIED
from ._errors import failed
from ._errors import require_asyncio
from ._errors import watched
from ._scripts import REAP
from ._scripts import SNAPSHOT
from ._settings import SubscriberOptions
from ._settings import SubscriberSettings
from ._settings import keys_for
from ._state import Gap
from ._state import SubscriptionState
from ._statistics import Counters
from ._statistics import counters
from ._subscribing import SessionSteps

logger = logging.getLogger("wool_pooling.redis")


@final
class _Session(SessionSteps):
    """One connection's worth of subscription: pub/sub plus a command client."""

    def __init__(
        self, target: Target, namespace: str, options: SubscriberOptions
    ) -> None:
        self.keys = keys_for(target, namespace, options.key_prefix)
        self.options = options
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
            named=options.name_connections,
        )
        self.listening = open_client(
            target,
            "subscriber",
            namespace,
            timeout,
            retries=0,
            client_options=options.client_options,
            named=options.name_connections,
        )
        self.pubsub = self.listening.client.pubsub()
        self.snapshot_script: Any = self.command.client.register_script(SNAPSHOT)
        self.reap_script: Any = self.command.client.register_script(REAP)

    async def open(self) -> tuple[int, bytes, list[bytes]]:
        """Subscribe, wait for the confirmation, then snapshot:
        (version, epoch, flat hash)."""
        return await self.subscribe_then_snapshot(self.pubsub.subscribe, "subscribe")

    async def next_message(self, wait: float) -> dict[str, Any] | None:
        """The next announcement, or None after ``wait`` seconds without one."""
        return await watched(
            self.pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
        )

    def connections(self) -> tuple[Connection | None, ...]:
        return (self.listening, self.command)


class RedisStream:
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
    :class:`~wool_pooling.redis._state.SubscriptionState` turns each input
    into events.
    """

    #: Whether a :class:`~wool_pooling.Synced` follows each snapshot: only
    #: where a shared subscription takes it in (an unshared stream is
    #: iterated by its user directly).
    _marks_listing: bool = False

    def __init__(self, settings: SubscriberSettings) -> None:
        self.settings = settings
        self.url = settings.url
        self.namespace = settings.namespace
        self.options = settings.options
        self._target = parse_url(settings.url)
        self._stats_key = _subscriber_key(type(self), settings)
        self._counters: Counters = counters(self._stats_key)

    def __eq__(self, other: object) -> bool:
        """Equal to a subscriber of the same class made of equal settings."""
        if not isinstance(other, RedisStream):
            return NotImplemented
        return type(self) is type(other) and self.settings == other.settings

    def __hash__(self) -> int:
        return hash((type(self), self.settings))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as its settings: no connection or state of an iteration
        travels."""
        return (type(self), (self.settings,))

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self._events()

    async def _events(self) -> AsyncGenerator[DiscoveryEvent, None]:
        require_asyncio("RedisDiscovery's subscriber")
        state = SubscriptionState(self.options.settle, self._invalid)
        counted = self._counters
        failures = 0
        while True:
            session: _Session | ClusterSession | None = None
            try:
                session = self._session(state)
                counted.connections += 2
                snapshot = await self._open(session, state)
                events, lost = state.snapshot(*snapshot, now=time.monotonic())
                _count_snapshot(counted, lost)
                if failures:
                    self._reconnected(lost)
                failures = 0
                for event in events:
                    yield event
                if self._marks_listing:
                    yield cast(DiscoveryEvent, Synced())  # the snapshot is complete
                # Closed here, not by the garbage collector, when this
                # generator is closed while suspended in it.
                async with contextlib.aclosing(self._follow(session, state)) as follow:
                    async for event in follow:
                        yield event
            except RETRIED as error:
                counted.gaps += isinstance(error, Gap)
                failures += 1
                await self._back_off(error, failures)
            finally:
                if session is not None:
                    with anyio.CancelScope(shield=True):
                        await session.aclose()
                    counted.connections -= 2

    def _session(self, state: SubscriptionState) -> _Session | ClusterSession:
        try:
            if self._target.cluster:
                return ClusterSession(self._target, self.namespace, self.options)
            return _Session(self._target, self.namespace, self.options)
        except Exception as error:
            if state.connected_before:
                raise
            raise failed(self.url, "connecting", error) from error

    async def _open(
        self, session: _Session | ClusterSession, state: SubscriptionState
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
            raise failed(self.url, action, error) from error

    async def _follow(
        self, session: _Session | ClusterSession, state: SubscriptionState
    ) -> AsyncGenerator[DiscoveryEvent, None]:
        """The session's events: announcements, settled drops, reaps.

        Liveness: after ``liveness_timeout / 2`` seconds with nothing read
        from the pub/sub connection it sends a ``PING`` there; once
        ``liveness_timeout`` seconds have passed since it last read
        anything (an announcement or a ``pong``), a read that finds nothing
        ends the session with a :exc:`TimeoutError` (a lost connection). A
        reap, or the ``PING``, under way at that deadline is cut short by it.
        Time spent suspended at a ``yield`` (slow consumers) is not counted:
        the connection is not read then.
        """
        options = self.options
        counted = self._counters
        liveness = options.liveness_timeout
        heard = time.monotonic()
        next_reap = heard + options.reap_interval
        pinged = False
        while True:
            now = time.monotonic()
            deadline = heard + liveness
            if state.held and now >= state.settle_until:
                for event in state.settle():
                    yield event
                # Time spent suspended, while consumers were slow, is not
                # silence: the connection was not being read.
                heard = max(heard, time.monotonic())
                continue
            if now >= next_reap:
                with _within(deadline, liveness, "to a reap"):
                    state.reaped(await session.reap())
                next_reap = time.monotonic() + options.reap_interval
                continue
            if not pinged and now >= heard + liveness / 2:
                with _within(deadline, liveness, "to a PING"):
                    await session.ping()
                pinged = True
                continue
            wait = min(next_reap, deadline if pinged else heard + liveness / 2) - now
            if state.held:
                wait = min(wait, state.settle_until - now)
            # Never a very short read: a read cut short by its timeout
            # mid-message is what redis-py's pub/sub handles worst.
            message = await session.next_message(max(wait, MIN_WAIT))
            if message is None:
                if pinged and time.monotonic() >= deadline:
                    raise _silent(liveness)
                continue
            heard = counted.heard = time.monotonic()
            pinged = False
            if message.get("type") not in ("message", "smessage"):
                continue  # a pong: the connection answers
            counted.announcements += 1
            event = state.message(message.get("data"))
            if event is not None:
                yield event
                heard = max(heard, time.monotonic())

    def _reconnected(self, lost: bool) -> None:
        self._counters.reconnects += 1
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
            raise failed(self.url, "reconnecting", error) from error
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
        self._counters.invalid_records += 1
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


def _count_snapshot(counted: Counters, lost: bool) -> None:
    """A snapshot was taken; ``lost``: it found a new epoch."""
    counted.snapshots += 1
    counted.epoch_changes += lost


def _silent(liveness: float, what: str = "on the pub/sub connection") -> TimeoutError:
    return TimeoutError(f"no answer {what} within {liveness:g}s (liveness_timeout)")


@contextlib.contextmanager
def _within(deadline: float, liveness: float, what: str) -> Generator[None]:
    """Cut the block short at ``deadline`` (monotonic), as a silent
    connection: a :exc:`TimeoutError` naming ``what`` and
    ``liveness_timeout``."""
    try:
        with anyio.fail_after(max(deadline - time.monotonic(), MIN_WAIT)):
            yield
    except TimeoutError as error:
        if str(error):
            raise  # redis-py's own timeout
        raise _silent(liveness, what) from None


def _subscriber_key(cls: type, settings: SubscriberSettings) -> Hashable:
    """Subscriptions are shared by normalised connection (scheme, resolved
    host, port, database, user), key prefix and namespace."""
    return settings.key()


@shared_subscription(key=_subscriber_key)
class SharedRedisStream(RedisStream):
    """The process's one subscription per (connection, namespace), shared.

    Yields :class:`~wool_pooling.Synced` after each snapshot's events (the
    first marks the end of the first listing; see
    :attr:`~wool_pooling.SubscriptionConsumer.synced`): the shared
    subscription takes it in, so no consumer sees it.
    """

    _marks_listing = True


#: The options of the live shared subscribers, by key: a subscriber with
#: other options than an earlier live one of its key is warned about.
_live: dict[Hashable, list[tuple[weakref.ref[Any], SubscriberOptions]]] = {}


def note_options(
    key: Hashable, subscription: object, options: SubscriberOptions
) -> None:
    entries = [(ref, each) for ref, each in _live.get(key, []) if ref() is not None]
    if any(each != options for _, each in entries):
        warnings.warn(
            "a RedisDiscovery subscriber shares the subscription of an earlier "
            "one to the same connection and namespace but was given other "
            "options (connect_timeout, reap_interval, reconnect, lease, "
            "client_options, liveness_timeout, name_connections): the earlier "
            "subscriber's apply",
            RuntimeWarning,
            stacklevel=3,
        )
    entries.append((weakref.ref(subscription), options))
    _live[key] = entries
