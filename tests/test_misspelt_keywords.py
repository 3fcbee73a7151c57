"""Every public constructor answers a misspelt keyword with the closest name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any

import pytest

from wool_pooling import Fanout
from wool_pooling import RestartPolicy
from wool_pooling import afilter
from wool_pooling import shared_subscription
from wool_pooling.redis import RedisDiscovery
from wool_pooling.redis import RedisPublisher


async def _items() -> AsyncIterator[int]:
    yield 1


CALLS: dict[str, tuple[Callable[..., Any], tuple[Any, ...], str, str]] = {
    "RedisDiscovery": (RedisDiscovery, ("redis://localhost", "ns"), "leese", "lease"),
    "RedisPublisher": (RedisPublisher, ("redis://localhost", "ns"), "leese", "lease"),
    "RestartPolicy": (RestartPolicy, (), "atempts", "attempts"),
    "Fanout": (Fanout, (None,), "max_lagg", "max_lag"),
    "shared_subscription": (shared_subscription, (), "kye", "key"),
    "afilter": (afilter, (bool, None), "inerr", "inner"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_misspelt_keyword_names_the_closest_one(name: str) -> None:
    """``RedisDiscovery(url, "ns", leese=3)`` raises a TypeError naming the
    constructor, the misspelt keyword and the one it takes that is closest."""
    function, args, typo, meant = CALLS[name]
    with pytest.raises(TypeError) as raised:
        function(*args, **{typo: 1})
    assert str(raised.value) == (
        f"{name}() got an unexpected keyword argument {typo!r} "
        f"(did you mean {meant!r}?)"
    )


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_keyword_far_from_every_name_gets_no_suggestion(name: str) -> None:
    """A keyword like no accepted one is refused without a guess."""
    function, args, _, _ = CALLS[name]
    with pytest.raises(TypeError) as raised:
        function(*args, zzzzzz=1)
    assert str(raised.value) == f"{name}() got an unexpected keyword argument 'zzzzzz'"


def test_correct_keywords_still_reach_the_constructor() -> None:
    """The check lets accepted keywords through, checked by the constructor."""
    assert RestartPolicy(attempts=3).attempts == 3
    assert Fanout(_items(), max_lag=8).statistics().consumers == 0
    with pytest.raises(ValueError, match="namespace"):
        RedisDiscovery("redis://localhost", namespace="")
