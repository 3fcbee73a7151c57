"""Share one live subscription among many async consumers, on asyncio and trio.

Decorate an async-iterable subscriber class with :func:`shared_subscription`:
constructing it then returns a :class:`SharedSubscription`, and all the
consumers that iterate equal subscriptions in one pool (by default, one pool
per running event loop) share a single raw instance and a single upstream
iteration of it. A consumer that joins
late first receives one ``worker-added`` event per worker already known,
then the live events: no gap, no duplicate. Cancelling or abandoning one
consumer never disturbs the others or the upstream. For wool pools,
``SharedDiscovery(wool.LocalDiscovery("ns"))`` does this for an existing
discovery in one line.

>>> import uuid
>>> import anyio
>>> from wool import DiscoveryEvent, WorkerMetadata
>>> from wool_pooling import shared_subscription
>>> @shared_subscription
... class Workers:
...     def __init__(self, namespace):
...         print("one raw subscriber for", namespace)
...
...     async def __aiter__(self):
...         for n in (1, 2):
...             worker = WorkerMetadata(
...                 uid=uuid.UUID(int=n), address=f"10.0.0.{n}:5000", pid=n, version="1"
...             )
...             yield DiscoveryEvent("worker-added", metadata=worker)
...         await anyio.sleep_forever()
>>> async def main():
...     async with aiter(Workers("prod")) as early:
...         print("early:", [(await anext(early)).metadata.address for _ in "ab"])
...         async with aiter(Workers("prod")) as late:  # same upstream, replayed
...             print("late:", [(await anext(late)).metadata.address for _ in "ab"])
>>> anyio.run(main)
one raw subscriber for prod
early: ['10.0.0.1:5000', '10.0.0.2:5000']
late: ['10.0.0.1:5000', '10.0.0.2:5000']

Also here: :class:`Fanout`, the demand-driven, cancellation-safe multicast
underneath, usable on any async iterable; :class:`SubscriptionPool` and
:func:`current_pool`, which scope the shared entries; :class:`afilter`,
a per-consumer discovery filter; :class:`RestartPolicy`, opt-in restarts
of a failing raw stream. ``python -m wool_pooling`` runs a demo.
``wool_pooling.__version__`` is the installed distribution's version.
"""

import importlib.metadata as _metadata

from ._core.fanout import Fanout
from ._core.fanout import FanoutConsumer
from ._core.fanout import FanoutStatistics
from ._core.fanout import Lagged
from ._core.fanout import LagPolicy
from ._core.synced import Synced
from ._core.synced import mark_synced
from ._pooling.pool import PoolStatistics
from ._pooling.pool import PoolTotals
from ._pooling.pool import SubscriptionPool
from ._pooling.pool import SubscriptionStatistics
from ._pooling.pool import current_pool
from ._pooling.restart import RestartPolicy
from ._pooling.subscription import SharedSubscription
from ._pooling.subscription import SubscriptionConsumer
from ._pooling.view import View
from ._wool.afilter import afilter
from ._wool.shared_discovery import SharedDiscovery
from ._wool.shared_discovery import SharedDiscoveryStatistics
from ._wool.shared_discovery import SyncSharedDiscovery
from ._wool.view import shared_subscription

#: The version of the installed ``wool-pooling`` distribution (its metadata).
__version__: str = _metadata.version("wool-pooling")

__all__ = [
    "Fanout",
    "FanoutConsumer",
    "FanoutStatistics",
    "LagPolicy",
    "Lagged",
    "PoolStatistics",
    "PoolTotals",
    "RestartPolicy",
    "SharedDiscovery",
    "SharedDiscoveryStatistics",
    "SharedSubscription",
    "SubscriptionConsumer",
    "SubscriptionPool",
    "SubscriptionStatistics",
    "SyncSharedDiscovery",
    "Synced",
    "View",
    "afilter",
    "current_pool",
    "mark_synced",
    "shared_subscription",
]
