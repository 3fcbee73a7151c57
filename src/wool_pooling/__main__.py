"""Demo: consumers share one discovery subscription; a late joiner gets a replay.

Run with ``python -m wool_pooling``; add ``--backend trio`` to run under trio
(the ``trio`` extra: ``pip install "wool-pooling[trio]"``) or ``--backend uvloop``
under asyncio with uvloop's event loop (``pip install uvloop``).
"""

from __future__ import annotations

import argparse
import importlib.util
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from wool import DiscoveryEvent
from wool import DiscoveryEventType
from wool import WorkerMetadata

from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription

#: The raw subscribers built (to a type checker, ``DemoSubscriber`` builds
#: subscriptions, not instances of the class).
_raw: list[Any] = []


@shared_subscription
class DemoSubscriber:
    """A discovery subscriber whose events the demo pushes by hand."""

    def __init__(self, namespace: str) -> None:
        _raw.append(self)
        self.events, self._receive = anyio.create_memory_object_stream[DiscoveryEvent](
            100
        )
        print(f"  [raw] DemoSubscriber({namespace!r}) built (#{len(_raw)})")

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        print("  [raw] one upstream iteration started")
        async for event in self._receive:
            yield event

    async def aclose(self) -> None:
        print("  [raw] closed")


async def _consume(name: str) -> None:
    async with aiter(DemoSubscriber("demo")) as consumer:
        async for event in consumer:
            metadata = event.metadata
            print(f"  {name} <- {event.type} {metadata.address} v{metadata.version}")


async def _publish(type: DiscoveryEventType, number: int, version: str = "1.0") -> None:
    metadata = WorkerMetadata(
        uid=uuid.UUID(int=number),
        address=f"127.0.0.1:{50050 + number}",
        pid=1000 + number,
        version=version,
    )
    await _raw[-1].events.send(DiscoveryEvent(type, metadata=metadata))
    await anyio.wait_all_tasks_blocked()


async def main() -> None:
    async with SubscriptionPool() as pool:
        async with anyio.create_task_group() as tg:
            print("two proxies subscribe to the same namespace:")
            tg.start_soon(_consume, "proxy-a")
            tg.start_soon(_consume, "proxy-b")
            await anyio.wait_all_tasks_blocked()
            print(f"pool: {pool.statistics()}")
            for number in (1, 2, 3):
                await _publish("worker-added", number)
            await _publish("worker-updated", 2, "1.1")
            await _publish("worker-dropped", 3)
            print("a third proxy joins late: it first gets a replay of known workers")
            tg.start_soon(_consume, "proxy-c")
            await anyio.wait_all_tasks_blocked()
            print("then everyone sees the live stream:")
            await _publish("worker-added", 4)
            print(f"pool: {pool.statistics()}")
            tg.cancel_scope.cancel()
        print(f"all proxies done; pool: {pool.statistics()}")
        print(f"raw subscribers built: {len(_raw)}")


def _cli() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m wool_pooling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend",
        choices=["asyncio", "trio", "uvloop"],
        default="asyncio",
        help="the event loop to run the demo on: asyncio's own (the default), "
        "trio, or asyncio with uvloop's loop",
    )
    backend = parser.parse_args().backend
    if backend != "asyncio" and importlib.util.find_spec(backend) is None:
        install = '"wool-pooling[trio]"' if backend == "trio" else "uvloop"
        parser.error(f"--backend {backend} needs {backend}: pip install {install}")
    print(f"wool-pooling demo on {backend}")
    if backend == "uvloop":
        anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
    else:
        anyio.run(main, backend=backend)


if __name__ == "__main__":
    _cli()
