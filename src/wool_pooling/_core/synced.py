"""The marker a source yields at the end of its first listing."""

from __future__ import annotations

from typing import Any
from typing import final

__all__ = ["Synced"]


@final
class Synced:
    """Yielded by a shared subscription's source: "my first listing is complete".

    A shared subscription takes it in (its consumers never see it) and sets
    :attr:`SubscriptionConsumer.synced
    <wool_pooling.SubscriptionConsumer.synced>`; after a restart it ends the
    settle time. A plain :class:`~wool_pooling.Fanout` passes it on like any
    other item. Every instance equals every other. See :ref:`synced`.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Synced)

    def __hash__(self) -> int:
        return hash(Synced)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Synced, ())

    def __repr__(self) -> str:
        return "Synced()"
