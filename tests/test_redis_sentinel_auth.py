"""``RedisDiscovery`` on Sentinel when every server requires a password.

The usual hardening: ``requirepass`` on the master, the replica and the three
sentinels, ``masterauth`` on the data nodes, ``sentinel auth-pass`` on the
sentinels. The url names the sentinels, so its user and password reach them
as well as the master, unless ``client_options["sentinel_kwargs"]`` gives
the sentinels' own; a refusal is a prompt, clear error that never shows the
password. Runs on asyncio only (redis-py's client is asyncio-only).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from _loops import asyncio_options
from _redis import SentinelSet
from _redis import require_redis_server
from redis_views import View
from redis_views import fake_worker

from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisDiscoveryError

pytestmark = pytest.mark.anyio

PASSWORD = "hardened-S3cret"
WRONG = "not-the-Pa55word"

#: Far longer than any refusal may take: "promptly" is well under it.
CONNECT_TIMEOUT = 30.0
PROMPTLY = 10.0


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", asyncio_options())


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSet]:
    """A master, a replica and three sentinels, all requiring ``PASSWORD``."""
    group = SentinelSet(require_redis_server(), password=PASSWORD)
    try:
        group.start()
        yield group
    finally:
        group.cleanup()


def sentinel_url(group: SentinelSet, password: str | None) -> str:
    hosts = ",".join(f"127.0.0.1:{port}" for port in group.sentinel_ports)
    auth = "" if password is None else f":{password}@"
    return f"redis+sentinel://{auth}{hosts}/{group.SERVICE}/0"


def namespace() -> str:
    return f"sentinel-auth-{uuid.uuid4().hex[:10]}"


def chain(error: BaseException) -> str:
    """Every message and repr along ``error``'s causes and contexts."""
    texts: list[str] = []
    current: BaseException | None = error
    while current is not None and len(texts) < 40:
        texts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return "\n".join(texts)


async def round_trip(discovery: RedisDiscovery) -> None:
    """Publish a worker and see it in a subscription, within the deadline."""
    worker = fake_worker()
    view = View()
    with anyio.fail_after(CONNECT_TIMEOUT):
        async with discovery.publisher as publisher, anyio.create_task_group() as tg:
            await publisher.publish("worker-added", worker)
            tg.start_soon(view.consume, discovery.subscribe())
            await view.has(worker.uid)
            tg.cancel_scope.cancel()


async def test_the_urls_password_reaches_the_sentinels_and_the_master(
    sentinels: SentinelSet,
) -> None:
    """With the password in the url alone, the discovery finds the master
    through the sentinels and publishes and subscribes there."""
    discovery = RedisDiscovery(
        sentinel_url(sentinels, PASSWORD),
        namespace(),
        connect_timeout=CONNECT_TIMEOUT,
    )
    await round_trip(discovery)


async def test_sentinel_kwargs_give_the_sentinels_their_own_credentials(
    sentinels: SentinelSet,
) -> None:
    """``client_options["sentinel_kwargs"]`` replaces the url's credentials
    for the sentinels: theirs work, and a wrong one is theirs to refuse."""
    url = sentinel_url(sentinels, PASSWORD)
    await round_trip(
        RedisDiscovery(
            url,
            namespace(),
            connect_timeout=CONNECT_TIMEOUT,
            client_options={"sentinel_kwargs": {"password": PASSWORD}},
        )
    )
    refused = RedisDiscovery(
        url,
        namespace(),
        connect_timeout=CONNECT_TIMEOUT,
        client_options={"sentinel_kwargs": {"password": WRONG}},
    )
    with pytest.raises(
        RedisDiscoveryError, match=r"the sentinel at \S+ refused authentication"
    ) as caught:
        async with refused.publisher:
            pass
    assert WRONG not in chain(caught.value)


@pytest.mark.parametrize("password", [WRONG, None], ids=["wrong", "missing"])
async def test_a_refusing_sentinel_is_a_prompt_clear_error_without_the_password(
    sentinels: SentinelSet, password: str | None
) -> None:
    """A wrong (or missing) password: publisher and subscriber fail well
    within ``connect_timeout``, saying a sentinel refused authentication and
    what it said, and the password appears nowhere in the error's chain."""
    discovery = RedisDiscovery(
        sentinel_url(sentinels, password),
        namespace(),
        connect_timeout=CONNECT_TIMEOUT,
    )
    start = time.monotonic()
    with pytest.raises(RedisDiscoveryError) as publishing:
        async with discovery.publisher:
            pass
    publisher_took = time.monotonic() - start
    start = time.monotonic()
    with pytest.raises(RedisDiscoveryError) as subscribing:
        async for _ in discovery.subscribe():
            pass
    subscriber_took = time.monotonic() - start
    for caught, took in ((publishing, publisher_took), (subscribing, subscriber_took)):
        message = str(caught.value)
        assert took < PROMPTLY, f"{took:.1f}s: {message}"
        assert "the sentinel at 127.0.0.1:" in message
        assert "refused authentication" in message
        assert "AuthenticationError: WRONGPASS " in message
        assert "TimeoutError" not in message
        assert WRONG not in chain(caught.value)
        assert PASSWORD not in chain(caught.value)


async def test_sentinels_without_a_password_take_theirs_from_sentinel_kwargs() -> None:
    """Sentinels without a password (data nodes with one): ``sentinel_kwargs={}``
    sends them none while the url's password still reaches the master; one
    that refuses a password it does not expect (``AUTH`` over RESP2) is the
    same prompt, clear error, naming the cure."""
    group = SentinelSet(require_redis_server(), password=PASSWORD, open_sentinels=True)
    try:
        group.start()
        url = sentinel_url(group, PASSWORD)
        await round_trip(
            RedisDiscovery(
                url,
                namespace(),
                connect_timeout=CONNECT_TIMEOUT,
                client_options={"sentinel_kwargs": {}},
            )
        )
        refused = RedisDiscovery(
            url,
            namespace(),
            connect_timeout=CONNECT_TIMEOUT,
            client_options={"sentinel_kwargs": {"password": WRONG, "protocol": 2}},
        )
        start = time.monotonic()
        with pytest.raises(RedisDiscoveryError) as caught:
            async with refused.publisher:
                pass
        assert time.monotonic() - start < PROMPTLY
        assert "refused authentication" in str(caught.value)
        assert "sentinel_kwargs" in str(caught.value)
        assert WRONG not in chain(caught.value)
    finally:
        group.cleanup()
