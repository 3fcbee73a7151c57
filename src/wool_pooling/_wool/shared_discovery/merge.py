"""The upstream of a :class:`~wool_pooling.SharedDiscovery`: one iteration of
the inner discovery, with a fresh scan merged in for each late joiner.

See "What is shared" and "Reading the view" in docs/wool.rst.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from contextlib import AbstractContextManager
from contextlib import AsyncExitStack
from typing import Any
from typing import cast
from typing import final

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from wool import DiscoveryEvent
from wool.runtime.discovery import __subscriber_pool__

from ..._core.backend import current_loop
from ..._core.iterators import aclose_iterator
from ..._core.synced import Synced
from ..._pooling.decorator import shared_subscription
from ..._pooling.subscription import SubscriptionConsumer
from ..workers import WorkerMap
from .portable import BY_CONSTRUCTOR
from .portable import Options
from .portable import Portable

logger = logging.getLogger("wool_pooling")

#: Seconds a joiner's fresh scan stays open after it started or last changed
#: the known workers: a scan of shared memory, or a server's snapshot,
#: arrives within that.
RESCAN_SETTLE = 0.25

#: Seconds the upstream of wool's ``LocalDiscovery`` or ``LanDiscovery``
#: (which never say when a listing is complete) has to find nothing new, from
#: its start or its last change, for its first listing to count as complete.
LISTING_QUIET = RESCAN_SETTLE

#: Events a reader may hand on past what the iteration has taken (the
#: fan-out's default read-ahead): the inner discovery is read no further ahead.
BUFFER = 64


def _key(cls: type, portable: Portable, options: Options) -> object:
    return portable.key


@shared_subscription(key=_key, read_ahead=BUFFER)
class Upstream:
    """The unfiltered subscription to one inner discovery with given options.

    Its iteration runs ``inner.subscribe(**options)`` in a reader task of its
    own. Each consumer joining once that reader has started has the inner
    discovery scanned afresh by a second reader, closed
    :data:`RESCAN_SETTLE` seconds after it started or last changed the
    known workers; joiners arriving before it starts share it. Readers merge
    what they read into one :class:`~wool_pooling._wool.workers.WorkerMap`
    and hand on only what changed it. The first reader's end or failure
    ends the iteration; a rescan's failure is logged. Closing the iteration
    closes every reader and waits for it, shielded.
    """

    def __init__(self, portable: Portable, options: Options) -> None:
        self.inner: Any = portable.discovery
        self.options = options
        self.rescans = 0
        self._merge: _Merge | None = None

    def __wool_pooling_rescans__(self) -> int:
        """Fresh scans started for joiners so far."""
        return self.rescans

    def __wool_pooling_joined__(self) -> None:
        """A consumer has joined: scan the inner discovery afresh."""
        if self._merge is not None and self._merge.rescan():
            self.rescans += 1

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self._events()

    async def _events(self) -> AsyncGenerator[Any, None]:
        send, receive = anyio.create_memory_object_stream[Any](BUFFER)
        merge = self._merge = _Merge(self.inner, self.options, send)
        listed = False
        # wool's discoveries never mark their first listing: it is taken to
        # be complete once nothing new came for a quiet time.
        quiet = type(self.inner) in BY_CONSTRUCTOR
        until = anyio.current_time() + LISTING_QUIET if quiet else math.inf
        try:
            while True:
                try:
                    item = receive.receive_nowait()
                except anyio.WouldBlock:
                    item = Synced()  # unless something comes in the quiet time
                    with anyio.CancelScope(deadline=until):
                        item = await receive.receive()
                if type(item) is _Reader:  # the first reader's end
                    if item.error is not None:
                        raise item.error
                    return
                if type(item) is Synced:
                    if not listed:
                        listed, until = True, math.inf
                        yield item
                    continue
                yield item
                if until != math.inf:
                    until = anyio.current_time() + LISTING_QUIET
        finally:
            self._merge = None
            receive.close()  # a reader handing on an event gives up
            await merge.close()

    def __repr__(self) -> str:
        return f"Upstream({self.inner!r}, {self.options!r})"


@final
class _Reader:
    """One iteration of ``inner.subscribe(**options)``, in a task of its own."""

    __slots__ = ("busy", "done", "error", "main", "marked", "scope")

    def __init__(self, main: bool) -> None:
        self.main = main
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.error: Exception | None = None  # what ended its iteration
        self.busy = False  # waiting to hand on an event
        self.marked = False  # handed on the inner consumer's synced


@final
class _Merge:
    """One iteration's readers, and the workers they have made known."""

    def __init__(
        self, inner: Any, options: Options, send: MemoryObjectSendStream[Any]
    ) -> None:
        self.inner = inner
        self.options = options
        self.send = send
        self.known = WorkerMap()
        self.readers: set[_Reader] = set()
        self.loop = current_loop()
        self.context = contextvars.copy_context()
        self.pending = False  # a reader that has not started its scan yet
        self._start(_Reader(main=True))

    def rescan(self) -> bool:
        """Start a fresh scan, unless one yet to start covers this joiner;
        whether it started one."""
        if self.pending:
            return False
        self._start(_Reader(main=False))
        return True

    def _start(self, reader: _Reader) -> None:
        self.pending = True
        self.readers.add(reader)
        # wool caches one raw subscriber per key and ``__subscriber_pool__``:
        # with a pool of its own, a reader scans afresh instead of joining
        # a cached iteration.
        context = self.context.copy()
        context.run(__subscriber_pool__.set, None)
        self.loop.spawn(self._read, reader, context=context)

    async def close(self) -> None:
        """Close every reader and wait for it, shielded."""
        readers = list(self.readers)
        for reader in readers:
            reader.scope.cancel()
        with anyio.CancelScope(shield=True):
            for reader in readers:
                await reader.done.wait()

    async def _read(self, reader: _Reader) -> None:
        """Iterate ``inner.subscribe(**options)`` once; the first reader then
        hands itself on, as the end of the iteration."""
        try:
            with reader.scope:
                # A pass of the loop first, even under an eager task factory:
                # consumers joining at this moment share this scan.
                await anyio.lowlevel.checkpoint()
                self.pending = False
                if not reader.main:
                    reader.scope.deadline = anyio.current_time() + RESCAN_SETTLE
                stack = AsyncExitStack()
                try:
                    subscribed = self.inner.subscribe(**dict(self.options))
                    iterator = aiter(cast(Any, await _resolve(subscribed, stack)))
                    stack.push_async_callback(aclose_iterator, iterator)
                    await self._forward(reader, iterator)
                finally:
                    with anyio.CancelScope(shield=True):
                        await stack.aclose()
        except Exception as error:
            reader.error = error
        finally:
            self.readers.discard(reader)
            reader.done.set()
        if reader.main:  # the iteration may be closed, its stream with it
            with contextlib.suppress(anyio.BrokenResourceError):
                await self.send.send(reader)
        elif reader.error is not None:
            logger.warning("a rescan of %r failed: %r", self.inner, reader.error)

    async def _forward(self, reader: _Reader, iterator: AsyncIterator[Any]) -> None:
        """Merge each item as it is read; hand on what changed the known
        workers (and the first reader's other items), in order."""
        relayed = None
        if reader.main and isinstance(iterator, SubscriptionConsumer):
            relayed = iterator
        watch = anyio.CancelScope()
        if relayed is not None:
            self.loop.spawn(self._watch, reader, relayed, watch)
        admit, send_nowait = self._admit, self.send.send_nowait
        try:
            async for item in iterator:
                item = admit(reader, item)
                if item is not None:
                    # Into the buffer without a checkpoint per event.
                    try:
                        send_nowait(item)
                    except anyio.WouldBlock:
                        # Merged already: handed on even if the reader closes.
                        reader.busy = True
                        with anyio.CancelScope(shield=True):
                            await self.send.send(item)
                        reader.busy = False
                if relayed is not None and relayed.synced and not reader.marked:
                    await self._mark(reader)
        finally:
            watch.cancel()

    def _admit(self, reader: _Reader, item: object) -> object | None:
        """What of ``item``, just read by ``reader``, to hand on (``None``:
        nothing). A change keeps a rescan open longer."""
        if not isinstance(item, DiscoveryEvent):
            return item if reader.main else None
        event = self.known.apply(item)
        if event is not None and not reader.main:
            reader.scope.deadline = anyio.current_time() + RESCAN_SETTLE
        return event

    async def _watch(
        self,
        reader: _Reader,
        consumer: SubscriptionConsumer[Any],
        scope: anyio.CancelScope,
    ) -> None:
        """Hand on :class:`~wool_pooling.Synced` once the inner shared
        subscription's consumer is synced, unless the reader, holding an
        event, will after it."""
        with scope:
            await consumer.wait_synced()
            if consumer.synced and not reader.busy and not reader.marked:
                await self._mark(reader)

    async def _mark(self, reader: _Reader) -> None:
        reader.marked = True
        with contextlib.suppress(anyio.BrokenResourceError):
            await self.send.send(Synced())


async def _resolve(value: object, stack: AsyncExitStack) -> object:
    """Resolve a subscriber as wool's ``WorkerProxy`` does: enter a context
    manager (on ``stack``), call a factory, await an awaitable."""
    if isinstance(value, AbstractContextManager):
        return stack.enter_context(cast(AbstractContextManager[object], value))
    if isinstance(value, AbstractAsyncContextManager):
        return await stack.enter_async_context(
            cast(AbstractAsyncContextManager[object], value)
        )
    if callable(value):
        return await _resolve(value(), stack)
    if isinstance(value, Awaitable):
        return await cast(Awaitable[object], value)
    return value
