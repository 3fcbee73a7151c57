"""``SharedDiscovery``: the one-line way to give wool pools pooled subscriptions.

``WorkerPool(discovery=SharedDiscovery(wool.LocalDiscovery("ns")))`` makes
every proxy of every pool in a process (and, after pickling, in every worker
process) that subscribes to the same inner discovery with the same options
share ONE upstream subscription: one raw subscriber, one iteration of it,
multicast by this library's fan-out with late-joiner replay.

The data path: ``inner.subscribe(**options)`` is iterated once, by the
private :class:`_UpstreamSubscriber`, a ``@shared_subscription`` class keyed
by (inner discovery, options); each consumer's own predicate, if any, is
applied on top by :class:`~wool_pooling.afilter`, per consumer, so consumers
with different filters still share the upstream.
"""

from __future__ import annotations

import contextlib
import contextvars
import copyreg
import functools
import inspect
import logging
import pickle
import threading
import types
import uuid
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from contextlib import AbstractContextManager
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any
from typing import Protocol
from typing import cast
from typing import final
from typing import overload
from typing import runtime_checkable

import anyio
import cloudpickle
import wool
from anyio.streams.memory import MemoryObjectReceiveStream
from anyio.streams.memory import MemoryObjectSendStream
from wool import DiscoveryEvent
from wool import DiscoveryLike
from wool import DiscoveryPublisherLike
from wool import WorkerMetadata
from wool.runtime.discovery import __subscriber_pool__

from .._core.backend import EventLoop
from .._core.backend import current_loop
from .._core.iterators import aclose_iterator
from .._core.signatures import check_keywords
from .._core.synced import Synced
from .._pooling.construction import CONFIG_ATTRIBUTE
from .._pooling.construction import SubscriptionConfig
from .._pooling.decorator import shared_subscription
from .._pooling.pool import SubscriptionPool
from .._pooling.statistics import SubscriptionStatistics
from .._pooling.subscription import SharedSubscription
from .._pooling.subscription import SubscriptionConsumer
from .afilter import afilter
from .workers import WorkerMap

__all__ = ["SharedDiscovery", "SyncSharedDiscovery"]

logger = logging.getLogger("wool_pooling")

#: The options passed to the inner discovery's ``subscribe``, frozen.
Options = tuple[tuple[str, Hashable], ...]


@runtime_checkable
class _SyncContextDiscovery(DiscoveryLike, Protocol):
    """A discovery that is also a synchronous context manager (``LocalDiscovery``)."""

    def __enter__(self) -> object: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> bool | None: ...


class SharedDiscovery:
    """Wrap a wool discovery so that its subscribers share one upstream per process.

    ``SharedDiscovery(inner, **subscribe_options)`` is itself a wool
    ``DiscoveryLike``:

    - :attr:`publisher` is ``inner.publisher``, untouched.
    - :meth:`subscribe` and :attr:`subscriber` return pooled subscriptions.
      Within one :class:`~wool_pooling.SubscriptionPool` (by default, one per
      running event loop), all of them share ONE unfiltered upstream per
      (inner discovery, subscribe options): ``inner.subscribe(**options)`` is
      called and iterated once, whatever the number of consumers and filters.
      A consumer's ``filter`` is applied to its own view by
      :class:`~wool_pooling.afilter`. They get every guarantee of
      ``@shared_subscription``: late-joiner replay of the known workers, no
      gap and no duplicate, cancellation of one consumer never disturbing
      the others or the upstream, and the upstream closed once its last
      consumer is released.
    - A consumer that joins once the upstream runs sees every worker that
      exists when it joins, as a fresh raw subscriber would, whether or not
      the running upstream noticed it: its join has ``inner`` subscribed to
      once more, for a fresh scan merged into the stream and closed a
      quarter of a second after it last found something new. Only events
      that change the known workers are passed on: a repeated
      ``worker-added`` or a ``worker-updated`` with unchanged metadata
      (``LocalDiscovery`` repeats one per worker at every scan) is not.
    - :meth:`workers` reads the upstream's view (a snapshot), and each
      consumer's :attr:`~wool_pooling.SubscriptionConsumer.synced` says
      when it has been handed the upstream's first listing. An inner
      subscriber that yields :class:`~wool_pooling.Synced` (or is itself a
      shared subscription, such as ``RedisDiscovery``'s, whose ``synced``
      is relayed) marks that end itself; wool's ``LocalDiscovery`` and
      ``LanDiscovery`` never do, so the first listing is taken to be over
      once the upstream has found nothing new for a quarter of a
      second (an estimate: a worker reported later arrives as a live
      event); around any other discovery no consumer is ever synced. A
      consumer joining after that end is synced once handed its replay.
    - ``subscribe_options`` are passed to ``inner.subscribe`` as keywords,
      for example ``poll_interval=0.2`` for ``wool.LocalDiscovery``. They
      must be hashable: they are part of the upstream's key. They are
      checked against ``inner.subscribe``'s signature here, before anything
      else, so a misspelt one fails at construction, not at the first
      dispatch.

    **Identity of the upstream.** The upstream is keyed by the options and,
    for wool's ``LocalDiscovery`` and ``LanDiscovery``, by their class and
    constructor arguments (two instances of one namespace and settings,
    including copies unpickled in a worker process, share one upstream;
    instances with different constructor filters do not); for any other
    discovery by ``inner`` itself when it is hashable, and by its identity
    otherwise. Two ``SharedDiscovery`` of the same class compare equal (and
    hash alike) when their upstreams would be shared.

    **Context manager.** Entering is reentrant and counted, because wool
    enters the discovery of every pool it is given and several pools may
    share this one: the first enter enters ``inner`` (if it is a context
    manager), the last exit exits it, and the enters in between only count.
    It is always an async context manager; when ``inner`` is a synchronous
    context manager (``LocalDiscovery``) it is also a synchronous one (the
    constructor then returns a :class:`SyncSharedDiscovery`, which wool
    enters synchronously), and ``inner`` is then always entered through its
    synchronous protocol, under a lock, so enters and exits from any thread
    are counted consistently. With an asynchronous ``inner``, an enter that
    arrives while ``inner`` is being entered or exited waits for that to
    finish; such an ``inner`` must be entered from one event loop at a time.
    The value ``inner``'s enter returns is ignored: :attr:`publisher` and
    :meth:`subscribe` always delegate to ``inner`` itself. Exceptions are
    never suppressed. Exiting more often than entering raises
    :exc:`RuntimeError`.

    **Pickling.** Everything handed out pickles with cloudpickle (and with
    plain pickle when what travels for ``inner``, the options and any filter
    do), so wool can ship a proxy's subscription into worker processes;
    there the copy joins the pool of the process that iterates it, so all
    proxies on a worker share one upstream too. What travels for ``inner``
    is never the object the pools entered: for wool's ``LocalDiscovery``
    and ``LanDiscovery`` their class and constructor arguments (no
    shared-memory segment, no cleanup closure), rebuilt as an equal,
    unentered discovery; for a discovery with a ``__reduce__`` of its own
    (``wool_pooling.redis.RedisDiscovery`` has one) that reduction; for any
    other discovery, what wool itself ships: the subscriber
    ``inner.subscribe(**subscribe_options)`` returned when this wrapper was
    made, which must pickle. In a worker process, subscriptions carrying
    equal subscribers share one upstream. A ``SharedDiscovery`` pickles as
    ``(inner's recipe or reduction, subscribe_options)``: the copy starts
    unentered and compares equal to the original; one over a discovery of
    the last kind does not pickle itself (wool never pickles the discovery a
    pool is given, only its subscriptions). Pickling, equality, hash and
    the upstream's key all read one record of the arguments.

    :param inner: The wool discovery to wrap (anything with ``publisher`` and
        ``subscribe``).
    :param subscribe_options: Keyword arguments for ``inner.subscribe``.
    :raises TypeError: if ``inner`` has no callable ``subscribe``, if an
        option is not a parameter of ``inner.subscribe`` (the message names
        it, the closest parameter and every accepted one; a ``subscribe``
        taking ``**kwargs`` accepts any name) or the options do not bind to
        its signature otherwise (a positional-only parameter given by name,
        a required parameter left out), if an option value is not hashable,
        or if nothing of ``inner`` can reach another process: it is neither
        wool's ``LocalDiscovery`` or ``LanDiscovery`` nor a class with a
        ``__reduce__`` of its own, and
        ``inner.subscribe(**subscribe_options)`` raises or returns what does
        not pickle with cloudpickle. The message names the class and the
        ``__reduce__`` that would let ``inner`` itself travel.
    """

    __slots__ = (
        "__weakref__",
        "_entered",
        "_lock",
        "_portable",
        "_transition",
    )

    @overload
    def __new__(
        cls, inner: _SyncContextDiscovery, /, **subscribe_options: Hashable
    ) -> SyncSharedDiscovery: ...

    @overload
    def __new__(
        cls, inner: DiscoveryLike, /, **subscribe_options: Hashable
    ) -> SharedDiscovery: ...

    def __new__(cls, inner: Any, /, **subscribe_options: Hashable) -> SharedDiscovery:
        if cls is SharedDiscovery and _is_sync_context_manager(inner):
            cls = SyncSharedDiscovery
        return object.__new__(cls)

    def __init__(self, inner: DiscoveryLike, /, **subscribe_options: Hashable) -> None:
        if not callable(getattr(inner, "subscribe", None)):
            raise TypeError(
                "SharedDiscovery wraps a wool discovery (with publisher and "
                f"subscribe), got {type(inner).__name__}: {inner!r}"
            )
        # First, before anything calls it (a discovery that cannot travel
        # has its subscribe called below): the options must fit subscribe.
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
        # The one record of the arguments: pickling, equality, hash and the
        # upstream's key all read it. How ``inner`` travels is settled here,
        # so what cannot travel at all fails now, not at dispatch.
        self._portable = _Portable.of(inner, options)
        self._entered = 0
        self._lock = threading.Lock()
        # Set while an asynchronous inner is being entered or exited.
        self._transition: anyio.Event | None = None

    @property
    def _inner(self) -> DiscoveryLike:
        return self._portable.discovery

    @property
    def _options(self) -> Options:
        return self._portable.options

    @property
    def inner(self) -> DiscoveryLike:
        """The wrapped discovery."""
        return self._inner

    @property
    def subscribe_options(self) -> dict[str, Hashable]:
        """The keyword arguments passed to ``inner.subscribe`` (a copy)."""
        return dict(self._options)

    @property
    def entered(self) -> int:
        """How many enters are not yet matched by an exit."""
        return self._entered

    @property
    def publisher(self) -> DiscoveryPublisherLike:
        """``inner.publisher``, read anew on each access."""
        return self._inner.publisher

    @property
    def subscriber(self) -> SharedSubscription[DiscoveryEvent]:
        """The unfiltered pooled subscription; same as ``subscribe()``."""
        return self.subscribe()

    @overload
    def subscribe(self, filter: None = None) -> SharedSubscription[DiscoveryEvent]: ...

    @overload
    def subscribe(self, filter: Callable[[WorkerMetadata], bool]) -> afilter: ...

    @overload
    def subscribe(
        self, filter: Callable[[WorkerMetadata], bool] | None = None
    ) -> SharedSubscription[DiscoveryEvent] | afilter: ...

    def subscribe(
        self, filter: Callable[[WorkerMetadata], bool] | None = None
    ) -> SharedSubscription[DiscoveryEvent] | afilter:
        """Return a pooled subscription, filtered by ``filter`` if given.

        Builds nothing and needs no event loop: the shared upstream is
        attached (and built if needed) when a consumer starts iterating.
        Accepts what wool's ``DiscoveryLike.subscribe`` passes (a
        ``PredicateFunction`` or ``None``), so a ``SharedDiscovery`` is a
        ``DiscoveryLike`` to a type checker too.

        :param filter: Predicate a worker must satisfy to appear in this
            subscriber's stream; ``None`` for every worker.
        :returns: The shared upstream subscription itself when ``filter`` is
            ``None``, else an :class:`~wool_pooling.afilter` over it.
        """
        upstream = _UpstreamSubscriber(self._portable, self._options)
        if filter is None:
            return upstream
        return afilter(filter, upstream)

    def workers(self, **options: Any) -> Mapping[uuid.UUID, WorkerMetadata]:
        """The workers the shared upstream knows now: a snapshot.

        :meth:`SharedSubscription.workers
        <wool_pooling.SharedSubscription.workers>` of the upstream that
        :meth:`subscribe` shares (in the current pool), so empty while no
        consumer iterates it. A read-only copy, taken now (it does not
        follow later events); costs one dict copy and nothing else.

        :param options: Those of :meth:`subscribe`: with ``filter``, only
            the workers it accepts (it is called once per known worker).
        :raises TypeError: for a keyword :meth:`subscribe` does not take.
        """
        predicate = options.pop("filter", None)
        if options:
            raise TypeError(
                "SharedDiscovery.workers() takes the keywords of subscribe() "
                f"(filter), got {', '.join(sorted(options))}"
            )
        view = _UpstreamSubscriber(self._portable, self._options).workers()
        if predicate is None:
            return view
        accepts = cast(Callable[[WorkerMetadata], bool], predicate)
        return types.MappingProxyType(
            {uid: metadata for uid, metadata in view.items() if accepts(metadata)}
        )

    def statistics(
        self, pool: SubscriptionPool | None = None
    ) -> SubscriptionStatistics:
        """Return a snapshot of the shared upstream's counters in ``pool``:
        consumers (filtered ones included), events delivered, replays,
        lags, resyncs, rescans and errors; see
        :meth:`~wool_pooling.SharedSubscription.statistics`.

        All zeros when nothing iterates the upstream in that pool.

        :param pool: The pool to look in; by default :func:`~wool_pooling.current_pool`.
        :raises RuntimeError: if ``pool`` is omitted and no pool is current
            and no event loop is running.
        """
        return self.subscribe().statistics(pool)

    # -- counted, reentrant context management -------------------------------

    async def __aenter__(self) -> SharedDiscovery:
        inner = self._inner
        if _is_sync_context_manager(inner):
            self._enter_sync()
            return self
        while self._transition is not None:
            await self._transition.wait()
        if self._entered:
            self._entered += 1
            return self
        transition = self._transition = anyio.Event()
        try:
            if isinstance(inner, AbstractAsyncContextManager):
                await cast(AbstractAsyncContextManager[object], inner).__aenter__()
            self._entered = 1
        finally:
            self._transition = None
            transition.set()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        inner = self._inner
        if _is_sync_context_manager(inner):
            self._exit_sync(exc_type, exc, traceback)
            return
        if self._entered <= 0:
            raise RuntimeError(f"{self!r} was exited more often than entered")
        if self._entered > 1:
            self._entered -= 1
            return
        transition = self._transition = anyio.Event()
        try:
            if isinstance(inner, AbstractAsyncContextManager):
                with anyio.CancelScope(shield=True):
                    await cast(AbstractAsyncContextManager[object], inner).__aexit__(
                        exc_type, exc, traceback
                    )
        finally:
            self._entered = 0
            self._transition = None
            transition.set()

    def _enter_sync(self) -> None:
        with self._lock:
            if self._entered == 0:
                cast(AbstractContextManager[object], self._inner).__enter__()
            self._entered += 1

    def _exit_sync(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with self._lock:
            if self._entered <= 0:
                raise RuntimeError(f"{self!r} was exited more often than entered")
            self._entered -= 1
            if self._entered == 0:
                cast(AbstractContextManager[object], self._inner).__exit__(
                    exc_type, exc, traceback
                )

    # -- pickling and repr ----------------------------------------------------

    def __reduce__(self) -> tuple[Any, ...]:
        portable = self._portable
        if portable.shipped is not None:
            cls = type(portable.discovery)
            raise TypeError(
                f"cannot pickle a SharedDiscovery of a {cls.__qualname__}: a "
                f"{cls.__qualname__} has no __reduce__, so only what its "
                "subscribe() returns travels (in every subscription this "
                "SharedDiscovery hands out, as wool ships it), never the "
                f"discovery; add a __reduce__ to {cls.__qualname__} that "
                "rebuilds it, unentered, to pickle the SharedDiscovery itself"
            )
        return (_restore, (portable,))

    def __eq__(self, other: object) -> bool:
        """Equal when of the same class, over equal records (see :class:`_Portable`)."""
        if not isinstance(other, SharedDiscovery):
            return NotImplemented
        return type(self) is type(other) and self._portable == other._portable

    def __hash__(self) -> int:
        return hash((type(self), self._portable))

    def __repr__(self) -> str:
        options = "".join(f", {name}={value!r}" for name, value in self._options)
        return (
            f"<{type(self).__name__}({self._inner!r}{options}) "
            f"[entered: {self._entered}]>"
        )


@final
class SyncSharedDiscovery(SharedDiscovery):
    """A :class:`SharedDiscovery` over a discovery that is a sync context manager.

    What ``SharedDiscovery(inner)`` returns for such an ``inner`` (for
    example ``wool.LocalDiscovery``): it is a synchronous context manager
    too, with the same counted, reentrant semantics, sharing one count with
    the asynchronous protocol. Construct it through :class:`SharedDiscovery`.

    :raises TypeError: if ``inner`` is not a synchronous context manager.
    """

    __slots__ = ()

    def __init__(self, inner: DiscoveryLike, /, **subscribe_options: Hashable) -> None:
        if not _is_sync_context_manager(inner):
            raise TypeError(
                "SyncSharedDiscovery needs a discovery that is a synchronous "
                f"context manager, got {type(inner).__name__}"
            )
        super().__init__(inner, **subscribe_options)

    def __enter__(self) -> SyncSharedDiscovery:
        self._enter_sync()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._exit_sync(exc_type, exc, traceback)


def _restore(portable: _Portable) -> SharedDiscovery:
    """Unpickle a :class:`SharedDiscovery`: a fresh, unentered wrapper."""
    return SharedDiscovery(portable.discovery, **dict(portable.options))


def _is_sync_context_manager(value: object) -> bool:
    return isinstance(value, AbstractContextManager)


# -- what travels to another process: never the entered discovery -----------

#: wool's discoveries that are rebuilt from their constructor arguments.
_BY_CONSTRUCTOR: tuple[type, ...] = (wool.LocalDiscovery, wool.LanDiscovery)

#: A discovery's recipe: ``factory(*args, **kwargs)`` rebuilds it, unentered;
#: ``None`` when it is not rebuilt from its constructor arguments.
Recipe = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None


def _recipe(inner: object) -> Recipe:
    """How to rebuild ``inner``, unentered, from its constructor arguments.

    wool's ``LocalDiscovery`` and ``LanDiscovery``: their class, called with
    the arguments they were constructed with (read back from the instance,
    which keeps each one as an attribute named after the parameter, with a
    leading underscore), so none of the state entering them creates (a
    shared-memory segment, its cleanup) travels. ``None`` for any other
    discovery.
    """
    cls = type(inner)
    if cls in _BY_CONSTRUCTOR:
        return _constructor_recipe(inner, cls)
    return None


def _reduces_itself(cls: type) -> bool:
    """Whether ``cls`` says itself how it pickles (``__reduce__``,
    ``__reduce_ex__`` or a ``copyreg`` reducer): only it knows what of it may
    travel."""
    return (
        cls.__reduce__ is not object.__reduce__
        or cls.__reduce_ex__ is not object.__reduce_ex__
        or cls in copyreg.dispatch_table
    )


@functools.cache
def _constructor_parameters(cls: type) -> tuple[tuple[str, inspect.Parameter], ...]:
    """The parameters of ``cls``'s constructor (one of :data:`_BY_CONSTRUCTOR`),
    read once: every unpickled wrapper settles its recipe again."""
    return tuple(inspect.signature(cls).parameters.items())


def _constructor_recipe(inner: object, cls: type) -> Recipe:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True  # until a parameter is left out: then by keyword
    for name, parameter in _constructor_parameters(cls):
        try:
            value = getattr(inner, f"_{name}")
        except AttributeError:
            raise TypeError(
                f"SharedDiscovery cannot read the constructor argument {name!r} "
                f"back from {cls.__qualname__} (this wool version stores it "
                "differently): subclass it with a __reduce__ that rebuilds it"
            ) from None
        if value is parameter.default or (
            parameter.default is not inspect.Parameter.empty
            and type(value) is type(parameter.default)
            and value == parameter.default
        ):
            positional = False
            continue  # the default: leaving it out keeps every task smaller
        if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and positional:
            args.append(value)
        else:
            kwargs[name] = value
    return (cls, tuple(args), kwargs)


def _shipped_subscriber(inner: DiscoveryLike, options: Options) -> bytes:
    """What ``inner.subscribe(**options)`` returns, pickled (with cloudpickle).

    What travels in place of a discovery that cannot: wool itself ships the
    subscriber a discovery's ``subscribe`` returns, never the discovery.

    :raises TypeError: naming the class, if ``subscribe`` fails or what it
        returns does not pickle (with cloudpickle, as wool pickles).
    """
    name = type(inner).__qualname__
    cannot = (
        f"SharedDiscovery cannot ship a {name} to worker processes: wool "
        "pickles a pool's subscription into every task it dispatches, and "
        f"{name} has no __reduce__, so what its subscribe() returns travels "
        "in its place (as wool ships it)"
    )
    remedy = (
        f"make that picklable, or add a __reduce__ to {name} that rebuilds it, "
        "unentered, from what it is made of, e.g. "
        "'def __reduce__(self): return (type(self), (self.namespace,))'"
    )
    try:
        subscriber: object = cast(Any, inner).subscribe(**dict(options))
    except Exception as error:
        raise TypeError(
            f"{cannot}, but subscribe({_shown(options)}) raised {error!r}; {remedy}"
        ) from error
    try:
        return cloudpickle.dumps(subscriber)  # pyright: ignore[reportUnknownMemberType]
    except Exception as error:
        raise TypeError(
            f"{cannot}, but that {type(subscriber).__qualname__} does not "
            f"pickle ({error}); {remedy}"
        ) from error


def _shown(options: Options) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in options)


@final
class _Portable:
    """The one record of a :class:`SharedDiscovery`'s arguments, and how what
    it subscribes to reaches another process: what a subscription carries.

    Holds the discovery, the options of its ``subscribe``, and one of, settled
    at construction (:meth:`of`):

    - a recipe (``LocalDiscovery``, ``LanDiscovery``): it pickles as their
      class and constructor arguments, and is rebuilt fresh and unentered;
    - nothing else, for a discovery that says itself how it pickles (its own
      ``__reduce__``): it pickles as that discovery;
    - for any other discovery, ``shipped``: the subscriber its
      ``subscribe(**options)`` returned, pickled once, here (so one that
      does not pickle fails now). That subscriber travels in the
      discovery's place, as wool itself ships one, and arrives as a
      :class:`_SubscriberOnly`.

    Pickling, equality and hash read this record, and so does the key of the
    upstream: two are equal when their options are and their recipes are
    (discoveries rebuilt from equal constructor arguments), or, without a
    recipe, their discoveries are (by identity, when unhashable).
    """

    __slots__ = ("_key", "discovery", "options", "recipe", "shipped")

    def __init__(
        self,
        discovery: DiscoveryLike,
        options: Options,
        recipe: Recipe = None,
        shipped: bytes | None = None,
    ) -> None:
        self.discovery = discovery
        self.options = options
        self.recipe = recipe
        self.shipped = shipped
        self._key: Hashable | None = None

    @property
    def key(self) -> Hashable:
        """``(the discovery's part, options)``: computed when first needed (a
        discovery's hash may resolve a host name)."""
        key = self._key
        if key is None:
            key = self._key = (
                _discovery_key(self.discovery, self.recipe),
                self.options,
            )
        return key

    @classmethod
    def of(cls, discovery: DiscoveryLike, options: Options) -> _Portable:
        """Settle how ``discovery`` travels.

        :raises TypeError: naming the class, when neither the discovery nor
            what its ``subscribe(**options)`` returns can be pickled.
        """
        recipe = _recipe(discovery)
        if recipe is not None or _reduces_itself(type(discovery)):
            return cls(discovery, options, recipe)
        return cls(discovery, options, None, _shipped_subscriber(discovery, options))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Portable) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.shipped is not None:
            return (_Portable, (_SubscriberOnly(self.shipped), self.options))
        if self.recipe is None:
            return (_Portable, (self.discovery, self.options))
        factory, args, kwargs = self.recipe
        if kwargs:
            return (_rebuild_with, (self.options, factory, args, kwargs))
        return (_rebuild, (self.options, factory, *args))

    def __repr__(self) -> str:
        return repr(self.discovery)


def _discovery_key(discovery: object, recipe: Recipe) -> Hashable:
    """A discovery's part of the key: its recipe (class and constructor
    arguments) when it has a hashable one, else the discovery itself, by
    identity when unhashable."""
    if recipe is not None:
        factory, args, kwargs = recipe
        key = (factory, args, tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:
            pass
        else:
            return key
    try:
        hash(discovery)
    except TypeError:
        return _Identity(discovery)
    return discovery


def _rebuild(
    options: Options, factory: Callable[..., DiscoveryLike], *args: Any
) -> _Portable:
    """Unpickle a :class:`_Portable` from its recipe: a fresh, unentered discovery."""
    return _Portable(factory(*args), options, (factory, args, {}))


def _rebuild_with(
    options: Options,
    factory: Callable[..., DiscoveryLike],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> _Portable:
    """:func:`_rebuild`, with keyword arguments."""
    return _Portable(factory(*args, **kwargs), options, (factory, args, kwargs))


@final
class _SubscriberOnly:
    """A discovery that cannot travel, as it arrives in another process: the
    subscriber its ``subscribe(**options)`` returned where it was wrapped,
    pickled there.

    :meth:`subscribe` unpickles that subscriber afresh (the options were
    applied where it was made); wool's subscribers are cheap handles that
    share their process's watch. Two are equal when their subscribers
    pickled to the same bytes, so the copies of one subscription that reach
    a process (one per task wool dispatches there) share one upstream,
    whether or not the subscriber's class defines equality (wool's do not).
    Pickles as those bytes, so it travels on, to a nested dispatch, the same
    way and with the same key.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    @property
    def publisher(self) -> DiscoveryPublisherLike:
        """Never: only a subscriber travelled here."""
        raise TypeError(
            f"{self!r} has no publisher: only the subscriber of a discovery "
            "without a __reduce__ travels to another process"
        )

    def subscribe(self, **options: Hashable) -> object:
        """The subscriber that travelled (``options`` applied where it was made)."""
        return pickle.loads(self.data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SubscriberOnly) and self.data == other.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_SubscriberOnly, (self.data,))

    def __repr__(self) -> str:
        return f"<subscriber of {len(self.data)} pickled bytes>"


# -- the shared upstream ------------------------------------------------------


@final
class _Identity:
    """Key of an unhashable discovery: equal only to itself."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _upstream_key(cls: type, portable: _Portable, options: Options) -> Hashable:
    """Key the upstream by the record of the discovery and options (its ``key``)."""
    return portable.key


#: Seconds a joiner's fresh scan of the inner discovery stays open after it
#: started or last changed something: its first scan (of shared memory, or a
#: server's snapshot) arrives within that, and two iterations overlap no
#: longer. (Events that change nothing, such as the ``worker-updated`` with
#: unchanged metadata ``LocalDiscovery`` repeats at every scan, do not count.)
RESCAN_SETTLE = 0.25

#: What a joiner sends the upstream to ask for a fresh scan.
_RESCAN = object()


@final
class _End:
    """A reader's last message: its inner iteration ended, or failed."""

    __slots__ = ("error",)

    def __init__(self, error: Exception | None) -> None:
        self.error = error


@final
class _Reader:
    """One iteration of the inner discovery, run in a task of its own."""

    __slots__ = ("done", "main", "scope")

    def __init__(self, main: bool) -> None:
        self.main = main
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()


@final
class _Merge:
    """Where the readers' events meet: the workers known so far, and the
    rescans still open with when each is to be closed.

    A reader merges each event as it reads it (:meth:`admit`) and hands on
    only what changed the known workers, in the order it merged them (one
    buffer, first in first out). So an event that changes nothing (such as
    the ``worker-updated`` with unchanged metadata that ``LocalDiscovery``
    repeats for every worker at every scan) never waits in the buffer, and
    a reader goes through an inner scan without waiting for the consumers
    to take what changed nothing: the inner discovery is back to watching
    for changes as soon as it can be.
    """

    __slots__ = ("known", "rescans")

    def __init__(self) -> None:
        self.known = WorkerMap()
        self.rescans: dict[_Reader, float] = {}

    def admit(self, reader: _Reader, item: object) -> object | None:
        """What of ``item``, just read by ``reader``, is to be handed on
        (``None``: nothing); a discovery event is merged into the known
        workers. A closed rescan hands on nothing; one that changed
        something stays open :data:`RESCAN_SETTLE` seconds longer."""
        main = reader.main
        if not main and reader not in self.rescans:
            return None
        if not isinstance(item, DiscoveryEvent):
            return item
        event = self.known.apply(item)
        if event is not None and not main:
            self.rescans[reader] = anyio.current_time() + RESCAN_SETTLE
        return event


async def _hand_on(
    send: MemoryObjectSendStream[Any], reader: _Reader, item: object
) -> None:
    """Send what ``reader`` merged, once the buffer has room; merged already,
    it is sent even if the reader is closed meanwhile (the known workers
    and what the consumers got stay one view)."""
    with anyio.CancelScope(shield=True):
        await send.send((reader, item))


@shared_subscription(key=_upstream_key)
class _UpstreamSubscriber:
    """The raw, unfiltered subscription to one inner discovery, with given options.

    Constructing it returns a :class:`~wool_pooling.SharedSubscription` keyed
    by (inner discovery, options), so one raw instance, and one iteration of
    it, serves every consumer of the pool. ``inner.subscribe(**options)`` is
    called when that iteration starts and its result is resolved the way
    wool's ``WorkerProxy`` resolves a subscriber (a context manager is
    entered, a factory called, an awaitable awaited) and then iterated, in a
    task of its own (a reader) that hands each event to the iteration.

    **Joiners see every worker that exists when they join.** A consumer
    joining once the iteration runs (see ``__wool_pooling_joined__``) has the
    inner discovery subscribed to once more: a second reader whose first
    scan reports every worker that exists by then, whether or not the first
    reader's notifications noticed it. The events of both are merged: only
    what changes the known workers is passed on (a ``worker-added`` of a
    worker already known with equal metadata is not repeated, one with new
    metadata becomes ``worker-updated``, a ``worker-dropped`` of a worker not
    known is left out), so no consumer sees a duplicate. Each reader merges
    what it reads as it reads it (see :class:`_Merge`), so an inner scan is
    read through without waiting on what changed nothing. The second reader
    is closed :data:`RESCAN_SETTLE` seconds after it started or last changed
    something; joiners arriving before it starts share it. Its failure is
    logged and changes nothing; the first reader's failure or end ends the
    iteration. Events that change nothing are left out in every case,
    whichever reader they come from.

    Closing the iteration closes every reader's inner iterator and exits
    whatever was entered, and waits for that, shielded from cancellation.
    """

    __slots__ = ("_rescan_wanted", "_rescans", "_wake", "inner", "options")

    def __init__(self, inner: _Portable, options: Options) -> None:
        # Any: wool types subscribe() without the options discoveries accept.
        self.inner: Any = inner.discovery
        self.options = options
        # While iterating: where a joiner asks for a fresh scan.
        self._wake: MemoryObjectSendStream[Any] | None = None
        self._rescan_wanted = False
        self._rescans = 0

    def __wool_pooling_rescans__(self) -> int:
        """Fresh scans started for joiners so far (for the entry's statistics)."""
        return self._rescans

    def __wool_pooling_joined__(self) -> None:
        """A consumer has joined this upstream: scan the inner discovery afresh.

        Called synchronously by the consumer, once registered with the
        fan-out. Before the iteration has started, its first scan is still
        to come, and nothing is done; a rescan already asked for and not yet
        started serves this joiner too.
        """
        wake = self._wake
        if wake is None or self._rescan_wanted:
            return
        self._rescan_wanted = True
        # Wakes the iteration if it waits for an event; if it does not, it
        # sees the flag before it waits again.
        with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):
            wake.send_nowait(_RESCAN)

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self._events()

    async def _events(self) -> AsyncGenerator[DiscoveryEvent, None]:
        # A buffer of the read-ahead (none by default): a reader takes at
        # most that many events from the inner discovery past what this
        # iteration has taken, so the inner discovery is read (scanned) no
        # further ahead than the consumers' read-ahead, and the pump takes a
        # scan's events without a task switch per event.
        config: SubscriptionConfig = getattr(type(self), CONFIG_ATTRIBUTE)
        send, receive = anyio.create_memory_object_stream[Any](config.read_ahead)
        loop = current_loop()
        alive: set[_Reader] = set()
        merge = _Merge()
        rescans = merge.rescans
        main = self._start(loop, send, alive, merge, main=True)
        listing = _FirstListing(type(self.inner) in _BY_CONSTRUCTOR)
        receive_nowait = receive.receive_nowait
        try:
            while True:
                item: Any
                if self._rescan_wanted:
                    item = _RESCAN
                else:
                    try:
                        item = receive_nowait()
                    except anyio.WouldBlock:
                        item = await listing.receive(receive)
                if type(item) is tuple:
                    reader, payload = cast(tuple[_Reader, object], item)
                    if type(payload) is DiscoveryEvent:
                        # Merged by its reader: it changed the known workers.
                        yield payload
                        listing.resumed()
                        continue
                elif item is _LISTED:
                    yield cast(DiscoveryEvent, Synced())
                    continue
                else:  # _RESCAN
                    if not self._rescan_wanted:
                        continue  # taken already, through the flag
                    self._rescan_wanted = False
                    reader = self._start(loop, send, alive, merge)
                    self._rescans += 1
                    rescans[reader] = anyio.current_time() + RESCAN_SETTLE
                    loop.spawn(_close_when_settled, reader, rescans)
                    continue
                if isinstance(payload, _End):
                    if reader is main:
                        if payload.error is not None:
                            raise payload.error
                        return
                    if rescans.pop(reader, None) is not None and payload.error:
                        logger.warning(
                            "a rescan of %r failed: %r", self.inner, payload.error
                        )
                    continue
                if type(payload) is Synced:
                    if listing.marked(reader is main):
                        yield cast(DiscoveryEvent, payload)
                    continue
                # Not a discovery event: passed on as the inner one yielded it.
                yield cast(DiscoveryEvent, payload)
                listing.resumed()
        finally:
            self._wake = None
            rescans.clear()
            receive.close()  # a reader handing over an event gives up
            readers = list(alive)
            for reader in readers:
                reader.scope.cancel()
            with anyio.CancelScope(shield=True):
                for reader in readers:
                    await reader.done.wait()

    def _start(
        self,
        loop: EventLoop,
        send: MemoryObjectSendStream[Any],
        alive: set[_Reader],
        merge: _Merge,
        *,
        main: bool = False,
    ) -> _Reader:
        reader = _Reader(main)
        alive.add(reader)
        # wool caches its subscribers per context (one raw subscriber, and
        # one fan-out, per key and per ``__subscriber_pool__``): a reader
        # started in a context that has one would join the cached iteration,
        # stale scan included, instead of scanning afresh. Each reader gets
        # a pool of its own (wool makes it at the first subscribe).
        context = contextvars.copy_context()
        context.run(__subscriber_pool__.set, None)
        loop.spawn(self._read, reader, send, alive, merge, context=context)
        return reader

    async def _read(
        self,
        reader: _Reader,
        send: MemoryObjectSendStream[Any],
        alive: set[_Reader],
        merge: _Merge,
    ) -> None:
        """Iterate the inner discovery once; hand ``(reader, item)`` to
        ``send`` for each item that :meth:`_Merge.admit` lets through.

        The main reader opens the upstream to rescans as its first scan
        starts: a consumer that joined before is covered by that scan. It
        starts a pass of the loop after it was spawned, even under an eager
        task factory (which runs a task's first step at once): consumers
        joining at the same moment as the first share its first scan.
        """
        error: Exception | None = None
        main = reader.main
        try:
            with reader.scope:
                if main:
                    await anyio.lowlevel.checkpoint()
                if main and not reader.scope.cancel_called:
                    self._wake = send
                stack = AsyncExitStack()
                try:
                    subscriber = await _resolve(
                        self.inner.subscribe(**dict(self.options)), stack
                    )
                    iterator = aiter(cast(Any, subscriber))
                    relay = (
                        _SyncedRelay.of(iterator, reader, send, merge) if main else None
                    )
                    try:
                        if relay is not None:
                            await relay.forward(iterator)
                        admit, send_nowait = merge.admit, send.send_nowait
                        async for event in iterator:
                            item = admit(reader, event)
                            if item is None:
                                continue
                            # Into the buffer without a checkpoint per event:
                            # a scan's events reach the iteration in one go.
                            try:
                                send_nowait((reader, item))
                            except anyio.WouldBlock:
                                await _hand_on(send, reader, item)
                    finally:
                        if relay is not None:
                            relay.stop()
                        with anyio.CancelScope(shield=True):
                            await aclose_iterator(iterator)
                finally:
                    with anyio.CancelScope(shield=True):
                        await stack.aclose()
        except Exception as failure:
            error = failure
        finally:
            alive.discard(reader)
            reader.done.set()
        # The iteration may be gone (closed), and its stream with it.
        with contextlib.suppress(anyio.BrokenResourceError):
            await send.send((reader, _End(error)))

    def __repr__(self) -> str:
        return f"_UpstreamSubscriber({self.inner!r}, {self.options!r})"


#: Seconds the upstream of wool's ``LocalDiscovery`` or ``LanDiscovery``
#: (which never say when a listing is complete) has to find nothing new,
#: from its start or its last change, before its first listing is taken to
#: be complete (see :attr:`~wool_pooling.SubscriptionConsumer.synced`).
LISTING_QUIET = RESCAN_SETTLE

#: What :meth:`_FirstListing.receive` returns once the quiet time is over.
_LISTED = object()


@final
class _FirstListing:
    """When the upstream's first listing is complete, as far as it can tell.

    An inner subscriber that yields :class:`~wool_pooling.Synced` says so
    itself (its first reader's first one is passed on; a rescan's, and any
    later one, are not). For wool's ``LocalDiscovery`` and ``LanDiscovery``
    (``quiet``), which never say, the first listing is taken to be complete
    once the upstream has waited :data:`LISTING_QUIET` seconds without an
    event that changed the known workers, counted from its start or its
    last change: an estimate, not a promise.
    """

    __slots__ = ("done", "quiet_until")

    def __init__(self, quiet: bool) -> None:
        self.done = False
        self.quiet_until: float | None = (
            anyio.current_time() + LISTING_QUIET if quiet else None
        )

    async def receive(self, receive: MemoryObjectReceiveStream[Any]) -> Any:
        """The next item, or :data:`_LISTED` once the quiet time is over."""
        until = self.quiet_until
        if until is None:
            return await receive.receive()
        with anyio.move_on_after(until - anyio.current_time()):
            return await receive.receive()
        self.quiet_until = None
        self.done = True
        return _LISTED

    def resumed(self) -> None:
        """An event was passed on: the quiet time starts again."""
        if self.quiet_until is not None:
            self.quiet_until = anyio.current_time() + LISTING_QUIET

    def marked(self, main: bool) -> bool:
        """A reader yielded :class:`~wool_pooling.Synced`: whether to pass
        it on (the main reader's first one only)."""
        if not main or self.done:
            return False
        self.done = True
        self.quiet_until = None
        return True


@final
class _SyncedRelay:
    """Passes on the :attr:`~wool_pooling.SubscriptionConsumer.synced` of an
    inner subscriber that is itself a shared subscription (a
    ``RedisDiscovery``'s, whose consumers never see its marker), as a
    :class:`~wool_pooling.Synced` sent after the events that made it true.

    A task of its own waits for it (the inner consumer may become synced
    while the reader waits for its next event); the reader itself sends the
    marker when it becomes true as an event is handed over.
    """

    __slots__ = ("busy", "consumer", "merge", "reader", "scope", "send", "sent")

    def __init__(
        self,
        consumer: SubscriptionConsumer[Any],
        reader: _Reader,
        send: MemoryObjectSendStream[Any],
        merge: _Merge,
    ) -> None:
        self.consumer = consumer
        self.reader = reader
        self.send = send
        self.merge = merge
        self.scope = anyio.CancelScope()
        # Whether the reader holds an event not yet sent; the marker sent.
        self.busy = False
        self.sent = False

    @classmethod
    def of(
        cls,
        iterator: object,
        reader: _Reader,
        send: MemoryObjectSendStream[Any],
        merge: _Merge,
    ) -> _SyncedRelay | None:
        if not isinstance(iterator, SubscriptionConsumer):
            return None
        relay = cls(cast(SubscriptionConsumer[Any], iterator), reader, send, merge)
        current_loop().spawn(relay._watch)
        return relay

    async def forward(self, iterator: AsyncIterator[Any]) -> None:
        """Hand the inner consumer's events to the upstream, then the
        marker once it is synced; returns at the inner stream's end."""
        async for event in iterator:
            item = self.merge.admit(self.reader, event)
            if item is not None:
                self.busy = True
                await _hand_on(self.send, self.reader, item)
                self.busy = False
            if not self.sent and self.consumer.synced:
                await self._send_marker()

    async def _watch(self) -> None:
        with self.scope:
            await self.consumer.wait_synced()
            if self.consumer.synced and not self.busy and not self.sent:
                await self._send_marker()

    async def _send_marker(self) -> None:
        self.sent = True
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self.send.send((self.reader, Synced()))

    def stop(self) -> None:
        self.scope.cancel()


async def _close_when_settled(reader: _Reader, rescans: dict[_Reader, float]) -> None:
    """Close the rescan ``reader`` once its time in ``rescans`` is up (it is
    moved on while the rescan finds something); return early once it has
    left ``rescans`` otherwise (it ended, or the iteration was closed)."""
    while True:
        until = rescans.get(reader)
        if until is None:
            return
        delay = until - anyio.current_time()
        if delay <= 0:
            del rescans[reader]
            reader.scope.cancel()
            return
        await anyio.sleep(delay)


async def _resolve(value: object, stack: AsyncExitStack) -> object:
    """Resolve a subscriber like wool's ``WorkerProxy`` (CMs entered on ``stack``)."""
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
