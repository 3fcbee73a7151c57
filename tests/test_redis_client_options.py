"""``client_options`` as docs/redis.rst, *Options and their precedence*,
describes them: the reserved names, the TLS options, a given ``ssl_context``.
No server is needed: the connection redis-py would open is built, not
connected."""

from __future__ import annotations

import ssl

import anyio
import pytest

from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisPublisher
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
    connection = open_client(parse_url(url), "publisher", discovery, retries=0)
    try:
        made = connection.client.connection_pool.make_connection()
        assert made.ssl_context.context is context
    finally:
        anyio.run(connection.aclose)


@pytest.mark.parametrize("cls", [RedisDiscovery, RedisPublisher])
@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1"]
)
def test_startup_nodes_are_reserved_for_every_url(cls: type, url: str) -> None:
    """The url gives the seeds: ``startup_nodes`` is refused as the other
    options the discovery sets itself, whatever the scheme."""
    with pytest.raises(ValueError, match=r"^client_options may not set startup_nodes"):
        cls(url, "ns", client_options={"startup_nodes": []})


@pytest.mark.parametrize("name", ["ssl_ca_cert", "ssl_anything"])
def test_any_ssl_option_needs_a_tls_url(name: str) -> None:
    """``ssl_*`` with ``redis://`` says the url needs TLS, even for a name
    redis-py's TLS connection does not take either."""
    with pytest.raises(ValueError, match=rf"^client_options {name} needs a TLS url"):
        RedisDiscovery("redis://127.0.0.1:1/0", "ns", client_options={name: "x"})


@pytest.mark.parametrize("cls", [RedisDiscovery, RedisPublisher])
def test_a_cluster_url_takes_the_options_only_a_cluster_client_takes(
    cls: type[RedisDiscovery] | type[RedisPublisher],
) -> None:
    """``RedisCluster``'s own keywords pass on a cluster url, and only there."""
    options = {"reinitialize_steps": 3, "require_full_coverage": True}
    cls("redis+cluster://127.0.0.1:1", "ns", client_options=options)
    with pytest.raises(TypeError, match="reinitialize_steps is not a keyword"):
        cls("redis://127.0.0.1:1/0", "ns", client_options=options)
