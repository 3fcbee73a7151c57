"""``Fanout.aclose()`` closes the source even when the pump never pulled from it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from _loops import asyncio_only

from wool_pooling import Fanout

pytestmark = pytest.mark.anyio


class Closable:
    """An async iterator that records its ``aclose()``."""

    def __init__(self) -> None:
        self.closed = 0

    def __aiter__(self) -> AsyncIterator[int]:
        return self

    async def __anext__(self) -> int:
        await anyio.sleep_forever()
        raise AssertionError

    async def aclose(self) -> None:
        self.closed += 1


async def test_aclose_before_any_wait_closes_an_iterator_source() -> None:
    """A fan-out closed before any consumer waited closes its iterator source once."""
    source = Closable()
    fanout = Fanout(source)
    fanout.consumer()
    await fanout.aclose()
    await fanout.aclose()
    assert source.closed == 1


@asyncio_only
async def test_aclose_before_the_pumps_first_step_closes_the_source() -> None:
    """Closed after a wait started the pump but before its first step, the
    fan-out still closes its iterator source, once."""
    source = Closable()
    fanout = Fanout(source)
    reading = fanout.consumer().__anext__()
    reading.send(None)  # asks for a pull: the pump is spawned, not yet run
    reading.close()
    assert fanout.statistics().pulling
    await fanout.aclose()
    assert source.closed == 1
