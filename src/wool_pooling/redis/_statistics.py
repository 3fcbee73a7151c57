"""What a Redis subscription counts, per subscription key, for operators."""

from __future__ import annotations

from collections.abc import Hashable

import attrs


@attrs.frozen
class RedisStatistics:
    """What the subscribers of one (connection, namespace) in this process have met."""

    #: Records (or announcements) that were not valid worker metadata: skipped.
    invalid_records: int = 0
    #: Successful reconnections after a lost connection (or a resynchronisation).
    reconnects: int = 0


by_key: dict[Hashable, RedisStatistics] = {}


def count(key: Hashable, **increments: int) -> None:
    current = by_key.get(key, RedisStatistics())
    by_key[key] = attrs.evolve(
        current,
        **{name: getattr(current, name) + n for name, n in increments.items()},
    )
