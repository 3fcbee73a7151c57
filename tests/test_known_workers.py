"""The shared record of known workers, and consumers that keep no view of their own.

A pool entry records every logged item once (``WorkerView``) and keeps
undo records for as far back as a consumer can be left behind; a consumer
reading the log keeps nothing, and the view it has seen is rebuilt only
when it falls behind (``Fanout.consumer(on_skip=...)``).
"""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import AsyncGenerator
from typing import Any
from typing import cast

import anyio
import pytest
from _stubs import entry_of
from _stubs import ev
from _stubs import make_stub
from _stubs import meta
from _stubs import pairs
from _stubs import take
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import Fanout
from wool_pooling import Lagged
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription
from wool_pooling._wool.view import WorkerView

pytestmark = pytest.mark.anyio

View = dict[uuid.UUID, WorkerMetadata]

UIDS = [uuid.UUID(int=i + 1) for i in range(4)]
TYPES = ["worker-added", "worker-updated", "worker-dropped"]


def reference(items: list[object]) -> View:
    """The model: apply each discovery event in turn, whatever it claims."""
    view: View = {}
    for item in items:
        if isinstance(item, DiscoveryEvent):
            if item.type == "worker-dropped":
                view.pop(item.metadata.uid, None)
            else:
                view[item.metadata.uid] = item.metadata
    return view


# Any stream, malformed ones included (an add of a known worker, a drop of an
# unknown one, an update of an unknown one), and items that are not events.
items = st.lists(
    st.one_of(
        st.builds(
            lambda type_, uid, pid: ev(type_, meta(UIDS[uid], pid=pid)),  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
            st.sampled_from(TYPES),
            st.integers(0, len(UIDS) - 1),
            st.integers(1, 3),
        ),
        st.just("not an event"),
    ),
    max_size=30,
)


def known_workers(history: int | None = None) -> WorkerView:
    """A worker view keeping ``history`` undo records, as a pool entry's."""
    view = WorkerView()
    view.remember(history)
    return view


@settings(max_examples=200, deadline=None)
@given(stream=items, history=st.integers(1, 8))
def test_workers_rebuilt_at_every_point_within_the_history(
    stream: list[object], history: int
) -> None:
    """``at(n)`` is the state after the first ``n`` items, for every ``n``
    within the history, and the record is the state at the end."""
    known = known_workers(history)
    for item in stream:
        known.record(item)
    assert known.count == len(stream)
    assert known.workers == reference(stream)
    assert known.untracked == any(not isinstance(i, DiscoveryEvent) for i in stream)
    for n in range(max(0, len(stream) - history), len(stream) + 1):
        assert known.seen_at(n) == reference(stream[:n]), n


def test_rebuilding_beyond_the_history_or_ahead_is_refused() -> None:
    known = known_workers(2)
    for pid in range(1, 5):
        known.record(ev("worker-added", meta(UIDS[0], pid=pid)))
    assert known.seen_at(2) == {UIDS[0]: meta(UIDS[0], pid=2)}
    with pytest.raises(ValueError, match="history of 2"):
        known.seen_at(1)
    with pytest.raises(ValueError, match="4 recorded"):
        known.seen_at(5)
    without = known_workers()
    without.record(ev("worker-added", meta(UIDS[0])))
    assert without.seen_at(1) == without.workers
    with pytest.raises(ValueError, match="history of 0"):
        without.seen_at(0)


def test_consumers_behind_at_the_same_item_share_one_rebuilt_view() -> None:
    """Rebuilt once per (log end, position): a burst that leaves many
    consumers behind costs one view, and the next item makes a new one."""
    known = known_workers(4)
    a, b = meta(UIDS[0]), meta(UIDS[1])
    known.record(ev("worker-added", a))
    known.record(ev("worker-added", b))
    first = known.seen_at(1)
    assert known.seen_at(1) is first
    assert known.seen_at(0) is not first
    known.record(ev("worker-dropped", a))
    again = known.seen_at(1)
    assert again == {a.uid: a} == first
    assert again is not first


# -- Fanout.consumer(on_skip=...) --------------------------------------------------


async def numbers(n: int) -> AsyncGenerator[int, None]:
    for i in range(n):
        yield i


async def test_on_skip_is_told_where_each_lag_begins() -> None:
    """Called once per Lagged the consumer will raise, with the number of
    items logged before the first it missed, in the step that left it behind."""
    fanout = Fanout(numbers(40), max_lag=3, on_lag="error")
    calls: list[tuple[int, int]] = []
    fast = fanout.consumer()
    slow = fanout.consumer(
        on_skip=lambda position: calls.append((position, fanout.statistics().pulled))
    )
    with anyio.fail_after(5):
        assert [await anext(slow) for _ in range(2)] == [0, 1]
        assert [await anext(fast) for _ in range(10)] == list(range(10))
        # Left behind at item 2 when item 5 was logged (2 + max_lag + 1 = 6 items).
        assert calls == [(2, 6)]
        with pytest.raises(Lagged) as info:
            await anext(slow)
        assert info.value.skipped == 5  # items 2 .. 6: it resumes at 7
        assert await anext(slow) == 7
        assert [await anext(fast) for _ in range(20)] == list(range(10, 30))
        assert calls == [(2, 6), (8, 12)]
        with pytest.raises(Lagged):
            await anext(slow)
        assert calls == [(2, 6), (8, 12)]  # the move of a lag pending is not a new one
    await fanout.aclose()


async def test_on_skip_that_raises_is_logged_and_the_fanout_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(position: int) -> None:
        raise RuntimeError(f"broken at {position}")

    fanout = Fanout(numbers(10), max_lag=2, on_lag="error")
    fast, slow = fanout.consumer(), fanout.consumer(on_skip=broken)
    with caplog.at_level(logging.ERROR, logger="wool_pooling"), anyio.fail_after(5):
        assert [item async for item in fast] == list(range(10))
        with pytest.raises(Lagged):
            await anext(slow)
        assert [item async for item in slow] == [8, 9]
    assert [r.exc_info[1].args for r in caplog.records if r.exc_info] == [
        ("broken at 0",)
    ]
    assert "on_skip" in caplog.records[0].getMessage()


@pytest.mark.parametrize("on_lag", ["wait", "error"])
async def test_on_skip_never_called_while_the_consumer_keeps_up(on_lag: Any) -> None:
    """Within the bound, and under on_lag="wait" at any distance, nothing is skipped."""
    fanout = Fanout(numbers(30), max_lag=3, on_lag=on_lag)
    calls: list[int] = []
    first, second = fanout.consumer(), fanout.consumer(on_skip=calls.append)
    with anyio.fail_after(5):
        for _ in range(10):
            assert [await anext(first) for _ in range(3)] == [
                await anext(second) for _ in range(3)
            ]
    assert calls == []
    await fanout.aclose()


async def test_on_skip_is_dropped_when_the_consumer_ends() -> None:
    class Hook:
        def __call__(self, position: int) -> None: ...

    hook = Hook()
    gone = weakref.ref(hook)
    fanout = Fanout(numbers(3), max_lag=2, on_lag="error")
    consumer = fanout.consumer(on_skip=hook)
    del hook
    assert gone() is not None
    consumer.close()
    assert gone() is None
    await fanout.aclose()


# -- SubscriptionConsumer: no view while on the log --------------------------------


def seen_of(consumer: object) -> Any:
    """What ``consumer`` had seen as it fell behind, held for its catch-up."""
    seen = consumer._seen  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
    return seen[-1] if seen else None  # pyright: ignore[reportUnknownVariableType]


async def test_consumer_on_the_log_keeps_no_view() -> None:
    """A consumer holds no view of its own, replaying or reading the log: its
    position says what it has seen, and a delivery records nothing."""
    stub = make_stub()
    workers = [meta() for _ in range(3)]
    async with SubscriptionPool():
        sub = cast(SharedSubscription[DiscoveryEvent], stub())
        first = aiter(sub)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(take, first, 3)
                await anyio.wait_all_tasks_blocked()
                stub.instances[-1].push(*(ev("worker-added", w) for w in workers))
            late = aiter(sub)
            replayed = await take(late, 1)
            assert seen_of(late) is None  # mid-replay
            replayed += await take(late, 2)
            assert pairs(replayed) == [("worker-added", w) for w in workers]
            stub.instances[-1].push(ev("worker-dropped", workers[0]))
            for consumer in (first, late):
                assert pairs(await take(consumer, 1)) == [
                    ("worker-dropped", workers[0])
                ]
                assert seen_of(consumer) is None
        await first.aclose()
        await late.aclose()


@shared_subscription(key=lambda cls, name, events, live: name, max_lag=2)
class Scripted:
    """Yields the events given, then what ``live`` sends."""

    def __init__(self, name: str, events: list[DiscoveryEvent], live: Any) -> None:
        self.events, self.live = events, live

    async def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        for event in self.events:
            yield event
        async for event in self.live:
            yield event


@pytest.mark.parametrize("taken", [1, 2], ids=lambda n: f"replay-taken-{n}")
async def test_consumer_left_behind_mid_replay_ends_its_replay_then_resyncs(
    taken: int,
) -> None:
    """Left behind before its replay is over, a consumer takes the rest of
    the replay, then the diff from it to the current workers; while it lags
    it holds the view rebuilt at its place in the log, then none."""
    a, b, c = meta(), meta(), meta()
    a2 = meta(a.uid, pid=2)
    send, receive = anyio.create_memory_object_stream[DiscoveryEvent](10)
    script = [ev("worker-added", a), ev("worker-added", b)]
    with send, receive:
        sub = cast(
            SharedSubscription[DiscoveryEvent],
            Scripted(f"mid-replay-{taken}", script, receive),
        )
        async with SubscriptionPool() as pool:
            fast = aiter(sub)
            with anyio.fail_after(5):
                assert pairs(await take(fast, 2)) == pairs(script)
                late = aiter(sub)
                got = await take(late, taken)
                for event in (
                    ev("worker-updated", a2),
                    ev("worker-dropped", b),
                    ev("worker-added", c),
                ):
                    send.send_nowait(event)
                assert len(await take(fast, 3)) == 3
                assert seen_of(late) == {a.uid: a, b.uid: b}
                assert entry_of(pool, sub).source.view.workers == {
                    a.uid: a2,
                    c.uid: c,
                }
                got += await take(late, 2 - taken + 3)
                assert pairs(got) == [
                    *pairs(script),
                    ("worker-updated", a2),
                    ("worker-added", c),
                    ("worker-dropped", b),
                ]
                assert seen_of(late) is None
            await fast.aclose()
            await late.aclose()
