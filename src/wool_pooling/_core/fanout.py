"""Demand-driven multicast of one async iterator: a shared log, one cursor per consumer.

The data path: a consumer with nothing to read waits (:meth:`Fanout._wait`)
and asks the pump for a pull; the pump (:func:`_iterate`, one task per
fan-out) logs the item in the step that receives it (:meth:`Fanout._push`)
and may pull again unasked, up to ``read_ahead`` items; each consumer holds
the next node it will read. A node is ``[item, next, seq]``; the fan-out
holds only the empty node at the log's end, so an item is held by the
consumers that have yet to read it and freed by reference counting when the
last of them moves past it. See docs/guarantees.rst.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import sys
import types
import weakref
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import Generic
from typing import Literal
from typing import TypeVar
from typing import final

import anyio
import anyio.lowlevel
import attrs

from .backend import EventLoop
from .backend import Interruptible
from .backend import Waiters
from .backend import current_loop
from .backend import ready
from .iterators import aclose_iterator
from .iterators import throw_into
from .signatures import check_positional
from .signatures import suggest_keywords

__all__ = ["Fanout", "FanoutConsumer", "FanoutStatistics", "LagPolicy", "Lagged"]

T = TypeVar("T")

logger = logging.getLogger("wool_pooling")

#: What to do when a consumer falls ``max_lag`` items behind.
LagPolicy = Literal["wait", "error"]

#: How many items a fan-out's pump pulls ahead of demand, by default: the
#: gain flattens beyond 64 (docs/benchmarks.rst, ``benchmarks/read_ahead.py``).
DEFAULT_READ_AHEAD = 64


class Lagged(Exception):
    """A consumer fell more than ``max_lag`` items behind and skipped some.

    Raised by a :class:`FanoutConsumer` of a fan-out built with
    ``on_lag="error"``, and by a :class:`~wool_pooling.SubscriptionConsumer`
    whose stream carried items that are not discovery events; the
    consumer's next read returns the oldest item still held. See :ref:`lag`.
    """

    def __init__(self, skipped: int) -> None:
        super().__init__(f"consumer fell behind and skipped {skipped} items")
        #: How many items this consumer missed.
        self.skipped = skipped


#: The items a fan-out holds for its slowest consumer unless told otherwise
#: (``Fanout`` and ``@shared_subscription`` alike).
DEFAULT_MAX_LAG = 1024


def validate_read_ahead(read_ahead: int) -> int:
    """Check a ``read_ahead`` argument: an int >= 0."""
    if (
        isinstance(read_ahead, bool)
        or not isinstance(read_ahead, int)  # pyright: ignore[reportUnnecessaryIsInstance]
        or read_ahead < 0
    ):
        raise ValueError(f"read_ahead must be an int >= 0, got {read_ahead!r}")
    return read_ahead


def validate_max_lag(max_lag: int | None) -> int | None:
    """Check a ``max_lag`` argument: ``None`` or an int >= 1."""
    if max_lag is None:
        return None
    if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"max_lag must be None or an int >= 1, got {max_lag!r}")
    return max_lag


#: A log node: ``[item, next node or None, seq]``.
_Node = list[Any]


@final
class _Trap(list[Any]):
    """A node ``[None, None, seq]`` in front of ``covered``: the consumer
    holding it takes the slow path at its next read, because it lagged
    (:data:`_LAGGED`: it raises :exc:`Lagged` first) or a pull waits for it
    to read (:data:`_WATCHED`)."""

    __slots__ = ("covered", "kind", "skipped")

    def __init__(self, covered: _Node, seq: int, kind: str, skipped: int = 0) -> None:
        super().__init__((None, None, seq))
        self.covered = covered
        self.kind = kind
        self.skipped = skipped


_LAGGED = "lagged"
_WATCHED = "watched"

#: What a consumer's read finds: nothing ready yet, or its end.
_NOTHING: Any = object()
_DONE: Any = object()

#: Where an ended consumer points: a node that never gets a next one.
_ENDED: _Node = [None, None, -1]

#: The horizon when no lag bound applies.
_NEVER = sys.maxsize


@attrs.frozen
class FanoutStatistics:
    """A snapshot of a :class:`Fanout`, as returned by :meth:`Fanout.statistics`."""

    #: Consumers registered and not yet ended.
    consumers: int
    #: Items held in the log because some consumer has not received them yet.
    buffered: int
    #: Consumers suspended waiting for the next pulled item.
    waiting: int
    #: Whether a pull from the source is in flight.
    pulling: bool
    #: Items logged so far: pulled, or added by :meth:`Fanout.inject`.
    pulled: int


@attrs.frozen
class _End:
    """How the source ended: exhausted, failed or closed."""

    error: BaseException | None = None
    traceback: types.TracebackType | None = None
    closed: bool = False
    #: The pump was cancelled from outside (its event loop shut down, say).
    cancelled: bool = False

    def __str__(self) -> str:
        return (
            "CLOSED" if self.closed else "EXHAUSTED" if self.error is None else "FAILED"
        )


_CLOSED_END = _End(closed=True)


@final
class _Pump:
    """The task that iterates a fan-out's source, and the event loop it runs in.

    Bound at the fan-out's first wait; the task starts at the first demand
    and holds the fan-out only weakly, so that dropping the fan-out stops it.
    """

    __slots__ = (
        "close_error",
        "context",
        "deferred",
        "done",
        "interruptible",
        "loop",
        "parking",
        "patience",
        "pulling",
        "stopping",
        "task",
        "watching",
    )

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        # The first waiting consumer's context, which every pull runs in.
        self.context = contextvars.copy_context()
        # The region its pulls run in (stop() interrupts it); where the task
        # waits for a demand, while it does; set once the task has ended
        # (None until it starts); the task.
        self.interruptible: Interruptible = loop.interruptible()
        self.parking: Waiters | None = None
        self.done: anyio.Event | None = None
        self.task: object = None
        # A pull is asked for or in flight; the task is to close the source.
        self.pulling = False
        self.stopping = False
        # What the source's aclose() raised, for Fanout.aclose() to raise.
        self.close_error: BaseException | None = None
        # The wake of waiting consumers held back while reading ahead; a
        # watch runs over it; releases that wake at once (Fanout._release).
        self.deferred = False
        self.watching = False
        self.patience = 0

    def stop(self) -> None:
        """Have the task close the source and end; from the loop's thread,
        outside the task."""
        self.stopping = True
        if self.parking is not None:
            self.parking.wake()
        elif self.pulling:
            self.interruptible.cancel()


def _wake_space_of(ref: weakref.ref[Fanout[Any]]) -> None:
    state = ref()
    if state is not None:
        state._wake_space()  # pyright: ignore[reportPrivateUsage]


@suggest_keywords
@final
class Fanout(Generic[T]):
    """Multicast one async iterable to any number of independent consumers.

    Every consumer receives every item pulled after it registered, in source
    order, exactly once. The source is advanced on demand, by one task (the
    pump) for its whole life, with up to ``read_ahead`` items pulled ahead;
    cancelling a consumer never cancels a pull or loses an item; an error of
    the source reaches every consumer with its traceback, after the items
    pulled before it; the log holds an item until every consumer registered
    when it was pulled has received it or left, within ``max_lag`` if given.
    A fan-out is bound to the event loop of its first wait. See
    :ref:`fanout` for the full guarantees and their costs.

    :param source: The async iterable to multicast; ``aiter(source)`` is
        called once, at the first pull, in the pump.
    :param max_lag: How many items the log may hold for the slowest
        consumer (1024 by default, as ``@shared_subscription``), or ``None``
        for no bound.
    :param on_lag: At the bound, ``"wait"``: no pull starts until the slowest
        consumer reads (lossless); ``"error"``: the oldest items are dropped,
        and a consumer that missed some gets :exc:`Lagged` at its next read.
    :param read_ahead: How many items the pump may pull past the most
        advanced consumer's demand, inside ``max_lag``; ``0`` pulls on
        demand only.
    :raises TypeError: if ``source`` has no ``__aiter__``.
    :raises ValueError: if ``max_lag`` is not ``None`` or an int >= 1,
        ``on_lag`` is neither ``"wait"`` nor ``"error"`` (or ``"error"``
        with ``max_lag=None``, a policy that could never act), or ``read_ahead``
        is not an int >= 0.
    """

    __slots__ = (
        "__weakref__",
        "_ahead",
        "_arrival",
        "_drop_lagging",
        "_end",
        "_horizon",
        "_max_lag",
        "_pump",
        "_read_ahead",
        "_registry",
        "_source",
        "_space",
        "_tail",
    )

    def __init__(
        self,
        source: AsyncIterable[T],
        *,
        max_lag: int | None = DEFAULT_MAX_LAG,
        on_lag: LagPolicy = "wait",
        read_ahead: int = DEFAULT_READ_AHEAD,
    ) -> None:
        if not hasattr(source, "__aiter__"):
            raise TypeError(
                f"Fanout needs an async iterable source, got {type(source).__name__}"
            )
        max_lag = validate_max_lag(max_lag)
        if on_lag not in ("wait", "error"):
            raise ValueError(f"on_lag must be 'wait' or 'error', got {on_lag!r}")
        if on_lag == "error" and max_lag is None:
            raise ValueError(
                "on_lag='error' needs a max_lag: with max_lag=None no consumer "
                "ever lags, so the policy could never act"
            )
        # What the pump iterates (dropped at close); the log's end, the empty
        # node the next item fills (its seq: items logged so far).
        self._source: AsyncIterable[T] = source
        self._tail: _Node = [None, None, 0]
        # Weak references to the consumers registered and not ended.
        self._registry: set[weakref.ref[FanoutConsumer[T]]] = set()
        self._max_lag = max_lag
        self._drop_lagging = on_lag == "error"
        # slowest + max_lag + 1, where slowest is a lower bound on every
        # consumer's seq: no consumer can be past the bound before the log
        # reaches it, so the lag check is one comparison until then.
        self._horizon = _NEVER if max_lag is None else max_lag + 1
        # Items the pump may pull past the most advanced consumer's demand,
        # and how many it has pulled since that consumer last waited.
        self._read_ahead = validate_read_ahead(read_ahead)
        self._ahead = 0
        self._end: _End | None = None
        # Waits for the next item and for room under the bound (woken once).
        self._arrival: Waiters | None = None
        self._space: Waiters | None = None
        self._pump: _Pump | None = None

    def consumer(
        self, *, on_skip: Callable[[int], object] | None = None
    ) -> FanoutConsumer[T]:
        """Register a new consumer that receives every item pulled from now on.

        :param on_skip: (``on_lag="error"``) called, synchronously and in the
            step that logs the item that left the consumer behind, with the
            number of items logged before the first it misses, once per
            :exc:`Lagged` it will raise. It must not block; what it raises is
            logged and ignored.
        :raises TypeError: if ``on_skip`` is neither ``None`` nor a callable
            taking one argument.
        :raises ~anyio.ClosedResourceError: if the fan-out was closed.
        """
        if on_skip is not None:
            if not callable(on_skip):
                raise TypeError(f"on_skip must be callable or None, got {on_skip!r}")
            check_positional(on_skip, 1, lambda: f"on_skip {on_skip!r}")
        if self.closed:
            raise anyio.ClosedResourceError("this fan-out is closed")
        consumer = FanoutConsumer(self, self._tail, on_skip)
        registry = self._registry
        registry.add(weakref.ref(consumer, registry.discard))
        return consumer

    def inject(self, item: T) -> None:
        """Log ``item`` for every consumer as if it had been pulled, outside
        any pull; nothing happens once the fan-out has finished."""
        if self._end is None:
            self._push(item)
            self._wake_arrival()

    @property
    def finished(self) -> bool:
        """Whether the source ended, failed, or the fan-out was closed."""
        return self._end is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._end is _CLOSED_END

    def statistics(self) -> FanoutStatistics:
        """Return a snapshot of consumers, buffered items and pull state."""
        arrival = self._arrival  # (a wait for room is not counted)
        return FanoutStatistics(
            consumers=len(self._registry),
            buffered=self._buffered(),
            waiting=0
            if arrival is None
            else sum(consumer._busy is arrival for consumer in self._live()),
            pulling=self._pump is not None and self._pump.pulling,
            pulled=self._tail[2],
        )

    async def aclose(self) -> None:
        """End every consumer, cancel a pull in flight and close the source.

        The pump closes the source and this waits for it. Idempotent; runs
        shielded from cancellation. See :ref:`fanout`.

        :raises Exception: what the source's ``aclose()`` raised, once, to
            the first call after it.
        :raises RuntimeError: if the source is iterated on another event
            loop (the consumers are ended all the same, and the source is
            closed in its own loop).
        """
        first = not self.closed
        if first:
            self._end = _CLOSED_END
            # Every consumer ends and lets go of this fan-out.
            for consumer in self._live():
                consumer._node = _ENDED
                consumer._state = _ended_state()
            self._registry = set()
            self._wake_all()
        source, self._source = self._source, _NO_SOURCE
        pump = self._pump
        if pump is None or pump.done is None:  # never pulled
            if first and hasattr(source, "__anext__"):
                with anyio.CancelScope(shield=True):
                    await aclose_iterator(source)
            return
        del source
        if not pump.done.is_set():
            loop = pump.loop
            if not loop.is_current():
                # The pump closes the source in its own loop: no wait here.
                loop.run_soon(pump.stop)
                loop.check_current("this fan-out")
            if pump.task is loop.current_task():
                # The source closes its own fan-out: the pump ends after.
                pump.stopping = True
                return
            pump.stop()
            with anyio.CancelScope(shield=True):
                await pump.done.wait()
        error, pump.close_error = pump.close_error, None
        if error is not None:
            raise error

    def __repr__(self) -> str:
        return (
            f"<Fanout [{self._end or 'OPEN'}, consumers: {len(self._registry)}, "
            f"buffered: {self._buffered()}] of {self._source!r}>"
        )

    # -- the log -----------------------------------------------------------

    def _push(self, item: T) -> None:
        """Log ``item`` for every consumer; wake no one."""
        tail = self._tail
        seq: int = tail[2] + 1
        following: _Node = [None, None, seq]
        tail[0] = item
        tail[1] = following
        self._tail = following
        if self._horizon <= seq and self._drop_lagging:
            self._drop_beyond_lag()

    def _live(self) -> list[FanoutConsumer[T]]:
        """The registered consumers not ended. The references are copied in
        one step first: a finaliser run by garbage collection during the scan
        may end a consumer."""
        live: list[FanoutConsumer[T]] = []
        for reference in list(self._registry):
            consumer = reference()
            if consumer is not None and consumer._node is not _ENDED:
                live.append(consumer)
        return live

    def _positions(self) -> list[int]:
        """The seq of every registered consumer's next item."""
        return [
            node[2]
            for consumer in self._live()
            if (node := consumer._node) is not _ENDED
        ]

    def _buffered(self) -> int:
        if self.closed:
            return 0
        end = self._tail[2]
        return end - min(self._positions(), default=end)

    def _drop_beyond_lag(self) -> None:
        """``on_lag="error"``: move each consumer more than ``max_lag`` items
        behind the end to the oldest item kept, behind a trap raising
        :exc:`Lagged`; the items it skipped are freed as it lets go of them."""
        max_lag = self._max_lag
        assert max_lag is not None
        end = self._tail[2]
        oldest = end - max_lag
        slowest = end
        for consumer in self._live():
            # A finaliser run by garbage collection at any allocation below
            # may end this consumer: skip it then, and never trap it after.
            node = consumer._node
            if node is _ENDED:
                continue
            seq = node[2]
            if seq < oldest:
                kept = node.covered if type(node) is _Trap else node
                while kept[2] < oldest:
                    kept = kept[1]
                if type(node) is _Trap and node.kind is _LAGGED:
                    node[2] = oldest
                    node.covered = kept
                    node.skipped += oldest - seq
                else:
                    trap = _Trap(kept, oldest, _LAGGED, oldest - seq)
                    if consumer._node is node:
                        consumer._node = trap
                        on_skip = consumer._on_skip
                        if on_skip is not None:
                            try:
                                on_skip(seq)
                            except Exception:
                                logger.exception("on_skip of %r raised", consumer)
                seq = oldest
            slowest = min(slowest, seq)
        self._horizon = slowest + max_lag + 1

    def _log_is_full(self) -> bool:
        """``on_lag="wait"``: whether the slowest consumer is ``max_lag``
        items behind (always false without a bound)."""
        end = self._tail[2]
        if end + 1 < self._horizon:
            return False
        assert self._max_lag is not None
        slowest = min(self._positions(), default=end)
        self._horizon = slowest + self._max_lag + 1
        return end + 1 >= self._horizon

    def _watch_slowest(self) -> None:
        """Trap the consumers at the oldest item, so that their next read
        wakes a pull waiting for room."""
        assert self._max_lag is not None
        slowest = self._horizon - self._max_lag - 1
        for consumer in self._live():
            node = consumer._node
            if node is not _ENDED and node[2] == slowest and type(node) is not _Trap:
                trap = _Trap(node, slowest, _WATCHED)
                if consumer._node is node:  # not ended meanwhile (see above)
                    consumer._node = trap

    # -- waking --------------------------------------------------------------

    def _wake_arrival(self) -> None:
        """Wake the consumers waiting for an item."""
        arrival = self._arrival
        if arrival is not None:
            self._arrival = None
            assert self._pump is not None  # bound by the first wait
            self._pump.deferred = False
            arrival.wake()

    def _wake_space(self) -> None:
        """A slow consumer moved or left: let a wait for room look again."""
        space = self._space
        if space is not None:
            self._space = None
            space.wake()

    def _wake_all(self) -> None:
        self._wake_arrival()
        self._wake_space()

    def _release(self, pump: _Pump) -> None:
        """The pump pulls again, reading ahead, with consumers waiting: wake
        them at once, or hold the wake back while pulls look quick, so that
        a source whose pulls only pass a checkpoint wakes them once per
        batch (docs/guarantees.rst, :ref:`fanout`). A watch
        (:func:`_release_when_idle`) wakes them once the log stayed put for
        two passes; on asyncio's own loops it starts only once a pull
        suspends in a way that may last (``EventLoop.until_waits``). A watch
        that did not pay makes the next ``read_ahead`` releases wake at once.
        """
        if self._arrival is None or pump.deferred:
            return
        if pump.patience:
            pump.patience -= 1
            self._wake_arrival()
            return
        pump.deferred = True
        if pump.loop.until_waits is None:
            _watch(pump, weakref.ref(self))

    # -- waiting and pulling -------------------------------------------------

    def _wait(self, consumer: FanoutConsumer[T]) -> Awaitable[None]:
        """Register ``consumer``'s task for one wake-up that may give it
        something to read, asking for a pull if none is in flight; return
        what to await. Call only while ``consumer`` is at the log's end and
        the fan-out runs; the caller awaits in its own frame, then sets
        ``consumer._busy`` back to ``None``, or on an error calls
        ``consumer._give_up()``.

        :raises ~anyio.BusyResourceError: if another task waits on
            ``consumer`` already.
        :raises RuntimeError: if the fan-out is bound to another event loop.
        """
        if consumer._busy is not None:
            raise anyio.BusyResourceError("receiving from")
        pump = self._pump
        if pump is None:  # bound at the first wait
            pump = self._pump = _Pump(current_loop())
        loop = pump.loop
        loop.check_current("this fan-out")
        if not self._drop_lagging and self._log_is_full():
            waiters = self._space
            if waiters is None:
                waiters = self._space = loop.waiters()
            self._watch_slowest()
        else:
            self._ahead = 0  # the most advanced consumer has read everything
            if not pump.pulling:
                self._demand(pump)
                # An eager task factory runs the pump's first step in this
                # call: it may have logged an item already.
                if consumer._node is not self._tail or self._end is not None:
                    return ready()
            waiters = self._arrival
            if waiters is None:
                waiters = self._arrival = loop.waiters()
        waiting = waiters.wait()
        consumer._busy = waiters
        return waiting

    def _demand(self, pump: _Pump) -> None:
        """Ask the pump for the next item, starting its task at the first demand."""
        pump.pulling = True
        if pump.done is None:
            pump.done = anyio.Event()
            loop = pump.loop
            # Dropped while the pump lives: the pump closes the source and ends.
            weakref.finalize(self, loop.run_soon, pump.stop).atexit = False
            loop.spawn(_run_pump, weakref.ref(self), pump, context=pump.context)
        elif pump.parking is not None:
            pump.parking.wake()

    def _reads_ahead(self, pump: _Pump) -> bool:
        """Whether the pump pulls once more with no consumer waiting: fewer
        than ``read_ahead`` items wait unread by the most advanced consumer,
        some consumer is registered, and the item cannot take the log past
        ``max_lag``. Counts the pull it allows."""
        if self._ahead >= self._read_ahead or not self._registry:
            return False
        if self._tail[2] + 1 >= self._horizon and (
            self._drop_lagging or self._log_is_full()
        ):
            return False
        self._ahead += 1
        pump.pulling = True
        return True

    def _fail(self, error: BaseException) -> None:
        """The pump's pull raised ``error``: end the fan-out with it."""
        if self._end is None:
            if isinstance(error, StopAsyncIteration):
                self._end = _End()
            elif isinstance(error, anyio.get_cancelled_exc_class()):
                # Cancelled from outside (the loop is shutting down): the
                # source is closed, and unusable from now on.
                self._end = _End(
                    anyio.BrokenResourceError(
                        "the task iterating the fan-out's source was cancelled "
                        "from outside"
                    ),
                    cancelled=True,
                )
            else:
                self._end = _End(error, error.__traceback__)
            self._wake_all()


def _watch(pump: _Pump, ref: weakref.ref[Fanout[Any]]) -> None:
    """Start the watch over a held-back wake, unless one runs."""
    if pump.deferred and not pump.watching:
        pump.watching = True
        pump.loop.spawn(_release_when_idle, ref, pump)


async def _run_pump(ref: weakref.ref[Fanout[Any]], pump: _Pump) -> None:
    """The pump's task: iterate the source in the region :meth:`_Pump.stop`
    interrupts, and tell :meth:`Fanout.aclose` once done."""
    try:
        with pump.interruptible:
            await _iterate(ref, pump)
    finally:
        assert pump.done is not None
        pump.done.set()


async def _iterate(ref: weakref.ref[Fanout[Any]], pump: _Pump) -> None:
    """Call ``aiter()`` on the source, ``__anext__()`` once per demand (and
    per item read ahead), logging each item in the step that receives it, and
    the iterator's ``aclose()`` at the end. The fan-out is held only weakly
    while the source is awaited."""
    iterator: Any = None
    try:
        pump.task = pump.loop.current_task()
        fanout = ref()
        if fanout is None:
            return
        source = fanout._source
        del fanout
        if pump.stopping:  # closed before this task's first step
            if hasattr(source, "__anext__"):
                iterator = source
            return
        iterator = aiter(source)
        del source
        thrown: BaseException | None = None
        # asyncio's own loops: a held wake starts its watch only once a pull
        # suspends in a way that may last; whether the last such pull did.
        until_waits = pump.loop.until_waits
        suspensions = (
            None
            if until_waits is None
            else until_waits(functools.partial(_watch, pump, ref))
        )
        classify = False
        suspends = True
        while True:
            if thrown is None:
                if classify and suspensions is not None:
                    item = await suspensions.pull(iterator.__anext__())
                    suspends = suspensions.suspended
                else:
                    item = await iterator.__anext__()
            else:
                # A cancellation of the source's own scope, met between pulls:
                # the source gets it at its yield.
                item = await throw_into(iterator, thrown)
                thrown = None
            pump.pulling = False
            fanout = ref()
            if fanout is None:
                return
            if fanout._end is None:
                fanout._push(item)
            del item
            while not pump.pulling:
                if fanout._end is not None or pump.stopping:
                    return
                if fanout._reads_ahead(pump):
                    fanout._release(pump)
                    classify = pump.deferred and not pump.watching
                    if classify and not suspends:
                        # Items come without a yield: a watch costs a step
                        # per pass of many items, classifying one per item.
                        _watch(pump, ref)
                        classify = False
                        suspends = True  # classify again at the next hold
                    break
                classify = False
                fanout._wake_arrival()
                del fanout
                parking = pump.parking = pump.loop.waiters()
                try:
                    await parking.wait()
                except anyio.get_cancelled_exc_class() as cancelled:
                    if not hasattr(iterator, "athrow"):
                        raise
                    thrown = cancelled
                finally:
                    pump.parking = None
                fanout = ref()
                if fanout is None or pump.stopping:
                    return
                if thrown is not None:
                    pump.pulling = True
            del fanout
    except BaseException as error:
        pump.pulling = False
        fanout = ref()
        if fanout is not None:
            fanout._fail(error)
        del fanout
        if isinstance(error, anyio.get_cancelled_exc_class()):
            raise  # interrupted (the region takes it back) or from outside
    finally:
        pump.pulling = False
        pump.stopping = True
        if iterator is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await aclose_iterator(iterator)
                except BaseException as error:  # for Fanout.aclose() to raise
                    pump.close_error = error


async def _release_when_idle(ref: weakref.ref[Fanout[Any]], pump: _Pump) -> None:
    """:meth:`Fanout._release`'s watch: once per pass of the loop, look at
    the log's end; wake the waiting consumers once it stayed put between
    three looks in a row. Ends without waking anyone once the wake was done
    otherwise."""
    seen, still, logged, passes, paid = -1, 0, 0, 0, True
    try:
        while True:
            await pump.loop.next_pass()
            passes += 1
            fanout = ref()
            if fanout is None:
                return
            end = fanout._tail[2]
            if not pump.deferred or fanout._end is not None:
                break
            if end != seen:
                if seen >= 0:
                    logged += end - seen
                seen, still = end, 0
            else:
                still += 1
                if still == 2:
                    break
            del fanout
        # With nothing logged, it paid if the source waited under it (it
        # woke the consumers), not if the pump had parked before it looked.
        paid = passes > 1
        if logged:
            paid = 5 * logged * len(fanout._registry) >= 4 * passes
    finally:
        # Also when cancelled from outside: the consumers are woken.
        pump.watching = False
        fanout = ref()
        if fanout is not None:
            pump.patience = 0 if paid else fanout._read_ahead
            if pump.deferred:
                fanout._wake_arrival()


@functools.cache
def _ended_state() -> Fanout[Any]:
    """The closed fan-out every ended consumer points to, holding nothing."""
    fanout: Fanout[Any] = Fanout(_NO_SOURCE)
    fanout._end = _CLOSED_END
    return fanout


class _NoSource:
    """What a closed fan-out iterates: nothing."""

    def __aiter__(self) -> AsyncIterator[Any]:
        raise anyio.ClosedResourceError("this fan-out is closed")

    def __repr__(self) -> str:
        return "<closed source>"


_NO_SOURCE: Any = _NoSource()


@final
class FanoutConsumer(Generic[T]):
    """One consumer of a :class:`Fanout`: an async iterator over its items.

    Created by :meth:`Fanout.consumer`; receives every item pulled after its
    registration, in order, exactly once. A buffered item is returned
    without suspending. Cancelling a pending ``__anext__`` loses nothing:
    the next read returns the item it would have received; leaving an
    ``async for`` leaves the consumer where it was. One task at a time may
    wait on it. :meth:`close` (or garbage collection, in any thread) ends it
    and frees what it held, never affecting the source or the others. See
    :ref:`fanout`.
    """

    __slots__ = ("__weakref__", "_busy", "_node", "_on_skip", "_state")

    def __init__(
        self,
        state: Fanout[T],
        node: _Node,
        on_skip: Callable[[int], object] | None = None,
    ) -> None:
        # The fan-out while registered; once ended, a closed stand-in.
        self._state: Fanout[Any] = state
        # The next node to read (or a trap over it).
        self._node: _Node = node
        # The waiters its task is registered in, while one waits on it.
        self._busy: Waiters | None = None
        self._on_skip = on_skip

    def __aiter__(self) -> FanoutConsumer[T]:
        return self

    def receive_nowait(self) -> T:
        """Return the next item if this consumer has one buffered.

        :raises ~anyio.WouldBlock: if nothing is buffered and the source may
            still produce items.
        :raises ~anyio.EndOfStream: if this consumer has ended: the source
            was exhausted, the fan-out or this consumer was closed.
        :raises Lagged: (``on_lag="error"``) if this consumer missed items;
            the next read returns the oldest item held.
        :raises ~anyio.BusyResourceError: if another task is waiting in this
            consumer's ``__anext__``.
        :raises Exception: the source's error, once, with its traceback;
            then the consumer ends.
        """
        node = self._node
        following = node[1]
        if following is not None and self._busy is None:  # a buffered item
            self._node = following
            return node[0]
        del node, following
        item = self._take()
        if item is _NOTHING:
            raise anyio.WouldBlock
        if item is _DONE:
            raise anyio.EndOfStream
        return item

    def _take(self) -> Any:
        """The next item, :data:`_NOTHING` or :data:`_DONE`: never one of
        anyio's exceptions, which a source may raise as its error."""
        if self._busy is not None:
            raise anyio.BusyResourceError("receiving from")
        node = self._node
        while type(node) is _Trap:  # step onto the node it covers
            self._node = node.covered
            if node.kind is _LAGGED:
                skipped = node.skipped
                del node  # the traceback must not pin the log
                raise Lagged(skipped)
            self._state._wake_space()
            node = self._node
        following = node[1]
        if following is not None:
            self._node = following
            return node[0]
        if node is _ENDED:
            return _DONE
        state = self._state
        end = state._end
        if end is None:
            return _NOTHING
        if end.cancelled and state._pump is not None:
            state._pump.loop.check_current("this fan-out")
        del state
        self.close()
        if end.error is not None:
            raise end.error.with_traceback(end.traceback)
        return _DONE

    async def __anext__(self) -> T:
        while True:
            node = self._node
            following = node[1]
            if following is not None:  # an item is buffered
                self._node = following
                return node[0]
            state = self._state
            if node is state._tail and state._end is None:  # nothing yet: wait
                waiting = state._wait(self)
                # A cancellation's traceback holds this frame: it must pin
                # neither the fan-out nor the log.
                del node, following, state
                try:
                    await waiting
                except BaseException:
                    self._give_up(waiting)
                    raise
                self._busy = None
                continue
            del node, following, state  # a traceback must not pin the log
            item = self._take()  # a trap, or the end
            if item is _NOTHING:
                continue  # a trap over the log's end: wait
            if item is _DONE:
                raise StopAsyncIteration
            return item

    async def wait_readable(self) -> None:
        """Wait until :meth:`receive_nowait` has an answer other than
        :exc:`~anyio.WouldBlock`: an item, :exc:`Lagged` or the end.

        Starts a pull if none is in flight; cancelling it withdraws this
        consumer's demand only.

        :raises ~anyio.BusyResourceError: if another task is waiting already.
        :raises RuntimeError: if the fan-out is bound to another event loop.
        """
        if self._busy is not None:
            raise anyio.BusyResourceError("receiving from")
        if self._node is not self._state._tail or self._state._end is not None:
            await anyio.lowlevel.checkpoint()
        while self._node is self._state._tail and self._state._end is None:
            waiting = self._state._wait(self)
            try:
                await waiting
            except BaseException:
                self._give_up(waiting)
                raise
            self._busy = None

    def _give_up(self, waiting: Awaitable[None]) -> None:
        """The wait ``waiting`` raised: withdraw its demand, unless woken."""
        if self._busy is not None:
            self._busy.withdraw(waiting)
            self._busy = None

    def skip_buffered(self) -> int:
        """Drop everything this consumer has yet to read (a pending
        :exc:`Lagged` too) and resume at the log's end.

        :returns: how many items were skipped.
        """
        skipped = self.buffered
        if self._node is not _ENDED and not self._state.closed:
            self._node = self._state._tail
            self._state._wake_space()
        return skipped

    def close(self) -> None:
        """End this consumer and free the items it held. Idempotent."""
        if self._node is not _ENDED:
            self._node = _ENDED
            self._on_skip = None
            state = self._state
            self._state = _ended_state()
            state._registry.discard(weakref.ref(self))
            state._wake_space()
            if self._busy is not None:
                state._wake_all()  # let its wait see the end

    async def aclose(self) -> None:
        """Like :meth:`close`, with a checkpoint."""
        self.close()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self) -> FanoutConsumer[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def fanout(self) -> Fanout[T]:
        """The fan-out this consumer reads from (once ended, a closed
        stand-in: an ended consumer keeps nothing of its fan-out alive)."""
        return self._state

    @property
    def closed(self) -> bool:
        """Whether this consumer has ended: closed, its fan-out closed, or
        the source's end (or error) delivered to it."""
        return self._node is _ENDED

    @property
    def buffered(self) -> int:
        """Items already pulled that this consumer has yet to receive."""
        if self._node is _ENDED or self._state.closed:
            return 0
        return self._state._tail[2] - self._node[2]

    @property
    def position(self) -> int:
        """How many items of the log this consumer has moved past (a skip
        counts once its :exc:`Lagged` is raised); ``-1`` once it has ended."""
        node = self._node
        if type(node) is _Trap and node.kind is _LAGGED:
            return node[2] - node.skipped
        return node[2]

    def __del__(self) -> None:
        if getattr(self, "_node", _ENDED) is _ENDED:
            return
        self._node = _ENDED
        # Its reference leaves the registry by itself; a pull waiting for
        # room is woken from the loop (a finaliser may run anywhere).
        state = self._state
        pump = state._pump
        if pump is not None and state._max_lag is not None and not state._drop_lagging:
            # Held weakly: a fan-out dropped meanwhile is not kept for it.
            pump.loop.run_soon(_wake_space_of, weakref.ref(state))

    def __repr__(self) -> str:
        state = "ACTIVE" if self._node is not _ENDED else "ENDED"
        return f"<FanoutConsumer [{state}, buffered: {self.buffered}]>"
