"""The public surface: names re-exported from the package root, and nothing private."""

from __future__ import annotations

import subprocess
import sys

import pytest

import wool_pooling

EXPECTED = {
    "Fanout",
    "FanoutConsumer",
    "FanoutStatistics",
    "PoolStatistics",
    "SharedDiscovery",
    "SharedSubscription",
    "SubscriptionConsumer",
    "SubscriptionPool",
    "SyncSharedDiscovery",
    "afilter",
    "current_pool",
    "shared_subscription",
}


def test_all_lists_the_public_names() -> None:
    """``__all__`` holds at least the documented public names, each importable."""
    assert set(wool_pooling.__all__) >= EXPECTED
    for name in wool_pooling.__all__:
        assert getattr(wool_pooling, name) is not None
        assert not name.startswith("_")


def test_the_documented_import_line_works() -> None:
    """The import line the README shows works as written."""
    from wool_pooling import Fanout  # noqa: F401
    from wool_pooling import FanoutConsumer  # noqa: F401
    from wool_pooling import SharedSubscription  # noqa: F401
    from wool_pooling import SubscriptionPool  # noqa: F401
    from wool_pooling import afilter  # noqa: F401
    from wool_pooling import current_pool  # noqa: F401
    from wool_pooling import shared_subscription  # noqa: F401


def test_package_ships_py_typed() -> None:
    """The package is marked as typed."""
    from importlib.resources import files

    assert files("wool_pooling").joinpath("py.typed").is_file()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_demo_runs_and_shows_sharing_and_replay(backend: str) -> None:
    """``python -m wool_pooling`` shares one raw subscriber and shows the replay."""
    result = subprocess.run(
        [sys.executable, "-m", "wool_pooling", "--backend", backend],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = result.stdout
    assert out.count("] DemoSubscriber('demo') built") == 1
    assert out.count("one upstream iteration started") == 1
    assert "entries=1, consumers=3" in out
    replay = out.split("joins late")[1].split("then everyone")[0]
    assert "proxy-c <- worker-added 127.0.0.1:50051 v1.0" in replay
    assert "proxy-c <- worker-added 127.0.0.1:50052 v1.1" in replay
    assert "50053" not in replay  # dropped before the late joiner arrived
    assert "raw subscribers built: 1" in out
    assert out.rstrip().endswith("raw subscribers built: 1")
