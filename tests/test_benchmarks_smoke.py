"""Smoke run of `benchmarks/fanout_throughput.py --quick`: it runs, writes its files.

Nothing here looks at timings: the figures depend on the machine. The test
checks that every implementation importable here was measured, so the script
cannot rot silently.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fanout_throughput.py"


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def expected_implementations() -> set[str]:
    names = {"fanout", "shared_subscription", "pump_streams", "floor"}
    if importable("wool.utilities.fanout"):
        names.add("wool_fanout")
    if importable("asyncstdlib"):
        names.add("tee")
    return names


def test_quick_run_measures_every_importable_implementation(tmp_path: Path) -> None:
    """The quick run exits 0 and reports throughput, memory and join for each one."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    table = tmp_path / "fanout_throughput.md"
    raw = tmp_path / "fanout_throughput.json"
    assert table.is_file()
    assert raw.is_file()
    assert "| N | implementation |" in table.read_text(encoding="utf-8")
    assert "| N | implementation |" in done.stdout  # the table is printed too
    if importable("matplotlib"):
        assert (tmp_path / "fanout_throughput.png").is_file()

    report = json.loads(raw.read_text(encoding="utf-8"))
    expected = expected_implementations()
    backends = {"asyncio", *(["trio"] if importable("trio") else [])}
    assert set(report["meta"]["implementations"]) == expected
    assert backends <= set(report["meta"]["backends"])

    measured = {
        (entry["backend"], entry["source"], entry["implementation"], entry["n"])
        for entry in report["throughput"]
    }
    for backend in backends:
        for source in ("never-suspending", "one-checkpoint"):
            assert (backend, source, "floor", 1) in measured
            for implementation in expected - {"floor"}:
                if implementation == "wool_fanout" and backend == "trio":
                    continue  # wool's Fanout runs on asyncio only
                for n in (1, 10, 100, 1000):
                    assert (backend, source, implementation, n) in measured
    for entry in report["throughput"]:
        assert len(entry["rates"]) >= 3
        assert entry["min"] <= entry["median"] <= entry["max"]

    memory = {entry["implementation"]: entry for entry in report["memory"]}
    bounded = {
        "fanout_bounded",
        "shared_subscription",
        "shared_subscription_unbounded",
    }
    assert set(memory) == expected | bounded
    assert all(entry["events"] == 20_000 for entry in report["memory"])
    # The bounded rows hold at most max_lag events for the stalled consumer;
    # every stalled consumer ends with the reader's view of the workers.
    max_lag = report["meta"]["default_max_lag"]
    assert memory["fanout_bounded"]["buffered_at_end"] == max_lag
    assert memory["shared_subscription"]["buffered_at_end"] == max_lag
    assert memory["fanout"]["buffered_at_end"] == 20_000 - 1
    assert memory["fanout_bounded"]["lagged_skipped"] == 20_000 - 1 - max_lag
    for name, entry in memory.items():
        assert entry["view_equal"] is (None if name == "floor" else True), name
    assert "view equal after resume" in table.read_text(encoding="utf-8")
    assert {entry["backend"] for entry in report["join"]} >= backends
    assert all(len(entry["replay_seconds"]) >= 3 for entry in report["join"])


CEILING = SCRIPT.with_name("wrapper_ceiling.py")


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


PULL_TARGETS = SCRIPT.with_name("pull_targets.py")


def test_pull_targets_quick_run_has_a_row_per_case(tmp_path: Path) -> None:
    """`benchmarks/pull_targets.py --quick` exits 0 and fills every table row."""
    out = tmp_path / "x.md"
    done = subprocess.run(
        [sys.executable, str(PULL_TARGETS), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    text = out.read_text(encoding="utf-8")
    assert sys.version in text
    assert out.with_suffix(".json").is_file()

    rows: set[tuple[str, str, int, str]] = set()
    section: tuple[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("### "):
            backend, source = line[4:].split(" / ")
            section = (backend, source)
        elif line.startswith("| ") and not line.startswith("| N |"):
            assert section is not None, line
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            assert len(cells) == 7, line
            float(cells[3].replace(",", ""))  # the median is a number
            rows.add((*section, int(cells[0]), cells[1]))

    backends = ["asyncio"]
    backends += ["uvloop"] if importable("uvloop") else []
    backends += ["trio"] if importable("trio") else []
    expected: set[tuple[str, str, int, str]] = set()
    for backend in backends:
        names = ["wool_pooling.Fanout"]
        if importable("wool.utilities.fanout"):
            names.append(
                "wool Fanout (asyncio)" if backend == "trio" else "wool Fanout"
            )
        if importable("asyncstdlib"):
            names.append("asyncstdlib.tee")
        for source in ("never", "checkpoint", "waiting"):
            expected.add((backend, source, 1, "floor"))
            for n in (1, 10, 100, 1000):
                expected.update((backend, source, n, name) for name in names)
    assert rows == expected
