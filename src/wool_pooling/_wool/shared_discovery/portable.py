"""What of a ``SharedDiscovery`` travels to another process (never the
discovery the pools entered), and its upstream's key; see docs/wool.rst."""

from __future__ import annotations

import copyreg
import functools
import inspect
import pickle
from collections.abc import Callable
from collections.abc import Hashable
from typing import Any
from typing import final

import attrs
import cloudpickle
import wool

#: The options passed to the inner discovery's ``subscribe``, frozen.
Options = tuple[tuple[str, Hashable], ...]

#: wool's discoveries that travel as their class and constructor arguments.
BY_CONSTRUCTOR: tuple[type, ...] = (wool.LocalDiscovery, wool.LanDiscovery)

#: ``(factory, args, kwargs)``: ``factory(*args, **kwargs)`` rebuilds a
#: discovery, unentered.
Recipe = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


@final
@attrs.define(eq=False, repr=False)
class Portable:
    """The one record of a ``SharedDiscovery``'s arguments, read by its
    pickling, and its equality, hash and upstream through :attr:`key`. Its
    discovery travels by a ``recipe`` (wool's), by its own reduction, or as
    ``shipped``, the subscriber it returned, pickled, arriving as a
    :class:`SubscriberOnly`.
    """

    discovery: Any
    options: Options
    recipe: Recipe | None = None
    shipped: bytes | None = None

    @classmethod
    def of(cls, discovery: object, options: Options) -> Portable:
        """Settle how ``discovery`` travels.

        :raises TypeError: if neither it nor what its ``subscribe`` returns pickles.
        """
        kind = type(discovery)
        if kind in BY_CONSTRUCTOR:
            return cls(discovery, options, _recipe(discovery))
        if (
            kind.__reduce__ is not object.__reduce__
            or kind.__reduce_ex__ is not object.__reduce_ex__
            or kind in copyreg.dispatch_table
        ):  # it says itself how it pickles: only it knows what may travel
            return cls(discovery, options)
        return cls(discovery, options, shipped=_ship(discovery, options))

    @functools.cached_property
    def key(self) -> Hashable:
        """The recipe, else the discovery (by identity if unhashable), and the
        options; computed when first needed (a hash may resolve a host)."""
        if self.recipe is not None:
            factory, args, kwargs = self.recipe
            part = (factory, args, tuple(sorted(kwargs.items())))
            if _hashable(part):
                return (part, self.options)
        if _hashable(self.discovery):
            return (self.discovery, self.options)
        # By identity: whatever holds this key holds the discovery too.
        return (("id", id(self.discovery)), self.options)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.shipped is not None:
            return (Portable, (SubscriberOnly(self.shipped), self.options))
        if self.recipe is None:
            return (Portable, (self.discovery, self.options))
        return (rebuild, (self.options, *self.recipe))


def rebuild(
    options: Options,
    factory: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Portable:
    """Unpickle a :class:`Portable` from its recipe: a fresh, unentered discovery."""
    return Portable(factory(*args, **kwargs), options, (factory, args, kwargs))


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _recipe(discovery: object) -> Recipe:
    """The class of ``discovery`` and the arguments it was built with, read
    back from the attributes wool keeps them in (``_namespace`` for
    ``namespace``). Defaults are left out, and arguments go by position
    until one is: every task wool pickles stays small."""
    cls = type(discovery)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True
    for parameter in inspect.signature(cls).parameters.values():
        try:
            value = getattr(discovery, f"_{parameter.name}")
        except AttributeError:
            raise TypeError(
                f"SharedDiscovery cannot read {parameter.name!r} back from "
                f"{cls.__qualname__}: subclass it with a __reduce__"
            ) from None
        default = parameter.default
        if value is default or (type(value) is type(default) and value == default):
            positional = False
            continue
        if parameter.kind is parameter.POSITIONAL_OR_KEYWORD and positional:
            args.append(value)
        else:
            kwargs[parameter.name] = value
    return (cls, tuple(args), kwargs)


def _ship(discovery: Any, options: Options) -> bytes:
    """What ``discovery.subscribe(**options)`` returns, pickled with
    cloudpickle, to travel in the place of ``discovery`` as wool ships it.

    :raises TypeError: if ``subscribe`` raises or its result does not pickle.
    """
    name = type(discovery).__qualname__
    cannot = f"SharedDiscovery cannot ship a {name} to worker processes"
    remedy = (
        f"make that picklable, or add a __reduce__ to {name} that rebuilds it, "
        "unentered: 'def __reduce__(self): return (type(self), (self.namespace,))'"
    )
    try:
        subscriber: object = discovery.subscribe(**dict(options))
    except Exception as error:
        shown = ", ".join(f"{key}={value!r}" for key, value in options)
        raise TypeError(
            f"{cannot}, but subscribe({shown}) raised {error!r}; {remedy}"
        ) from error
    try:
        return cloudpickle.dumps(subscriber)  # pyright: ignore[reportUnknownMemberType]
    except Exception as error:
        raise TypeError(
            f"{cannot}, but that {type(subscriber).__qualname__} does not "
            f"pickle ({error}); {remedy}"
        ) from error


@attrs.frozen
class SubscriberOnly:
    """A discovery that cannot travel, as it arrives in another process: the
    subscriber its ``subscribe(**options)`` returned, pickled where it was
    wrapped. Equal when pickled to the same bytes, so the copies of one
    subscription reaching a process share one upstream.
    """

    data: bytes

    def subscribe(self, **options: Hashable) -> object:
        """The subscriber, unpickled afresh (``options`` applied where it was made)."""
        return pickle.loads(self.data)
