"""Demand-driven multicast of one async iterator: a shared log, one cursor per consumer.

A consumer with nothing to read waits (:meth:`Fanout._wait`); the pump
(:func:`_iterate`) logs each item in the step that receives it. A node is
``[item, next, seq]`` and the fan-out holds only the empty one at the end, so
an item is freed when the last consumer moves past it. See docs/guarantees.rst.
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
    return _int_at_least("read_ahead", read_ahead, 0, "an int >= 0")


def validate_max_lag(max_lag: int | None) -> int | None:
    """Check a ``max_lag`` argument: ``None`` or an int >= 1."""
    if max_lag is None:
        return None
    return _int_at_least("max_lag", max_lag, 1, "None or an int >= 1")


def _int_at_least(name: str, value: int, least: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


#: A log node: ``[item, next node or None, seq]``.
_Node = list[Any]


@final
class _Trap(list[Any]):
    """A node in front of ``covered``: its consumer lagged (``skipped``
    items), or a pull waits for it to read (``skipped`` 0)."""

    __slots__ = ("covered", "skipped")

    def __init__(self, covered: _Node, seq: int, skipped: int = 0) -> None:
        super().__init__((None, None, seq))
        self.covered = covered
        self.skipped = skipped


#: What a consumer's read finds: nothing ready yet, or its end.
_NOTHING: Any = object()
_DONE: Any = object()

#: Where an ended consumer points: a node that never gets a next one.
_ENDED: _Node = [None, None, -1]


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
    """How the source ended: ``EXHAUSTED``, ``FAILED``, ``CLOSED``, or
    ``CANCELLED`` from outside (its loop shut down)."""

    name: str
    error: BaseException | None = None
    traceback: types.TracebackType | None = None


_CLOSED_END = _End("CLOSED")


@final
@attrs.define(eq=False)
class _Pump:
    """The task that iterates a fan-out's source, and its event loop."""

    loop: EventLoop
    #: What :meth:`stop` interrupts.
    interruptible: Interruptible
    #: What every pull runs in: the first waiting consumer's context.
    context: contextvars.Context = attrs.field(factory=contextvars.copy_context)
    #: Where the task waits for a demand.
    parking: Waiters | None = None
    #: Set once the task has ended (``None`` until it starts).
    done: anyio.Event | None = None
    task: object = None
    pulling: bool = False
    stopping: bool = False
    close_error: BaseException | None = None
    # A held wake (Fanout._release), its watch, releases that wake at once.
    deferred: bool = False
    watching: bool = False
    patience: int = 0

    def stop(self) -> None:
        """Have the task close the source and end (from outside the task)."""
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
@attrs.define(init=False, eq=False, repr=False)
class Fanout(Generic[T]):
    """Multicast one async iterable to any number of independent consumers.

    Every consumer receives every item pulled after it registered, in source
    order, exactly once; one task (the pump) iterates the source on demand,
    bound to the event loop of the first wait. See :ref:`fanout`.

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

    _source: AsyncIterable[T]
    #: The empty node at the log's end; its seq: items logged so far.
    _tail: _Node
    _registry: set[weakref.ref[FanoutConsumer[T]]]
    _max_lag: int | None
    _drop_lagging: bool
    #: slowest + max_lag + 1, slowest a lower bound on every consumer's seq:
    #: the lag check is one comparison until the log reaches it (and never
    #: without a bound).
    _horizon: int
    _read_ahead: int
    #: Pulled since the most advanced consumer waited.
    _ahead: int
    _end: _End | None
    #: Waits for the next item and for room under the bound.
    _arrival: Waiters | None
    _space: Waiters | None
    _pump: _Pump | None

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
        self._source = source
        self._tail = [None, None, 0]
        self._registry = set()
        self._max_lag = max_lag
        self._drop_lagging = on_lag == "error"
        self._horizon = sys.maxsize if max_lag is None else max_lag + 1
        self._read_ahead = validate_read_ahead(read_ahead)
        self._ahead = 0
        self._end = None
        self._arrival = None
        self._space: Waiters | None = None
        self._pump: _Pump | None = None

    def consumer(
        self, *, on_skip: Callable[[int], object] | None = None
    ) -> FanoutConsumer[T]:
        """Register a new consumer that receives every item pulled from now on.

        :param on_skip: (``on_lag="error"``) called synchronously, once per
            :exc:`Lagged` to come, with the seq of the first item missed;
            what it raises is logged. See :ref:`lag`.
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
        self._registry.add(weakref.ref(consumer, self._registry.discard))
        return consumer

    def inject(self, item: T) -> None:
        """Log ``item`` for every consumer as if pulled; ignored once finished."""
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
            buffered=self._tail[2] - self._slowest(),
            waiting=0
            if arrival is None
            else sum(consumer._busy is arrival for consumer in self._live()),
            pulling=self._pump is not None and self._pump.pulling,
            pulled=self._tail[2],
        )

    async def aclose(self) -> None:
        """End every consumer, cancel a pull in flight and close the source.

        Idempotent and shielded. See :ref:`fanout`.

        :raises Exception: what the source's ``aclose()`` raised, once.
        :raises RuntimeError: if the source is iterated on another event
            loop (the consumers end all the same; the source closes there).
        """
        if not self.closed:
            self._end = _CLOSED_END
            for consumer in self._live():
                consumer.close()  # which wakes its wait, if any
        source, self._source = self._source, _NO_SOURCE
        pump = self._pump
        # Not iterated (a closed fan-out's source is _NO_SOURCE, no iterator).
        if (pump is None or pump.task is None) and hasattr(source, "__anext__"):
            with anyio.CancelScope(shield=True):
                await aclose_iterator(source)
        del source
        if pump is None or pump.done is None:
            return
        if not pump.done.is_set():
            loop = pump.loop
            if not loop.is_current():
                loop.run_soon(pump.stop)
                loop.check_current("this fan-out")
            if pump.task is loop.current_task():  # the source closes it
                pump.stopping = True
                return
            pump.stop()
            with anyio.CancelScope(shield=True):
                await pump.done.wait()
        error, pump.close_error = pump.close_error, None
        if error is not None:
            raise error

    def __repr__(self) -> str:
        statistics = self.statistics()
        return (
            f"<Fanout [{self._end.name if self._end else 'OPEN'}, "
            f"consumers: {statistics.consumers}, "
            f"buffered: {statistics.buffered}] of {self._source!r}>"
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
        """The registered consumers not ended (a finaliser may end one meanwhile)."""
        return [
            consumer
            for reference in list(self._registry)
            if (consumer := reference()) is not None and consumer._node is not _ENDED
        ]

    def _slowest(self) -> int:
        """The seq of the slowest consumer's next item (the log's end if none)."""
        return min(
            (consumer._node[2] for consumer in self._live()),
            default=self._tail[2],
        )

    def _drop_beyond_lag(self) -> None:
        """``on_lag="error"``: trap each consumer ``max_lag`` items behind."""
        max_lag = self._max_lag
        assert max_lag is not None
        end = self._tail[2]
        oldest = end - max_lag
        slowest = end
        for consumer in self._live():
            node = consumer._node  # an on_skip before may have ended it
            if node is _ENDED:
                continue
            seq = node[2]
            if seq < oldest:
                kept = node.covered if type(node) is _Trap else node
                while kept[2] < oldest:
                    kept = kept[1]
                if type(node) is _Trap and node.skipped:
                    node[2] = oldest
                    node.covered = kept
                    node.skipped += oldest - seq
                else:
                    consumer._node = _Trap(kept, oldest, oldest - seq)
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
        """``on_lag="wait"``: whether the slowest consumer is ``max_lag`` behind."""
        end = self._tail[2]
        if end + 1 < self._horizon:
            return False
        assert self._max_lag is not None
        self._horizon = self._slowest() + self._max_lag + 1
        return end + 1 >= self._horizon

    def _watch_slowest(self) -> None:
        """Trap the slowest consumers: their next read wakes a wait for room."""
        assert self._max_lag is not None
        slowest = self._horizon - self._max_lag - 1
        for consumer in self._live():
            node = consumer._node
            if node[2] == slowest and type(node) is not _Trap:
                consumer._node = _Trap(node, slowest)

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

    def _release(self, pump: _Pump) -> None:
        """Wake the waiting consumers, or hold the wake under a watch."""
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
        """Register ``consumer`` (at the log's end) for one wake-up, asking
        for a pull if none is in flight; return what to await."""
        if consumer._busy is not None:
            raise anyio.BusyResourceError("receiving from")
        pump = self._pump
        if pump is None:  # bound at the first wait
            loop = current_loop()
            pump = self._pump = _Pump(loop, loop.interruptible())
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
                # An eager task factory may have logged an item already.
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
            weakref.finalize(self, pump.loop.run_soon, pump.stop).atexit = False
            pump.loop.spawn(_run_pump, weakref.ref(self), pump, context=pump.context)
        elif pump.parking is not None:
            pump.parking.wake()

    def _reads_ahead(self, pump: _Pump) -> bool:
        """Whether the pump may pull once more unasked, counting the pull."""
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
                self._end = _End("EXHAUSTED")
            elif isinstance(error, anyio.get_cancelled_exc_class()):
                self._end = _End(
                    "CANCELLED",
                    anyio.BrokenResourceError(
                        "the task iterating the fan-out's source was cancelled "
                        "from outside"
                    ),
                )
            else:
                self._end = _End("FAILED", error, error.__traceback__)
            self._wake_arrival()
            self._wake_space()


def _watch(pump: _Pump, ref: weakref.ref[Fanout[Any]]) -> None:
    """Start the watch over a held-back wake, unless one runs."""
    if pump.deferred and not pump.watching:
        pump.watching = True
        pump.loop.spawn(_release_when_idle, ref, pump)


async def _run_pump(ref: weakref.ref[Fanout[Any]], pump: _Pump) -> None:
    """The pump's task, in the region :meth:`_Pump.stop` interrupts."""
    try:
        with pump.interruptible:
            await _iterate(ref, pump)
    finally:
        assert pump.done is not None
        pump.done.set()


async def _iterate(ref: weakref.ref[Fanout[Any]], pump: _Pump) -> None:
    """Pull per demand or read-ahead, logging each item as it comes."""
    iterator: Any = None
    try:
        pump.task = pump.loop.current_task()
        fanout = ref()
        if fanout is None or pump.stopping:  # gone or closed before this step
            return
        iterator = aiter(fanout._source)
        del fanout
        thrown: BaseException | None = None
        until_waits = pump.loop.until_waits
        on_wait = functools.partial(_watch, pump, ref)
        classify = False
        suspends = True
        while True:
            if thrown is None:
                if classify and until_waits is not None:
                    item, suspends = await until_waits(iterator.__anext__(), on_wait)
                else:
                    item = await iterator.__anext__()
            else:
                # The source's own scope's cancellation, met between pulls.
                item = await iterator.athrow(thrown)  # thrown only where it exists
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
                    if not suspends and pump.deferred and not pump.watching:
                        _watch(pump, ref)  # a watch costs less then
                        suspends = True  # classify again at the next hold
                    classify = pump.deferred and not pump.watching
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
    """Wake the held consumers once the log stayed put for three passes."""
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
        paid = passes > 1  # with nothing logged: unless the pump had parked
        if logged:
            paid = 5 * logged * len(fanout._registry) >= 4 * passes
    finally:
        pump.watching = False
        fanout = ref()
        if fanout is not None:
            pump.patience = 0 if paid else fanout._read_ahead
            if pump.deferred:
                fanout._wake_arrival()


class _NoSource:
    """What a closed fan-out iterates: nothing."""

    def __aiter__(self) -> AsyncIterator[Any]:
        raise anyio.ClosedResourceError("this fan-out is closed")

    def __repr__(self) -> str:
        return "<closed source>"


_NO_SOURCE: Any = _NoSource()

#: The closed fan-out every ended consumer points to.
_ENDED_STATE: Fanout[Any] = Fanout(_NO_SOURCE)
_ENDED_STATE._end = _CLOSED_END


@final
@attrs.define(eq=False, repr=False)
class FanoutConsumer(Generic[T]):
    """One consumer of a :class:`Fanout`, made by :meth:`Fanout.consumer`.

    An async iterator over every item pulled after it registered; cancelling
    a read loses nothing, one task at a time may wait on it, and closing it
    (or dropping it) frees what it held. See :ref:`fanout`.
    """

    #: Its fan-out; once ended, a closed stand-in.
    _state: Fanout[T]
    #: The next node to read, or a trap over it.
    _node: _Node
    _on_skip: Callable[[int], object] | None = None
    #: What its waiting task waits in.
    _busy: Waiters | None = attrs.field(default=None, init=False)

    def __aiter__(self) -> FanoutConsumer[T]:
        return self

    def receive_nowait(self) -> T:
        """Return the next item if this consumer has one buffered.

        :raises ~anyio.WouldBlock: if nothing is buffered and the source may
            still produce items.
        :raises ~anyio.EndOfStream: if this consumer has ended.
        :raises Lagged: (``on_lag="error"``) if this consumer missed items.
        :raises ~anyio.BusyResourceError: if another task waits on it.
        :raises Exception: the source's error, once; then the consumer ends.
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
        """The next item, :data:`_NOTHING` or :data:`_DONE`."""
        if self._busy is not None:
            raise anyio.BusyResourceError("receiving from")
        node = self._node
        while type(node) is _Trap:  # step onto the node it covers
            self._node = node.covered
            if node.skipped:
                skipped = node.skipped
                del node  # the traceback must not pin the log
                raise Lagged(skipped)
            self._state._wake_space()
            node = self._node
        following = node[1]
        if following is not None:
            self._node = following
            return node[0]
        state = self._state  # an ended consumer's: a closed stand-in
        end = state._end
        if end is None:
            return _NOTHING
        if end.name == "CANCELLED" and state._pump is not None:
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
        """Wait until :meth:`receive_nowait` would not raise
        :exc:`~anyio.WouldBlock`, starting a pull if none is in flight.

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
        """Drop what this consumer has yet to read (and a pending :exc:`Lagged`).

        :returns: how many items were skipped.
        """
        skipped = self.buffered
        if self._node is not _ENDED:
            self._node = self._state._tail
            self._state._wake_space()
        return skipped

    def close(self) -> None:
        """End this consumer and free the items it held. Idempotent."""
        if self._node is not _ENDED:
            self._node = _ENDED
            self._on_skip = None
            state = self._state
            self._state = _ENDED_STATE
            state._registry.discard(weakref.ref(self))
            state._wake_space()
            if self._busy is not None:
                state._wake_arrival()  # let its wait see the end

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
        """The fan-out this consumer reads from (once ended, a closed stand-in)."""
        return self._state

    @property
    def closed(self) -> bool:
        """Whether this consumer has ended (closed, or its fan-out's end delivered)."""
        return self._node is _ENDED

    @property
    def buffered(self) -> int:
        """Items already pulled that this consumer has yet to receive."""
        if self._node is _ENDED:
            return 0
        return self._state._tail[2] - self._node[2]

    @property
    def position(self) -> int:
        """Items of the log this consumer has moved past; ``-1`` once ended."""
        node = self._node
        if type(node) is _Trap and node.skipped:
            return node[2] - node.skipped
        return node[2]

    def __del__(self) -> None:
        if getattr(self, "_node", _ENDED) is _ENDED:
            return
        self._node = _ENDED
        state = self._state
        pump = state._pump
        if pump is not None and state._max_lag is not None and not state._drop_lagging:
            pump.loop.run_soon(_wake_space_of, weakref.ref(state))

    def __repr__(self) -> str:
        state = "ACTIVE" if self._node is not _ENDED else "ENDED"
        return f"<FanoutConsumer [{state}, buffered: {self.buffered}]>"
