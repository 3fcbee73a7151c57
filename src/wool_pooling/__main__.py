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

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from anyio.streams.memory import MemoryObjectSendStream
from wool import DiscoveryEvent
from wool import WorkerMetadata

from wool_pooling import SubscriptionPool
from wool_pooling import shared_subscription


def _worker(number: int, version: str = "1.0") -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=number),
        address=f"127.0.0.1:{50050 + number}",
        pid=1000 + number,
        version=version,
    )


class _Raw:
    """What the demo knows of the raw subscribers built (to a type checker,
    ``DemoSubscriber`` is a factory of subscriptions, not the class)."""

    opened: int = 0
    events: MemoryObjectSendStream[DiscoveryEvent] | None = None


@shared_subscription
class DemoSubscriber:
    """A discovery subscriber whose events the demo pushes by hand."""

    events: MemoryObjectSendStream[DiscoveryEvent]
    _receive: MemoryObjectReceiveStream[DiscoveryEvent]

    def __init__(self, namespace: str) -> None:
        _Raw.opened += 1
        self.namespace = namespace
        self.events, self._receive = anyio.create_memory_object_stream[DiscoveryEvent](
            100
        )
        _Raw.events = self.events
        print(f"  [raw] DemoSubscriber({namespace!r}) built (#{_Raw.opened})")

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        print("  [raw] one upstream iteration started")
        async for event in self._receive:
            yield event

    async def aclose(self) -> None:
        print("  [raw] closed")


def _describe(event: DiscoveryEvent) -> str:
    return f"{event.type} {event.metadata.address} v{event.metadata.version}"


async def _consume(name: str, stop: anyio.Event) -> None:
    subscription = DemoSubscriber("demo")
    async with (
        aiter(subscription) as consumer,
        anyio.create_task_group() as tg,
    ):

        async def read() -> None:
            async for event in consumer:
                print(f"  {name} <- {_describe(event)}")

        tg.start_soon(read)
        await stop.wait()
        tg.cancel_scope.cancel()


async def _publish(event: DiscoveryEvent) -> None:
    assert _Raw.events is not None
    await _Raw.events.send(event)
    await anyio.wait_all_tasks_blocked()


async def main() -> None:
    async with SubscriptionPool() as pool:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            print("two proxies subscribe to the same namespace:")
            tg.start_soon(_consume, "proxy-a", stop)
            tg.start_soon(_consume, "proxy-b", stop)
            await anyio.wait_all_tasks_blocked()
            print(f"pool: {pool.statistics()}")
            for number in (1, 2, 3):
                await _publish(DiscoveryEvent("worker-added", metadata=_worker(number)))
            await _publish(DiscoveryEvent("worker-updated", metadata=_worker(2, "1.1")))
            await _publish(DiscoveryEvent("worker-dropped", metadata=_worker(3)))
            print("a third proxy joins late: it first gets a replay of known workers")
            tg.start_soon(_consume, "proxy-c", stop)
            await anyio.wait_all_tasks_blocked()
            print("then everyone sees the live stream:")
            await _publish(DiscoveryEvent("worker-added", metadata=_worker(4)))
            print(f"pool: {pool.statistics()}")
            stop.set()
        print(f"all proxies done; pool: {pool.statistics()}")
        print(f"raw subscribers built: {_Raw.opened}")


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
    options = parser.parse_args()
    needs = {
        "trio": 'trio: pip install "wool-pooling[trio]"',
        "uvloop": "uvloop: pip install uvloop",
    }
    if options.backend in needs and importlib.util.find_spec(options.backend) is None:
        parser.error(f"--backend {options.backend} needs {needs[options.backend]}")
    print(f"wool-pooling demo on {options.backend}")
    if options.backend == "uvloop":
        anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
    else:
        anyio.run(main, backend=options.backend)


if __name__ == "__main__":
    _cli()
