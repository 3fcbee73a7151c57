"""``@shared_subscription``: make constructing a class return a pooled subscription."""

from __future__ import annotations

import math
from collections.abc import AsyncIterable
from collections.abc import Callable
from typing import Any
from typing import ParamSpec
from typing import TypeVar
from typing import overload

from .._core.fanout import DEFAULT_MAX_LAG
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


@overload
def shared_subscription(
    cls: Callable[P, AsyncIterable[T]], /
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
) -> Callable[[Callable[P, AsyncIterable[T]]], Callable[P, SharedSubscription[T]]]: ...


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
    """Class decorator, bare or called: constructing the class returns a
    :class:`SharedSubscription`, and the raw instance is built when a
    consumer first iterates. See :doc:`custom-subscribers`.

    :param key: ``key(cls, *args, **kwargs) -> Hashable``, evaluated at
        construction; ``None`` keys by the arguments bound to ``__init__``
        with defaults applied.
    :param ttl: Seconds an entry is kept once its last consumer is released,
        so a consumer arriving in time reuses the running subscription.
    :param max_lag: How many events the shared log holds for a consumer that
        falls behind (``None``: unbounded); one further behind is caught up
        by the entry's view, or gets :exc:`~wool_pooling.Lagged` (:ref:`lag`).
    :param restart: A :class:`RestartPolicy` to iterate the raw subscriber
        again when its stream fails (or ends), instead of ending every
        consumer; ``None`` (the default) ends them with the error.
    :param read_ahead: How many events the shared iteration may pull past
        the most advanced consumer's demand (inside ``max_lag``); ``0`` pulls
        on demand only.
    :param view: ``view(raw)`` returns what an entry remembers for late
        joiners, lagging consumers and restarts (a :class:`View`), called
        once per entry with its raw instance. ``None``: the worker view
        (:ref:`views`).
    :raises TypeError: at decoration, if given something other than a class
        with ``__aiter__``, if ``key`` or ``view`` is not callable, or if no
        call of the class could be passed to ``key``.
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
