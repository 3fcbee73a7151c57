"""The known workers of one shared discovery stream, and the replay built from them."""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from typing import Any
from typing import final

from wool import DiscoveryEvent
from wool import WorkerMetadata

__all__ = ["TrackedSource"]


@final
class TrackedSource:
    """The raw subscriber's single iteration, recording which workers are known.

    This is the source a pool entry's :class:`~wool_pooling.Fanout` pulls
    from, so the state is updated exactly once per source event, in the pump,
    before any consumer sees the event. A consumer that registers with the
    fan-out and takes :meth:`replay` in the same synchronous step therefore
    sees every known worker once, then exactly the events after that point:
    no gap, no duplicate.

    Known workers are those added or updated and not dropped since, each with
    its latest metadata, in the order they were first seen. Items that are not
    discovery events pass through untracked. Memory held: one metadata per
    known worker.
    """

    __slots__ = ("_iterator", "_raw", "workers")

    def __init__(self, raw: AsyncIterable[Any]) -> None:
        self._raw = raw
        self._iterator: AsyncIterator[Any] | None = None
        self.workers: dict[uuid.UUID, WorkerMetadata] = {}

    def __aiter__(self) -> TrackedSource:
        return self

    async def __anext__(self) -> Any:
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = aiter(self._raw)
        event = await anext(iterator)
        if isinstance(event, DiscoveryEvent):
            metadata = event.metadata
            if event.type == "worker-dropped":
                self.workers.pop(metadata.uid, None)
            else:
                self.workers[metadata.uid] = metadata
        return event

    def replay(self) -> deque[DiscoveryEvent]:
        """One ``worker-added`` event per known worker, with its latest metadata."""
        return deque(
            DiscoveryEvent("worker-added", metadata=metadata)
            for metadata in self.workers.values()
        )

    async def aclose(self) -> None:
        """Close the raw subscriber's iterator, if it was started and can be closed."""
        iterator, self._iterator = self._iterator, None
        closer = getattr(iterator, "aclose", None)
        if closer is not None:
            await closer()
