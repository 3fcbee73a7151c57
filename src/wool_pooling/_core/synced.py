"""The marker a source yields at the end of its first listing."""

from __future__ import annotations

from typing import Any
from typing import final

__all__ = ["Synced"]


@final
class Synced:
    """Yielded by a shared subscription's source: "my first listing is complete".

    A subscriber class yields ``Synced()`` once it has yielded every item of
    its first listing (the workers that existed when it started, say); every
    instance is equal to every other. A shared subscription takes it in and
    never passes it on: its consumers never see it, and learn it through
    :attr:`SubscriptionConsumer.synced
    <wool_pooling.SubscriptionConsumer.synced>` and
    :meth:`~wool_pooling.SubscriptionConsumer.wait_synced`. A later one (a
    restarted stream's, or a reconnected one's after its new snapshot)
    leaves ``synced`` as it was; after a restart under a
    :class:`~wool_pooling.RestartPolicy` it also ends the settle time:
    the workers the new stream has not reported by then are dropped at
    once. Only shared subscriptions interpret it: a plain
    :class:`~wool_pooling.Fanout` passes it on like any other item.
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
