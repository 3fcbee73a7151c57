"""A ``wool.WorkerPool`` on ``SharedDiscovery(RedisDiscovery(..., key_prefix=...))``.

wool ships the pool's discovery to every worker process: a routine that
dispatches another from inside a worker finds its peers through the copy
the worker received. That copy must watch the same keys as the original:
under the discovery's key prefix, with its client options. wool is
asyncio-only, so this module runs on asyncio only (on a plain loop under
``WOOL_POOLING_TEST_LOOP=eager``, see ``test_wool_e2e``).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import anyio
import pytest
import wool
from _loops import TEST_LOOP
from _loops import asyncio_options
from _redis import RedisServer
from e2e_routines import nested_add
from redis_views import admin
from wool import WorkerMetadata
from wool import protocol

from wool_pooling import SharedDiscovery
from wool_pooling.redis import RedisDiscovery

pytestmark = [pytest.mark.wool_processes, pytest.mark.anyio]

#: Bound on the whole pool's life in a test (workers spawn as processes).
DEADLINE = 90
#: Bound on the nested dispatch, once the pool is up.
DISPATCH = 30
LEASE = 2.0
PREFIX = "app:"


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """wool is asyncio-only: asyncio, as configured (a plain loop for eager)."""
    return ("asyncio", {} if TEST_LOOP == "eager" else asyncio_options())


def keys_of(url: str, namespace: str) -> set[str]:
    """Every key on the server that names ``namespace`` (its hash tag)."""
    client = admin(url)
    try:
        return {key.decode() for key in client.keys(f"*{{{namespace}}}*")}
    finally:
        client.close()


def workers_under(url: str, prefix: str, namespace: str) -> dict[uuid.UUID, int]:
    """uid -> pid of the workers recorded under ``prefix``."""
    client = admin(url)
    try:
        records = client.hgetall(f"{prefix}{{{namespace}}}:workers")
    finally:
        client.close()
    workers = (
        WorkerMetadata.from_protobuf(protocol.WorkerMetadata.FromString(payload))
        for payload in records.values()
    )
    return {worker.uid: worker.pid for worker in workers}


async def test_a_worker_dispatches_through_the_shipped_discovery_under_its_key_prefix(
    redis_server: RedisServer,
) -> None:
    """A pool on ``SharedDiscovery(RedisDiscovery(..., key_prefix="app:"))``
    runs a routine that dispatches another from inside its worker (through
    the discovery copy the worker received), and every key of the namespace
    lives under ``app:``, none under the default ``wool:``."""
    namespace = f"e2e-{uuid.uuid4().hex[:12]}"
    discovery = SharedDiscovery(
        RedisDiscovery(
            redis_server.url,
            namespace,
            lease=LEASE,
            key_prefix=PREFIX,
            client_options={"health_check_interval": 5},
        )
    )
    with anyio.fail_after(DEADLINE):
        async with wool.WorkerPool(spawn=2, discovery=discovery):
            with anyio.move_on_after(DISPATCH) as dispatch:
                total, pid = await nested_add(1, 2)
            pids = set(workers_under(redis_server.url, PREFIX, namespace).values())
            keys = keys_of(redis_server.url, namespace)
    assert not dispatch.cancelled_caught, (
        f"no answer within {DISPATCH}s: the worker's copy of the discovery "
        f"found no worker (the namespace's keys: {sorted(keys)})"
    )
    assert total == 3
    assert len(pids) == 2
    assert pid in pids
    assert pid != os.getpid()
    base = f"{PREFIX}{{{namespace}}}"
    assert keys == {
        f"{base}:{name}"
        for name in ("workers", "leases", "version", "epoch", "changes")
    }
