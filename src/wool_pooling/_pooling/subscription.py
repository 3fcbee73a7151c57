"""What constructing a decorated class returns, and the consumers it hands out."""

from __future__ import annotations

import types
import uuid
from collections import deque
from collections.abc import Hashable
from collections.abc import Mapping
from typing import Any
from typing import Generic
from typing import TypeVar
from typing import cast
from typing import final

import anyio
import anyio.lowlevel
import cloudpickle

from .._core.fanout import FanoutConsumer
from .._core.fanout import Lagged
from .construction import CONFIG_ATTRIBUTE
from .construction import SubscriptionConfig
from .construction import build_raw
from .pool import Entry
from .pool import SubscriptionPool
from .pool import attach
from .pool import current_pool
from .pool import find_entry
from .restart import RestartPolicy
from .statistics import SubscriptionStatistics
from .view import View

__all__ = ["SharedSubscription", "SubscriptionConsumer"]

#: The item type of a subscription: what its class's ``__aiter__`` yields.
T_co = TypeVar("T_co", covariant=True)


@final
class SharedSubscription(Generic[T_co]):
    """What ``Cls(*args, **kwargs)`` returns for a decorated class: its
    class, key and arguments, nothing built.

    Each ``__aiter__()`` returns an independent :class:`SubscriptionConsumer`;
    all consumers of the same (class, key) in the same
    :class:`SubscriptionPool` share one raw instance and one iteration of it.
    Equality and hash follow (class, key). Pickles by calling the class again
    with the same arguments (plain ``pickle`` when the class is importable,
    cloudpickle otherwise); a :exc:`TypeError` then names the class, caused
    by the pickler's own error. See :doc:`guarantees`.
    """

    __slots__ = ("__weakref__", "_args", "_checked", "_cls", "_key", "_kwargs")

    def __init__(
        self, cls: type, key: Hashable, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._cls = cls
        self._key = key
        self._args = args
        self._kwargs = kwargs
        self._checked = False  # whether cloudpickle was found to pickle it

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
        """The workers this subscription's shared source knows now: a
        read-only snapshot, taken now, of what a consumer joining now would
        be replayed (see :ref:`synced`).

        Read from the live entry in the current pool; empty when none is
        live (nothing iterates it, its source ended, or no event loop runs
        here), and for a view that holds no workers. Starts nothing.
        """
        try:
            view = self.view()
        except RuntimeError:  # no event loop runs here
            view = None
        return types.MappingProxyType({}) if view is None else view.snapshot()

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
        ``pool`` counted (all zeros without one); see :doc:`metrics`.

        Call it from the pool's event loop. O(consumers).

        :param pool: The pool to look in; by default :func:`~wool_pooling.current_pool`.
        :raises RuntimeError: if ``pool`` is omitted and no pool is current
            and no event loop is running.
        """
        entry = find_entry(pool or current_pool(), (self._cls, self._key))
        if entry is None:
            return SubscriptionStatistics()
        return entry.counters.snapshot(entry.refs, entry.source)

    def __aiter__(self) -> SubscriptionConsumer[T_co]:
        return SubscriptionConsumer(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SharedSubscription):
            return NotImplemented
        theirs = cast("SharedSubscription[object]", other)
        return self._cls is theirs._cls and self._key == theirs._key

    def __hash__(self) -> int:
        return hash((self._cls, self._key))

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
        return build_raw(self._cls, self._args, self._kwargs)


def _construct(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Unpickle a :class:`SharedSubscription` by constructing its class again."""
    return cls(*args, **kwargs)


@final
class SubscriptionConsumer(Generic[T_co]):
    """One consumer of a :class:`SharedSubscription`, from its ``__aiter__()``.

    Joins at its first ``__anext__``: it attaches to the entry of its key in
    the current pool (building the raw instance if needed), receives the
    entry view's replay (one ``worker-added`` per known worker), then the
    live items: no gap, no duplicate. A consumer more than ``max_lag`` items
    behind is caught up by the view (:ref:`lag`). Cancelling a pending
    ``__anext__`` ends this consumer and releases its reference; so do the
    source's end or error, :meth:`aclose`, and garbage collection (in any
    thread). One task at a time may wait on it. See :doc:`guarantees`.

    :raises RuntimeError: from ``__anext__`` if the current pool is closed,
        or if the consumer joined under another event loop.
    :raises ~anyio.BusyResourceError: from ``__anext__`` if another task
        waits on it.
    :raises Lagged: from ``__anext__``, when it fell behind and its view
        cannot catch it up.
    """

    __slots__ = (
        "_consumer",
        "_ended",
        "_entry",
        "_replay",
        "_seen",
        "_skipped",
        "_subscription",
        "_sync_event",
        "_synced",
    )

    def __init__(self, subscription: SharedSubscription[T_co]) -> None:
        self._subscription = subscription
        self._entry: Entry | None = None
        self._consumer: FanoutConsumer[Any] | None = None
        # Items to return before reading the log: the join's replay, or a
        # catch-up.
        self._replay: deque[Any] | None = None
        # What it had seen when it fell behind, for its catch-up (with a lag
        # bound).
        self._seen: _Seen | None = None
        self._skipped = 0
        self._ended = False
        # Whether it was found synced (it stays so), and what wait_synced()
        # waits on meanwhile.
        self._synced = False
        self._sync_event: anyio.Event | None = None

    @property
    def subscription(self) -> SharedSubscription[T_co]:
        """The subscription this consumer iterates."""
        return self._subscription

    def __aiter__(self) -> SubscriptionConsumer[T_co]:
        return self

    async def __anext__(self) -> T_co:
        consumer = self._consumer
        if consumer is None:
            if self._ended:
                raise StopAsyncIteration
            consumer = self._join()
            if self._sync_event is not None:
                self._wake_if_synced()
        while True:
            replay = self._replay
            if replay is not None and not consumer.closed:
                item = replay.popleft()
                if not replay:
                    self._replay = None
            else:
                try:
                    if consumer.buffered:  # an item (or a lag) without a wait
                        item = consumer.receive_nowait()
                    else:  # nothing yet, or the end: the source's error as it is
                        item = await consumer.__anext__()
                except StopAsyncIteration:
                    await self._release()
                    raise
                except Exception as error:
                    return await self._failed(consumer, error)
                except BaseException:
                    await self._release()  # a cancellation: this consumer ends
                    raise
            if self._sync_event is not None:
                self._wake_if_synced()
            return item

    async def _failed(self, consumer: FanoutConsumer[Any], error: Exception) -> T_co:
        """What ``consumer``'s read raised: a lag (caught up, or raised), or
        an end, this consumer's."""
        if isinstance(error, Lagged):
            assert self._entry is not None
            self._entry.counters.skipped(error.skipped)
            self._skipped += error.skipped
            if self._catch_up(consumer):
                return await self.__anext__()
            raise error
        if isinstance(error, (anyio.BusyResourceError, RuntimeError)) and not (
            consumer.closed  # (a closed one met the source's error)
        ):
            raise error  # another task waits, or another loop: not ours to end
        await self._release()  # the source's error, whatever its type
        raise error

    @property
    def synced(self) -> bool:
        """Whether this consumer has been handed the whole first listing (its
        replay and, if the source's first :class:`~wool_pooling.Synced` had
        not come when it joined, every item up to it); once true, it stays
        true. See :ref:`synced`. Constant time.
        """
        if self._synced:
            return True
        consumer = self._consumer
        entry = self._entry
        if consumer is None or entry is None or self._replay is not None:
            return False
        source = entry.source
        listed = source.listed_at
        if listed is None or source.count - consumer.buffered < listed:
            return False
        self._synced = True
        return True

    async def wait_synced(self) -> None:
        """Wait until :attr:`synced` is true, or this consumer has ended.

        Reads nothing itself: call it from a task other than the one
        iterating. Cancel-safe; any number of tasks may wait. See :ref:`synced`.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        while not self.synced and not self._ended:
            event = self._sync_event
            if event is None or event.is_set():
                event = self._sync_event = anyio.Event()
            self._wake_if_synced()  # or be woken at the listing's end
            await event.wait()
        await anyio.lowlevel.cancel_shielded_checkpoint()

    def _wake_if_synced(self) -> None:
        """Wake the tasks in :meth:`wait_synced` if this consumer is now
        synced (or has ended)."""
        event = self._sync_event
        if event is None:
            return
        entry = self._entry
        if self._ended or self.synced:
            self._sync_event = None
            event.set()
            if entry is not None:
                entry.source.forget_listed(event)
            return
        if entry is not None and entry.source.listed_at is None:
            entry.source.notify_listed(event)  # woken at the listing's end

    def _catch_up(self, consumer: FanoutConsumer[Any]) -> bool:
        """Replace the items this consumer missed by its view's catch-up to
        the log's end, if the view has one (see :ref:`lag`)."""
        entry = self._entry
        seen = self._seen
        assert entry is not None
        if seen is None:
            return False
        catch_up = entry.source.view.catch_up(seen.state)
        seen.state = None
        if catch_up is None:
            return False
        self._replay = deque(catch_up) or None
        skipped = consumer.skip_buffered()
        entry.counters.skipped(skipped, resync=True)
        self._skipped += skipped
        return True

    def _join(self) -> FanoutConsumer[Any]:
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
        seen = None
        if subscription.max_lag is not None:
            seen = self._seen = _Seen(view)
        # Registered and replayed in one step: no gap, no duplicate.
        consumer = self._consumer = entry.fanout.consumer(on_skip=seen)
        self._replay = deque(view.replay()) or None
        entry.counters.join(consumer, self._replay is not None)
        view.joined()
        return consumer

    async def aclose(self) -> None:
        """End this consumer and release its reference. Idempotent."""
        await self._release()
        await anyio.lowlevel.checkpoint_if_cancelled()

    async def __aenter__(self) -> SubscriptionConsumer[T_co]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _release(self) -> None:
        _ = self.synced  # as it stood before the end (it stays so)
        self._ended = True
        self._wake_if_synced()
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


@final
class _Seen:
    """Takes what a :class:`SubscriptionConsumer` had seen from its view, as
    it falls behind (the fan-out's ``on_skip``), until its catch-up."""

    __slots__ = ("state", "view")

    def __init__(self, view: View[Any]) -> None:
        self.view = view
        self.state: object = None

    def __call__(self, position: int) -> None:
        self.state = self.view.seen_at(position)
