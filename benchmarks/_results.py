"""Where a benchmark writes its result file, and what names it: one idea, shared.

A full run records into ``benchmarks/results/`` (replacing that interpreter's
file); ``--quick`` writes into a fresh temporary folder; ``--out DIR`` into
DIR either way, so a quick run of every script can share one folder for
``benchmarks/report.py DIR``. Each script announces its folder on stderr as
``results: DIR``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def interpreter() -> str:
    """``cpython3.11``: the implementation and version a result file is for."""
    version = sys.version_info
    return f"{sys.implementation.name}{version[0]}.{version[1]}"


def folder(out: Path | None, quick: bool) -> Path:
    """The folder to write into, created, and announced on stderr."""
    chosen = out or (
        Path(tempfile.mkdtemp(prefix="wool-pooling-bench-")) if quick else RESULTS
    )
    chosen.mkdir(parents=True, exist_ok=True)
    print(f"results: {chosen}", file=sys.stderr)
    return chosen


def meta(quick: bool, seconds: float) -> dict[str, object]:
    """What every result file records about the run that made it."""
    return {
        "python": sys.version,
        "interpreter": interpreter(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "quick": quick,
        "seconds": seconds,
    }


def write(
    out: Path, name: str, meta: dict[str, Any], rows: list[dict[str, Any]]
) -> Path:
    """Write ``name-<interpreter>.json`` into ``out``, the run's ``meta`` and its
    ``rows`` as JSON, and announce it on stderr (with ``meta["seconds"]``)."""
    path = out / f"{name}-{interpreter()}.json"
    path.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    took = f" ({meta['seconds']:.0f} s)" if "seconds" in meta else ""
    print(f"results: {path}{took}", file=sys.stderr)
    return path
