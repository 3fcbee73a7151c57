"""``SharedDiscovery`` and its counted context manager; see docs/wool.rst."""

from __future__ import annotations

import operator
import threading
import types
import uuid
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from contextlib import AbstractContextManager
from typing import Any
from typing import Protocol
from typing import cast
from typing import final
from typing import overload

import anyio
import attrs
from wool import DiscoveryEvent
from wool import DiscoveryLike
from wool import DiscoveryPublisherLike
from wool import WorkerMetadata

from ..._core.signatures import check_keywords
from ..._pooling.pool import SubscriptionPool
from ..._pooling.pool import SubscriptionStatistics
from ..._pooling.subscription import SharedSubscription
from ..afilter import afilter
from .merge import Upstream
from .merge import UpstreamView
from .portable import Portable

__all__ = ["SharedDiscovery", "SharedDiscoveryStatistics", "SyncSharedDiscovery"]


@attrs.frozen
class SharedDiscoveryStatistics(SubscriptionStatistics):
    """What :meth:`SharedDiscovery.statistics` returns: the
    :class:`~wool_pooling.SubscriptionStatistics` of its upstream, and:"""

    #: Fresh scans of the inner discovery started for joining consumers.
    rescans: int = 0


class _SyncContextDiscovery(DiscoveryLike, Protocol):
    """A discovery that is a synchronous context manager."""

    def __enter__(self) -> object: ...

    def __exit__(self, *exc_info: object) -> bool | None: ...


@attrs.define(init=False, unsafe_hash=True)
class SharedDiscovery:
    """A wool ``DiscoveryLike`` whose subscribers share one upstream per
    (inner discovery, options) in a :class:`~wool_pooling.SubscriptionPool`.

    Entering is counted: the first enter enters ``inner``, the last exit
    exits it. Over a synchronous context manager the constructor returns a
    :class:`SyncSharedDiscovery`. See :doc:`wool`.

    :param inner: The wool discovery to wrap.
    :param subscribe_options: Keyword arguments for ``inner.subscribe``,
        hashable: they are part of the upstream's key.
    :raises TypeError: if ``inner`` has no callable ``subscribe``, if the
        options do not bind to it or do not hash, or if nothing of ``inner``
        can travel to another process.
    """

    #: The one record of its arguments: equality and hash follow its key.
    _portable: Portable = attrs.field(eq=operator.attrgetter("key"))
    _entered: int = attrs.field(default=0, init=False, eq=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, eq=False)
    _transition: anyio.Event | None = attrs.field(default=None, init=False, eq=False)

    @overload
    def __new__(
        cls, inner: _SyncContextDiscovery, /, **subscribe_options: Hashable
    ) -> SyncSharedDiscovery: ...

    @overload
    def __new__(
        cls, inner: DiscoveryLike, /, **subscribe_options: Hashable
    ) -> SharedDiscovery: ...

    def __new__(cls, inner: Any, /, **subscribe_options: Hashable) -> SharedDiscovery:
        sync = isinstance(inner, AbstractContextManager)
        if cls is SharedDiscovery and sync:
            cls = SyncSharedDiscovery
        elif cls is SyncSharedDiscovery and not sync:
            raise TypeError(
                "SyncSharedDiscovery needs a discovery that is a synchronous "
                f"context manager, got {type(inner).__name__}"
            )
        return object.__new__(cls)

    def __init__(self, inner: DiscoveryLike, /, **subscribe_options: Hashable) -> None:
        if not callable(getattr(inner, "subscribe", None)):
            raise TypeError(
                "SharedDiscovery wraps a wool discovery (with publisher and "
                f"subscribe), got {type(inner).__name__}: {inner!r}"
            )
        # Before anything calls subscribe (shipping a subscriber does).
        check_keywords(
            cast(Any, inner).subscribe,
            subscribe_options,
            f"SharedDiscovery: {type(inner).__qualname__}.subscribe()",
        )
        options = tuple(sorted(subscribe_options.items()))
        try:
            hash(options)
        except TypeError as error:
            raise TypeError(
                f"SharedDiscovery subscribe options must be hashable, got {options!r}"
            ) from error
        self.__attrs_init__(Portable.of(inner, options))  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]

    @property
    def inner(self) -> DiscoveryLike:
        """The wrapped discovery."""
        return self._portable.discovery

    @property
    def subscribe_options(self) -> dict[str, Hashable]:
        """The keyword arguments passed to ``inner.subscribe`` (a copy)."""
        return dict(self._portable.options)

    @property
    def entered(self) -> int:
        """How many enters are not yet matched by an exit."""
        return self._entered

    @property
    def publisher(self) -> DiscoveryPublisherLike:
        """``inner.publisher``, read anew on each access."""
        return self.inner.publisher

    @property
    def subscriber(self) -> SharedSubscription[DiscoveryEvent]:
        """The unfiltered pooled subscription; same as ``subscribe()``."""
        return self.subscribe()

    @overload
    def subscribe(self, filter: None = None) -> SharedSubscription[DiscoveryEvent]: ...

    @overload
    def subscribe(self, filter: Callable[[WorkerMetadata], bool]) -> afilter: ...

    @overload  # what wool's DiscoveryLike protocol calls
    def subscribe(
        self, filter: Callable[[WorkerMetadata], bool] | None = None
    ) -> SharedSubscription[DiscoveryEvent] | afilter: ...

    def subscribe(
        self, filter: Callable[[WorkerMetadata], bool] | None = None
    ) -> SharedSubscription[DiscoveryEvent] | afilter:
        """The upstream's :class:`~wool_pooling.SharedSubscription`, or an
        :class:`~wool_pooling.afilter` over it.

        :param filter: Whether a worker appears in this stream; ``None``: all.
        """
        upstream = Upstream(self._portable)
        return upstream if filter is None else afilter(filter, upstream)

    def workers(
        self, *, filter: Callable[[WorkerMetadata], bool] | None = None
    ) -> Mapping[uuid.UUID, WorkerMetadata]:
        """A read-only snapshot of the workers the upstream knows in the
        current pool, empty while nothing iterates it.

        :param filter: As for :meth:`subscribe`: only the workers it accepts.
        """
        view = self.subscribe().workers()
        if filter is None:
            return view
        return types.MappingProxyType(
            {uid: metadata for uid, metadata in view.items() if filter(metadata)}
        )

    def statistics(
        self, pool: SubscriptionPool | None = None
    ) -> SharedDiscoveryStatistics:
        """The upstream's counters in ``pool``, filtered consumers included.

        :param pool: The pool to look in; by default :func:`~wool_pooling.current_pool`.
        :raises RuntimeError: if ``pool`` is omitted and no event loop runs.
        """
        upstream = self.subscribe()
        view = upstream.view(pool)
        return SharedDiscoveryStatistics(
            **attrs.asdict(upstream.statistics(pool), recurse=False),
            rescans=view.rescans if isinstance(view, UpstreamView) else 0,
        )

    async def __aenter__(self) -> SharedDiscovery:
        inner = self.inner
        if isinstance(inner, AbstractContextManager):
            self._enter_sync()
            return self
        while self._transition is not None:  # entering or exiting ``inner``
            await self._transition.wait()
        if not self._entered and isinstance(inner, AbstractAsyncContextManager):
            enter = cast(AbstractAsyncContextManager[Any], inner).__aenter__()
            await self._switch(enter)
        self._entered += 1
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        inner = self.inner
        if isinstance(inner, AbstractContextManager):
            self._exit_sync(*exc_info)
            return
        if self._exit_count() and isinstance(inner, AbstractAsyncContextManager):
            exit = cast(AbstractAsyncContextManager[Any], inner).__aexit__(*exc_info)
            with anyio.CancelScope(shield=True):
                await self._switch(exit)

    async def _switch(self, step: Awaitable[object]) -> None:
        """Await ``inner``'s enter or exit; an enter meanwhile waits for it."""
        transition = self._transition = anyio.Event()
        try:
            await step
        finally:
            self._transition = None
            transition.set()

    def _enter_sync(self) -> None:
        with self._lock:
            if self._entered == 0:
                cast(AbstractContextManager[object], self.inner).__enter__()
            self._entered += 1

    def _exit_sync(self, *exc_info: Any) -> None:
        with self._lock:
            if self._exit_count():
                cast(AbstractContextManager[object], self.inner).__exit__(*exc_info)

    def _exit_count(self) -> bool:
        """Count an exit; whether it was the last.

        :raises RuntimeError: if there are more exits than enters.
        """
        if self._entered <= 0:
            raise RuntimeError(f"{self!r} was exited more often than entered")
        self._entered -= 1
        return not self._entered

    def __reduce__(self) -> tuple[Any, ...]:
        if self._portable.shipped is not None:
            name = type(self.inner).__qualname__
            raise TypeError(
                f"cannot pickle a SharedDiscovery of a {name}: only what its "
                "subscribe() returns travels, in the subscriptions it hands "
                f"out; add a __reduce__ to {name} that rebuilds it, unentered"
            )
        return (_restore, (self._portable,))

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self._portable.options)
        name = type(self).__name__
        return f"<{name}({self.inner!r}{options}) [entered: {self._entered}]>"


@final
class SyncSharedDiscovery(SharedDiscovery):
    """A :class:`SharedDiscovery` over a synchronous context manager (such as
    ``wool.LocalDiscovery``), itself one; both protocols share one count.

    :raises TypeError: if ``inner`` is not a synchronous context manager.
    """

    __slots__ = ()

    def __enter__(self) -> SyncSharedDiscovery:
        self._enter_sync()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._exit_sync(*exc_info)


def _restore(portable: Portable) -> SharedDiscovery:
    """Unpickle a :class:`SharedDiscovery`, unentered."""
    shared = SharedDiscovery.__new__(SharedDiscovery, portable.discovery)
    shared.__attrs_init__(portable)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
    return shared
