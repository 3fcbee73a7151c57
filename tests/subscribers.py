"""Importable decorated subscriber classes, for tests that need plain ``pickle``.

Plain ``pickle`` (and a child process) can only rebuild a subscription whose
class is importable by name, so these classes live at module level here,
with :class:`Announcer`, the undecorated base the decorator tests subclass.
``tests/`` is on ``sys.path`` under pytest's default (prepend) import mode,
so tests import this module as ``subscribers``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Any
from typing import ClassVar

import anyio
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import shared_subscription


def announcement(raw: object) -> DiscoveryEvent:
    """The ``worker-added`` event unique to the raw instance ``raw``."""
    serial = id(raw)
    return DiscoveryEvent(
        "worker-added",
        metadata=WorkerMetadata(
            uid=uuid.UUID(int=serial), address="127.0.0.1:1", pid=1, version="1"
        ),
    )


def uid_of(raw: object) -> uuid.UUID:
    """The worker uid that :func:`announcement` gives the raw instance ``raw``."""
    return uuid.UUID(int=id(raw))


class Announcer:
    """Undecorated base: each raw instance announces one worker, then waits.

    Every subclass gets its own ``created`` list of the raw instances built
    (kept alive, so the ids in the announcements stay unique).
    """

    __slots__ = ()

    created: ClassVar[list[Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.created = []

    def register(self) -> None:
        type(self).created.append(self)

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self._stream()

    async def _stream(self) -> AsyncGenerator[DiscoveryEvent, None]:
        yield announcement(self)
        await anyio.sleep_forever()


@shared_subscription
class NamedSubscriber:
    """Announces one worker unique to its raw instance, then waits until closed."""

    #: Every raw instance built, in order (kept alive, so ids stay unique).
    instances: ClassVar[list[NamedSubscriber]] = []

    def __init__(self, name: Any, size: int = 1) -> None:
        self.name = name
        self.size = size
        self.closed = 0
        NamedSubscriber.instances.append(self)

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self._stream()

    async def _stream(self) -> AsyncGenerator[DiscoveryEvent, None]:
        yield announcement(self)
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        self.closed += 1


async def first_uid(consumer: Any) -> uuid.UUID:
    """Wait (bounded) for a consumer's first event; return the worker it names."""
    with anyio.fail_after(5):
        event = await consumer.__anext__()
    assert event.type == "worker-added"
    return event.metadata.uid


@shared_subscription
class StarSubscriber:
    """Takes any number of positional arguments (pickling error messages)."""

    def __init__(self, *items: Any) -> None:
        self.items = items

    async def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        yield announcement(self)
