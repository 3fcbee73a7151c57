"""Soak test: consumers join and leave a shared subscription at random.

Run from the repository root (not part of the default test run;
``tests/test_soak_smoke.py`` runs ``--quick`` on both backends)::

    python benchmarks/soak.py                     # 1,000 consumers, 1,000,000 events
    python benchmarks/soak.py --quick             # 50 consumers, 20,000 events
    python benchmarks/soak.py --consumers 200 --events 200000 --backend trio

One ``@shared_subscription`` class, iterated inside one ``SubscriptionPool``.
Its raw subscriber yields ``--events`` discovery events (``worker-updated``,
cycling over 16 workers and 8 metadata versions each), each carrying its
sequence number, and passes a checkpoint before a random quarter of them, so
that pulls suspend and consumers wait. An anchor consumer reads every event;
as it goes, it starts ``--consumers`` consumer tasks at random points of the
sequence and cancels some of them at random later points. Each consumer has
a random pace (never suspending, a checkpoint per event, or one per 64
events) and leaves in one of these ways:

- ``close``: takes a random number of events, then leaves ``async with``;
- ``abandon``: takes a random number of events, breaks out and drops the
  consumer without closing it (released on garbage collection);
- ``cancel``: reads until the anchor cancels its task at a random point
  (inside ``async with`` or not), whether it is suspended in ``__anext__``,
  in its own checkpoint or not started yet; or until the stream ends.

The subscription class has ``max_lag=None``: this is the exactness part, and
a consumer that falls behind must be given every event, not resynchronised
(resync is measured by ``benchmarks/throughput.py``). Checked for
every consumer, against the position the source had reached when it joined:

- the replay (one ``worker-added`` per known worker) is exactly the state of
  the source at its join point: each worker once, with its latest metadata;
- then the live events are a contiguous run of the sequence starting exactly
  at the join point: no event lost, none duplicated or out of place; a
  consumer that reaches the end has every event up to the last one;
- nothing else (an event without a sequence number would be a resync).

And overall: the raw subscriber was iterated once, every consumer joined,
nothing is left in the pool at the end, and memory is flat after warm-up:
the resident set size is reported at the start, after warm-up (when the
anchor has read 10% of the events) and at the end; the run fails if the end
exceeds the warm-up figure by more than ``--rss-margin`` MB.

Prints one summary line and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import _results
import anyio
import anyio.abc
import anyio.lowlevel
import attrs
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import SubscriptionConsumer
from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

WORKERS = 16
VERSIONS = 8
#: Probability that the source passes a checkpoint before an event.
SUSPEND_PROBABILITY = 0.25
#: Fraction of the events after which memory counts as warmed up.
WARM_UP = 0.1
#: Mean number of consumers alive at once (sets the mean life of a consumer).
CONCURRENCY = 10
MODES = ("close", "abandon", "cancel")
PACES = ("fast", "slow", "bursty")
#: How long the anchor waits for every consumer to have joined.
JOIN_TIMEOUT = 120.0


# -- the source --------------------------------------------------------------


class Stream:
    """The events of one run: ``total`` sequence-numbered discovery events.

    :attr:`produced` is the number of events yielded so far, which is where a
    consumer joining now starts: the fan-out logs an event in the same step
    as the source yields it. After the last event the source waits for
    :attr:`finish`, so that every consumer joins before it ends.
    """

    def __init__(self, total: int, seed: int) -> None:
        self.total = total
        uids = [uuid.uuid4() for _ in range(WORKERS)]
        # metadata[n % len(metadata)] is the metadata of event n: worker
        # n % WORKERS, version (n // WORKERS) % VERSIONS.
        self.metadata = [
            WorkerMetadata(
                uid=uids[index % WORKERS],
                address="127.0.0.1:1",
                pid=1,
                version=str(index // WORKERS),
            )
            for index in range(WORKERS * VERSIONS)
        ]
        rng = random.Random(seed ^ 0x5EED)
        self._suspend = [rng.random() < SUSPEND_PROBABILITY for _ in range(4096)]
        self.produced = 0
        self.iterations = 0
        self.finish = anyio.Event()

    async def events(self) -> AsyncIterator[DiscoveryEvent]:
        self.iterations += 1
        metadata = self.metadata
        size = len(metadata)
        suspend = self._suspend
        checkpoint = anyio.lowlevel.checkpoint
        for seq in range(self.total):
            if suspend[seq % 4096]:
                await checkpoint()
            event = DiscoveryEvent("worker-updated", metadata=metadata[seq % size])
            event.seq = seq  # type: ignore[attr-defined]
            self.produced = seq + 1
            yield event
        await self.finish.wait()

    def state_at(self, position: int) -> dict[uuid.UUID, WorkerMetadata]:
        """The known workers after the first ``position`` events."""
        size = len(self.metadata)
        state: dict[uuid.UUID, WorkerMetadata] = {}
        for worker in range(min(position, WORKERS)):
            last = worker + (position - 1 - worker) // WORKERS * WORKERS
            metadata = self.metadata[last % size]
            state[metadata.uid] = metadata
        return state


@shared_subscription(max_lag=None)
class SoakSubscriber:
    """The raw subscriber: one iteration of the run's stream."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self.stream.events()


# -- checking one consumer ---------------------------------------------------


@attrs.define
class Check:
    """What one consumer received, checked as it arrives."""

    stream: Stream
    joined_at: int = -1
    replay: dict[uuid.UUID, WorkerMetadata] = attrs.Factory(dict)
    next_seq: int = -1
    live: int = 0
    lost: int = 0
    duplicated: int = 0
    bad_replay: int = 0
    unexpected: int = 0
    end: str = "running"
    #: Cancelled while suspended in ``__anext__`` (not in its own code).
    cancelled_in_anext: bool = False

    def join(self) -> None:
        self.joined_at = self.stream.produced

    def receive(self, event: Any) -> None:
        seq: int | None = getattr(event, "seq", None)
        if seq is None:
            if (
                self.next_seq < 0
                and type(event) is DiscoveryEvent
                and event.type == "worker-added"
            ):
                metadata = event.metadata
                if metadata.uid in self.replay:
                    self.bad_replay += 1  # a worker replayed twice
                self.replay[metadata.uid] = metadata
            else:
                self.unexpected += 1  # a replay after live events, or a resync
            return
        self.live += 1
        expected = self.next_seq
        if expected < 0:  # the first live event: the replay is over
            self._check_replay()
            expected = self.joined_at
        if seq > expected:
            self.lost += seq - expected
        elif seq < expected:
            self.duplicated += 1
        self.next_seq = max(seq + 1, self.next_seq)

    def _check_replay(self) -> None:
        state = self.stream.state_at(self.joined_at)
        if len(self.replay) != len(state) or any(
            state.get(uid) is not metadata for uid, metadata in self.replay.items()
        ):
            self.bad_replay += 1

    def exhausted(self) -> None:
        """The stream ended: this consumer must have received up to its end."""
        self.end = "exhausted"
        if self.next_seq < 0:
            self._check_replay()
            self.next_seq = self.joined_at
        self.lost += self.stream.total - self.next_seq

    def partial(self, end: str) -> None:
        """Left early: what was received must be a valid prefix."""
        self.end = end
        if self.next_seq < 0:
            state = self.stream.state_at(self.joined_at)
            if any(
                state.get(uid) is not metadata for uid, metadata in self.replay.items()
            ):
                self.bad_replay += 1


# -- the run -----------------------------------------------------------------


@attrs.define
class Plan:
    """One consumer: when it starts, how it reads and how it leaves."""

    index: int
    start_after: int
    life: int
    mode: str
    pace: str
    use_async_with: bool
    cancel_after: int
    scope: anyio.CancelScope = attrs.Factory(anyio.CancelScope)


def make_plans(consumers: int, events: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    mean_life = max(1, CONCURRENCY * events // max(consumers, 1))
    plans: list[Plan] = []
    for index in range(consumers):
        start = rng.randrange(events)
        plans.append(
            Plan(
                index=index,
                start_after=start,
                life=rng.randint(1, 2 * mean_life),
                mode=rng.choice(MODES),
                pace=rng.choice(PACES),
                use_async_with=rng.random() < 0.5,
                cancel_after=start + rng.randint(0, 2 * mean_life),
            )
        )
    return plans


@attrs.define
class Totals:
    consumers: int = 0
    joined: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    bad_replay: int = 0
    unexpected: int = 0
    ends: dict[str, int] = attrs.Factory(dict)
    errors: list[str] = attrs.Factory(list)
    all_joined: anyio.Event = attrs.Factory(anyio.Event)

    def add(self, check: Check) -> None:
        self.delivered += check.live + len(check.replay)
        self.lost += check.lost
        self.duplicated += check.duplicated
        self.bad_replay += check.bad_replay
        self.unexpected += check.unexpected
        self.ends[check.end] = self.ends.get(check.end, 0) + 1

    def count_join(self) -> None:
        self.joined += 1
        if self.joined == self.consumers:
            self.all_joined.set()


async def consume(
    plan: Plan, subscription: Any, stream: Stream, totals: Totals
) -> None:
    check = Check(stream)
    iterator: SubscriptionConsumer | None = aiter(subscription)
    assert iterator is not None
    pace = plan.pace
    limit = plan.life if plan.mode != "cancel" else math.inf
    checkpoint = anyio.lowlevel.checkpoint
    end = "closed" if plan.mode == "close" else "abandoned"
    try:
        with plan.scope:
            if plan.mode == "close" or (plan.mode == "cancel" and plan.use_async_with):
                async with iterator:
                    await read(iterator, check, totals, limit, pace, checkpoint)
            else:
                await read(iterator, check, totals, limit, pace, checkpoint)
                if plan.mode == "abandon":
                    iterator = None  # released on garbage collection
        if plan.scope.cancelled_caught:
            end = "cancelled"
            if check.cancelled_in_anext:
                # Cancelling a pending __anext__ ends the consumer.
                end = "cancelled in __anext__"
                assert iterator is not None
                try:
                    await anext(iterator)
                except StopAsyncIteration:
                    pass
                else:
                    totals.errors.append(
                        f"consumer {plan.index}: __anext__ after a cancelled "
                        "__anext__ did not raise StopAsyncIteration"
                    )
    except Exception as error:  # a consumer must never see an error
        totals.errors.append(f"consumer {plan.index}: {error!r}")
        end = "failed"
    if check.end == "running":
        check.partial(end)
    totals.add(check)


async def read(
    iterator: SubscriptionConsumer,
    check: Check,
    totals: Totals,
    limit: float,
    pace: str,
    checkpoint: Any,
) -> None:
    check.join()
    totals.count_join()  # the join happens in the same step, at __anext__
    cancelled = anyio.get_cancelled_exc_class()
    while True:
        try:
            event = await anext(iterator)
        except StopAsyncIteration:
            check.exhausted()
            return
        except cancelled:
            check.cancelled_in_anext = True
            raise
        check.receive(event)
        if check.live >= limit:
            return
        if pace == "slow" or (pace == "bursty" and check.live % 64 == 0):
            await checkpoint()


async def anchor(
    subscription: Any,
    stream: Stream,
    plans: list[Plan],
    totals: Totals,
    group: anyio.abc.TaskGroup,
    memory: dict[str, int],
) -> None:
    """Read every event; start and cancel the consumers as planned."""
    starts: dict[int, list[Plan]] = {}
    cancels: dict[int, list[Plan]] = {}
    for plan in plans:
        starts.setdefault(plan.start_after, []).append(plan)
        if plan.mode == "cancel" and plan.cancel_after < stream.total:
            cancels.setdefault(plan.cancel_after, []).append(plan)
    warm_up = int(stream.total * WARM_UP)
    tenth = max(stream.total // 10, 1)
    began = time.perf_counter()
    check = Check(stream)
    iterator = aiter(subscription)
    check.join()
    async with iterator:
        seq = 0
        async for event in iterator:
            check.receive(event)
            for plan in starts.pop(seq, ()):
                group.start_soon(consume, plan, subscription, stream, totals)
            for plan in cancels.pop(seq, ()):
                plan.scope.cancel()
            seq += 1
            if seq == warm_up:
                gc.collect()
                memory["warm_up"] = rss()
            if seq % tenth == 0:
                progress(seq, stream.total, totals, began)
            if seq == stream.total:
                # Let every consumer join before the stream ends.
                with anyio.move_on_after(JOIN_TIMEOUT):
                    await totals.all_joined.wait()
                if not totals.all_joined.is_set():
                    totals.errors.append(
                        f"only {totals.joined} of {totals.consumers} consumers joined"
                    )
                stream.finish.set()
        else:
            check.exhausted()
    if check.live != stream.total or check.lost or check.duplicated:
        totals.errors.append(
            f"the anchor received {check.live} of {stream.total} events "
            f"({check.lost} lost, {check.duplicated} duplicated)"
        )
    totals.add(check)


def progress(seq: int, total: int, totals: Totals, began: float) -> None:
    """A progress line on stderr, every tenth of the events."""
    alive = totals.joined - sum(totals.ends.values())
    print(
        f"[soak] {seq / total:4.0%} {seq:>10,} events, {totals.joined:>5,} joined, "
        f"{alive:>4} alive, RSS {rss() / 1e6:7.1f} MB, "
        f"{time.perf_counter() - began:6.1f}s",
        file=sys.stderr,
        flush=True,
    )


async def soak(consumers: int, events: int, seed: int) -> dict[str, Any]:
    stream = Stream(events, seed)
    plans = make_plans(consumers, events, seed)
    totals = Totals(consumers=consumers)
    if consumers == 0:
        totals.all_joined.set()
    subscription = SoakSubscriber(stream)
    # Import what the end of the run uses (trio.testing, a few MB) up front.
    await anyio.wait_all_tasks_blocked()
    gc.collect()
    memory = {"start": rss()}
    began = time.perf_counter()
    async with SubscriptionPool() as pool:
        async with anyio.create_task_group() as group:
            group.start_soon(anchor, subscription, stream, plans, totals, group, memory)
        # Consumers dropped without closing are released by the loop, soon.
        for _ in range(100):
            gc.collect()
            await anyio.wait_all_tasks_blocked()
            if pool.statistics().entries == 0:
                break
        left = pool.statistics()
    elapsed = time.perf_counter() - began
    del plans
    gc.collect()
    memory["end"] = rss()
    memory["peak"] = peak_rss()
    memory.setdefault("warm_up", memory["end"])
    return {
        "totals": totals,
        "left": left,
        "iterations": stream.iterations,
        "max_lag": subscription.max_lag,
        "memory": memory,
        "seconds": elapsed,
    }


# -- memory ------------------------------------------------------------------


def _status(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status``, in bytes; ``None`` off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _max_rss() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def rss() -> int:
    """The resident set size now (the peak so far, where it cannot be read)."""
    value = _status("VmRSS")
    return _max_rss() if value is None else value


def peak_rss() -> int:
    value = _status("VmHWM")
    return _max_rss() if value is None else value


# -- entry point -------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/soak.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--consumers", type=int, default=None, help="default 1000")
    parser.add_argument("--events", type=int, default=None, help="default 1000000")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument(
        "--quick", action="store_true", help="50 consumers, 20,000 events"
    )
    parser.add_argument(
        "--rss-margin",
        type=float,
        default=20.0,
        help="fail if the end RSS exceeds the warm-up RSS by more (MB, default 20)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="also write the summary to DIR/soak-<backend>-<interpreter>.json",
    )
    options = parser.parse_args(argv)
    consumers = options.consumers
    if consumers is None:
        consumers = 50 if options.quick else 1_000
    events = options.events
    if events is None:
        events = 20_000 if options.quick else 1_000_000
    if consumers < 0 or events < 1:
        parser.error("--consumers must be >= 0 and --events >= 1")

    result = anyio.run(soak, consumers, events, options.seed, backend=options.backend)
    totals: Totals = result["totals"]
    left = result["left"]
    memory = result["memory"]
    growth = (memory["end"] - memory["warm_up"]) / 1e6
    violations = list(totals.errors)
    if totals.lost or totals.duplicated or totals.bad_replay or totals.unexpected:
        violations.append("events lost, duplicated or out of place")
    if result["iterations"] != 1:
        violations.append(f"the raw subscriber was iterated {result['iterations']}x")
    if left.entries or left.consumers:
        violations.append(f"left in the pool: {left}")
    if growth > options.rss_margin:
        violations.append(
            f"memory grew {growth:.1f} MB after warm-up (limit {options.rss_margin:g})"
        )
    mb = {name: value / 1e6 for name, value in memory.items()}
    ends = ", ".join(f"{count} {end}" for end, count in sorted(totals.ends.items()))
    print(
        f"soak {options.backend} seed={options.seed}: {consumers:,} consumers, "
        f"{events:,} events, max_lag={result['max_lag']}: "
        f"{totals.delivered:,} delivered, "
        f"{totals.lost} lost, {totals.duplicated} duplicated, "
        f"{totals.bad_replay} bad replays, {totals.unexpected} unexpected; "
        f"ends: {ends}; upstream iterations: {result['iterations']}; "
        f"left in pool: {left.entries} entries, {left.consumers} consumers; "
        f"RSS start {mb['start']:.1f} MB, after warm-up {mb['warm_up']:.1f} MB, "
        f"end {mb['end']:.1f} MB ({growth:+.1f} MB, limit {options.rss_margin:g}), "
        f"peak {mb['peak']:.1f} MB; {result['seconds']:.1f}s: "
        + ("OK" if not violations else "FAILED"),
        flush=True,
    )
    for violation in violations[:20]:
        print(f"  violation: {violation}", file=sys.stderr)
    if options.out is not None:
        out = _results.folder(options.out, options.quick)
        meta = _results.meta(options.quick, result["seconds"])
        summary = {
            "backend": options.backend,
            "seed": options.seed,
            "consumers": consumers,
            "events": events,
            "max_lag": result["max_lag"],
            "delivered": totals.delivered,
            "lost": totals.lost,
            "duplicated": totals.duplicated,
            "bad_replay": totals.bad_replay,
            "unexpected": totals.unexpected,
            "ends": dict(sorted(totals.ends.items())),
            "iterations": result["iterations"],
            "rss_mb": mb,
            "rss_growth_mb": growth,
            "violations": violations[:20],
            "ok": not violations,
        }
        name = f"soak-{options.backend}-{_results.interpreter()}.json"
        (out / name).write_text(
            json.dumps({"meta": meta, "result": summary}, indent=2) + "\n"
        )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
