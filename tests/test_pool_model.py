"""Model-based test of one SubscriptionPool, on asyncio and on trio.

A hypothesis ``RuleBasedStateMachine`` drives the real pool (in an event loop
running in a blocking portal's thread) and a plain reference model side by
side: constructing consumers of several keys and classes, reading, cancelling
a read mid-await, ``aclose()``, abandoning a consumer to garbage collection,
pushing worker events into the raw sources, failing or ending a source
(restarted or not), and letting a ttl expire. After every step, once the loop
is idle, every consumer's received events, pending read and outcome, the
pool's statistics and the raw instances (built, iterated, closed) must match
the model exactly.

The ttl class uses a long ttl; "advance past ttl" cancels the entry's expiry
timer, which finalises the entry exactly as the timer's end would, so no step
depends on wall-clock timing. For the same reason the restarting class has a
long ``settle`` window (its drops are tested in ``test_restart.py``): once
restarted, an entry translates every later event into a diff. The
classes use ``read_ahead=0`` (the model's pulls are its consumers'
demands) or, in the read-ahead machines, 2 (so that programs reach the
bound): up to two pulls follow a demand while a consumer is registered.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import uuid
from collections.abc import AsyncGenerator
from collections.abc import Callable
from typing import Any
from typing import ClassVar
from typing import cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import attrs
import pytest
from _stubs import pairs
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import initialize
from hypothesis.stateful import invariant
from hypothesis.stateful import precondition
from hypothesis.stateful import rule
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import RestartPolicy
from wool_pooling import SharedSubscription
from wool_pooling import SubscriptionConsumer
from wool_pooling import SubscriptionPool
from wool_pooling import current_pool
from wool_pooling import shared_subscription

# The state machine's tests are sync: anyio's plugin ignores them.
pytestmark = pytest.mark.anyio

Pair = tuple[str, WorkerMetadata]
#: How a read ended: ("stop",), ("error", message), ("cancelled",).
Outcome = tuple[str, ...]


class Failure:
    """Pushed into a raw stream: the current run raises ``RuntimeError(message)``."""

    def __init__(self, message: str) -> None:
        self.message = message


class End:
    """Pushed into a raw stream: the current run ends normally."""


class Raw:
    """Undecorated raw subscriber fed through a memory object stream.

    Each ``aiter()`` starts a run reading the same stream, so a restarted
    source continues with what is pushed after the failure.
    """

    instances: ClassVar[list[Raw]] = []

    def __init__(self, name: str) -> None:
        self.name = name
        self.send, self.receive = anyio.create_memory_object_stream[
            DiscoveryEvent | Failure | End
        ](math.inf)
        self.aiter_calls = 0
        self.close_calls = 0
        type(self).instances.append(self)

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        self.aiter_calls += 1
        return self._run()

    async def _run(self) -> AsyncGenerator[DiscoveryEvent, None]:
        async for item in self.receive:
            if isinstance(item, Failure):
                raise RuntimeError(item.message)
            if isinstance(item, End):
                return
            yield item

    async def aclose(self) -> None:
        self.close_calls += 1
        await anyio.lowlevel.checkpoint()
        self.send.close()
        self.receive.close()


@attrs.define(frozen=True)
class Kind:
    """One decorated class of the machine: its ttl and restart policy."""

    name: str
    ttl: float
    restart: RestartPolicy | None


PLAIN = Kind("Plain", 0.0, None)
RESTARTING = Kind(
    "Restarting",
    0.0,
    RestartPolicy(attempts=None, backoff=0, jitter=0, settle=3600, restart_on_end=True),
)
LINGERING = Kind("Lingering", 3600.0, None)

#: (kind, key) of the subscriptions the machine uses.
SLOTS = [(PLAIN, "a"), (PLAIN, "b"), (RESTARTING, "a"), (LINGERING, "a")]


@attrs.define(eq=False)
class ModelEntry:
    """The model of one pool entry."""

    slot: int
    #: Index of its raw instance in the class's ``instances``.
    raw_index: int
    ttl: float
    restarting: bool
    known: dict[uuid.UUID, WorkerMetadata] = attrs.field(
        factory=dict[uuid.UUID, WorkerMetadata]
    )
    #: Every event the fan-out logged, in order.
    log: list[Pair] = attrs.field(factory=list[Pair])
    #: Pushed into the raw stream and not yet pulled.
    queue: list[Any] = attrs.field(factory=list[Any])
    #: What the raw stream's current run (after the queue) has reported.
    run_view: dict[uuid.UUID, WorkerMetadata] = attrs.field(
        factory=dict[uuid.UUID, WorkerMetadata]
    )
    #: A plain source had its failure or end pushed: nothing more is pulled.
    dead: bool = False
    inflight: bool = False
    #: Pulls read ahead since a consumer last waited at the log's end.
    ahead: int = 0
    started: bool = False
    restarts: int = 0
    translating: bool = False
    ended: Outcome | None = None
    refs: int = 0
    finalized: bool = False


@attrs.define(eq=False)
class Record:
    """One consumer: the real one and its model, side by side."""

    slot: int
    # -- real --
    it: SubscriptionConsumer | None
    events: list[DiscoveryEvent] = attrs.field(factory=list[DiscoveryEvent])
    real_pending: bool = False
    real_outcome: Outcome | None = None
    scope: anyio.CancelScope | None = None
    # -- model --
    entry: ModelEntry | None = None
    replay: list[Pair] = attrs.field(factory=list[Pair])
    position: int = 0
    received: list[Pair] = attrs.field(factory=list[Pair])
    pending: bool = False
    outcome: Outcome | None = None
    abandoned: bool = False
    #: Reads continuously (``async for``) instead of one read per step.
    reading: bool = False

    @property
    def live(self) -> bool:
        return self.outcome is None and not self.abandoned

    def expected(self) -> list[Pair]:
        assert self.entry is not None
        return self.replay + self.entry.log[self.position :]


def metadata(uid: uuid.UUID, pid: int) -> WorkerMetadata:
    return WorkerMetadata(uid=uid, address="127.0.0.1:1", pid=pid, version="1")


async def _settle_asyncio() -> None:
    """Return once every other task is blocked and no callback is ready.

    anyio's ``wait_all_tasks_blocked`` sleeps 0.1 s whenever a task is
    runnable; this loops on zero-length sleeps instead.
    """
    loop = asyncio.get_running_loop()
    this = asyncio.current_task()
    for _ in range(100_000):
        await asyncio.sleep(0)
        if loop._ready:  # type: ignore[attr-defined]
            continue
        if all(
            task is this
            or (task._fut_waiter is not None and not task._fut_waiter.done())  # type: ignore[attr-defined]
            for task in asyncio.all_tasks()
        ):
            return
    raise AssertionError("the event loop never became idle")


async def _settle_trio() -> None:
    import trio.testing

    await trio.testing.wait_all_tasks_blocked()


class PoolMachine(RuleBasedStateMachine):
    """Drive the default pool of a fresh event loop against the model."""

    backend: ClassVar[str] = "asyncio"
    #: 0: pulls are the consumers' demands; else up to this many pulls follow
    #: an item while a consumer is registered and none waits at the log's end.
    read_ahead: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        self._portal_cm = anyio.from_thread.start_blocking_portal(self.backend)
        self.portal = self._portal_cm.__enter__()
        self._settle: Callable[[], Any] = (
            _settle_asyncio if self.backend == "asyncio" else _settle_trio
        )
        self.classes: dict[str, type[Raw]] = {}
        for kind in (PLAIN, RESTARTING, LINGERING):
            cls = type(kind.name, (Raw,), {"instances": []})
            self.classes[kind.name] = shared_subscription(
                ttl=kind.ttl, restart=kind.restart, read_ahead=self.read_ahead
            )(cls)
        self.pool: SubscriptionPool = self.portal.call(self._current_pool)
        self.uids = [uuid.uuid4() for _ in range(3)]
        self.records: list[Record] = []
        self.current: list[ModelEntry | None] = [None] * len(SLOTS)
        self.retired: list[ModelEntry] = []
        self.built: dict[str, list[ModelEntry]] = {name: [] for name in self.classes}
        self.failures = itertools.count()

    @staticmethod
    async def _current_pool() -> SubscriptionPool:
        return current_pool()

    def settle(self) -> None:
        self.portal.call(self._settle)

    # -- model -------------------------------------------------------------

    def live_entries(self) -> list[ModelEntry]:
        return [entry for entry in self.current if entry is not None] + self.retired

    def model_finalize(self, entry: ModelEntry) -> None:
        entry.finalized = True
        if self.current[entry.slot] is entry:
            self.current[entry.slot] = None
        if entry in self.retired:
            self.retired.remove(entry)

    def model_release(self, entry: ModelEntry) -> None:
        entry.refs -= 1
        assert entry.refs >= 0
        if entry.refs == 0 and (entry.ttl == 0 or entry.ended is not None):
            self.model_finalize(entry)

    def model_end(self, record: Record, outcome: Outcome) -> None:
        record.outcome = outcome
        record.pending = False
        if record.entry is not None:
            self.model_release(record.entry)

    def model_join(self, record: Record) -> None:
        entry = self.current[record.slot]
        if entry is not None and entry.ended is not None:
            self.current[record.slot] = None  # retired: never reused
            if entry.refs == 0:
                self.model_finalize(entry)
            else:
                self.retired.append(entry)
            entry = None
        if entry is None:
            kind, _ = SLOTS[record.slot]
            built = self.built[kind.name]
            entry = ModelEntry(
                record.slot, len(built), kind.ttl, kind.restart is not None
            )
            built.append(entry)
            self.current[record.slot] = entry
        entry.refs += 1
        record.entry = entry
        record.replay = [("worker-added", meta) for meta in entry.known.values()]
        record.position = len(entry.log)

    def model_read(self, record: Record) -> None:
        if record.entry is None:
            self.model_join(record)
        entry = record.entry
        assert entry is not None
        while True:
            expected = record.expected()
            if len(record.received) < len(expected):
                record.received.append(expected[len(record.received)])
                if record.reading:
                    continue  # a reading consumer asks for the next one at once
            elif entry.ended is not None:
                self.model_end(record, entry.ended)
            else:
                record.pending = True
                entry.inflight = True
                entry.ahead = 0  # it waits at the log's end
                entry.started = True
                self.model_pull(entry)
            return

    def model_pull(self, entry: ModelEntry) -> None:
        """Run the pull in flight while the raw stream has items for it."""
        while entry.inflight and entry.queue:
            item = entry.queue.pop(0)
            if isinstance(item, Failure | End):
                if entry.restarting:
                    entry.restarts += 1
                    entry.translating = True
                    continue
                entry.inflight = False
                entry.ended = (
                    ("error", item.message) if isinstance(item, Failure) else ("stop",)
                )
                for record in self.waiting(entry):
                    self.model_end(record, entry.ended)
                return
            event = self.translate(entry, item)
            if event is None:
                continue
            type_, meta = event
            if type_ == "worker-dropped":
                entry.known.pop(meta.uid, None)
            else:
                entry.known[meta.uid] = meta
            entry.log.append(event)
            entry.inflight = False
            for record in self.waiting(entry):
                record.received.append(record.expected()[len(record.received)])
                if record.reading:
                    entry.inflight = True  # it waits at the log's end again
                else:
                    record.pending = False
            if entry.inflight:
                entry.ahead = 0
            elif self.read_ahead > entry.ahead and entry.refs > 0:
                entry.ahead += 1  # read ahead: a consumer is registered
                entry.inflight = True

    def waiting(self, entry: ModelEntry) -> list[Record]:
        return [r for r in self.records if r.entry is entry and r.live and r.pending]

    @staticmethod
    def translate(entry: ModelEntry, event: DiscoveryEvent) -> Pair | None:
        meta = event.metadata
        if not entry.translating:
            return (event.type, meta)
        known = entry.known.get(meta.uid)
        if event.type == "worker-dropped":
            return (event.type, meta) if known is not None else None
        if known is None:
            return ("worker-added", meta)
        if known == meta:
            return None
        return ("worker-updated", meta)

    # -- the real system -----------------------------------------------------

    async def _read(self, record: Record) -> None:
        assert record.it is not None
        with anyio.CancelScope() as scope:
            record.scope = scope
            record.real_pending = True
            try:
                record.events.append(await anext(record.it))
                while record.reading:
                    record.events.append(await anext(record.it))
            except StopAsyncIteration:
                record.real_outcome = ("stop",)
            except Exception as error:
                record.real_outcome = ("error", str(error))
        record.scope = None
        record.real_pending = False
        if scope.cancelled_caught:
            record.real_outcome = ("cancelled",)

    def read(self, record: Record) -> None:
        self.portal.start_task_soon(self._read, record)
        self.model_read(record)
        self.settle()

    def pickable(self, pick: int, predicate: Callable[[Record], bool]) -> Record | None:
        candidates = [r for r in self.records if r.live and predicate(r)]
        if not candidates:
            return None
        return candidates[pick % len(candidates)]

    # -- rules -------------------------------------------------------------

    def construct(self, slot: int, keyword: bool) -> Record:
        kind, key = SLOTS[slot]
        cls = self.classes[kind.name]
        sub = cast(SharedSubscription, cls(name=key) if keyword else cls(key))
        record = Record(slot, aiter(sub))
        self.records.append(record)
        return record

    @initialize(
        joins=st.lists(
            st.tuples(st.integers(0, len(SLOTS) - 1), st.booleans()),
            min_size=1,
            max_size=4,
        )
    )
    def start(self, joins: list[tuple[int, bool]]) -> None:
        """Begin with a few consumers that joined, reading continuously or not."""
        for slot, reading in joins:
            record = self.construct(slot, False)
            record.reading = reading
            self.read(record)

    @rule(
        slot=st.integers(0, len(SLOTS) - 1),
        keyword=st.booleans(),
        how=st.sampled_from(["lazy", "read", "reading", "reading"]),
    )
    def join(self, slot: int, keyword: bool, how: str) -> None:
        """Construct a consumer and (mostly) start reading, which joins.

        Some stay unjoined until a later read, some read once (the rules read
        them further), some read continuously, like ``async for``.
        """
        record = self.construct(slot, keyword)
        if how != "lazy":
            record.reading = how == "reading"
            self.read(record)

    def pushable(self) -> list[ModelEntry]:
        return [
            entry
            for entry in self.current
            if entry is not None and not entry.dead and entry.ended is None
        ]

    def idle_lingering(self) -> list[ModelEntry]:
        return [e for e in self.live_entries() if e.ttl > 0 and e.refs == 0]

    def behind(self, record: Record) -> bool:
        """Whether the model has something for this consumer's next read."""
        entry = record.entry
        if not record.live or record.pending or entry is None:
            return False
        return entry.ended is not None or len(record.expected()) > len(record.received)

    @precondition(lambda self: any(r.live and not r.pending for r in self.records))
    @rule(pick=st.integers(0, 1000), everyone=st.booleans())
    def consume(self, pick: int, everyone: bool) -> None:
        """One consumer reads once, or every joined one reads all it has."""
        if not everyone:
            record = self.pickable(pick, lambda r: not r.pending)
            if record is not None:
                self.read(record)
            return
        for record in list(self.records):
            while self.behind(record):
                self.read(record)

    @precondition(lambda self: any(r.live for r in self.records))
    @rule(pick=st.integers(0, 1000), how=st.sampled_from(["cancel", "aclose", "gc"]))
    def leave(self, pick: int, how: str) -> None:
        """A consumer goes: its pending read is cancelled, it is closed, or dropped."""
        record = None
        if how == "cancel":
            record = self.pickable(pick, lambda r: r.pending)
        elif how == "gc":
            record = self.pickable(pick, lambda r: not r.pending)
        if record is None:
            how = "aclose"
            record = self.pickable(pick, lambda r: True)
        assert record is not None
        if how == "cancel":
            scope = record.scope
            assert scope is not None, "the model expects a pending read"
            self.portal.call(scope.cancel)
            self.model_end(record, ("cancelled",))
        elif how == "gc":

            def drop() -> None:
                # In the loop's thread, like a collection during the program.
                record.it = None
                gc.collect(0)

            self.portal.call(drop)
            record.abandoned = True
            if record.entry is not None:
                self.model_release(record.entry)
        else:
            assert record.it is not None
            self.portal.call(record.it.aclose)
            if record.pending:  # its read in flight ends
                self.model_end(record, ("stop",))
            else:
                record.abandoned = True
                if record.entry is not None:
                    self.model_release(record.entry)
        self.settle()

    @precondition(lambda self: bool(self.pushable()))
    @rule(
        which=st.integers(0, 1000),
        events=st.lists(
            st.tuples(
                st.sampled_from(["add", "add", "update", "drop"]),
                st.integers(0, 1000),
                st.integers(1, 2),
            ),
            min_size=1,
            max_size=3,
        ),
    )
    def push_events(self, which: int, events: list[tuple[str, int, int]]) -> None:
        """The raw stream reports events consistent with its current run."""
        entries = self.pushable()
        entry = entries[which % len(entries)]
        view = entry.run_view
        for kind, pick, pid in events:
            if kind == "add":
                uids = [uid for uid in self.uids if uid not in view]
            else:
                uids = list(view)
            if not uids:
                continue
            uid = uids[pick % len(uids)]
            if kind == "drop":
                event = DiscoveryEvent("worker-dropped", metadata=view.pop(uid))
            else:
                meta = view[uid] = metadata(uid, pid)
                type_ = "worker-added" if kind == "add" else "worker-updated"
                event = DiscoveryEvent(type_, metadata=meta)
            self.push(entry, event)

    @precondition(lambda self: bool(self.pushable()))
    @rule(
        which=st.integers(0, 1000),
        fail=st.booleans(),
        rereport=st.lists(st.integers(0, 2), min_size=3, max_size=3),
    )
    def break_source(self, which: int, fail: bool, rereport: list[int]) -> None:
        """The raw stream fails or ends; a restarting one starts over.

        Its new run then re-reports some of the workers the old run knew
        (``rereport``, per worker: 0 not, else with that pid).
        """
        entries = self.pushable()
        entry = entries[which % len(entries)]
        before = entry.run_view
        entry.run_view = {}  # a restarted run reports from scratch
        entry.dead = not entry.restarting
        self.push(entry, Failure(f"failure {next(self.failures)}") if fail else End())
        if not entry.restarting:
            return
        for (uid, old), pid in zip(before.items(), rereport, strict=False):
            if pid:
                # Half the time the very same metadata object.
                meta = old if old.pid == pid and which % 2 else metadata(uid, pid)
                entry.run_view[uid] = meta
                self.push(entry, DiscoveryEvent("worker-added", metadata=meta))

    def push(self, entry: ModelEntry, item: DiscoveryEvent | Failure | End) -> None:
        kind, name = SLOTS[entry.slot]
        raw = self.classes[kind.name].instances[entry.raw_index]
        assert raw.name == name
        self.portal.call(raw.send.send_nowait, item)
        entry.queue.append(item)
        if entry.inflight:
            self.model_pull(entry)
        self.settle()

    @precondition(lambda self: bool(self.idle_lingering()))
    @rule()
    def advance_past_ttl(self) -> None:
        """Let every idle ttl entry expire (its expiry timer ends now)."""
        for entry in self.idle_lingering():
            kind, _ = SLOTS[entry.slot]
            raw = self.classes[kind.name].instances[entry.raw_index]
            entries = self.pool._entries.values()  # pyright: ignore[reportPrivateUsage]
            (real,) = [candidate for candidate in entries if candidate.raw is raw]
            assert real.expiry is not None, "an idle ttl entry awaits its expiry"
            self.portal.call(real.expiry.cancel)
            self.model_finalize(entry)
        self.settle()

    # -- invariants ----------------------------------------------------------

    @invariant()
    def consumers_match_model(self) -> None:
        for index, record in enumerate(self.records):
            name = f"consumer {index} of {SLOTS[record.slot]}"
            assert pairs(record.events) == record.received, f"{name}: events"
            assert record.real_pending == record.pending, f"{name}: pending read"
            assert record.real_outcome == record.outcome, f"{name}: outcome"
            if record.pending:
                # A pending read has nothing left to receive.
                assert len(record.expected()) == len(record.received)

    @invariant()
    def views_are_consistent(self) -> None:
        """No duplicate add, no update or drop of an unknown worker, for anyone."""
        for index, record in enumerate(self.records):
            view: dict[uuid.UUID, WorkerMetadata] = {}
            for type_, meta in pairs(record.events):
                if type_ == "worker-added":
                    assert meta.uid not in view, f"consumer {index}: duplicate add"
                else:
                    assert meta.uid in view, f"consumer {index}: {type_} of unknown"
                if type_ == "worker-dropped":
                    del view[meta.uid]
                else:
                    view[meta.uid] = meta
            entry = record.entry
            caught_up = entry is not None and len(record.received) == len(
                record.expected()
            )
            if record.live and entry is not None and caught_up:
                assert view == entry.known, f"consumer {index}: view"

    @invariant()
    def statistics_match_model(self) -> None:
        stats = self.pool.statistics()
        entries = self.live_entries()
        assert stats.entries == len(entries)
        assert stats.consumers == sum(entry.refs for entry in entries)
        assert stats.idle == sum(1 for entry in entries if entry.refs == 0)
        if not any(record.live and record.entry for record in self.records):
            lingering = [entry for entry in entries if entry.ttl > 0]
            assert stats.entries == len(lingering)
            assert stats.consumers == 0

    @invariant()
    def raw_instances_match_model(self) -> None:
        for name, cls in self.classes.items():
            built = self.built[name]
            assert len(cls.instances) == len(built)
            for entry, raw in zip(built, cls.instances, strict=True):
                assert raw.close_calls == (1 if entry.finalized else 0)
                if not entry.finalized:
                    iterations = 1 + entry.restarts if entry.started else 0
                    assert raw.aiter_calls == iterations

    def teardown(self) -> None:
        try:
            self.portal.call(self.pool.aclose)
            self.settle()
            stats = self.pool.statistics()
            assert (stats.entries, stats.consumers, stats.idle) == (0, 0, 0)
            for cls in self.classes.values():
                assert all(raw.close_calls == 1 for raw in cls.instances)
            assert not any(record.real_pending for record in self.records)
        finally:
            for record in self.records:
                if record.scope is not None:
                    self.portal.call(record.scope.cancel)
            self._portal_cm.__exit__(None, None, None)


class AsyncioPoolMachine(PoolMachine):
    backend = "asyncio"


class TrioPoolMachine(PoolMachine):
    backend = "trio"


class AsyncioReadAheadPoolMachine(PoolMachine):
    backend = "asyncio"
    read_ahead = 2


class TrioReadAheadPoolMachine(PoolMachine):
    backend = "trio"
    read_ahead = 2


_settings = settings(
    max_examples=50,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestPoolModelAsyncio = AsyncioPoolMachine.TestCase
TestPoolModelAsyncio.settings = _settings
TestPoolModelTrio = TrioPoolMachine.TestCase
TestPoolModelTrio.settings = _settings
TestPoolModelReadAheadAsyncio = AsyncioReadAheadPoolMachine.TestCase
TestPoolModelReadAheadAsyncio.settings = _settings
TestPoolModelReadAheadTrio = TrioReadAheadPoolMachine.TestCase
TestPoolModelReadAheadTrio.settings = _settings
