"""One connection's worth of subscription: subscribe, snapshot, read, reap, close."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from typing import Any
from typing import cast
from typing import final

import redis.exceptions as redis_errors

from ._connection import Connection
from ._connection import Target
from ._connection import address
from ._connection import node_url
from ._connection import open_client
from ._connection import parse_url
from ._errors import watched
from ._scripts import REAP
from ._scripts import SNAPSHOT
from ._scripts import Keys
from ._scripts import idle_expiry_ms
from ._scripts import sharded
from ._settings import DiscoverySettings
from ._state import Resync

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


@final
class Session:
    """A pub/sub connection and a command connection to the namespace's server
    (on a cluster: to the master owning its slot). Neither retries: a lost
    connection, a ``MOVED`` or an unasked ``sunsubscribe`` raises."""

    def __init__(self, target: Target, settings: DiscoverySettings) -> None:
        self.target = target
        self.settings = settings
        self.keys = Keys.of(settings.namespace, target.db, settings.key_prefix)
        #: What :meth:`open` is doing, for error messages.
        self.stage = "connecting"
        self.node = "the cluster"
        self.opened: list[Connection] = []
        self.pubsub: Any = None
        self.scripts: dict[str, Any] = {}

    def _client(
        self, target: Target, role: str, options: Mapping[str, Any] | None = None
    ) -> Connection:
        connection = open_client(
            target, role, self.settings, retries=0, client_options=options
        )
        self.opened.append(connection)
        return connection

    async def _owner(self) -> Target:
        """The master owning the namespace's slot, as the cluster says now."""
        layout = self._client(self.target, "subscriber-cmd")
        self.stage = "reading the cluster's layout"
        try:
            await watched(layout.client.initialize())
            node = layout.client.get_node_from_key(self.keys.channel)
        except redis_errors.RedisClusterException as error:
            # No seed reachable, or no master for the slot (yet): a lost
            # connection, retried under the reconnect policy.
            raise redis_errors.ConnectionError(str(error)) from error
        self.opened.remove(layout)
        await layout.aclose()
        self.node = address(str(node.host), int(node.port))
        return parse_url(node_url(self.target.url, self.node))

    async def open(self, since: list[object]) -> list[Any]:
        """Subscribe, wait for the server's confirmation, then :meth:`read`.

        Subscribing first is what makes that read and the announcements
        after it meet with no gap.
        """
        target, options = self.target, self.settings.client_options
        cluster = target.cluster
        if cluster:
            target = await self._owner()
            options = {
                name: value
                for name, value in options.items()
                if name not in _CLUSTER_ONLY_OPTIONS
            }
        self.stage = "connecting"
        command = self._client(target, "subscriber-cmd", options).client
        self.pubsub = self._client(target, "subscriber", options).client.pubsub()
        for name, script in (("snapshot", SNAPSHOT), ("reap", REAP)):
            self.scripts[name] = command.register_script(
                sharded(script) if cluster else script
            )
        self.stage = "subscribing"
        subscribe = self.pubsub.ssubscribe if cluster else self.pubsub.subscribe
        await watched(subscribe(self.keys.channel))
        confirmation = "ssubscribe" if cluster else "subscribe"
        while True:
            message = await watched(self.pubsub.get_message(timeout=None))
            if message is not None and message["type"] == confirmation:
                break
        return await self.read(since)

    async def read(self, since: list[object]) -> list[Any]:
        """The changes after ``since`` (the epoch, version and change last
        applied) or a snapshot, on the command connection: the snapshot
        script's reply."""
        self.stage = "taking a snapshot"
        return cast(list[Any], await self._run("snapshot", *since))

    async def _run(self, script: str, *rest: object) -> Any:
        settings = self.settings
        keep = idle_expiry_ms(settings.lease, settings.reap_interval)
        args = [self.keys.channel, uuid.uuid4().hex, keep, settings.change_log, *rest]
        return await watched(self.scripts[script](keys=self.keys.keys, args=args))

    async def next_message(self, wait: float) -> dict[str, Any] | None:
        """The next announcement or ``pong``; ``None`` after ``wait`` seconds
        without one.

        :raises Resync: if the node unsubscribed the channel (its slot moved).
        """
        message = await watched(self.pubsub.get_message(timeout=wait))
        if message is None:
            return None
        kind = message["type"]
        if kind == "sunsubscribe":
            raise Resync(
                f"{self.node} unsubscribed {self.keys.channel}: the "
                "namespace's slot moved to another node"
            )
        return message if kind in ("message", "smessage", "pong") else None

    async def ping(self) -> None:
        """Send a ``PING`` on the pub/sub connection (answered by a ``pong``)."""
        await watched(self.pubsub.ping())

    async def reap(self) -> bytes:
        """Reap expired leases; the namespace's epoch."""
        return cast(bytes, await self._run("reap"))

    async def aclose(self) -> None:
        """Close the pub/sub connection, then every other; errors ignored."""
        closers = [self.pubsub.aclose] if self.pubsub is not None else []
        closers += [each.aclose for each in reversed(self.opened)]
        for close in closers:
            with contextlib.suppress(Exception):
                await close()
