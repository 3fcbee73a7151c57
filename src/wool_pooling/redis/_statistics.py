"""What a Redis subscription counts, per subscription key, for operators."""

from __future__ import annotations

import time
import weakref
from collections.abc import Hashable

import attrs


@attrs.frozen
class RedisStatistics:
    """What the subscribers of one (connection, namespace) in this process have met.

    Counted while a discovery or subscriber of that key lives in the
    process, whether shared or not (``shared=False`` subscribers add to the
    same counts); the counts go with the last of them.
    """

    #: Records (or announcements) that were not valid worker metadata: skipped.
    invalid_records: int = 0
    #: Successful reconnections after a lost connection (or a resynchronisation).
    reconnects: int = 0
    #: Connections to the server the subscribers hold now: two per live
    #: subscription (pub/sub and commands), however many consumers share it.
    connections: int = 0
    #: Full snapshots taken: one per connection, and per reconnection that
    #: could not resume.
    snapshots: int = 0
    #: Reconnections that read only the changes missed from the namespace's
    #: change log, not a snapshot.
    resumes: int = 0
    #: Changes read from the change log by those resumes.
    changes_read: int = 0
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


def _zeros() -> dict[str, int]:
    counts = attrs.asdict(RedisStatistics())
    del counts["seconds_since_last_message"]
    return counts


@attrs.define
class Counters:
    """The running counts of one key, by :class:`RedisStatistics` field name
    (one dict update per announcement)."""

    counts: dict[str, int] = attrs.Factory(_zeros)
    #: ``time.monotonic()`` of the last message read, if any.
    heard: float | None = None

    def statistics(self) -> RedisStatistics:
        """The counts as they stand."""
        heard = self.heard
        since = None if heard is None else max(0.0, time.monotonic() - heard)
        return RedisStatistics(**self.counts, seconds_since_last_message=since)


#: The counters of each key, held by its discoveries and subscribers: an
#: entry goes with the last of them.
by_key: weakref.WeakValueDictionary[Hashable, Counters] = weakref.WeakValueDictionary()


def counters(key: Hashable) -> Counters:
    """The counters of ``key``, made at the first call; the caller holds them."""
    found = by_key.get(key)
    if found is None:
        found = by_key[key] = Counters()
    return found
