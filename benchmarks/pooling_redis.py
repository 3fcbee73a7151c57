"""RedisDiscovery pooled vs unpooled: connections, convergence time, idle CPU.

Run it with ``python benchmarks/pooling_redis.py`` (needs the ``redis`` extra
and ``redis-server`` on ``PATH``, or ``--url``). For each K (``--consumers``),
K concurrent consumers of one namespace's discovery run in this process,
once pooled (``RedisDiscovery(...)``: one shared subscription) and once
unpooled (``shared=False``: each consumer its own, as a discovery written
without this library). Reported per row:

- connections: the namespace's subscriber connections on the server
  (``CLIENT LIST``, by name: the pub/sub ones, plus the command ones that
  take snapshots and reap leases);
- ready: seconds from starting the K consumers to all having the snapshot;
- convergence: median seconds from a publish to all K consumers having the
  new worker (``--rounds`` publishes);
- idle CPU: this process's CPU time, and the server's (``INFO cpu``), over
  ``--idle`` seconds with nothing published, in % of one core.

Standalone: it starts its own ``redis-server`` on a free loopback port
(persistence off) unless ``--url`` is given. It prints the table and writes
the figures, with the run's setup, to ``pooling_redis-<interpreter>.json``
in ``--out DIR`` (default: ``benchmarks/results``; with ``--quick``, a
temporary folder), which ``benchmarks/report.py`` renders. The machine may
be shared: read the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _results
import redis
from wool import WorkerMetadata

from wool_pooling.redis import RedisDiscovery


@contextmanager
def redis_server() -> Iterator[str]:
    executable = shutil.which("redis-server")
    if executable is None:
        sys.exit(
            "redis-server is not on PATH (apt-get install -y redis-server), "
            "or pass --url"
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = tempfile.mkdtemp(prefix="redis-bench-")
    process = subprocess.Popen(
        [executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", directory, "--maxclients", "10000"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        client.close()
        process.terminate()
        process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def worker(port: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.uuid4(), address=f"127.0.0.1:{port}", pid=0, version="bench"
    )


class Consumers:
    """K consumers; counts how many have seen each worker."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.seen: dict[uuid.UUID, int] = {}
        self.waiting: dict[uuid.UUID, asyncio.Event] = {}

    async def consume(self, subscription: Any) -> None:
        async for event in subscription:
            uid = event.metadata.uid
            if event.type == "worker-added":
                count = self.seen[uid] = self.seen.get(uid, 0) + 1
                if count == self.k and uid in self.waiting:
                    self.waiting[uid].set()

    async def everyone_has(self, uid: uuid.UUID) -> None:
        event = self.waiting.setdefault(uid, asyncio.Event())
        if self.seen.get(uid, 0) == self.k:
            return
        await asyncio.wait_for(event.wait(), 120)


def server_connections(client: Any, namespace: str) -> int:
    prefixes = (
        f"wool-pooling:subscriber:{namespace}:",
        f"wool-pooling:subscriber-cmd:{namespace}:",
    )
    return sum(1 for c in client.client_list() if c["name"].startswith(prefixes))


def server_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def measure(
    url: str, k: int, shared: bool, rounds: int, idle: float
) -> dict[str, Any]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    discovery = RedisDiscovery(url, namespace, shared=shared)
    admin = redis.Redis.from_url(url)
    consumers = Consumers(k)
    async with discovery.publisher as publisher:
        first = worker(1)
        await publisher.publish("worker-added", first)
        started = time.perf_counter()
        tasks = [
            asyncio.create_task(consumers.consume(discovery.subscribe()))
            for _ in range(k)
        ]
        await consumers.everyone_has(first.uid)
        ready = time.perf_counter() - started
        connections = server_connections(admin, namespace)
        times = []
        for round_ in range(rounds):
            new = worker(100 + round_)
            started = time.perf_counter()
            await publisher.publish("worker-added", new)
            await consumers.everyone_has(new.uid)
            times.append(time.perf_counter() - started)
        cpu, server = time.process_time(), server_cpu(admin)
        await asyncio.sleep(idle)
        own_cpu = (time.process_time() - cpu) / idle * 100
        server_idle = (server_cpu(admin) - server) / idle * 100
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    admin.close()
    return {
        "consumers": k,
        "pooled": shared,
        "connections": connections,
        "ready_s": ready,
        "convergence_ms": statistics.median(times) * 1000,
        "idle_cpu_pct": own_cpu,
        "server_idle_cpu_pct": server_idle,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| K consumers | connections pooled / unpooled | ready (s) pooled / unpooled "
        "| convergence (ms) pooled / unpooled | idle CPU, this process (%) "
        "| idle CPU, server (%) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    by_k: dict[int, dict[bool, dict[str, Any]]] = {}
    for row in rows:
        by_k.setdefault(row["consumers"], {})[row["pooled"]] = row
    for k, pair in sorted(by_k.items()):
        p, u = pair[True], pair[False]
        lines.append(
            f"| {k} | {p['connections']} / {u['connections']} "
            f"| {p['ready_s']:.3f} / {u['ready_s']:.3f} "
            f"| {p['convergence_ms']:.2f} / {u['convergence_ms']:.2f} "
            f"| {p['idle_cpu_pct']:.2f} / {u['idle_cpu_pct']:.2f} "
            f"| {p['server_idle_cpu_pct']:.2f} / {u['server_idle_cpu_pct']:.2f} |"
        )
    return "\n".join(lines)


async def run(
    url: str, ks: list[int], rounds: int, idle: float
) -> list[dict[str, Any]]:
    rows = []
    for k in ks:
        for shared in (True, False):
            row = await measure(url, k, shared, rounds, idle)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def server_version(url: str) -> str:
    client = redis.Redis.from_url(url)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/pooling_redis.py",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--url", help="a Redis server (default: start one)")
    parser.add_argument(
        "--consumers",
        type=int,
        nargs="+",
        help="the K values (default: 1 10 50 200; --quick: 1 3)",
    )
    parser.add_argument(
        "--rounds", type=int, help="publishes per row (default 5; --quick: 1)"
    )
    parser.add_argument(
        "--idle", type=float, help="idle seconds measured (default 3; --quick: 0.1)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: tiny K, one round"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="results folder for pooling_redis-<interpreter>.json (default: "
        "benchmarks/results, or a temporary folder with --quick)",
    )
    arguments = parser.parse_args(argv)
    consumers = arguments.consumers or ([1, 3] if arguments.quick else [1, 10, 50, 200])
    rounds = arguments.rounds or (1 if arguments.quick else 5)
    idle = (
        arguments.idle
        if arguments.idle is not None
        else (0.1 if arguments.quick else 3.0)
    )
    out = _results.folder(arguments.out, arguments.quick)
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        url = arguments.url or stack.enter_context(redis_server())
        rows = asyncio.run(run(url, consumers, rounds, idle))
        version = server_version(url)
    meta = _results.meta(arguments.quick, time.perf_counter() - began)
    meta |= {
        "redis_server": version,
        "redis_py": redis.__version__,
        "rounds": rounds,
        "idle": idle,
        "consumers": consumers,
    }
    path = out / f"pooling_redis-{_results.interpreter()}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
