"""Demand-driven multicast of one async iterator: a shared log, one cursor per consumer.

Data path: the source is pulled, one item per request, into a singly linked
log; each consumer holds a reference to the next node it will read. A node is
``[item, next, seq]`` (a list: the cheapest object to build and index); the
fan-out holds only the empty node at the log's end, which the next item fills.
So an item is held by nothing but the consumers that have yet to read it, and
is freed by reference counting the moment the last of them moves past it or
leaves: no counts to keep, nothing to trim. A read is two index operations.

A consumer that must take the slow path at its next read (it lagged, or a
pull waits for it to make room) has its reference replaced by a *trap*:
``[None, None, seq, node, kind, arg]``, which has no ``next`` and so is never
read as an item.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
import weakref
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from typing import Any
from typing import Generic
from typing import Literal
from typing import Protocol
from typing import TypeVar
from typing import final

import anyio
import anyio.lowlevel
import attrs

from ._eager import DRIVEN
from ._eager import SUSPENDED
from ._eager import PumpOnly
from ._eager import forward
from ._eager import inline_puller
from ._loop import EventLoop
from ._loop import current_loop
from ._unhooked import unhooked

__all__ = ["Fanout", "FanoutConsumer", "FanoutStatistics", "LagPolicy", "Lagged"]

T = TypeVar("T")

#: What to do when a consumer falls ``max_lag`` items behind.
LagPolicy = Literal["wait", "error"]


class Lagged(Exception):
    """A consumer fell more than ``max_lag`` items behind and skipped some.

    Raised by ``__anext__`` of a :class:`FanoutConsumer` of a fan-out built
    with ``on_lag="error"``; the consumer's next ``__anext__`` returns the
    oldest item still held.
    """

    def __init__(self, skipped: int) -> None:
        super().__init__(f"consumer fell behind and skipped {skipped} items")
        #: How many items this consumer missed.
        self.skipped = skipped


def validate_max_lag(max_lag: int | None) -> int | None:
    """Check a ``max_lag`` argument: ``None`` or an int >= 1."""
    if max_lag is None:
        return None
    if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"max_lag must be None or an int >= 1, got {max_lag!r}")
    return max_lag


#: A log node: ``[item, next node or None, seq]``; see the module docstring.
_Node = list[Any]

#: Trap kinds (``trap[4]``): the consumer skipped ``trap[5]`` items; or a
#: pull waits for this consumer to read (``on_lag="wait"``).
_LAGGED = "lagged"
_WATCHED = "watched"

#: Where an ended consumer points: a node that never gets a next one.
_ENDED: _Node = [None, None, -1]

#: ``_lag_check_at`` when no lag bound applies.
_NEVER = sys.maxsize

#: What FanoutConsumer._pull returns when a pull is in flight: wait for it.
WAITING: Any = object()


class _ParkingLot(Protocol):
    """What the fan-out uses of ``trio.lowlevel.ParkingLot``."""

    async def park(self) -> None: ...

    def unpark_all(self) -> object: ...


def _parking_lot() -> _ParkingLot:
    """A new ``trio.lowlevel.ParkingLot`` (trio is imported only under trio)."""
    import trio

    return trio.lowlevel.ParkingLot()


@attrs.frozen
class FanoutStatistics:
    """A snapshot of a :class:`Fanout`, as returned by :meth:`Fanout.statistics`."""

    #: Consumers registered and not yet ended.
    consumers: int
    #: Items held in the log because some consumer has not received them yet.
    buffered: int
    #: Consumers suspended in ``__anext__`` waiting for the next pulled item.
    waiting: int
    #: Whether a pull from the source is in flight.
    pulling: bool
    #: Items pulled from the source so far.
    pulled: int


@attrs.frozen
class _End:
    """How the source ended: exhausted, failed or closed."""

    error: BaseException | None = None
    traceback: types.TracebackType | None = None
    closed: bool = False


@final
class Fanout(Generic[T]):
    """Multicast one async iterable to any number of independent consumers.

    Every consumer receives every item pulled after it registered, in source
    order, exactly once.

    **Demand-driven.** The source is advanced only when a consumer that has
    nothing buffered waits in ``__anext__``; at most one pull is in flight and
    nothing is pulled ahead of that demand. A consumer that has items buffered
    receives them without suspending and without touching the source.

    **Cancellation safety.** Pulls belong to a pump task owned by the fan-out
    (a consumer at the log's end may run a pull's steps itself, but always as
    that task, in its context: the source only ever sees the pump), so
    cancelling a consumer, even the one whose request started the pull in
    flight, only abandons that consumer's wait: it never cancels the pull,
    never closes or breaks the source and never loses, duplicates or reorders
    an item, for anyone. The cancelled consumer stays registered and its next
    ``__anext__`` returns the item it would have received. The pump starts at
    the first request, sleeps while there is no demand, ends when the source
    ends, when no consumer is left, or when the fan-out is closed; it never
    outlives the fan-out.

    **Errors.** An exception raised by the source reaches every consumer, each
    after the items pulled before it, with its original traceback; afterwards
    each consumer ends. A consumer registered after the source ended ends
    immediately (after receiving the error, if there was one).

    **Memory.** The log holds an item until every consumer registered when it
    was pulled has received it or has left (it is freed at that moment, by
    reference counting); a consumer that is garbage collected without
    ``close()`` leaves. A held item costs one small node (about 100 bytes)
    besides the item itself. With ``max_lag=None`` a consumer
    that stops reading makes the log grow with every item the others pull;
    ``max_lag`` bounds the log to that many items, per ``on_lag``:

    - ``"wait"`` (lossless backpressure): no pull starts while the slowest
      consumer is ``max_lag`` items behind; the others wait for it.
    - ``"error"`` (tokio's broadcast semantics): the oldest items are dropped
      even if unread; a consumer that missed some gets :exc:`Lagged` (with
      the count) from its next ``__anext__``, then the oldest item held.

    **Cost.** A buffered read is two index operations and never touches the
    other consumers. A pull is O(1) too, except at the lag bound: while some
    consumer is ``max_lag`` items behind, each pull (``"error"``) or each
    read of the slowest consumer (``"wait"``) looks at every consumer.

    **Closing.** :meth:`aclose` cancels a pull in flight, closes the source
    (``aclose()`` of its iterator) and ends every consumer at once: items not
    yet received are discarded.

    :param source: The async iterable to multicast; ``aiter(source)`` is
        called once, at the first pull.
    :param max_lag: How many items the log may hold for the slowest
        consumer, or ``None`` for no bound.
    :param on_lag: ``"wait"`` or ``"error"``: what happens at the bound.
    :raises ValueError: if ``max_lag`` is not ``None`` or an int >= 1, or
        ``on_lag`` is neither ``"wait"`` nor ``"error"``.
    """

    __slots__ = (
        "__weakref__",
        "_arrival",
        "_consumers",
        "_demand",
        "_drop_lagging",
        "_end",
        "_holds_back",
        "_iterator",
        "_lag_check_at",
        "_loop",
        "_max_lag",
        "_puller",
        "_pulling",
        "_pump_done",
        "_pump_scope",
        "_pumping",
        "_registry",
        "_slowest",
        "_source",
        "_space",
        "_tail",
    )

    def __init__(
        self,
        source: AsyncIterable[T],
        *,
        max_lag: int | None = None,
        on_lag: LagPolicy = "wait",
    ) -> None:
        if not hasattr(source, "__aiter__"):
            raise TypeError(
                f"Fanout needs an async iterable source, got {type(source).__name__}"
            )
        self._max_lag = validate_max_lag(max_lag)
        if on_lag not in ("wait", "error"):
            raise ValueError(f"on_lag must be 'wait' or 'error', got {on_lag!r}")
        self._drop_lagging = on_lag == "error"
        # on_lag="wait" with a bound: a pull may have to wait for room.
        self._holds_back = self._max_lag is not None and not self._drop_lagging
        self._source = source
        self._iterator: AsyncIterator[T] | None = None
        # The log's end: the empty node the next item fills. Its seq is the
        # number of items logged so far.
        self._tail: _Node = [None, None, 0]
        self._consumers = 0
        # Weak references to the registered consumers, for what needs their
        # positions: the lag bound, statistics, closing (see _live). Weak: a
        # dropped consumer is collected.
        self._registry: set[weakref.ref[FanoutConsumer[T]]] = set()
        # The lag bound. _slowest is a lower bound on every consumer's seq
        # (positions only move forward; newcomers start at the end).
        self._slowest = 0
        self._lag_check_at = (
            self._max_lag + 1
            if self._max_lag is not None and self._drop_lagging
            else _NEVER
        )
        self._space: anyio.Event | None = None
        self._end: _End | None = None
        # Demand: consumers waiting for the item after the log's end. They all
        # wait on _arrival, which is set (and replaced) when that item lands.
        self._demand = 0
        # On asyncio, the list of the waiters' futures; on trio, a parking
        # lot (awaited directly: an Event would add two coroutines per wait).
        self._arrival: list[asyncio.Future[None]] | _ParkingLot | None = None
        # The pump: the task that runs (or finishes) every pull.
        self._loop: EventLoop | None = None
        self._pumping = False
        self._pulling = False
        # While the pump idles, a consumer may start a pull inline, as the
        # pump (see _eager.py); a pull that suspends is left to the pump.
        self._puller: PumpOnly | None = None
        self._pump_scope: anyio.CancelScope | None = None
        self._pump_done: anyio.Event | None = None

    # -- public surface --------------------------------------------------

    def consumer(self) -> FanoutConsumer[T]:
        """Register a new consumer that receives every item pulled from now on.

        :raises ~anyio.ClosedResourceError: if the fan-out was closed.
        """
        end = self._end
        if end is not None and end.closed:
            raise anyio.ClosedResourceError("this fan-out is closed")
        consumer = FanoutConsumer(self, self._tail)
        self._consumers += 1
        registry = self._registry
        registry.add(weakref.ref(consumer, registry.discard))
        return consumer

    @property
    def finished(self) -> bool:
        """Whether the source ended, failed, or the fan-out was closed."""
        return self._end is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._end is not None and self._end.closed

    def statistics(self) -> FanoutStatistics:
        """Return a snapshot of consumers, buffered items and pump state."""
        return FanoutStatistics(
            consumers=self._consumers,
            buffered=self._buffered(),
            waiting=self._demand,
            pulling=self._pulling,
            pulled=self._tail[2],
        )

    async def aclose(self) -> None:
        """Cancel a pull in flight, close the source and end every consumer.

        Idempotent. Runs shielded from cancellation, so the source is closed
        even when the caller is being cancelled. An exception raised by the
        source's ``aclose()`` propagates.
        """
        first = not self.closed
        if first:
            self._end = _End(closed=True)
            self._consumers = 0
            # Every consumer moves to the (empty) end: what it had yet to read
            # is dropped, and its next read finds the fan-out closed.
            tail = self._tail
            for consumer in self._live():
                consumer._node = tail  # pyright: ignore[reportPrivateUsage]
            self._registry = set()
            self._satisfy_waiters()
            self._wake_space()
            if self._pump_scope is not None:
                self._pump_scope.cancel()
        with anyio.CancelScope(shield=True):
            if self._pump_done is not None:
                await self._pump_done.wait()
            if first:
                iterator = self._iterator
                if iterator is None and hasattr(self._source, "__anext__"):
                    iterator = self._source  # type: ignore[assignment]
                self._iterator = None
                closer = getattr(iterator, "aclose", None)
                if closer is not None:
                    await closer()

    def __repr__(self) -> str:
        if self._end is None:
            state = "OPEN"
        elif self._end.closed:
            state = "CLOSED"
        elif self._end.error is not None:
            state = "FAILED"
        else:
            state = "EXHAUSTED"
        return (
            f"<Fanout [{state}, consumers: {self._consumers}, "
            f"buffered: {self._buffered()}] of {self._source!r}>"
        )

    # -- the log ---------------------------------------------------------

    def _append(self, item: T) -> None:
        tail = self._tail
        seq: int = tail[2] + 1
        following: _Node = [None, None, seq]
        tail[0] = item
        tail[1] = following
        self._tail = following
        if self._lag_check_at <= seq:
            self._drop_beyond_lag()
        if self._arrival is not None:
            self._satisfy_waiters()

    def _inject(self, item: T) -> None:
        """Log an item that did not come from a pull (a resync's drop), if open."""
        if self._end is None:
            self._append(item)

    def _positions(self) -> list[int]:
        """The seq of every registered consumer's next item."""
        return [consumer._node[2] for consumer in self._live()]  # pyright: ignore[reportPrivateUsage]

    def _live(self) -> list[FanoutConsumer[T]]:
        """A snapshot of the registered consumers, for a scan.

        The weak references are copied in one step first: garbage collection
        may run at any allocation of the scan, and a finaliser it runs may end
        a consumer or register one. Ending a consumer does not remove its
        reference (a finaliser may end one mid-scan); the reference removes
        itself once the consumer is collected.
        """
        live: list[FanoutConsumer[T]] = []
        for reference in list(self._registry):
            consumer = reference()
            if consumer is not None and consumer._registered:  # pyright: ignore[reportPrivateUsage]
                live.append(consumer)
        return live

    def _buffered(self) -> int:
        if self._end is not None and self._end.closed:
            return 0
        return self._tail[2] - min(self._positions(), default=self._tail[2])

    def _drop_beyond_lag(self) -> None:
        """``on_lag="error"``: drop the items more than ``max_lag`` behind the end.

        Each consumer still short of them is moved to the oldest item kept,
        behind a trap that raises :exc:`Lagged` (with the count) at its next
        read; the items it skipped are freed as it lets go of them. Runs only
        when some consumer may be too far behind (``_lag_check_at``).
        """
        max_lag = self._max_lag
        assert max_lag is not None
        end = self._tail[2]
        oldest = end - max_lag
        slowest = end
        for consumer in self._live():
            node = consumer._node  # pyright: ignore[reportPrivateUsage]
            seq = node[2]
            if seq < oldest:
                trapped = len(node) > 3
                kept = node[3] if trapped else node
                while kept[2] < oldest:
                    kept = kept[1]
                if trapped and node[4] is _LAGGED:
                    node[2], node[3], node[5] = oldest, kept, node[5] + oldest - seq
                else:
                    consumer._node = [None, None, oldest, kept, _LAGGED, oldest - seq]  # pyright: ignore[reportPrivateUsage]
                seq = oldest
            if seq < slowest:
                slowest = seq
        self._lag_check_at = slowest + max_lag + 1

    def _log_is_full(self) -> bool:
        """``on_lag="wait"``: the slowest consumer is ``max_lag`` items behind.

        Call only when ``_holds_back`` (a bound, in ``"wait"`` mode).
        """
        max_lag = self._max_lag
        assert max_lag is not None
        end = self._tail[2]
        if end - self._slowest < max_lag:
            return False
        self._slowest = min(self._positions(), default=end)
        return end - self._slowest >= max_lag

    async def _wait_for_space(self) -> None:
        """Wait until the slowest consumer reads (or leaves) the oldest item.

        The consumers at the oldest item get a trap, so that their next read
        wakes this wait.
        """
        space = self._space
        if space is None:
            space = self._space = anyio.Event()
        self._watch_slowest()
        await space.wait()

    def _watch_slowest(self) -> None:
        # Not inline in _wait_for_space: its suspended frame must not keep a
        # consumer alive (a dropped slow consumer must be collectable).
        slowest = self._slowest
        for consumer in self._live():
            node = consumer._node  # pyright: ignore[reportPrivateUsage]
            if node[2] == slowest and len(node) == 3:
                consumer._node = [None, None, slowest, node, _WATCHED, None]  # pyright: ignore[reportPrivateUsage]

    def _wake_space(self) -> None:
        """A slow consumer moved or left: let a pull waiting for room look again."""
        space = self._space
        if space is not None:
            self._space = None
            space.set()

    def _leave(self, consumer: FanoutConsumer[T]) -> None:
        """Unregister a consumer; what only it held is freed with its node."""
        if self._end is not None and self._end.closed:
            return
        self._consumers -= 1
        # (It stays in the registry until collected: see _live.)
        self._wake_space()
        if self._consumers == 0 and self._puller is not None:
            self._puller.wake()  # let an idle pump notice that nobody is left

    # -- demand and the pump ----------------------------------------------

    def _satisfy_waiters(self) -> None:
        arrival = self._arrival
        if arrival is not None:
            self._arrival = None
            self._demand = 0
            if isinstance(arrival, list):
                for waiter in arrival:
                    if not waiter.done():
                        waiter.set_result(None)
            else:
                arrival.unpark_all()

    async def _wait_for_item(self, consumer: FanoutConsumer[T]) -> None:
        """Register ``consumer``'s demand for the item after the log's end and
        wait for it (or for the consumer to be closed).

        Cancelling this wait withdraws the demand but never the pull in
        flight, which the pump completes and logs for everyone.
        """
        arrival = self._arrival
        if arrival is None:
            loop = self._loop
            if loop is None:
                loop = self._loop = current_loop()
            arrival = self._arrival = (
                [] if loop.backend == "asyncio" else _parking_lot()
            )
        self._demand += 1
        if not self._pumping:
            self._start_pump()
        elif self._puller is not None and not self._puller.driving:
            self._puller.wake()  # (a driven pull's end wakes every waiter)
        consumer._waiting = True  # pyright: ignore[reportPrivateUsage]
        try:
            if isinstance(arrival, list):
                # asyncio: a future per waiter, awaited directly (an Event
                # would add two coroutines per wait).
                waiter = asyncio.get_running_loop().create_future()
                arrival.append(waiter)
                try:
                    await waiter
                except BaseException:
                    if self._arrival is arrival:  # not woken: hold nothing
                        arrival.remove(waiter)
                    raise
            else:
                await arrival.park()  # trio: woken by unpark_all
        finally:
            consumer._waiting = False  # pyright: ignore[reportPrivateUsage]
            if self._arrival is arrival:
                self._demand -= 1

    def _start_pump(self) -> None:
        if self._loop is None:
            self._loop = current_loop()
        self._pumping = True
        self._pump_scope = anyio.CancelScope()
        self._pump_done = anyio.Event()
        context = contextvars.copy_context()
        self._loop.spawn(
            self._pump, self._pump_scope, self._pump_done, context, context=context
        )

    def _open(self) -> AsyncIterator[T]:
        iterator = self._iterator = aiter(self._source)
        return iterator

    async def _drive_pull(self, puller: PumpOnly) -> None:
        """Carry on, in the calling consumer, a pull it started inline that
        suspended at a yield bound to no task.

        The consumer makes that yield itself, then runs the next step, still
        as the pump, until the pull completes or suspends on something bound
        to a task (which the pump then owns). If the consumer is cancelled at
        its yield, or the pump is woken meanwhile (closing, a timeout inside
        the pull), the pump carries the pull on instead; the consumer's
        cancellation never reaches the source.
        """
        checkpoint_if_cancelled = puller.cancel_check
        while puller.driving:
            try:
                sent = await forward(puller.driven_message)
                if checkpoint_if_cancelled is not None:
                    await checkpoint_if_cancelled()
            except BaseException:
                if puller.driving:
                    puller.hand_over()
                raise
            if not puller.driving:
                break  # the pump took the pull over
            try:
                item = puller.resume(sent)
            except StopAsyncIteration:
                self._finish(None)
                return
            except BaseException as error:
                self._finish(error)
                return
            if item is SUSPENDED:
                return
            if item is not DRIVEN:
                self._pulling = False
                self._append(item)
        if self._consumers == 0:
            puller.wake()  # the pump stayed parked: let it see nobody is left

    async def _pump(
        self,
        scope: anyio.CancelScope,
        done: anyio.Event,
        context: contextvars.Context,
    ) -> None:
        try:
            with scope:
                self._puller = inline_puller(context)
                await self._pump_while_needed(self._puller)
        except BaseException:
            if self._pulling and self._end is None:
                # Cancelled from outside (the loop is shutting down) in the
                # middle of a pull: the source is unusable from now on.
                self._finish(
                    anyio.BrokenResourceError(
                        "the fan-out's pull was cancelled from outside"
                    )
                )
            raise
        finally:
            self._pumping = False
            self._pulling = False
            self._puller = None
            if self._pump_scope is scope:
                self._pump_scope = None
            done.set()

    async def _pump_while_needed(self, puller: PumpOnly) -> None:
        cancelled = anyio.get_cancelled_exc_class()
        while self._end is None:
            if self._demand == 0:
                if self._consumers == 0:
                    return
                pull = await puller.idle()
                if pull is None:
                    continue  # woken by demand (or by the last consumer leaving)
            else:
                iterator = self._iterator
                if iterator is None:
                    iterator = self._iterator = aiter(self._source)
                pull = anext(iterator)
            self._pulling = True
            try:
                item = await pull
            except StopAsyncIteration:
                self._finish(None)
                return
            except cancelled:
                raise
            except BaseException as error:
                self._finish(error)
                return
            self._pulling = False
            if self._end is None:
                self._append(item)
            del item, pull  # an idle pump must not keep the last item alive

    def _finish(self, error: BaseException | None) -> None:
        traceback = error.__traceback__ if error is not None else None
        self._end = _End(error, traceback)
        self._pulling = False
        self._satisfy_waiters()
        if self._puller is not None:
            self._puller.wake()  # an idle pump has nothing left to do


@final
class FanoutConsumer(Generic[T]):
    """One consumer of a :class:`Fanout`: an async iterator over its items.

    Created by :meth:`Fanout.consumer`. Receives every item pulled after its
    registration, in order, exactly once.

    ``__anext__`` returns a buffered item without suspending; otherwise it
    waits for the next pull. Cancelling ``__anext__`` loses nothing: the
    consumer stays registered and its next ``__anext__`` returns the item it
    would have received. ``async for`` goes through :meth:`__aiter__`, an
    async generator over the same position (cheaper per item).
    :meth:`close` (or :meth:`aclose`, or leaving ``async with``) ends the
    consumer and frees what it held; so does garbage collection. Ending a
    consumer never affects the source or the others.
    """

    __slots__ = (
        "__weakref__",
        "_driving",
        "_fanout",
        "_node",
        "_registered",
        "_waiting",
    )

    def __init__(self, fanout: Fanout[T], node: _Node) -> None:
        self._fanout = fanout
        # The node of the next item to read (or a trap over it).
        self._node = node
        self._registered = True
        self._waiting = False
        # Set by _pull when the pull it started must be driven by whoever
        # awaits __anext__ next (at once: no await in between).
        self._driving = False

    def __aiter__(self) -> AsyncGenerator[T, None]:
        """An iterator for ``async for``: buffered items cost no coroutine.

        It reads what this consumer has buffered itself, and pulls or waits
        through :meth:`__anext__`, with the same guarantees. Like any
        async generator it ends at the first exception it raises (such as
        :exc:`Lagged`, or a cancellation): nothing is lost, since the
        position is this consumer's; iterate the consumer again, or call
        ``anext()`` on the consumer itself, to go on.
        """
        return unhooked(_reads(self))

    async def __anext__(self) -> T:
        node = self._node
        following = node[1]
        if following is not None:  # the fast path: an item is buffered
            self._node = following
            return node[0]
        fanout = self._fanout
        while True:
            if self._driving:  # _pull started a pull that this call drives
                self._driving = False
                puller = fanout._puller  # pyright: ignore[reportPrivateUsage]
                if puller is not None:
                    await fanout._drive_pull(puller)  # pyright: ignore[reportPrivateUsage]
            elif len(node) > 3:  # a trap: step onto the node it covers
                self._node = node[3]
                if node[4] is _LAGGED:
                    skipped: int = node[5]
                    del node  # the traceback must not pin the log
                    raise Lagged(skipped)
                fanout._wake_space()  # pyright: ignore[reportPrivateUsage]
            elif not self._registered:
                raise StopAsyncIteration
            elif fanout._end is not None:  # pyright: ignore[reportPrivateUsage]
                end = fanout._end  # pyright: ignore[reportPrivateUsage]
                self.close()
                if end.error is not None:
                    raise end.error.with_traceback(end.traceback)
                raise StopAsyncIteration
            elif fanout._holds_back and fanout._log_is_full():  # pyright: ignore[reportPrivateUsage]
                await fanout._wait_for_space()  # pyright: ignore[reportPrivateUsage]
            else:
                item = self._pull()
                if item is WAITING:
                    await fanout._wait_for_item(self)  # pyright: ignore[reportPrivateUsage]
                elif item is not SUSPENDED:
                    return item
                # Else the pump owns the pull now, or the source ended, or
                # this call drives the pull (next round).
            node = self._node
            following = node[1]
            if following is not None:
                self._node = following
                return node[0]

    def _pull(self) -> Any:
        """Start a pull inline, as the pump, if this consumer (at the log's
        end) may now: the pump idles, nothing holds the pull back.

        Synchronous, for the iterators of ``async for``, which must not
        create a coroutine per item. Returns the item, logged and read, if
        the pull completed without suspending; :data:`WAITING` if a pull is
        in flight (or the pump is not running): await
        ``fanout._wait_for_item(consumer)``, then look again; otherwise
        :data:`SUSPENDED`: await :meth:`__anext__` for the item (it drives
        the pull started here, if that pull must be driven).
        """
        fanout = self._fanout
        node = self._node
        if (
            len(node) > 3  # a trap
            or not self._registered
            or fanout._end is not None  # pyright: ignore[reportPrivateUsage]
            or (fanout._holds_back and fanout._log_is_full())  # pyright: ignore[reportPrivateUsage]
        ):
            return SUSPENDED
        puller = fanout._puller  # pyright: ignore[reportPrivateUsage]
        if puller is None or not puller.ready:
            return WAITING
        fanout._pulling = True  # pyright: ignore[reportPrivateUsage]
        try:
            item = puller.start(fanout._iterator or fanout._open())  # pyright: ignore[reportPrivateUsage]
        except StopAsyncIteration:
            fanout._finish(None)  # pyright: ignore[reportPrivateUsage]
            return SUSPENDED
        except BaseException as error:
            fanout._finish(error)  # pyright: ignore[reportPrivateUsage]
            return SUSPENDED
        if item is DRIVEN:
            self._driving = True
            return SUSPENDED
        if item is not SUSPENDED:
            fanout._pulling = False  # pyright: ignore[reportPrivateUsage]
            fanout._append(item)  # pyright: ignore[reportPrivateUsage]
            self._node = node[1]
        return item

    def close(self) -> None:
        """End this consumer and free the items it held. Idempotent."""
        if self._registered:
            self._registered = False
            self._node = _ENDED
            self._fanout._leave(self)  # pyright: ignore[reportPrivateUsage]
            if self._waiting:
                self._fanout._satisfy_waiters()  # pyright: ignore[reportPrivateUsage]

    async def aclose(self) -> None:
        """Like :meth:`close`, with a checkpoint."""
        self.close()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self) -> FanoutConsumer[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _skip_to_end(self) -> None:
        """Drop everything this consumer has yet to read; resume at the log's end."""
        fanout = self._fanout
        if not self._registered or fanout.closed:
            return
        self._node = fanout._tail  # pyright: ignore[reportPrivateUsage]
        fanout._wake_space()  # pyright: ignore[reportPrivateUsage]

    @property
    def fanout(self) -> Fanout[T]:
        """The fan-out this consumer reads from."""
        return self._fanout

    @property
    def buffered(self) -> int:
        """Items already pulled that this consumer has yet to receive."""
        if not self._registered or self._fanout.closed:
            return 0
        return self._fanout._tail[2] - self._node[2]  # pyright: ignore[reportPrivateUsage]

    def __del__(self) -> None:
        if getattr(self, "_registered", False):
            self._registered = False
            self._fanout._leave(self)  # pyright: ignore[reportPrivateUsage]

    def __repr__(self) -> str:
        state = "ACTIVE" if self._registered else "ENDED"
        return f"<FanoutConsumer [{state}, buffered: {self.buffered}]>"


async def _reads(consumer: FanoutConsumer[T]) -> AsyncGenerator[T, None]:
    """Every item of ``consumer``, in order (see :meth:`FanoutConsumer.__aiter__`)."""
    pull = consumer._pull  # pyright: ignore[reportPrivateUsage]
    wait = consumer._fanout._wait_for_item  # pyright: ignore[reportPrivateUsage]
    read = consumer.__anext__
    while True:
        node = consumer._node  # pyright: ignore[reportPrivateUsage]
        following = node[1]
        if following is not None:  # buffered: __anext__'s fast path
            consumer._node = following  # pyright: ignore[reportPrivateUsage]
            yield node[0]
            continue
        item = pull()
        if item is WAITING:
            await wait(consumer)
            continue
        if item is SUSPENDED:
            try:
                item = await read()
            except StopAsyncIteration:
                return
        yield item
