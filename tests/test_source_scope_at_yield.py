"""A cancel scope a source holds open across its ``yield``, cancelled while
the one task iterating it waits between pulls, is raised inside the source
at that ``yield`` (``athrow()``), through a bare fan-out and through a
``@shared_subscription`` class alike: the source's scope catches it and the
source goes on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from wool_pooling import Fanout
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio

scopes: list[anyio.CancelScope] = []


async def scoped() -> AsyncIterator[str]:
    with anyio.CancelScope() as scope:
        scopes.append(scope)
        yield "inside"
        await anyio.sleep_forever()  # never reached: cancelled at the yield
    yield "after"


@shared_subscription(read_ahead=0)
class Scoped:
    def __aiter__(self) -> AsyncIterator[str]:
        return scoped()


@pytest.mark.parametrize("via", ["fanout", "subscription"])
async def test_a_scope_cancelled_between_pulls_is_raised_at_the_sources_yield(
    via: str,
) -> None:
    """The source's own scope, cancelled while nothing pulls, ends at the
    ``yield`` it was suspended at, and the next item comes after it."""
    scopes.clear()
    with anyio.fail_after(10):
        async with SubscriptionPool():
            fanout = Fanout(scoped(), read_ahead=0) if via == "fanout" else None
            consumer = aiter(Scoped()) if fanout is None else fanout.consumer()
            assert await anext(consumer) == "inside"
            await anyio.wait_all_tasks_blocked()  # the pump waits between pulls
            scopes[0].cancel()
            await anyio.wait_all_tasks_blocked()
            assert await anext(consumer) == "after"
            await consumer.aclose()
            if fanout is not None:
                await fanout.aclose()
