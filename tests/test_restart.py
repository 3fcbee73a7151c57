"""Restartable shared sources: ``@shared_subscription(restart=RestartPolicy(...))``."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Sequence
from typing import Any
from typing import cast

import anyio
import anyio.lowlevel
import pytest
from _stubs import entry_of
from _stubs import meta
from _stubs import pairs
from _stubs import take
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import RestartPolicy
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

pytestmark = pytest.mark.anyio

#: Script markers: the run raises ``RuntimeError(f"run {k} failed")`` / ends.
FAIL = "fail"
END = "end"

Item = DiscoveryEvent | str | anyio.Event
View = dict[uuid.UUID, WorkerMetadata]


def same(metadata: WorkerMetadata) -> WorkerMetadata:
    """An equal but distinct copy: re-reports compare by value."""
    return meta(metadata.uid, pid=metadata.pid)


def added(metadata: WorkerMetadata) -> DiscoveryEvent:
    return DiscoveryEvent("worker-added", metadata=metadata)


def updated(metadata: WorkerMetadata) -> DiscoveryEvent:
    return DiscoveryEvent("worker-updated", metadata=metadata)


def dropped(metadata: WorkerMetadata) -> DiscoveryEvent:
    return DiscoveryEvent("worker-dropped", metadata=metadata)


def apply(view: View, events: Sequence[DiscoveryEvent]) -> View:
    """Apply events to a consumer's view, rejecting inconsistent ones."""
    for event in events:
        uid = event.metadata.uid
        if event.type == "worker-added":
            assert uid not in view, f"duplicate worker-added for {uid}"
            view[uid] = event.metadata
        elif event.type == "worker-updated":
            assert uid in view, f"worker-updated of unknown worker {uid}"
            view[uid] = event.metadata
        else:
            assert uid in view, f"worker-dropped of unknown worker {uid}"
            del view[uid]
    return view


def state(*workers: WorkerMetadata) -> View:
    return {metadata.uid: metadata for metadata in workers}


async def first_events(sub: SharedSubscription, n: int) -> list[DiscoveryEvent]:
    """The first ``n`` events one consumer of ``sub`` reads, in a pool of its
    own, closed before returning."""
    async with SubscriptionPool():
        return await take(aiter(sub), n)


class Script:
    """The plan of each run of a raw stream, and a log of what happened.

    Run ``k`` (the ``k``-th ``aiter(raw)``) plays ``runs[k]``: events are
    yielded, ``FAIL`` raises, ``END`` ends the run, an ``anyio.Event`` is
    waited for. After its items (and for runs beyond the script) the run
    blocks forever.
    """

    def __init__(self, *runs: Sequence[Item]) -> None:
        self.runs = [list(run) for run in runs]
        #: ("started", k) and ("closed", k) entries, in order.
        self.log: list[tuple[str, int]] = []

    @property
    def started(self) -> int:
        return sum(1 for what, _ in self.log if what == "started")


class Run:
    """One iteration of the raw stream: an async iterator with ``aclose()``."""

    def __init__(self, script: Script, index: int) -> None:
        self.script = script
        self.index = index
        runs = script.runs
        self.items: list[Item] = list(runs[index]) if index < len(runs) else []
        self.position = 0
        self.closed = False

    def __aiter__(self) -> Run:
        return self

    async def __anext__(self) -> DiscoveryEvent:
        while not self.closed and self.position < len(self.items):
            item = self.items[self.position]
            self.position += 1
            if isinstance(item, anyio.Event):
                await item.wait()
            elif item == FAIL:
                raise RuntimeError(f"run {self.index} failed")
            elif item == END:
                self.position = len(self.items)
                self.closed = True
            else:
                await anyio.lowlevel.checkpoint()
                return cast(DiscoveryEvent, item)
        if self.closed:
            raise StopAsyncIteration
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.script.log.append(("closed", self.index))
        self.closed = True


class Raw:
    """Undecorated raw subscriber playing a :class:`Script`, one run per aiter."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def __aiter__(self) -> Run:
        index = self.script.started
        self.script.log.append(("started", index))
        return Run(self.script, index)


def restartable(policy: RestartPolicy | None, **options: Any) -> type[Raw]:
    """A fresh decorated class (keyed by the script's identity)."""
    cls = type("Raw", (Raw,), {})
    return shared_subscription(restart=policy, **options)(cls)


def subscribe(
    policy: RestartPolicy | None, script: Script, **options: Any
) -> SharedSubscription:
    return cast(SharedSubscription, restartable(policy, **options)(script))


def fast(**overrides: Any) -> RestartPolicy:
    """No backoff, a short settle window."""
    settings: dict[str, Any] = {"backoff": 0, "jitter": 0, "settle": 0.2}
    settings.update(overrides)
    return RestartPolicy(**settings)


# -- the diff after a restart -------------------------------------------------


async def test_unchanged_rereport_adds_nothing() -> None:
    """Workers the new stream re-reports unchanged produce no event for anyone."""
    a, b, z = meta(), meta(), meta()
    later, gate = meta(), anyio.Event()
    script = Script(
        [added(a), added(b), added(z), FAIL],
        [added(same(a)), updated(same(b)), gate, added(later)],
    )
    sub = subscribe(fast(), script)
    async with SubscriptionPool():
        first, second = aiter(sub), aiter(sub)
        seen = [await take(first, 3), await take(second, 3)]
        assert [pairs(events) for events in seen] == [
            pairs([added(a), added(b), added(z)])
        ] * 2
        # The next event anyone sees is the settle timer's drop of z: the
        # re-reports of a and b came (and were suppressed) before it.
        for it, events in zip((first, second), seen, strict=True):
            events.extend(await take(it, 1))
            assert pairs(events[3:]) == [("worker-dropped", z)]
        gate.set()
        for it, events in zip((first, second), seen, strict=True):
            events.extend(await take(it, 1))
            assert pairs(events[4:]) == [("worker-added", later)]
            assert apply({}, events) == state(a, b, later)
        assert script.started == 2


async def test_changed_metadata_becomes_worker_updated() -> None:
    """A known worker re-reported with other metadata is one worker-updated."""
    a, b = meta(), meta()
    a2 = meta(a.uid, pid=2)
    b2 = meta(b.uid, pid=3)
    joined = anyio.Event()  # both consumers join before the failure
    script = Script(
        [added(a), added(b), joined, FAIL],
        [added(a2), updated(b2), added(same(b2))],
    )
    sub = subscribe(fast(settle=5), script)
    async with SubscriptionPool():
        first, second = aiter(sub), aiter(sub)
        one = await take(first, 2)
        two = await take(second, 2)
        joined.set()
        one += await take(first, 2)
        two += await take(second, 2)
        for events in (one, two):
            assert pairs(events[2:]) == [
                ("worker-updated", a2),
                ("worker-updated", b2),
            ]
            assert apply({}, events) == state(a2, b2)


async def test_new_worker_becomes_worker_added() -> None:
    """A worker only the new stream reports is one worker-added, whatever its type."""
    a, c, d = meta(), meta(), meta()
    script = Script(
        [added(a), FAIL],
        [added(same(a)), added(c), updated(d)],
    )
    sub = subscribe(fast(settle=5), script)
    async with SubscriptionPool():
        first, second = aiter(sub), aiter(sub)
        one = await take(first, 1)
        two = await take(second, 1)
        one += await take(first, 2)
        two += await take(second, 2)
        for events in (one, two):
            assert pairs(events) == [
                ("worker-added", a),
                ("worker-added", c),
                ("worker-added", d),
            ]
            assert apply({}, events) == state(a, c, d)


async def test_drop_in_new_stream_of_unknown_worker_is_suppressed() -> None:
    """The new stream's drops pass through for known workers only."""
    a, b, stranger = meta(), meta(), meta()
    script = Script(
        [added(a), added(b), FAIL],
        [added(same(a)), dropped(stranger), dropped(b), added(same(a))],
    )
    sub = subscribe(fast(settle=5), script)
    events = await first_events(sub, 3)
    assert pairs(events[2:]) == [("worker-dropped", b)]
    assert apply({}, events) == state(a)


async def test_unreported_worker_dropped_after_settle_on_silent_stream() -> None:
    """Workers not reported within ``settle`` are dropped, even on a silent stream."""
    a, b = meta(), meta()
    script = Script([added(a), added(b), FAIL], [])
    sub = subscribe(fast(), script)
    async with SubscriptionPool() as pool:
        first, second = aiter(sub), aiter(sub)
        one = await take(first, 2)
        two = await take(second, 2)
        one += await take(first, 2)
        two += await take(second, 2)
        for events in (one, two):
            assert pairs(events[2:]) == [("worker-dropped", a), ("worker-dropped", b)]
            assert apply({}, events) == {}
        assert entry_of(pool, sub).source.view.workers == {}
        assert script.started == 2


async def test_partial_rereport_drops_only_the_missing() -> None:
    """After settle exactly the unreported workers are dropped, with latest metadata."""
    a, b, c = meta(), meta(), meta()
    b2 = meta(b.uid, pid=7)
    script = Script(
        [added(a), added(b), updated(b2), added(c), FAIL],
        [added(same(c))],
    )
    sub = subscribe(fast(), script)
    async with SubscriptionPool():
        it = aiter(sub)
        events = await take(it, 4)
        events += await take(it, 2)
        assert pairs(events[4:]) == [("worker-dropped", a), ("worker-dropped", b2)]
        assert apply({}, events) == state(c)


async def test_consumer_left_behind_by_the_settle_drops_resyncs_exactly() -> None:
    """The settle timer's drops are logged outside any pull, and recorded: a
    consumer they leave behind the bound is rebuilt at its place (a drop
    left out of the record would lose b from it) and resynchronised exactly."""
    a, b, c, d = meta(), meta(), meta(), meta()
    a2 = meta(a.uid, pid=2)
    script = Script([added(a), added(b), added(c), FAIL], [added(a2), added(d)])
    # read_ahead=0: slow joins at item 2, not after a batch read ahead.
    cls = shared_subscription(restart=fast(), max_lag=3, read_ahead=0)(
        type("Raw", (Raw,), {})
    )
    sub = cast(SharedSubscription, cls(script))
    async with SubscriptionPool() as pool:
        quick = aiter(sub)
        assert pairs(await take(quick, 2)) == [("worker-added", a), ("worker-added", b)]
        slow = aiter(sub)  # joins at item 2, with a and b replayed
        assert len(await take(slow, 2)) == 2
        # c; after the restart a2 (updated) and d; then the settle timer's
        # drop of b leaves slow 4 items behind: one more than max_lag.
        events = await take(quick, 5)
        assert pairs(events) == [
            ("worker-added", c),
            ("worker-updated", a2),
            ("worker-added", d),
            ("worker-dropped", b),
            ("worker-dropped", c),
        ]
        assert entry_of(pool, sub).source.view.workers == state(a2, d)
        resync = await take(slow, 3)
        assert pairs(resync) == [
            ("worker-updated", a2),
            ("worker-added", d),
            ("worker-dropped", b),
        ]
        assert apply(state(a, b), resync) == state(a2, d)
        assert script.started == 2


async def test_no_error_reaches_consumers_and_views_match_new_state() -> None:
    """Across restarts consumers see no error and end with the new stream's state."""
    a, b, c, d = meta(), meta(), meta(), meta()
    a2 = meta(a.uid, pid=9)
    script = Script(
        [added(a), added(b), FAIL],
        [added(same(a)), added(c), FAIL],
        [added(a2), added(same(c)), added(d)],
    )
    sub = subscribe(fast(), script)
    async with SubscriptionPool() as pool:
        first, second = aiter(sub), aiter(sub)
        views: list[View] = [{}, {}]
        expected = state(a2, c, d)
        with anyio.fail_after(5):
            for view, it in zip(views, (first, second), strict=True):
                while view != expected:
                    apply(view, [await anext(it)])
        assert entry_of(pool, sub).source.view.workers == expected
        assert script.started == 3


# -- giving up, unlimited attempts, ends --------------------------------------


async def test_exhausted_attempts_reach_every_consumer() -> None:
    """When ``attempts`` restarts in a row fail, every consumer gets the last error."""
    a = meta()
    joined = anyio.Event()  # every consumer joins before the failures
    script = Script([added(a), joined, FAIL], [FAIL], [FAIL])
    sub = subscribe(fast(attempts=2, settle=5), script)
    async with SubscriptionPool() as pool:
        consumers = [aiter(sub) for _ in range(3)]
        for it in consumers:
            assert pairs(await take(it, 1)) == [("worker-added", a)]
        joined.set()
        for it in consumers:
            with (
                anyio.fail_after(5),
                pytest.raises(RuntimeError, match=r"^run 2 failed$"),
            ):
                await anext(it)
        for it in consumers:
            with pytest.raises(StopAsyncIteration):
                await anext(it)
        assert script.started == 3
        assert pool.statistics().entries == 0


async def test_unlimited_attempts_keep_restarting() -> None:
    """``attempts=None`` restarts however many times the stream fails."""
    a, b = meta(), meta()
    script = Script(
        [added(a), FAIL], *([FAIL] for _ in range(8)), [added(same(a)), added(b)]
    )
    sub = subscribe(fast(attempts=None, settle=5), script)
    events = await first_events(sub, 2)
    assert pairs(events) == [("worker-added", a), ("worker-added", b)]
    assert script.started == 10


async def test_failure_counter_resets_after_an_event() -> None:
    """Only failures without an event in between count against ``attempts``."""
    workers = [meta() for _ in range(5)]
    runs: list[list[Item]] = []
    for index in range(5):
        # Each run re-reports the workers so far, reports one more, then fails.
        run: list[Item] = [added(same(w)) for w in workers[:index]]
        runs.append([*run, added(workers[index]), FAIL])
    runs[-1].pop()  # the last run does not fail
    script = Script(*runs)
    sub = subscribe(fast(attempts=1, settle=5), script)
    events = await first_events(sub, 5)
    assert pairs(events) == [("worker-added", w) for w in workers]
    assert script.started == 5


async def test_restart_on_end_restarts_after_normal_end() -> None:
    """With ``restart_on_end`` a stream that ends is iterated again."""
    a, b = meta(), meta()
    script = Script([added(a), END], [added(same(a)), added(b)])
    sub = subscribe(fast(restart_on_end=True, settle=5), script)
    events = await first_events(sub, 2)
    assert pairs(events) == [("worker-added", a), ("worker-added", b)]
    assert script.started == 2


@pytest.mark.parametrize("read_ahead", [0, 64])
async def test_normal_end_ends_consumers_by_default(read_ahead: int) -> None:
    """Without ``restart_on_end`` the stream's end ends every consumer, no restart."""
    a = meta()
    script = Script([added(a), END], [added(meta())])
    sub = subscribe(fast(), script, read_ahead=read_ahead)
    async with SubscriptionPool() as pool:
        consumers = [aiter(sub), aiter(sub)]
        firsts: list[list[tuple[str, WorkerMetadata]]] = []

        async def first(it: Any) -> None:
            firsts.append(pairs(await take(it, 1)))

        # Both join before the first pull (with read-ahead, the end is pulled
        # in the same batch as a).
        async with anyio.create_task_group() as group:
            for it in consumers:
                group.start_soon(first, it)
        assert firsts == [[("worker-added", a)]] * 2
        for it in consumers:
            with anyio.fail_after(5), pytest.raises(StopAsyncIteration):
                await anext(it)
        assert script.started == 1
        assert pool.statistics().entries == 0


async def test_failed_iterator_closed_before_restart() -> None:
    """The failed iteration is closed before ``aiter(raw)`` is called again."""
    a = meta()
    b = meta()
    script = Script([added(a), FAIL], [FAIL], [added(same(a)), added(b)])
    sub = subscribe(fast(settle=5), script)
    async with SubscriptionPool():
        it = aiter(sub)
        events = await take(it, 2)
        assert pairs(events) == [("worker-added", a), ("worker-added", b)]
        assert script.log == [
            ("started", 0),
            ("closed", 0),
            ("started", 1),
            ("closed", 1),
            ("started", 2),
        ]


async def test_each_restart_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Every restart logs one warning on the ``wool_pooling.restart`` logger."""
    a, b = meta(), meta()
    script = Script([added(a), FAIL], [FAIL], [END], [added(same(a)), added(b)])
    sub = subscribe(fast(restart_on_end=True, settle=5), script)
    with caplog.at_level(logging.WARNING, logger="wool_pooling.restart"):
        async with SubscriptionPool():
            it = aiter(sub)
            await take(it, 2)
    warnings = [
        record
        for record in caplog.records
        if record.name == "wool_pooling.restart" and record.levelno == logging.WARNING
    ]
    assert len(warnings) == 3
    assert script.started == 4


# -- late joiners --------------------------------------------------------------


async def test_late_joiner_during_settle_window_is_consistent() -> None:
    """A consumer joining while a restart settles gets a replay its events extend."""
    a, b, c = meta(), meta(), meta()
    a2 = meta(a.uid, pid=2)
    gate = anyio.Event()
    script = Script(
        [added(a), added(b), FAIL],
        [added(a2), gate, added(same(b)), added(c)],
    )
    sub = subscribe(fast(settle=0.5), script)
    async with SubscriptionPool():
        first = aiter(sub)
        one = await take(first, 3)
        assert pairs(one[2:]) == [("worker-updated", a2)]
        late = aiter(sub)
        two = await take(late, 2)  # the replay, taken in the settle window
        assert pairs(two) == [("worker-added", a2), ("worker-added", b)]
        gate.set()  # b is re-reported (suppressed), then c is new
        one += await take(first, 1)
        two += await take(late, 1)
        assert pairs(one[3:]) == pairs(two[2:]) == [("worker-added", c)]
        assert apply({}, one) == apply({}, two) == state(a2, b, c)


async def test_late_joiner_after_settle_drop_gets_no_dropped_worker() -> None:
    """A consumer joining after the settle drop sees neither the worker nor its drop."""
    a, b, c = meta(), meta(), meta()
    gate = anyio.Event()
    script = Script([added(a), added(b), FAIL], [added(same(a)), gate, added(c)])
    sub = subscribe(fast(), script)
    async with SubscriptionPool():
        first = aiter(sub)
        one = await take(first, 3)
        assert pairs(one[2:]) == [("worker-dropped", b)]
        late = aiter(sub)
        two = await take(late, 1)
        gate.set()
        one += await take(first, 1)
        two += await take(late, 1)
        assert pairs(two) == [("worker-added", a), ("worker-added", c)]
        assert apply({}, one) == apply({}, two) == state(a, c)


# -- the policy -----------------------------------------------------------------


def test_delay_grows_exponentially_and_is_capped() -> None:
    """Without jitter, delay(n) = backoff * multiplier**(n-1), capped at max_backoff."""
    policy = RestartPolicy(backoff=0.1, multiplier=2.0, max_backoff=1.0, jitter=0)
    delays = [policy.delay(n) for n in range(1, 8)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    flat = RestartPolicy(backoff=0.5, multiplier=1.0, jitter=0)
    assert [flat.delay(n) for n in (1, 2, 10)] == [0.5, 0.5, 0.5]


def test_delay_is_capped_for_any_attempt_number() -> None:
    """Unlimited attempts never make delay() overflow: it stays at max_backoff."""
    policy = RestartPolicy(attempts=None, backoff=0.1, max_backoff=10.0, jitter=0)
    for attempt in (100, 1024, 1100, 100_000):
        assert policy.delay(attempt) == 10.0
    no_backoff = RestartPolicy(attempts=None, backoff=0, jitter=0)
    for attempt in (1, 1100, 100_000):
        assert no_backoff.delay(attempt) == 0.0


def test_delay_stays_within_jitter_bounds() -> None:
    """delay(n) is within [1 - jitter, 1 + jitter] of its base, never above the cap."""
    policy = RestartPolicy(backoff=1.0, multiplier=2.0, max_backoff=6.0, jitter=0.5)
    for attempt, base in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 6.0), (9, 6.0)):
        samples = [policy.delay(attempt) for _ in range(200)]
        assert all(0.5 * base <= s <= min(1.5 * base, 6.0) for s in samples)
        assert len(set(samples)) > 1  # actually randomised


def test_delays_that_reach_the_cap_still_spread_below_it() -> None:
    """At ``max_backoff`` the jitter spreads the delays over
    ``[max_backoff * (1 - jitter), max_backoff]`` instead of putting every
    delay above the cap on the cap itself (a herd retrying in step)."""
    policy = RestartPolicy(backoff=1.0, multiplier=2.0, max_backoff=5.0, jitter=0.2)
    samples = [policy.delay(10) for _ in range(1000)]
    assert all(4.0 <= s <= 5.0 for s in samples)
    assert sum(s == 5.0 for s in samples) < 10
    assert sum(s < 4.5 for s in samples) > 300


def test_policy_defaults() -> None:
    """The documented defaults."""
    policy = RestartPolicy()
    assert (
        policy.attempts,
        policy.backoff,
        policy.multiplier,
        policy.max_backoff,
        policy.jitter,
        policy.settle,
        policy.restart_on_end,
    ) == (5, 0.1, 2.0, 10.0, 0.1, 1.0, False)


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        ({"backoff": -0.1}, "backoff"),
        ({"backoff": math.nan}, "backoff"),
        ({"max_backoff": -1}, "max_backoff"),
        ({"max_backoff": math.inf}, "max_backoff"),
        ({"settle": -1}, "settle"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"attempts": 0}, "attempts"),
        ({"attempts": -3}, "attempts"),
    ],
)
def test_bad_policy_raises_value_error_naming_parameter(
    overrides: dict[str, Any], name: str
) -> None:
    """Bad values raise ValueError at construction, naming the parameter."""
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        RestartPolicy(**overrides)


def test_restart_must_be_a_policy() -> None:
    """``restart=`` accepts only a RestartPolicy (or None)."""
    with pytest.raises(TypeError, match="restart"):
        shared_subscription(restart="yes")  # type: ignore[arg-type]


def test_negative_ttl_raises_value_error_naming_ttl() -> None:
    """A negative ttl on the decorator is a ValueError mentioning ttl."""
    with pytest.raises(ValueError, match="ttl"):
        shared_subscription(ttl=-1)
