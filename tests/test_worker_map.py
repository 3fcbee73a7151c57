"""The one rule for applying discovery events to the known workers.

``WorkerMap`` is checked against a plain dict model over arbitrary event
sequences (adds of known workers, drops of unknown ones, updates of unknown
ones, equal metadata as the same object or as a copy); then each place that
applies events through it is pinned where its behaviour became the map's.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from collections.abc import Iterable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _stubs import pairs
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from wool import DiscoveryEvent
from wool import DiscoveryEventType
from wool import WorkerMetadata

from wool_pooling import RestartPolicy
from wool_pooling import SharedDiscovery
from wool_pooling import SubscriptionPool
from wool_pooling import afilter
from wool_pooling._pooling.restart import RestartingSource
from wool_pooling._wool.view import WorkerView
from wool_pooling._wool.workers import WorkerMap
from wool_pooling.redis._state import SubscriptionState

View = dict[uuid.UUID, WorkerMetadata]
Pair = tuple[str, WorkerMetadata]

UIDS = [uuid.UUID(int=i + 1) for i in range(3)]
TYPES: list[DiscoveryEventType] = ["worker-added", "worker-updated", "worker-dropped"]


def worker(index: int, pid: int = 1) -> WorkerMetadata:
    return WorkerMetadata(uid=UIDS[index], address="127.0.0.1:1", pid=pid, version="1")


#: One object per (worker, pid): an event may carry one of these (the same
#: object as before) or a fresh equal copy.
POOL = {(index, pid): worker(index, pid) for index in range(3) for pid in (1, 2, 3)}


@st.composite
def event_streams(draw: st.DrawFn) -> list[DiscoveryEvent]:
    """Any stream over three workers and three metadata values each."""
    specs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(TYPES),
                st.integers(0, 2),
                st.integers(1, 3),
                st.booleans(),
            ),
            max_size=30,
        )
    )
    return [
        DiscoveryEvent(
            type_, metadata=worker(index, pid) if fresh else POOL[index, pid]
        )
        for type_, index, pid, fresh in specs
    ]


def model_apply(model: View, event: DiscoveryEvent) -> Pair | None:
    """The model: a plain dict, and what a consumer must be told."""
    metadata = event.metadata
    uid = metadata.uid
    if event.type == "worker-dropped":
        if uid not in model:
            return None
        return ("worker-dropped", model.pop(uid))
    if uid not in model:
        model[uid] = metadata
        return ("worker-added", metadata)
    if model[uid] == metadata:
        return None
    model[uid] = metadata
    return ("worker-updated", metadata)


def consume(view: View, events: Iterable[DiscoveryEvent]) -> View:
    """A consumer's view, refusing any event that breaks the lifecycle."""
    for event in events:
        uid = event.metadata.uid
        if event.type == "worker-added":
            assert uid not in view, "a second worker-added"
        elif event.type == "worker-updated":
            assert uid in view, "an update of an unknown worker"
            assert view[uid] != event.metadata, "an unchanged update"
        else:
            assert uid in view, "a drop of an unknown worker"
            assert view[uid] is event.metadata, "a drop with other metadata"
            del view[uid]
            continue
        view[uid] = event.metadata
    return view


def built(stream: Iterable[DiscoveryEvent]) -> WorkerMap:
    workers = WorkerMap()
    for event in stream:
        workers.apply(event)
    return workers


@settings(max_examples=300, deadline=None)
@given(stream=event_streams())
def test_apply_passes_on_what_the_dict_model_says(stream: list[DiscoveryEvent]) -> None:
    """Each apply returns the model's event (or ``None``) and leaves the map
    equal to the model, in first-seen order; what it returns is a consistent
    lifecycle, and the event itself whenever it needs no rewriting."""
    workers, model, view = WorkerMap(), View(), View()
    for event in stream:
        passed = workers.apply(event)
        expected = model_apply(model, event)
        if expected is None:
            assert passed is None
        else:
            assert passed is not None
            assert passed.type == expected[0]
            assert passed.metadata is expected[1]
            if passed.type == event.type and passed.metadata is event.metadata:
                assert passed is event
            consume(view, [passed])
        assert list(workers.workers.items()) == list(model.items())
        assert view == model
        assert len(workers) == len(model)


@settings(max_examples=300, deadline=None)
@given(before=event_streams(), after=event_streams())
def test_diff_leads_from_one_view_to_the_other(
    before: list[DiscoveryEvent], after: list[DiscoveryEvent]
) -> None:
    """The diff turns this view into the other through a consistent
    lifecycle, changes neither, and applies unchanged; a view has no diff
    to itself."""
    seen, target = built(before), built(after)
    seen_items = list(seen.workers.items())
    target_items = list(target.workers.items())
    events = seen.diff(target)
    assert list(seen.workers.items()) == seen_items
    assert list(target.workers.items()) == target_items
    assert consume(dict(seen.workers), events) == target.workers
    copy = WorkerMap(dict(seen.workers))
    assert [copy.apply(event) for event in events] == list(events)
    assert copy.workers == target.workers
    assert pairs(seen.diff(target.workers)) == pairs(events)  # a plain mapping too
    assert not seen.diff(seen)
    assert not seen.diff(WorkerMap(dict(seen.workers)))


@settings(max_examples=200, deadline=None)
@given(stream=event_streams())
def test_replay_adds_every_known_worker_in_first_seen_order(
    stream: list[DiscoveryEvent],
) -> None:
    """One worker-added per known worker, latest metadata, first-seen order:
    applied to an empty map, it rebuilds the map."""
    workers, model = built(stream), View()
    for event in stream:
        model_apply(model, event)
    replay = workers.replay()
    assert pairs(replay) == [("worker-added", m) for m in model.values()]
    assert all(a is b for (_, a), b in zip(pairs(replay), model.values(), strict=True))
    again = built(replay)
    assert list(again.workers.items()) == list(workers.workers.items())


@settings(max_examples=200, deadline=None)
@given(stream=event_streams(), history=st.integers(1, 8))
def test_known_workers_record_and_apply_leave_the_map_state(
    stream: list[DiscoveryEvent], history: int
) -> None:
    """``record`` (the log as it came) leaves the state ``apply`` leaves;
    a relisting view takes in only what it passes on, and ``at`` rebuilds
    the state after each of those."""
    recorded, applied, workers = WorkerView(), WorkerView(), WorkerMap()
    applied.remember(history)
    applied.relisting()
    states: list[View] = [{}]
    for event in stream:
        recorded.record(event)
        workers.apply(event)
        if applied.relist(event) is not None:
            states.append(dict(applied.workers))
    assert list(recorded.workers.items()) == list(workers.workers.items())
    assert list(applied.workers.items()) == list(workers.workers.items())
    assert recorded.count == len(stream)
    assert applied.count == len(states) - 1
    for n in range(max(0, applied.count - history), applied.count + 1):
        assert applied.seen_at(n) == states[n], n


def test_drop_forgets_a_known_worker_with_its_known_metadata() -> None:
    """``drop(uid)``: the worker's drop with the metadata known, once."""
    workers = WorkerMap()
    first = worker(0)
    workers.apply(DiscoveryEvent("worker-added", metadata=first))
    event = workers.drop(first.uid)
    assert event is not None
    assert (event.type, event.metadata) == ("worker-dropped", first)
    assert event.metadata is first
    assert workers.drop(first.uid) is None
    assert not workers.workers


def test_a_settled_relisting_drops_what_it_did_not_report() -> None:
    """``settled()`` takes in and gives a drop per worker the relisting did
    not report, with its known metadata; each counts as a logged item (and
    can be undone)."""
    known = WorkerView()
    known.remember(4)
    first = worker(0)
    known.record(DiscoveryEvent("worker-added", metadata=first))
    known.relisting()
    assert known.relist(DiscoveryEvent("worker-dropped", metadata=worker(1))) is None
    drops = list(known.settled())
    assert pairs(drops) == [("worker-dropped", first)]
    assert drops[0].metadata is first
    assert known.count == 2
    assert known.seen_at(1) == {first.uid: first}
    assert known.seen_at(2) == {}


# -- the places that apply events through the map ---------------------------------


async def script(events: list[DiscoveryEvent]) -> AsyncGenerator[DiscoveryEvent, None]:
    """A subscription replaying ``events``, then ending."""
    for event in events:
        await anyio.lowlevel.checkpoint()
        yield event


def moved(metadata: WorkerMetadata) -> WorkerMetadata:
    """The same worker, other metadata."""
    return WorkerMetadata(
        uid=metadata.uid, address="127.0.0.1:9", pid=9, version=metadata.version
    )


@pytest.mark.anyio
async def test_afilter_passes_no_unchanged_update_and_drops_with_tracked_metadata() -> (
    None
):
    """An update or add with unchanged metadata of a passing worker is not
    passed on, and a drop carries the metadata the consumer holds."""
    first = worker(0)
    events = script(
        [
            DiscoveryEvent("worker-added", metadata=first),
            DiscoveryEvent("worker-updated", metadata=worker(0)),
            DiscoveryEvent("worker-added", metadata=first),
            DiscoveryEvent("worker-dropped", metadata=moved(first)),
        ]
    )
    got = [event async for event in afilter(lambda _: True, events)]
    assert pairs(got) == [("worker-added", first), ("worker-dropped", first)]
    assert got[1].metadata is first


class ScriptDiscovery:
    """A discovery whose every subscription replays ``events``."""

    publisher: Any = None

    def __init__(self, events: list[DiscoveryEvent]) -> None:
        self.events = events

    @property
    def subscriber(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self.subscribe()

    def subscribe(
        self, filter: Any = None, **options: Any
    ) -> AsyncGenerator[DiscoveryEvent, None]:
        return script(self.events)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ScriptDiscovery, (self.events,))


@pytest.mark.anyio
async def test_shared_discovery_drop_carries_the_metadata_passed_on() -> None:
    """A drop whose metadata differs from the worker's known metadata is
    passed on with the known one, as every other place does."""
    first = worker(0)
    discovery = SharedDiscovery(
        ScriptDiscovery(
            [
                DiscoveryEvent("worker-added", metadata=first),
                DiscoveryEvent("worker-dropped", metadata=moved(first)),
            ]
        )
    )
    with anyio.fail_after(10):
        async with SubscriptionPool():
            got = [event async for event in discovery.subscribe()]
    assert pairs(got) == [("worker-added", first), ("worker-dropped", first)]


class FailingOnce:
    """First run: ``first`` then a failure; every later run: ``then``."""

    def __init__(self, first: list[DiscoveryEvent], then: list[DiscoveryEvent]):
        self.first, self.then, self.runs = first, then, 0

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        self.runs += 1
        return self._iterate(self.runs)

    async def _iterate(self, run: int) -> AsyncGenerator[DiscoveryEvent, None]:
        for event in self.first if run == 1 else self.then:
            await anyio.lowlevel.checkpoint()
            yield event
        if run == 1:
            raise RuntimeError("run 1 failed")
        await anyio.sleep_forever()


@pytest.mark.anyio
async def test_restart_diff_drops_with_known_metadata_and_skips_unchanged() -> None:
    """After a restart, an unchanged re-report is not passed on, an add of
    a known worker with new metadata is an update, and a drop carries the
    known metadata; each is recorded as the log's next item."""
    first, second = worker(0), worker(1)
    raw = FailingOnce(
        [
            DiscoveryEvent("worker-added", metadata=first),
            DiscoveryEvent("worker-added", metadata=second),
        ],
        [
            DiscoveryEvent("worker-added", metadata=worker(0)),
            DiscoveryEvent("worker-added", metadata=worker(1, pid=2)),
            DiscoveryEvent("worker-dropped", metadata=moved(first)),
        ],
    )
    view = WorkerView()
    view.remember(8)
    source = RestartingSource(raw, RestartPolicy(backoff=0, settle=60), view)
    try:
        with anyio.fail_after(10):
            got = [await anext(source) for _ in range(4)]
    finally:
        await source.aclose()
    assert pairs(got) == [
        ("worker-added", first),
        ("worker-added", second),
        ("worker-updated", worker(1, pid=2)),
        ("worker-dropped", first),
    ]
    assert got[3].metadata is first
    assert view.count == source.count == 4
    assert view.workers == {second.uid: worker(1, pid=2)}


def test_redis_reannouncement_with_other_bytes_but_equal_metadata_passes_nothing() -> (
    None
):
    """A record announced again in other bytes that decode to equal metadata
    (an unknown field, say) changes nothing: the metadata is compared, not
    only the bytes."""
    first = worker(0)
    payload = first.to_protobuf().SerializeToString()
    state = SubscriptionState(1.0, lambda uid, error: None)
    uid = str(first.uid).encode()
    events, lost = state.snapshot(1, b"e", [uid, payload], now=0.0)
    assert (pairs(events), lost) == ([("worker-added", first)], False)
    unknown_field = b"\xa0\x06\x01"  # field 100, varint 1: ignored when decoding
    again = b" ".join([b"2", b"e", b"worker-added", uid, payload + unknown_field])
    assert state.message(again) is None
    assert (
        state.message(b" ".join([b"3", b"e", b"worker-updated", uid, payload])) is None
    )
    updated = worker(0, pid=2).to_protobuf().SerializeToString()
    event = state.message(b" ".join([b"4", b"e", b"worker-added", uid, updated]))
    assert event is not None
    assert (event.type, event.metadata) == ("worker-updated", worker(0, pid=2))
