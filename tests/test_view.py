"""The View an entry is given, and the restart engine used on its own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from collections.abc import Collection
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _stubs import meta
from _stubs import pairs
from wool import DiscoveryEvent

from wool_pooling import Lagged
from wool_pooling import RestartPolicy
from wool_pooling import SubscriptionPool
from wool_pooling import Synced
from wool_pooling import View
from wool_pooling import shared_subscription
from wool_pooling._pooling.decorator import shared_subscription as plain_subscription
from wool_pooling._pooling.restart import RestartingSource
from wool_pooling._wool.view import WorkerView

pytestmark = pytest.mark.anyio


class Latest(View[int]):
    """Remembers the last item: a joiner is replayed it; a consumer that falls
    behind is caught up with it."""

    def __init__(self, raw: Numbers) -> None:
        self.raw = raw
        self.last: int | None = None
        self.joins = 0

    def record(self, item: int) -> None:
        self.last = item

    def replay(self) -> Collection[int]:
        return () if self.last is None else (self.last,)

    def joined(self) -> None:
        self.joins += 1

    def catch_up(self, seen: object) -> Collection[int] | None:
        return self.replay()


@shared_subscription(view=Latest, max_lag=2, read_ahead=0)
class Numbers:
    def __init__(self, name: str) -> None:
        self.name = name
        self.release = anyio.Event()

    async def __aiter__(self) -> AsyncIterator[int]:
        for n in range(3):
            yield n
        await self.release.wait()
        for n in range(3, 10):
            yield n
        await anyio.sleep_forever()


async def test_an_entry_is_given_the_view_its_factory_makes() -> None:
    """``view=`` is called once per entry with the raw instance; the view
    records each item, a joiner is replayed what it gives, its join hook
    runs at every join, and ``view(pool)`` finds it while the entry lives."""
    subscription = Numbers("n")
    async with SubscriptionPool() as pool:
        assert subscription.view(pool) is None
        async with aiter(subscription) as first:
            assert [await anext(first) for _ in range(3)] == [0, 1, 2]
            view = subscription.view(pool)
            assert isinstance(view, Latest)
            assert isinstance(view.raw, Numbers)
            assert view.raw.name == "n"
            async with aiter(subscription) as late:
                assert await anext(late) == 2  # the replay
                assert subscription.view(pool) is view
                assert view.joins == 2
        assert subscription.view(pool) is None


async def test_a_lagging_consumer_is_caught_up_by_its_view() -> None:
    """A consumer further than ``max_lag`` behind gets the view's catch-up in
    place of what it missed, then the live items."""
    subscription = Numbers("lag")
    async with (
        SubscriptionPool() as pool,
        aiter(subscription) as fast,
        aiter(subscription) as slow,
    ):
        assert await anext(slow) == 0
        assert [await anext(fast) for _ in range(3)] == [0, 1, 2]  # 0: replay
        view = subscription.view(pool)
        assert isinstance(view, Latest)
        view.raw.release.set()
        assert [await anext(fast) for _ in range(7)] == [*range(3, 10)]
        assert await anext(slow) == 9  # caught up with the latest
        stats = subscription.statistics(pool)
        assert (stats.lagged, stats.resyncs) == (1, 1)


@plain_subscription(max_lag=1, read_ahead=0)
class Plain:
    async def __aiter__(self) -> AsyncIterator[int]:
        for n in range(4):
            yield n
        await anyio.sleep_forever()


async def test_without_a_view_factory_the_pool_remembers_nothing() -> None:
    """The pool's own decorator with no view: a joiner gets no replay, and a
    consumer that falls behind gets ``Lagged``."""
    subscription = Plain()
    async with SubscriptionPool(), aiter(subscription) as slow:
        assert await anext(slow) == 0
        first = aiter(subscription)  # joins at its first read
        assert [await anext(first) for _ in range(3)] == [1, 2, 3]
        with pytest.raises(Lagged):
            await anext(slow)
        late = aiter(subscription)
        async with anyio.create_task_group() as tg:
            tg.start_soon(anext, late)
            await anyio.wait_all_tasks_blocked()
            stats = subscription.statistics()
            assert (stats.consumers, stats.replays) == (3, 0)
            tg.cancel_scope.cancel()


async def test_a_join_calls_no_dunder_hook_of_the_subscriber_class() -> None:
    """Only the entry's view hears of a join (``View.joined()``): a
    ``__wool_pooling_joined__`` on the subscriber class is not a hook."""
    called: list[object] = []

    @shared_subscription
    class Hooked:
        def __wool_pooling_joined__(self) -> None:
            called.append(self)

        async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
            yield DiscoveryEvent("worker-added", metadata=meta())
            await anyio.sleep_forever()

    async with SubscriptionPool(), aiter(Hooked()) as consumer:
        assert (await anext(consumer)).type == "worker-added"
    assert called == []


class Script:
    """A raw stream that runs ``runs`` in turn, raising after each but the last."""

    def __init__(self, *runs: list[Any]) -> None:
        self.runs = list(runs)

    async def __aiter__(self) -> AsyncIterator[Any]:
        run = self.runs.pop(0)
        for item in run:
            await anyio.lowlevel.checkpoint()
            yield item
        if self.runs:
            raise RuntimeError("lost")
        await anyio.sleep_forever()


def added(pid: int) -> DiscoveryEvent:
    return DiscoveryEvent("worker-added", metadata=meta(UIDS[pid], pid=pid))


UIDS = [meta().uid for _ in range(3)]


async def test_the_restart_engine_runs_on_its_own() -> None:
    """``RestartingSource(raw, policy, view)`` without a pool: it restarts the
    raw stream, the view turns the relisting into what changed and the
    ``Synced`` marker ends it (the unreported worker is dropped), and it
    counts the restart and the error."""
    raw = Script([added(0), added(1), Synced()], [added(1), Synced(), added(2)])
    view = WorkerView(raw)
    source = RestartingSource[Any](raw, RestartPolicy(backoff=0, settle=60), view)
    try:
        with anyio.fail_after(5):
            got = [await anext(source) for _ in range(4)]
    finally:
        await source.aclose()
    assert pairs(got) == [
        ("worker-added", meta(UIDS[0], pid=0)),
        ("worker-added", meta(UIDS[1], pid=1)),
        ("worker-dropped", meta(UIDS[0], pid=0)),
        ("worker-added", meta(UIDS[2], pid=2)),
    ]
    assert (source.restarts, source.errors, source.count) == (1, 1, 4)
    assert source.listed_at == 2
    assert list(view.workers) == [UIDS[1], UIDS[2]]


async def test_without_a_policy_the_engine_raises_and_counts() -> None:
    """With no policy the stream's error ends the iteration, counted once."""
    source = RestartingSource[Any](Script([added(0)], [added(1)]))
    assert pairs([await anext(source)]) == [("worker-added", meta(UIDS[0], pid=0))]
    with pytest.raises(RuntimeError, match="lost"):
        await anext(source)
    assert (source.restarts, source.errors) == (0, 1)
