"""The pool: one entry (raw instance, fan-out, view) per subscription key,
built from the record the decorator leaves on a class; the entry's states,
its events, and the function deciding the next state; what the pool and its
entries count, for operators."""

from __future__ import annotations

import enum
import inspect
import weakref
from collections.abc import Callable
from collections.abc import Hashable
from contextvars import ContextVar
from contextvars import Token
from typing import Any
from typing import final

import anyio
import attrs

from .._core.backend import EventLoop
from .._core.backend import current_loop
from .._core.fanout import Fanout
from .._core.fanout import FanoutConsumer
from .._core.fanout import logger
from .restart import RestartingSource
from .restart import RestartPolicy
from .view import View
from .view import ViewFactory

__all__ = [
    "PoolStatistics",
    "PoolTotals",
    "SubscriptionPool",
    "SubscriptionStatistics",
    "current_pool",
]

#: An entry's key: the decorated class and the subscription key.
Key = tuple[type, Hashable]

#: Name of the class attribute holding a decorated class's configuration.
CONFIG_ATTRIBUTE = "__shared_subscription__"

#: ``key(cls, *args, **kwargs) -> Hashable``: which constructions share an entry.
KeyFunction = Callable[..., Hashable]


@attrs.frozen
class SubscriptionConfig:
    """What ``@shared_subscription`` recorded on a class: its arguments, and
    the ``__new__`` the class defined itself (``own_new``)."""

    key: KeyFunction | None
    ttl: float
    max_lag: int | None
    restart: RestartPolicy | None
    read_ahead: int
    view: ViewFactory | None
    own_new: Any


class EntryState(enum.Enum):
    """Where a pool entry stands; only ``ACTIVE`` and ``IDLE`` ones are found
    by key, and every one but ``CLOSED`` is counted by the pool."""

    #: Consumers are attached.
    ACTIVE = "active"
    #: No consumer attached (a new entry, until its first joins); kept until
    #: its ttl timer fires.
    IDLE = "idle"
    #: The source ended or failed with consumers attached; closed once the
    #: last of them leaves.
    ENDED = "ended"
    #: Being closed: its fan-out, then the raw instance's ``aclose()``.
    CLOSING = "closing"
    CLOSED = "closed"


class EntryEvent(enum.Enum):
    """What happens to a pool entry."""

    #: A consumer joined (counted already).
    JOINED = "joined"
    #: A consumer left (counted out already, at once if garbage collected).
    LEFT = "left"
    EXPIRED = "expired"
    SOURCE_ENDED = "source ended"
    POOL_CLOSED = "pool closed"
    CLOSED = "closed"


class IllegalTransition(RuntimeError):
    """An event met an entry in a state where it cannot happen: a bug."""


def transition(
    state: EntryState, event: EntryEvent, consumers: int, ttl: float
) -> EntryState:
    """The state an entry in ``state`` moves to on ``event``, with
    ``consumers`` attached once the event is counted; pure and synchronous.

    :raises IllegalTransition: for an event that cannot happen in ``state``.
    """
    if event is EntryEvent.JOINED:
        if consumers and (state is EntryState.ACTIVE or state is EntryState.IDLE):
            return EntryState.ACTIVE
    elif state is EntryState.IDLE and consumers:
        pass  # an idle entry has no consumer: only a join adds one
    elif event is EntryEvent.POOL_CLOSED and state is not EntryState.CLOSED:
        return EntryState.CLOSING
    elif event is EntryEvent.LEFT:
        if consumers or state is EntryState.IDLE or state is EntryState.CLOSING:
            return state
        if state is EntryState.ACTIVE:
            return EntryState.IDLE if ttl > 0 else EntryState.CLOSING
        return EntryState.CLOSING if state is EntryState.ENDED else state
    elif event is EntryEvent.SOURCE_ENDED and state is EntryState.ACTIVE:
        return EntryState.ENDED if consumers else EntryState.CLOSING
    elif event is EntryEvent.SOURCE_ENDED or event is EntryEvent.EXPIRED:
        if state is EntryState.IDLE:
            return EntryState.CLOSING
    elif event is EntryEvent.CLOSED and state is EntryState.CLOSING:
        return EntryState.CLOSED
    raise IllegalTransition(
        f"a pool entry {state.name} cannot take {event.name} "
        f"(consumers: {consumers}, ttl: {ttl})"
    )


#: The states a joining consumer finds an entry in.
_REACHABLE = (EntryState.ACTIVE, EntryState.IDLE)

_current: ContextVar[SubscriptionPool | None] = ContextVar(
    "wool_pooling.current_pool", default=None
)
_default_pools: weakref.WeakKeyDictionary[EventLoop, SubscriptionPool] = (
    weakref.WeakKeyDictionary()
)


def current_pool() -> SubscriptionPool:
    """Return the pool of this context (``async with SubscriptionPool()``),
    else the running event loop's default pool (one per loop or trio run).

    :raises RuntimeError: if no pool is current and no event loop is running.
    """
    pool = _current.get()
    if pool is None:
        loop = current_loop()
        pool = _default_pools.get(loop)
        if pool is None:
            pool = _default_pools[loop] = SubscriptionPool()
    return pool


@attrs.frozen
class SubscriptionStatistics:
    """A snapshot of one shared subscription in one pool, as returned by
    :meth:`SharedSubscription.statistics() <wool_pooling.SharedSubscription.statistics>`
    and :meth:`SharedDiscovery.statistics() <wool_pooling.SharedDiscovery.statistics>`:
    the counts of the pool entry iterating its key now, all zeros without
    one, from zero again with the next. See :doc:`metrics`.
    """

    #: Consumers attached to the entry.
    consumers: int = 0
    #: Items of the shared stream received by its consumers, summed over
    #: them (an item read by 100 consumers counts 100); the replay of known
    #: workers at a join and a resync's difference are not counted.
    delivered: int = 0
    #: Consumers that joined while workers were known, and so first received
    #: one ``worker-added`` per known worker (a replay).
    replays: int = 0
    #: Times a consumer fell more than ``max_lag`` items behind.
    lagged: int = 0
    #: Items of the shared stream its consumers never received because they
    #: fell behind (a resync's difference stood in for some).
    skipped: int = 0
    #: Lagging consumers caught up by the difference between what they had
    #: seen and the current workers (the others got :exc:`~wool_pooling.Lagged`).
    resyncs: int = 0
    #: Restarts of the raw stream under its ``RestartPolicy``.
    restarts: int = 0
    #: Errors raised by the raw stream: each one a restart followed, and the
    #: one that ended the consumers.
    source_errors: int = 0


@attrs.frozen
class PoolTotals:
    """Running totals of a pool, as returned by
    :meth:`SubscriptionPool.totals() <wool_pooling.SubscriptionPool.totals>`:
    the counts of :class:`SubscriptionStatistics` summed over every entry the
    pool opened, closed ones included. None ever decreases. See :doc:`metrics`.
    """

    #: Entries opened: raw instances built.
    opened: int = 0
    #: Entries closed (their raw instances closed).
    closed: int = 0
    #: Items of the shared streams received, summed over consumers.
    delivered: int = 0
    #: Joins that were replayed the known workers.
    replays: int = 0
    #: Times a consumer fell more than ``max_lag`` items behind.
    lagged: int = 0
    #: Items consumers never received because they fell behind.
    skipped: int = 0
    #: Lagging consumers caught up by a difference.
    resyncs: int = 0
    #: Restarts of raw streams under their ``RestartPolicy``.
    restarts: int = 0
    #: Errors raised by raw streams.
    source_errors: int = 0


@final
@attrs.define(eq=False)
class EntryCounters:
    """The counts an entry keeps, at joins, leaves, lags and restarts; the rest
    is derived when asked for. No delivery is counted as it happens: the items
    received are the distance each consumer moved along the log (its
    ``position``), summed when asked for, plus what those that left had moved,
    less what they skipped."""

    #: The consumers attached, to sum their positions.
    consumers: weakref.WeakSet[FanoutConsumer[Any]] = attrs.field(
        factory=weakref.WeakSet[FanoutConsumer[Any]]
    )
    #: Items the consumers that left had moved past, less where every
    #: consumer joined and what they skipped (see the class docstring).
    moved: int = 0
    replays: int = 0
    lagged: int = 0
    items_skipped: int = 0
    resyncs: int = 0

    def join(self, consumer: FanoutConsumer[Any], replayed: bool) -> None:
        """``consumer`` registered at its log position: it has received nothing."""
        self.consumers.add(consumer)
        self.moved -= consumer.position
        self.replays += replayed

    def leave(self, consumer: FanoutConsumer[Any], fanout: Fanout[Any]) -> None:
        """``consumer`` of ``fanout`` is about to end: count its position, once.
        One that has ended already read the source's end, so every item logged."""
        if consumer in self.consumers:
            self.consumers.discard(consumer)
            here = consumer.position
            self.moved += fanout.statistics().pulled if here < 0 else here

    def skipped(self, skipped: int, resync: bool = False) -> int:
        """A consumer fell behind and skipped ``skipped`` items (``resync``: it
        was caught up by its view instead); returns ``skipped``."""
        self.resyncs += resync
        self.lagged += not resync
        self.items_skipped += skipped
        self.moved -= skipped
        return skipped


@attrs.frozen
class PoolStatistics:
    """A snapshot of a pool, as returned by :meth:`SubscriptionPool.statistics`."""

    #: Live entries: raw instances built and not yet closed (an entry
    #: being closed counts until its raw instance is closed).
    entries: int
    #: Consumers attached across all entries (but those being closed).
    consumers: int
    #: Entries with no consumer attached, kept open by their ttl (or whose
    #: last consumer was just garbage collected). Counted in :attr:`entries`.
    idle: int


@attrs.define(eq=False, repr=False)
class Entry:
    """One pooled subscription: raw instance, source (restart engine and
    view), fan-out, and :class:`EntryState`, changed only by :meth:`_move`.
    """

    pool: SubscriptionPool
    key: Key
    raw: Any
    source: RestartingSource[Any]
    fanout: Fanout[Any]
    ttl: float
    loop: EventLoop
    #: A new entry is idle until its first consumer joins, in the same step.
    state: EntryState = EntryState.IDLE
    #: Consumers attached.
    refs: int = 0
    #: The ttl timer of an ``IDLE`` entry: cancelling it ends the wait early,
    #: and the entry then expires unless a consumer joined meanwhile.
    expiry: anyio.CancelScope | None = None
    #: Set once ``CLOSED``.
    closed: anyio.Event = attrs.field(factory=anyio.Event)
    #: What its joins, leaves and lags counted, for its statistics.
    counters: EntryCounters = attrs.field(factory=EntryCounters)

    def statistics(self) -> SubscriptionStatistics:
        """What this entry counted, with the consumers attached now."""
        counters = self.counters
        live = [consumer.position for consumer in counters.consumers]
        return SubscriptionStatistics(
            consumers=self.refs,
            delivered=counters.moved + sum(here for here in live if here >= 0),
            replays=counters.replays,
            lagged=counters.lagged,
            skipped=counters.items_skipped,
            resyncs=counters.resyncs,
            restarts=self.source.restarts,
            source_errors=self.source.errors,
        )

    def add_to(self, totals: PoolTotals, closed: bool) -> PoolTotals:
        """``totals`` and what this entry counted (``closed`` or not)."""
        counts = attrs.asdict(self.statistics())
        del counts["consumers"]
        return PoolTotals(
            opened=totals.opened + 1,
            closed=totals.closed + closed,
            **{name: getattr(totals, name) + n for name, n in counts.items()},
        )

    async def release(self) -> None:
        """Detach one consumer; close the entry if it was the last one and
        ``ttl == 0`` or its source finished (else its ttl timer starts).
        Shielded from cancellation."""
        self.refs -= 1
        await self._decide_leave()

    def release_soon(self) -> None:
        """:meth:`release` from a garbage-collection callback, in any thread:
        the consumer is counted out (from another thread, by the loop), and
        the last one's leave is decided later in a task on the loop."""
        if self.loop.in_own_thread():
            self._count_out()
        else:
            self.loop.run_soon(self._count_out)

    def _count_out(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            # No task may start from a garbage-collection callback.
            self.loop.run_soon(self.loop.spawn, self._decide_leave)

    async def _decide_leave(self) -> None:
        """Take a leave: the last one takes ``SOURCE_ENDED`` first if the
        source has finished (no ttl keeps it), then ``LEFT``."""
        closing = False
        if not self.refs and self.fanout.finished and self.state in _REACHABLE:
            closing = self._move(EntryEvent.SOURCE_ENDED)
        if self._move(EntryEvent.LEFT) or closing:
            await self._close()

    def _move(self, event: EntryEvent) -> bool:
        """Take ``event``: the next state from :func:`transition` and its
        bookkeeping, in one synchronous step. Returns whether the entry just
        entered ``CLOSING`` (the caller then runs :meth:`_close`)."""
        before = self.state
        after = self.state = transition(before, event, self.refs, self.ttl)
        if after is before:
            return False
        if before is EntryState.IDLE:
            scope, self.expiry = self.expiry, None
            if scope is not None:
                scope.cancel()
        if after is EntryState.ACTIVE:
            return False
        if after is EntryState.IDLE:
            scope = self.expiry = anyio.CancelScope()
            self.loop.spawn(self._expire, scope)
            return False
        entries = self.pool._entries
        if entries.get(self.key) is self:
            del entries[self.key]  # no consumer joins it any more
        if after is EntryState.CLOSING:
            return True
        if after is EntryState.CLOSED:
            pool = self.pool
            del pool._live[self]
            pool._totals = self.add_to(pool._totals, True)
            self.closed.set()
        return False

    async def _expire(self, scope: anyio.CancelScope) -> None:
        """The ttl timer: ``EXPIRED`` once ``ttl`` elapses, unless the entry
        left ``IDLE`` meanwhile (which replaces or cancels ``scope``)."""
        try:
            with scope:
                await anyio.sleep(self.ttl)
        finally:
            if self.expiry is scope and self._move(EntryEvent.EXPIRED):
                await self._close()

    async def _close(self) -> None:
        """Close the fan-out (and so the raw iterator), then await the raw
        instance's ``aclose()``, if any, shielded, errors logged; then
        ``CLOSED``. Runs exactly once per entry."""
        with anyio.CancelScope(shield=True):
            try:
                for consumer in [*self.counters.consumers]:  # before it ends them
                    self.counters.leave(consumer, self.fanout)
                try:
                    await self.fanout.aclose()
                except Exception:
                    logger.exception("error closing the source of %r", self.raw)
                try:  # the raw instance's aclose(), if it has one
                    closed = getattr(self.raw, "aclose", lambda: None)()
                    if inspect.isawaitable(closed):
                        await closed
                except Exception:
                    logger.exception("error closing %r", self.raw)
            finally:
                self._move(EntryEvent.CLOSED)

    def __repr__(self) -> str:
        cls, key = self.key
        return (
            f"<Entry [{self.state.name}, consumers: {self.refs}] of "
            f"{cls.__qualname__}, key={key!r}>"
        )


def find_entry(pool: SubscriptionPool, key: Key) -> Entry | None:
    """The entry of ``key`` in ``pool`` consumers join, else the newest whose
    source ended while consumers remain; ``None`` without one."""
    entry = pool._entries.get(key)
    if entry is None:
        for each in reversed(pool._live):
            if each.key == key and each.state is EntryState.ENDED:
                return each
    return entry


def attach(
    pool: SubscriptionPool,
    key: Key,
    config: SubscriptionConfig,
    build: Callable[[], Any],
    what: str,
) -> Entry:
    """Attach one consumer of ``key`` to ``pool``, building its entry if
    needed (an entry whose source finished is not joined), synchronously.

    :raises RuntimeError: naming ``what`` if the pool is closed or bound to
        another event loop.
    """
    if pool._closed:
        raise RuntimeError(f"cannot iterate {what}: its subscription pool is closed")
    loop = current_loop()
    if pool._loop is None:
        pool._loop = loop
    elif pool._loop is not loop:
        raise RuntimeError(
            f"cannot iterate {what}: a SubscriptionPool is bound to the event "
            "loop that first used it"
        )
    entry = pool._entries.get(key)
    if entry is not None and entry.fanout.finished:
        if entry._move(EntryEvent.SOURCE_ENDED):
            loop.spawn(entry._close)
        entry = None
    if entry is None:
        raw = build()
        view = View[Any]() if config.view is None else config.view(raw)
        # How far back a consumer can be left behind: one item beyond the
        # bound (see _FanoutState.drop_beyond_lag).
        view.remember(None if config.max_lag is None else config.max_lag + 1)
        source = RestartingSource[Any](raw, config.restart, view)
        fanout = Fanout(
            source,
            max_lag=config.max_lag,
            # (``"error"`` needs a bound; without one no consumer ever lags)
            on_lag="wait" if config.max_lag is None else "error",
            read_ahead=config.read_ahead,
        )
        source.deliver_to(fanout.inject)
        entry = Entry(pool, key, raw, source, fanout, config.ttl, loop)
        pool._entries[key] = entry
        pool._live[entry] = None
    entry.refs += 1
    entry._move(EntryEvent.JOINED)  # never closes
    return entry


@final
@attrs.define(eq=False, repr=False)
class SubscriptionPool:
    """Holds one entry per subscription key: raw instance, fan-out, view.

    Consumers of the same key in the same pool share one raw instance and
    one iteration of it. An entry lives from its first consumer to its last
    (plus its ``ttl``); one whose source ended is never reused.
    ``async with SubscriptionPool() as pool:`` makes the pool current for the
    block and closes it on exit; a closed pool cannot be iterated again. A
    pool is bound to the event loop that first uses it. See
    :doc:`guarantees` (Memory).
    """

    #: The entries a joining consumer finds: ``ACTIVE`` and ``IDLE``, by key.
    _entries: dict[Key, Entry] = attrs.field(factory=dict[Key, "Entry"], init=False)
    #: Every entry not ``CLOSED`` yet, oldest first (a dict as an ordered set).
    _live: dict[Entry, None] = attrs.field(factory=dict["Entry", None], init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _loop: EventLoop | None = attrs.field(default=None, init=False)
    _token: Token[SubscriptionPool | None] | None = attrs.field(
        default=None, init=False
    )
    #: What the closed entries counted.
    _totals: PoolTotals = attrs.field(factory=PoolTotals, init=False)

    @property
    def closed(self) -> bool:
        """Whether the pool was closed."""
        return self._closed

    def statistics(self) -> PoolStatistics:
        """Return a snapshot of entries and attached consumers."""
        consumers = idle = 0
        for entry in self._live:
            if entry.state is not EntryState.CLOSING:
                consumers += entry.refs
                idle += entry.refs == 0
        return PoolStatistics(entries=len(self._live), consumers=consumers, idle=idle)

    def totals(self) -> PoolTotals:
        """Return the running totals of every entry this pool opened, closed
        ones included; see :doc:`metrics`. O(consumers)."""
        totals = self._totals
        for entry in self._live:
            totals = entry.add_to(totals, False)
        return totals

    async def __aenter__(self) -> SubscriptionPool:
        if self._closed:
            raise RuntimeError("this subscription pool is closed")
        if self._token is not None:
            raise RuntimeError("this subscription pool is already entered")
        self._token = _current.set(self)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        token, self._token = self._token, None
        if token is not None:
            _current.reset(token)
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pool: close every entry, oldest first; their consumers
        end. Returns once all are closed. Shielded from cancellation;
        idempotent."""
        self._closed = True
        closing = [
            entry for entry in [*self._live] if entry._move(EntryEvent.POOL_CLOSED)
        ]
        with anyio.CancelScope(shield=True):
            for entry in closing:
                await entry._close()
            for entry in [*self._live]:
                await entry.closed.wait()

    def __repr__(self) -> str:
        stats = self.statistics()
        state = "CLOSED" if self._closed else "OPEN"
        return (
            f"<SubscriptionPool [{state}, entries: {stats.entries}, "
            f"consumers: {stats.consumers}]>"
        )
