"""Smoke run of ``benchmarks/pooling_redis.py``: it runs, and counts connections.

Timings are not looked at (they depend on the machine); the connection
counts are exact: a pooled subscription holds 2 connections whatever K,
unpooled consumers 2 each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _redis import RedisServer

pytestmark = pytest.mark.benchmarks

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "pooling_redis.py"


def test_pooling_redis_counts_connections(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Pooled, a namespace's subscription holds 2 connections whatever K;
    unpooled, 2 per consumer: in the printed table and the JSON result."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--url",
            redis_server.url,
            "--consumers",
            "1",
            "3",
            "--rounds",
            "1",
            "--idle",
            "0.1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    interpreter = f"cpython{sys.version_info[0]}.{sys.version_info[1]}"
    if sys.implementation.name != "cpython":
        interpreter = interpreter.replace("cpython", sys.implementation.name)
    report = json.loads((tmp_path / f"pooling_redis-{interpreter}.json").read_text())
    counts = {
        (row["consumers"], row["pooled"]): row["connections"] for row in report["rows"]
    }
    assert counts == {(1, True): 2, (1, False): 2, (3, True): 2, (3, False): 6}
    assert report["meta"]["consumers"] == [1, 3]
    assert report["meta"]["redis_server"].count(".") == 2
    assert "| 3 | 2 / 6 |" in done.stdout


def test_soak_redis_documents_its_options_and_fails_on_a_bad_one() -> None:
    """``benchmarks/soak_redis.py --help`` lists the fleet's knobs and
    ``--out``; an unknown option exits non-zero (CI runs ``--quick``)."""
    soak = SCRIPT.parent / "soak_redis.py"
    done = subprocess.run(
        [sys.executable, str(soak), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for option in ("--processes", "--consumers", "--seconds", "--quick", "--out"):
        assert option in done.stdout
    bad = subprocess.run(
        [sys.executable, str(soak), "--no-such-option"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode != 0
