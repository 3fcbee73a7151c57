"""Two ``wool.WorkerPool``s, in two processes, discovering each other through Redis.

Run it with ``python examples/redis_discovery.py`` (needs
``pip install "wool-pooling[redis]"``). Without ``--url`` it starts a
``redis-server`` (from ``PATH``) on a free loopback port, with persistence
off, and stops it at the end; ``--url redis://host:6379/0`` uses yours, and
the script deletes the keys of the namespace it made there (its own
``example-<hex>`` one) once both pools have exited.

Pool A runs in this process and pool B in a child process; each spawns one
worker and publishes it through ``RedisDiscovery``. Each pool's proxy then
knows both workers, its own and the other process's, found only through
Redis: the script dispatches a routine until it has run on the workers of
both pools, and counts on the server (``CLIENT LIST``, by connection name)
the subscription connections the namespace holds: one per process.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Generator
from contextlib import contextmanager
from typing import BinaryIO

import wool

from wool_pooling.redis import RedisDiscovery

# wool logs every worker's start and stop at INFO; this example's output is
# its own lines only (worker processes re-import this module, so this
# applies to them too).
logging.getLogger("wool").setLevel(logging.WARNING)


@wool.routine
async def where_am_i() -> tuple[int, int]:
    """The worker's pid and its parent's (the process whose pool spawned it)."""
    return os.getpid(), os.getppid()


RedisReply = bytes | int | list["RedisReply"] | None


def _read_reply(replies: BinaryIO) -> RedisReply:
    """One reply of the Redis protocol (RESP2): a string, integer or array."""
    header = replies.readline()
    kind, rest = header[:1], header[1:].strip()
    if kind == b"-":
        raise RuntimeError(f"redis: {rest.decode()}")
    if kind == b":":
        return int(rest)
    if kind == b"$":
        if int(rest) < 0:
            return None
        payload = replies.read(int(rest) + 2)[:-2]
        return payload
    if kind == b"*":
        return [_read_reply(replies) for _ in range(max(int(rest), 0))]
    return rest  # a simple string: +OK, +PONG


def redis_command(url: str, *words: str) -> RedisReply:
    """Send one command to the server at ``url`` and return its reply (enough
    of the Redis protocol for ``PING``, ``CLIENT LIST``, ``SCAN`` and ``DEL``)."""
    parts = urllib.parse.urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 6379)
    database = parts.path.strip("/") or "0"
    commands = [("SELECT", database), words]
    if parts.password:
        commands.insert(0, ("AUTH", *filter(None, [parts.username, parts.password])))
    with socket.create_connection(address, timeout=5) as connection:
        replies = connection.makefile("rb")
        reply: RedisReply = None
        for command in commands:
            request = f"*{len(command)}\r\n" + "".join(
                f"${len(word.encode())}\r\n{word}\r\n" for word in command
            )
            connection.sendall(request.encode())
            reply = _read_reply(replies)
        return reply


def delete_namespace(url: str, namespace: str) -> int:
    """Delete the keys ``RedisDiscovery`` keeps for ``namespace`` (all named
    ``wool:{<namespace>}:...``); return how many there were."""
    pattern = "wool:{" + namespace + "}:*"
    keys: list[str] = []
    cursor = "0"
    while True:
        reply = redis_command(url, "SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
        assert isinstance(reply, list)
        assert isinstance(reply[0], bytes)
        batch = reply[1]
        assert isinstance(batch, list)
        keys += [key.decode() for key in batch if isinstance(key, bytes)]
        cursor = reply[0].decode()
        if cursor == "0":
            break
    if keys:
        redis_command(url, "DEL", *keys)
    return len(keys)


@contextmanager
def local_redis_server() -> Generator[str]:
    """A throwaway ``redis-server`` on a free loopback port; yields its URL."""
    executable = shutil.which("redis-server")
    if executable is None:
        sys.exit(
            "redis-server is not on PATH: install it (Debian/Ubuntu: "
            "apt-get install -y redis-server; macOS: brew install redis) "
            "or pass --url redis://host:port/0"
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = tempfile.mkdtemp(prefix="redis-example-")
    server = subprocess.Popen(
        [executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", directory],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis_command(url, "PING")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        print(f"started redis-server on 127.0.0.1:{port} (no --url given)")
        yield url
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)


def subscription_connections(url: str, namespace: str) -> tuple[int, int]:
    """(subscription connections, distinct processes holding them), by name."""
    prefix = f"wool-pooling:subscriber:{namespace}:"
    clients = redis_command(url, "CLIENT", "LIST")
    assert isinstance(clients, bytes)
    names = [
        field.removeprefix("name=")
        for line in clients.decode().splitlines()
        for field in line.split()
        if field.startswith(f"name={prefix}")
    ]
    return len(names), len({name.rsplit(":", 1)[1] for name in names})


async def serve(url: str, namespace: str) -> None:
    """Pool B: spawn one worker, publish it, hold the pool until stdin closes."""
    async with wool.WorkerPool(
        spawn=1, discovery=RedisDiscovery(url, namespace), lazy=False
    ):
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def main(url: str) -> None:
    namespace = f"example-{uuid.uuid4().hex[:8]}"
    discovery = RedisDiscovery(url, namespace)
    pool_b = subprocess.Popen(  # noqa: ASYNC220 - starts it; the wait is threaded
        [sys.executable, __file__, "--serve", url, namespace],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert pool_b.stdout is not None
        line = await asyncio.get_running_loop().run_in_executor(
            None, pool_b.stdout.readline
        )
        if line != b"ready\n":
            raise SystemExit("pool B did not start")
        print(
            f"pool A (pid {os.getpid()}) and pool B (pid {pool_b.pid}): one namespace"
        )
        async with wool.WorkerPool(spawn=1, discovery=discovery, lazy=False):
            # Both workers known to this process (this consumer shares the
            # proxy's one subscription: no extra connection).
            known: set[uuid.UUID] = set()
            async with asyncio.timeout(30):
                async for event in discovery.subscribe():
                    if event.type == "worker-added":
                        known.add(event.metadata.uid)
                    if len(known) == 2:
                        break
            print("pool A's proxy knows 2 workers: its own and pool B's")
            owners: dict[int, int] = {}
            for _ in range(100):
                pid, parent = await where_am_i()
                owners[parent] = pid
                if len(owners) == 2:
                    break
            print(
                "where_am_i() ran on pool A's worker and on pool B's worker: "
                f"{sorted(owners) == sorted([os.getpid(), pool_b.pid])}"
            )
            count, processes = subscription_connections(url, namespace)
            print(
                f"subscription connections for the namespace: {count}, from "
                f"{processes} processes (the pools, and the workers the routine's "
                "proxy was shipped to)"
            )
    finally:
        try:
            pool_b.communicate(timeout=60)  # closes its stdin: pool B exits
        finally:
            # Both pools are gone: leave nothing of the namespace on the server.
            delete_namespace(url, namespace)


def _cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", help="a Redis server (default: start one)")
    parser.add_argument(
        "--serve", nargs=2, metavar=("URL", "NAMESPACE"), help=argparse.SUPPRESS
    )
    arguments = parser.parse_args()
    if arguments.serve:
        asyncio.run(serve(*arguments.serve))
    elif arguments.url:
        asyncio.run(main(arguments.url))
    else:
        with local_redis_server() as url:
            asyncio.run(main(url))


if __name__ == "__main__":  # worker processes re-import this file: guard the run
    _cli()
