"""What constructing a decorated class returns, the consumers it hands out,
and how its raw, unpooled instance is built."""

from __future__ import annotations

import contextlib
import uuid
from collections import deque
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from typing import Any
from typing import Generic
from typing import TypeVar
from typing import final

import anyio
import anyio.lowlevel
import attrs
import cloudpickle

from .._core.fanout import FanoutConsumer
from .._core.fanout import Lagged
from .pool import CONFIG_ATTRIBUTE
from .pool import Entry
from .pool import SubscriptionConfig
from .pool import SubscriptionPool
from .pool import SubscriptionStatistics
from .pool import attach
from .pool import current_pool
from .pool import find_entry
from .restart import RestartPolicy
from .view import View

__all__ = ["SharedSubscription", "SubscriptionConsumer"]

#: The item type of a subscription: what its class's ``__aiter__`` yields.
T_co = TypeVar("T_co", covariant=True)


@final
@attrs.define(unsafe_hash=True, repr=False)
class SharedSubscription(Generic[T_co]):
    """What ``Cls(*args, **kwargs)`` returns for a decorated class: its
    class, key and arguments, nothing built.

    Each ``__aiter__()`` returns an independent :class:`SubscriptionConsumer`;
    those of one (class, key) in one :class:`SubscriptionPool` share one raw
    instance and one iteration of it. Equality and hash follow (class, key).
    Pickles by calling the class again with the same arguments (cloudpickle
    if the class is not importable; a :exc:`TypeError` names the class if
    that fails). See :doc:`guarantees`.
    """

    _cls: type
    _key: Hashable
    _args: tuple[Any, ...] = attrs.field(eq=False)
    _kwargs: dict[str, Any] = attrs.field(eq=False)
    #: Whether cloudpickle was found to pickle it.
    _checked: bool = attrs.field(default=False, init=False, eq=False)
    #: The consumer :meth:`wait_synced` left holding the entry.
    _held: SubscriptionConsumer[T_co] | None = attrs.field(
        default=None, init=False, eq=False
    )

    @property
    def cls(self) -> type:
        """The decorated class (or subclass) that was constructed."""
        return self._cls

    @property
    def key(self) -> Hashable:
        """The key computed at construction; entries are per (class, key)."""
        return self._key

    @property
    def args(self) -> tuple[Any, ...]:
        """Positional constructor arguments."""
        return self._args

    @property
    def kwargs(self) -> dict[str, Any]:
        """Keyword constructor arguments (a copy)."""
        return dict(self._kwargs)

    @property
    def ttl(self) -> float:
        """Seconds an entry is kept after its last consumer is released."""
        return self._config().ttl

    @property
    def restart(self) -> RestartPolicy | None:
        """How the raw stream is restarted when it fails, if at all."""
        return self._config().restart

    @property
    def max_lag(self) -> int | None:
        """Events a consumer may fall behind before it is resynchronised."""
        return self._config().max_lag

    def _config(self) -> SubscriptionConfig:
        return getattr(self._cls, CONFIG_ATTRIBUTE)

    def workers(self) -> Mapping[uuid.UUID, Any]:
        """A read-only snapshot of the workers the live entry of this
        subscription in the current pool knows: what a consumer joining now
        is replayed. Empty when no entry is live (or no event loop runs
        here), and for a view that holds no workers. Starts nothing; see
        :ref:`synced`.
        """
        view = None
        with contextlib.suppress(RuntimeError):  # no event loop runs here
            view = self.view()
        return (View[Any]() if view is None else view).snapshot()

    async def wait_synced(self) -> None:
        """Wait until the shared view holds the source's whole first listing,
        for :meth:`workers`. A consumer that does not read then holds the
        entry open until this object is dropped (or waits again).
        See :ref:`synced`.

        :raises RuntimeError: if the current pool is closed.
        :raises Exception: the source's error, if it fails before its
            listing is complete.
        """
        # An equal twin's consumer: no cycle with this object, whose release
        # then releases it at once.
        consumer = await aiter(attrs.evolve(self)).__aenter__()  # joins
        try:
            error = await _pull_listing(consumer._entry)
            if error is not None:
                raise error
        except BaseException:
            await consumer.aclose()
            raise
        self._held = consumer  # its finaliser releases the entry

    def view(self, pool: SubscriptionPool | None = None) -> View[Any] | None:
        """The view of the live entry of this subscription in ``pool``
        (by default the current pool), or ``None`` if no entry is live.

        :param pool: The pool to look in; by default :func:`~wool_pooling.current_pool`.
        :raises RuntimeError: if ``pool`` is omitted and no pool is current
            and no event loop is running.
        """
        entry = (pool or current_pool())._entries.get((self._cls, self._key))
        if entry is None or entry.fanout.finished:
            return None
        return entry.source.view

    def statistics(
        self, pool: SubscriptionPool | None = None
    ) -> SubscriptionStatistics:
        """Return a snapshot of what the entry iterating this subscription in
        ``pool`` counted (all zeros without one), from the pool's event loop,
        in O(consumers); see :doc:`metrics`.

        :param pool: The pool to look in; by default :func:`~wool_pooling.current_pool`.
        :raises RuntimeError: if ``pool`` is omitted and no pool is current
            and no event loop is running.
        """
        entry = find_entry(pool or current_pool(), (self._cls, self._key))
        return SubscriptionStatistics() if entry is None else entry.statistics()

    def __aiter__(self) -> SubscriptionConsumer[T_co]:
        return SubscriptionConsumer(self)

    def __reduce__(self) -> tuple[Any, ...]:
        if not self._checked:  # pickled again and again by wool: checked once
            try:
                cloudpickle.dumps((self._cls, self._args, self._kwargs))  # pyright: ignore[reportUnknownMemberType]
            except Exception as error:
                raise TypeError(
                    f"cannot pickle a {self._cls.__qualname__} subscription: {error}"
                ) from error
            self._checked = True
        return (_construct, (self._cls, self._args, self._kwargs))

    def __repr__(self) -> str:
        return f"SharedSubscription({self._cls.__qualname__}, key={self._key!r})"

    def _build_raw(self) -> Any:
        """Build what ``cls(*args, **kwargs)`` would be without pooling (this
        library's or wool's)."""
        cls, args, kwargs = self._cls, self._args, self._kwargs
        new = _unpooled_new(cls)
        instance = new(cls) if new is object.__new__ else new(cls, *args, **kwargs)
        if isinstance(instance, cls):
            cls.__init__(instance, *args, **kwargs)
        return instance


def _unpooled_new(cls: type) -> Callable[..., Any]:
    for klass in cls.__mro__:
        namespace = vars(klass)
        config = namespace.get(CONFIG_ATTRIBUTE)
        candidate = config.own_new if config is not None else namespace.get("__new__")
        if isinstance(candidate, staticmethod):
            candidate = candidate.__func__  # type: ignore[reportUnknownMemberType]
        if candidate is not None and not _is_pooling(candidate):
            return candidate  # type: ignore[no-any-return]
    return object.__new__


def _is_pooling(new: object) -> bool:
    # wool's SubscriberMeta injects its own pooling __new__ into every class
    # it creates; building a raw instance must go around it.
    return bool(getattr(new, "__wool_pooling__", False)) or (
        getattr(new, "__module__", None) == "wool.runtime.discovery.pool"
    )


def _construct(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Unpickle a :class:`SharedSubscription` by constructing its class again."""
    return cls(*args, **kwargs)


@final
@attrs.define(eq=False, repr=False)
class SubscriptionConsumer(Generic[T_co]):
    """One consumer of a :class:`SharedSubscription`, from its ``__aiter__()``.

    Joins at ``async with``, :meth:`wait_synced` or its first ``__anext__``:
    it attaches to its key's entry in the current pool (building the raw
    instance if needed), is replayed the entry's view (one ``worker-added``
    per known worker), then receives the live items: no gap, no duplicate.
    One more than ``max_lag`` items behind is caught up by the view
    (:ref:`lag`). Cancelling a pending ``__anext__`` ends it and releases its
    reference; so do the source's end or error, :meth:`aclose`, and garbage
    collection (in any thread). One task at a time may wait on it. See
    :doc:`guarantees`.

    :raises RuntimeError: from joining if the current pool is closed, or
        from ``__anext__`` if the consumer joined under another event loop.
    :raises ~anyio.BusyResourceError: from ``__anext__`` if another task
        waits on it.
    :raises Lagged: from ``__anext__``, when it fell behind and its view
        cannot catch it up.
    """

    _subscription: SharedSubscription[T_co]
    _entry: Entry | None = attrs.field(default=None, init=False)
    _consumer: FanoutConsumer[Any] | None = attrs.field(default=None, init=False)
    #: A replay or catch-up, read first.
    _replay: deque[Any] | None = attrs.field(default=None, init=False)
    #: What it had seen as it fell behind.
    _seen: deque[object] | None = attrs.field(default=None, init=False)
    _skipped: int = attrs.field(default=0, init=False)
    _ended: bool = attrs.field(default=False, init=False)
    #: Once found synced, it stays so.
    _synced: bool = attrs.field(default=False, init=False)

    @property
    def subscription(self) -> SharedSubscription[T_co]:
        """The subscription this consumer iterates."""
        return self._subscription

    def __aiter__(self) -> SubscriptionConsumer[T_co]:
        return self

    async def __anext__(self) -> T_co:
        consumer = self._consumer
        if consumer is None:
            consumer = self._join()
            if consumer is None:
                raise StopAsyncIteration
        replay = self._replay
        if replay is not None and not consumer.closed:
            item = replay.popleft()
            if not replay:
                self._replay = None
            return item
        try:
            if consumer.buffered:  # an item (or a lag) without a wait
                return consumer.receive_nowait()
            # Nothing yet, or the end: the source's error as it is.
            return await consumer.__anext__()
        except Exception as error:
            return await self._failed(consumer, error)
        except BaseException:
            await self._release()  # a cancellation: this consumer ends
            raise

    async def _failed(self, consumer: FanoutConsumer[Any], error: Exception) -> T_co:
        """What ``consumer``'s read raised: a lag (caught up by the view, see
        :ref:`lag`, or raised), or an end, this consumer's."""
        entry = self._entry
        if isinstance(error, Lagged) and entry is not None:
            self._skipped += entry.counters.skipped(error.skipped, resync=False)
            seen = self._seen
            catch_up = entry.source.view.catch_up(seen.pop()) if seen else None
            if catch_up is None:
                raise error
            self._replay = deque(catch_up) or None
            skipped = consumer.skip_buffered()  # what the catch-up stands in for
            self._skipped += entry.counters.skipped(skipped, resync=True)
            return await self.__anext__()
        if isinstance(error, (anyio.BusyResourceError, RuntimeError)) and not (
            consumer.closed  # (a closed one met the source's error)
        ):
            raise error  # another task waits, or another loop: not ours to end
        await self._release()  # the end, or the source's error, whatever its type
        raise error

    @property
    def synced(self) -> bool:
        """Whether this consumer has been handed the whole first listing (its
        replay, and every item up to the end of the listing if it was not over
        when it joined); once true, it stays true. See :ref:`synced`.
        """
        consumer = self._consumer
        entry = self._entry
        if self._synced or consumer is None or entry is None or self._replay:
            return self._synced
        source = entry.source
        listed = source.listed_at
        self._synced = listed is not None and source.count - consumer.buffered >= listed
        return self._synced

    async def wait_synced(self) -> None:
        """Join, and wait until the whole first listing has reached this
        consumer (handed, or held for its next reads; :attr:`synced` turns
        true as they return it), or the source has ended or failed. Pulls
        the source meanwhile. Cancel-safe; any number of tasks may wait. See
        :ref:`synced`.

        :raises RuntimeError: if the current pool is closed.
        """
        await anyio.lowlevel.checkpoint()
        self._join()
        await _pull_listing(self._entry)

    def _join(self) -> FanoutConsumer[Any] | None:
        """Join, unless joined or ended: its fan-out consumer, if any."""
        if self._consumer is not None or self._ended:
            return self._consumer
        subscription = self._subscription
        entry = attach(
            current_pool(),
            (subscription.cls, subscription.key),
            subscription._config(),
            subscription._build_raw,
            repr(subscription),
        )
        self._entry = entry
        view = entry.source.view
        seen = self._seen = deque[object](maxlen=1)  # (no reference back to self)
        # Registered and replayed in one step: no gap, no duplicate.
        consumer = self._consumer = entry.fanout.consumer(
            on_skip=lambda position: seen.append(view.seen_at(position))
        )
        self._replay = deque(view.replay()) or None
        entry.counters.join(consumer, self._replay is not None)
        view.joined()
        return consumer

    async def aclose(self) -> None:
        """End this consumer and release its reference. Idempotent."""
        await self._release()
        await anyio.lowlevel.checkpoint_if_cancelled()

    async def __aenter__(self) -> SubscriptionConsumer[T_co]:
        self._join()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _release(self) -> None:
        _ = self.synced  # as it stood before the end (it stays so)
        self._ended = True
        consumer, self._consumer = self._consumer, None
        entry, self._entry = self._entry, None  # an ended consumer pins nothing
        self._replay = self._seen = None
        if consumer is not None and entry is not None:
            entry.counters.leave(consumer, entry.fanout)
            consumer.close()
            await entry.release()

    def __del__(self) -> None:
        consumer = getattr(self, "_consumer", None)
        if consumer is None:
            return
        # Dropping the fan-out consumer ends it (its own finaliser hands the
        # leave to the loop's thread if need be).
        self._consumer = None
        entry = self._entry
        assert entry is not None
        entry.counters.leave(consumer, entry.fanout)
        del consumer
        entry.release_soon()

    @property
    def lag(self) -> int:
        """How many items of the shared stream this consumer is behind:
        logged, not yet read (at most ``max_lag``; what its view hands it
        first, a replay or a catch-up, aside). See :ref:`lag`. Constant time.
        """
        consumer = self._consumer
        return 0 if consumer is None else consumer.buffered

    @property
    def skipped(self) -> int:
        """How many items of the shared stream this consumer never received
        because it fell behind: those a :exc:`Lagged` reported, and those its
        view's catch-up stood in for. See :ref:`lag`."""
        return self._skipped

    def __repr__(self) -> str:
        if self._ended:
            state = "ENDED"
        elif self._consumer is None:
            state = "NOT STARTED"
        else:
            state = f"ACTIVE, replay: {len(self._replay or ())}"
        return f"<SubscriptionConsumer [{state}] of {self._subscription!r}>"


async def _pull_listing(entry: Entry | None) -> Exception | None:
    """Read ``entry``'s fan-out (an ended consumer has none) until its
    source's first listing is complete or the source has ended; the source's
    error if it failed first."""
    if entry is None or entry.source.listed_at is not None or entry.fanout.finished:
        return None
    failed: list[Exception] = []
    reader = entry.fanout.consumer()

    async def pull() -> None:
        try:
            with contextlib.suppress(StopAsyncIteration):  # the source's end
                while True:
                    with contextlib.suppress(Lagged):  # what it missed is not needed
                        await reader.__anext__()
        except Exception as error:
            failed.append(error)
        group.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(pull)
            await entry.source.listed.wait()
            group.cancel_scope.cancel()
    finally:
        reader.close()
    return failed[0] if failed else None
