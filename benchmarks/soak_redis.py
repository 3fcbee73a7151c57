"""Fleet soak of ``RedisDiscovery``: many processes, churn, restarts, kills.

Run from the repository root (needs the ``redis`` extra and ``redis-server``
on ``PATH``)::

    python benchmarks/soak_redis.py                 # 8 x 50 consumers, 60 s
    python benchmarks/soak_redis.py --quick         # the same for 10 s
    python benchmarks/soak_redis.py --processes 4 --consumers 20 --seconds 30

It starts its own ``redis-server`` (persistence off, so a restart loses the
data), then ``--processes`` consumer processes, each with ``--consumers``
consumers of one ``RedisDiscovery`` namespace (one shared subscription per
process), and one publisher process that only adds workers. For
``--seconds``, two publishers in this process churn workers (add, update,
drop, at random), while at random moments the server is restarted or every
client connection is cut (``CLIENT KILL``), and once the publisher process
is SIGKILLed (its workers, never dropped, must leave every view when their
leases expire).

Then the churn stops, and the truth (the workers the two publishers have
published and not dropped) is sent to every consumer process, which waits
until each of its views equals it. Every event is checked as it arrives:
a ``worker-added`` for a worker the view has is a duplicate, an update or
a drop of one it does not have is a missed event. A view that differs from
the truth when the wait runs out counts its differences as missed events.
Both counts must be 0: the script exits 1 otherwise.

``--out DIR`` writes the result as ``DIR/soak_redis.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import RestartPolicy
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisDiscoveryError

#: Short leases: a killed publisher's workers leave within seconds.
LEASE = 2.0
RECONNECT = RestartPolicy(attempts=None, backoff=0.05, max_backoff=1.0, jitter=0.3)
#: Bound on the final convergence, in seconds.
CONVERGE = 60.0


def worker(port: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.uuid4(), address=f"127.0.0.1:{port}", pid=0, version="soak"
    )


def discovery(url: str, namespace: str) -> RedisDiscovery:
    return RedisDiscovery(
        url, namespace, lease=LEASE, reconnect=RECONNECT, connect_timeout=2.0
    )


# -- a consumer process --


class View:
    def __init__(self) -> None:
        self.workers: set[str] = set()
        self.duplicates = 0
        self.missed = 0
        self.events = 0

    def apply(self, event: DiscoveryEvent) -> None:
        uid = str(event.metadata.uid)
        self.events += 1
        if event.type == "worker-added":
            if uid in self.workers:
                self.duplicates += 1
            self.workers.add(uid)
        elif uid not in self.workers:
            self.missed += 1
            if event.type == "worker-updated":
                self.workers.add(uid)
        elif event.type == "worker-dropped":
            self.workers.discard(uid)


async def consumer_process(url: str, namespace: str, consumers: int) -> None:
    source = discovery(url, namespace)
    views = [View() for _ in range(consumers)]

    async def consume(view: View) -> None:
        async for event in source.subscribe():
            view.apply(event)

    tasks = [asyncio.create_task(consume(view)) for view in views]
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    line = await loop.run_in_executor(None, sys.stdin.readline)
    truth = set(json.loads(line))
    deadline = time.monotonic() + CONVERGE
    while time.monotonic() < deadline:
        if all(view.workers == truth for view in views):
            break
        await asyncio.sleep(0.05)
    failed = [task for task in tasks if task.done()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    differences = sum(len(view.workers ^ truth) for view in views)
    print(
        json.dumps(
            {
                "views": len(views),
                "equal": sum(view.workers == truth for view in views),
                "duplicates": sum(view.duplicates for view in views),
                "missed": sum(view.missed for view in views) + differences,
                "events": sum(view.events for view in views),
                "ended": len(failed),
                "reconnects": source.statistics().reconnects,
            }
        ),
        flush=True,
    )


async def publisher_process(url: str, namespace: str, count: int) -> None:
    async with discovery(url, namespace).publisher as publisher:
        for port in range(count):
            await publisher.publish("worker-added", worker(30000 + port))
        print("ready", flush=True)
        await asyncio.Event().wait()


# -- the parent --


class Server:
    def __init__(self) -> None:
        executable = shutil.which("redis-server")
        if executable is None:
            sys.exit("redis-server is not on PATH (apt-get install -y redis-server)")
        self.executable = executable
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.directory = tempfile.mkdtemp(prefix="redis-soak-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.directory,
                "--maxclients",
                "10000",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                client = redis.Redis(port=self.port, socket_timeout=1)
                client.ping()
                client.close()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            process.wait(10)

    def admin(self) -> Any:
        return redis.Redis(port=self.port, socket_timeout=2)


def spawn(*arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def churn(
    url: str,
    namespace: str,
    until: float,
    truth: dict[str, WorkerMetadata],
    counts: dict[str, int],
    rng: random.Random,
    stopped: asyncio.Event,
    release: asyncio.Event,
) -> None:
    async with discovery(url, namespace).publisher as publisher:
        mine: dict[str, WorkerMetadata] = {}
        while time.monotonic() < until:
            await asyncio.sleep(rng.uniform(0.005, 0.03))
            choice = rng.random()
            try:
                if choice < 0.45 or len(mine) < 3:
                    metadata = worker(rng.randrange(1, 20000))
                    await publisher.publish("worker-added", metadata)
                    mine[str(metadata.uid)] = truth[str(metadata.uid)] = metadata
                elif choice < 0.7:
                    uid = rng.choice(list(mine))
                    moved = WorkerMetadata(
                        uid=mine[uid].uid,
                        address=f"127.0.0.1:{rng.randrange(1, 20000)}",
                        pid=0,
                        version="soak",
                    )
                    await publisher.publish("worker-updated", moved)
                    mine[uid] = truth[uid] = moved
                else:
                    uid = rng.choice(list(mine))
                    metadata = mine.pop(uid)
                    truth.pop(uid)  # forgotten even if the drop fails
                    await publisher.publish("worker-dropped", metadata)
                counts["publishes"] += 1
            except RedisDiscoveryError:
                counts["failed_publishes"] += 1
        # Stay entered until the end (renewing): the truth must stay published.
        stopped.set()
        await release.wait()


async def chaos(
    server: Server,
    until: float,
    counts: dict[str, int],
    rng: random.Random,
    victim: subprocess.Popen[str],
    kill_at: float,
) -> None:
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        if victim.poll() is None and time.monotonic() >= kill_at:
            victim.send_signal(signal.SIGKILL)
            counts["sigkilled"] += 1
            continue
        if time.monotonic() >= until:
            break
        if rng.random() < 0.4:
            await asyncio.to_thread(server.stop)
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            await asyncio.to_thread(server.start)
            counts["restarts"] += 1
        else:
            client = server.admin()
            try:
                kind = rng.choice(["pubsub", "normal"])
                counts["client_kills"] += int(client.client_kill_filter(_type=kind))
                counts["client_kill_rounds"] += 1
            except redis.RedisError:
                pass
            finally:
                client.close()


async def parent(arguments: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(arguments.seed)
    server = Server()
    server.start()
    namespace = f"soak-{uuid.uuid4().hex[:8]}"
    counts = dict.fromkeys(
        (
            "publishes",
            "failed_publishes",
            "restarts",
            "client_kills",
            "client_kill_rounds",
            "sigkilled",
        ),
        0,
    )
    children: list[subprocess.Popen[str]] = []
    started = time.monotonic()
    try:
        victim = spawn("--publisher-child", server.url, namespace, "5")
        children = [
            spawn("--consumer-child", server.url, namespace, str(arguments.consumers))
            for _ in range(arguments.processes)
        ]
        for child in (victim, *children):
            assert child.stdout is not None
            line = await asyncio.to_thread(child.stdout.readline)
            if line.strip() != "ready":
                raise RuntimeError(f"a child did not start: {line!r}")
        truth: dict[str, WorkerMetadata] = {}
        until = time.monotonic() + arguments.seconds
        kill_at = time.monotonic() + rng.uniform(0.2, 0.6) * arguments.seconds
        stopped = [asyncio.Event() for _ in range(2)]
        release = asyncio.Event()
        publishers = [
            asyncio.create_task(
                churn(server.url, namespace, until, truth, counts, rng, each, release)
            )
            for each in stopped
        ]
        await chaos(server, until, counts, rng, victim, kill_at)
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            counts["sigkilled"] += 1
        for each in stopped:
            await each.wait()
        # Orphans (an add that reached the server but whose reply was lost,
        # the killed publisher's workers) leave when their leases expire.
        deadline = time.monotonic() + CONVERGE
        while time.monotonic() < deadline:
            client = server.admin()
            stored = {
                uid.decode() for uid in client.hkeys(f"wool:{{{namespace}}}:workers")
            }
            client.close()
            if stored == set(truth):
                break
            await asyncio.sleep(0.1)
        line = json.dumps(sorted(truth)) + "\n"
        results = []
        for child in children:
            assert child.stdin is not None
            child.stdin.write(line)
            child.stdin.flush()
        for child in children:
            assert child.stdout is not None
            results.append(json.loads(await asyncio.to_thread(child.stdout.readline)))
        release.set()
        for task in publishers:
            await task
    finally:
        for child in children:
            child.kill()
            child.wait()
        server.stop()
        shutil.rmtree(server.directory, ignore_errors=True)
    elapsed = time.monotonic() - started
    summary = {
        "processes": arguments.processes,
        "consumers_per_process": arguments.consumers,
        "seconds": arguments.seconds,
        "elapsed_seconds": round(elapsed, 1),
        "seed": arguments.seed,
        "final_workers": len(truth),
        **counts,
        "views": sum(r["views"] for r in results),
        "views_equal_truth": sum(r["equal"] for r in results),
        "duplicates": sum(r["duplicates"] for r in results),
        "missed": sum(r["missed"] for r in results),
        "events_received": sum(r["events"] for r in results),
        "consumers_ended": sum(r["ended"] for r in results),
        "reconnects_per_process": [r["reconnects"] for r in results],
        "python": sys.version.split()[0],
    }
    ok = (
        summary["duplicates"] == 0
        and summary["missed"] == 0
        and summary["views_equal_truth"] == summary["views"]
        and summary["consumers_ended"] == 0
    )
    summary["ok"] = ok
    print(
        f"soak_redis {summary['processes']}x{summary['consumers_per_process']} "
        f"{summary['elapsed_seconds']}s: {summary['publishes']:,} publishes, "
        f"{summary['restarts']} restarts, {summary['client_kills']} connections "
        f"killed, {summary['sigkilled']} process SIGKILLed; "
        f"{summary['views_equal_truth']}/{summary['views']} views equal the truth, "
        f"{summary['duplicates']} duplicates, {summary['missed']} missed: "
        f"{'OK' if ok else 'FAILED'}"
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8, help="default 8")
    parser.add_argument(
        "--consumers", type=int, default=50, help="consumers per process, default 50"
    )
    parser.add_argument("--seconds", type=float, default=None, help="default 60")
    parser.add_argument("--quick", action="store_true", help="10 seconds")
    parser.add_argument("--seed", type=int, default=None, help="random seed")
    parser.add_argument("--out", default=None, help="write DIR/soak_redis.json")
    parser.add_argument("--consumer-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--publisher-child", nargs=3, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    # Every reconnect is logged as a warning: expected here, by the hundred.
    logging.getLogger("wool_pooling.redis").setLevel(logging.ERROR)
    if arguments.consumer_child:
        url, namespace, consumers = arguments.consumer_child
        asyncio.run(consumer_process(url, namespace, int(consumers)))
        return 0
    if arguments.publisher_child:
        url, namespace, count = arguments.publisher_child
        asyncio.run(publisher_process(url, namespace, int(count)))
        return 0
    if arguments.seconds is None:
        arguments.seconds = 10.0 if arguments.quick else 60.0
    if arguments.seed is None:
        arguments.seed = int.from_bytes(os.urandom(4), "big")
    summary = asyncio.run(parent(arguments))
    if arguments.out is not None:
        out = Path(arguments.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "soak_redis.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
