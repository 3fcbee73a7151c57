"""The example scripts run as documented and show what they claim."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from _redis import RedisServer
from _redis import require_redis_server
from _tools import require_modules

pytestmark = pytest.mark.wool_processes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _readme_block_after(marker: str) -> list[str]:
    readme = (EXAMPLES.parent / "README.md").read_text()
    rest = readme[readme.index(marker) + len(marker) :]
    opening = rest.index("```\n") + len("```\n")
    return rest[opening : rest.index("```", opening)].splitlines()


def _any_pid(lines: list[str]) -> list[str]:
    return [re.sub(r"worker pid \d+;", "worker pid <pid>;", line) for line in lines]


def test_custom_discovery_example_prints_what_the_readme_shows() -> None:
    """``python examples/custom_discovery.py`` prints the README's "It prints"
    block (two pools on one subscription, one raw subscriber, the nested call
    in a worker, nothing left after), the worker's pid aside, and nothing on
    stderr: wool's INFO logging is quieted."""
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_discovery.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    shown = _readme_block_after(
        "It prints (the worker's pid differs from run to run):\n"
    )
    assert shown[:2] == [
        "two pools, one subscription: entries=1 consumers=2",
        "raw subscribers built in this process: 1",
    ]
    printed = completed.stdout.splitlines()
    assert _any_pid(printed) == _any_pid(shown)
    nested = printed[2]
    assert nested.startswith("multiply_in_a_worker(6, 7) = 42 (worker pid ")
    assert nested.endswith("its pool: entries=1 consumers=1)")
    assert completed.stderr == ""


def test_demo_under_trio_without_trio_says_how_to_get_it() -> None:
    """``python -m wool_pooling --backend trio`` without trio installed exits
    with a usage line naming the command as typed and a line naming the
    ``trio`` extra, not a traceback."""
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; sys.modules['trio'] = None; "
            "sys.argv = ['-m', '--backend', 'trio']; "
            "runpy.run_module('wool_pooling', run_name='__main__', alter_sys=True)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.startswith("usage: python -m wool_pooling ")
    assert "__main__" not in completed.stderr
    assert 'pip install "wool-pooling[trio]"' in completed.stderr
    assert "Traceback" not in completed.stderr


def test_redis_discovery_example_pools_find_each_other() -> None:
    """``python examples/redis_discovery.py`` starts its own redis-server and
    shows two pools in two processes using each other's workers, with one
    subscription connection per process: the README's block, numbers aside."""
    require_redis_server()
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / "redis_discovery.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("started redis-server on 127.0.0.1:")
    assert lines[1].endswith("): one namespace")
    assert lines[2:4] == [
        "pool A's proxy knows 2 workers: its own and pool B's",
        "where_am_i() ran on pool A's worker and on pool B's worker: True",
    ]
    counts = re.fullmatch(
        r"subscription connections for the namespace: (\d+), from (\d+) processes.*",
        lines[4],
    )
    assert counts is not None, lines[4]
    assert counts[1] == counts[2]
    assert int(counts[1]) >= 2
    shown = _readme_block_after(".venv/bin/python examples/redis_discovery.py\n```\n")
    assert [re.sub(r"\d+", "<n>", line) for line in lines] == [
        re.sub(r"\d+", "<n>", line) for line in shown
    ]


def test_redis_discovery_example_leaves_no_keys_on_the_given_server(
    redis_server: RedisServer,
) -> None:
    """``examples/redis_discovery.py --url URL`` deletes the keys of the
    namespace it made once both pools exit, and touches no other key."""
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.set("someone-elses-key", "kept")
        completed = subprocess.run(
            [sys.executable, str(EXAMPLES / "redis_discovery.py"), "--url",
             redis_server.url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout.splitlines()[0].endswith("): one namespace")
        assert client.keys("*") == [b"someone-elses-key"]
    finally:
        client.close()


def test_metrics_example_without_prometheus_client_names_its_extra() -> None:
    """Without ``prometheus_client``, ``examples/metrics.py`` exits with one
    line naming the extra that installs it, not a traceback."""
    hide = (
        "import sys, runpy; sys.modules['prometheus_client'] = None; "
        f"sys.argv = [{str(EXAMPLES / 'metrics.py')!r}]; "
        f"runpy.run_path({str(EXAMPLES / 'metrics.py')!r}, run_name='__main__')"
    )
    completed = subprocess.run(
        [sys.executable, "-c", hide],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 1
    assert completed.stderr == (
        "examples/metrics.py needs prometheus_client: "
        'pip install "wool-pooling[metrics]"\n'
    )


@pytest.mark.docs
def test_metrics_example_exports_a_subscriptions_counters() -> None:
    """``python examples/metrics.py`` prints the Prometheus exposition of one
    shared subscription's counters: 50 consumers, 3 events delivered to 49,
    one late joiner replayed, nothing lagged; its consumers' lag and skips;
    and its pool's totals, which keep what the closed "staging" entry
    counted (3 more delivered). ``prometheus_client`` is the
    example's own dependency (the ``dev`` extra), not the package's: without
    it this is skipped, and fails under ``WOOL_POOLING_REQUIRE_TOOLS=1``; it
    runs in the ``docs`` session, which has it."""
    missing = require_modules("prometheus_client", extra="metrics")
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / "metrics.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    values = dict(line.rsplit(" ", 1) for line in completed.stdout.splitlines())
    label = '{name="workers-prod"}'
    assert values[f"wool_pooling_subscription_consumers{label}"] == "50.0"
    assert values[f"wool_pooling_subscription_delivered_total{label}"] == "147.0"
    assert values[f"wool_pooling_subscription_replays_total{label}"] == "1.0"
    assert values[f"wool_pooling_subscription_lagged_total{label}"] == "0.0"
    assert values[f"wool_pooling_consumers_lag{label}"] == "0.0"
    assert values[f"wool_pooling_consumers_skipped_total{label}"] == "0.0"
    pool = '{name="default"}'
    assert values[f"wool_pooling_pool_opened_total{pool}"] == "2.0"
    assert values[f"wool_pooling_pool_closed_total{pool}"] == "1.0"
    assert values[f"wool_pooling_pool_delivered_total{pool}"] == "150.0"
    assert values[f"wool_pooling_pool_skipped_total{pool}"] == "0.0"
    assert values[f"wool_pooling_pool_restarts_total{pool}"] == "0.0"
    assert values[f"wool_pooling_pool_entries{pool}"] == "1.0"
    assert len(values) == 8 + 2 + 9 + 3
