"""Which keyword arguments redis-py's client takes, read from its signatures,
so that a misspelt client option fails at construction, not at the first
connection (in a subscription's task or a worker process)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

import redis.asyncio.connection as redis_connection
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import ConnectionPool
from redis.asyncio.connection import SSLConnection
from redis.asyncio.connection import UnixDomainSocketConnection
from redis.asyncio.sentinel import Sentinel
from redis.asyncio.sentinel import SentinelManagedConnection
from redis.asyncio.sentinel import SentinelManagedSSLConnection

from .._core.signatures import did_you_mean
from .._core.signatures import signature_of


def check_client_option_names(
    options: Mapping[str, Any], *, scheme: str, unix: bool, url: str
) -> None:
    """Check that redis-py takes each option for a url of ``scheme``
    (``unix``: a socket path; ``url``: redacted, for the message).

    :raises ValueError: for ``ssl`` or an ``ssl_*`` option without TLS.
    :raises TypeError: for a name redis-py does not take there.
    """
    tls = scheme.startswith("rediss")
    known = _client_option_names(
        unix, scheme.endswith("+sentinel"), tls, scheme.endswith("+cluster")
    )
    for name in options:
        if not tls and (name == "ssl" or name.startswith("ssl_")):
            raise ValueError(
                f"client_options {name} needs a TLS url (rediss:// or "
                f"rediss+sentinel://), got {url!r}"
            )
        if known is not None and name not in known:
            raise TypeError(
                f"client_options {name} is not a keyword of redis-py's client "
                f"for a {scheme}:// url{did_you_mean(name, known)}"
            )


@functools.cache
def _client_option_names(
    unix: bool, sentinel: bool, tls: bool, cluster: bool = False
) -> frozenset[str] | None:
    """The keywords of the connection class redis-py builds for a url of
    this kind, of its pool (and ``Sentinel`` or ``RedisCluster``), and
    ``ssl_context``; ``None`` if some ``**kwargs`` cannot be followed."""
    connection: type
    if sentinel:
        connection = SentinelManagedSSLConnection if tls else SentinelManagedConnection
    elif unix:
        connection = UnixDomainSocketConnection
    else:
        connection = SSLConnection if tls else redis_connection.Connection
    names = _keywords(connection)
    if names is None:
        return None
    names |= _keywords(ConnectionPool, own=True) or set()
    names.add("ssl_context")
    if cluster:
        names |= _keywords(RedisCluster, own=True) or set()
    if sentinel:
        names |= _keywords(Sentinel, own=True) or set()
        names.add("check_connection")
        if tls:
            names.add("ssl")  # what the url says already
    # Set from the url and by the pool: never the caller's.
    return frozenset(names - {"sentinels"})


def _keywords(cls: type, *, own: bool = False) -> set[str] | None:
    """The keyword parameters of ``cls.__init__`` and (unless ``own``) of
    the bases it hands its ``**kwargs`` to; ``None`` if those reach
    ``object``, or a signature cannot be read."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        signature = None if klass is object else signature_of(init)
        if signature is None:
            return None
        parameters = signature.parameters.values()
        names.update(
            parameter.name
            for parameter in parameters
            if parameter.kind in _KEYWORD_KINDS and parameter.name != "self"
        )
        if own or not any(
            parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters
        ):
            return names
    return None


_KEYWORD_KINDS = (
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
)
