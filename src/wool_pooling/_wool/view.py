"""The worker view: what a shared discovery stream's entry remembers."""

from __future__ import annotations

import functools
import itertools
import types
import uuid
from collections import deque
from collections.abc import Iterator
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from wool import DiscoveryEvent
from wool import WorkerMetadata

from .._core.signatures import suggest_keywords
from .._pooling import decorator
from .._pooling.view import View
from .workers import WorkerMap
from .workers import Workers

__all__ = ["WorkerView", "shared_subscription"]

#: An undo record: the uid an item changed and its metadata before (``None``:
#: it was not known), or ``None`` for an item that changed nothing tracked.
_Undo = tuple[uuid.UUID, WorkerMetadata | None] | None


class WorkerView(WorkerMap, View[Any]):
    """The workers a discovery stream has made known, as a pool entry's view.

    A joiner is replayed one ``worker-added`` per known worker; a consumer
    that falls behind is caught up by the difference between the workers it
    had seen (rebuilt from undo records of the last items) and the current
    ones, and so is a restarted stream's report (see :ref:`restart`). Once
    an item that is not a discovery event has passed, a consumer that falls
    behind gets :exc:`~wool_pooling.Lagged`. Memory held: one metadata per
    known worker and the undo records.

    :param raw: The entry's raw instance (unused).
    """

    __slots__ = ("_at", "_reported", "_undo", "count", "untracked")

    def __init__(self, raw: object = None) -> None:
        super().__init__()
        #: Whether an item that is not a discovery event has passed.
        self.untracked = False
        #: Items recorded so far.
        self.count = 0
        self._undo: deque[_Undo] | None = None
        # The last view seen_at() built, while no item followed: consumers that
        # fell behind at the same item share it.
        self._at: tuple[int, int, Workers] | None = None
        # While relisting: the workers the new stream has reported.
        self._reported: set[uuid.UUID] | None = None

    def remember(self, items: int | None) -> None:
        self._undo = None if items is None else deque(maxlen=items)

    def record(self, item: Any) -> None:
        # The per-item path of every shared stream: one dict update, inline.
        self.count += 1
        undo: _Undo = None
        if isinstance(item, DiscoveryEvent):
            metadata = item.metadata
            uid = metadata.uid
            workers = self.workers
            if item.type == "worker-dropped":
                undo = (uid, workers.pop(uid, None))
            else:
                undo = (uid, workers.get(uid))
                workers[uid] = metadata
        else:
            self.untracked = True
        if self._undo is not None:
            self._undo.append(undo)

    def catch_up(self, seen: object) -> deque[DiscoveryEvent] | None:
        if self.untracked or not isinstance(seen, dict):
            return None
        return WorkerMap(seen).diff(self)  # pyright: ignore[reportUnknownArgumentType]

    def relisting(self) -> None:
        self._reported = set()

    def relist(self, item: Any) -> Any:
        reported = self._reported
        if reported is None or not isinstance(item, DiscoveryEvent):
            self.record(item)
            return item
        uid = item.metadata.uid
        if item.type == "worker-dropped":
            reported.discard(uid)
        else:
            reported.add(uid)
        # What applying it passes on, then taken in as any item is.
        before = self.workers.get(uid)
        passed = WorkerMap({} if before is None else {uid: before}).apply(item)
        if passed is not None:
            self.record(passed)
        return passed

    def settled(self) -> Iterator[DiscoveryEvent]:
        reported, self._reported = self._reported or set(), None
        for uid in [uid for uid in self.workers if uid not in reported]:
            dropped = DiscoveryEvent("worker-dropped", metadata=self.workers[uid])
            self.record(dropped)
            yield dropped

    def snapshot(self) -> Mapping[Any, Any]:
        return types.MappingProxyType(dict(self.workers))

    def seen_at(self, position: int) -> Workers:
        """The known workers as they stood after the first ``position`` items
        (read-only: it may be shared with the next call).

        :raises ValueError: if ``position`` is ahead of :attr:`count`, or
            further back than the items remembered.
        """
        back = self.count - position
        undo = self._undo
        if back < 0 or back > (0 if undo is None else len(undo)):
            raise ValueError(
                f"cannot rebuild the workers after item {position}: "
                f"{self.count} recorded, history of {len(undo or ())}"
            )
        cached = self._at
        if cached is not None and cached[:2] == (self.count, position):
            return cached[2]
        view = dict(self.workers)
        for record in itertools.islice(reversed(undo or ()), back):
            if record is not None:
                uid, before = record
                if before is None:
                    view.pop(uid, None)
                else:
                    view[uid] = before
        self._at = (self.count, position, view)
        return view


if TYPE_CHECKING:
    shared_subscription = decorator.shared_subscription
else:
    # (checked apart from the documented function, whose signature it keeps)
    _checked = suggest_keywords(decorator.shared_subscription)

    @functools.wraps(decorator.shared_subscription)
    def shared_subscription(cls=None, /, *, view=None, **options):
        # The public decorator: the worker view unless told otherwise.
        return _checked(cls, view=WorkerView if view is None else view, **options)
