"""``@shared_subscription``: make constructing a class return a pooled subscription."""

from __future__ import annotations

import math
from collections.abc import AsyncIterable
from collections.abc import Callable
from typing import Any
from typing import ParamSpec
from typing import Protocol
from typing import TypeVar
from typing import overload

from .._core.fanout import DEFAULT_READ_AHEAD
from .._core.fanout import validate_max_lag
from .._core.fanout import validate_read_ahead
from .construction import CONFIG_ATTRIBUTE
from .construction import KeyFunction
from .construction import SubscriptionConfig
from .construction import check_key
from .construction import derive_key
from .restart import RestartPolicy
from .subscription import SharedSubscription
from .view import ViewFactory

__all__ = ["shared_subscription"]

P = ParamSpec("P")
T = TypeVar("T")


class _Decorator(Protocol):
    """What ``shared_subscription(key=..., ...)`` returns: the decorator itself."""

    def __call__(
        self, cls: Callable[P, AsyncIterable[T]], /
    ) -> Callable[P, SharedSubscription[T]]: ...


#: Default bound on how far a consumer of a shared subscription may lag.
DEFAULT_MAX_LAG = 1024


@overload
def shared_subscription(
    cls: Callable[P, AsyncIterable[T]],
    /,
    *,
    key: KeyFunction | None = None,
    ttl: float = 0.0,
    max_lag: int | None = DEFAULT_MAX_LAG,
    restart: RestartPolicy | None = None,
    read_ahead: int = DEFAULT_READ_AHEAD,
    view: ViewFactory | None = None,
) -> Callable[P, SharedSubscription[T]]: ...


@overload
def shared_subscription(
    cls: None = None,
    /,
    *,
    key: KeyFunction | None = None,
    ttl: float = 0.0,
    max_lag: int | None = DEFAULT_MAX_LAG,
    restart: RestartPolicy | None = None,
    read_ahead: int = DEFAULT_READ_AHEAD,
    view: ViewFactory | None = None,
) -> _Decorator: ...


def shared_subscription(
    cls: Any = None,
    /,
    *,
    key: KeyFunction | None = None,
    ttl: float = 0.0,
    max_lag: int | None = DEFAULT_MAX_LAG,
    restart: RestartPolicy | None = None,
    read_ahead: int = DEFAULT_READ_AHEAD,
    view: ViewFactory | None = None,
) -> Any:
    """Class decorator: constructing the class returns a :class:`SharedSubscription`.

    Usable bare (``@shared_subscription``) or called
    (``@shared_subscription(key=..., ttl=...)``). It replaces ``__new__`` on
    the class, with no metaclass, so it also applies to classes that have a
    metaclass of their own and to subclasses (each keyed by its own class).
    ``Cls(*args, **kwargs)`` runs neither the class's ``__new__`` nor its
    ``__init__``: it computes the key and returns a subscription. The raw
    instance is built from those arguments when a consumer first iterates.

    **Types.** A type checker sees the decorated name as what calling it
    returns: a callable taking the parameters of the class's ``__init__``
    and returning ``SharedSubscription[T]``, ``T`` being the item type of the
    class's ``__aiter__``; so ``Cls(...).aclose`` is an error and
    ``aiter(Cls(...))`` is a :class:`SubscriptionConsumer`, without casts.
    The class's own attributes are not visible through that name (keep
    class-level state in another object), a checker does not let it be
    subclassed (decorate the subclasses of an undecorated base instead),
    and ``isinstance(x, Cls)`` is rejected, as it is never true of a
    subscription. In pyright's strict mode
    (``typeCheckingMode = "strict"``) give ``key`` as a ``def`` with annotated
    parameters: a lambda's parameters cannot be annotated.

    :param key: ``key(cls, *args, **kwargs) -> Hashable``, evaluated at
        construction. ``None`` keys by the arguments bound to ``__init__``'s
        signature with defaults applied, so ``Cls("a")`` and
        ``Cls(name="a")`` share an entry. Keys are namespaced by class. An
        exception the key function raises reaches the caller as it is (same
        object, same type), with a note naming the class and the function.
    :param ttl: Seconds an entry is kept once its last consumer is released,
        so a consumer arriving in time reuses the running subscription.
    :param max_lag: How many events the shared log holds for a consumer that
        falls behind (``None``: unbounded). A consumer further behind is
        resynchronised: instead of the events it missed it receives the
        difference between the workers it last saw and the current ones, so
        memory is bounded by the number of workers, not of events. The
        diff covers discovery events only: once the stream has carried
        other items, a consumer that falls behind gets
        :exc:`~wool_pooling.Lagged` (with the count it missed) instead;
        pass ``max_lag=None`` for a stream no consumer may miss items of.
    :param restart: A :class:`RestartPolicy` to iterate the raw subscriber
        again when its stream fails (or ends), instead of ending every
        consumer; ``None`` (the default) ends them with the error.
    :param read_ahead: How many events the shared iteration may pull past
        the most advanced consumer's demand, in its one task (see
        :class:`~wool_pooling.Fanout`); they count inside ``max_lag``.
        64 by default; ``0`` pulls on demand only.
    :param view: ``view(raw)`` returns what an entry remembers for late
        joiners, lagging consumers and restarts (a :class:`View`), called
        once per entry with its raw instance. ``None``: the worker view
        (:ref:`views`).
    :raises TypeError: at decoration, if given something other than a class
        or a class without ``__aiter__``, if ``key`` is not callable, or if
        no call of the class could be passed to it (it has no ``cls``
        parameter, or cannot take ``__init__``'s required arguments whether
        given by position or by name); the message names the class, the
        key and the call it cannot take.
    :raises ValueError: if ``ttl`` is negative or not finite, ``max_lag``
        is not ``None`` or an int >= 1, or ``read_ahead`` is not an int >= 0.
    """
    if key is not None and not callable(key):
        raise TypeError(f"shared_subscription key must be callable, got {key!r}")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"shared_subscription ttl must be a number, got {ttl!r}")
    if not math.isfinite(ttl) or ttl < 0:
        raise ValueError(
            f"shared_subscription ttl must be a finite number >= 0, got {ttl!r}"
        )

    max_lag = validate_max_lag(max_lag)
    read_ahead = validate_read_ahead(read_ahead)
    if view is not None and not callable(view):
        raise TypeError(f"shared_subscription view must be callable, got {view!r}")
    if restart is not None and not isinstance(restart, RestartPolicy):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(
            f"shared_subscription restart must be a RestartPolicy, got {restart!r}"
        )

    def decorate(target: Any) -> Any:
        if not isinstance(target, type):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"@shared_subscription decorates a class, got {target!r}")
        method = getattr(target, "__aiter__", None)
        if method is None:
            raise TypeError(
                f"@shared_subscription: {target.__qualname__} has no __aiter__; "
                "only async-iterable subscriber classes can be shared"
            )
        if not callable(method):
            raise TypeError(
                f"@shared_subscription: {target.__qualname__}.__aiter__ is "
                f"{method!r}, not a method; only async-iterable subscriber "
                "classes can be shared"
            )
        if key is not None:
            check_key(target, key)
        config = SubscriptionConfig(
            key=key,
            ttl=float(ttl),
            max_lag=max_lag,
            restart=restart,
            read_ahead=read_ahead,
            view=view,
            own_new=vars(target).get("__new__"),
        )
        setattr(target, CONFIG_ATTRIBUTE, config)
        target.__new__ = staticmethod(_pooled_new)  # type: ignore[assignment]
        return target

    if cls is None:
        return decorate
    return decorate(cls)


def _pooled_new(cls: type, *args: Any, **kwargs: Any) -> SharedSubscription[Any]:
    # Not an instance of cls, so type.__call__ does not run cls.__init__.
    return SharedSubscription(cls, derive_key(cls, args, kwargs), args, kwargs)


_pooled_new.__wool_pooling__ = True  # type: ignore[attr-defined]
