"""Smoke runs of the benchmarks in quick mode: they run, and write where they say.

Nothing here looks at timings: the figures depend on the machine. The tests
check that every case was measured (so a script cannot rot silently), that
``--quick`` leaves the committed results alone, that a quick run of every
script shares one folder that the report renders, and that the committed
report is what the committed result files render.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _tools import require_modules

MISSING_TOOLS = require_modules("pyperf", "matplotlib", "asyncstdlib", extra="bench")
if MISSING_TOOLS is None:
    import pyperf

# Each test runs scripts for a while (the fixture runs every one): more time than
# the suite's per-test timeout, wherever the tests are run from.
pytestmark = [pytest.mark.benchmarks, pytest.mark.timeout(900)]

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
RESULTS = BENCHMARKS / "results"
INTERPRETER = f"{sys.implementation.name}{sys.version_info[0]}.{sys.version_info[1]}"


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run(
    script: str, *args: str, returncode: int = 0
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == returncode, done.stderr[-4000:]
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
                implementations += ["wake-up only", "wake-up per batch"]
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


@pytest.fixture(scope="module")
def quick(request: pytest.FixtureRequest) -> dict[str, Any]:
    """A quick run of every benchmark into one folder, then its report.

    ``throughput.py --quick`` without ``--out`` picks a temporary folder (the
    committed results are left alone); every other script is then given that
    folder with ``--out``, and ``report.py`` renders it. ``pooling_redis.py``
    runs against the tests' redis-server when there is one.
    """
    before = snapshot()
    throughput = run("throughput.py", "--quick")
    out = folder_of(throughput.stderr)
    outputs = {"throughput.py": throughput}
    outputs["pooling.py"] = run("pooling.py", "--quick", "--out", str(out))
    outputs["pooling_k1.py"] = run("pooling_k1.py", "--quick", "--out", str(out))
    for backend in ("asyncio", "trio"):
        outputs[f"soak.py {backend}"] = run(
            "soak.py", "--quick", "--backend", backend, "--out", str(out)
        )
    outputs["wrapper_ceiling.py"] = run(
        "wrapper_ceiling.py", "--quick", "--out", str(out)
    )
    redis_url = None
    with contextlib.suppress(pytest.skip.Exception):
        redis_url = request.getfixturevalue("redis_server").url
    if redis_url is not None:
        outputs["pooling_redis.py"] = run(
            "pooling_redis.py", "--quick", "--url", redis_url, "--out", str(out)
        )
    outputs["report.py"] = run("report.py", str(out))
    after = snapshot()
    return {"out": out, "outputs": outputs, "before": before, "after": after}


def test_quick_runs_leave_the_committed_results_alone(quick: dict[str, Any]) -> None:
    """Quick runs write into their own folder, never ``benchmarks/results``."""
    assert quick["after"] == quick["before"]
    assert RESULTS not in quick["out"].parents
    assert quick["out"] != RESULTS


def test_throughput_quick_run_measures_every_case_quietly(
    quick: dict[str, Any],
) -> None:
    """A quick run writes a pyperf file per interpreter with every case, and
    prints none of pyperf's "may be unstable" warnings."""
    out = quick["out"]
    done = quick["outputs"]["throughput.py"]
    assert "unstable" not in done.stdout + done.stderr
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
    for row in rows.values():  # the median of MEMORY_RUNS fresh processes
        assert len(row["peak_mb_runs"]) == 3
        assert row["peak_mb"] == sorted(row["peak_mb_runs"])[1]


def test_pooling_quick_run_counts_one_upstream_when_pooled(
    quick: dict[str, Any],
) -> None:
    """``pooling.py --quick --out DIR``: raw opens K upstreams, pooled one."""
    report = json.loads((quick["out"] / f"pooling-{INTERPRETER}.json").read_text())
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
        assert len(row["converge"]["10"]["rounds"]) == 3


def test_pooling_k1_quick_run_pairs_a_raw_and_a_pooled_round(
    quick: dict[str, Any],
) -> None:
    """``pooling_k1.py --quick --out DIR``: one process, rounds of raw and
    pooled in turn over one publisher, each timed with its publisher's part."""
    report = json.loads((quick["out"] / f"pooling_k1-{INTERPRETER}.json").read_text())
    assert report["meta"]["python"] == sys.version
    [row] = report["rows"]
    assert row["kind"] == "local"
    [pair] = row["pairs"]["10"]
    assert pair["order"] == ["raw", "pooled"]
    for name in ("raw", "pooled"):
        figures = pair[name]
        for what in ("added", "dropped"):
            assert figures[what] > figures[f"{what}_publisher"] > 0
            assert figures[f"{what}_tail"] == pytest.approx(
                figures[what] - figures[f"{what}_publisher"]
            )


def test_pooling_k1_report_takes_the_median_of_each_pair_s_ratio() -> None:
    """The K = 1 table's ratio is the median over the pairs of each pair's
    pooled / raw (not the ratio of the medians), and the floor the median of
    the tails' difference per change."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _report_pooling
    finally:
        sys.path.remove(str(BENCHMARKS))

    def pair(pooled: float, raw: float) -> dict[str, Any]:
        return {
            "pooled": {"added": pooled, "added_tail": pooled / 10},
            "raw": {"added": raw, "added_tail": raw / 10},
        }

    pairs = [pair(1.0, 2.0), pair(3.0, 2.0), pair(4.0, 4.0)]
    # ratios 0.5, 1.5, 1.0: median 1.0; medians of the figures 3.0 / 2.0
    assert _report_pooling.k1_ratio(pairs, "added", 1, " s", 2) == (
        "1.00x (3.00 / 2.00 s)"
    )
    # tails' differences -0.1, +0.1, 0 s over 1,000 changes: median 0 µs
    assert _report_pooling.k1_floor(pairs, "1000", "added") == 0
    pairs.append(pair(2.2, 2.0))  # +0.02 s: the median is now +0.01 s, 10 µs
    assert _report_pooling.k1_floor(pairs, "1000", "added") == pytest.approx(10.0)


def test_convergence_caption_counts_the_rounds_each_figure_is_the_median_of() -> None:
    """The pooling report's convergence caption counts each row's rounds:
    one count when every K has the same, else the count per K."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _report_pooling
    finally:
        sys.path.remove(str(BENCHMARKS))

    def row(k: int, rounds: int) -> dict[str, Any]:
        return {"k": k, "converge": {"1000": {"rounds": [{}] * rounds}}}

    said = _report_pooling.rounds_said
    assert said([row(1, 3), row(10_000, 3)]) == "the median of 3 rounds per process"
    assert said([row(1, 1)]) == "one round"
    assert said([row(1, 3), row(10, 3), row(10_000, 1)]) == (
        "the median of the rounds per process, K = 1: 3, K = 10: 3, K = 10,000: 1"
    )


def test_soak_and_wrapper_ceiling_write_their_results_with_out(
    quick: dict[str, Any],
) -> None:
    """``soak.py --out`` and ``wrapper_ceiling.py --out`` write JSON next to the
    others: the soak's summary (nothing lost) and every wrapper's ratio."""
    out = quick["out"]
    for backend in ("asyncio", "trio"):
        soak = json.loads((out / f"soak-{backend}-{INTERPRETER}.json").read_text())
        assert soak["result"]["ok"] is True
        assert soak["result"]["backend"] == backend
        assert soak["result"]["lost"] == soak["result"]["duplicated"] == 0
        assert soak["result"]["consumers"] == 50
    ceiling = json.loads(
        (out / f"wrapper_ceiling-asyncio-{INTERPRETER}.json").read_text()
    )
    assert [row["wrapper"] for row in ceiling["rows"]] == [
        "coroutine",
        "async generator",
        "one task",
        "wool_pooling.Fanout",
    ]
    assert all(row["median"] > 0 for row in ceiling["rows"])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_handoff_quick_run_times_every_layer_against_direct(backend: str) -> None:
    """``handoff.py --quick`` times a burst through every layer, on either
    backend, and prints each figure: positive, the direct iteration's the
    reference."""
    done = run("handoff.py", "--quick", "--backend", backend)
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["backend"] == backend
    layers = figures["us_per_event"]
    assert list(layers) == [
        "direct",
        "Fanout",
        "shared_subscription",
        "SharedDiscovery",
    ]
    assert all(value > 0 for value in layers.values())
    for layer in layers:
        assert any(line.startswith(layer) for line in done.stdout.splitlines())


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_read_ahead_quick_run_rates_every_source_at_every_value(backend: str) -> None:
    """``read_ahead.py --quick`` measures every source at every read-ahead
    it is given, R = 0 first, and prints each row: positive rates, one
    cell per value."""
    done = run("read_ahead.py", "--quick", "--backend", backend, "--values", "0", "8")
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["backend"] == backend
    assert figures["values"] == [0, 8]
    rows = figures["rows"]
    assert [(row["source"], row["n"]) for row in rows] == [
        (source, n)
        for source in ("never", "checkpoint", "waiting", "discovery")
        for n in (1, 10)
    ]
    assert all(list(row["rates"]) == ["0", "8"] for row in rows)
    assert all(rate > 0 for row in rows for rate in row["rates"].values())
    printed = done.stdout.splitlines()[2:-1]
    assert len(printed) == len(rows)
    assert all(line.count("x") == 2 for line in printed)


def test_read_ahead_refuses_values_not_starting_at_zero() -> None:
    """R = 0 is every ratio's reference: ``--values`` must start with it."""
    done = run("read_ahead.py", "--values", "4", "0", returncode=2)
    assert "--values must start with 0" in done.stderr


def test_report_renders_every_result_of_the_shared_folder(
    quick: dict[str, Any],
) -> None:
    """``report.py DIR`` renders every script's results into ``report.md``
    (also printed), its only report, and draws the plot per interpreter."""
    out = quick["out"]
    printed = quick["outputs"]["report.py"].stdout
    report = (out / "report.md").read_text()
    assert printed.rstrip("\n") == report.rstrip("\n")
    for shown in (
        "## Summary: what pooling buys",
        "| local | 10 | 1 / 10 |",
        f"### {INTERPRETER}",
        "#### asyncio, source waits for another task per item",
        "| 1,000 | Fanout |",
        "view equal after resume",
        "### Soak: consumers joining and leaving at random",
        f"| soak-trio-{INTERPRETER}.json | trio | 50 |",
        "| wool_pooling.Fanout |",
        f"### One consumer, raw and pooled paired in one process (pooling_k1-"
        f"{INTERPRETER}.json)",
        "At K = 1 a change is mostly the publisher's own time",
        "## Run times",
    ):
        assert shown in report, shown
    if "pooling_redis.py" in quick["outputs"]:
        assert "| redis | 3 | 2 / 6 connections |" in report
        assert f"(pooling_redis-{INTERPRETER}.json)" in report
    assert not (out / "report.rst").exists()
    if importable("matplotlib"):
        assert (out / f"throughput-{INTERPRETER}.png").is_file()
        assert f"per backend and source](throughput-{INTERPRETER}.png)" in report


@pytest.mark.parametrize(
    "script",
    [
        "handoff.py",
        "pooling.py",
        "pooling_k1.py",
        "pooling_redis.py",
        "read_ahead.py",
        "report.py",
        "soak.py",
        "statistics_overhead.py",
        "throughput.py",
        "wrapper_ceiling.py",
    ],
)
def test_every_benchmark_script_has_a_command_line_help(script: str) -> None:
    """``--help`` prints a usage line naming the script, and exits 0."""
    done = run(script, "--help")
    assert done.stdout.startswith("usage: ")
    assert script in done.stdout.splitlines()[0]
    assert "--help" in done.stdout


def test_committed_report_is_what_the_committed_results_render() -> None:
    """``report.py --check benchmarks/results --readme README.md`` passes:
    ``report.md`` and the README's figures are what the committed result
    files give, and each throughput file has its plot."""
    readme = BENCHMARKS.parent / "README.md"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "report.py"),
            "--check",
            str(RESULTS),
            "--readme",
            str(readme),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for path in RESULTS.glob("throughput-*.json"):
        assert path.with_suffix(".png").is_file(), path


def test_report_check_fails_on_a_stale_report(tmp_path: Path) -> None:
    """``--check`` exits 1, naming the file, when a rendered figure differs
    (in ``report.md``, or in the README's part), and names no other file."""
    results = tmp_path / "results"
    results.mkdir()
    for path in RESULTS.iterdir():
        shutil.copy(path, results / path.name)
    readme = tmp_path / "README.md"
    readme.write_text((BENCHMARKS.parent / "README.md").read_text())

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(BENCHMARKS / "report.py"), "--check", str(results),
             "--readme", str(readme)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )  # fmt: skip

    assert check().returncode == 0
    report = (results / "report.md").read_text()
    (results / "report.md").write_text(report.replace("| 0.", "| 9.", 1))
    done = check()
    assert done.returncode == 1
    assert "report.md is stale" in done.stderr
    assert "README.md is stale" not in done.stderr
    (results / "report.md").write_text(report)
    text = readme.read_text()
    readme.write_text(text.replace("| local | 10 | 1 / 10 |", "| local | 10 | 1 / 9 |"))
    done = check()
    assert done.returncode == 1
    assert "README.md is stale" in done.stderr
    assert "report.md is stale" not in done.stderr


def test_throughput_plot_shows_ratios_to_wool_per_backend_with_the_limit() -> None:
    """The plot of one interpreter: a panel per backend (a row per source),
    one line per implementation at its items/s over wool's ``Fanout`` in the
    same run, the wake-up limit as its own line, and the legend outside the
    axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _report_fanout
        import _report_plot
    finally:
        sys.path.remove(str(BENCHMARKS))
    path = RESULTS / "throughput-cpython3.11.json"
    _, rates = _report_fanout.load_throughput(path)
    figure = _report_plot.ratio_figure("cpython3.11", rates)
    try:
        axes = figure.get_axes()
        assert [ax.get_title() for ax in axes[:3]] == [
            "asyncio",
            "uvloop",
            "trio (vs wool on asyncio)",
        ]
        assert len(axes) == 3 * 3
        assert all(ax.get_legend() is None for ax in axes)
        (legend,) = figure.legends
        labels = [text.get_text() for text in legend.get_texts()]
        assert "wake-up limit" in labels
        assert "Fanout" in labels
        assert "wool Fanout" not in labels
        asyncio_waiting = axes[2 * 3]  # row: waits for another task; column: asyncio
        lines = {line.get_label(): line for line in asyncio_waiting.get_lines()}
        ns = [1, 10, 100, 1000]
        expected = [
            rates[f"asyncio/waiting/Fanout/N={n}"]
            / rates[f"asyncio/waiting/wool Fanout/N={n}"]
            for n in ns
        ]
        assert list(lines["Fanout"].get_xdata()) == ns
        assert list(lines["Fanout"].get_ydata()) == pytest.approx(expected)
        limit = [
            rates[f"asyncio/waiting/wake-up only/N={n}"]
            / rates[f"asyncio/waiting/wool Fanout/N={n}"]
            for n in ns
        ]
        assert list(lines["wake-up limit"].get_ydata()) == pytest.approx(limit)
    finally:
        plt.close(figure)
    assert not (RESULTS / "throughput.png").exists()  # one figure per interpreter
