"""Smoke runs of the benchmarks in quick mode: they run, and write where they say.

Nothing here looks at timings: the figures depend on the machine. The tests
check that every case was measured (so a script cannot rot silently), that
``--quick`` leaves the committed results alone, and that the report renders.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyperf

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
RESULTS = BENCHMARKS / "results"
INTERPRETER = f"{sys.implementation.name}{sys.version_info[0]}.{sys.version_info[1]}"


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def snapshot() -> dict[str, int]:
    """The committed results' files and their modification times."""
    return {path.name: path.stat().st_mtime_ns for path in RESULTS.iterdir()}


def folder_of(stderr: str) -> Path:
    """The results folder a run announces on stderr (``results: DIR``)."""
    line = next(line for line in stderr.splitlines() if line.startswith("results: "))
    return Path(line.removeprefix("results: ").split(" (")[0])


def expected_throughput_names() -> set[str]:
    backends = ["asyncio"]
    backends += ["uvloop"] if importable("uvloop") else []
    backends += ["trio"] if importable("trio") else []
    names: set[str] = set()
    for backend in backends:
        for source in ("never", "checkpoint", "waiting"):
            for n in (1, 10, 100, 1000):
                implementations = ["Fanout", "SharedSubscription", "pump + streams"]
                implementations.append("wake-up only")
                if backend != "trio":
                    implementations.append("wool Fanout")
                if importable("asyncstdlib"):
                    implementations.append("asyncstdlib.tee")
                if n == 1:
                    implementations.append("raw source")
                names.update(f"{backend}/{source}/{i}/N={n}" for i in implementations)
        for workers in (10, 100):
            names.update(
                f"join/{backend}/W={workers}/{w}" for w in ("arrival", "replay")
            )
    return names


def test_throughput_quick_run_measures_every_case_in_a_temporary_folder() -> None:
    """Without ``--out``, a quick run writes a pyperf file per interpreter elsewhere."""
    before = snapshot()
    done = run("throughput.py", "--quick", "--quiet")
    assert snapshot() == before  # the committed results are untouched
    out = folder_of(done.stderr)
    assert RESULTS not in out.parents
    assert out != RESULTS

    suite = pyperf.BenchmarkSuite.load(str(out / f"throughput-{INTERPRETER}.json"))
    assert suite.get_metadata()["python_version"].startswith(sys.version.split()[0])
    names = {bench.get_name() for bench in suite.get_benchmarks()}
    assert names == expected_throughput_names()
    assert all(bench.median() > 0 for bench in suite.get_benchmarks())

    memory = json.loads((out / f"memory-{INTERPRETER}.json").read_text())
    assert memory["meta"]["python"] == sys.version
    rows = {row["case"]: row for row in memory["rows"]}
    events = memory["meta"]["events"]
    assert rows['Fanout(max_lag=1024, on_lag="error")']["buffered"] == 1024
    assert rows['Fanout(max_lag=1024, on_lag="error")']["skipped"] == events - 1 - 1024
    assert rows["SharedSubscription (pool, default max_lag=1024)"]["buffered"] == 1024
    assert rows["Fanout(max_lag=None), unbounded"]["buffered"] == events - 1
    assert rows["raw source"]["view_equal"] is None
    assert all(
        row["view_equal"] is True for case, row in rows.items() if case != "raw source"
    )

    report = run("report.py", str(out)).stdout
    assert "### asyncio, source waits for another task per item" in report
    assert "| 1000 | Fanout |" in report
    assert "view equal after resume" in report
    if importable("matplotlib"):
        assert (out / "throughput.png").is_file()


def test_pooling_quick_run_counts_one_upstream_when_pooled(tmp_path: Path) -> None:
    """``pooling.py --quick --out DIR``: raw opens K upstreams, pooled one."""
    run("pooling.py", "--quick", "--out", str(tmp_path))
    report = json.loads((tmp_path / f"pooling-{INTERPRETER}.json").read_text())
    assert report["meta"]["python"] == sys.version
    rows = {(row["kind"], row["pooled"], row["k"]): row for row in report["rows"]}
    assert set(rows) == {
        ("local", pooled, k) for pooled in (False, True) for k in (1, 10)
    }
    for (_, pooled, k), row in rows.items():
        assert row["observers"] == (1 if pooled else k)
        assert row["dispatch"]["dispatches"] > 0
        assert row["dispatch"]["p50"] <= row["dispatch"]["p99"]
        assert set(row["converge"]) == {"10"}
    report_text = run("report.py", str(tmp_path)).stdout
    assert "| local | 10 | 1 / 10 |" in report_text


CEILING = BENCHMARKS / "wrapper_ceiling.py"


def test_wrapper_ceiling_script_prints_a_ratio_per_backend() -> None:
    """`benchmarks/wrapper_ceiling.py` runs on both backends and prints each ratio."""
    for backend in ("asyncio", "trio"):
        done = subprocess.run(
            [
                sys.executable,
                str(CEILING),
                "--backend",
                backend,
                "--items",
                "2000",
                "--reps",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        lines = done.stdout.splitlines()
        names = [
            "coroutine",
            "async generator",
            "task per item",
            "wool_pooling.Fanout",
        ]
        assert len(lines) == len(names)
        for line, name in zip(lines, names, strict=True):
            assert line.startswith(f"{backend}: {name} / floor = ")
            ratio = float(line.split("= ")[1].split("x")[0])
            assert 0 < ratio < 10
