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
    """Known workers by uid, each with its latest metadata, in first-seen order.

    The one place where a discovery event is applied to a view of the
    workers. :meth:`apply` keeps the events passed on a consistent
    lifecycle, whatever the stream claims:

    - never a second ``worker-added``: an add of a known worker with new
      metadata is passed on as ``worker-updated``, with equal metadata not
      at all;
    - never an unchanged ``worker-updated``: it is not passed on; an update
      of an unknown worker is passed on as ``worker-added``;
    - never a drop of an unknown worker; a drop passed on carries the
      metadata last passed on for that worker (the one its consumers hold).

    :meth:`diff` and :meth:`replay` give the events that lead a consumer
    from one view, or from none, to this one. Memory held: one metadata
    per known worker.

    :param workers: The view to start from, used as is (not copied);
        empty by default.
    """

    __slots__ = ("workers",)

    def __init__(self, workers: Workers | None = None) -> None:
        #: The known workers: uid to latest metadata, in first-seen order.
        self.workers: Workers = {} if workers is None else workers

    def __len__(self) -> int:
        return len(self.workers)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {len(self.workers)} workers>"

    def apply(self, event: DiscoveryEvent) -> DiscoveryEvent | None:
        """Apply ``event``; return the event to pass on (see :meth:`passed`),
        or ``None``, and then the map is left as it was."""
        passed = self.passed(event)
        if passed is not None:
            self.take(passed)
        return passed

    def passed(self, event: DiscoveryEvent) -> DiscoveryEvent | None:
        """The event :meth:`apply` would pass on for ``event``, applying nothing.

        ``event`` itself unless it has to be rewritten (an add that is an
        update, an update that is an add, a drop whose metadata is not the
        one known); ``None`` if it changes nothing (a repeated add or update
        with equal metadata, a drop of an unknown worker).
        """
        metadata = event.metadata
        before = self.workers.get(metadata.uid)
        if event.type == "worker-dropped":
            if before is None or metadata is before:
                return None if before is None else event
            return DiscoveryEvent("worker-dropped", metadata=before)
        if before is None:
            if event.type == "worker-added":
                return event
            return DiscoveryEvent("worker-added", metadata=metadata)
        if before is metadata or before == metadata:
            return None
        if event.type == "worker-updated":
            return event
        return DiscoveryEvent("worker-updated", metadata=metadata)

    def take(self, event: DiscoveryEvent) -> None:
        """Apply ``event`` as it is: a drop forgets the worker, any other
        event sets its metadata."""
        metadata = event.metadata
        if event.type == "worker-dropped":
            self.workers.pop(metadata.uid, None)
        else:
            self.workers[metadata.uid] = metadata

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
        """The events that turn this view into ``other`` (this map is unchanged).

        ``worker-added`` for a worker only ``other`` knows and
        ``worker-updated`` for one whose metadata differs, both in
        ``other``'s order, then ``worker-dropped`` (with the metadata this
        view has) for each worker ``other`` does not know, in this view's
        order. Applying them in turn to this view gives ``other``.
        """
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
        """One ``worker-added`` per known worker, with its latest metadata, in
        first-seen order: what leads a consumer that knows nothing here."""
        return deque(
            DiscoveryEvent("worker-added", metadata=metadata)
            for metadata in self.workers.values()
        )
