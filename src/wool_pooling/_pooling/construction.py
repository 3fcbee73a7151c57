"""How a decorated class is keyed and how its raw, unpooled instance is built."""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Callable
from collections.abc import Hashable
from typing import Any
from typing import cast

import attrs

from .._core.signatures import BindingMemo
from .._core.signatures import signature_of
from .restart import RestartPolicy
from .view import ViewFactory

__all__ = [
    "CONFIG_ATTRIBUTE",
    "SubscriptionConfig",
    "build_raw",
    "check_key",
    "derive_key",
]

#: Name of the class attribute holding a decorated class's configuration.
CONFIG_ATTRIBUTE = "__shared_subscription__"

KeyFunction = Callable[..., Hashable]


@attrs.frozen
class SubscriptionConfig:
    """What ``@shared_subscription`` recorded on a class: its arguments, and
    the ``__new__`` the class defined itself (``own_new``)."""

    key: KeyFunction | None
    ttl: float
    max_lag: int | None
    restart: RestartPolicy | None
    read_ahead: int
    view: ViewFactory | None
    own_new: Any


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
    first: tuple[str, str] | None = None
    for split in range(most, least - 1, -1):  # fewer and fewer by position
        by_position = [parameter.name for parameter in required[:split]]
        by_name = [parameter.name for parameter in required[split:]]
        try:
            key_signature.bind_partial(cls, *by_position, **dict.fromkeys(by_name))
        except TypeError as error:
            shown = ", ".join(["cls", *by_position, *(f"{n}=" for n in by_name)])
            first = first or (shown, str(error))
        else:
            return
    assert first is not None
    shown, reason = first
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


def build_raw(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Build what ``cls(*args, **kwargs)`` would be without pooling (this
    library's or wool's)."""
    new = _unpooled_new(cls)
    if new is object.__new__:
        instance = cast(object, object.__new__(cls))
    else:
        instance = cast(object, new(cls, *args, **kwargs))
    if isinstance(instance, cls):
        cls.__init__(instance, *args, **kwargs)
    return instance


def _unpooled_new(cls: type) -> Callable[..., Any]:
    for klass in cls.__mro__:
        namespace = vars(klass)
        config = namespace.get(CONFIG_ATTRIBUTE)
        candidate = config.own_new if config is not None else namespace.get("__new__")
        if candidate is None or _is_pooling(candidate):
            continue
        if isinstance(candidate, staticmethod):
            candidate = candidate.__func__  # type: ignore[reportUnknownMemberType]
        return candidate  # type: ignore[no-any-return]
    return object.__new__


def _is_pooling(new: Any) -> bool:
    function = new.__func__ if isinstance(new, staticmethod) else new  # type: ignore[reportUnknownMemberType]
    if getattr(function, "__wool_pooling__", False):
        return True
    # wool's SubscriberMeta injects its own pooling __new__ into every class
    # it creates; building a raw instance must go around it.
    return getattr(function, "__module__", None) == "wool.runtime.discovery.pool"
