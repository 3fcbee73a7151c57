"""Releasing an abandoned consumer: its reference goes at once, the close follows."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

import anyio
import pytest

from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio


async def test_garbage_collected_consumer_is_released_at_once() -> None:
    """A collected consumer stops counting immediately; the raw close follows."""
    closed: list[object] = []

    @shared_subscription(read_ahead=0)  # the second consumer joins after item 1
    class Subscriber:
        def __init__(self, name: str) -> None:
            self.name = name

        async def __aiter__(self) -> AsyncIterator[int]:
            yield 1
            yield 2
            await anyio.sleep_forever()

        async def aclose(self) -> None:
            closed.append(self)

    async with SubscriptionPool() as pool:
        subscription: SharedSubscription = Subscriber("x")  # type: ignore[assignment]
        kept = aiter(subscription)
        abandoned = aiter(subscription)
        with anyio.fail_after(5):
            assert await anext(abandoned) == 1
            assert await anext(kept) == 2  # joined after 1 was pulled
        assert (pool.statistics().entries, pool.statistics().consumers) == (1, 2)
        del abandoned
        gc.collect()
        assert (pool.statistics().entries, pool.statistics().consumers) == (1, 1)
        await anyio.wait_all_tasks_blocked()
        assert closed == []  # another consumer still holds the entry
        del kept
        gc.collect()
        assert pool.statistics().consumers == 0
        with anyio.fail_after(5):
            while pool.statistics().entries:
                await anyio.wait_all_tasks_blocked()
        assert len(closed) == 1
