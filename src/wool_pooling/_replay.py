"""The known workers of one shared discovery stream: replay and restart resync."""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any
from typing import final

import anyio
from wool import DiscoveryEvent
from wool import WorkerMetadata

from ._loop import current_loop
from ._restart import RestartPolicy

__all__ = ["TrackedSource", "Workers", "apply_event", "diff_events"]

restart_logger = logging.getLogger("wool_pooling.restart")

Workers = dict[uuid.UUID, WorkerMetadata]


def apply_event(workers: Workers, event: object) -> None:
    """Record in ``workers`` what a discovery event says; ignore other items."""
    if isinstance(event, DiscoveryEvent):
        metadata = event.metadata
        if event.type == "worker-dropped":
            workers.pop(metadata.uid, None)
        else:
            workers[metadata.uid] = metadata


def diff_events(seen: Workers, current: Workers) -> deque[DiscoveryEvent]:
    """The events that turn the view ``seen`` into ``current``.

    ``worker-added`` for a new worker, ``worker-updated`` for changed
    metadata, ``worker-dropped`` (with the metadata last seen) for a worker
    that is gone.
    """
    diff: deque[DiscoveryEvent] = deque()
    for uid, metadata in current.items():
        before = seen.get(uid)
        if before is None:
            diff.append(DiscoveryEvent("worker-added", metadata=metadata))
        elif before is not metadata and before != metadata:
            diff.append(DiscoveryEvent("worker-updated", metadata=metadata))
    for uid, metadata in seen.items():
        if uid not in current:
            diff.append(DiscoveryEvent("worker-dropped", metadata=metadata))
    return diff


@final
class TrackedSource:
    """The raw subscriber's iteration, recording which workers are known.

    This is the source a pool entry's :class:`~wool_pooling.Fanout` pulls
    from, so the state is updated exactly once per source event, in the pull,
    before any consumer sees the event. A consumer that registers with the
    fan-out and takes :meth:`replay` in the same synchronous step therefore
    sees every known worker once, then exactly the events after that point:
    no gap, no duplicate.

    Known workers are those added or updated and not dropped since, each with
    its latest metadata, in the order they were first seen. Items that are not
    discovery events pass through untracked. Memory held: one metadata per
    known worker.

    With a :class:`~wool_pooling.RestartPolicy`, a failure of the raw stream
    (or its end, if so configured) restarts it instead of ending the
    consumers. After a restart the new stream's events are translated into
    the difference with the workers known before: a re-reported worker is
    repeated only if its metadata changed (as ``worker-updated``), and the
    workers it has not reported within ``settle`` seconds are dropped.
    """

    __slots__ = (
        "_failures",
        "_iterator",
        "_raw",
        "_reported",
        "_restart",
        "_settling",
        "inject",
        "workers",
    )

    def __init__(
        self, raw: AsyncIterable[Any], restart: RestartPolicy | None = None
    ) -> None:
        self._raw = raw
        self._restart = restart
        self._iterator: AsyncIterator[Any] | None = None
        self.workers: Workers = {}
        # Consecutive restarts without an event in between.
        self._failures = 0
        # After a restart: the workers the new stream has reported so far,
        # and the timer that drops the others once the settle time is over.
        self._reported: set[uuid.UUID] | None = None
        self._settling: anyio.CancelScope | None = None
        #: Delivers an event outside a pull (the fan-out's log append); the
        #: settle timer uses it, since the new stream may stay silent.
        self.inject: Callable[[Any], None] | None = None

    def __aiter__(self) -> TrackedSource:
        return self

    async def __anext__(self) -> Any:
        if self._restart is not None:
            return await self._next_with_restarts()
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = aiter(self._raw)
        event = await iterator.__anext__()
        if isinstance(event, DiscoveryEvent):  # apply_event, inline: every pull
            metadata = event.metadata
            if event.type == "worker-dropped":
                self.workers.pop(metadata.uid, None)
            else:
                self.workers[metadata.uid] = metadata
        return event

    def _track(self, event: Any) -> Any:
        apply_event(self.workers, event)
        return event

    async def _next_with_restarts(self) -> Any:
        policy = self._restart
        assert policy is not None
        while True:
            iterator = self._iterator
            if iterator is None:
                iterator = self._iterator = aiter(self._raw)
            try:
                event = await anext(iterator)
            except StopAsyncIteration as end:
                if not policy.restart_on_end:
                    raise
                await self._restart_after(end, policy)
                continue
            except Exception as error:
                await self._restart_after(error, policy)
                continue
            self._failures = 0
            event = self._translate(event)
            if event is not None:
                return self._track(event)

    async def _restart_after(self, error: BaseException, policy: RestartPolicy) -> None:
        """Close the failed iteration and wait out the backoff, or re-raise."""
        self._failures += 1
        attempt = self._failures
        if not policy.allows(attempt):
            restart_logger.error(
                "giving up on %r after %d restarts: %r", self._raw, attempt - 1, error
            )
            raise error
        delay = policy.delay(attempt)
        restart_logger.warning(
            "restarting %r in %.3fs (attempt %d of %s) after %r",
            self._raw,
            delay,
            attempt,
            policy.attempts if policy.attempts is not None else "unlimited",
            error,
        )
        iterator, self._iterator = self._iterator, None
        closer = getattr(iterator, "aclose", None)
        if closer is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await closer()
                except Exception:
                    restart_logger.debug("closing the failed iteration", exc_info=True)
        await anyio.sleep(delay)
        self._reported = set()
        if self._settling is not None:
            self._settling.cancel()
        settling = self._settling = anyio.CancelScope()
        current_loop().spawn(self._settle, settling, policy.settle)

    async def _settle(self, scope: anyio.CancelScope, seconds: float) -> None:
        """Drop the workers the restarted stream has not reported in time."""
        with scope:
            await anyio.sleep(seconds)
        if self._settling is not scope or scope.cancel_called:
            return
        self._settling = None
        reported = self._reported or set()
        self._reported = None
        stale = [
            DiscoveryEvent("worker-dropped", metadata=metadata)
            for uid, metadata in self.workers.items()
            if uid not in reported
        ]
        for event in stale:
            self._track(event)
            if self.inject is not None:
                self.inject(event)

    def _translate(self, event: Any) -> Any:
        """After a restart, turn the new stream's report into a diff."""
        reported = self._reported
        if reported is None or not isinstance(event, DiscoveryEvent):
            return event
        metadata = event.metadata
        uid = metadata.uid
        known = self.workers.get(uid)
        if event.type == "worker-dropped":
            reported.discard(uid)
            return event if known is not None else None
        reported.add(uid)
        if known is None:
            return DiscoveryEvent("worker-added", metadata=metadata)
        if known is metadata or known == metadata:
            return None  # re-reported unchanged: nothing new for consumers
        return DiscoveryEvent("worker-updated", metadata=metadata)

    def replay(self) -> deque[DiscoveryEvent]:
        """One ``worker-added`` event per known worker, with its latest metadata."""
        return deque(
            DiscoveryEvent("worker-added", metadata=metadata)
            for metadata in self.workers.values()
        )

    async def aclose(self) -> None:
        """Close the raw subscriber's iterator, if it was started and can be closed."""
        if self._settling is not None:
            self._settling.cancel()
            self._settling = None
        iterator, self._iterator = self._iterator, None
        closer = getattr(iterator, "aclose", None)
        if closer is not None:
            await closer()
