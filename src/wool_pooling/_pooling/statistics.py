"""What pooled subscriptions count, for operators: kept at joins, leaves,
lags and restarts. No delivery is counted as it happens: the items received
are the distance each consumer moved along the log (its ``position``), summed
when asked for, plus what those that left had moved, less what they skipped.
"""

from __future__ import annotations

import weakref
from typing import Any
from typing import final

import attrs

from .._core.fanout import Fanout
from .._core.fanout import FanoutConsumer
from .restart import RestartingSource

__all__ = ["EntryCounters", "PoolTotals", "SubscriptionStatistics"]


@attrs.frozen
class SubscriptionStatistics:
    """A snapshot of one shared subscription in one pool, as returned by
    :meth:`SharedSubscription.statistics() <wool_pooling.SharedSubscription.statistics>`
    and :meth:`SharedDiscovery.statistics() <wool_pooling.SharedDiscovery.statistics>`:
    the counts of the pool entry iterating its key now, all zeros without
    one, from zero again with the next. See :doc:`metrics`.
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
    #: Items of the shared stream its consumers never received because they
    #: fell behind (a resync's difference stood in for some).
    skipped: int = 0
    #: Lagging consumers caught up by the difference between what they had
    #: seen and the current workers (the others got :exc:`~wool_pooling.Lagged`).
    resyncs: int = 0
    #: Restarts of the raw stream under its ``RestartPolicy``.
    restarts: int = 0
    #: Errors raised by the raw stream: each one a restart followed, and the
    #: one that ended the consumers.
    source_errors: int = 0


@attrs.frozen
class PoolTotals:
    """Running totals of a pool, as returned by
    :meth:`SubscriptionPool.totals() <wool_pooling.SubscriptionPool.totals>`:
    the counts of :class:`SubscriptionStatistics` summed over every entry the
    pool opened, closed ones included. None ever decreases. See :doc:`metrics`.
    """

    #: Entries opened: raw instances built.
    opened: int = 0
    #: Entries closed (their raw instances closed).
    closed: int = 0
    #: Items of the shared streams received, summed over consumers.
    delivered: int = 0
    #: Joins that were replayed the known workers.
    replays: int = 0
    #: Times a consumer fell more than ``max_lag`` items behind.
    lagged: int = 0
    #: Items consumers never received because they fell behind.
    skipped: int = 0
    #: Lagging consumers caught up by a difference.
    resyncs: int = 0
    #: Restarts of raw streams under their ``RestartPolicy``.
    restarts: int = 0
    #: Errors raised by raw streams.
    source_errors: int = 0


@final
@attrs.define(eq=False)
class EntryCounters:
    """The counts an entry keeps; the rest is derived when asked for."""

    #: The consumers attached, to sum their positions.
    consumers: weakref.WeakSet[FanoutConsumer[Any]] = attrs.field(
        factory=weakref.WeakSet[FanoutConsumer[Any]]
    )
    #: Items the consumers that left had moved past, less where every
    #: consumer joined and what they skipped (see the module docstring).
    moved: int = 0
    replays: int = 0
    lagged: int = 0
    items_skipped: int = 0
    resyncs: int = 0

    def join(self, consumer: FanoutConsumer[Any], replayed: bool) -> None:
        """``consumer`` registered at its log position: it has received nothing."""
        self.consumers.add(consumer)
        self.moved -= consumer.position
        self.replays += replayed

    def leave(self, consumer: FanoutConsumer[Any], fanout: Fanout[Any]) -> None:
        """``consumer`` of ``fanout`` is about to end: count its position, once.
        One that has ended already read the source's end, so every item logged."""
        if consumer in self.consumers:
            self.consumers.discard(consumer)
            here = consumer.position
            self.moved += fanout.statistics().pulled if here < 0 else here

    def settle(self, fanout: Fanout[Any]) -> None:
        """``fanout`` is about to end its consumers: count their leaves now."""
        for consumer in [*self.consumers]:
            self.leave(consumer, fanout)

    def skipped(self, skipped: int, resync: bool = False) -> None:
        """A consumer fell behind and skipped ``skipped`` items (``resync``: it
        was caught up by its view instead)."""
        self.resyncs += resync
        self.lagged += not resync
        self.items_skipped += skipped
        self.moved -= skipped

    def snapshot(
        self, consumers: int, source: RestartingSource[Any]
    ) -> SubscriptionStatistics:
        """The statistics of an entry with ``consumers`` attached and ``source``."""
        live = [consumer.position for consumer in self.consumers]
        return SubscriptionStatistics(
            consumers=consumers,
            delivered=self.moved + sum(here for here in live if here >= 0),
            replays=self.replays,
            lagged=self.lagged,
            skipped=self.items_skipped,
            resyncs=self.resyncs,
            restarts=source.restarts,
            source_errors=source.errors,
        )

    def add_to(
        self, totals: PoolTotals, source: RestartingSource[Any], closed: bool
    ) -> PoolTotals:
        """``totals`` and this entry, of ``source``, ``closed`` or not."""
        counts = attrs.asdict(self.snapshot(0, source))
        del counts["consumers"]
        return PoolTotals(
            opened=totals.opened + 1,
            closed=totals.closed + closed,
            **{name: getattr(totals, name) + n for name, n in counts.items()},
        )
