"""The pool: one entry (raw instance, fan-out, known workers) per subscription key."""

from __future__ import annotations

import inspect
import logging
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
from .._wool.tracking import TrackedSource
from .._wool.tracking import Tracking
from .construction import SubscriptionConfig
from .restart import RestartingSource

__all__ = ["Entry", "PoolStatistics", "SubscriptionPool", "attach", "current_pool"]

logger = logging.getLogger("wool_pooling")

_current: ContextVar[SubscriptionPool | None] = ContextVar(
    "wool_pooling.current_pool", default=None
)
_default_pools: weakref.WeakKeyDictionary[EventLoop, SubscriptionPool] = (
    weakref.WeakKeyDictionary()
)


def current_pool() -> SubscriptionPool:
    """Return the pool subscriptions started in this context attach to.

    That is the pool made current by ``async with SubscriptionPool()`` in this
    context, or else the default pool of the running event loop (one per
    asyncio loop or trio run, so sibling tasks share subscriptions and a new
    ``asyncio.run()`` or ``trio.run()`` starts with a fresh pool).

    :raises RuntimeError: if no pool is current and no event loop is running.
    """
    pool = _current.get()
    if pool is not None:
        return pool
    loop = current_loop()
    pool = _default_pools.get(loop)
    if pool is None:
        pool = _default_pools[loop] = SubscriptionPool()
    return pool


@attrs.frozen
class PoolStatistics:
    """A snapshot of a pool, as returned by :meth:`SubscriptionPool.statistics`."""

    #: Live entries: raw instances built and not yet finalised (an entry
    #: being finalised counts until its raw instance is closed).
    entries: int
    #: Consumers attached across all entries.
    consumers: int
    #: Entries with no consumer attached that are not being finalised yet:
    #: those kept open by their ttl (and, briefly, one whose finalisation is
    #: scheduled but has not started, after a consumer was garbage
    #: collected, say). Counted in :attr:`entries` too.
    idle: int


@attrs.define(eq=False)
class Entry:
    """One live subscription: its raw instance, fan-out and known workers.

    What a :class:`~wool_pooling.SubscriptionConsumer` holds while attached
    (see :func:`attach`); it detaches with :meth:`release` or, from a
    garbage-collection callback, :meth:`release_soon`.
    """

    pool: SubscriptionPool
    key: tuple[type, Hashable]
    raw: Any
    source: Tracking
    fanout: Fanout[Any]
    ttl: float
    loop: EventLoop
    refs: int = 0
    #: Cancels the pending ttl expiry, if any.
    expiry: anyio.CancelScope | None = None
    finalizing: bool = False
    finalized: anyio.Event | None = None

    async def release(self) -> None:
        """Detach one consumer; finalise the entry if it was the last one.

        With ``ttl == 0``, or when the entry's source has finished, the entry
        is finalised before this returns; otherwise finalisation is scheduled
        for when the ttl elapses. Shielded from cancellation.
        """
        self.refs -= 1
        if self.refs == 0:
            with anyio.CancelScope(shield=True):
                await self.pool._after_last_release(self)

    def release_soon(self) -> None:
        """:meth:`release` from a garbage-collection callback, in any thread.

        In the loop's own thread the reference is dropped at once (statistics
        show it); from another thread the release is handed to the loop.
        Either way, what follows the last release runs on the entry's loop.
        """
        if self.loop.in_own_thread():
            self.pool._release_in_background(self)
        else:
            self.loop.run_soon(self.pool._release_in_background, self)


def attach(
    pool: SubscriptionPool,
    key: tuple[type, Hashable],
    config: SubscriptionConfig,
    build: Callable[[], Any],
    what: str,
) -> Entry:
    """Attach one consumer of ``key`` to ``pool``, building its entry if
    needed: the raw instance from ``build()``, its source per ``config``, a
    fan-out.

    Synchronous, so that no other task can run between finding the entry
    and registering the consumer with its fan-out.

    :raises RuntimeError: naming ``what`` if the pool is closed or bound to
        another event loop.
    """
    return pool._attach(key, config, build, what)


@final
class SubscriptionPool:
    """Holds one entry per subscription key: raw instance, fan-out, known workers.

    Consumers of the same key in the same pool share one raw instance and one
    iteration of it. An entry is built when its first consumer starts
    iterating and finalised when its last consumer is released and the ttl has
    elapsed: the fan-out is closed (cancelling a pull in flight and closing
    the raw iterator), then the raw instance's ``aclose()`` (if it has one)
    is awaited, exactly once. An entry whose source ended or failed is never
    reused: the next consumer gets a fresh raw instance.

    ``async with SubscriptionPool() as pool:`` makes the pool current for the
    block (see :func:`current_pool`) and, on exit, finalises every entry:
    their consumers end. A closed pool cannot be iterated again. A pool is
    bound to the event loop that first uses it.
    """

    __slots__ = (
        "__weakref__",
        "_closed",
        "_closing",
        "_entries",
        "_loop",
        "_retired",
        "_token",
    )

    def __init__(self) -> None:
        self._entries: dict[tuple[type, Hashable], Entry] = {}
        # Entries no longer reachable by key (source finished) whose
        # consumers have not all been released yet.
        self._retired: set[Entry] = set()
        # Entries being finalised: unreachable, still counted until closed.
        self._closing: set[Entry] = set()
        self._closed = False
        self._loop: EventLoop | None = None
        self._token: Token[SubscriptionPool | None] | None = None

    @property
    def closed(self) -> bool:
        """Whether the pool was closed."""
        return self._closed

    def statistics(self) -> PoolStatistics:
        """Return a snapshot of entries and attached consumers."""
        live = [*self._entries.values(), *self._retired]
        return PoolStatistics(
            entries=len(live) + len(self._closing),
            consumers=sum(entry.refs for entry in live),
            idle=sum(1 for entry in live if entry.refs == 0),
        )

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
        """Close the pool: finalise every entry; their consumers end. Idempotent."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            for entry in [*self._entries.values(), *self._retired]:
                await self._finalize(entry)

    def __repr__(self) -> str:
        stats = self.statistics()
        state = "CLOSED" if self._closed else "OPEN"
        return (
            f"<SubscriptionPool [{state}, entries: {stats.entries}, "
            f"consumers: {stats.consumers}]>"
        )

    # -- attaching and releasing consumers -----------------------------------

    def _attach(
        self,
        key: tuple[type, Hashable],
        config: SubscriptionConfig,
        build: Callable[[], Any],
        what: str,
    ) -> Entry:
        """See :func:`attach`."""
        if self._closed:
            raise RuntimeError(
                f"cannot iterate {what}: its subscription pool is closed"
            )
        loop = current_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(
                f"cannot iterate {what}: a SubscriptionPool is bound to the event "
                "loop that first used it"
            )
        entry = self._entries.get(key)
        if entry is not None and entry.fanout.finished:
            self._retire(entry)
            entry = None
        if entry is None:
            raw = build()
            source: Tracking
            # Undo records for as far back as a consumer can be left behind:
            # one item beyond the bound (see _FanoutState.drop_beyond_lag).
            history = None if config.max_lag is None else config.max_lag + 1
            if config.restart is None:
                source = TrackedSource(raw, history)
                fanout = Fanout(
                    source,
                    max_lag=config.max_lag,
                    on_lag="error",
                    read_ahead=config.read_ahead,
                )
            else:
                restarting = source = RestartingSource(raw, config.restart, history)
                fanout = Fanout(
                    source,
                    max_lag=config.max_lag,
                    on_lag="error",
                    read_ahead=config.read_ahead,
                )
                restarting.deliver_to(fanout.inject)
            entry = Entry(self, key, raw, source, fanout, config.ttl, loop)
            self._entries[key] = entry
        entry.refs += 1
        if entry.expiry is not None:
            entry.expiry.cancel()
            entry.expiry = None
        return entry

    def _release_in_background(self, entry: Entry) -> None:
        entry.refs -= 1
        if entry.refs == 0:
            entry.loop.run_soon(self._after_last_release_in_background, entry)

    def _after_last_release_in_background(self, entry: Entry) -> None:
        entry.loop.spawn(self._after_last_release, entry)

    async def _after_last_release(self, entry: Entry) -> None:
        """Finalise an unused entry now, or once its ttl has elapsed."""
        if entry.refs > 0 or entry.finalizing:
            return  # attached again meanwhile, or already closing
        if entry.ttl > 0 and not entry.fanout.finished and not self._closed:
            scope = entry.expiry = anyio.CancelScope()
            entry.loop.spawn(self._expire, entry, scope)
            return
        with anyio.CancelScope(shield=True):
            await self._finalize(entry)

    async def _expire(self, entry: Entry, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                await anyio.sleep(entry.ttl)
        finally:
            if entry.expiry is scope and entry.refs == 0:
                entry.expiry = None
                with anyio.CancelScope(shield=True):
                    await self._finalize(entry)

    def _retire(self, entry: Entry) -> None:
        """Make a finished entry unreachable by key; finalise it once unused."""
        del self._entries[entry.key]
        self._retired.add(entry)
        if entry.refs == 0:
            entry.loop.spawn(self._finalize, entry)

    async def _finalize(self, entry: Entry) -> None:
        """Close the entry's fan-out and raw instance, exactly once."""
        if entry.finalizing:
            if entry.finalized is not None:
                await entry.finalized.wait()
            return
        entry.finalizing = True
        entry.finalized = anyio.Event()
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        self._retired.discard(entry)
        self._closing.add(entry)
        if entry.expiry is not None:
            entry.expiry.cancel()
            entry.expiry = None
        try:
            try:
                await entry.fanout.aclose()
            except Exception:
                logger.exception("error closing the source of %r", entry.raw)
            await _close_raw(entry.raw)
        finally:
            self._closing.discard(entry)
            entry.finalized.set()


async def _close_raw(raw: Any) -> None:
    """Await ``raw.aclose()`` if the raw instance has one."""
    closer = getattr(raw, "aclose", None)
    if closer is None:
        return
    try:
        result = closer()
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("error closing %r", raw)
