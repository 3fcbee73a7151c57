from __future__ import annotations

from collections.abc import AsyncGenerator
from collections.abc import Callable
from typing import Any
from typing import Final

import anyio
from wool import DiscoveryEvent
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata

from .._core.iterators import aclose_iterator
from .._core.signatures import check_positional
from .workers import WorkerMap


class afilter:
    """Transition-tracking filter over a wool discovery stream.

    Yields only the part of ``inner``'s stream that concerns workers
    satisfying ``predicate``, rewriting events so that consumers see a
    consistent lifecycle for every worker that passes:

    - a worker entering the predicate yields ``worker-added``;
    - an add or update of a tracked worker that still passes yields
      ``worker-updated`` with the new metadata, if its metadata changed;
    - a tracked worker that stops passing yields ``worker-dropped``
      with its *previous* (tracked) metadata;
    - a ``worker-dropped`` of a tracked worker passes through, with the
      tracked metadata;
    - any other event (non-passing or dropped untracked worker, or an
      add or update with unchanged metadata) is suppressed.

    These are the rules :class:`~wool_pooling.SharedDiscovery` applies to
    the whole stream, applied to the workers that pass.

    Guarantees:

    - each ``__aiter__`` call is an independent iteration with its own
      tracking state, so one ``afilter`` may be iterated many times,
      sequentially or concurrently;
    - the relative order of the inner events is preserved;
    - memory held is one :class:`WorkerMetadata` per tracked worker per
      iteration;
    - when an iteration ends, is closed (``aclose()``) or is cancelled,
      the inner iterator is closed too (if it has ``aclose``);
    - two are equal (and hash alike) when their predicates and inners are,
      and a pickled copy (``predicate`` and ``inner`` pickled) is equal to
      the original.

    :param predicate: Callable deciding whether a worker passes.
    :param inner: Upstream discovery subscriber to filter.
    :raises TypeError: If ``predicate`` is not callable or cannot be
        called with one argument (a worker's metadata), or ``inner`` is not
        async-iterable.
    """

    __slots__ = ("_inner", "_predicate")

    _predicate: Final[Callable[[WorkerMetadata], bool]]
    _inner: Final[DiscoverySubscriberLike]

    def __init__(
        self,
        predicate: Callable[[WorkerMetadata], bool],
        inner: DiscoverySubscriberLike,
    ) -> None:
        if not callable(predicate):
            raise TypeError(f"afilter predicate must be callable, got {predicate!r}")
        check_positional(predicate, 1, lambda: f"afilter predicate {predicate!r}")
        if not hasattr(inner, "__aiter__"):
            msg = f"afilter inner must have __aiter__, got {type(inner).__name__}"
            raise TypeError(f"{msg}: {inner!r}")
        self._predicate = predicate
        self._inner = inner

    @property
    def predicate(self) -> Callable[[WorkerMetadata], bool]:
        """The predicate deciding which workers pass."""
        return self._predicate

    @property
    def inner(self) -> DiscoverySubscriberLike:
        """The upstream discovery subscriber."""
        return self._inner

    def __repr__(self) -> str:
        return f"afilter({self._predicate!r}, {self._inner!r})"

    def _arguments(
        self,
    ) -> tuple[Callable[[WorkerMetadata], bool], DiscoverySubscriberLike]:
        """The one record of the constructor arguments: pickling, equality
        and hash all read it."""
        return (self._predicate, self._inner)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, afilter):
            return NotImplemented
        return self._arguments() == other._arguments()

    def __hash__(self) -> int:
        return hash(self._arguments())

    def __reduce__(self) -> tuple[Any, ...]:
        return (afilter, self._arguments())

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self._filter()

    async def _filter(self) -> AsyncGenerator[DiscoveryEvent, None]:
        """Iterate the inner subscriber, applying the transition rules."""
        predicate = self._predicate
        tracked = WorkerMap()
        iterator = aiter(self._inner)
        try:
            async for event in iterator:
                if event.type == "worker-dropped" or predicate(event.metadata):
                    passed = tracked.apply(event)
                else:  # it does not pass (any longer)
                    passed = tracked.drop(event.metadata.uid)
                if passed is not None:
                    yield passed
        finally:
            with anyio.CancelScope(shield=True):
                await aclose_iterator(iterator)
