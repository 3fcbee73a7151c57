"""``afilter``: one consumer's view of a discovery stream, filtered."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from collections.abc import Callable
from typing import Any

import anyio
import attrs
from wool import DiscoveryEvent
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata

from .._core.iterators import aclose_iterator
from .._core.signatures import check_positional
from .._core.signatures import suggest_keywords
from .workers import WorkerMap


@suggest_keywords
@attrs.frozen
class afilter:
    """The part of ``inner``'s discovery stream that concerns the workers
    ``predicate`` accepts, as a consistent lifecycle per worker. Two are
    equal, hash alike and pickle as their arguments. See "Filters" in
    :doc:`wool`.

    :param predicate: Called with a worker's metadata: whether it passes.
    :param inner: The discovery subscriber to filter.
    :raises TypeError: if ``predicate`` is not callable with one argument,
        or ``inner`` is not async-iterable.
    """

    #: Whether a worker passes, given its metadata.
    predicate: Callable[[WorkerMetadata], bool]
    #: The upstream discovery subscriber.
    inner: DiscoverySubscriberLike

    def __attrs_post_init__(self) -> None:
        predicate, inner = self.predicate, self.inner
        if not callable(predicate):
            raise TypeError(f"afilter predicate must be callable, got {predicate!r}")
        check_positional(predicate, 1, lambda: f"afilter predicate {predicate!r}")
        if not hasattr(inner, "__aiter__"):
            msg = f"afilter inner must have __aiter__, got {type(inner).__name__}"
            raise TypeError(f"{msg}: {inner!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (afilter, (self.predicate, self.inner))

    async def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        predicate = self.predicate
        passing = WorkerMap()
        iterator = aiter(self.inner)
        try:
            async for event in iterator:
                if event.type == "worker-dropped" or predicate(event.metadata):
                    passed = passing.apply(event)
                else:  # it does not pass (any longer)
                    passed = passing.drop(event.metadata.uid)
                if passed is not None:
                    yield passed
        finally:
            with anyio.CancelScope(shield=True):
                await aclose_iterator(iterator)
