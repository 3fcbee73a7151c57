from __future__ import annotations

import pickle
import uuid
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterable
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel
import cloudpickle
import pytest
from _loops import BACKENDS
from _loops import run as run_on_backend
from _stubs import EventType
from _stubs import ev
from _stubs import meta as stub_meta
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from wool import DiscoveryEvent
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata

from wool_pooling._wool.afilter import afilter

# Sync tests (the hypothesis one) are ignored by anyio's plugin despite this mark.
pytestmark = pytest.mark.anyio

Pairs = list[tuple[str, WorkerMetadata]]


def meta(
    uid: uuid.UUID | None = None, *, gpu: bool = True, pid: int = 1
) -> WorkerMetadata:
    """A worker tagged ``gpu`` or ``cpu``."""
    return stub_meta(uid, pid=pid, tags=frozenset({"gpu" if gpu else "cpu"}))


def is_gpu(metadata: WorkerMetadata) -> bool:
    return "gpu" in metadata.tags


def reject_all(metadata: WorkerMetadata) -> bool:
    return False


class ListSubscriber:
    """Re-iterable, cloudpickle-able subscriber replaying a list of events."""

    def __init__(self, events: Sequence[DiscoveryEvent]) -> None:
        self.events = list(events)

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self._iterate()

    async def _iterate(self) -> AsyncGenerator[DiscoveryEvent, None]:
        for event in self.events:
            await anyio.lowlevel.checkpoint()
            yield event


class SpecSubscriber:
    """Plain-``pickle``-able subscriber (WorkerMetadata holds a mappingproxy)."""

    def __init__(self, specs: Sequence[tuple[EventType, int, bool]]) -> None:
        self.specs = list(specs)

    def __aiter__(self) -> AsyncGenerator[DiscoveryEvent, None]:
        return self._iterate()

    async def _iterate(self) -> AsyncGenerator[DiscoveryEvent, None]:
        for type_, worker, gpu in self.specs:
            yield ev(type_, meta(uuid.UUID(int=worker + 1), gpu=gpu))


class RecordingIterator:
    """Class-based inner iterator recording whether it was closed."""

    def __init__(
        self, events: Sequence[DiscoveryEvent], block: bool, error: Exception | None
    ) -> None:
        self.events = list(events)
        self.block = block
        self.error = error
        self.closed = False

    def __aiter__(self) -> RecordingIterator:
        return self

    async def __anext__(self) -> DiscoveryEvent:
        if self.events:
            return self.events.pop(0)
        if self.error is not None:
            raise self.error
        if self.block:
            await anyio.Event().wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        await anyio.lowlevel.checkpoint()  # unshielded cleanup would be cancelled here
        self.closed = True


class RecordingSubscriber:
    """Subscriber handing out :class:`RecordingIterator` and remembering them."""

    def __init__(
        self,
        events: Sequence[DiscoveryEvent] = (),
        *,
        block: bool = False,
        error: Exception | None = None,
    ) -> None:
        self.events = list(events)
        self.block = block
        self.error = error
        self.iterators: list[RecordingIterator] = []

    def __aiter__(self) -> RecordingIterator:
        iterator = RecordingIterator(self.events, self.block, self.error)
        self.iterators.append(iterator)
        return iterator


async def collect(stream: AsyncIterable[DiscoveryEvent]) -> Pairs:
    return [(e.type, e.metadata) for e in [e async for e in stream]]


async def test_matching_added_passes() -> None:
    """A worker-added for a passing worker is yielded as worker-added."""
    m = meta()
    assert await collect(afilter(is_gpu, ListSubscriber([ev("worker-added", m)]))) == [
        ("worker-added", m)
    ]


async def test_added_then_updated_pass_in_order() -> None:
    """Added then updated of a passing worker are yielded in order."""
    m1 = meta()
    m2 = meta(m1.uid, pid=2)
    inner = ListSubscriber([ev("worker-added", m1), ev("worker-updated", m2)])
    assert await collect(afilter(is_gpu, inner)) == [
        ("worker-added", m1),
        ("worker-updated", m2),
    ]


async def test_repeated_added_of_tracked_worker_is_update() -> None:
    """A second worker-added of a tracked passing worker becomes worker-updated."""
    m1 = meta()
    m2 = meta(m1.uid, pid=2)
    inner = ListSubscriber([ev("worker-added", m1), ev("worker-added", m2)])
    assert await collect(afilter(is_gpu, inner)) == [
        ("worker-added", m1),
        ("worker-updated", m2),
    ]


async def test_rejecting_predicate_yields_nothing() -> None:
    """A predicate rejecting everything yields no events at all."""
    m = meta()
    inner = ListSubscriber(
        [ev("worker-added", m), ev("worker-updated", m), ev("worker-dropped", m)]
    )
    assert await collect(afilter(reject_all, inner)) == []


async def test_entry_transition_yields_added() -> None:
    """A worker starting to pass on an update is yielded as worker-added."""
    m1 = meta(gpu=False)
    m2 = meta(m1.uid, gpu=True)
    inner = ListSubscriber([ev("worker-added", m1), ev("worker-updated", m2)])
    assert await collect(afilter(is_gpu, inner)) == [("worker-added", m2)]


async def test_exit_transition_drops_with_prior_metadata() -> None:
    """A tracked worker that stops passing is dropped with prior metadata."""
    m1 = meta(gpu=True)
    m2 = meta(m1.uid, gpu=False)
    inner = ListSubscriber([ev("worker-added", m1), ev("worker-updated", m2)])
    events = [e async for e in afilter(is_gpu, inner)]
    assert [(e.type, e.metadata) for e in events] == [
        ("worker-added", m1),
        ("worker-dropped", m1),
    ]
    assert events[1].metadata is m1


async def test_tracked_drop_passes_through() -> None:
    """A worker-dropped of a tracked worker is passed through."""
    m = meta()
    inner = ListSubscriber([ev("worker-added", m), ev("worker-dropped", m)])
    assert await collect(afilter(is_gpu, inner)) == [
        ("worker-added", m),
        ("worker-dropped", m),
    ]


async def test_untracked_drop_suppressed() -> None:
    """A worker-dropped of a never-passing worker is suppressed."""
    m = meta(gpu=False)
    inner = ListSubscriber([ev("worker-added", m), ev("worker-dropped", m)])
    assert await collect(afilter(is_gpu, inner)) == []


async def test_drop_after_exit_suppressed_and_readd_is_added() -> None:
    """After an exit, a drop is suppressed and a re-entry is a fresh worker-added."""
    m1 = meta()
    m2 = meta(m1.uid, gpu=False)
    m3 = meta(m1.uid, pid=3)
    inner = ListSubscriber(
        [
            ev("worker-added", m1),
            ev("worker-updated", m2),
            ev("worker-dropped", m2),
            ev("worker-added", m3),
        ]
    )
    assert await collect(afilter(is_gpu, inner)) == [
        ("worker-added", m1),
        ("worker-dropped", m1),
        ("worker-added", m3),
    ]


async def test_sequential_iterations_independent() -> None:
    """Two sequential iterations of one afilter give the same results."""
    m1 = meta()
    m2 = meta(gpu=False)
    inner = ListSubscriber(
        [ev("worker-added", m1), ev("worker-added", m2), ev("worker-dropped", m1)]
    )
    filtered = afilter(is_gpu, inner)
    first = await collect(filtered)
    assert first == [("worker-added", m1), ("worker-dropped", m1)]
    assert await collect(filtered) == first


async def test_interleaved_iterations_independent() -> None:
    """Two interleaved iterations of one afilter keep separate state."""
    m1 = meta()
    m2 = meta(m1.uid, pid=2)
    inner = ListSubscriber([ev("worker-added", m1), ev("worker-updated", m2)])
    filtered = afilter(is_gpu, inner)
    a, b = aiter(filtered), aiter(filtered)
    got_a = [await anext(a)]
    got_b = [await anext(b)]
    got_a.append(await anext(a))
    got_b.append(await anext(b))
    for it in (a, b):
        with pytest.raises(StopAsyncIteration):
            await anext(it)
    expected = [("worker-added", m1), ("worker-updated", m2)]
    assert [(e.type, e.metadata) for e in got_a] == expected
    assert [(e.type, e.metadata) for e in got_b] == expected


async def test_concurrent_tasks_independent() -> None:
    """Two tasks iterating one afilter concurrently each see the full stream."""
    m1 = meta()
    m2 = meta(m1.uid, gpu=False)
    m3 = meta()
    inner = ListSubscriber(
        [ev("worker-added", m1), ev("worker-added", m3), ev("worker-updated", m2)]
    )
    filtered = afilter(is_gpu, inner)
    results: list[Pairs] = []

    async def run() -> None:
        results.append(await collect(filtered))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        tg.start_soon(run)
    expected = [("worker-added", m1), ("worker-added", m3), ("worker-dropped", m1)]
    assert results == [expected, expected]


async def test_cloudpickle_roundtrip() -> None:
    """A cloudpickled afilter unpickles to one yielding the same results."""
    m1 = meta()
    m2 = meta(gpu=False)
    inner = ListSubscriber([ev("worker-added", m1), ev("worker-added", m2)])
    filtered = afilter(is_gpu, inner)
    clone = cloudpickle.loads(cloudpickle.dumps(filtered))
    assert isinstance(clone, afilter)
    assert await collect(clone) == await collect(filtered)


async def test_cloudpickle_roundtrip_with_lambda() -> None:
    """A lambda predicate survives a cloudpickle roundtrip."""
    m = meta(pid=7)
    filtered = afilter(lambda w: w.pid == 7, ListSubscriber([ev("worker-added", m)]))
    clone = cloudpickle.loads(cloudpickle.dumps(filtered))
    assert await collect(clone) == [("worker-added", m)]


async def test_plain_pickle_roundtrip() -> None:
    """An afilter over module-level objects survives a plain pickle roundtrip."""
    specs: list[tuple[EventType, int, bool]] = [
        ("worker-added", 0, True),
        ("worker-added", 1, False),
        ("worker-updated", 0, False),
    ]
    filtered = afilter(is_gpu, SpecSubscriber(specs))
    clone = pickle.loads(pickle.dumps(filtered))
    assert isinstance(clone, afilter)
    assert clone.predicate is is_gpu
    assert await collect(clone) == await collect(filtered)


async def test_is_discovery_subscriber_like() -> None:
    """An afilter satisfies wool's DiscoverySubscriberLike protocol."""
    assert isinstance(afilter(is_gpu, ListSubscriber([])), DiscoverySubscriberLike)


async def test_properties_and_repr() -> None:
    """predicate/inner are exposed read-only and appear in the repr."""
    inner = ListSubscriber([])
    filtered = afilter(is_gpu, inner)
    assert filtered.predicate is is_gpu
    assert filtered.inner is inner
    assert repr(filtered) == f"afilter(predicate={is_gpu!r}, inner={inner!r})"
    with pytest.raises(AttributeError):
        filtered.inner = inner  # type: ignore[misc]


async def test_aclose_closes_inner() -> None:
    """Closing the afilter iterator closes the inner iterator."""
    m = meta()
    inner = RecordingSubscriber([ev("worker-added", m)], block=True)
    iterator = aiter(afilter(is_gpu, inner))
    assert (await anext(iterator)).metadata is m
    assert not inner.iterators[0].closed
    await iterator.aclose()
    assert inner.iterators[0].closed


async def test_unstarted_iteration_opens_nothing() -> None:
    """An iteration closed before its first step never opens the inner."""
    inner = RecordingSubscriber([ev("worker-added", meta())])
    iterator = aiter(afilter(is_gpu, inner))
    await iterator.aclose()
    assert inner.iterators == []


async def test_cancellation_closes_inner() -> None:
    """Cancelling a task blocked in iteration closes the inner iterator."""
    m = meta()
    inner = RecordingSubscriber([ev("worker-added", m)], block=True)
    seen: list[DiscoveryEvent] = []

    async def consume() -> None:
        async for event in afilter(is_gpu, inner):
            seen.append(event)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        assert [e.metadata for e in seen] == [m]
        assert not inner.iterators[0].closed
        tg.cancel_scope.cancel()
    assert inner.iterators[0].closed


async def test_exhaustion_ends_and_closes_inner() -> None:
    """Inner exhaustion ends the filter with StopAsyncIteration and closes inner."""
    m = meta()
    inner = RecordingSubscriber([ev("worker-added", m)])
    iterator = aiter(afilter(is_gpu, inner))
    assert (await anext(iterator)).metadata is m
    with pytest.raises(StopAsyncIteration):
        await anext(iterator)
    assert inner.iterators[0].closed


async def test_inner_exception_propagates_and_closes_inner() -> None:
    """An exception raised by the inner iterator propagates and closes it."""
    inner = RecordingSubscriber(
        [ev("worker-added", meta())], error=RuntimeError("boom")
    )
    iterator = aiter(afilter(is_gpu, inner))
    await anext(iterator)
    with pytest.raises(RuntimeError, match="boom"):
        await anext(iterator)
    assert inner.iterators[0].closed


async def test_predicate_exception_propagates_and_closes_inner() -> None:
    """An exception raised by the predicate propagates and closes the inner."""

    def explode(metadata: WorkerMetadata) -> bool:
        raise ValueError("bad predicate")

    inner = RecordingSubscriber([ev("worker-added", meta())], block=True)
    with pytest.raises(ValueError, match="bad predicate"):
        await collect(afilter(explode, inner))
    assert inner.iterators[0].closed


async def test_non_callable_predicate_rejected() -> None:
    """A non-callable predicate raises TypeError."""
    with pytest.raises(TypeError, match="afilter predicate must be callable, got 42"):
        afilter(42, ListSubscriber([]))  # type: ignore[arg-type]


async def test_non_iterable_inner_rejected() -> None:
    """An inner without __aiter__ raises TypeError naming what was given."""
    with pytest.raises(TypeError, match=r"__aiter__.*list"):
        afilter(is_gpu, [1, 2])  # type: ignore[arg-type]


# --- property-based -------------------------------------------------------

event_types: list[EventType] = ["worker-added", "worker-updated", "worker-dropped"]
specs_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(event_types), st.booleans()),
    max_size=25,
)


def build_events(specs: list[tuple[int, EventType, bool]]) -> list[DiscoveryEvent]:
    return [
        ev(type_, meta(uuid.UUID(int=worker + 1), gpu=gpu, pid=i))
        for i, (worker, type_, gpu) in enumerate(specs)
    ]


def model(
    events: list[DiscoveryEvent], predicate: Callable[[WorkerMetadata], bool]
) -> dict[uuid.UUID, WorkerMetadata]:
    known: dict[uuid.UUID, WorkerMetadata] = {}
    for e in events:
        if e.type == "worker-dropped":
            known.pop(e.metadata.uid, None)
        else:
            known[e.metadata.uid] = e.metadata
    return {uid: m for uid, m in known.items() if predicate(m)}


def replay(stream: list[DiscoveryEvent]) -> dict[uuid.UUID, WorkerMetadata]:
    state: dict[uuid.UUID, WorkerMetadata] = {}
    for e in stream:
        uid = e.metadata.uid
        if e.type == "worker-added":
            assert uid not in state, "added an already-tracked worker"
            state[uid] = e.metadata
        elif e.type == "worker-updated":
            assert uid in state, "updated an untracked worker"
            state[uid] = e.metadata
        else:
            assert uid in state, "dropped an untracked worker"
            del state[uid]
    return state


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=100, deadline=None)
@given(specs=specs_strategy)
def test_stream_matches_reference_model(
    backend: tuple[str, dict[str, Any]], specs: list[tuple[int, EventType, bool]]
) -> None:
    """After every prefix, the replayed filtered stream equals the model's view."""
    events = build_events(specs)

    async def body() -> None:
        for n in range(len(events) + 1):
            stream = [e async for e in afilter(is_gpu, ListSubscriber(events[:n]))]
            assert replay(stream) == model(events[:n], is_gpu)

    run_on_backend(body, backend)
