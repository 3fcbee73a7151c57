"""Demand-driven multicast of one async iterator: a shared log, one cursor per consumer.

The data path, top to bottom: a consumer with nothing buffered waits
(:meth:`_FanoutState.wait`) and, if no pull is in flight, asks the
fan-out's pump for one (:meth:`_FanoutState.demand`); after logging an item
the pump may pull again unasked, up to ``read_ahead`` items past that
demand (:meth:`_FanoutState.reads_ahead`). The pump
(:func:`_pump`) is one task per fan-out, started by the first demand: it
calls ``aiter()`` on the source, every ``__anext__()`` and, at the end, the
iterator's ``aclose()``, so the source is iterated exactly as one ``async
for`` in one task would iterate it. The item a pull returns is appended to a
singly linked log (:meth:`_FanoutState.append`) in the same step, and every
waiter is woken; each consumer holds a reference to the next node it will
read and reads it in ``FanoutConsumer.__anext__`` with two index operations.

**Where an item is held and when it is freed.** A node is ``[item, next,
seq]`` (a list: the cheapest object to build and index); the fan-out holds
only the empty node at the log's end, which the next item fills. So an item is
held by nothing but the consumers that have yet to read it, and is freed by
reference counting the moment the last of them moves past it or leaves: no
counts to keep, nothing to trim.

A consumer that must take the slow path at its next read (it lagged, or a
pull waits for it to make room) has its reference replaced by a
:class:`_Trap`, a node with no ``next`` (so it is never read as an item)
that names the node it covers.
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
from typing import cast
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

__all__ = ["Fanout", "FanoutConsumer", "FanoutStatistics", "LagPolicy", "Lagged"]

T = TypeVar("T")

logger = logging.getLogger("wool_pooling")

#: What to do when a consumer falls ``max_lag`` items behind.
LagPolicy = Literal["wait", "error"]


class Lagged(Exception):
    """A consumer fell more than ``max_lag`` items behind and skipped some.

    Raised by ``__anext__`` (and :meth:`~FanoutConsumer.receive_nowait`) of a
    :class:`FanoutConsumer` of a fan-out built with ``on_lag="error"``, and
    by ``__anext__`` of a :class:`~wool_pooling.SubscriptionConsumer` whose
    stream carried items that are not discovery events (which no resync can
    stand for); the consumer's next read returns the oldest item still held.
    """

    def __init__(self, skipped: int) -> None:
        super().__init__(f"consumer fell behind and skipped {skipped} items")
        #: How many items this consumer missed.
        self.skipped = skipped


#: How many items a fan-out's pump pulls ahead of demand, by default. A
#: batch of 64 amortises the pump's wake-up and each consumer's over 64
#: items of a source that has them ready (one that waits is unaffected);
#: beyond 64 the gain flattens while the items held ahead grow
#: (``benchmarks/read_ahead.py``; figures in docs/benchmarks.rst). Read-ahead
#: counts inside ``max_lag``: it never takes the log past the lag bound.
DEFAULT_READ_AHEAD = 64


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


#: A log node: ``[item, next node or None, seq]``; see the module docstring.
_Node = list[Any]


@final
class _Trap(list[Any]):
    """A node standing in front of ``covered`` in a consumer's reference:
    ``[None, None, seq]`` (so never read as an item), and why.

    ``kind`` is :data:`_LAGGED` (the consumer skipped ``skipped`` items and
    gets :exc:`Lagged` first) or :data:`_WATCHED` (a pull waits for this
    consumer to read: ``on_lag="wait"``).
    """

    __slots__ = ("covered", "kind", "skipped")

    def __init__(self, covered: _Node, seq: int, kind: str, skipped: int = 0) -> None:
        super().__init__((None, None, seq))
        self.covered = covered
        self.kind = kind
        self.skipped = skipped


_LAGGED = "lagged"
_WATCHED = "watched"

#: Where an ended consumer points: a node that never gets a next one.
_ENDED: _Node = [None, None, -1]

#: ``lag_check_at`` when no lag bound applies.
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
    """The task that iterates a fan-out's source, as the fan-out sees it.

    Holds nothing of the fan-out: the task itself holds the fan-out's state
    only weakly, so that dropping the fan-out frees it (:attr:`finalizer`
    then stops the task, which closes the source).
    """

    __slots__ = (
        "close_error",
        "done",
        "finalizer",
        "finished",
        "interruptible",
        "loop",
        "parking",
        "pulling",
        "stopping",
        "task",
    )

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        # Where the task waits for the next demand, while it does; the region
        # its pulls run in (stop() interrupts it); woken once the task ended.
        self.parking: Waiters | None = None
        self.interruptible: Interruptible = loop.interruptible()
        self.done: Waiters = loop.waiters()
        # Whether the task awaits the source, is to close it and end, and has.
        self.pulling = False
        self.stopping = False
        self.finished = False
        # What the source's aclose() raised, for Fanout.aclose() to raise; the
        # task, from its first step on.
        self.close_error: BaseException | None = None
        self.finalizer: weakref.finalize[Any, Any] | None = None
        self.task: object = None

    def stop(self) -> None:
        """Have the task close the source and end: at once if it waits for
        a demand, by interrupting the pull in flight otherwise. Call from
        the loop's thread."""
        self.stopping = True
        if self.parking is not None:
            self.parking.wake()
        elif self.pulling:
            self.interruptible.cancel()


@final
class _FanoutState(Generic[T]):
    """Everything a fan-out and its consumers share; the consumers touch
    nothing else of the fan-out."""

    __slots__ = (
        "__weakref__",
        "ahead",
        "arrival",
        "consumers",
        "context",
        "deferred",
        "drop_lagging",
        "end",
        "handle",
        "holds_back",
        "lag_check_at",
        "loop",
        "max_lag",
        "patience",
        "pulling",
        "pump",
        "read_ahead",
        "ref",
        "registry",
        "slowest",
        "source",
        "space",
        "tail",
        "watching",
    )

    def __init__(
        self,
        source: AsyncIterable[T],
        max_lag: int | None,
        drop_lagging: bool,
        read_ahead: int = DEFAULT_READ_AHEAD,
    ) -> None:
        # What the pump iterates (released when the fan-out is closed); the
        # log's end, the empty node the next item fills (seq: items logged).
        self.source: AsyncIterable[T] = source
        self.tail: _Node = [None, None, 0]
        # Consumers registered and not ended, and weak references to them
        # for the lag bound, statistics and closing (see live()).
        self.consumers = 0
        self.registry: set[weakref.ref[FanoutConsumer[T]]] = set()
        self.max_lag = max_lag
        self.drop_lagging = drop_lagging
        # on_lag="wait" with a bound: a pull may have to wait for room.
        self.holds_back = max_lag is not None and not drop_lagging
        # A lower bound on every consumer's seq (positions only move forward).
        self.slowest = 0
        self.lag_check_at = (
            max_lag + 1 if max_lag is not None and drop_lagging else _NEVER
        )
        self.end: _End | None = None
        # Items the pump may pull past the most advanced consumer's demand,
        # and how many it has pulled since that consumer last waited.
        self.read_ahead = read_ahead
        self.ahead = 0
        # Bound at the first wait: the loop, and a copy of the waiter's context.
        self.loop: EventLoop | None = None
        self.context: contextvars.Context | None = None
        # Consumers waiting for the item after the log's end (woken when it
        # lands, or when the fan-out ends); a wait for room.
        self.arrival: Waiters | None = None
        self.space: Waiters | None = None
        # Whether the wake of ``arrival`` is held back; whether a watch
        # runs; how many releases wake at once before the next watch
        # (release()).
        self.deferred = False
        self.watching = False
        self.patience = 0
        # Whether a pull is in flight (asked, not yet logged); the pump, from
        # the first demand on; what it holds of this state; the Fanout object
        # over it, held weakly (consumers hold the state, not the fan-out).
        self.pulling = False
        self.pump: _Pump | None = None
        self.ref = weakref.ref(self)
        self.handle: weakref.ref[Fanout[T]] | None = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`Fanout.aclose` was called."""
        return self.end is _CLOSED_END

    def fanout(self) -> Fanout[T]:
        """The :class:`Fanout` over this state (a new one if it was dropped)."""
        existing = self.handle() if self.handle is not None else None
        if existing is not None:
            return existing
        fanout = cast("Fanout[T]", object.__new__(Fanout))
        fanout._state = self
        self.handle = weakref.ref(fanout)
        return fanout

    # -- the log -----------------------------------------------------------

    def append(self, item: T) -> None:
        """Log ``item`` for every consumer, and wake those waiting for it."""
        self.push(item)
        self.wake_arrival()

    def push(self, item: T) -> None:
        """Log ``item`` for every consumer; wake no one (see :meth:`release`)."""
        tail = self.tail
        seq: int = tail[2] + 1
        following: _Node = [None, None, seq]
        tail[0] = item
        tail[1] = following
        self.tail = following
        if self.lag_check_at <= seq:
            self.drop_beyond_lag()

    def wake_arrival(self) -> None:
        """Wake the consumers waiting for an item."""
        self.deferred = False
        arrival = self.arrival
        if arrival is not None:
            self.arrival = None
            arrival.wake()

    def release(self) -> None:
        """The pump pulls again, reading ahead, with consumers waiting: wake
        them at once, or, while the source's pulls look quick, hold the wake
        back until a whole pass of the loop goes by with nothing logged.

        A source whose pull only passes a checkpoint then costs its waiting
        consumers one wake-up per batch, not per item: they are woken when
        the pump parks (the batch is full, or no one asks) or when a pull
        really waits. A *watch* task (:func:`_release_when_idle`) looks at
        the log once per pass and wakes them; being a task, it keeps
        ``wait_all_tasks_blocked()`` from returning before they are woken.
        On asyncio's own loops the watch starts only once a pull suspends in
        a way that may last (:attr:`EventLoop.until_waits`), so a source that
        only passes checkpoints costs no step beyond its own; on uvloop and
        trio it starts here. The watch costs a step per pass and saves one per consumer
        per item: one that saw fewer items logged than passes went by, per
        consumer registered (with a fifth to spare), found it did not pay;
        the next ``read_ahead`` releases then wake at once, and the one
        after watches again.
        """
        if self.arrival is None or self.deferred:
            return
        if self.patience:
            self.patience -= 1
            self.wake_arrival()
            return
        self.deferred = True
        loop = self.loop
        assert loop is not None  # bound before the first pull
        if loop.until_waits is None:
            self.watch()

    def watch(self) -> None:
        """Start the watch over a held-back wake, unless one runs."""
        if self.deferred and not self.watching:
            self.watching = True
            loop = self.loop
            assert loop is not None
            loop.spawn(_release_when_idle, self.ref, loop.next_pass)

    def live(self) -> list[FanoutConsumer[T]]:
        """A snapshot of the registered consumers, for a scan.

        The weak references are copied in one step first: garbage collection
        may run at any allocation of the scan, and a finaliser it runs may end
        a consumer. Ending a consumer does not remove its reference; the
        reference removes itself once the consumer is collected.
        """
        live: list[FanoutConsumer[T]] = []
        for reference in list(self.registry):
            consumer = reference()
            if consumer is not None and consumer._node is not _ENDED:
                live.append(consumer)
        return live

    def positions(self) -> list[int]:
        """The seq of every registered consumer's next item."""
        return [
            node[2]
            for consumer in self.live()
            if (node := consumer._node) is not _ENDED
        ]

    def buffered(self) -> int:
        if self.closed:
            return 0
        end = self.tail[2]
        return end - min(self.positions(), default=end)

    def drop_beyond_lag(self) -> None:
        """``on_lag="error"``: drop the items more than ``max_lag`` behind the end.

        Each consumer still short of them is moved to the oldest item kept,
        behind a trap that raises :exc:`Lagged` (with the count) at its next
        read; the items it skipped are freed as it lets go of them. Runs only
        when some consumer may be too far behind (``lag_check_at``).
        """
        max_lag = self.max_lag
        assert max_lag is not None
        end = self.tail[2]
        oldest = end - max_lag
        slowest = end
        for consumer in self.live():
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
            if seq < slowest:
                slowest = seq
        self.lag_check_at = slowest + max_lag + 1

    def log_is_full(self) -> bool:
        """``on_lag="wait"``: the slowest consumer is ``max_lag`` items behind."""
        max_lag = self.max_lag
        assert max_lag is not None
        end = self.tail[2]
        if end - self.slowest < max_lag:
            return False
        self.slowest = min(self.positions(), default=end)
        return end - self.slowest >= max_lag

    def watch_slowest(self) -> None:
        """Trap the consumers at the oldest item, so that their next read
        wakes a pull waiting for room."""
        slowest = self.slowest
        for consumer in self.live():
            node = consumer._node
            if node is not _ENDED and node[2] == slowest and type(node) is not _Trap:
                trap = _Trap(node, slowest, _WATCHED)
                if consumer._node is node:  # not ended meanwhile (see above)
                    consumer._node = trap

    def wake_space(self) -> None:
        """A slow consumer moved or left: let a wait for room look again."""
        space = self.space
        if space is not None:
            self.space = None
            space.wake()

    def wake_all(self) -> None:
        """Wake every wait: for an item, and for room."""
        self.deferred = False
        arrival = self.arrival
        if arrival is not None:
            self.arrival = None
            arrival.wake()
        self.wake_space()

    def leave(self) -> None:
        """One consumer left; what only it held is freed with its node."""
        if self.closed:
            return
        self.consumers -= 1
        self.wake_space()

    # -- waiting and pulling -------------------------------------------------

    def wait(self, consumer: FanoutConsumer[T]) -> Awaitable[None]:
        """Register ``consumer``'s task for one wake-up that may give it
        something to read (an item, a trap, the end), asking for a pull if
        none is in flight and nothing holds it back; return what to await.

        Call only while ``consumer`` is at the log's end and the fan-out
        runs. The caller awaits in its own frame (a coroutine per wait costs
        a frame per delivery), then sets ``consumer._busy`` back to ``None``
        and looks again (the wake-up may have been for another consumer). If
        the await raises, it calls ``consumer._give_up()`` instead: only this
        consumer's demand is abandoned, never the pull in flight.

        :raises ~anyio.BusyResourceError: if another task waits on
            ``consumer`` already.
        :raises RuntimeError: if the fan-out is bound to another event loop.
        """
        if consumer._busy is not None:
            raise anyio.BusyResourceError("receiving from")
        loop = self.loop
        if loop is None:  # bound at the first wait
            loop = self.loop = current_loop()
            self.context = contextvars.copy_context()
        # Checked in full once per consumer and task (asyncio: loop); after
        # that, one call of the backend's own tells it.
        try:
            here = loop.here()
        except RuntimeError:
            here = None
        if here is None or here is not consumer._here:
            loop.check_current("this fan-out")
            consumer._here = here
        if self.holds_back and self.log_is_full():
            waiters = self.space
            if waiters is None:
                waiters = self.space = loop.waiters()
            self.watch_slowest()
        else:
            self.ahead = 0  # the most advanced consumer has read everything
            if not self.pulling:
                self.demand(loop)
                # An eager task factory runs the pump's first step in this
                # call: it may have logged an item already.
                if consumer._node is not self.tail or self.end is not None:
                    return ready()
            waiters = self.arrival
            if waiters is None:
                waiters = self.arrival = loop.waiters()
        waiting = waiters.wait(here)
        consumer._busy = waiters
        return waiting

    def demand(self, loop: EventLoop) -> None:
        """Ask the pump for the next item, starting the pump at the first demand."""
        self.pulling = True
        pump = self.pump
        if pump is not None:
            if pump.parking is not None:
                pump.parking.wake()
            return
        pump = self.pump = _Pump(loop)
        # Dropped while the pump lives: the pump closes the source and ends.
        pump.finalizer = weakref.finalize(self, loop.run_soon, pump.stop)
        pump.finalizer.atexit = False
        loop.spawn(_pump, self.ref, pump, context=self.context)

    def reads_ahead(self) -> bool:
        """Whether the pump pulls once more with no consumer waiting: fewer
        than ``read_ahead`` items wait unread by the most advanced consumer,
        some consumer is registered, and the item cannot take the log past
        ``max_lag`` for the slowest one. Counts the pull it allows."""
        if self.ahead >= self.read_ahead or not self.consumers:
            return False
        if self.holds_back:
            if self.log_is_full():
                return False
        elif self.tail[2] + 1 >= self.lag_check_at:
            return False
        self.ahead += 1
        self.pulling = True
        return True

    def log(self, item: T) -> None:
        """The pump's pull returned ``item``: log it, in the same step. The
        pump then wakes the consumers waiting for it: at once if it parks,
        a pass of the loop later if it reads ahead (:meth:`release`)."""
        self.pulling = False
        if self.end is None:
            self.push(item)

    def failed(self, error: BaseException) -> None:
        """The pump's pull raised ``error``: end the fan-out with it."""
        self.pulling = False
        if self.end is None:
            cancelled = isinstance(error, anyio.get_cancelled_exc_class())
            if isinstance(error, StopAsyncIteration):
                self.end = _End()
            elif cancelled:
                # Cancelled from outside (the loop is shutting down): the
                # source is closed, and unusable from now on.
                self.end = _End(
                    anyio.BrokenResourceError(
                        "the task iterating the fan-out's source was cancelled "
                        "from outside"
                    ),
                    cancelled=True,
                )
            else:
                self.end = _End(error, error.__traceback__)
            self.wake_all()

    async def close(self) -> None:
        first = not self.closed
        if first:
            self.end = _CLOSED_END
            self.consumers = 0
            # Every consumer ends: what it had yet to read is dropped, and it
            # lets go of this state (a consumer kept alive by, say, the
            # traceback of its cancelled wait then pins nothing).
            for consumer in self.live():
                consumer._node = _ENDED
                consumer._state = _ended_state()
                consumer._here = None
            self.registry = set()
            self.wake_all()
        source, self.source = self.source, _NO_SOURCE
        pump = self.pump
        if pump is None:
            if first and hasattr(source, "__anext__"):
                # Never pulled, so aiter() was never called; a source that
                # is its own iterator is closed all the same.
                with anyio.CancelScope(shield=True):
                    await aclose_iterator(source)
            return
        del source
        if not pump.finished:
            loop = pump.loop
            if not loop.is_current():
                # The pump closes the source in its own loop: no wait here.
                loop.run_soon(pump.stop)
                loop.check_current("this fan-out")
            pump.stop()
            if pump.task is loop.current_task():
                return  # the source closes its own fan-out: the pump ends after
            with anyio.CancelScope(shield=True):
                await pump.done.wait()
        error, pump.close_error = pump.close_error, None
        if error is not None:
            raise error


async def _pump(ref: weakref.ref[_FanoutState[Any]], pump: _Pump) -> None:
    """Iterate a fan-out's source, in this one task, for the source's whole life.

    Calls ``aiter()`` at the first demand, then ``__anext__()`` once per
    demand (waiting at the pump's parking in between), and finally the
    iterator's ``aclose()``: when the source ends or fails, when the fan-out
    is closed (a pull in flight is interrupted first) or dropped. The item
    a pull returns is logged in the step that receives it, so whatever the
    source records while producing it is never ahead of the log. The state
    is held only weakly while the source is awaited, so that neither the
    pump nor an error's traceback keeps a dropped fan-out alive.
    """
    try:
        with pump.interruptible:
            await _iterate(ref, pump)
    finally:
        pump.finished = True
        pump.done.wake()


async def _iterate(ref: weakref.ref[_FanoutState[Any]], pump: _Pump) -> None:
    """The pump's work, inside the region :meth:`_Pump.stop` interrupts (the
    source's own cancel scopes nest inside it, and are closed inside it)."""
    iterator: Any = None
    try:
        pump.task = pump.loop.current_task()
        state = ref()
        if state is None:
            return
        source = state.source
        del state
        if pump.stopping:  # closed before this task's first step
            if hasattr(source, "__anext__"):
                iterator = source
            return
        pump.pulling = True
        iterator = aiter(source)
        del source
        thrown: BaseException | None = None
        # While a wake is held back with no watch over it (asyncio): the
        # pull in flight starts the watch if it suspends in a way that may
        # last (see _FanoutState.release); whether the last such pull
        # suspended at all.
        until_waits = pump.loop.until_waits
        suspensions = (
            None
            if until_waits is None
            else until_waits(functools.partial(_start_watch, ref))
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
                # The source's own cancel scope (a task group's, a timeout's)
                # was cancelled while this task waited between pulls, outside
                # the source: the source gets it at its yield.
                item = await throw_into(iterator, thrown)
                thrown = None
            pump.pulling = False
            state = ref()
            if state is None:
                return
            state.log(item)
            del item
            while not state.pulling or state.end is not None:
                if state.end is not None or pump.stopping:
                    return
                if state.reads_ahead():
                    if not state.deferred:  # else held back already: no call
                        state.release()
                    classify = state.deferred and not state.watching
                    if classify and not suspends:
                        # Items come without a yield: a watch costs a step
                        # per pass of many items, classifying one per item.
                        state.watch()
                        classify = False
                        suspends = True  # classify again at the next hold
                    break
                classify = False
                state.wake_arrival()
                del state
                parking = pump.parking = pump.loop.waiters()
                try:
                    await parking.wait()
                except anyio.get_cancelled_exc_class() as cancelled:
                    if not hasattr(iterator, "athrow"):
                        raise
                    thrown = cancelled
                finally:
                    pump.parking = None
                state = ref()
                if state is None or pump.stopping:
                    return
                if thrown is not None:
                    break
            del state
            pump.pulling = True
    except BaseException as error:
        state = ref()
        if state is not None:
            state.failed(error)
        del state
        if isinstance(error, anyio.get_cancelled_exc_class()):
            raise  # interrupted (the region takes it back) or from outside
    finally:
        pump.pulling = False
        pump.stopping = True
        if pump.finalizer is not None:
            pump.finalizer.detach()
        state = ref()
        if state is not None:
            state.pulling = False
        del state
        if iterator is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await aclose_iterator(iterator)
                except BaseException as error:  # for Fanout.aclose() to raise
                    pump.close_error = error


async def _release_when_idle(
    ref: weakref.ref[_FanoutState[Any]], next_pass: Callable[[], Awaitable[None]]
) -> None:
    """:meth:`_FanoutState.release`'s watch: once per pass of the loop, look
    at the log's end; wake the waiting consumers once it stayed put between
    three looks in a row (two whole passes: trio may run this task before
    or after the pump within a pass). Ends without waking anyone once the
    wake it watches was done otherwise (the pump parked, the fan-out ended)."""
    seen = -1
    still = 0
    logged = 0
    passes = 0
    paid = True
    try:
        while True:
            await next_pass()
            passes += 1
            state = ref()
            if state is None:
                return
            end = state.tail[2]
            if not state.deferred or state.end is not None:
                break
            if end != seen:
                if seen >= 0:
                    logged += end - seen
                seen, still = end, 0
            else:
                still += 1
                if still == 2:
                    break
            del state
        paid = 5 * logged * state.consumers >= 4 * passes
    finally:
        # Also when this task is cancelled from outside (the loop shuts
        # down): the consumers are woken, and later releases watch again.
        state = ref()
        if state is not None:
            state.watching = False
            state.patience = 0 if paid else state.read_ahead
            if state.deferred:
                state.wake_arrival()


def _start_watch(ref: weakref.ref[_FanoutState[Any]]) -> None:
    """The pump's pull suspended in a way that may last: watch the wake held
    back (the state is held weakly, as by the pump)."""
    state = ref()
    if state is not None:
        state.watch()


@functools.cache
def _ended_state() -> _FanoutState[Any]:
    """The state every ended consumer points to: closed, holding nothing."""
    state: _FanoutState[Any] = _FanoutState(_NO_SOURCE, None, False)
    state.end = _CLOSED_END
    return state


class _NoSource:
    """What a closed stand-in fan-out iterates: nothing."""

    def __aiter__(self) -> AsyncIterator[Any]:
        raise anyio.ClosedResourceError("this fan-out is closed")

    def __repr__(self) -> str:
        return "<closed source>"


_NO_SOURCE: Any = _NoSource()


@final
class Fanout(Generic[T]):
    """Multicast one async iterable to any number of independent consumers.

    Every consumer receives every item pulled after it registered, in source
    order, exactly once.

    **Demand-driven, with read-ahead.** The source is advanced when a
    consumer that has nothing buffered waits for an item, and at most one
    pull is in flight. With ``read_ahead=R`` (64 by default) the pump then
    keeps pulling, in its one task, while fewer than R items wait unread by
    the most advanced consumer (the one that last waited at the log's end),
    some consumer is registered, and the next item cannot take the log past
    ``max_lag`` for the slowest consumer: a source with items ready costs
    one wake-up per batch, and consumers read the batch without suspending.
    With
    ``read_ahead=0`` nothing is pulled ahead of a demand. Items read ahead
    are logged like any other; those no consumer is left to read when the
    fan-out closes are dropped with it. A consumer that has items buffered
    receives them without suspending and without touching the source.

    **One task iterates the source.** The first demand starts the fan-out's
    pump, one background task that calls ``aiter()`` on the source, every
    ``__anext__()`` and, at the end, the iterator's ``aclose()``, on every
    backend and interpreter: the source is iterated exactly as one ``async
    for`` in one task would iterate it. So a source may hold a task group,
    a cancel scope or an :func:`asyncio.timeout` open across its own
    ``yield``; a background task it runs in such a group that fails fails
    the source, and so every consumer. The pump runs in a copy of the
    :class:`contextvars.Context` of the first waiting consumer, never in a
    consumer's task, so cancelling a consumer never reaches the source. It
    waits between pulls for the next demand and ends when the source ends
    or fails, when the fan-out is closed, or when it is dropped (it then
    closes the source). An item is logged in the very step in which the
    source returns it, so whatever the source records while producing it
    (a table of known workers, say) is never ahead of the log a consumer
    registering then starts from.

    **Cancellation safety.** Cancelling a consumer, even the one whose
    request started the pull in flight, only abandons that consumer's wait,
    promptly: it never cancels the pull, never closes or breaks the source
    and never loses, duplicates or reorders an item, for anyone. The
    cancelled consumer stays registered and its next read returns the item
    it would have received.

    **Errors.** An exception raised by the source (synchronously by
    ``aiter()`` or ``__anext__()``, or by the awaitable ``__anext__()``
    returns) reaches every consumer, each after the items pulled before it,
    with its original traceback; afterwards each consumer ends. A consumer
    registered after the source ended ends immediately (after receiving the
    error, if there was one).

    **Memory.** The log holds an item until every consumer registered when it
    was pulled has received it or has left (it is freed at that moment, by
    reference counting); a consumer that is garbage collected without
    ``close()`` leaves. A held item costs one small node (about 100 bytes)
    besides the item itself. With ``max_lag=None`` a consumer that stops
    reading makes the log grow with every item the others pull; ``max_lag``
    bounds the log to that many items, per ``on_lag``:

    - ``"wait"`` (lossless backpressure): no pull starts while the slowest
      consumer is ``max_lag`` items behind; the others wait for it.
    - ``"error"`` (tokio's broadcast semantics): the oldest items are dropped
      even if unread; a consumer that missed some gets :exc:`Lagged` (with
      the count) from its next read, then the oldest item held.

    **Cost.** A buffered read is two index operations and never touches the
    other consumers. A pull is O(1) too, except at the lag bound: while some
    consumer is ``max_lag`` items behind, each pull (``"error"``) or each
    read of the slowest consumer (``"wait"``) looks at every consumer.

    **Event loop.** A fan-out is bound to the event loop of its first wait;
    waiting on it (or closing it, once its pump has started and while it
    runs) from another loop raises :exc:`RuntimeError`.

    **Closing.** :meth:`aclose` ends every consumer at once (items not yet
    received are discarded) and has the pump close the source: a pull in
    flight is cancelled first, as a cancellation of the task of a single
    ``async for`` would cancel it (asyncio: one :exc:`asyncio.CancelledError`
    at the source's current await; trio: the pull's cancel scope, so the
    source's own cleanup shields what it awaits, as trio code does), then
    the iterator's ``aclose()`` runs in the pump.

    :param source: The async iterable to multicast; ``aiter(source)`` is
        called once, at the first pull.
    :param max_lag: How many items the log may hold for the slowest
        consumer, or ``None`` for no bound.
    :param on_lag: ``"wait"`` or ``"error"``: what happens at the bound.
    :param read_ahead: How many items the pump may pull past the most
        advanced consumer's demand (inside ``max_lag``), 64 by default: a
        batch amortises the wake-ups of the pump and of each consumer, and
        beyond 64 the gain flattens while the items held ahead grow. ``0``
        pulls on demand only, exactly.
    :raises TypeError: if ``source`` has no ``__aiter__``.
    :raises ValueError: if ``max_lag`` is not ``None`` or an int >= 1,
        ``on_lag`` is neither ``"wait"`` nor ``"error"``, or ``read_ahead``
        is not an int >= 0.
    """

    __slots__ = ("__weakref__", "_state")

    def __init__(
        self,
        source: AsyncIterable[T],
        *,
        max_lag: int | None = None,
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
        read_ahead = validate_read_ahead(read_ahead)
        self._state = _FanoutState(source, max_lag, on_lag == "error", read_ahead)
        self._state.handle = weakref.ref(self)

    def consumer(
        self, *, on_skip: Callable[[int], object] | None = None
    ) -> FanoutConsumer[T]:
        """Register a new consumer that receives every item pulled from now on.

        :param on_skip: (``on_lag="error"``) called as the consumer falls
            behind the bound and is moved past items it has not read, with
            the number of items logged before the first it misses
            (:attr:`FanoutStatistics.pulled` at that point): once per
            :exc:`Lagged` it will raise, synchronously, in the step that logs
            the item that left it behind, while what it missed is still
            known to whoever tracks the log. It must not block; an exception
            it raises is logged (logger ``wool_pooling``) and ignored. It is
            dropped when the consumer ends.
        :raises TypeError: if ``on_skip`` is neither ``None`` nor a callable
            taking one argument (it would fail at every skip, logged only).
        :raises ~anyio.ClosedResourceError: if the fan-out was closed.
        """
        if on_skip is not None:
            if not callable(on_skip):
                raise TypeError(f"on_skip must be callable or None, got {on_skip!r}")
            check_positional(on_skip, 1, lambda: f"on_skip {on_skip!r}")
        state = self._state
        if state.closed:
            raise anyio.ClosedResourceError("this fan-out is closed")
        consumer = FanoutConsumer(state, state.tail, on_skip)
        state.consumers += 1
        registry = state.registry
        registry.add(weakref.ref(consumer, registry.discard))
        return consumer

    def inject(self, item: T) -> None:
        """Log ``item`` for every consumer as if it had been pulled, outside
        any pull; nothing happens once the fan-out has finished."""
        state = self._state
        if state.end is None:
            state.append(item)

    @property
    def finished(self) -> bool:
        """Whether the source ended, failed, or the fan-out was closed."""
        return self._state.end is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._state.closed

    def statistics(self) -> FanoutStatistics:
        """Return a snapshot of consumers, buffered items and pull state."""
        state = self._state
        arrival = state.arrival  # (a wait for room is not counted)
        return FanoutStatistics(
            consumers=state.consumers,
            buffered=state.buffered(),
            waiting=0
            if arrival is None
            else sum(consumer._busy is arrival for consumer in state.live()),
            pulling=state.pulling,
            pulled=state.tail[2],
        )

    async def aclose(self) -> None:
        """End every consumer, cancel a pull in flight and close the source.

        The source is closed by the task that iterates it, and this waits
        for it. Idempotent. Runs shielded from cancellation, so the source is
        closed even when the caller is being cancelled. An exception raised
        by the source's ``aclose()`` propagates (once, to the first call
        after it).

        :raises RuntimeError: if the source is iterated on another event
            loop (the consumers are ended all the same, and the source is
            closed in its own loop).
        """
        await self._state.close()

    def __repr__(self) -> str:
        state = self._state.end or "OPEN"
        return (
            f"<Fanout [{state}, consumers: {self._state.consumers}, "
            f"buffered: {self._state.buffered()}] of {self._state.source!r}>"
        )


@final
class FanoutConsumer(Generic[T]):
    """One consumer of a :class:`Fanout`: an async iterator over its items.

    Created by :meth:`Fanout.consumer`. Receives every item pulled after its
    registration, in order, exactly once.

    :meth:`receive_nowait` returns a buffered item or raises; ``__anext__``
    (and so ``async for``, since ``__aiter__`` returns the consumer) returns
    a buffered item without suspending, and otherwise waits for the next
    pull. Cancelling a pending ``__anext__`` loses nothing: the consumer stays
    registered, and its next ``__anext__`` (or another ``async for`` over it)
    returns the item it would have received. An ``async for`` loop left by
    ``break``, an exception or a cancellation leaves the consumer where it
    was. One task at a time may wait on a consumer: a second one gets
    :exc:`~anyio.BusyResourceError`.

    :meth:`close` (or :meth:`aclose`, or leaving ``async with``) ends the
    consumer and frees what it held; so does garbage collection, in any
    thread (the release is then handed to the fan-out's event loop). Ending a
    consumer never affects the source or the others.
    """

    __slots__ = ("__weakref__", "_busy", "_here", "_node", "_on_skip", "_state")

    def __init__(
        self,
        state: _FanoutState[T],
        node: _Node,
        on_skip: Callable[[int], object] | None = None,
    ) -> None:
        # The shared state while this consumer is registered; once it ends,
        # a placeholder: an ended consumer pins nothing of its fan-out.
        self._state: _FanoutState[Any] = state
        # The next node to read (or a trap over it).
        self._node: _Node = node
        # The waiters its task is registered in, while one waits on it.
        self._busy: Waiters | None = None
        # The loop (trio: run token) a wait found running, once accepted.
        self._here: object = None
        self._on_skip = on_skip

    def __aiter__(self) -> FanoutConsumer[T]:
        return self

    def receive_nowait(self) -> T:
        """Return the next item if this consumer has one buffered.

        :raises ~anyio.WouldBlock: if nothing is buffered and the source may
            still produce items (a read that waits would start a pull).
        :raises ~anyio.EndOfStream: if this consumer has ended: the source
            was exhausted, the fan-out or this consumer was closed.
        :raises Lagged: (``on_lag="error"``) if this consumer missed items;
            the next read returns the oldest item held.
        :raises ~anyio.BusyResourceError: if another task is waiting in this
            consumer's ``__anext__``.
        :raises Exception: the source's error, once, with its traceback;
            then the consumer ends.
        """
        if self._busy is not None:
            raise anyio.BusyResourceError("receiving from")
        node = self._node
        while type(node) is _Trap:  # step onto the node it covers
            self._node = node.covered
            if node.kind is _LAGGED:
                skipped = node.skipped
                del node  # the traceback must not pin the log
                raise Lagged(skipped)
            self._state.wake_space()
            node = self._node
        following = node[1]
        if following is not None:
            self._node = following
            return node[0]
        if node is _ENDED:
            raise anyio.EndOfStream
        state = self._state
        end = state.end
        if end is None:
            raise anyio.WouldBlock
        if end.cancelled and state.loop is not None:
            state.loop.check_current("this fan-out")
        del state
        self.close()
        if end.error is not None:
            raise end.error.with_traceback(end.traceback)
        raise anyio.EndOfStream

    async def __anext__(self) -> T:
        while True:
            node = self._node
            following = node[1]
            if following is not None:  # an item is buffered
                self._node = following
                return node[0]
            state = self._state
            if node is state.tail and state.end is None:  # nothing yet: wait
                waiting = state.wait(self)
                try:
                    await waiting
                except BaseException:
                    self._give_up(waiting)
                    raise
                self._busy = None
                continue
            del node, following, state  # a traceback must not pin the log
            try:
                return self.receive_nowait()  # a trap, or the end
            except anyio.WouldBlock:
                continue  # a trap over the log's end: wait
            except anyio.EndOfStream:
                raise StopAsyncIteration from None

    async def wait_readable(self) -> None:
        """Wait until :meth:`receive_nowait` has an answer other than
        :exc:`~anyio.WouldBlock`: an item, :exc:`Lagged` or the end.

        Starts a pull if none is in flight (and ``on_lag="wait"`` does not
        hold it back). Cancelling it withdraws this consumer's demand only.

        :raises ~anyio.BusyResourceError: if another task is waiting already.
        :raises RuntimeError: if the fan-out is bound to another event loop.
        """
        if self._busy is not None:
            raise anyio.BusyResourceError("receiving from")
        state = self._state
        if self._node is not state.tail or state.end is not None:
            await anyio.lowlevel.checkpoint()
        while self._node is state.tail and state.end is None:
            waiting = state.wait(self)
            try:
                await waiting
            except BaseException:
                self._give_up(waiting)
                raise
            self._busy = None

    def _give_up(self, waiting: Awaitable[None]) -> None:
        """The wait ``waiting`` raised (cancellation): withdraw its demand,
        unless it was woken, and let another wait start."""
        if self._busy is not None:
            self._busy.withdraw(waiting)
            self._busy = None

    def skip_buffered(self) -> int:
        """Drop everything this consumer has yet to read and resume at the
        log's end (a :exc:`Lagged` pending is dropped too).

        :returns: how many items were skipped.
        """
        state = self._state
        node = self._node
        if node is _ENDED or state.closed:
            return 0
        tail = state.tail
        skipped = tail[2] - node[2]
        self._node = tail
        state.wake_space()
        return skipped

    def close(self) -> None:
        """End this consumer and free the items it held. Idempotent."""
        if self._node is not _ENDED:
            self._node = _ENDED
            self._here = None
            self._on_skip = None
            state = self._state
            self._state = _ended_state()
            state.leave()
            if self._busy is not None:
                state.wake_all()  # let its wait see the end

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
        """The fan-out this consumer reads from (once it has ended, a closed
        stand-in: an ended consumer keeps nothing of its fan-out alive)."""
        return self._state.fanout()

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
        return self._state.tail[2] - self._node[2]

    def __del__(self) -> None:
        if getattr(self, "_node", _ENDED) is _ENDED:
            return
        self._node = _ENDED
        state = self._state
        loop = state.loop
        if loop is None:
            state.leave()  # never waited on: nothing to wake
        elif loop.in_own_thread():
            # Count it gone at once; wake a pull waiting for room only from
            # the loop (a finaliser may run in the middle of anything).
            if not state.closed:
                state.consumers -= 1
                if state.space is not None:
                    loop.run_soon(state.wake_space)
        elif not loop.run_soon(state.leave):
            state.leave()  # the loop is gone: nobody waits

    def __repr__(self) -> str:
        state = "ACTIVE" if self._node is not _ENDED else "ENDED"
        return f"<FanoutConsumer [{state}, buffered: {self.buffered}]>"


# -- what statistics derive from the log, at the time they are asked for -----


def position(consumer: FanoutConsumer[Any]) -> int:
    """How many items of its fan-out's log ``consumer`` has moved past: the
    seq of its next item, less the items a :exc:`Lagged` it has yet to raise
    will report skipped (so a skip counts once it is reported); ``-1`` once
    it has ended.

    Read, never kept: a delivery costs nothing for it.
    """
    node = consumer._node
    if type(node) is _Trap and node.kind is _LAGGED:
        return node[2] - node.skipped
    return node[2]


def positions_total(fanout: Fanout[Any]) -> int:
    """The sum of :func:`position` over the consumers of ``fanout`` that have
    not ended. O(consumers)."""
    return sum(position(consumer) for consumer in fanout._state.live())


def logged(fanout: Fanout[Any]) -> int:
    """Items logged so far (:attr:`FanoutStatistics.pulled`), in O(1)."""
    return fanout._state.tail[2]


def source_failed(fanout: Fanout[Any]) -> bool:
    """Whether the source of ``fanout`` raised (its end was an error, not an
    exhaustion, a close, or a cancellation from outside)."""
    end = fanout._state.end
    return end is not None and end.error is not None and not end.cancelled
