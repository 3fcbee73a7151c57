"""Demand-driven multicast of one async iterator: a shared log, one cursor per consumer.

The data path, top to bottom: a consumer with nothing buffered asks for the
next item (:meth:`_FanoutState.wait_readable`); if no pull is in flight, one
starts (:func:`_run_pull`, the only code that awaits the source: a task of its
own on asyncio, the fan-out's pump on trio); the item it returns is appended
to a singly linked log (:meth:`_FanoutState.append`) and every waiter is
woken; each consumer holds a reference to the next node it will read and
reads it with :meth:`FanoutConsumer.receive_nowait`.

``FanoutConsumer.__anext__`` writes the common cases of that path out, since
they run once per item (for each consumer): the buffered read; on asyncio
with eager pulls, starting the pull's task itself; on trio, the wait for the
pump's next item.

**Where an item is held and when it is freed.** A node is ``[item, next,
seq]`` (a list: the cheapest object to build and index); the fan-out holds
only the empty node at the log's end, which the next item fills. So an item is
held by nothing but the consumers that have yet to read it, and is freed by
reference counting the moment the last of them moves past it or leaves: no
counts to keep, nothing to trim. A read is two index operations.

A consumer that must take the slow path at its next read (it lagged, or a
pull waits for it to make room) has its reference replaced by a *trap*:
``[None, None, seq, node, kind, arg]``, which has no ``next`` and so is never
read as an item.
"""

from __future__ import annotations

import contextvars
import sys
import types
import weakref
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from typing import Any
from typing import Generic
from typing import Literal
from typing import TypeVar
from typing import cast
from typing import final

import anyio
import anyio.lowlevel
import attrs

from . import _backend
from ._backend import EventLoop
from ._backend import PullTask
from ._backend import Waiters
from ._backend import current_loop
from ._backend import eager_task
from ._backend import running_task

__all__ = ["Fanout", "FanoutConsumer", "FanoutStatistics", "LagPolicy", "Lagged"]

T = TypeVar("T")

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
    #: Items logged so far: pulled from the source, or added by
    #: :meth:`Fanout.inject`.
    pulled: int


@attrs.frozen
class _End:
    """How the source ended: exhausted, failed or closed."""

    error: BaseException | None = None
    traceback: types.TracebackType | None = None
    closed: bool = False


@final
class _FanoutState(Generic[T]):
    """Everything a fan-out and its consumers share; the consumers touch
    nothing else of the fan-out."""

    __slots__ = (
        "__weakref__",
        "arrival",
        "consumers",
        "context",
        "drop_lagging",
        "eager",
        "end",
        "handle",
        "holds_back",
        "iterator",
        "lag_check_at",
        "loop",
        "max_lag",
        "pull",
        "pull_done",
        "pulling",
        "pump",
        "pump_bell",
        "pumped",
        "ref",
        "registry",
        "slowest",
        "source",
        "space",
        "tail",
        "waiting",
    )

    def __init__(
        self, source: AsyncIterable[T], max_lag: int | None, drop_lagging: bool
    ) -> None:
        self.source = source
        self.iterator: AsyncIterator[T] | None = None
        # The log's end: the empty node the next item fills. Its seq is the
        # number of items logged so far.
        self.tail: _Node = [None, None, 0]
        self.consumers = 0
        # Weak references to the registered consumers, for what needs their
        # positions: the lag bound, statistics, closing (see live()). Weak: a
        # dropped consumer is collected.
        self.registry: set[weakref.ref[FanoutConsumer[T]]] = set()
        self.max_lag = max_lag
        self.drop_lagging = drop_lagging
        # on_lag="wait" with a bound: a pull may have to wait for room.
        self.holds_back = max_lag is not None and not drop_lagging
        # A lower bound on every consumer's seq (positions only move forward;
        # newcomers start at the end).
        self.slowest = 0
        self.lag_check_at = (
            max_lag + 1 if max_lag is not None and drop_lagging else _NEVER
        )
        self.end: _End | None = None
        # Bound at the first wait: the loop, and the context every pull runs in.
        self.loop: EventLoop | None = None
        self.context: contextvars.Context | None = None
        # The asyncio loop while a consumer may start an eager pull itself
        # (FanoutConsumer.__anext__'s fast path): bound to a loop that starts
        # pulls eagerly, and not ended. None otherwise.
        self.eager: Any = None
        # The loop (trio) while its pulls run in a pump and it is not ended:
        # a consumer may wait without wait_readable() (see __anext__).
        self.pumped: EventLoop | None = None
        # What a pull holds of this state while it awaits the source.
        self.ref = weakref.ref(self)
        # Consumers waiting for the item after the log's end (woken when it
        # lands, or when the fan-out ends); a pull waiting for room.
        self.arrival: Waiters | None = None
        self.waiting = 0
        self.space: Waiters | None = None
        # The pull in flight: whether there is one, its task, and (only while
        # aclose() waits for it) an event set when it is over.
        self.pulling = False
        self.pull: PullTask | None = None
        self.pull_done: anyio.Event | None = None
        # trio: the pump that runs every pull (see _pump), and its bell
        # while it waits between pulls (None while it pulls or has ended).
        self.pump: PullTask | None = None
        self.pump_bell: _Bell | None = None
        # The Fanout object over this state, held weakly (consumers hold the
        # state, not the fan-out object).
        self.handle: weakref.ref[Fanout[T]] | None = None

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
        tail = self.tail
        seq: int = tail[2] + 1
        following: _Node = [None, None, seq]
        tail[0] = item
        tail[1] = following
        self.tail = following
        if self.lag_check_at <= seq:
            self.drop_beyond_lag()
        self.wake_waiters()

    def inject(self, item: T) -> None:
        """Log an item that did not come from a pull (a resync's drop), if open."""
        if self.end is None:
            self.append(item)

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
        if self.end is not None and self.end.closed:
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
                trapped = len(node) > 3
                kept = node[3] if trapped else node
                while kept[2] < oldest:
                    kept = kept[1]
                if trapped and node[4] is _LAGGED:
                    node[2], node[3], node[5] = oldest, kept, node[5] + oldest - seq
                else:
                    trap = [None, None, oldest, kept, _LAGGED, oldest - seq]
                    if consumer._node is node:
                        consumer._node = trap
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
            if node is not _ENDED and node[2] == slowest and len(node) == 3:
                trap = [None, None, slowest, node, _WATCHED, None]
                if consumer._node is node:  # not ended meanwhile (see above)
                    consumer._node = trap

    def wake_space(self) -> None:
        """A slow consumer moved or left: let a wait for room look again."""
        space = self.space
        if space is not None:
            self.space = None
            space.wake()

    def wake_waiters(self) -> None:
        arrival = self.arrival
        if arrival is not None:
            self.arrival = None
            self.waiting = 0
            arrival.wake()

    def leave(self) -> None:
        """One consumer left; what only it held is freed with its node."""
        if self.end is not None and self.end.closed:
            return
        self.consumers -= 1
        self.wake_space()
        if self.consumers == 0:
            self.stop_pump()

    # -- waiting and pulling -------------------------------------------------

    def bind(self) -> EventLoop:
        """The loop this fan-out runs on, bound at its first wait.

        :raises RuntimeError: if called under another event loop.
        """
        loop = self.loop
        if loop is None:
            loop = self.loop = current_loop()
            self.context = contextvars.copy_context()
            if self.end is None:
                self.eager = loop.eager_loop()
                self.pumped = loop if loop.pulls_in_pump else None
        else:
            loop.check_current("this fan-out")
        return loop

    async def wait_readable(self, consumer: FanoutConsumer[T]) -> None:
        """Wait until ``consumer`` has something to read: an item, a trap,
        or the end; start a pull if none is in flight and nothing holds it
        back. Cancelling this wait withdraws only this consumer's demand,
        never the pull in flight."""
        loop = self.bind()
        while (
            consumer._node[1] is None
            and len(consumer._node) == 3
            and consumer._node is not _ENDED
            and self.end is None
        ):
            if self.holds_back and self.log_is_full():
                space = self.space
                if space is None:
                    space = self.space = loop.waiters()
                self.watch_slowest()
                await space.wait()
                continue
            if not self.pulling:
                # The pull's first step may have run inline (an eager task):
                # a cancel request it made meanwhile (say, of the consumer's
                # own cancel scope) is delivered here, at an await inside
                # this call, never after it returns; and whatever it did to
                # this consumer (an item logged, the consumer closed) is
                # looked at again before waiting.
                if self.start_pull(loop):
                    await anyio.lowlevel.checkpoint()
                continue
            arrival = self.arrival
            if arrival is None:
                arrival = self.arrival = loop.waiters()
            self.waiting += 1
            try:
                await arrival.wait()
            finally:
                if self.arrival is arrival:  # not woken: withdraw the demand
                    self.waiting -= 1

    def start_pull(self, loop: EventLoop) -> bool:
        """Start a pull; return whether its inline first step asked to
        cancel the calling task (see :meth:`EventLoop.start_pull`)."""
        self.pulling = True
        context = self.context
        assert context is not None
        if loop.pulls_in_pump:
            bell = self.pump_bell
            if bell is not None:  # the pump waits between pulls: wake it
                self.pump_bell = None
                bell.ring(True)
            else:
                bell = _Bell(loop.parking())
                self.pump, _ = loop.start_pull(_pump, (self.ref, bell), context)
                # Dropped while the pump waits between pulls: let it end.
                bell.finalizer = weakref.finalize(self, loop.run_soon, bell.ring, False)
                bell.finalizer.atexit = False
            return False
        task, cancel_requested = loop.start_pull(_run_pull, self.ref, context)
        if self.pulling:  # not completed inline
            self.pull = task
        return cancel_requested

    def failed(self, error: BaseException) -> None:
        self.pulling = False
        self.pull = None
        if self.end is None:
            if isinstance(error, StopAsyncIteration):
                self.finish(None)
            elif isinstance(error, anyio.get_cancelled_exc_class()):
                # Cancelled from outside (the loop is shutting down) in the
                # middle of a pull: the source is unusable from now on.
                self.finish(
                    anyio.BrokenResourceError(
                        "the fan-out's pull was cancelled from outside"
                    )
                )
            else:
                self.finish(error)
        if self.pull_done is not None:
            self.pull_done.set()

    def finish(self, error: BaseException | None) -> None:
        traceback = error.__traceback__ if error is not None else None
        self.end = _End(error, traceback)
        self.eager = None
        self.pumped = None
        self.wake_waiters()
        self.wake_space()
        self.stop_pump()

    def stop_pump(self) -> None:
        """Let a pump waiting between pulls end (the fan-out has ended, or
        has no consumer left)."""
        bell = self.pump_bell
        if bell is not None:
            self.pump_bell = None
            bell.ring(False)

    async def close(self) -> None:
        first = not (self.end is not None and self.end.closed)
        if first:
            self.end = _End(closed=True)
            self.eager = None
            self.pumped = None
            self.consumers = 0
            # Every consumer ends: what it had yet to read is dropped, and it
            # lets go of this state (a consumer kept alive by, say, the
            # traceback of its cancelled wait then pins nothing).
            for consumer in self.live():
                consumer._node = _ENDED
                consumer._state = _ended_state()
                consumer._task = None
            self.registry = set()
            self.wake_waiters()
            self.wake_space()
            self.stop_pump()
        loop = self.loop
        if loop is not None and self.pulling:
            loop.check_current("this fan-out")
        with anyio.CancelScope(shield=True):
            if self.pulling:
                done = self.pull_done
                if done is None:
                    done = self.pull_done = anyio.Event()
                pull = self.pull if self.pull is not None else self.pump
                if pull is not None:
                    pull.cancel()
                await done.wait()
            if first:
                iterator, self.iterator = self.iterator, None
                source, self.source = self.source, _CLOSED_SOURCE
                if iterator is None and hasattr(source, "__anext__"):
                    iterator = source  # type: ignore[assignment]
                del source
                closer = getattr(iterator, "aclose", None)
                del iterator
                if closer is not None:
                    await closer()


async def _run_pull(ref: weakref.ref[_FanoutState[Any]]) -> None:
    """Pull one item from the source and log it for every consumer.

    The only code that awaits the source. It runs as a task of its own on
    asyncio (see :meth:`~wool_pooling._backend.EventLoop.start_pull`), in the
    fan-out's pump on trio (:func:`_pump`), and holds the state only weakly
    while it awaits, so that neither a pull in flight nor an error's
    traceback keeps a dropped fan-out alive. The item is logged in the step
    that receives it, so the source is never ahead of the log (a consumer
    joining in between would be told of the source's state, then get the
    item too). Whatever the source raises, synchronously or not, ends the
    fan-out with it.
    """
    state = ref()
    if state is None:
        return
    try:
        iterator = state.iterator
        if iterator is None:
            iterator = state.iterator = aiter(state.source)
        del state
        item = await iterator.__anext__()
    except BaseException as error:
        state = ref()
        if state is not None:
            state.failed(error)
        return
    state = ref()
    if state is None:
        return
    # The pull is over; append(item), written out (on asyncio this runs once
    # per item, in a task of its own).
    state.pulling = False
    state.pull = None
    if state.end is None:
        tail = state.tail
        seq: int = tail[2] + 1
        following: _Node = [None, None, seq]
        tail[0] = item
        tail[1] = following
        state.tail = following
        if state.lag_check_at <= seq:
            state.drop_beyond_lag()
        if state.arrival is not None:
            state.wake_waiters()
    if state.pull_done is not None:
        state.pull_done.set()


@final
class _Bell:
    """How a fan-out reaches its pump while the pump waits between pulls."""

    __slots__ = ("finalizer", "parking", "waiting", "wanted")

    def __init__(self, parking: Waiters) -> None:
        # Where the pump waits between pulls, and whether it waits there.
        self.parking = parking
        self.waiting = False
        # Why the pump was woken: a pull is wanted, or it is to end.
        self.wanted = False
        # Rings the bell if the fan-out is dropped while the pump waits.
        self.finalizer: weakref.finalize[Any, Any] | None = None

    def ring(self, wanted: bool) -> None:
        if self.waiting:
            self.waiting = False
            self.wanted = wanted
            self.parking.wake()


async def _pump(args: tuple[weakref.ref[_FanoutState[Any]], _Bell]) -> None:
    """trio: run a fan-out's pulls one after the other, in this one task.

    Spawning a trio task (and its cancel scope) per pull costs more than the
    pull; this task instead waits at the bell between pulls for the next
    demand. It holds the state only weakly, as :func:`_run_pull` does, and
    ends when the fan-out ends, is closed or dropped, or has no consumer
    left (the next demand then starts a new pump).
    """
    ref, bell = args
    try:
        while True:
            await _run_pull(ref)
            state = ref()
            if state is None or state.end is not None or state.consumers == 0:
                return
            bell.waiting = True
            state.pump_bell = bell
            del state
            await bell.parking.wait()
            if not bell.wanted:
                return
    finally:
        if bell.finalizer is not None:
            bell.finalizer.detach()


class _ClosedSource:
    """What a closed fan-out's state iterates instead of its source."""

    def __aiter__(self) -> AsyncIterator[Any]:
        raise anyio.ClosedResourceError("this fan-out is closed")

    def __repr__(self) -> str:
        return "<closed source>"


_CLOSED_SOURCE: Any = _ClosedSource()
_ENDED_STATES: list[_FanoutState[Any]] = []


def _ended_state() -> _FanoutState[Any]:
    """The state every ended consumer points to: closed, holding nothing."""
    if not _ENDED_STATES:
        state: _FanoutState[Any] = _FanoutState(_CLOSED_SOURCE, None, False)
        state.end = _End(closed=True)
        _ENDED_STATES.append(state)
    return _ENDED_STATES[0]


@final
class Fanout(Generic[T]):
    """Multicast one async iterable to any number of independent consumers.

    Every consumer receives every item pulled after it registered, in source
    order, exactly once.

    **Demand-driven.** The source is advanced only when a consumer that has
    nothing buffered waits for an item; at most one pull is in flight and
    nothing is pulled ahead of that demand. A consumer that has items buffered
    receives them without suspending and without touching the source.

    **Where a pull runs.** Never in a consumer's task. On asyncio every pull
    runs in a task of its own, started by the fan-out: with CPython 3.12+
    its first step runs eagerly, inside the call of the consumer that asked
    for it, but as the new task, so an item the source has ready costs no
    trip through the event loop; on 3.11 it starts at the loop's next pass.
    On trio, where spawning a task costs more than a pull, the fan-out runs
    its pulls one after the other in one system task, its pump, which waits
    for the next demand between pulls and ends when the fan-out ends, is
    closed or dropped, or has no consumer left. The source may rely on this:
    one pull at a time; all pulls run in one :class:`contextvars.Context` (a
    copy of the first waiting consumer's); the current task during a pull is
    not a consumer's (``asyncio.timeout``, anyio and trio cancel scopes work
    inside a pull); cancelling a consumer never reaches it; an item is logged
    in the very step in which the source returns it, so whatever the source
    records while producing it (a table of known workers, say) is never
    ahead of the log a consumer registering then starts from. Successive
    pulls may run in different tasks, so a source must not keep a cancel
    scope or task group open across its own ``yield``.

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
    waiting on it (or closing it while a pull is in flight) from another
    loop raises :exc:`RuntimeError`.

    **Closing.** :meth:`aclose` cancels a pull in flight, closes the source
    (``aclose()`` of its iterator) and ends every consumer at once: items not
    yet received are discarded.

    :param source: The async iterable to multicast; ``aiter(source)`` is
        called once, at the first pull.
    :param max_lag: How many items the log may hold for the slowest
        consumer, or ``None`` for no bound.
    :param on_lag: ``"wait"`` or ``"error"``: what happens at the bound.
    :raises TypeError: if ``source`` has no ``__aiter__``.
    :raises ValueError: if ``max_lag`` is not ``None`` or an int >= 1, or
        ``on_lag`` is neither ``"wait"`` nor ``"error"``.
    """

    __slots__ = ("__weakref__", "_state")

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
        max_lag = validate_max_lag(max_lag)
        if on_lag not in ("wait", "error"):
            raise ValueError(f"on_lag must be 'wait' or 'error', got {on_lag!r}")
        self._state = _FanoutState(source, max_lag, on_lag == "error")
        self._state.handle = weakref.ref(self)

    def consumer(self) -> FanoutConsumer[T]:
        """Register a new consumer that receives every item pulled from now on.

        :raises ~anyio.ClosedResourceError: if the fan-out was closed.
        """
        state = self._state
        end = state.end
        if end is not None and end.closed:
            raise anyio.ClosedResourceError("this fan-out is closed")
        consumer = FanoutConsumer(state, state.tail)
        state.consumers += 1
        registry = state.registry
        registry.add(weakref.ref(consumer, registry.discard))
        return consumer

    def inject(self, item: T) -> None:
        """Log ``item`` for every consumer as if it had been pulled, outside
        any pull; nothing happens once the fan-out has finished."""
        self._state.inject(item)

    @property
    def finished(self) -> bool:
        """Whether the source ended, failed, or the fan-out was closed."""
        return self._state.end is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        end = self._state.end
        return end is not None and end.closed

    def statistics(self) -> FanoutStatistics:
        """Return a snapshot of consumers, buffered items and pull state."""
        state = self._state
        return FanoutStatistics(
            consumers=state.consumers,
            buffered=state.buffered(),
            waiting=state.waiting,
            pulling=state.pulling,
            pulled=state.tail[2],
        )

    async def aclose(self) -> None:
        """Cancel a pull in flight, close the source and end every consumer.

        Idempotent. Runs shielded from cancellation, so the source is closed
        even when the caller is being cancelled. An exception raised by the
        source's ``aclose()`` propagates.

        :raises RuntimeError: if a pull is in flight on another event loop
            (the consumers are ended all the same).
        """
        await self._state.close()

    def __repr__(self) -> str:
        end = self._state.end
        if end is None:
            state = "OPEN"
        elif end.closed:
            state = "CLOSED"
        elif end.error is not None:
            state = "FAILED"
        else:
            state = "EXHAUSTED"
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

    __slots__ = ("__weakref__", "_busy", "_node", "_state", "_task")

    def __init__(self, state: _FanoutState[T], node: _Node) -> None:
        # The shared state while this consumer is registered; once it ends,
        # a placeholder: an ended consumer pins nothing of its fan-out.
        self._state: _FanoutState[Any] = state
        # The node of the next item to read (or a trap over it).
        self._node: _Node = node
        # Whether a task is waiting in __anext__.
        self._busy = False
        # The last task found (in __anext__) to run in the fan-out's loop:
        # a task runs in one loop only, so the loop is checked once per task.
        self._task: object = None

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
        if self._busy:
            raise anyio.BusyResourceError("receiving from")
        node = self._node
        following = node[1]
        if following is not None:  # the fast path: an item is buffered
            self._node = following
            return node[0]
        while len(node) > 3:  # a trap: step onto the node it covers
            self._node = node[3]
            if node[4] is _LAGGED:
                skipped: int = node[5]
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
        end = self._state.end
        if end is None:
            raise anyio.WouldBlock
        self.close()
        if end.error is not None:
            raise end.error.with_traceback(end.traceback)
        raise anyio.EndOfStream

    async def __anext__(self) -> T:
        while True:
            node = self._node
            following = node[1]
            if following is not None:  # the fast path: an item is buffered
                self._node = following
                return node[0]
            del following
            state = self._state
            eager = state.eager
            if (
                node is state.tail  # at the log's end: not ended, no trap
                and eager is not None  # asyncio, eager pulls, not ended
                and not state.pulling
                and not self._busy
                and (
                    not state.holds_back
                    or state.tail[2] - state.slowest < state.max_lag
                )
            ):
                # The eager route (asyncio, CPython 3.12+): start the pull
                # here, as EventLoop.start_pull would, without the calls (it
                # is written out because it runs once per item). An item the
                # source has ready is logged before the task is returned.
                try:
                    caller = running_task()
                except RuntimeError:  # no asyncio loop: the slow path says so
                    caller = None
                if caller is not None and caller is not self._task:
                    # A task runs in one loop only: check the loop once per task.
                    if caller.get_loop() is eager:
                        self._task = caller
                    else:
                        caller = None
                if caller is not None:
                    state.pulling = True
                    self._busy = True
                    try:
                        task = eager_task(
                            _run_pull(state.ref),
                            loop=eager,
                            context=state.context,
                            eager_start=True,
                        )
                    finally:
                        self._busy = False
                    if state.pulling:  # the source suspended
                        state.pull = task
                    del task
                    # If the caller is to be cancelled (its cancel scope,
                    # say, cancelled by the pull's first step), that is let
                    # through here, at an await inside this call, as
                    # wait_readable() does. A task being cancelled already
                    # takes this checkpoint too; it raises nothing that its
                    # next await would not.
                    if caller.cancelling():
                        await anyio.lowlevel.checkpoint()
                    continue
            pumped = state.pumped
            if (
                pumped is not None  # trio, not ended
                and node is state.tail  # at the log's end: not ended, no trap
                and not self._busy
                and (
                    not state.holds_back
                    or state.tail[2] - state.slowest < state.max_lag
                )
            ):
                # wait_readable(), written out for trio: with many consumers
                # this runs once per item for each of them.
                trio = _backend.trio_lowlevel
                try:
                    task = trio.current_task()
                except RuntimeError:  # not in a trio run: the slow path says so
                    task = None
                if task is not None:
                    if task is not self._task:
                        pumped.check_current("this fan-out")
                        self._task = task
                    if not state.pulling:
                        state.start_pull(pumped)
                    # trio's waiters take a task in (enter(): state.arrival
                    # is never one already woken) without a coroutine of
                    # their own; this task then parks itself.
                    arrival: Any = state.arrival
                    if arrival is None:
                        arrival = state.arrival = pumped.waiters()
                    abort = arrival.enter(task)
                    state.waiting += 1
                    self._busy = True
                    try:
                        await trio.wait_task_rescheduled(abort)
                    finally:
                        self._busy = False
                        if state.arrival is arrival:  # not woken: withdrawn
                            state.waiting -= 1
                    continue
            if (
                node[1] is None  # nothing buffered,
                and len(node) == 3  # no trap,
                and node is not _ENDED  # not ended,
                and state.end is None  # the source goes on:
            ):  # receive_nowait() would raise WouldBlock; wait instead
                if self._busy:
                    raise anyio.BusyResourceError("receiving from")
                self._busy = True
                try:
                    await state.wait_readable(self)
                finally:
                    self._busy = False
                continue
            del node, state  # a traceback (of Lagged, say) must not pin the log
            try:
                return self.receive_nowait()
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
        if self._busy:
            raise anyio.BusyResourceError("receiving from")
        if self._node is _ENDED:
            await anyio.lowlevel.checkpoint()
            return
        self._busy = True
        try:
            await self._state.wait_readable(self)
        finally:
            self._busy = False

    def skip_buffered(self) -> int:
        """Drop everything this consumer has yet to read and resume at the
        log's end (a :exc:`Lagged` pending is dropped too).

        :returns: how many items were skipped.
        """
        state = self._state
        node = self._node
        if node is _ENDED or (state.end is not None and state.end.closed):
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
            self._task = None
            state = self._state
            self._state = _ended_state()
            state.leave()
            if self._busy:
                state.wake_waiters()  # let its wait see the end
                state.wake_space()

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
        state = self._state
        if self._node is _ENDED or (state.end is not None and state.end.closed):
            return 0
        return state.tail[2] - self._node[2]

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
            if state.end is None or not state.end.closed:
                state.consumers -= 1
                if state.space is not None:
                    loop.run_soon(state.wake_space)
        elif not loop.run_soon(state.leave):
            state.leave()  # the loop is gone: nobody waits

    def __repr__(self) -> str:
        state = "ACTIVE" if self._node is not _ENDED else "ENDED"
        return f"<FanoutConsumer [{state}, buffered: {self.buffered}]>"
