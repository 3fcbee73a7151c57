"""What the single-server and the cluster session share: subscribe, then
snapshot; ping; reap; close."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import cast

from ._connection import Connection
from ._errors import watched
from ._scripts import Keys
from ._scripts import idle_expiry_ms
from ._settings import SubscriberOptions


class SessionSteps:
    """The steps of one connection's worth of subscription that do not
    depend on where the namespace is served. A session sets :attr:`pubsub`,
    :attr:`snapshot_script` and :attr:`reap_script` as it connects."""

    keys: Keys
    options: SubscriberOptions
    #: What the session is doing, for error messages.
    stage: str
    pubsub: Any
    snapshot_script: Any
    reap_script: Any

    def connections(self) -> tuple[Connection | None, ...]:
        """The connections :meth:`aclose` closes after the pub/sub one."""
        raise NotImplementedError

    def script_args(self) -> list[str | int]:
        """The arguments every script of a subscription takes: channel, a
        fresh epoch (used if the namespace has none), and how long to keep
        the namespace's keys."""
        keep = idle_expiry_ms(self.options.settle, self.options.reap_interval)
        return [self.keys.channel, uuid.uuid4().hex, keep]

    async def subscribe_then_snapshot(
        self, subscribe: Callable[[str], Awaitable[Any]], confirmation: str
    ) -> tuple[int, bytes, list[bytes]]:
        """Subscribe to the channel with ``subscribe``, wait for the
        server's ``confirmation`` message, then take the snapshot on the
        command connection: (version, epoch, flat hash). Subscribing first is
        what makes the snapshot and the announcements after it meet with no
        gap."""
        self.stage = "subscribing"
        await watched(subscribe(self.keys.channel))
        while True:
            message = await watched(self.pubsub.get_message(timeout=None))
            if message is not None and message["type"] == confirmation:
                break
        self.stage = "taking a snapshot"
        version, epoch, flat = await watched(
            self.snapshot_script(keys=self.keys.keys, args=self.script_args())
        )
        return int(version), cast(bytes, epoch), cast(list[bytes], flat)

    async def ping(self) -> None:
        """Send a ``PING`` on the pub/sub connection (its answer comes as a
        ``pong`` message)."""
        await watched(self.pubsub.ping())

    async def reap(self) -> bytes:
        """Reap expired leases; the namespace's epoch."""
        return cast(
            bytes,
            await watched(
                self.reap_script(keys=self.keys.keys, args=self.script_args())
            ),
        )

    async def aclose(self) -> None:
        """Close the pub/sub connection, then every other; errors ignored."""
        closers: list[Callable[[], Awaitable[Any]]] = []
        if self.pubsub is not None:
            closers.append(self.pubsub.aclose)
        closers += [c.aclose for c in self.connections() if c is not None]
        for close in closers:
            with contextlib.suppress(Exception):
                await close()
