"""Wool discovery through a Redis server, beyond one machine (the ``redis`` extra).

See docs/redis.rst for the guarantees: ordering, one subscription per
process, reconnects, leases, the namespace's lifecycle, Cluster and Sentinel.
"""

from __future__ import annotations

try:
    import redis.asyncio  # pyright: ignore[reportUnusedImport]  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        'wool_pooling.redis needs redis-py: pip install "wool-pooling[redis]"'
    ) from error

from ._connection import redact
from ._discovery import RedisDiscovery
from ._discovery import RedisPublisher
from ._errors import DEFAULT_RECONNECT
from ._errors import RedisDiscoveryError
from ._stream import RedisStatistics

__all__ = [
    "DEFAULT_RECONNECT",
    "RedisDiscovery",
    "RedisDiscoveryError",
    "RedisPublisher",
    "RedisStatistics",
    "redact",
]
