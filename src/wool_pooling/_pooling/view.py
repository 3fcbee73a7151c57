"""The View: what a pool entry remembers of its stream for late joiners."""

from __future__ import annotations

import types
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any
from typing import Generic
from typing import TypeVar

__all__ = ["View", "ViewFactory"]

T = TypeVar("T")

#: What ``shared_subscription(view=...)`` takes: called once per pool entry
#: with the raw instance, once built; returns the entry's view.
ViewFactory = Callable[[Any], "View[Any]"]

_EMPTY: Mapping[Any, Any] = types.MappingProxyType({})


class View(Generic[T]):
    """What a pool entry remembers of its stream, for the consumers that join
    late, fall behind, or outlive a restart.

    This base class remembers nothing: a joiner gets no replay, a consumer
    that falls behind gets :exc:`~wool_pooling.Lagged`, a restarted stream's
    items pass as they come. Override what your stream needs. Each method is
    called synchronously, in the entry's event loop, in log order, in the
    step that logs the item, so the view always describes the log's end.
    See :ref:`views` in docs/custom-subscribers.rst.
    """

    __slots__ = ()

    def remember(self, items: int | None) -> None:
        """Be ready for :meth:`seen_at` up to ``items`` items back (``None``:
        never called). Called once, before any :meth:`record`."""

    def record(self, item: T) -> None:
        """Take ``item``, the next one logged."""

    def replay(self) -> Collection[T]:
        """What a consumer joining now receives before the live items."""
        return ()

    def joined(self) -> None:
        """A consumer joined the entry (its replay taken); must not block."""

    def seen_at(self, position: int) -> object:
        """What a consumer had seen once the first ``position`` items were
        logged: called as it falls behind, handed back to :meth:`catch_up`."""
        return None

    def catch_up(self, seen: object) -> Collection[T] | None:
        """The items that lead a consumer from ``seen`` (from :meth:`seen_at`)
        to the log's end, in place of those it missed; ``None`` if none can,
        and it then gets :exc:`~wool_pooling.Lagged`."""
        return None

    def relisting(self) -> None:
        """The stream was restarted: the items that follow relist what it
        knows, until :meth:`settled`."""

    def relist(self, item: T) -> T | None:
        """Take in ``item`` of a relisting stream; return what to log in its
        place (``None``: nothing), as :meth:`record` would have taken it."""
        self.record(item)
        return item

    def settled(self) -> Iterable[T]:
        """The relisting is over (its end marked, or the policy's ``settle``
        time): the items to log now, each taken in as it is iterated."""
        return ()

    def snapshot(self) -> Mapping[Any, Any]:
        """What the view holds now, keyed (the workers by uid, say): read-only."""
        return _EMPTY
