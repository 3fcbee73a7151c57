"""The upstream of a ``SharedDiscovery``: one iteration of the inner discovery,
with a fresh scan merged in for each late joiner; see docs/wool.rst."""

from __future__ import annotations

import contextlib
import contextvars
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
from ..._core.fanout import logger
from ..._core.iterators import aclose_iterator
from ..._core.synced import Synced
from ..._pooling.subscription import SubscriptionConsumer
from ..view import WorkerView
from ..view import shared_subscription
from ..workers import WorkerMap
from .portable import BY_CONSTRUCTOR
from .portable import Portable

#: Seconds a joiner's fresh scan stays open after it started or last changed
#: the known workers.
RESCAN_SETTLE = 0.25

#: Seconds the upstream of wool's discoveries, which never mark a listing's
#: end, has to find nothing new for its first listing to count as complete.
LISTING_QUIET = RESCAN_SETTLE

#: Events readers may hand on past what the iteration took (the read-ahead).
BUFFER = 64


def _key(cls: type, portable: Portable) -> object:
    return portable.key


@final
class UpstreamView(WorkerView):
    """The worker view of an upstream's entry: a join starts a fresh scan,
    unless one yet to start covers it."""

    __slots__ = ("rescans", "upstream")

    def __init__(self, raw: Any) -> None:
        super().__init__(raw)
        self.upstream = raw
        #: Fresh scans started for joiners.
        self.rescans = 0

    def joined(self) -> None:
        upstream = self.upstream
        if upstream.send is not None and not upstream.pending:
            self.rescans += 1
            upstream.start(_Reader(main=False))


@shared_subscription(key=_key, read_ahead=BUFFER, view=UpstreamView)
class Upstream:
    """The unfiltered subscription to one inner discovery with given options:
    ``inner.subscribe(**options)`` iterated by a reader task, and by one more
    for each fresh scan. Readers merge what they read into one ``WorkerMap``
    and hand on only what changed it; the first reader's end or failure ends
    the iteration, a fresh scan's is logged. See docs/wool.rst.
    """

    def __init__(self, portable: Portable) -> None:
        self.inner: Any = portable.discovery
        self.options = portable.options
        self.send: MemoryObjectSendStream[Any] | None = None  # while iterating
        self.readers: set[_Reader] = set()
        self.pending = False  # a reader has not started its scan yet

    async def __aiter__(self) -> AsyncGenerator[Any, None]:
        self.send, receive = anyio.create_memory_object_stream[Any](BUFFER)
        self.known = WorkerMap()
        self.loop = current_loop()
        self.context = contextvars.copy_context()
        self.start(_Reader(main=True))
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
                yield item  # (a Synced again is taken in as a no-op)
                if type(item) is Synced:
                    until = math.inf
                elif until != math.inf:
                    until = anyio.current_time() + LISTING_QUIET
        finally:
            self.send = None
            receive.close()  # a reader handing on an event gives up
            readers = list(self.readers)
            for reader in readers:
                reader.scope.cancel()
            with anyio.CancelScope(shield=True):
                for reader in readers:
                    await reader.done.wait()

    def start(self, reader: _Reader) -> None:
        self.pending = True
        self.readers.add(reader)
        # In a wool subscriber pool of its own, a reader scans afresh.
        context = self.context.copy()
        context.run(__subscriber_pool__.set, None)
        self.loop.spawn(self._read, reader, cast(Any, self.send), context=context)

    async def _read(self, reader: _Reader, send: MemoryObjectSendStream[Any]) -> None:
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
                    await self._forward(reader, iterator, send)
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
                await send.send(reader)
        elif reader.error is not None and self.send is send:  # still running
            logger.warning("a rescan of %r failed: %r", self.inner, reader.error)

    async def _forward(
        self,
        reader: _Reader,
        iterator: AsyncIterator[Any],
        send: MemoryObjectSendStream[Any],
    ) -> None:
        """Merge each item as it is read, and hand on in order what changed
        the known workers (and the first reader's other items)."""
        relayed = None
        if reader.main and isinstance(iterator, SubscriptionConsumer):
            relayed = iterator
            self.loop.spawn(_relay, reader, relayed, send)
        apply, send_nowait = self.known.apply, send.send_nowait
        try:
            async for item in iterator:
                if isinstance(item, DiscoveryEvent):
                    item = apply(item)
                    if item is not None and not reader.main:  # keep it open
                        reader.scope.deadline = anyio.current_time() + RESCAN_SETTLE
                elif not reader.main:
                    item = None
                if item is not None:
                    try:  # into the buffer, without a checkpoint per event
                        send_nowait(item)
                    except anyio.WouldBlock:
                        # Merged already: handed on even if the reader closes.
                        reader.busy = True
                        with anyio.CancelScope(shield=True):
                            await send.send(item)
                        reader.busy = False
                if relayed is not None and relayed.synced and not reader.marked:
                    await reader.mark(send)
        finally:
            reader.relay.cancel()


@final
class _Reader:
    """One iteration of ``inner.subscribe(**options)``, in a task of its own."""

    __slots__ = ("busy", "done", "error", "main", "marked", "relay", "scope")

    def __init__(self, main: bool) -> None:
        self.main = main
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.error: Exception | None = None  # what ended its iteration
        self.relay = anyio.CancelScope()  # of _relay, over a shared subscription
        self.busy = False  # waiting to hand on an event
        self.marked = False

    async def mark(self, send: MemoryObjectSendStream[Any]) -> None:
        self.marked = True
        with contextlib.suppress(anyio.BrokenResourceError):
            await send.send(Synced())


async def _relay(
    reader: _Reader,
    consumer: SubscriptionConsumer[Any],
    send: MemoryObjectSendStream[Any],
) -> None:
    """Hand on :class:`~wool_pooling.Synced` once ``consumer`` (a shared
    subscription's, whose consumers never see the marker) is synced, unless
    ``reader``, holding an event, will after it."""
    with reader.relay:
        await consumer.wait_synced()
        if consumer.synced and not reader.busy and not reader.marked:
            await reader.mark(send)


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
