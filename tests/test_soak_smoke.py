"""Smoke run of `benchmarks/soak.py --quick` on both backends.

The soak script checks, for every consumer that joins and leaves the shared
subscription at random, that it received a contiguous run of the event
sequence from its join point; it exits non-zero on any violation.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmarks

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_quick_soak_loses_and_duplicates_nothing(backend: str) -> None:
    """The quick soak exits 0, with 0 lost and 0 duplicated events."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--backend", backend],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"soak {backend} ")
    assert re.search(r"\b0 lost\b", summary), summary
    assert re.search(r"\b0 duplicated\b", summary), summary
    assert re.search(r"\b0 bad replays, 0 unexpected\b", summary), summary
    delivered = re.search(r"([\d,]+) delivered", summary)
    assert delivered is not None
    assert int(delivered.group(1).replace(",", "")) >= 20_000  # the anchor's share
    assert "left in pool: 0 entries, 0 consumers" in summary
    assert summary.endswith(": OK")
