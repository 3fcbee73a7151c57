"""A shared subscription's consumer shows how far behind it is (``lag``) and
how many items it skipped (``skipped``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import anyio
import pytest
from _stubs import added
from _stubs import first_read
from _stubs import make_stub
from _stubs import take
from wool import DiscoveryEvent

from wool_pooling import Lagged
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio


async def test_lag_counts_the_logged_items_a_consumer_has_yet_to_read() -> None:
    """``lag`` is 0 before the join, grows by each item the others pulled
    that this consumer has not read, falls as it reads, and is 0 once it
    ended; the join's replay is not lag."""
    cls = make_stub(read_ahead=0)
    sub = cast("SharedSubscription[DiscoveryEvent]", cls("a"))
    async with SubscriptionPool():
        fast, slow = aiter(sub), aiter(sub)
        assert slow.lag == 0  # not joined yet
        await first_read(fast, lambda: cls.instances[0].push(added(1)))
        await take(slow, 1)  # joins: the replay of worker 1
        assert slow.lag == 0
        cls.instances[0].push(added(2), added(3), added(4))
        await take(fast, 3)
        assert (fast.lag, slow.lag) == (0, 3)
        await take(slow, 1)
        assert slow.lag == 2
        await slow.aclose()
        assert slow.lag == 0
        await fast.aclose()


async def test_a_resynced_consumer_counts_what_it_skipped() -> None:
    """A discovery consumer left ``max_lag`` behind is at most ``max_lag``
    behind; once caught up by a difference it counts every log item it
    missed in ``skipped`` and has no lag; later reads skip nothing."""
    cls = make_stub(max_lag=2)
    sub = cast("SharedSubscription[DiscoveryEvent]", cls("a"))
    async with SubscriptionPool():
        fast, slow = aiter(sub), aiter(sub)
        await first_read(fast, lambda: cls.instances[0].push(added(1)))
        await take(slow, 1)  # joins: the replay of worker 1
        cls.instances[0].push(*(added(n) for n in range(2, 7)))
        await take(fast, 5)
        assert (slow.lag, slow.skipped) == (2, 0)  # counted once it finds out
        diff = await take(slow, 5)  # workers 2..6, as a difference
        assert {event.metadata.pid for event in diff} == {2, 3, 4, 5, 6}
        assert (slow.lag, slow.skipped, fast.skipped) == (0, 5, 0)
        cls.instances[0].push(added(7))
        await take(slow, 1)
        assert (slow.lag, slow.skipped) == (0, 5)
        await fast.aclose()
        await slow.aclose()
        assert slow.skipped == 5  # kept once it ended


class Numbers:
    """A raw subscriber of plain ints, fed by the test."""

    built: list[Numbers] = []

    def __init__(self, name: str) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[int](100)
        self.built.append(self)

    async def __aiter__(self) -> AsyncIterator[int]:
        async for item in self.receive:
            yield item


async def test_a_consumer_told_lagged_counts_the_items_it_reported() -> None:
    """On a stream that is not discovery events, ``skipped`` adds what each
    :exc:`Lagged` reported, and ``lag`` what is still held for the consumer."""
    cls = shared_subscription(max_lag=2)(type("Ints", (Numbers,), {"built": []}))
    sub = cast("SharedSubscription[int]", cls("n"))
    async with SubscriptionPool():
        fast, slow = aiter(sub), aiter(sub)
        assert await first_read(fast, lambda: cls.built[0].send.send_nowait(0)) == 0
        assert await first_read(slow, lambda: cls.built[0].send.send_nowait(1)) == 1
        for n in range(2, 7):
            cls.built[0].send.send_nowait(n)
        assert await take(fast, 6) == [1, 2, 3, 4, 5, 6]
        assert (slow.lag, slow.skipped) == (2, 0)
        with pytest.raises(Lagged) as lagged:
            await anext(slow)
        assert (lagged.value.skipped, slow.skipped, slow.lag) == (3, 3, 2)
        assert await take(slow, 2) == [5, 6]
        assert (slow.lag, slow.skipped) == (0, 3)
        await fast.aclose()
        await slow.aclose()
