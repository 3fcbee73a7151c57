"""The errors of wool_pooling.redis, and the failures a subscription retries."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable
from collections.abc import Generator
from typing import Any

import anyio
import redis.exceptions as redis_errors

from .._pooling.restart import RestartPolicy
from ._connection import reason
from ._connection import redact
from ._state import Resync

#: Errors that mean "the connection is gone" (``OSError`` includes
#: :exc:`TimeoutError`): reconnect and resynchronise.
CONNECTION_ERRORS = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)

#: Errors of a command that failed (a cluster's layout unreadable included):
#: a publisher's call and the operator's listing report them.
FAILURES = (redis_errors.RedisError, redis_errors.RedisClusterException, OSError)

#: Errors a running subscription retries under its reconnect policy.
RETRIED = (*CONNECTION_ERRORS, Resync, redis_errors.ResponseError)

#: Shortest wait for an announcement, in seconds.
MIN_WAIT = 0.05

#: How a subscriber reconnects by default: at 0.1 s, doubling, up to a delay
#: drawn from [0, 30] s (docs/redis.rst, *Restart herd*, derives it).
DEFAULT_RECONNECT = RestartPolicy(
    attempts=None, backoff=0.1, multiplier=2.0, max_backoff=30.0, jitter=1.0
)


class RedisDiscoveryError(Exception):
    """The Redis server cannot be reached, refused a command, or holds data
    in the discovery's keys that is not the discovery's.

    The message names the action, the url without its password and the
    server's (or the OS's) reason, e.g. ``connecting at redis://... failed:
    ConnectionError: ... Connection refused``; for a server that refuses
    ``CLIENT SETNAME``, the ``name_connections`` option that avoids it.
    """


def require_asyncio(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"{what} runs on asyncio only (it is built on redis-py's asyncio "
            "client, and wool itself is asyncio-only), but no asyncio event "
            "loop is running here (trio?). Run it under asyncio, uvloop included."
        ) from None


async def watched(awaitable: Awaitable[Any]) -> Any:
    """Await a redis-py call; re-raise a cancellation that its own
    ``asyncio.timeout`` swallowed (the task's cancellation count says so)."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    try:
        return await awaitable
    finally:
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError


@contextlib.contextmanager
def within(seconds: float, message: str = "") -> Generator[None]:
    """Raise :exc:`TimeoutError` of ``message`` after ``seconds`` (redis-py's
    own timeouts, a ``redis.exceptions.TimeoutError``, pass as they are)."""
    try:
        with anyio.fail_after(max(seconds, MIN_WAIT)):
            yield
    except TimeoutError:
        raise TimeoutError(message or f"no answer within {seconds:g}s") from None


#: How a server refusing ``CLIENT SETNAME`` says so: an ACL, an unknown
#: command (a proxy, a managed service), or redis-py's own message.
_REFUSED_CLIENT = re.compile(
    r"client\|setname|[`'\"]client[`'\"]|command [`'\"]?client\b"
    r"|setting client name",
    re.IGNORECASE,
)


def failed(url: str, action: str, error: BaseException) -> RedisDiscoveryError:
    """The error for ``action`` failing at ``url``."""
    why = reason(error)
    message = f"{action} at {redact(url)} failed: {why}"
    if _REFUSED_CLIENT.search(why):
        message += (
            " (the server refuses CLIENT SETNAME, which names each connection: "
            "pass name_connections=False to send no CLIENT command, as managed "
            "services such as Memorystore and some proxies require)"
        )
    return RedisDiscoveryError(message)
