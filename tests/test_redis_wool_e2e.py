"""Real ``wool.WorkerPool``s discovering each other through a real Redis server.

A pool process (``redis_pool_process.py``) spawns wool workers and publishes
them through ``RedisDiscovery``; this process is the client: its pool has no
workers of its own and finds them only through Redis. wool itself is
asyncio-only, so these tests run on asyncio only; under
``WOOL_POOLING_TEST_LOOP=eager`` they use a plain loop (wool 0.15.7 fails
under the eager task factory, see ``test_wool_e2e``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import wool
from _loops import TEST_LOOP
from _loops import asyncio_options
from _redis import RedisServer
from e2e_routines import worker_pid
from redis_views import View
from redis_views import hash_content

from wool_pooling.redis import RedisDiscovery

pytestmark = [pytest.mark.wool_processes, pytest.mark.anyio]

TESTS = Path(__file__).resolve().parent
LEASE = 1.0


@pytest.fixture(params=["asyncio"])
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """Asyncio only (wool is): the loop as configured, but a plain one for
    ``eager``."""
    return ("asyncio", {} if TEST_LOOP == "eager" else asyncio_options())


@contextmanager
def pool_process(
    url: str, namespace: str, spawn: int
) -> Iterator[subprocess.Popen[bytes]]:
    """A process with a ``WorkerPool(spawn=spawn)`` on Redis; killed on exit."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), *sys.path]))
    process = subprocess.Popen(
        [
            sys.executable,
            str(TESTS / "redis_pool_process.py"),
            url,
            namespace,
            str(spawn),
            str(LEASE),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"ready\n"
        yield process
    finally:
        # The whole session: the pool process and its workers.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rsplit(b")", 1)[1].split()[1])


async def test_client_dispatches_to_a_worker_found_only_through_redis(
    redis_server: RedisServer,
) -> None:
    """Pool process spawns workers and publishes them; this process's pool has
    no workers and no other discovery, yet runs a routine on one of them."""
    namespace = f"e2e-{uuid.uuid4().hex[:12]}"
    with pool_process(redis_server.url, namespace, spawn=2) as pool:
        published = hash_content(redis_server.url, namespace)
        assert len(published) == 2
        discovery = RedisDiscovery(redis_server.url, namespace, lease=LEASE)
        with anyio.fail_after(60):
            async with wool.WorkerPool(discovery=discovery, lazy=False):
                pid = await worker_pid()
        assert pid in {worker.pid for worker in published.values()}
        assert pid != os.getpid()
        assert parent_of(pid) == pool.pid


async def test_a_sigkilled_worker_leaves_every_view_within_the_lease(
    redis_server: RedisServer,
) -> None:
    """SIGKILL one wool worker process (no drop published): its pool stops
    renewing its lease and every consumer drops it; then SIGKILL the pool
    process itself: the other worker goes the same way."""
    namespace = f"e2e-{uuid.uuid4().hex[:12]}"
    with pool_process(redis_server.url, namespace, spawn=2) as pool:
        workers = list(hash_content(redis_server.url, namespace).values())
        discovery = RedisDiscovery(redis_server.url, namespace, lease=LEASE)
        views = [View() for _ in range(3)]
        async with anyio.create_task_group() as tg:
            for view in views:
                tg.start_soon(view.consume, discovery.subscribe())
            for view in views:
                await view.has(*(worker.uid for worker in workers))
            os.kill(workers[0].pid, signal.SIGKILL)
            killed = time.monotonic()
            for view in views:
                await view.has(workers[1].uid)
            first = time.monotonic() - killed
            os.kill(pool.pid, signal.SIGKILL)
            killed = time.monotonic()
            for view in views:
                await view.has()
            second = time.monotonic() - killed
            tg.cancel_scope.cancel()
        # One lease and one reap interval, plus slack for this shared machine.
        assert first < LEASE + LEASE / 4 + 5
        assert second < LEASE + LEASE / 4 + 5
        assert hash_content(redis_server.url, namespace) == {}
