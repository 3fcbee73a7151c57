"""The restart herd of ``RedisDiscovery``: every subscriber snapshots at once.

Run from the repository root (needs the ``redis`` extra and ``redis-server``
on ``PATH``)::

    python benchmarks/storm_redis.py                  # W:P = 1000:16 10000:16 100000:4
    python benchmarks/storm_redis.py --quick          # W:P = 200:4 2000:4
    python benchmarks/storm_redis.py --runs 10000:8 --subscriptions 2

For each run ``W:P`` it starts its own ``redis-server`` with persistence
(an RDB file written on ``SHUTDOWN SAVE`` and loaded on start, nothing
saved periodically), so the W records survive the restart and the herd is
the worst case: P x S snapshots of all W records at once. (Without
persistence the snapshots after a restart are empty; the load moves to the
publishers, which add their workers again, each add announced to every
subscriber.)

1. W workers are recorded through the publisher's own Lua script, in a
   pipeline (as W publishers would, with a lease of a day: nothing expires
   during the run).
2. The cost of one snapshot against W: the subscriber's snapshot script,
   run alone ``--snapshots`` times: its wall time, the server's CPU time
   (from ``/proc/<pid>/stat``), the reply's bytes, the time a client
   takes to decode it into ``WorkerMetadata``, and the time a subscription
   that knows every record takes to apply it again (a resync: its
   process's CPU, its event loop held).
3. P subscriber processes start, each iterating ``--subscriptions`` (S)
   subscriptions of one ``RedisDiscovery(..., shared=False)``: every
   iteration has its own connections and takes its own snapshot, as S
   processes would. Each keeps a view (the set of workers its events
   make). The reconnect policy is the default one.
4. One more worker is recorded without an announcement (as if it was
   announced while every subscriber was away), then the server is stopped
   (``SHUTDOWN SAVE``) and started again on the same port and file. A view
   equals the truth (W + 1 workers) only once its subscription has taken a
   snapshot after the restart: the time from the server answering again to
   the last view equal to the truth is the reconvergence. During it the
   server's CPU is sampled every 0.1 s; its peak (percent of one core), its
   CPU seconds and the bytes it sent (``INFO stats``) are recorded.

Every view must end equal to the truth, with no duplicate add and no
unknown drop: the script exits 1 otherwise. A full run records
``benchmarks/results/storm_redis-<interpreter>.json`` (with the load
average: the figures depend on what else the machine runs); ``--quick``
writes into a temporary folder; ``--out DIR`` into DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
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
from wool import DiscoveryEvent
from wool import WorkerMetadata
from wool import protocol

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

FULL = ["1000:16", "10000:16", "100000:4"]
QUICK = ["200:4", "2000:4"]


def worker(index: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.uuid4(),
        address=f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}:50051",
        pid=10_000 + index,
        version="0.15.0",
    )


def payload(metadata: WorkerMetadata) -> bytes:
    return metadata.to_protobuf().SerializeToString()


def decoded(flat: list[bytes]) -> int:
    """Decode a snapshot's records as a subscriber does; how many."""
    for index in range(1, len(flat), 2):
        WorkerMetadata.from_protobuf(protocol.WorkerMetadata.FromString(flat[index]))
    return len(flat) // 2


def resp_bytes(reply: Any) -> int:
    """The size of ``reply`` on the wire (RESP2), as the server sent it."""
    if isinstance(reply, int):
        return len(f":{reply}\r\n")
    if isinstance(reply, bytes):
        return len(f"${len(reply)}\r\n") + len(reply) + 2
    assert isinstance(reply, list)
    return len(f"*{len(reply)}\r\n") + sum(resp_bytes(item) for item in reply)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]


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


async def subscriber_process(
    url: str,
    namespace: str,
    subscriptions: int,
    connect_timeout: float,
    converge: float,
) -> None:
    loop = asyncio.get_running_loop()
    source = RedisDiscovery(
        url, namespace, shared=False, connect_timeout=connect_timeout
    )
    views = [View() for _ in range(subscriptions)]
    marker: list[str] = []
    #: Wall-clock time each view came to equal the truth after the restart.
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

    line = await loop.run_in_executor(None, sys.stdin.readline)
    expected = int(line)
    began = time.monotonic()
    # One subscription at a time, each waiting for its first snapshot: the
    # start is no herd (only the restart is measured).
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
    marker.append((await loop.run_in_executor(None, sys.stdin.readline)).strip())
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(converge):
            while None in converged and not any(task.done() for task in tasks):
                progress.clear()
                await progress.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(
        json.dumps(
            {
                "converged_at": converged,
                "sizes": [len(view.workers) for view in views],
                "duplicates": sum(view.duplicates for view in views),
                "unknown": sum(view.unknown for view in views),
                "reconnects": source.statistics().reconnects,
            }
        ),
        flush=True,
    )


# -- the parent --


class Server:
    """A ``redis-server`` with persistence: ``SHUTDOWN SAVE``, then restart."""

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

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.executable, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.directory,
             "--dbfilename", "storm.rdb", "--maxclients", "10000"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def wait_ready(self) -> None:
        """Return once the server answers ``PING`` (its RDB file loaded).

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

    def shutdown_save(self) -> None:
        """``SHUTDOWN SAVE``, then wait for the process to exit.

        Sent on a plain socket: redis-py retries a command whose connection
        closes, which would add its backoff to the measured downtime.
        """
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as sock:
            sock.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$4\r\nSAVE\r\n")
            while sock.recv(1024):
                pass
        assert self.process is not None
        self.process.wait(60)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            process.wait(10)

    def admin(self) -> Any:
        return redis.Redis(port=self.port, socket_timeout=60)


def cpu_ticks(pid: int) -> int:
    """The process's user + system CPU time, in clock ticks."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def sent_bytes(client: Any) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def populate(client: Any, keys: Keys, count: int) -> list[str]:
    """Record ``count`` workers through the publisher's script; their uids."""
    sha = client.script_load(PUBLISH)
    epoch = uuid.uuid4().hex
    uids: list[str] = []
    for start in range(0, count, 1000):
        pipe = client.pipeline(transaction=False)
        for index in range(start, min(count, start + 1000)):
            metadata = worker(index)
            uids.append(str(metadata.uid))
            pipe.evalsha(
                sha, len(keys.keys), *keys.keys, keys.channel, epoch,
                idle_expiry_ms(LEASE_MS / 1000), DEFAULT_CHANGE_LOG,
                "worker-added", uids[-1], payload(metadata), LEASE_MS,
            )  # fmt: skip
        pipe.execute()
    return uids


def snapshot_cost(server: Server, keys: Keys, count: int) -> dict[str, Any]:
    """One snapshot, run alone ``count`` times: its reply's bytes, its wall
    time (fetched and parsed by redis-py), the server's CPU time per
    snapshot (``/proc``: the script and writing the reply), the script's own
    time (``INFO commandstats``), the time to decode its records, and the
    time a subscription that knows them all takes to apply it again."""
    client = server.admin()
    sha = client.script_load(SNAPSHOT)
    keep = idle_expiry_ms(LEASE_MS / 1000)
    arguments = [sha, len(keys.keys), *keys.keys, keys.channel, uuid.uuid4().hex, keep]
    arguments.append(DEFAULT_CHANGE_LOG)
    reply = client.evalsha(*arguments)
    wire = resp_bytes(reply)
    began = time.perf_counter()
    records = decoded(reply[2])
    decode_seconds = time.perf_counter() - began
    # A subscription that already knows every record takes a new snapshot:
    # what its process spends on it (decode, compare), its loop held.
    state = SubscriptionState(1.0, lambda uid, error: None)
    state.snapshot(int(reply[0]), reply[1], reply[2], now=0.0)
    began = time.perf_counter()
    state.snapshot(int(reply[0]), reply[1], reply[2], now=0.0)
    resync_seconds = time.perf_counter() - began
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
    return {
        "records": records,
        "bytes": wire,
        "bytes_per_record": round(wire / max(records, 1), 1),
        "wall_ms_median": round(walls[len(walls) // 2] * 1000, 3),
        "wall_ms_min": round(walls[0] * 1000, 3),
        "server_cpu_ms": round(cpu * 1000, 3),
        "script_ms": round(float(script) / 1000, 3),
        "decode_ms": round(decode_seconds * 1000, 1),
        "resync_ms": round(resync_seconds * 1000, 1),
        "repeats": count,
    }


def spawn(*arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


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


async def storm(
    workers: int,
    processes: int,
    subscriptions: int,
    repeats: int,
    connect_timeout: float,
    converge: float,
) -> dict[str, Any]:
    server = Server()
    server.start()
    await asyncio.to_thread(server.wait_ready)
    namespace = f"storm-{uuid.uuid4().hex[:8]}"
    keys = Keys.of(namespace)
    children: list[subprocess.Popen[str]] = []
    try:
        client = server.admin()
        began = time.perf_counter()
        uids = await asyncio.to_thread(populate, client, keys, workers)
        populate_seconds = time.perf_counter() - began
        cost = await asyncio.to_thread(
            snapshot_cost, server, keys, max(repeats, min(1000, 200_000 // workers))
        )
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
        for child in children:
            assert child.stdin is not None
            child.stdin.write(f"{workers}\n")
            child.stdin.flush()
        initial = [await read_json(child) for child in children]
        # A worker whose announcement every subscriber missed: only a
        # snapshot taken after the restart shows it.
        marker = worker(workers)
        pipe = client.pipeline(transaction=True)
        pipe.hset(keys.workers, str(marker.uid), payload(marker))
        pipe.zadd(keys.leases, {str(marker.uid): time.time() * 1000 + LEASE_MS})
        pipe.incr(keys.version)
        pipe.execute()
        client.close()
        truth = set(uids) | {str(marker.uid)}
        for child in children:
            assert child.stdin is not None
            child.stdin.write(f"{marker.uid}\n")
            child.stdin.flush()
        samples: list[tuple[float, float]] = []
        load = os.getloadavg()
        stopped = time.time()
        await asyncio.to_thread(server.shutdown_save)
        down = time.time()
        server.start()
        started = time.time()
        ticks_before = cpu_ticks(server.pid)
        sampler = asyncio.create_task(sample(server, samples))
        await asyncio.to_thread(server.wait_ready)
        ready = time.time()
        results = [await read_json(child) for child in children]
        ticks_after = cpu_ticks(server.pid)
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        admin = server.admin()
        herd_bytes = sent_bytes(admin)
        stored = admin.hlen(keys.workers)
        admin.close()
    finally:
        for child in children:
            child.kill()
            child.wait()
        server.stop()
        shutil.rmtree(server.directory, ignore_errors=True)
    times = sorted(t for r in results for t in r["converged_at"] if t is not None)
    views = sum(len(r["converged_at"]) for r in results)
    equal = sum(
        size == len(truth) and at is not None
        for r in results
        for size, at in zip(r["sizes"], r["converged_at"], strict=True)
    )
    herd = [
        cpu for at, cpu in samples if ready - PERIOD <= at <= (times or [ready])[-1]
    ]

    def after_ready(index: float) -> float | None:
        if not times:
            return None
        return round(times[min(len(times) - 1, int(index * len(times)))] - ready, 3)

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
        "loadavg_before_restart": [round(value, 2) for value in load],
        "shutdown_save_seconds": round(down - stopped, 3),
        "load_seconds": round(ready - started, 3),
        "reconverge_first_seconds": after_ready(0),
        "reconverge_median_seconds": after_ready(0.5),
        "reconverge_seconds": after_ready(1.0),
        "reconverge_from_shutdown_seconds": (
            round(times[-1] - stopped, 3) if times else None
        ),
        "server_peak_cpu_percent": round(max(herd, default=0.0), 1),
        "server_cpu_seconds": round((ticks_after - ticks_before) / TICK, 2),
        "herd_bytes": herd_bytes,
        "herd_bytes_per_snapshot": round(herd_bytes / max(views, 1)),
        # Above 1: snapshots sent to subscribers that had given up on them.
        "snapshots_sent_per_view": round(herd_bytes / max(views, 1) / cost["bytes"], 2),
        "reconnects": sum(r["reconnects"] for r in results),
        "views": views,
        "views_equal_truth": equal,
        "duplicates": sum(r["duplicates"] for r in results),
        "unknown_drops_or_updates": sum(r["unknown"] for r in results),
        "stored_after": stored,
        "cpu_samples": [
            [round(at - ready, 2), round(cpu)] for at, cpu in samples if cpu >= 1
        ],
    }


def markdown(report: dict[str, Any]) -> list[str]:
    """A result file as a Markdown table: one row per run (W, herd)."""
    lines = [
        "| workers (W) | herd (P x S) | snapshot | server CPU per snapshot "
        "| client: fetch / resync | reconverged (median / last) | server peak CPU "
        "| server CPU in the herd | bytes sent in the herd | views equal "
        "| load average |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        shot = row["snapshot"]
        lines.append(
            f"| {row['workers']:,} | {row['processes']} x "
            f"{row['subscriptions_per_process']} | {shot['bytes'] / 1e6:.2f} MB "
            f"| {shot['server_cpu_ms']:.1f} ms "
            f"| {shot['wall_ms_median']:.0f} / {shot['resync_ms']:.0f} ms "
            f"| {row['reconverge_median_seconds']} / {row['reconverge_seconds']} s "
            f"| {row['server_peak_cpu_percent']:.0f}% "
            f"| {row['server_cpu_seconds']:.2f} s | {row['herd_bytes'] / 1e6:.1f} MB "
            f"| {row['views_equal_truth']} / {row['views']} "
            f"| {row['loadavg_before_restart'][0]:.1f} |"
        )
    return lines


def parse_run(text: str) -> tuple[int, int]:
    try:
        workers, processes = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not W:P (e.g. 10000:16): {text!r}") from None
    if workers < 1 or processes < 1:
        raise argparse.ArgumentTypeError(f"W and P must be at least 1: {text!r}")
    return workers, processes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs",
        nargs="+",
        type=parse_run,
        default=None,
        metavar="W:P",
        help="W workers watched by P processes, each run on a fresh server "
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
        default=20,
        help="repeats of the lone snapshot (more for small W), default 20",
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
        "short for 100,000 records parsed without hiredis on a loaded machine)",
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
    logging.getLogger("wool_pooling.redis").setLevel(logging.ERROR)
    if arguments.subscriber_child:
        url, namespace, subscriptions, timeout, converge = arguments.subscriber_child
        asyncio.run(
            subscriber_process(
                url, namespace, int(subscriptions), float(timeout), float(converge)
            )
        )
        return 0
    if arguments.subscriptions < 1:
        parser.error("--subscriptions must be at least 1")
    runs = arguments.runs or [
        parse_run(text) for text in (QUICK if arguments.quick else FULL)
    ]
    out = _results.folder(arguments.out, arguments.quick)
    began = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for workers, processes in runs:
        row = asyncio.run(
            storm(
                workers,
                processes,
                arguments.subscriptions,
                arguments.snapshots,
                arguments.connect_timeout,
                arguments.converge,
            )
        )
        rows.append(row)
        print(
            f"W={workers:,} herd={row['herd']}: snapshot "
            f"{row['snapshot']['bytes']:,} B, {row['snapshot']['server_cpu_ms']} ms "
            f"server CPU, {row['snapshot']['resync_ms']} ms to resync; restart "
            f"{row['load_seconds']} s to load, reconverged in "
            f"{row['reconverge_seconds']} s (median {row['reconverge_median_seconds']}"
            f" s), server peak {row['server_peak_cpu_percent']}% CPU, "
            f"{row['herd_bytes']:,} B sent; {row['views_equal_truth']}/{row['views']}"
            " views equal the truth",
            flush=True,
        )
    version = "?"
    with contextlib.suppress(OSError, IndexError, subprocess.CalledProcessError):
        version = (
            subprocess.run(
                ["redis-server", "--version"],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.split("v=")[1]
            .split()[0]
        )
    meta = _results.meta(arguments.quick, time.perf_counter() - began)
    meta.update(
        redis_server=version,
        persistence="RDB on SHUTDOWN SAVE, loaded on start",
        reconnect=repr(DEFAULT_RECONNECT),
        cpus=os.cpu_count(),
        hiredis=importlib.util.find_spec("hiredis") is not None,
        loadavg_after=[round(value, 2) for value in os.getloadavg()],
    )
    path = out / f"storm_redis-{_results.interpreter()}.json"
    report = {"meta": meta, "rows": rows}
    path.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(markdown(report)), flush=True)
    ok = all(
        row["views_equal_truth"] == row["views"]
        and row["duplicates"] == 0
        and row["unknown_drops_or_updates"] == 0
        for row in rows
    )
    print(f"storm_redis: {'OK' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
