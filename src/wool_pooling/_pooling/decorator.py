"""``@shared_subscription``: make constructing a class return a pooled
subscription, keyed by its arguments or its key function."""

from __future__ import annotations

import inspect
import math
import reprlib
from collections.abc import AsyncIterable
from collections.abc import Callable
from collections.abc import Hashable
from typing import Any
from typing import ParamSpec
from typing import TypeVar
from typing import overload

from .._core.fanout import DEFAULT_MAX_LAG
from .._core.fanout import DEFAULT_READ_AHEAD
from .._core.fanout import validate_max_lag
from .._core.fanout import validate_read_ahead
from .._core.signatures import BindingMemo
from .._core.signatures import signature_of
from .pool import CONFIG_ATTRIBUTE
from .pool import KeyFunction
from .pool import SubscriptionConfig
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


def derive_key(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """The subscription key of ``cls(*args, **kwargs)``.

    :raises Exception: what the key function raises, with a note naming it.
    :raises TypeError: if the arguments do not fit ``__init__``, or the key
        is not hashable.
    """
    config: SubscriptionConfig = getattr(cls, CONFIG_ATTRIBUTE)
    if config.key is None:
        key = _bound_arguments(cls, args, kwargs)
    else:
        # Binding costs more than the rest of a keyed construction, and
        # whether arguments fit depends only on their shape.
        shape = (len(args), frozenset(kwargs))
        if not _fitting.binds(cls, shape):
            _bound_arguments(cls, args, kwargs)  # fails here if they do not fit
            _fitting.add(cls, shape)
        try:
            key = config.key(cls, *args, **kwargs)
        except Exception as error:
            error.add_note(
                f"{cls.__qualname__}: its subscription key function "
                f"{_describe(config.key)} failed for {_call(cls, args, kwargs)}"
            )
            raise
    try:
        hash(key)
    except TypeError as error:
        raise TypeError(
            f"{cls.__qualname__}: subscription key {key!r} is not hashable"
        ) from error
    return key


def check_key(cls: type, key: KeyFunction) -> None:
    """Refuse a ``key`` that no call of ``cls`` could be passed to, whichever
    required arguments of ``__init__`` the call passes by position or by name.

    :raises TypeError: naming the class, the key function, the call it
        cannot take and Python's reason.
    """
    key_signature = signature_of(key)
    if key_signature is None:
        return
    init = signature_of(cls.__init__)
    required = [
        parameter
        for parameter in (list(init.parameters.values())[1:] if init else [])
        if parameter.default is parameter.empty
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]
    kinds = [parameter.kind for parameter in required]
    least = kinds.count(inspect.Parameter.POSITIONAL_ONLY)
    most = least + kinds.count(inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [parameter.name for parameter in required]
    failed: list[tuple[int, TypeError]] = []
    for split in range(most, least - 1, -1):  # fewer and fewer by position
        try:
            key_signature.bind_partial(
                cls, *names[:split], **dict.fromkeys(names[split:])
            )
        except TypeError as error:
            failed.append((split, error))
        else:
            return
    split, reason = failed[0]
    shown = ", ".join(["cls", *names[:split], *(f"{n}=" for n in names[split:])])
    raise TypeError(
        f"@shared_subscription: {cls.__qualname__}'s key function "
        f"{_describe(key)} cannot take key({shown}), the call "
        f"{cls.__qualname__}(...) makes ({reason}); a key takes the class "
        "first, then the arguments of __init__"
    )


def _describe(function: Callable[..., Any]) -> str:
    """``module.qualname(signature)`` of a function, as far as known."""
    name = getattr(function, "__qualname__", None) or repr(function)
    module = getattr(function, "__module__", None)
    if module and module != "builtins":
        name = f"{module}.{name}"
    signature = signature_of(function)
    return name if signature is None else f"{name}{signature}"


def _call(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """How ``cls(*args, **kwargs)`` reads, values shortened."""
    shown = [reprlib.repr(value) for value in args]
    shown += [f"{name}={reprlib.repr(value)}" for name, value in kwargs.items()]
    return f"{cls.__qualname__}({', '.join(shown)})"


#: Shapes of call (positional count, keyword names) that fit ``__init__``.
_fitting: BindingMemo[tuple[int, frozenset[str]]] = BindingMemo()


def _bound_arguments(
    cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """The arguments bound to ``__init__``, defaults applied, as a tuple.

    :raises TypeError: if they do not fit ``__init__``.
    """
    signature = signature_of(cls.__init__)
    if signature is None:
        return (args, tuple(sorted(kwargs.items())))
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError as error:
        raise TypeError(f"{cls.__qualname__}(): {error}") from error
    bound.apply_defaults()
    parameters = signature.parameters
    return tuple(
        tuple(sorted(value.items()))
        if parameters[name].kind is inspect.Parameter.VAR_KEYWORD
        else value
        for name, value in list(bound.arguments.items())[1:]
    )
