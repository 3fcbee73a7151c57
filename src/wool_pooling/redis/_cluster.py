"""Redis Cluster: sharded announcements, and a subscription on the slot's owner.

A namespace's keys and channel share one hash tag (``wool:{ns}:...``), so
they live in one slot, on one master (and its replicas). On a cluster url:

- every script announces with ``SPUBLISH`` (sharded pub/sub, Redis 7+) in
  place of ``PUBLISH``: an announcement reaches the nodes of the slot's
  shard only, never every node of the cluster (:func:`sharded`);
- a subscription (:class:`ClusterSession`) reads the cluster's layout from
  its seed nodes (redis-py's ``RedisCluster``), then opens two plain
  connections to the master owning the namespace's slot: one subscribed
  to the channel (``SSUBSCRIBE``), one that takes the snapshot and reaps.
  Both on the same node, so the snapshot and the announcements that follow
  it come from one place, as on a single server.

Nothing follows a slot silently. When the slot moves (a migration), the
node ends the subscription with an unsolicited ``sunsubscribe``; when its
master fails, the connections drop; a command for a slot the node no
longer owns gets ``MOVED``. Each ends the session like any lost
connection: the stream reconnects under its policy, reads the layout
again, subscribes on the new owner and takes a new snapshot, passing on
only the difference.
"""

from __future__ import annotations

from typing import Any
from typing import cast
from typing import final

import redis.exceptions as redis_errors

from ._connection import Connection
from ._connection import Target
from ._connection import node_url
from ._connection import open_client
from ._connection import parse_url
from ._errors import watched
from ._scripts import REAP
from ._scripts import SNAPSHOT
from ._settings import SubscriberOptions
from ._settings import keys_for
from ._state import Resync
from ._subscribing import SessionSteps

__all__ = ["ClusterSession", "sharded"]

_PUBLISH_CALL = "redis.call('PUBLISH', channel,"
_SPUBLISH_CALL = "redis.call('SPUBLISH', channel,"


def sharded(script: str) -> str:
    """``script`` announcing with ``SPUBLISH`` (to the channel's shard) in
    place of ``PUBLISH`` (to every node of a cluster).

    :raises ValueError: if ``script`` does not announce exactly once.
    """
    if script.count(_PUBLISH_CALL) != 1:
        raise ValueError("a discovery script announces with exactly one PUBLISH")
    return script.replace(_PUBLISH_CALL, _SPUBLISH_CALL)


@final
class ClusterSession(SessionSteps):
    """One subscription to a namespace of a Redis Cluster: sharded pub/sub
    and a command connection, both on the master owning the namespace's slot.

    Same interface as the single-server session: :meth:`open` (subscribe,
    then snapshot), :meth:`next_message`, :meth:`reap`, :meth:`aclose`.
    Any sign that the slot is no longer served there (a ``sunsubscribe``
    the session did not ask for, ``MOVED``, a lost connection) raises, and
    the stream takes a new session.
    """

    def __init__(
        self, target: Target, namespace: str, options: SubscriberOptions
    ) -> None:
        self.target = target
        self.namespace = namespace
        self.options = options
        self.keys = keys_for(target, namespace, options.key_prefix)
        self.stage = "connecting"
        self.node: tuple[str, int] | None = None
        self.command: Connection | None = None
        self.listening: Connection | None = None
        self.pubsub: Any = None
        self.snapshot_script: Any = None
        self.reap_script: Any = None
        # No retries: a lost connection ends the session.
        self.layout: Connection | None = open_client(
            target,
            "subscriber-cmd",
            namespace,
            options.connect_timeout,
            retries=0,
            client_options=options.client_options,
            named=options.name_connections,
        )

    async def _owner(self) -> tuple[str, int]:
        """The master owning the namespace's slot, as the cluster says now."""
        assert self.layout is not None
        cluster = self.layout.client
        self.stage = "reading the cluster's layout"
        try:
            await watched(cluster.initialize())
            node = cluster.get_node_from_key(self.keys.channel)
        except redis_errors.RedisClusterException as error:
            # No seed reachable, or no master for the slot (yet): a lost
            # connection, retried under the reconnect policy.
            raise redis_errors.ConnectionError(str(error)) from error
        return str(node.host), int(node.port)

    def _node_client(self, role: str) -> Connection:
        assert self.node is not None
        node = parse_url(node_url(self.target.url, self.node))
        client_options = {
            name: value
            for name, value in self.options.client_options.items()
            if name not in _CLUSTER_ONLY_OPTIONS
        }
        return open_client(
            node,
            role,
            self.namespace,
            self.options.connect_timeout,
            retries=0,
            client_options=client_options,
            named=self.options.name_connections,
        )

    async def open(self) -> tuple[int, bytes, list[bytes]]:
        """Find the slot's master, ``SSUBSCRIBE`` there and wait for the
        confirmation, then snapshot on the same node: (version, epoch,
        flat hash)."""
        self.node = await self._owner()
        layout, self.layout = self.layout, None
        if layout is not None:
            await layout.aclose()
        self.stage = "connecting"
        self.command = self._node_client("subscriber-cmd")
        self.listening = self._node_client("subscriber")
        self.pubsub = self.listening.client.pubsub()
        self.snapshot_script = self.command.client.register_script(sharded(SNAPSHOT))
        self.reap_script = self.command.client.register_script(sharded(REAP))
        return await self.subscribe_then_snapshot(self.pubsub.ssubscribe, "ssubscribe")

    async def next_message(self, wait: float) -> dict[str, Any] | None:
        """The next announcement, or None after ``wait`` seconds without one
        (or after a message that is not an announcement).

        :raises Resync: when the node unsubscribed the channel (its slot
            moved to another master).
        """
        message = await watched(self.pubsub.get_message(timeout=wait))
        if message is None:
            return None
        kind = message["type"]
        if kind == "sunsubscribe":
            raise Resync(
                f"{self.node_name} unsubscribed {self.keys.channel}: the "
                "namespace's slot moved to another node"
            )
        # An announcement, or the answer to a PING (the connection answers).
        return cast(dict[str, Any], message) if kind in ("smessage", "pong") else None

    @property
    def node_name(self) -> str:
        if self.node is None:
            return "the cluster"
        host, port = self.node
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def connections(self) -> tuple[Connection | None, ...]:
        return (self.listening, self.command, self.layout)


#: ``RedisCluster`` options that a single node's client does not take.
_CLUSTER_ONLY_OPTIONS = frozenset(
    {
        "require_full_coverage",
        "read_from_replicas",
        "load_balancing_strategy",
        "dynamic_startup_nodes",
        "reinitialize_steps",
        "cluster_error_retry_attempts",
        "address_remap",
        "policy_resolver",
    }
)
