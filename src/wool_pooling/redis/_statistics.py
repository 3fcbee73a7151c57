"""What a Redis subscription counts, per subscription key, for operators.

The subscribers count into a mutable :class:`Counters` per key (an attribute
update per announcement, nothing per consumer); :func:`snapshot` freezes it
into a :class:`RedisStatistics` when asked.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import final

import attrs


@attrs.frozen
class RedisStatistics:
    """What the subscribers of one (connection, namespace) in this process have met.

    Counted since the process's first subscriber of that key, whether shared
    or not (``shared=False`` subscribers add to the same counts).
    """

    #: Records (or announcements) that were not valid worker metadata: skipped.
    invalid_records: int = 0
    #: Successful reconnections after a lost connection (or a resynchronisation).
    reconnects: int = 0
    #: Connections to the server the subscribers hold now: two per live
    #: subscription (pub/sub and commands), however many consumers share it.
    connections: int = 0
    #: Snapshots taken: one per connection and per reconnection.
    snapshots: int = 0
    #: Announcements received on the pub/sub connection (duplicates and
    #: invalid ones included).
    announcements: int = 0
    #: Announcements found missing (a version skipped): each one cost a
    #: resynchronisation.
    gaps: int = 0
    #: Snapshots that found a new epoch: the server lost, flushed or
    #: expired the namespace's data.
    epoch_changes: int = 0
    #: Seconds since a subscriber last read anything from its pub/sub
    #: connection (an announcement or the answer to its liveness ``PING``);
    #: ``None`` before the first. Stays under ``liveness_timeout`` while the
    #: connection is healthy.
    seconds_since_last_message: float | None = None


@final
class Counters:
    """The running counts of one key; see :class:`RedisStatistics`."""

    __slots__ = (
        "announcements",
        "connections",
        "epoch_changes",
        "gaps",
        "heard",
        "invalid_records",
        "reconnects",
        "snapshots",
    )

    def __init__(self) -> None:
        self.invalid_records = 0
        self.reconnects = 0
        self.connections = 0
        self.snapshots = 0
        self.announcements = 0
        self.gaps = 0
        self.epoch_changes = 0
        #: ``time.monotonic()`` of the last message read, if any.
        self.heard: float | None = None


by_key: dict[Hashable, Counters] = {}


def counters(key: Hashable) -> Counters:
    """The counters of ``key``, made at the first call."""
    found = by_key.get(key)
    if found is None:
        found = by_key[key] = Counters()
    return found


def snapshot(key: Hashable) -> RedisStatistics:
    """The counts of ``key`` as they stand (all zeros if nothing counted)."""
    found = by_key.get(key)
    if found is None:
        return RedisStatistics()
    heard = found.heard
    return RedisStatistics(
        invalid_records=found.invalid_records,
        reconnects=found.reconnects,
        connections=found.connections,
        snapshots=found.snapshots,
        announcements=found.announcements,
        gaps=found.gaps,
        epoch_changes=found.epoch_changes,
        seconds_since_last_message=None
        if heard is None
        else max(0.0, time.monotonic() - heard),
    )
