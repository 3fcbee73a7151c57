"""Share one live subscription among many async consumers, on asyncio and trio."""

from ._afilter import afilter
from ._decorator import shared_subscription
from ._discovery import SharedDiscovery
from ._discovery import SyncSharedDiscovery
from ._fanout import Fanout
from ._fanout import FanoutConsumer
from ._fanout import FanoutStatistics
from ._fanout import Lagged
from ._fanout import LagPolicy
from ._pool import PoolStatistics
from ._pool import SubscriptionPool
from ._pool import current_pool
from ._restart import RestartPolicy
from ._subscription import SharedSubscription
from ._subscription import SubscriptionConsumer

__all__ = [
    "Fanout",
    "FanoutConsumer",
    "FanoutStatistics",
    "LagPolicy",
    "Lagged",
    "PoolStatistics",
    "RestartPolicy",
    "SharedDiscovery",
    "SharedSubscription",
    "SubscriptionConsumer",
    "SubscriptionPool",
    "SyncSharedDiscovery",
    "afilter",
    "current_pool",
    "shared_subscription",
]
