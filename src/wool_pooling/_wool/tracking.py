"""The known workers of one shared discovery stream, recorded item by item."""

from __future__ import annotations

import inspect
import itertools
import uuid
from collections import deque
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from typing import Any
from typing import Protocol
from typing import cast
from typing import final

import anyio
from wool import DiscoveryEvent
from wool import WorkerMetadata

from .._core.iterators import aclose_iterator
from .._core.iterators import throw_into
from .._core.synced import Synced
from .workers import WorkerMap
from .workers import Workers

__all__ = [
    "BrokenSubscriber",
    "KnownWorkers",
    "TrackedSource",
    "Tracking",
    "open_iterator",
]


class BrokenSubscriber(TypeError):
    """A subscriber class's ``__aiter__`` did not return an async iterator.

    A programming error, not a failing stream: never restarted.
    """


def open_iterator(raw: object) -> AsyncIterator[Any]:
    """``aiter(raw)``, with an error naming the class when ``__aiter__`` is wrong.

    A coroutine or generator it returned instead is closed, so no "never
    awaited" warning follows the error.

    :raises BrokenSubscriber: (a :exc:`TypeError`) naming the subscriber
        class and what its ``__aiter__`` returned.
    """
    cls = type(raw)
    method = getattr(cls, "__aiter__", None)
    if not callable(method):
        raise BrokenSubscriber(
            f"{cls.__qualname__}.__aiter__ is {method!r}, not a method returning "
            "an async iterator"
        )
    iterator: object = method(raw)
    if callable(getattr(type(iterator), "__anext__", None)):
        return cast("AsyncIterator[Any]", iterator)
    hint = ""
    if inspect.iscoroutine(iterator):
        iterator.close()
        hint = (
            ": an 'async def __aiter__' without 'yield' returns a coroutine; "
            "make it an async generator (yield the items) or a plain 'def' "
            "returning an async iterator"
        )
    elif inspect.isgenerator(iterator):
        iterator.close()
        hint = ": a generator is not async; use 'async def' with 'yield'"
    raise BrokenSubscriber(
        f"{cls.__qualname__}.__aiter__() returned {type(iterator).__qualname__} "
        f"{_short(iterator)}, not an async iterator{hint}"
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


#: An undo record: the uid an item changed and its metadata before (``None``:
#: it was not known), or ``None`` for an item that changed nothing tracked.
_Undo = tuple[uuid.UUID, WorkerMetadata | None] | None


@final
class KnownWorkers(WorkerMap):
    """The workers a stream has made known, and how to go back a few events.

    A :class:`~wool_pooling._wool.workers.WorkerMap` that counts the items
    of the stream's log. :meth:`record` is called once per item the stream
    logs as it came, in log order, so that :attr:`count` is the log's
    length; :meth:`apply` (and :meth:`drop`) make the event to log instead,
    and count it only if there is one. Known workers are those added or
    updated and not dropped since, each with its latest metadata, in the
    order they were first seen.

    With ``history`` (the shared log's lag bound), the last ``history`` items
    also leave an undo record, so that :meth:`at` can rebuild the workers as
    they stood a few items back: that is what a consumer that fell behind has
    seen, so no consumer keeps a view of its own while it reads the log.
    Memory held: one metadata per known worker, at most ``history`` undo
    records, and the last view :meth:`at` rebuilt.
    """

    __slots__ = ("_at", "_listed_waiters", "_undo", "count", "listed_at", "untracked")

    def __init__(self, history: int | None = None) -> None:
        super().__init__()
        #: Whether an item that is not a discovery event has passed: the
        #: workers then do not describe the whole stream, and a lagging
        #: consumer cannot be resynchronised from them.
        self.untracked = False
        #: Items recorded so far.
        self.count = 0
        self._undo: deque[_Undo] | None = (
            None if history is None else deque(maxlen=history)
        )
        # The last view :meth:`at` built, while no item followed: consumers
        # that fell behind at the same item share it.
        self._at: tuple[int, int, Workers] | None = None
        #: Items logged when the stream marked the end of its first listing
        #: (see :class:`~wool_pooling.Synced`); ``None`` until it does.
        self.listed_at: int | None = None
        self._listed_waiters: list[anyio.Event] | None = None

    def mark_listed(self) -> None:
        """The stream yielded :class:`~wool_pooling.Synced`: its first
        listing ends at the log's end (a later mark changes nothing)."""
        if self.listed_at is not None:
            return
        self.listed_at = self.count
        waiters, self._listed_waiters = self._listed_waiters, None
        for event in waiters or ():
            event.set()

    def notify_listed(self, event: anyio.Event) -> None:
        """Set ``event`` when :meth:`mark_listed` first runs."""
        waiters = self._listed_waiters
        if waiters is None:
            waiters = self._listed_waiters = []
        if event not in waiters:
            waiters.append(event)

    def forget_listed(self, event: anyio.Event) -> None:
        """Undo :meth:`notify_listed` (its waiter has gone)."""
        waiters = self._listed_waiters
        if waiters is not None and event in waiters:
            waiters.remove(event)

    def record(self, item: object) -> None:
        """Take ``item`` (a discovery event, or an untracked item) as the next
        logged, as it is: a drop forgets the worker, any other event sets its
        metadata.

        The log is already decided, so nothing is compared or built: this
        leaves the state :meth:`apply` would, at the cost of one dict update
        (the per-item path of every shared stream; a call to a shared helper
        would cost it a tenth more).
        """
        self.count += 1
        undo: _Undo = None
        if isinstance(item, DiscoveryEvent):
            metadata = item.metadata
            uid = metadata.uid
            workers = self.workers
            if item.type == "worker-dropped":
                undo = (uid, workers.pop(uid, None))
            else:
                undo = (uid, workers.get(uid))
                workers[uid] = metadata
        else:
            self.untracked = True
        if self._undo is not None:
            self._undo.append(undo)

    def apply(self, event: DiscoveryEvent) -> DiscoveryEvent | None:
        """:meth:`WorkerMap.apply <wool_pooling._wool.workers.WorkerMap.apply>`,
        recording the event returned (if any) as the next logged."""
        uid = event.metadata.uid
        before = self.workers.get(uid)
        passed = super().apply(event)
        if passed is not None:
            self._logged(uid, before)
        return passed

    def drop(self, uid: uuid.UUID) -> DiscoveryEvent | None:
        """:meth:`WorkerMap.drop <wool_pooling._wool.workers.WorkerMap.drop>`,
        recording the event returned (if any) as the next logged."""
        before = self.workers.get(uid)
        passed = super().drop(uid)
        if passed is not None:
            self._logged(uid, before)
        return passed

    def _logged(self, uid: uuid.UUID, before: WorkerMetadata | None) -> None:
        self.count += 1
        if self._undo is not None:
            self._undo.append((uid, before))

    def at(self, count: int) -> Workers:
        """The known workers as they stood after the first ``count`` items.

        Treat the result as read-only: it may be shared with the next call.

        :raises ValueError: if ``count`` is ahead of :attr:`count`, or
            further back than the history kept.
        """
        back = self.count - count
        undo = self._undo
        if back < 0 or back > (0 if undo is None else len(undo)):
            raise ValueError(
                f"cannot rebuild the workers after item {count}: "
                f"{self.count} recorded, history of {len(undo or ())}"
            )
        cached = self._at
        if cached is not None and cached[:2] == (self.count, count):
            return cached[2]
        view = dict(self.workers)
        if undo is not None:
            for record in itertools.islice(reversed(undo), back):
                if record is None:
                    continue
                uid, before = record
                if before is None:
                    view.pop(uid, None)
                else:
                    view[uid] = before
        self._at = (self.count, count, view)
        return view


class Tracking(Protocol):
    """A pool entry's source: it iterates the raw subscriber and records each
    item it returns in :attr:`known`, before the item is logged."""

    #: The workers known at the log's end, and how they stood a few items back.
    known: KnownWorkers

    def __aiter__(self) -> AsyncIterator[Any]: ...

    async def __anext__(self) -> Any: ...

    async def aclose(self) -> None: ...


@final
class TrackedSource:
    """The raw subscriber's iteration, recording which workers are known.

    This is the source a pool entry's :class:`~wool_pooling.Fanout` pulls
    from, so the state (:attr:`known`) is updated exactly once per source
    event, in the pull, before any consumer sees the event. A consumer that
    registers with the fan-out and takes the replay of the known workers in
    the same synchronous
    step therefore sees every known worker once, then exactly the events
    after that point: no gap, no duplicate.

    Items that are not discovery events pass through untracked (and set
    ``known.untracked``). Memory held: see :class:`KnownWorkers`. (Restarts
    are :class:`~wool_pooling._pooling.restart.RestartingSource`'s.)
    """

    __slots__ = ("_iterator", "_raw", "known")

    def __init__(self, raw: AsyncIterable[Any], history: int | None = None) -> None:
        self._raw = raw
        self._iterator: AsyncIterator[Any] | None = None
        self.known = KnownWorkers(history)

    def __aiter__(self) -> TrackedSource:
        return self

    async def __anext__(self) -> Any:
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = open_iterator(self._raw)
        item = await iterator.__anext__()
        if type(item) is Synced:
            return await self._after_marker(iterator)
        return self._track(item)

    async def athrow(self, error: BaseException) -> Any:
        """Raise ``error`` in the raw iteration, where it is suspended."""
        iterator = self._iterator
        if iterator is None:
            raise error
        item = await throw_into(iterator, error)
        if type(item) is Synced:
            return await self._after_marker(iterator)
        return self._track(item)

    async def _after_marker(self, iterator: AsyncIterator[Any]) -> Any:
        """Take in a :class:`~wool_pooling.Synced` (never logged) and every
        one following it; return the next item."""
        while True:
            self.known.mark_listed()
            item = await iterator.__anext__()
            if type(item) is not Synced:
                return self._track(item)

    def _track(self, event: Any) -> Any:
        self.known.record(event)
        return event

    async def aclose(self) -> None:
        """Close the raw subscriber's iterator, if it was started and can be closed."""
        iterator, self._iterator = self._iterator, None
        await aclose_iterator(iterator)
