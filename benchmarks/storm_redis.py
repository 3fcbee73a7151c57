"""Herds of ``RedisDiscovery`` subscriptions: a blip and a restart, every
process at once; and what one client's snapshot costs.

Run from the repository root (needs the ``redis`` extra and ``redis-server``
on ``PATH``; the ``bench`` extra installs hiredis, redis-py's C parser)::

    python benchmarks/storm_redis.py             # W:P = 1000:16 10000:16 100000:16
    python benchmarks/storm_redis.py --quick     # W:P = 200:4
    python benchmarks/storm_redis.py --runs 10000:8 --subscriptions 2
    python benchmarks/storm_redis.py --client 1000 10000 100000   # one client only

For each run ``W:P`` it starts its own ``redis-server`` (nothing saved
periodically):

1. W workers are recorded through the publisher's own Lua script, in a
   pipeline (as W publishers would, with a lease of a day: nothing expires
   during the run).
2. One client's snapshot against W: the subscriber's snapshot script run
   alone ``--snapshots`` times (its wall time with redis-py's parser, the
   server's CPU from ``/proc/<pid>/stat``, the reply's bytes), then what a
   client spends on it: fetching and parsing the reply on redis-py's
   asyncio client, decoding it into a fresh subscription's state (its
   first snapshot), and applying a new reply to a subscription that knows
   every record (a resync, its event loop held). ``--client W...`` measures
   only this, and prints it.
3. P subscriber processes start, each iterating ``--subscriptions`` (S)
   subscriptions of one ``RedisDiscovery(..., shared=False)``: every
   iteration has its own connections, as S processes would. Each keeps a
   view (the set of workers its events make). The reconnect policy is the
   default one.
4. The blip herd: ``CLIENT KILL TYPE pubsub`` cuts every subscription's
   pub/sub connection on a server that keeps its keys, and one more worker
   is published right after (no subscriber hears it live). A view equals
   the truth once its subscription has caught up after reconnecting,
   whatever way the library does it.
5. The restart herd: the server is stopped without saving and started
   again on a data file written by another server, into which the same
   records and one more worker were published: the data was lost (a new
   epoch) and the publishers have recorded every worker again, so every
   subscription must take a full snapshot.

For each herd: the time from the cut (the server answering again, for a
restart) to the last view equal to the truth, the server's CPU in it
(``INFO CPU``: ``used_cpu_sys`` + ``used_cpu_user``), its peak (sampled
from ``/proc`` every 0.1 s), the bytes it sent (``INFO stats``), and the
subscriptions' ``RedisStatistics`` (full snapshots, and catch-ups where the
library counts them). Every view must end equal to the truth, with no
duplicate add and no unknown drop: the script exits 1 otherwise. A full
run records ``benchmarks/results/storm_redis-<interpreter>.json`` with the
load average (the figures depend on what else the machine runs);
``--quick`` writes into a temporary folder; ``--out DIR`` into DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _results
import redis
import redis.asyncio
import redis.utils
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis._errors import DEFAULT_RECONNECT
from wool_pooling.redis._scripts import DEFAULT_CHANGE_LOG
from wool_pooling.redis._scripts import PUBLISH
from wool_pooling.redis._scripts import SNAPSHOT
from wool_pooling.redis._scripts import Keys
from wool_pooling.redis._scripts import idle_expiry_ms
from wool_pooling.redis._state import SubscriptionState

#: A record's lease, in ms: nothing expires during a run.
LEASE_MS = 86_400_000
#: Bound on each wait (initial snapshots, reconvergence), in seconds.
CONVERGE = 600.0
#: CPU sampling period, in seconds.
PERIOD = 0.1
TICK = os.sysconf("SC_CLK_TCK")
HERDS = ("blip", "restart")

FULL = ["1000:16", "10000:16", "100000:16"]
QUICK = ["200:4"]
CLIENT = [1000, 10_000, 100_000]


def worker(index: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.uuid4(),
        address=f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}:50051",
        pid=10_000 + index,
        version="0.15.0",
    )


def payload(metadata: WorkerMetadata) -> bytes:
    return metadata.to_protobuf().SerializeToString()


def resp_bytes(reply: Any) -> int:
    """The size of ``reply`` on the wire (RESP2), as the server sent it."""
    if isinstance(reply, int):
        return len(f":{reply}\r\n")
    if isinstance(reply, bytes):
        return len(f"${len(reply)}\r\n") + len(reply) + 2
    assert isinstance(reply, list)
    return len(f"*{len(reply)}\r\n") + sum(resp_bytes(item) for item in reply)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]


def loadavg() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


# -- a subscriber process --


class View:
    def __init__(self) -> None:
        self.workers: set[str] = set()
        self.duplicates = 0
        self.unknown = 0

    def apply(self, event: DiscoveryEvent) -> None:
        uid = str(event.metadata.uid)
        if event.type == "worker-added":
            if uid in self.workers:
                self.duplicates += 1
            self.workers.add(uid)
        elif uid not in self.workers:
            self.unknown += 1
        elif event.type == "worker-dropped":
            self.workers.discard(uid)


def counts(source: RedisDiscovery) -> dict[str, int]:
    """The subscriptions' counters a herd changes (``resumes`` where the
    library counts catch-ups apart from snapshots)."""
    statistics = source.statistics()
    names = ("reconnects", "snapshots", "resumes", "epoch_changes", "gaps")
    return {
        name: getattr(statistics, name) for name in names if hasattr(statistics, name)
    }


async def subscriber_process(
    url: str,
    namespace: str,
    subscriptions: int,
    connect_timeout: float,
    converge: float,
) -> None:
    """Keep ``subscriptions`` views; after the first snapshots, for each
    marker uid read from stdin, wait until every view holds it and print
    what the herd took (one JSON line each)."""
    loop = asyncio.get_running_loop()
    source = RedisDiscovery(
        url, namespace, shared=False, connect_timeout=connect_timeout
    )
    views = [View() for _ in range(subscriptions)]
    marker: list[str] = []
    #: Wall-clock time each view came to hold the marker.
    converged: list[float | None] = [None] * subscriptions
    progress = asyncio.Event()

    async def consume(index: int) -> None:
        view = views[index]
        try:
            async for event in source.subscribe():
                view.apply(event)
                if marker and converged[index] is None and marker[0] in view.workers:
                    converged[index] = time.time()
                progress.set()
        finally:
            progress.set()  # an ended subscription ends the waits below

    expected = int(await loop.run_in_executor(None, sys.stdin.readline))
    began = time.monotonic()
    # One subscription at a time, each waiting for its first snapshot: the
    # start is no herd (only the blip and the restart are measured).
    tasks: list[asyncio.Task[None]] = []
    for index in range(subscriptions):
        tasks.append(asyncio.create_task(consume(index)))
        async with asyncio.timeout(CONVERGE):
            while len(views[index].workers) != expected:
                if tasks[-1].done():
                    raise RuntimeError("a subscription ended")
                progress.clear()
                await progress.wait()
    print(json.dumps({"initial_seconds": time.monotonic() - began}), flush=True)
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        before = counts(source)
        marker[:] = [line]
        converged[:] = [None] * subscriptions
        for view in views:
            view.duplicates = view.unknown = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(converge):
                while None in converged and not any(task.done() for task in tasks):
                    progress.clear()
                    await progress.wait()
        after = counts(source)
        print(
            json.dumps(
                {
                    "converged_at": converged,
                    "sizes": [len(view.workers) for view in views],
                    "duplicates": sum(view.duplicates for view in views),
                    "unknown": sum(view.unknown for view in views),
                    "counts": {name: after[name] - before[name] for name in after},
                }
            ),
            flush=True,
        )
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- the parent --


class Server:
    """A ``redis-server`` of its own folder, started on a data file."""

    def __init__(self) -> None:
        executable = shutil.which("redis-server")
        if executable is None:
            sys.exit("redis-server is not on PATH (apt-get install -y redis-server)")
        self.executable = executable
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.directory = tempfile.mkdtemp(prefix="redis-storm-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def data(self) -> Path:
        return Path(self.directory) / "storm.rdb"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.executable, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.directory,
             "--dbfilename", self.data.name, "--maxclients", "10000"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def wait_ready(self) -> None:
        """Return once the server answers ``PING`` (its data file loaded).

        A plain socket, polled every 5 ms: redis-py's own retries would add
        their backoff to the measured time.
        """
        deadline = time.monotonic() + CONVERGE
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 2) as sock:
                    sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass  # refused: not listening yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server on port {self.port} never answered")
            time.sleep(0.005)

    def shutdown(self, save: bool) -> None:
        """``SHUTDOWN SAVE`` (or ``NOSAVE``), then wait for the process to exit.

        Sent on a plain socket: redis-py retries a command whose connection
        closes.
        """
        how = b"SAVE" if save else b"NOSAVE"
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as sock:
            sock.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$%d\r\n%s\r\n" % (len(how), how))
            while sock.recv(1024):
                pass
        assert self.process is not None
        self.process.wait(60)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)

    def admin(self) -> Any:
        return redis.Redis(port=self.port, socket_timeout=60)


def cpu_ticks(pid: int) -> int:
    """The process's user + system CPU time, in clock ticks."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def server_figures(client: Any) -> tuple[float, int]:
    """The server's CPU seconds (``INFO CPU``) and bytes sent so far."""
    cpu = client.info("cpu")
    sent = client.info("stats")["total_net_output_bytes"]
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), int(sent)


def populate(client: Any, keys: Keys, records: list[WorkerMetadata]) -> None:
    """Record ``records`` through the publisher's script, each announced."""
    sha = client.script_load(PUBLISH)
    epoch = uuid.uuid4().hex
    for start in range(0, len(records), 1000):
        pipe = client.pipeline(transaction=False)
        for metadata in records[start : start + 1000]:
            pipe.evalsha(
                sha, len(keys.keys), *keys.keys, keys.channel, epoch,
                idle_expiry_ms(LEASE_MS / 1000), DEFAULT_CHANGE_LOG,
                "worker-added", str(metadata.uid), payload(metadata), LEASE_MS,
            )  # fmt: skip
        pipe.execute()


def snapshot_arguments(keys: Keys) -> list[Any]:
    keep = idle_expiry_ms(LEASE_MS / 1000)
    return [
        len(keys.keys), *keys.keys, keys.channel, uuid.uuid4().hex, keep,
        DEFAULT_CHANGE_LOG,
    ]  # fmt: skip


async def client_cost(url: str, keys: Keys, repeats: int) -> dict[str, Any]:
    """What one client spends on a snapshot (medians of ``repeats``): fetching
    and parsing the reply on redis-py's asyncio client, as a subscription
    does; decoding it into a fresh subscription's state; applying a new reply
    to a subscription that knows every record (a resync)."""
    client = redis.asyncio.Redis.from_url(url, socket_timeout=600)
    try:
        sha = await client.script_load(SNAPSHOT)
        arguments = snapshot_arguments(keys)
        fetch: list[float] = []
        first: list[float] = []
        resync: list[float] = []
        for _ in range(repeats):
            state = SubscriptionState(1.0, lambda uid, error: None)
            for times in (first, resync):
                began = time.perf_counter()
                version, epoch, flat = (await client.evalsha(sha, *arguments))[:3]
                fetch.append(time.perf_counter() - began)
                began = time.perf_counter()
                state.snapshot(int(version), epoch, flat, now=0.0)
                times.append(time.perf_counter() - began)
                del flat
    finally:
        await client.aclose()

    def median_ms(values: list[float]) -> float:
        return round(sorted(values)[len(values) // 2] * 1000, 1)

    return {
        "records": len(state.workers),
        "hiredis": redis.utils.HIREDIS_AVAILABLE,
        "fetch_ms": median_ms(fetch),
        "first_decode_ms": median_ms(first),
        "resync_ms": median_ms(resync),
        "client_resync_ms": round(median_ms(fetch) + median_ms(resync), 1),
        "client_repeats": repeats,
    }


def snapshot_cost(server: Server, keys: Keys, count: int) -> dict[str, Any]:
    """One snapshot, run alone ``count`` times: its reply's bytes, its wall
    time (fetched and parsed by redis-py), the server's CPU time per
    snapshot (``/proc``: the script and writing the reply), the script's own
    time (``INFO commandstats``); then :func:`client_cost`."""
    client = server.admin()
    sha = client.script_load(SNAPSHOT)
    arguments = [sha, *snapshot_arguments(keys)]
    reply = client.evalsha(*arguments)
    wire = resp_bytes(reply)
    records = len(reply[2]) // 2
    del reply
    walls: list[float] = []
    client.config_resetstat()
    before = cpu_ticks(server.pid)
    for _ in range(count):
        began = time.perf_counter()
        client.evalsha(*arguments)
        walls.append(time.perf_counter() - began)
    cpu = (cpu_ticks(server.pid) - before) / TICK / count
    script = client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
    client.close()
    walls.sort()
    cost = {
        "records": records,
        "bytes": wire,
        "bytes_per_record": round(wire / max(records, 1), 1),
        "wall_ms_median": round(walls[len(walls) // 2] * 1000, 3),
        "wall_ms_min": round(walls[0] * 1000, 3),
        "server_cpu_ms": round(cpu * 1000, 3),
        "script_ms": round(float(script) / 1000, 3),
        "repeats": count,
    }
    repeats = max(1, min(5, count, 100_000 // max(records, 1)))
    cost.update(asyncio.run(client_cost(server.url, keys, repeats)))
    return cost


def spawn(*arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def tell(children: list[subprocess.Popen[str]], line: str) -> None:
    for child in children:
        assert child.stdin is not None
        child.stdin.write(f"{line}\n")
        child.stdin.flush()


async def read_json(child: subprocess.Popen[str]) -> dict[str, Any]:
    assert child.stdout is not None
    line = await asyncio.to_thread(child.stdout.readline)
    if not line:
        raise RuntimeError(f"a subscriber process ended (exit {child.wait()})")
    return json.loads(line)


async def sample(server: Server, samples: list[tuple[float, float]]) -> None:
    """Append (wall time, percent of one core) every ``PERIOD`` seconds."""
    pid, ticks, at = server.pid, cpu_ticks(server.pid), time.monotonic()
    while True:
        await asyncio.sleep(PERIOD)
        try:
            now_ticks, now = cpu_ticks(pid), time.monotonic()
        except OSError:
            return
        if now > at:
            samples.append((time.time(), 100 * (now_ticks - ticks) / TICK / (now - at)))
        ticks, at = now_ticks, now


def herd_figures(
    results: list[dict[str, Any]],
    truth: int,
    began: float,
    samples: list[tuple[float, float]],
    cpu: float,
    sent: int,
    snapshot_bytes: int,
) -> dict[str, Any]:
    """One herd's figures, its times from ``began`` (the cut, or the server
    answering again)."""
    times = sorted(t for r in results for t in r["converged_at"] if t is not None)
    views = sum(len(r["converged_at"]) for r in results)
    equal = sum(
        size == truth and at is not None
        for r in results
        for size, at in zip(r["sizes"], r["converged_at"], strict=True)
    )
    herd = [c for at, c in samples if began - PERIOD <= at <= (times or [began])[-1]]

    def after(index: float) -> float | None:
        if not times:
            return None
        return round(times[min(len(times) - 1, int(index * len(times)))] - began, 3)

    totals: dict[str, int] = {}
    for r in results:
        for name, value in r["counts"].items():
            totals[name] = totals.get(name, 0) + value
    return {
        "reconverge_first_seconds": after(0),
        "reconverge_median_seconds": after(0.5),
        "reconverge_seconds": after(1.0),
        "server_cpu_seconds": round(cpu, 3),
        "server_peak_cpu_percent": round(max(herd, default=0.0), 1),
        "herd_bytes": sent,
        # About 1 per view when each takes a full snapshot; near 0 for catch-ups.
        "snapshots_sent_per_view": round(sent / max(views, 1) / snapshot_bytes, 3),
        "counts": totals,
        "views": views,
        "views_equal_truth": equal,
        "duplicates": sum(r["duplicates"] for r in results),
        "unknown_drops_or_updates": sum(r["unknown"] for r in results),
        "cpu_samples": [
            [round(at - began, 2), round(c)] for at, c in samples if c >= 1
        ],
    }


async def storm(
    workers: int,
    processes: int,
    subscriptions: int,
    repeats: int,
    connect_timeout: float,
    converge: float,
) -> dict[str, Any]:
    namespace = f"storm-{uuid.uuid4().hex[:8]}"
    keys = Keys.of(namespace)
    records = [worker(index) for index in range(workers + 2)]
    blip, restart = (str(each.uid) for each in records[workers:])
    server, other = Server(), Server()
    children: list[subprocess.Popen[str]] = []
    try:
        # The data file of the restart: every record published again, one
        # more worker, another epoch.
        other.start()
        await asyncio.to_thread(other.wait_ready)
        client = other.admin()
        await asyncio.to_thread(populate, client, keys, records)
        client.close()
        await asyncio.to_thread(other.shutdown, True)
        # What loading that file costs the server (no client yet): taken off
        # the restart herd's CPU.
        other.start()
        await asyncio.to_thread(other.wait_ready)
        client = other.admin()
        load_cpu, _ = await asyncio.to_thread(server_figures, client)
        client.close()
        await asyncio.to_thread(other.shutdown, False)
        server.start()
        await asyncio.to_thread(server.wait_ready)
        client = server.admin()
        began = time.perf_counter()
        await asyncio.to_thread(populate, client, keys, records[:workers])
        populate_seconds = time.perf_counter() - began
        cost = await asyncio.to_thread(snapshot_cost, server, keys, repeats)
        children = [
            spawn(
                "--subscriber-child",
                server.url,
                namespace,
                str(subscriptions),
                str(connect_timeout),
                str(converge),
            )
            for _ in range(processes)
        ]
        tell(children, str(workers))
        initial = [await read_json(child) for child in children]
        figures: dict[str, Any] = {}
        for herd in HERDS:
            samples: list[tuple[float, float]] = []
            load = loadavg()
            if herd == "blip":
                tell(children, blip)
                cpu, sent = await asyncio.to_thread(server_figures, client)
                sampler = asyncio.create_task(sample(server, samples))
                # One write: no subscription hears the new worker live.
                pipe = client.pipeline(transaction=False)
                pipe.client_kill_filter(_type="pubsub")
                pipe.evalsha(
                    client.script_load(PUBLISH), len(keys.keys), *keys.keys,
                    keys.channel, uuid.uuid4().hex, idle_expiry_ms(LEASE_MS / 1000),
                    DEFAULT_CHANGE_LOG, "worker-added", blip, payload(records[workers]),
                    LEASE_MS,
                )  # fmt: skip
                start = time.time()
                await asyncio.to_thread(pipe.execute)
                truth = workers + 1
            else:
                tell(children, restart)
                client.close()
                stopped = time.time()
                await asyncio.to_thread(server.shutdown, False)
                shutil.copy(other.data, server.data)
                server.start()
                sampler = asyncio.create_task(sample(server, samples))
                await asyncio.to_thread(server.wait_ready)
                start = time.time()
                client = server.admin()
                # A new process: its counts start at 0, its CPU at loading.
                cpu, sent = load_cpu, 0
                figures["restart_down_seconds"] = round(start - stopped, 3)
                figures["restart_load_cpu_seconds"] = round(load_cpu, 3)
                truth = workers + 2
            results = [await read_json(child) for child in children]
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            cpu_after, sent_after = await asyncio.to_thread(server_figures, client)
            figures[herd] = herd_figures(
                results, truth, start, samples, cpu_after - cpu,
                sent_after - sent, cost["bytes"],
            )  # fmt: skip
            figures[herd]["loadavg_before"] = load
        tell(children, "")
        stored = client.hlen(keys.workers)
        client.close()
    finally:
        for child in children:
            child.kill()
            child.wait()
        server.stop()
        other.stop()
    return {
        "workers": workers,
        "processes": processes,
        "subscriptions_per_process": subscriptions,
        "herd": processes * subscriptions,
        "connections": 2 * processes * subscriptions,
        "connect_timeout": connect_timeout,
        "populate_seconds": round(populate_seconds, 2),
        "snapshot": cost,
        "initial_snapshot_seconds_max": round(
            max(r["initial_seconds"] for r in initial), 2
        ),
        **figures,
        "stored_after": stored,
    }


def markdown(report: dict[str, Any]) -> list[str]:
    """A result file as a Markdown table: one row per run (W, herd) and herd."""
    lines = [
        "| workers (W) | herd (P x S) | snapshot | server CPU per snapshot "
        "| client: fetch / first decode / resync | herd | reconverged "
        "(median / last) | server CPU in the herd | server peak CPU "
        "| bytes sent per view | full snapshots / catch-ups | views equal "
        "| load average |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        shot = row["snapshot"]
        for herd in HERDS:
            figures = row[herd]
            made = figures["counts"]
            cpu = f"{figures['server_cpu_seconds'] * 1000:,.1f} ms"
            if herd == "blip" and row["restart"]["server_cpu_seconds"] > 0:
                ratio = (
                    figures["server_cpu_seconds"] / row["restart"]["server_cpu_seconds"]
                )
                cpu += f" ({ratio:.1%} of the restart's)"
            lines.append(
                f"| {row['workers']:,} | {row['processes']} x "
                f"{row['subscriptions_per_process']} | {shot['bytes'] / 1e6:.2f} MB "
                f"| {shot['server_cpu_ms']:.1f} ms "
                f"| {shot['fetch_ms']:.0f} / {shot['first_decode_ms']:.0f} / "
                f"{shot['resync_ms']:.0f} ms | {herd} "
                f"| {figures['reconverge_median_seconds']} / "
                f"{figures['reconverge_seconds']} s "
                f"| {cpu} "
                f"| {figures['server_peak_cpu_percent']:.0f}% "
                f"| {figures['herd_bytes'] / max(figures['views'], 1) / 1e6:.3f} MB "
                f"| {made.get('snapshots', '?')} / {made.get('resumes', '-')} "
                f"| {figures['views_equal_truth']} / {figures['views']} "
                f"| {figures['loadavg_before'][0]:.1f} |"
            )
    return lines


def client_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| workers (W) | hiredis | fetch and parse | first decode | resync "
        "| fetch + resync |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['records']:,} | {'yes' if row['hiredis'] else 'no'} "
            f"| {row['fetch_ms']:,.1f} ms | {row['first_decode_ms']:,.1f} ms "
            f"| {row['resync_ms']:,.1f} ms | {row['client_resync_ms']:,.1f} ms |"
        )
    return lines


def client_only(counts: list[int], repeats: int) -> list[dict[str, Any]]:
    """:func:`client_cost` at each W, each on a fresh server."""
    rows: list[dict[str, Any]] = []
    for workers in counts:
        server = Server()
        try:
            server.start()
            server.wait_ready()
            keys = Keys.of(f"storm-{uuid.uuid4().hex[:8]}")
            client = server.admin()
            populate(client, keys, [worker(index) for index in range(workers)])
            client.close()
            rows.append(asyncio.run(client_cost(server.url, keys, repeats)))
        finally:
            server.stop()
        print("\n".join(client_table(rows[-1:])[2:]), flush=True)
    return rows


def parse_run(text: str) -> tuple[int, int]:
    try:
        workers, processes = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not W:P (e.g. 10000:16): {text!r}") from None
    if workers < 1 or processes < 1:
        raise argparse.ArgumentTypeError(f"W and P must be at least 1: {text!r}")
    return workers, processes


def redis_server_version() -> str:
    with contextlib.suppress(OSError, IndexError, subprocess.CalledProcessError):
        done = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=True
        )
        return done.stdout.split("v=")[1].split()[0]
    return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs",
        nargs="+",
        type=parse_run,
        default=None,
        metavar="W:P",
        help="W workers watched by P processes, each run on fresh servers "
        f"(default {' '.join(FULL)}; --quick {' '.join(QUICK)})",
    )
    parser.add_argument(
        "--subscriptions",
        type=int,
        default=1,
        help="unshared subscriptions per process (S: each one a process's "
        "worth of connections and snapshots), default 1",
    )
    parser.add_argument(
        "--snapshots",
        type=int,
        default=None,
        help="repeats of the lone snapshot, default 20 (--quick 3); the "
        "client's figures take at most 5",
    )
    parser.add_argument(
        "--client",
        nargs="*",
        type=int,
        default=None,
        metavar="W",
        help="measure one client's snapshot only, at each W (default "
        f"{' '.join(map(str, CLIENT))}), print it and record nothing",
    )
    parser.add_argument("--quick", action="store_true", help="small W and P")
    parser.add_argument("--out", type=Path, default=None, help="write DIR/...json")
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        metavar="FILE",
        help="print a result file as a Markdown table, and run nothing",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=30.0,
        help="the subscribers' connect_timeout, which bounds each snapshot's "
        "transfer and parse: default 30 (RedisDiscovery's own 5 can be too "
        "short for 100,000 records on a loaded machine)",
    )
    parser.add_argument(
        "--converge",
        type=float,
        default=CONVERGE,
        help=f"seconds each view has to reconverge, default {CONVERGE:g}",
    )
    parser.add_argument("--subscriber-child", nargs=5, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.render is not None:
        print("\n".join(markdown(json.loads(arguments.render.read_text()))))
        return 0
    # Every reconnect is logged as a warning: expected here, by the hundred.
    logging.getLogger("wool_pooling").setLevel(logging.ERROR)
    if arguments.subscriber_child:
        url, namespace, subscriptions, timeout, converge = arguments.subscriber_child
        asyncio.run(
            subscriber_process(
                url, namespace, int(subscriptions), float(timeout), float(converge)
            )
        )
        return 0
    repeats = arguments.snapshots or (3 if arguments.quick else 20)
    if arguments.client is not None:
        print(
            f"one client's snapshot; load average {loadavg()}\n"
            + "\n".join(client_table([])),
            flush=True,
        )
        client_only(arguments.client or CLIENT, min(5, repeats))
        return 0
    if arguments.subscriptions < 1:
        parser.error("--subscriptions must be at least 1")
    runs = arguments.runs or [
        parse_run(text) for text in (QUICK if arguments.quick else FULL)
    ]
    out = _results.folder(arguments.out, arguments.quick)
    load = loadavg()
    began = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for workers, processes in runs:
        row = asyncio.run(
            storm(
                workers,
                processes,
                arguments.subscriptions,
                repeats,
                arguments.connect_timeout,
                arguments.converge,
            )
        )
        rows.append(row)
        print(
            f"W={workers:,} herd={row['herd']}: snapshot "
            f"{row['snapshot']['bytes']:,} B, {row['snapshot']['server_cpu_ms']} ms "
            f"server CPU, client {row['snapshot']['client_resync_ms']} ms to fetch "
            "and resync; "
            + "; ".join(
                f"{herd}: reconverged in {row[herd]['reconverge_seconds']} s, "
                f"{row[herd]['server_cpu_seconds']} s server CPU, "
                f"{row[herd]['views_equal_truth']}/{row[herd]['views']} views equal"
                for herd in HERDS
            ),
            flush=True,
        )
    meta = _results.meta(arguments.quick, time.perf_counter() - began)
    meta.update(
        redis_server=redis_server_version(),
        redis_py=redis.__version__,
        hiredis=redis.utils.HIREDIS_AVAILABLE,
        restart="data lost: a data file of the same records published again "
        "(another epoch), one more worker",
        reconnect=repr(DEFAULT_RECONNECT),
        loadavg_before=load,
        loadavg_after=loadavg(),
    )
    path = out / f"storm_redis-{_results.interpreter()}.json"
    report = {"meta": meta, "rows": rows}
    path.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(markdown(report)), flush=True)
    ok = all(
        row[herd]["views_equal_truth"] == row[herd]["views"]
        and row[herd]["duplicates"] == 0
        and row[herd]["unknown_drops_or_updates"] == 0
        for row in rows
        for herd in HERDS
    )
    print(f"storm_redis: {'OK' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
