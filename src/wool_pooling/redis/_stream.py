"""The reconnecting subscription: one session (a pub/sub and a command
connection) at a time, snapshot or changes missed, then announcements; and
what it counts, per subscription key, for operators."""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import AsyncGenerator
from collections.abc import Hashable
from typing import Any
from typing import cast
from typing import final

import anyio
import attrs
import redis.exceptions as redis_errors
from wool import DiscoveryEvent

from .._core.synced import Synced
from .._pooling.restart import RestartingSource
from .._wool.view import shared_subscription
from . import _connection
from . import _errors
from . import _scripts
from . import _settings
from . import _state

logger = logging.getLogger("wool_pooling.redis")


@attrs.frozen
class RedisStatistics:
    """What the subscribers of one (connection, namespace) in this process have met.

    Counted while a discovery or subscriber of that key lives in the
    process, whether shared or not (``shared=False`` subscribers add to the
    same counts); the counts go with the last of them.
    """

    #: Records (or announcements) that were not valid worker metadata: skipped.
    invalid_records: int = 0
    #: Successful reconnections after a lost connection (or a resynchronisation).
    reconnects: int = 0
    #: Connections to the server the subscribers hold now: two per live
    #: subscription (pub/sub and commands), however many consumers share it.
    connections: int = 0
    #: Full snapshots taken: one per connection, and per reconnection that
    #: could not resume.
    snapshots: int = 0
    #: Reconnections that read only the changes missed from the namespace's
    #: change log, not a snapshot.
    resumes: int = 0
    #: Changes read from the change log by those resumes.
    changes_read: int = 0
    #: Announcements received on the pub/sub connection (duplicates and
    #: invalid ones included).
    announcements: int = 0
    #: Announcements found missing (a version skipped): each one cost a
    #: resynchronisation.
    gaps: int = 0
    #: Snapshots that found a new epoch: the server lost, flushed or
    #: expired the namespace's data.
    epoch_changes: int = 0
    #: Seconds since a subscriber last read anything from its pub/sub
    #: connection (an announcement or the answer to its liveness ``PING``);
    #: ``None`` before the first. Stays under ``liveness_timeout`` while the
    #: connection is healthy.
    seconds_since_last_message: float | None = None


_COUNTS = attrs.filters.exclude("seconds_since_last_message")


@attrs.define
class Counters:
    """The running counts of one key, by :class:`RedisStatistics` field name
    (one dict update per announcement)."""

    counts: dict[str, int] = attrs.Factory(
        lambda: attrs.asdict(RedisStatistics(), filter=_COUNTS)
    )
    #: ``time.monotonic()`` of the last message read, if any.
    heard: float | None = None

    def statistics(self) -> RedisStatistics:
        """The counts as they stand."""
        heard = self.heard
        since = None if heard is None else max(0.0, time.monotonic() - heard)
        return RedisStatistics(**self.counts, seconds_since_last_message=since)


#: The counters of each key, held by its discoveries and subscribers: an
#: entry goes with the last of them.
by_key: weakref.WeakValueDictionary[Hashable, Counters] = weakref.WeakValueDictionary()


class RedisStream:
    """The raw subscription: connect, snapshot, yield, mark the listing,
    follow; each later session is started by the restart engine under the
    ``reconnect`` policy (docs/redis.rst, *Reconnects*).

    :raises RedisDiscoveryError: if the first session fails, and once the
        policy allows no more reconnects.
    """

    #: Whether a :class:`~wool_pooling.Synced` follows the first snapshot
    #: (taken in by a shared subscription; an unshared stream's user would
    #: see it).
    _marks_listing: bool = False

    def __init__(self, settings: _settings.DiscoverySettings) -> None:
        self.settings = settings
        self.target = _connection.parse_url(settings.url)
        #: The counts of the subscription's key, held while it lives.
        self.counted = by_key.setdefault(
            _settings.subscription_key(settings), Counters()
        )

    def __eq__(self, other: object) -> bool:
        """Equal to a subscriber of the same class made of equal arguments."""
        if not isinstance(other, RedisStream) or type(other) is not type(self):
            return NotImplemented
        # The record's own comparison: every argument (a discovery's is its key).
        return _settings.DiscoverySettings.__eq__(self.settings, other.settings)

    def __hash__(self) -> int:
        return hash((type(self), self.settings))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as its settings (no connection or state travels)."""
        return (type(self), (self.settings,))

    async def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        _errors.require_asyncio("RedisDiscovery's subscriber")
        sessions = _Sessions(self)
        source = RestartingSource[DiscoveryEvent](sessions, self.settings.reconnect)
        try:
            for event in await sessions.connect():
                yield event
            if self._marks_listing:
                yield cast(DiscoveryEvent, Synced())  # the first listing is complete
            async for event in source:
                yield event
        finally:
            with anyio.CancelScope(shield=True):
                await source.aclose()
                await sessions.close()

    def __repr__(self) -> str:
        url, namespace = _connection.redact(self.settings.url), self.settings.namespace
        return f"{type(self).__name__}({url!r}, {namespace!r})"


@final
class _Sessions:
    """One iteration's sessions, one at a time, sharing what it knows: each
    iteration (by the restart engine) follows the session open now, or opens
    and lists a new one. A session is a pub/sub and a command connection to
    the namespace's server (on a cluster: to the master owning its slot);
    neither retries: a lost connection, a ``MOVED`` or an unasked
    ``sunsubscribe`` raises."""

    def __init__(self, stream: RedisStream) -> None:
        self.stream, self.settings = stream, stream.settings
        self.counts = stream.counted.counts
        self.state = _state.SubscriptionState(self.settings.lease, self._invalid)
        self.keys = _scripts.Keys.of(
            self.settings.namespace, stream.target.db, self.settings.key_prefix
        )
        #: Whether a session is open (its connections counted), and those
        #: it has opened so far.
        self.live = False
        self.opened: list[_connection.Connection] = []
        self.pubsub: Any = None
        self.scripts: list[Any] = []

    async def connect(self) -> list[DiscoveryEvent]:
        """Open a session and read what it missed from the change log, or
        take a snapshot: the events to it.

        :raises RedisDiscoveryError: if this is the first session and it fails.
        """
        state, counts, settings = self.state, self.counts, self.settings
        reconnecting = state.epoch is not None  # a session listed before
        self.live = True
        counts["connections"] += 2
        try:
            with _errors.within(settings.connect_timeout):
                reply = await self._open(state.since())
        except Exception as error:
            if reconnecting:
                raise
            if isinstance(error, redis_errors.AuthenticationError):
                action = "authenticating"
            elif isinstance(error, redis_errors.ResponseError):
                action = self.stage
            else:
                action = "connecting"
            raise _errors.failed(settings.url, action, error) from error
        events: list[DiscoveryEvent] = []
        lost, how = False, f"resumed, {len(reply[2])} changes missed"
        if reply[3]:
            events, complete = state.resume(reply[2])
            counts["resumes"] += 1
            counts["changes_read"] += len(reply[2])
            if not complete:  # the rest from a snapshot
                with _errors.within(settings.connect_timeout):
                    reply = await self._script(self.scripts[0], *state.since())
        if not reply[3]:
            version, epoch, flat, _, change = reply
            now = time.monotonic()
            more, lost = state.snapshot(int(version), epoch, flat, now, change)
            events += more
            counts["snapshots"] += 1
            counts["epoch_changes"] += lost
            how = "resynchronising"
        if reconnecting:
            counts["reconnects"] += 1
            logger.warning(
                "reconnected to %s (namespace %s): %s%s",
                _connection.redact(settings.url),
                settings.namespace,
                how,
                f" (the server lost its data: waiting {settings.lease:.1f}s "
                "for publishers to renew their workers)"
                if lost
                else "",
            )
        return events

    async def _open(self, since: list[object]) -> list[Any]:
        """Subscribe, wait for the server's confirmation, then read the
        changes after ``since`` (the epoch, version and change last applied)
        or a snapshot: the snapshot script's reply.

        Subscribing first is what makes that read and the announcements
        after it meet with no gap.
        """
        target = self.stream.target
        cluster = target.cluster
        if cluster:
            target = await self._owner()
        self.stage = "connecting"  # what connect() is doing, for its errors
        command = self._client(target, "subscriber-cmd").client
        self.pubsub = self._client(target, "subscriber").client.pubsub()
        self.scripts = _scripts.register(
            command, cluster, _scripts.SNAPSHOT, _scripts.RENEW
        )
        self.stage = "subscribing"
        # (the command, and the type of the server's confirmation)
        subscribe = "ssubscribe" if cluster else "subscribe"
        await _errors.watched(getattr(self.pubsub, subscribe)(self.keys.channel))
        while True:
            message = await _errors.watched(self.pubsub.get_message(timeout=None))
            if message is not None and message["type"] == subscribe:
                break
        self.stage = "taking a snapshot"
        return cast(list[Any], await self._script(self.scripts[0], *since))

    def _client(self, target: _connection.Target, role: str) -> _connection.Connection:
        connection = _connection.open_client(target, role, self.settings, retries=0)
        self.opened.append(connection)
        return connection

    async def _owner(self) -> _connection.Target:
        """The master owning the namespace's slot, as the cluster says now."""
        layout = self._client(self.stream.target, "subscriber-cmd")
        self.stage = "reading the cluster's layout"
        try:
            await _errors.watched(layout.client.initialize())
            node = layout.client.get_node_from_key(self.keys.channel)
        except redis_errors.RedisClusterException as error:
            # No seed reachable, or no master for the slot (yet): a lost
            # connection, retried under the reconnect policy.
            raise redis_errors.ConnectionError(str(error)) from error
        self.opened.remove(layout)
        await layout.aclose()
        self.node = _connection.address(str(node.host), int(node.port))
        return _connection.parse_url(_connection.node_url(self.settings.url, self.node))

    async def _script(self, script: Any, *rest: object) -> Any:
        settings = self.settings
        keep = _scripts.idle_expiry_ms(settings.lease, settings.reap_interval)
        return await _scripts.run(script, self.keys, keep, settings.change_log, *rest)

    async def __aiter__(self) -> AsyncGenerator[Any, None]:
        settings = self.settings
        connected = self.live
        try:
            if not connected:
                for event in await self.connect():
                    yield event
                connected = True
                yield Synced()  # the relisting is complete
            follow = self._follow()
            async with contextlib.aclosing(follow):
                async for event in follow:
                    yield event
        except _errors.RETRIED as error:
            self.counts["gaps"] += isinstance(error, _state.Gap)
            logger.warning(
                "lost %s (namespace %s): %s; reconnecting as the policy says",
                _connection.redact(settings.url),
                settings.namespace,
                _connection.reason(error),
            )
            action = "following the announcements" if connected else "reconnecting"
            raise _errors.failed(settings.url, action, error) from error
        finally:
            await self.close()

    async def _follow(self) -> AsyncGenerator[DiscoveryEvent, None]:
        """The session's events: announcements, settled drops, reaps.

        :raises TimeoutError: once nothing was read for ``liveness_timeout``
            (a ``PING`` sent at half of it), time suspended at a ``yield``
            not counted (docs/redis.rst, *Dead connections*).
        :raises Resync: if the node unsubscribed the channel (its slot moved).
        """
        # A renewal of no worker reaps, and says the epoch.
        state, counted, renew = self.state, self.stream.counted, self.scripts[1]
        liveness = self.settings.liveness_timeout
        reap_interval = self.settings.reap_interval
        silent = f"within {liveness:g}s (liveness_timeout)"
        heard = time.monotonic()
        next_reap = heard + reap_interval
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
                with _errors.within(deadline - now, f"no answer to a reap {silent}"):
                    state.check_epoch((await self._script(renew, 0))[1])
                next_reap = time.monotonic() + reap_interval
                continue
            if not pinged and now >= heard + liveness / 2:
                with _errors.within(deadline - now, f"no answer to a PING {silent}"):
                    await _errors.watched(self.pubsub.ping())
                pinged = True
                continue
            wait = min(next_reap, deadline if pinged else heard + liveness / 2) - now
            if state.held:
                wait = min(wait, state.settle_until - now)
            # Never a very short read: a read cut short by its timeout
            # mid-message is what redis-py's pub/sub handles worst.
            message = await _errors.watched(
                self.pubsub.get_message(timeout=max(wait, _errors.MIN_WAIT))
            )
            if message is None:
                if pinged and time.monotonic() >= deadline:
                    raise TimeoutError(f"no answer on the pub/sub connection {silent}")
                continue
            heard = counted.heard = time.monotonic()
            pinged = False
            if message["type"] == "sunsubscribe":
                raise _state.Resync(
                    f"{self.node} unsubscribed {self.keys.channel}: the "
                    "namespace's slot moved to another node"
                )
            if message["type"] not in ("message", "smessage"):
                continue  # a pong: the connection answers
            self.counts["announcements"] += 1
            event = state.message(message["data"])
            if event is not None:
                yield event
                heard = max(heard, time.monotonic())

    def _invalid(self, what: bytes, error: BaseException) -> None:
        self.counts["invalid_records"] += 1
        logger.warning(
            "skipping a record of namespace %s at %s that is not valid worker "
            "metadata (%r): %s",
            self.settings.namespace,
            _connection.redact(self.settings.url),
            what,
            _connection.reason(error),
        )

    async def close(self) -> None:
        """Close the session open now, if any: the pub/sub connection, then
        every other; errors ignored."""
        if not self.live:
            return
        closers = [self.pubsub.aclose] if self.pubsub is not None else []
        closers += [each.aclose for each in reversed(self.opened)]
        self.live, self.pubsub, self.opened = False, None, []
        with anyio.CancelScope(shield=True):
            for close in closers:
                with contextlib.suppress(Exception):
                    await close()
        self.counts["connections"] -= 2

    def __repr__(self) -> str:
        return repr(self.stream)


@shared_subscription
class SharedRedisStream(RedisStream):
    """The process's one subscription per (connection, namespace), shared
    (keyed by its discovery, which equals one of the same connection and
    namespace); marks each snapshot's end with :class:`~wool_pooling.Synced`."""

    _marks_listing = True
