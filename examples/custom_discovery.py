"""A custom wool discovery whose subscriber is shared with ``@shared_subscription``.

Run it with ``python examples/custom_discovery.py``.

``DirectoryDiscovery`` keeps one file per worker in a directory: its
publisher writes and deletes the files, its subscriber polls the directory
and reports what changed. The subscriber class is decorated with
``@shared_subscription``, so however many proxies subscribe in a process,
the directory is watched once there, and a proxy that subscribes late first
gets the workers already known.

Two ``wool.WorkerPool``s use the discovery in this process. Each spawns one
worker, publishes it, and builds its proxy eagerly, so both subscribe: the
script prints the pool statistics (one entry, two consumers) and how many raw
subscribers were built (one). Then it dispatches a routine that dispatches
another one from inside a worker: wool ships the proxy, subscription
included, into the worker process, where it joins that process's pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import uuid
from collections.abc import AsyncIterator
from collections.abc import Callable
from pathlib import Path

import anyio
import wool
from wool import DiscoveryEvent
from wool import DiscoverySubscriberLike
from wool import WorkerMetadata
from wool import protocol

from wool_pooling import afilter
from wool_pooling import current_pool
from wool_pooling import shared_subscription

SUFFIX = ".worker"

# wool's worker processes log their start and stop at INFO on stderr. Each one
# re-imports this file (wool starts them with ``spawn``), so this line quiets
# them too: the script prints only its own four lines.
logging.getLogger("wool").setLevel(logging.WARNING)


class DirectoryPublisher:
    """Announces workers by writing one file per worker into ``directory``."""

    #: Workers announced here are reached on this host only.
    bind_host = "127.0.0.1"

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    async def publish(self, type: str, metadata: WorkerMetadata) -> None:
        path = self.directory / f"{metadata.uid}{SUFFIX}"
        if type == "worker-dropped":
            path.unlink(missing_ok=True)
            return
        # Write then rename, so a subscriber never reads half a file.
        partial = path.with_suffix(".partial")
        partial.write_bytes(metadata.to_protobuf().SerializeToString())
        os.replace(partial, path)


class Built:
    """Raw subscribers built in this process (the decorator makes it one).

    Kept outside ``DirectorySubscriber``: to a type checker that name is a
    factory of shared subscriptions, not the class, so class attributes are
    not visible through it.
    """

    count = 0


@shared_subscription
class DirectorySubscriber:
    """Reports the workers in ``directory``: added, updated, dropped.

    Constructing it returns a shared subscription (keyed by the constructor
    arguments); the body of this class runs once per shared subscription, in
    the process that iterates it.
    """

    def __init__(self, directory: str, poll_interval: float = 0.05) -> None:
        Built.count += 1
        self.directory = Path(directory)
        self.poll_interval = poll_interval

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        known: dict[uuid.UUID, bytes] = {}
        while True:
            found = self._scan()
            for uid, data in found.items():
                if known.get(uid) != data:
                    kind = "worker-added" if uid not in known else "worker-updated"
                    known[uid] = data
                    yield DiscoveryEvent(kind, metadata=_decode(data))
            for uid in [uid for uid in known if uid not in found]:
                yield DiscoveryEvent("worker-dropped", metadata=_decode(known.pop(uid)))
            await anyio.sleep(self.poll_interval)

    def _scan(self) -> dict[uuid.UUID, bytes]:
        found: dict[uuid.UUID, bytes] = {}
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                found[uuid.UUID(path.stem)] = path.read_bytes()
            except FileNotFoundError:  # dropped while scanning
                continue
        return found


def _decode(data: bytes) -> WorkerMetadata:
    return WorkerMetadata.from_protobuf(protocol.WorkerMetadata.FromString(data))


class DirectoryDiscovery:
    """A wool ``DiscoveryLike``: the publisher and subscriber above, on a directory."""

    def __init__(self, directory: str, poll_interval: float = 0.05) -> None:
        self.directory = directory
        self.poll_interval = poll_interval

    @property
    def publisher(self) -> DirectoryPublisher:
        return DirectoryPublisher(self.directory)

    @property
    def subscriber(self) -> DiscoverySubscriberLike:
        return self.subscribe()

    def subscribe(
        self, filter: Callable[[WorkerMetadata], bool] | None = None
    ) -> DiscoverySubscriberLike:
        # Every subscriber shares one raw DirectorySubscriber; a filter is
        # applied per consumer on top of it.
        shared = DirectorySubscriber(self.directory, self.poll_interval)
        return shared if filter is None else afilter(filter, shared)


@wool.routine
async def multiply(a: int, b: int) -> int:
    return a * b


@wool.routine
async def multiply_in_a_worker(a: int, b: int) -> tuple[int, int, int, int]:
    """Dispatch ``multiply`` from inside a worker; report that worker's pool."""
    product = await multiply(a, b)
    statistics = current_pool().statistics()
    return product, os.getpid(), statistics.entries, statistics.consumers


async def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        discovery = DirectoryDiscovery(directory)
        async with (
            wool.WorkerPool(spawn=1, discovery=discovery, lazy=False),
            wool.WorkerPool(spawn=1, discovery=discovery, lazy=False),
        ):
            statistics = current_pool().statistics()
            print(
                "two pools, one subscription: "
                f"entries={statistics.entries} consumers={statistics.consumers}"
            )
            built = Built.count
            print(f"raw subscribers built in this process: {built}")
            product, pid, entries, consumers = await multiply_in_a_worker(6, 7)
            print(
                f"multiply_in_a_worker(6, 7) = {product} (worker pid {pid}; "
                f"its pool: entries={entries} consumers={consumers})"
            )
        statistics = current_pool().statistics()
        print(
            "after both pools exit: "
            f"entries={statistics.entries} consumers={statistics.consumers}"
        )


if __name__ == "__main__":  # worker processes re-import this file: guard the run
    asyncio.run(main())
