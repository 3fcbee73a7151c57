"""Arguments checked against the signature of what will receive them.

A callable the library stores to call later (a discovery's ``subscribe``, a
key function, a predicate, a callback) is checked when it is given: the
arguments it will be called with must bind to its signature, so a misspelt
option or a missing parameter fails at the line that passed it, with a
:exc:`TypeError` naming the argument (and, for a misspelt name, the closest
accepted one), instead of at the first call, possibly in another task or
process. A callable whose signature cannot be read (some builtins) is
accepted unchecked.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import types
import weakref
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any
from typing import Generic
from typing import TypeVar

Shape = TypeVar("Shape", bound=Hashable)

__all__ = [
    "BindingMemo",
    "check_keywords",
    "check_positional",
    "did_you_mean",
    "signature_of",
]

_KEYWORD_KINDS = (
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
)


def signature_of(function: Callable[..., Any]) -> inspect.Signature | None:
    """``inspect.signature(function)``, or ``None`` when it cannot be read."""
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


class BindingMemo(Generic[Shape]):
    """The shapes of call found to bind to each callable, held weakly.

    Whether arguments bind to a signature depends on their shape only (how
    many are positional, which names are given), and reading and binding a
    signature costs tens of microseconds, so each check is made once per
    callable and shape. A callable that cannot be weakly referenced is never
    remembered: it is checked every time.
    """

    __slots__ = ("_bound",)

    def __init__(self) -> None:
        self._bound: weakref.WeakKeyDictionary[Any, set[Shape]] = (
            weakref.WeakKeyDictionary()
        )

    def binds(self, function: object, shape: Shape) -> bool:
        """Whether ``shape`` was found to bind to ``function``."""
        try:
            return shape in self._bound.get(function, ())
        except TypeError:  # not weakly referable
            return False

    def add(self, function: object, shape: Shape) -> None:
        """Remember that ``shape`` binds to ``function``."""
        with contextlib.suppress(TypeError):
            self._bound.setdefault(function, set()).add(shape)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name``
    (:func:`difflib.get_close_matches`), or ``""`` when none is close."""
    matches = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def check_keywords(
    function: Callable[..., Any], keywords: Mapping[str, object], what: str
) -> None:
    """Check that ``function(**keywords)`` binds to ``function``'s signature.

    :param what: How the message names the call, e.g.
        ``"SharedDiscovery: LocalDiscovery.subscribe()"``.
    :raises TypeError: for a name ``function`` has no parameter of (unless
        it takes ``**kwargs``): the message names it, the closest accepted
        name and every accepted one; or when the keywords do not bind
        otherwise (a positional-only parameter given by name, a required
        parameter missing): the message names them and says why.
    """
    plain: Any = function.__func__ if inspect.ismethod(function) else function
    names = (inspect.ismethod(function), *keywords)
    if _binds.binds(plain, names):
        return
    signature = signature_of(function)
    if signature is None:
        return
    parameters = signature.parameters
    takes_any = any(
        parameter.kind is inspect.Parameter.VAR_KEYWORD
        for parameter in parameters.values()
    )
    if not takes_any:
        accepted = [
            name
            for name, parameter in parameters.items()
            if parameter.kind in _KEYWORD_KINDS
        ]
        for name in keywords:
            if name not in parameters:
                takes = ", ".join(accepted) if accepted else "no keyword"
                raise TypeError(
                    f"{what} has no parameter {name!r}"
                    f"{did_you_mean(name, accepted)}; it takes {takes}"
                )
    try:
        signature.bind(**keywords)
    except TypeError as error:
        shown = ", ".join(f"{name}={value!r}" for name, value in keywords.items())
        raise TypeError(f"{what} cannot be called with ({shown}): {error}") from None
    _binds.add(plain, names)


#: Functions (a bound method: its function) found to take so many keywords
#: by these names (whether bound first): whether keywords bind depends on
#: their names only, and some wrappers are rebuilt at every unpickling.
_binds: BindingMemo[tuple[object, ...]] = BindingMemo()


#: Callables other than plain functions found to take so many positional
#: arguments: reading a signature costs tens of microseconds, and the same
#: callbacks are checked at every call of some hot paths.
_takes: BindingMemo[int] = BindingMemo()

#: Plain functions' shapes (see :func:`_shape`) found to take so many
#: positional arguments. A function unpickled anew (a predicate wool ships
#: with every task) is a new object each time, with the shape of the last.
_shape_takes: dict[tuple[int, ...], set[int]] = {}

_VARIADIC = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


def _shape(function: object) -> tuple[int, ...] | None:
    """All that decides which positional arguments bind to ``function``, if
    it is a plain Python function with no attribute of its own (so no
    ``__wrapped__`` or ``__signature__`` that a signature would follow): its
    code's parameter counts and variadic flags, and how many defaults it
    has. ``None`` for anything else."""
    if type(function) is not types.FunctionType or function.__dict__:
        return None
    code = function.__code__
    return (
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_flags & _VARIADIC,
        len(function.__defaults__ or ()),
        len(function.__kwdefaults__ or ()),
    )


def check_positional(
    function: Callable[..., Any], count: int, what: Callable[[], str]
) -> None:
    """Check that ``function`` can be called with ``count`` positional arguments.

    :param what: Called for the message's start, which names the callable,
        e.g. ``"afilter predicate <function is_ready>"``; the message goes
        on with ``"must take N positional argument(s)"`` and the reason.
    :raises TypeError: when it cannot (too many or too few parameters).
    """
    plain: Any = function
    needed = count
    if inspect.ismethod(function):
        plain, needed = function.__func__, count + 1
    elif _called_through_its_class(function):
        # An instance whose class defines __call__ in Python: checked, and
        # remembered, as that function (each new instance costs nothing).
        plain, needed = type(function).__call__, count + 1
    shape = _shape(plain)
    if shape is not None:
        if needed in _shape_takes.get(shape, ()):
            return
    elif _takes.binds(plain, needed):
        return
    signature = signature_of(plain)
    if signature is None:
        return
    try:
        signature.bind(*(None,) * needed)
    except TypeError as error:
        plural = "" if count == 1 else "s"
        raise TypeError(
            f"{what()} must take {count} positional argument{plural}: {error}"
        ) from None
    if shape is not None:
        _shape_takes.setdefault(shape, set()).add(needed)
    else:
        _takes.add(plain, needed)


def _called_through_its_class(function: object) -> bool:
    """Whether calling ``function`` is calling its class's Python
    ``__call__`` with it first, so that the signature is that function's: an
    instance (not a class, function or method) with no ``__signature__`` of
    its own, whose class's ``__call__`` is a plain function."""
    return (
        not isinstance(function, type)
        and not inspect.isfunction(function)
        and not inspect.ismethod(function)
        and callable(function)
        and inspect.isfunction(type(function).__call__)
        and getattr(function, "__signature__", None) is None
    )
