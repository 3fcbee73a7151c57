"""The reconnecting subscription: one session at a time, snapshot then changes."""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
import weakref
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Hashable
from typing import Any
from typing import cast

import anyio
import redis.exceptions as redis_errors
from wool import DiscoveryEvent

from .._core.synced import Synced
from .._wool.view import shared_subscription
from ._connection import parse_url
from ._connection import reason
from ._connection import redact
from ._errors import MIN_WAIT
from ._errors import RETRIED
from ._errors import failed
from ._errors import require_asyncio
from ._errors import within
from ._session import Session
from ._settings import SubscriberOptions
from ._settings import SubscriberSettings
from ._state import Gap
from ._state import SubscriptionState
from ._statistics import Counters
from ._statistics import counters

logger = logging.getLogger("wool_pooling.redis")


class RedisStream:
    """The raw subscription: snapshot, then the announcements after it.

    Each session subscribes, takes the snapshot, yields the difference
    between what was yielded and the snapshot, then each announcement in
    version order, reaping every ``reap_interval``. A lost connection, a
    gap, another epoch or an announcement that does not parse ends the
    session; the next one starts after the reconnect policy's delay (see
    docs/redis.rst, *Reconnects*).
    """

    #: Whether a :class:`~wool_pooling.Synced` follows each snapshot (taken
    #: in by a shared subscription; an unshared stream's user would see it).
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
        """Pickle as its settings (no connection or state travels)."""
        return (type(self), (self.settings,))

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self._events()

    async def _events(self) -> AsyncGenerator[DiscoveryEvent, None]:
        require_asyncio("RedisDiscovery's subscriber")
        state = SubscriptionState(self.options.settle, self._invalid)
        counted = self._counters
        failures = 0
        while True:
            session: Session | None = None
            try:
                session = Session(self._target, self.namespace, self.options)
                counted.connections += 2
                snapshot = await self._open(session, state)
                events, lost = state.snapshot(*snapshot, now=time.monotonic())
                counted.snapshots += 1
                counted.epoch_changes += lost
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

    async def _open(
        self, session: Session, state: SubscriptionState
    ) -> tuple[int, bytes, list[bytes]]:
        """Subscribe and snapshot.

        :raises RedisDiscoveryError: for any failure of the first session.
        """
        timeout = self.options.connect_timeout
        try:
            with within(timeout, f"no answer within {timeout:g}s"):
                return await session.open()
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
        self, session: Session, state: SubscriptionState
    ) -> AsyncGenerator[DiscoveryEvent, None]:
        """The session's events: announcements, settled drops, reaps.

        :raises TimeoutError: once nothing was read for ``liveness_timeout``
            (a ``PING`` sent at half of it), time suspended at a ``yield``
            not counted (docs/redis.rst, *Dead connections*).
        """
        options = self.options
        counted = self._counters
        liveness = options.liveness_timeout
        silent = f"within {liveness:g}s (liveness_timeout)"
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
                with within(deadline - now, f"no answer to a reap {silent}"):
                    state.reaped(await session.reap())
                next_reap = time.monotonic() + options.reap_interval
                continue
            if not pinged and now >= heard + liveness / 2:
                with within(deadline - now, f"no answer to a PING {silent}"):
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
                    raise TimeoutError(f"no answer on the pub/sub connection {silent}")
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


def _subscriber_key(cls: type, settings: SubscriberSettings) -> Hashable:
    """Subscriptions are shared by normalised connection, prefix and namespace."""
    return settings.key()


@shared_subscription(key=_subscriber_key)
class SharedRedisStream(RedisStream):
    """The process's one subscription per (connection, namespace), shared;
    marks each snapshot's end with :class:`~wool_pooling.Synced`."""

    _marks_listing = True


#: The options of the live shared subscribers, by key: a subscriber with
#: other options than an earlier live one of its key is warned about. An
#: entry goes with its subscriber, a key with its last one.
_live: dict[Hashable, list[tuple[weakref.ref[Any], SubscriberOptions]]] = {}


def note_options(
    key: Hashable, subscription: object, options: SubscriberOptions
) -> None:
    entries = _live.setdefault(key, [])
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

    def forget(ref: weakref.ref[Any]) -> None:
        found = _live.get(key, [])
        found[:] = [entry for entry in found if entry[0] is not ref]
        if not found:
            _live.pop(key, None)

    entries.append((weakref.ref(subscription, forget), options))
