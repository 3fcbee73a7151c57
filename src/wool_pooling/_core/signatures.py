"""Arguments checked, when given, against the signature that will receive them.

A callable whose signature cannot be read is accepted unchecked. See
docs/guarantees.rst (Errors).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import types
import weakref
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any
from typing import TypeVar
from typing import cast

Shape = TypeVar("Shape", bound=Hashable)

__all__ = [
    "BindingMemo",
    "check_keywords",
    "check_positional",
    "did_you_mean",
    "signature_of",
    "suggest_keywords",
]


def signature_of(function: Callable[..., Any]) -> inspect.Signature | None:
    """``inspect.signature(function)``, or ``None`` when it cannot be read."""
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


class BindingMemo(weakref.WeakKeyDictionary[Any, set[Shape]]):
    """The shapes of call found to bind to each callable, held weakly (a
    binding costs tens of microseconds, on hot paths)."""

    def binds(self, function: object, shape: Shape) -> bool:
        """Whether ``shape`` was found to bind to ``function``."""
        try:
            return shape in self.get(function, ())
        except TypeError:  # not weakly referable
            return False

    def add(self, function: object, shape: Shape) -> None:
        """Remember that ``shape`` binds to ``function``."""
        with contextlib.suppress(TypeError):
            self.setdefault(function, set()).add(shape)


def _keywords(parameters: Mapping[str, inspect.Parameter]) -> list[str]:
    """The names of ``parameters`` a call can pass by keyword."""
    return [
        name
        for name, each in parameters.items()
        if each.kind in (each.POSITIONAL_OR_KEYWORD, each.KEYWORD_ONLY)
    ]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name``, or ``""``."""
    matches = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def check_keywords(
    function: Callable[..., Any], keywords: Mapping[str, object], what: str
) -> None:
    """Check that ``function(**keywords)`` binds to ``function``'s signature.

    :param what: How the message names the call.
    :raises TypeError: naming a keyword ``function`` does not take, or
        saying why the keywords do not bind.
    """
    plain: Any = function.__func__ if inspect.ismethod(function) else function
    memo, shape = _memo(plain, inspect.ismethod(function), *keywords)
    if _binds.binds(memo, shape):
        return
    signature = signature_of(function)
    if signature is None:
        return
    parameters = signature.parameters
    kinds = {parameter.kind for parameter in parameters.values()}
    accepted = _keywords(parameters)
    for name in keywords:
        if name not in parameters and inspect.Parameter.VAR_KEYWORD not in kinds:
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
    _binds.add(memo, shape)


#: Callables found to take these arguments: a function made anew (unpickled,
#: or a lambda per call) is remembered by its code, which it shares. A
#: positional check's shape is tagged: none equals a keyword check's.
_binds: BindingMemo[tuple[object, ...]] = BindingMemo()


def _memo(function: Any, *shape: object) -> tuple[object, tuple[object, ...]]:
    """Where ``_binds`` remembers ``shape`` for ``function``: a plain
    function's code, with its defaults' counts; any other callable itself."""
    if type(function) is types.FunctionType and not function.__dict__:
        defaults = len(function.__defaults__ or ()), len(function.__kwdefaults__ or ())
        return function.__code__, (*shape, *defaults)
    return function, shape


def check_positional(
    function: Callable[..., Any], count: int, what: Callable[[], str]
) -> None:
    """Check that ``function`` can be called with ``count`` positional arguments.

    :param what: Called for the message's start, naming the callable.
    :raises TypeError: when it cannot.
    """
    plain: Any = function
    if inspect.ismethod(function):
        plain = function.__func__
    elif (
        not isinstance(function, type)
        and inspect.isfunction(type(function).__call__)
        and getattr(function, "__signature__", None) is None
    ):
        plain = type(function).__call__  # what calling it calls, self first
    needed = count if plain is function else count + 1
    memo, shape = _memo(plain, "positional", needed)
    if _binds.binds(memo, shape):
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
    _binds.add(memo, shape)


Checked = TypeVar("Checked", bound=Callable[..., Any])


def suggest_keywords(target: Checked) -> Checked:
    """Make a misspelt keyword of ``target`` (a function, or a class's
    ``__init__``) fail with `` (did you mean 'x'?)``."""
    function: Callable[..., Any] = (
        target.__init__ if isinstance(target, type) else target  # pyright: ignore[reportUnknownMemberType]
    )
    accepted = frozenset(_keywords(inspect.signature(function).parameters))
    what = f"{function.__qualname__.removesuffix('.__init__')}()"

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for name in kwargs:
            if name not in accepted:
                raise TypeError(
                    f"{what} got an unexpected keyword argument {name!r}"
                    f"{did_you_mean(name, accepted)}"
                )
        return function(*args, **kwargs)

    if isinstance(target, type):
        setattr(target, "__init__", checked)  # noqa: B010
        return cast(Checked, target)
    return cast(Checked, checked)
