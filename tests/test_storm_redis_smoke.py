"""Smoke run of ``benchmarks/storm_redis.py``: a small restart herd reconverges.

The script starts (and restarts) its own ``redis-server``, so it takes no
``--url``; ``require_redis_server`` skips these tests without one (or fails
them under ``WOOL_POOLING_REQUIRE_REDIS=1``). The discovery runs on asyncio
only: the script's processes run it under ``asyncio.run``, so nothing here
runs under trio. Timings are not looked at (they depend on the machine); the
counts, the views and the bytes are exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _redis import require_redis_server

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "storm_redis.py"


def interpreter() -> str:
    version = sys.version_info
    return f"{sys.implementation.name}{version[0]}.{version[1]}"


def test_a_restart_herd_reconverges_every_view(tmp_path: Path) -> None:
    """After the restart, every view of 2 processes x 2 unshared subscriptions
    equals the truth (W + 1 workers: the one recorded unannounced before the
    shutdown, so only a new snapshot shows it), with no duplicate; the
    server kept the records (persistence) and sent each view at least one
    snapshot's bytes; the table is printed and re-rendered from the file."""
    require_redis_server()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--runs", "300:2",
         "--subscriptions", "2", "--snapshots", "3", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    path = tmp_path / f"storm_redis-{interpreter()}.json"
    report = json.loads(path.read_text())
    (row,) = report["rows"]
    assert (row["workers"], row["processes"], row["subscriptions_per_process"]) == (
        300,
        2,
        2,
    )
    assert (row["herd"], row["connections"]) == (4, 8)
    assert (row["views"], row["views_equal_truth"]) == (4, 4)
    assert row["duplicates"] == row["unknown_drops_or_updates"] == 0
    assert row["stored_after"] == 301
    assert row["reconnects"] >= 4
    assert row["snapshot"]["records"] == 300
    assert row["snapshot"]["bytes"] > 300 * 100  # a uid and a metadata each
    assert row["herd_bytes"] >= 4 * row["snapshot"]["bytes"]
    assert row["snapshots_sent_per_view"] >= 1.0
    assert row["reconverge_seconds"] >= row["reconverge_median_seconds"] >= 0
    assert report["meta"]["persistence"].startswith("RDB")
    assert len(report["meta"]["loadavg_after"]) == 3
    assert "| 300 | 2 x 2 |" in done.stdout
    rendered = subprocess.run(
        [sys.executable, str(SCRIPT), "--render", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "| 300 | 2 x 2 |" in rendered.stdout
    assert "| 4 / 4 |" in rendered.stdout


def test_storm_redis_refuses_a_malformed_run() -> None:
    """``--runs`` takes ``W:P`` with both at least 1: anything else exits
    non-zero, naming the bad value, before any server starts."""
    for bad in ("1000", "0:4", "1000:x"):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--runs", bad],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert repr(bad) in done.stderr
