"""An ``ssl_context`` in ``client_options`` is the context of every TLS
connection to the server, a Sentinel-monitored master's included
(docs/redis.rst, *Options and their precedence*). No server is needed: the
connection redis-py would open is built, not connected."""

from __future__ import annotations

import ssl

import anyio
import pytest

from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis._connection import open_client
from wool_pooling.redis._connection import parse_url


@pytest.mark.parametrize(
    "url",
    ["rediss://127.0.0.1:1/0", "rediss+sentinel://127.0.0.1:1/master/0"],
    ids=["server", "sentinel-master"],
)
def test_a_given_ssl_context_wraps_each_connection(url: str) -> None:
    """A connection of the client's pool carries the given context."""
    context = ssl.create_default_context()
    discovery = RedisDiscovery(url, "ns", client_options={"ssl_context": context})
    connection = open_client(
        parse_url(url), "publisher", discovery._settings, retries=0
    )
    try:
        made = connection.client.connection_pool.make_connection()
        assert made.ssl_context.context is context
    finally:
        anyio.run(connection.aclose)
