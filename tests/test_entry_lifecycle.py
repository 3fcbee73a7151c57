"""A pool entry's lifecycle: the transition table, and the states a real entry
walks through as consumers join and leave, its ttl expires, its source ends
and its pool closes."""

from __future__ import annotations

import itertools
from typing import Any
from typing import ClassVar

import anyio
import anyio.lowlevel
import pytest
from _stubs import TIMEOUT
from _stubs import AcloseStub
from _stubs import StreamStub
from _stubs import make_stub
from _stubs import settle
from _stubs import subscribe

from wool_pooling import PoolStatistics
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription
from wool_pooling._pooling.pool import Entry
from wool_pooling._pooling.pool import EntryEvent
from wool_pooling._pooling.pool import EntryState
from wool_pooling._pooling.pool import IllegalTransition
from wool_pooling._pooling.pool import attach
from wool_pooling._pooling.pool import transition

ACTIVE, IDLE, ENDED, CLOSING, CLOSED = (
    EntryState.ACTIVE,
    EntryState.IDLE,
    EntryState.ENDED,
    EntryState.CLOSING,
    EntryState.CLOSED,
)
JOINED, LEFT, EXPIRED, SOURCE_ENDED, POOL_CLOSED, DONE = (
    EntryEvent.JOINED,
    EntryEvent.LEFT,
    EntryEvent.EXPIRED,
    EntryEvent.SOURCE_ENDED,
    EntryEvent.POOL_CLOSED,
    EntryEvent.CLOSED,
)
ANY = None

#: (state, event, consumers attached after it?, ttl > 0?, next state); ANY
#: matches both. Every case no row matches is illegal.
TABLE: list[tuple[EntryState, EntryEvent, bool | None, bool | None, EntryState]] = [
    (ACTIVE, JOINED, True, ANY, ACTIVE),
    (ACTIVE, LEFT, True, ANY, ACTIVE),
    (ACTIVE, LEFT, False, True, IDLE),
    (ACTIVE, LEFT, False, False, CLOSING),
    (ACTIVE, SOURCE_ENDED, True, ANY, ENDED),
    (ACTIVE, SOURCE_ENDED, False, ANY, CLOSING),
    (ACTIVE, POOL_CLOSED, ANY, ANY, CLOSING),
    (IDLE, JOINED, True, ANY, ACTIVE),
    (IDLE, LEFT, False, ANY, IDLE),
    (IDLE, EXPIRED, False, ANY, CLOSING),
    (IDLE, SOURCE_ENDED, False, ANY, CLOSING),
    (IDLE, POOL_CLOSED, False, ANY, CLOSING),
    (ENDED, LEFT, True, ANY, ENDED),
    (ENDED, LEFT, False, ANY, CLOSING),
    (ENDED, POOL_CLOSED, ANY, ANY, CLOSING),
    (CLOSING, LEFT, ANY, ANY, CLOSING),
    (CLOSING, POOL_CLOSED, ANY, ANY, CLOSING),
    (CLOSING, DONE, ANY, ANY, CLOSED),
    (CLOSED, LEFT, ANY, ANY, CLOSED),
]


def expected(
    state: EntryState, event: EntryEvent, consumers: int, ttl: float
) -> EntryState | None:
    """The next state per :data:`TABLE`, or ``None`` where the case is illegal."""
    found = [
        after
        for before, on, attached, lingers, after in TABLE
        if (before, on) == (state, event)
        and attached in (ANY, consumers > 0)
        and lingers in (ANY, ttl > 0)
    ]
    assert len(found) <= 1, "overlapping rows"
    return found[0] if found else None


CASES = list(itertools.product(EntryState, EntryEvent, (0, 1, 3), (0.0, 2.5)))


@pytest.mark.parametrize(
    ("state", "event", "consumers", "ttl"),
    CASES,
    ids=[f"{s.name}-{e.name}-{c}-{t}" for s, e, c, t in CASES],
)
def test_transition_follows_the_table_and_refuses_the_rest(
    state: EntryState, event: EntryEvent, consumers: int, ttl: float
) -> None:
    """Every state x event x (consumers, ttl) moves as the table says, or raises."""
    after = expected(state, event, consumers, ttl)
    if after is None:
        with pytest.raises(IllegalTransition, match=f"{state.name}.*{event.name}"):
            transition(state, event, consumers, ttl)
    else:
        assert transition(state, event, consumers, ttl) is after


def test_every_row_of_the_table_is_reached() -> None:
    """No row of the table is dead: each decides at least one case."""
    reached = {
        (state, event, after)
        for state, event, consumers, ttl in CASES
        if (after := expected(state, event, consumers, ttl)) is not None
    }
    assert {(before, on, after) for before, on, _, _, after in TABLE} == reached


def test_closed_is_reached_only_through_closing() -> None:
    """Whatever happens, an entry is closed only by the close step's end."""
    for state, event, consumers, ttl in CASES:
        if expected(state, event, consumers, ttl) is CLOSED:
            assert state in (CLOSING, CLOSED)


# -- a real entry ---------------------------------------------------------------


def join(pool: SubscriptionPool, cls: type[StreamStub], name: str = "a") -> Entry:
    """Attach one consumer of ``cls(name)`` to ``pool``, as a consumer's join does."""
    sub = subscribe(cls, name)
    return attach(
        pool,
        (sub.cls, sub.key),
        sub._config(),  # pyright: ignore[reportPrivateUsage]
        sub._build_raw,  # pyright: ignore[reportPrivateUsage]
        repr(sub),
    )


async def end_source(entry: Entry) -> None:
    """Let ``entry``'s fan-out see its source end."""
    raw: Any = entry.raw
    reader = entry.fanout.consumer()
    raw.end()
    with anyio.fail_after(TIMEOUT), pytest.raises(StopAsyncIteration):
        await anext(reader)
    assert entry.fanout.finished


@pytest.mark.anyio
async def test_an_entry_with_a_ttl_walks_active_idle_active_idle_closed() -> None:
    """Joins make an entry ACTIVE, its last leave IDLE (a timer), its expiry CLOSED."""
    cls = make_stub(ttl=60)
    async with SubscriptionPool() as pool:
        entry = join(pool, cls)
        assert entry.state is ACTIVE
        assert repr(entry) == "<Entry [ACTIVE, consumers: 1] of AcloseStub, key=('a',)>"
        assert join(pool, cls) is entry
        assert repr(entry).startswith("<Entry [ACTIVE, consumers: 2]")
        await entry.release()
        await entry.release()
        assert entry.state is IDLE
        assert repr(entry).startswith("<Entry [IDLE, consumers: 0]")
        assert entry.expiry is not None
        assert pool.statistics() == PoolStatistics(entries=1, consumers=0, idle=1)
        assert join(pool, cls) is entry  # taken over before its ttl elapsed
        assert entry.state is ACTIVE
        assert entry.expiry is None
        await entry.release()
        assert entry.expiry is not None
        entry.expiry.cancel()  # the timer fires now
        with anyio.fail_after(TIMEOUT):
            while entry.state is not CLOSED:
                await anyio.lowlevel.checkpoint()
        assert cls.instances[0].closes_done == 1
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)
        assert join(pool, cls) is not entry


@pytest.mark.anyio
async def test_an_entry_without_ttl_is_closed_when_its_last_release_returns() -> None:
    """ttl=0: the last release runs the close step before it returns."""
    cls = make_stub()
    async with SubscriptionPool() as pool:
        entry = join(pool, cls)
        await entry.release()
        assert entry.state is CLOSED
        assert repr(entry).startswith("<Entry [CLOSED, consumers: 0]")
        assert cls.instances[0].closes_done == 1


@pytest.mark.anyio
async def test_an_ended_entry_is_left_to_its_consumers_and_closed_by_the_last() -> None:
    """A finished source makes its entry ENDED at the next join: the joiner gets a
    fresh entry, the old one closes when its own consumers have left."""
    cls = make_stub(ttl=60)
    async with SubscriptionPool() as pool:
        old = join(pool, cls)
        join(pool, cls)
        await end_source(old)
        fresh = join(pool, cls)
        assert fresh is not old
        assert (old.state, fresh.state) == (ENDED, ACTIVE)
        assert pool.statistics() == PoolStatistics(entries=2, consumers=3, idle=0)
        await old.release()
        assert old.state is ENDED
        await old.release()  # no ttl for an ended source
        assert old.state is CLOSED
        assert cls.instances[0].closes_done == 1
        assert pool.statistics() == PoolStatistics(entries=1, consumers=1, idle=0)
        await fresh.release()


@pytest.mark.anyio
async def test_closing_the_pool_moves_every_entry_to_closing_at_once() -> None:
    """Pool exit: every entry is CLOSING before the first close step ends, and
    aclose() returns once all are CLOSED."""
    go = anyio.Event()

    @shared_subscription()
    class BlockingClose(AcloseStub):
        """A raw instance whose ``aclose()`` waits for the test's word."""

        instances: ClassVar[list[StreamStub]] = []

        async def aclose(self) -> None:
            await go.wait()
            await super().aclose()

    cls = make_stub()
    pool = SubscriptionPool()
    first = join(pool, BlockingClose, "a")
    second = join(pool, cls, "b")
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.aclose)
        await anyio.wait_all_tasks_blocked()
        assert (first.state, second.state) == (CLOSING, CLOSING)
        assert pool.statistics() == PoolStatistics(entries=2, consumers=0, idle=0)
        await first.release()  # a consumer leaving a closing entry
        assert first.state is CLOSING
        go.set()
    assert (first.state, second.state) == (CLOSED, CLOSED)
    await second.release()  # and one leaving a closed entry
    assert second.state is CLOSED
    assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)


@pytest.mark.anyio
async def test_an_illegal_event_raises_and_leaves_the_entry_as_it_was() -> None:
    """An event the lifecycle does not allow raises; the state is unchanged."""
    cls = make_stub(ttl=60)
    async with SubscriptionPool() as pool:
        entry = join(pool, cls)
        with pytest.raises(IllegalTransition):
            entry._move(EXPIRED)  # pyright: ignore[reportPrivateUsage]
        assert entry.state is ACTIVE
        assert entry.expiry is None
        await entry.release()


@pytest.mark.anyio
async def test_a_collected_consumers_leave_is_decided_later_with_the_count_then() -> (
    None
):
    """A garbage-collected consumer is counted out at once; its leave, decided
    on the loop later, keeps an entry that a consumer joined meanwhile."""
    cls = make_stub()
    async with SubscriptionPool() as pool:
        entry = join(pool, cls)
        entry.release_soon()
        assert (entry.state, entry.refs) == (ACTIVE, 0)
        assert pool.statistics() == PoolStatistics(entries=1, consumers=0, idle=1)
        assert join(pool, cls) is entry  # joined before the leave is decided
        await settle()
        assert (entry.state, entry.refs) == (ACTIVE, 1)
        assert cls.instances[0].close_calls == 0
        entry.release_soon()
        with anyio.fail_after(TIMEOUT):
            while entry.state is not CLOSED:
                await anyio.lowlevel.checkpoint()
        assert cls.instances[0].closes_done == 1
        assert pool.statistics() == PoolStatistics(entries=0, consumers=0, idle=0)
