"""``async for`` over either kind of consumer: what both must keep.

``aclose()`` of the iterator a loop used closes the consumer itself, and one
task at a time may wait on a consumer: a loop over a consumer another task
waits on raises :exc:`anyio.BusyResourceError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _stubs import TIMEOUT
from _stubs import Feed
from _stubs import ev
from _stubs import join
from _stubs import loop_take
from _stubs import make_stub
from _stubs import meta
from _stubs import pairs
from _stubs import settle
from _stubs import subscribe
from _stubs import take
from wool import DiscoveryEvent

from wool_pooling import Fanout
from wool_pooling import FanoutConsumer
from wool_pooling import SubscriptionConsumer
from wool_pooling import SubscriptionPool

pytestmark = pytest.mark.anyio


KINDS = ["fanout", "subscription"]


#: A consumer of either kind.
AnyConsumer = FanoutConsumer[int] | SubscriptionConsumer


@asynccontextmanager
async def buffered_consumer(
    kind: str,
) -> AsyncIterator[tuple[AnyConsumer, list[Any], Callable[[], Any]]]:
    """A joined consumer of ``kind`` with three items buffered, those items, and
    a function that makes one more item arrive at the source and returns it.

    The items are comparable with ``==`` (pairs for discovery events); use
    :func:`comparable` on what the consumer yields.
    """
    if kind == "fanout":
        source = Feed()
        fanout = Fanout(source)
        other, consumer = fanout.consumer(), fanout.consumer()
        source.feed(*range(3))
        fed = [2]

        def more_items() -> int:
            fed[0] += 1
            source.feed(fed[0])
            return fed[0]

        try:
            assert await take(other, 3) == [0, 1, 2]
            yield consumer, [0, 1, 2], more_items
        finally:
            await fanout.aclose()
        return
    stub = make_stub()
    events = [ev("worker-added", meta()) for _ in range(4)]
    async with SubscriptionPool():
        sub = subscribe(stub)
        other, consumer = aiter(sub), aiter(sub)
        await join(stub, other, consumer, first=events[0])
        raw = stub.instances[-1]
        raw.push(*events[1:])
        assert pairs(await take(other, 3)) == pairs(events[1:])

        def more_events() -> Any:
            event = ev("worker-added", meta())
            raw.push(event)
            return pairs([event])[0]

        try:
            yield consumer, pairs(events[1:]), more_events
        finally:
            await other.aclose()
            await consumer.aclose()


def comparable(items: list[Any]) -> list[Any]:
    """Items as :func:`buffered_consumer` lists them."""
    if items and isinstance(items[0], DiscoveryEvent):
        return pairs(items)
    return items


@pytest.mark.parametrize("kind", KINDS)
async def test_aclose_of_the_iterator_a_loop_used_closes_the_consumer(
    kind: str,
) -> None:
    """``aclose()`` of the iterator a loop used closes the consumer itself."""
    async with buffered_consumer(kind) as (consumer, expected, more):
        iterator = aiter(consumer)
        assert iterator is consumer
        got: list[Any] = []
        with anyio.fail_after(TIMEOUT):
            async for item in iterator:
                got.append(item)
                break
            await iterator.aclose()
            more()
            assert [item async for item in consumer] == []
        assert "ENDED" in repr(consumer)
        assert comparable(got) == expected[:1]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_loop_over_a_consumer_another_task_waits_on_raises_busy(
    kind: str,
) -> None:
    """A loop over a consumer another task waits on raises BusyResourceError."""
    async with buffered_consumer(kind) as (consumer, expected, more):
        got: list[Any] = []

        async def loop() -> None:
            async for item in consumer:
                got.append(item)
                if len(got) == len(expected) + 1:
                    break

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(loop)
                await settle()
                assert comparable(got) == expected  # then it waits for one more
                with pytest.raises(anyio.BusyResourceError):
                    await loop_take(consumer, 1)  # a second loop, in this task
                arrived = more()
            assert comparable(got) == [*expected, arrived]
            following = more()
            assert comparable(await take(consumer, 1)) == [following]
