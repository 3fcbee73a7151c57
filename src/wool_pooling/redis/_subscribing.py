"""The first step of every session: subscribe, then snapshot, in that order."""

from __future__ import annotations

from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import cast

from ._errors import watched


async def subscribe_then_snapshot(
    session: Any, subscribe: Callable[[str], Awaitable[Any]], confirmation: str
) -> tuple[int, bytes, list[bytes]]:
    """Subscribe ``session`` to its channel with ``subscribe``, wait for the
    server's ``confirmation`` message, then take the snapshot on its command
    connection: (version, epoch, flat hash). Subscribing first is what makes
    the snapshot and the announcements after it meet with no gap."""
    session.stage = "subscribing"
    await watched(subscribe(session.keys.channel))
    while True:
        message = await watched(session.pubsub.get_message(timeout=None))
        if message is not None and message["type"] == confirmation:
            break
    session.stage = "taking a snapshot"
    version, epoch, flat = await watched(
        session.snapshot_script(keys=session.keys.keys, args=session.script_args())
    )
    return int(version), cast(bytes, epoch), cast(list[bytes], flat)
