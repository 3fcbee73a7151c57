"""``SharedDiscovery``: :mod:`.lifecycle` (the wrapper, a counted context
manager), :mod:`.portable` (what travels to another process) and :mod:`.merge`
(the upstream, merging a fresh scan for each late joiner)."""

from .lifecycle import SharedDiscovery
from .lifecycle import SharedDiscoveryStatistics
from .lifecycle import SyncSharedDiscovery
from .merge import Upstream
from .portable import rebuild

__all__ = ["SharedDiscovery", "SharedDiscoveryStatistics", "SyncSharedDiscovery"]

# Pickled by this one module's name: wool pickles a subscription into every
# task it dispatches, each module name costs its length again.
Upstream.__module__ = rebuild.__module__ = __name__
