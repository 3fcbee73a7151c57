"""The workers a discovery stream has made known, and the events that change them."""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Mapping

from wool import DiscoveryEvent
from wool import WorkerMetadata

__all__ = ["WorkerMap", "Workers"]

Workers = dict[uuid.UUID, WorkerMetadata]


class WorkerMap:
    """Known workers by uid, each with its latest metadata, in first-seen
    order: the one place where a discovery event is applied to a view of
    the workers, keeping the events passed on a consistent lifecycle (the
    rules of "Filters" in docs/wool.rst).

    :param workers: The view to start from, used as is (not copied).
    """

    __slots__ = ("workers",)

    def __init__(self, workers: Workers | None = None) -> None:
        self.workers: Workers = {} if workers is None else workers

    def __len__(self) -> int:
        return len(self.workers)

    def apply(self, event: DiscoveryEvent) -> DiscoveryEvent | None:
        """Apply ``event``; return the event to pass on (``event``, or it
        rewritten), or ``None`` if it changes nothing."""
        metadata = event.metadata
        uid = metadata.uid
        workers = self.workers
        if event.type == "worker-dropped":
            before = workers.pop(uid, None)
            if before is None:
                return None
            if metadata is before:
                return event
            return DiscoveryEvent("worker-dropped", metadata=before)
        before = workers.get(uid)
        if before is None:
            workers[uid] = metadata
            if event.type == "worker-added":
                return event
            return DiscoveryEvent("worker-added", metadata=metadata)
        if before is metadata or before == metadata:
            return None
        workers[uid] = metadata
        if event.type == "worker-updated":
            return event
        return DiscoveryEvent("worker-updated", metadata=metadata)

    def drop(self, uid: uuid.UUID) -> DiscoveryEvent | None:
        """Forget worker ``uid``: its ``worker-dropped`` (with the metadata
        known), or ``None`` if it was not known."""
        before = self.workers.pop(uid, None)
        if before is None:
            return None
        return DiscoveryEvent("worker-dropped", metadata=before)

    def diff(
        self, other: WorkerMap | Mapping[uuid.UUID, WorkerMetadata]
    ) -> deque[DiscoveryEvent]:
        """The events that turn this view into ``other``: adds and updates in
        ``other``'s order, then drops in this view's."""
        target = other.workers if isinstance(other, WorkerMap) else other
        seen = self.workers
        events: deque[DiscoveryEvent] = deque()
        for uid, metadata in target.items():
            before = seen.get(uid)
            if before is None:
                events.append(DiscoveryEvent("worker-added", metadata=metadata))
            elif before is not metadata and before != metadata:
                events.append(DiscoveryEvent("worker-updated", metadata=metadata))
        for uid, metadata in seen.items():
            if uid not in target:
                events.append(DiscoveryEvent("worker-dropped", metadata=metadata))
        return events

    def replay(self) -> deque[DiscoveryEvent]:
        """One ``worker-added`` per known worker, in first-seen order."""
        return deque(
            DiscoveryEvent("worker-added", metadata=metadata)
            for metadata in self.workers.values()
        )
