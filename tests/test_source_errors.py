"""A source's error reaches every consumer whatever its type, anyio's own
exception types included: never taken for an end or for nothing ready."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from wool_pooling import Fanout
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "error",
    [RuntimeError("boom"), anyio.EndOfStream(), anyio.WouldBlock()],
    ids=lambda error: type(error).__name__,
)
async def test_a_source_error_of_anyios_own_types_reaches_every_consumer(
    error: Exception,
) -> None:
    """A source that raises ``EndOfStream`` or ``WouldBlock`` fails every
    consumer with it, as any other error: the fan-out never takes it for its
    own end or for nothing ready."""

    async def failing() -> AsyncIterator[int]:
        yield 1
        raise error

    fanout = Fanout(failing())
    first, second = fanout.consumer(), fanout.consumer()
    for consumer in (first, second):
        with anyio.fail_after(5):
            assert await anext(consumer) == 1
            with pytest.raises(type(error)) as raised:
                await anext(consumer)
        assert raised.value is error
    await fanout.aclose()


@pytest.mark.parametrize(
    "error",
    [RuntimeError("boom"), anyio.EndOfStream(), anyio.WouldBlock()],
    ids=lambda error: type(error).__name__,
)
async def test_a_shared_sources_error_of_anyios_own_types_reaches_its_consumer(
    error: Exception,
) -> None:
    """Through ``@shared_subscription`` too, a source's ``EndOfStream`` or
    ``WouldBlock`` reaches the consumer as raised: never a clean end."""

    @shared_subscription
    class Failing:
        def __init__(self, name: str) -> None:
            self.name = name

        async def __aiter__(self) -> AsyncIterator[int]:
            yield 1
            raise error

    async def read_all() -> list[int]:
        return [item async for item in Failing(type(error).__name__)]

    async with SubscriptionPool():
        with anyio.fail_after(5), pytest.raises(type(error)) as raised:
            await read_all()
    assert raised.value is error
