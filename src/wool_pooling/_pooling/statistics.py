"""What one pooled subscription counts, for operators: kept at joins, leaves,
lags and restarts, and derived from the shared log when asked for.

No delivery is counted as it happens: the items consumers received are the
distance each has moved along the log (:func:`~wool_pooling._core.fanout.position`),
summed when :meth:`~wool_pooling.SharedSubscription.statistics` is called,
plus what the consumers that left had moved, less what they skipped.
"""

from __future__ import annotations

from typing import Any
from typing import final

import attrs

from .._core.fanout import Fanout
from .._core.fanout import FanoutConsumer
from .._core.fanout import position
from .._core.fanout import positions_total
from .restart import RestartingSource

__all__ = [
    "EntryCounters",
    "SubscriptionStatistics",
    "count_join",
    "count_lag",
    "count_leave",
    "count_resync",
    "snapshot",
]


@attrs.frozen
class SubscriptionStatistics:
    """A snapshot of one shared subscription in one pool, as returned by
    :meth:`SharedSubscription.statistics() <wool_pooling.SharedSubscription.statistics>`
    and :meth:`SharedDiscovery.statistics() <wool_pooling.SharedDiscovery.statistics>`.

    The counts are those of the pool entry that iterates the subscription's
    key now: all zeros when nothing iterates it in that pool, and they start
    again from zero with the next entry (after its ttl, or after its source
    ended).
    """

    #: Consumers attached to the entry.
    consumers: int = 0
    #: Items of the shared stream received by its consumers, summed over
    #: them (an item read by 100 consumers counts 100); the replay of known
    #: workers at a join and a resync's difference are not counted.
    delivered: int = 0
    #: Consumers that joined while workers were known, and so first received
    #: one ``worker-added`` per known worker (a replay).
    replays: int = 0
    #: Times a consumer fell more than ``max_lag`` items behind.
    lagged: int = 0
    #: Lagging consumers caught up by the difference between what they had
    #: seen and the current workers (the others got :exc:`~wool_pooling.Lagged`).
    resyncs: int = 0
    #: Restarts of the raw stream under its ``RestartPolicy``.
    restarts: int = 0
    #: Errors raised by the raw stream: each one a restart followed, and the
    #: one that ended the consumers.
    source_errors: int = 0


@final
class EntryCounters:
    """The counts an entry keeps; the rest is derived when asked for."""

    __slots__ = ("lagged", "moved", "replays", "resyncs")

    def __init__(self) -> None:
        #: Items the consumers that left had moved past, less where every
        #: consumer joined and what they skipped (see the module docstring).
        self.moved = 0
        self.replays = 0
        self.lagged = 0
        self.resyncs = 0


def count_join(
    counters: EntryCounters, consumer: FanoutConsumer[Any], replayed: bool
) -> None:
    """A consumer registered at its log position: it has received nothing yet."""
    counters.moved -= position(consumer)
    counters.replays += replayed


def count_leave(
    counters: EntryCounters, consumer: FanoutConsumer[Any], fanout: Fanout[Any]
) -> None:
    """``consumer`` of ``fanout`` is about to end: count its position. One
    that has ended already read the source's end, so every item logged."""
    here = position(consumer)
    counters.moved += fanout.statistics().pulled if here < 0 else here


def count_lag(counters: EntryCounters, skipped: int) -> None:
    """A consumer fell behind and skipped ``skipped`` items."""
    counters.lagged += 1
    counters.moved -= skipped


def count_resync(counters: EntryCounters, skipped: int) -> None:
    """A lagging consumer moved to the log's end past ``skipped`` items, caught
    up by a difference instead."""
    counters.resyncs += 1
    counters.moved -= skipped


def snapshot(
    counters: EntryCounters,
    consumers: int,
    fanout: Fanout[Any],
    source: RestartingSource[Any],
) -> SubscriptionStatistics:
    """The statistics of an entry: its ``counters``, its ``consumers``, and
    what its ``fanout`` and ``source`` say now."""
    return SubscriptionStatistics(
        consumers=consumers,
        delivered=counters.moved + positions_total(fanout),
        replays=counters.replays,
        lagged=counters.lagged,
        resyncs=counters.resyncs,
        restarts=source.restarts,
        source_errors=source.errors,
    )
