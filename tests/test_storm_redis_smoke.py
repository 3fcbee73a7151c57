"""Smoke run of ``benchmarks/storm_redis.py``: small blip and restart herds reconverge.

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


def test_a_blip_and_a_restart_herd_reconverge_every_view(tmp_path: Path) -> None:
    """After the blip (pub/sub connections cut, one worker published
    meanwhile) and after the restart (the data lost: the same records and
    one more published again under another epoch), every view of 2
    processes x 2 unshared subscriptions equals the truth, with no
    duplicate; after the restart each view took a full snapshot; the
    figures say whether hiredis parsed the replies; the table is printed
    and re-rendered from the file."""
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
    for herd in ("blip", "restart"):
        figures = row[herd]
        assert (figures["views"], figures["views_equal_truth"]) == (4, 4)
        assert figures["duplicates"] == figures["unknown_drops_or_updates"] == 0
        assert figures["counts"]["reconnects"] >= 4
        assert figures["reconverge_seconds"] >= figures["reconverge_median_seconds"]
        assert figures["server_cpu_seconds"] >= 0
        assert len(figures["loadavg_before"]) == 3
    assert row["restart"]["counts"]["snapshots"] >= 4
    assert row["restart"]["herd_bytes"] >= 4 * row["snapshot"]["bytes"]
    assert row["stored_after"] == 302
    snapshot = row["snapshot"]
    assert snapshot["records"] == 300
    assert snapshot["bytes"] > 300 * 100  # a uid and a metadata each
    assert snapshot["hiredis"] is report["meta"]["hiredis"]
    assert snapshot["fetch_ms"] >= 0
    assert snapshot["resync_ms"] >= 0
    assert report["meta"]["restart"].startswith("data lost")
    assert len(report["meta"]["loadavg_after"]) == 3
    assert "| 300 | 2 x 2 |" in done.stdout
    rendered = subprocess.run(
        [sys.executable, str(SCRIPT), "--render", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [line for line in rendered.stdout.splitlines() if "| 300 | 2 x 2 |" in line]
    assert [line.split(" | ")[5] for line in lines] == ["blip", "restart"]
    assert all("| 4 / 4 |" in line for line in lines)


def test_one_client_s_snapshot_is_measured_at_each_w() -> None:
    """``--client W...`` prints one row per W: fetch, first decode, resync,
    and whether hiredis parsed the reply; it records nothing."""
    require_redis_server()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--client", "50", "120", "--snapshots", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 50 |")]
    rows += [line for line in done.stdout.splitlines() if line.startswith("| 120 |")]
    assert len(rows) == 2
    assert all(row.split(" | ")[1] in ("yes", "no") for row in rows)
    assert "results:" not in done.stderr


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
