"""``wool_pooling.redis`` runs on asyncio only (redis-py's asyncio client, and
wool itself), so every other Redis test runs on asyncio alone; this one pins
that on trio the discovery says so at once, not somewhere deep inside asyncio.
"""

from __future__ import annotations

import uuid

import pytest
from _redis import RedisServer

from wool_pooling.redis import RedisDiscovery

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {}), id="trio")]),
]


async def test_a_subscriber_and_a_publisher_refuse_trio_clearly(
    redis_server: RedisServer,
) -> None:
    """Under trio, iterating a subscriber and entering a publisher each raise
    RuntimeError naming the part and saying it runs on asyncio only, though
    the server is up."""
    discovery = RedisDiscovery(redis_server.url, f"trio-{uuid.uuid4().hex}")
    with pytest.raises(
        RuntimeError, match=r"^RedisDiscovery's subscriber runs on asyncio only"
    ):
        async for _ in discovery.subscribe():
            pass  # pragma: no cover - never reached
    with pytest.raises(RuntimeError, match=r"^RedisPublisher runs on asyncio only"):
        async with discovery.publisher:
            pass  # pragma: no cover - never reached
