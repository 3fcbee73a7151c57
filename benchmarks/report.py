"""Render the benchmarks' result files into one Markdown report and the plots.

Every figure the README and the docs quote comes from here::

    python benchmarks/report.py benchmarks/results --readme README.md
    python benchmarks/report.py DIR                  # a quick run's folder
    python benchmarks/report.py --check benchmarks/results --readme README.md

Reads, from DIR, whichever of these it finds (other files are left alone):
``pooling-*.json`` (``pooling.py``), ``pooling_k1-*.json`` (``pooling_k1.py``),
``pooling_redis-*.json`` (``pooling_redis.py``), pyperf's ``throughput-*.json``
and ``memory-*.json`` (``throughput.py``), ``soak-*.json`` (``soak.py
--out``), ``soak_redis*.json`` (``soak_redis.py``) and
``wrapper_ceiling-*.json`` (``wrapper_ceiling.py --out``). Writes:

- ``DIR/report.md``: every table, in Markdown (also printed); the docs show
  ``benchmarks/results/report.md`` as a page of their own, through MyST;
- ``DIR/throughput-<interpreter>.png``: per interpreter, each
  implementation's delivered items/s as a multiple of wool's ``Fanout``
  in the same run (with matplotlib; skipped without it);
- with ``--readme README.md``: the README's summary table and the newest
  interpreter's throughput plot with its table, between its two marks.

Each benchmark's tables are rendered by a module next to this one:
``_report_pooling.py`` (``pooling.py``, ``pooling_k1.py``, ``pooling_redis.py``,
the summary),
``_report_fanout.py`` (``throughput.py``), ``_report_checks.py`` (the soaks,
the wrapper ceiling) and ``_report_plot.py`` (the plots), all in the
Markdown of ``_report_markdown.py``. This script puts them in order,
writes the report and the README's part, and checks them.

The output depends on the result files only (no clock, no machine), so
re-rendering the committed files reproduces the committed report: ``--check``
renders in memory and exits 1, naming the file, if a committed one (the
README's part included, with ``--readme``) differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from _report_checks import soak_blocks
from _report_checks import soak_redis_blocks
from _report_checks import storm_redis_blocks
from _report_checks import wrapper_blocks
from _report_fanout import Rates
from _report_fanout import batched
from _report_fanout import interpreter_of
from _report_fanout import load_throughput
from _report_fanout import memory_blocks
from _report_fanout import side_by_side_blocks
from _report_fanout import throughput_blocks
from _report_fanout import versus_blocks
from _report_fanout import versus_table
from _report_markdown import load
from _report_markdown import markdown
from _report_markdown import table
from _report_plot import plot
from _report_pooling import k1_summary
from _report_pooling import pooling_blocks
from _report_pooling import pooling_k1_blocks
from _report_pooling import pooling_redis_blocks
from _report_pooling import summary_blocks
from _report_pooling import summary_table

RESULTS = Path(__file__).resolve().parent / "results"
README_BEGIN = (
    "<!-- rendered by benchmarks/report.py --readme README.md: do not edit -->"
)
README_END = "<!-- end of what benchmarks/report.py renders -->"

#: Each throughput file, by interpreter: its path, metadata and rates.
Runs = dict[str, tuple[Path, dict[str, Any], Rates]]
#: Each file that records its run time: its glob, what ran, its key in ``meta``.
RUN_TIMES = (
    ("pooling-*.json", "pooling.py", "seconds"),
    ("pooling_k1-*.json", "pooling_k1.py", "seconds"),
    ("pooling_redis-*.json", "pooling_redis.py", "seconds"),
    ("memory-*.json", "throughput.py (pyperf cases and memory cases)", "run_seconds"),
)


def run_time_blocks(folder: Path) -> list[str]:
    """How long each recorded run took, from the file itself."""
    rows = [
        [path.name, what, f"{seconds:,.1f}"]
        for pattern, what, key in RUN_TIMES
        for path in sorted(folder.glob(pattern))
        if (seconds := load(path)["meta"].get(key)) is not None
    ]
    if not rows:
        return []
    return ["## Run times", "Recorded by each run, in its file.",
            table("file | what ran | run (s)", "llr", rows)]  # fmt: skip


# -- the whole report, and the README's part -----------------------------------


def throughput_runs(folder: Path) -> Runs:
    """Each throughput file, by interpreter: its path, metadata and rates."""
    runs: Runs = {}
    for path in sorted(folder.glob("throughput-*.json")):
        meta, rates = load_throughput(path)
        runs[interpreter_of(path, meta)] = (path, meta, rates)
    return runs


def summary(folder: Path) -> tuple[Path | None, Path | None]:
    """The pooling file and the Redis pooling file the summary comes from."""
    poolings = sorted(folder.glob("pooling-*.json"))
    redises = sorted(folder.glob("pooling_redis-*.json"))
    return next(iter(poolings), None), next(iter(redises), None)


def k1_file(folder: Path) -> Path | None:
    """The file of one consumer's convergence paired in one process, if any."""
    return next(iter(sorted(folder.glob("pooling_k1-*.json"))), None)


def render(folder: Path, runs: Runs, plotted: set[str]) -> list[str]:
    """Every block of the report, from the files of ``folder``; ``plotted``
    names the interpreters whose plot is next to them."""
    blocks = [
        "# Benchmark results",
        "Rendered by `python benchmarks/report.py benchmarks/results` from the "
        "result files next to it; every table names the file it comes from. Ratios "
        "are what to read: absolute figures drift with the machine's load.",
    ]
    blocks += summary_blocks(*summary(folder))
    if (k1 := k1_summary(k1_file(folder))) is not None:
        blocks.append(k1)
    if runs:
        blocks.append("## Fan-out throughput against wool's Fanout")
        for interp, (_, _, rates) in runs.items():
            blocks += versus_blocks(interp, rates, interp in plotted)
    poolings = sorted(folder.glob("pooling-*.json"))
    k1s = sorted(folder.glob("pooling_k1-*.json"))
    redises = sorted(folder.glob("pooling_redis-*.json"))
    if poolings or k1s or redises:
        blocks.append("## Pooling: every figure")
        for path in poolings:
            blocks += pooling_blocks(path)
        for path in k1s:
            blocks += pooling_k1_blocks(path)
        for path in redises:
            blocks += pooling_redis_blocks(path)
    memories = sorted(folder.glob("memory-*.json"))
    if runs or memories:
        blocks.append("## Fan-out: every figure")
        for path, meta, rates in runs.values():
            blocks += throughput_blocks(path, rates, meta)
        if len(runs) > 1:
            blocks += side_by_side_blocks({i: r for i, (_, _, r) in runs.items()})
        for path in memories:
            blocks += memory_blocks(path)
    soaks = sorted(folder.glob("soak-*.json"))
    fleet = sorted(folder.glob("soak_redis*.json"))
    storms = sorted(folder.glob("storm_redis*.json"))
    ceilings = sorted(folder.glob("wrapper_ceiling-*.json"))
    if soaks or fleet or storms or ceilings:
        blocks.append("## Checks and limits")
        if soaks:
            blocks += soak_blocks(soaks)
        for path in fleet:
            blocks += soak_redis_blocks(path)
        for path in storms:
            blocks += storm_redis_blocks(path)
        if ceilings:
            blocks += wrapper_blocks(ceilings)
    return blocks + run_time_blocks(folder)


def repository() -> str:
    """The project's repository URL, as ``pyproject.toml`` gives it."""
    import tomllib

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    return str(tomllib.loads(pyproject.read_text())["project"]["urls"]["Source"])


def readme_part(folder: Path, runs: Runs, plotted: set[str]) -> str:
    """What the README shows of the report: the summary table, then the
    throughput plot of the newest interpreter recorded (an absolute URL, for
    a package index page) next to its table; the others are in the docs."""
    local = summary_table(*summary(folder))
    blocks = [] if local is None else [local]
    if (k1 := k1_summary(k1_file(folder))) is not None:
        blocks.append(k1)
    versus = {interp: versus_table(rates) for interp, (_, _, rates) in runs.items()}
    newest = [interp for interp, table in versus.items() if table is not None]
    if newest:
        interp = newest[-1]
        raw = repository().replace("github.com", "raw.githubusercontent.com")
        image = f"{raw}/main/benchmarks/results/throughput-{interp}.png"
        alt = f"{interp}: delivered items/s as a multiple of wool's Fanout"
        blocks.append(
            f"The fan-out underneath, on {interp}: delivered items/s as a multiple "
            "of wool's\nown `Fanout` in the same run; the table gives `Fanout`'s, "
            "then (in brackets) its\nmultiple of the wake-up limit (N tasks woken "
            "once per item, nothing else)"
            + (
                ", then its multiple of the same limit per batch\nof the read-ahead's "
                "items (`wake-up per batch`)."
                if batched(runs[interp][2])
                else "."
            )
        )
        blocks += [f"![{alt}]({image})"] if interp in plotted else []
        blocks.append(versus[interp])
    return markdown([README_BEGIN, *blocks, README_END]).rstrip("\n")


def with_readme_part(text: str, part: str) -> str:
    """``text`` with what lies between the README's marks replaced by ``part``."""
    start = text.index(README_BEGIN)
    return text[:start] + part + text[text.index(README_END) + len(README_END) :]


# -- the command line ----------------------------------------------------------


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/report.py",
        description="Render the benchmarks' result files of DIR into DIR/report.md "
        "and the throughput plots.",
        epilog="A quick run of every script into one folder, then its report: "
        "pooling.py, throughput.py, pooling_redis.py, soak.py and wrapper_ceiling.py, "
        "each with --quick --out DIR, then report.py DIR.",
    )
    parser.add_argument(
        "folder", metavar="DIR", nargs="?", type=Path, default=RESULTS,
        help="the results folder (default: benchmarks/results)",
    )  # fmt: skip
    parser.add_argument(
        "--check", action="store_true",
        help="render in memory, write nothing; exit 1 if DIR/report.md (or "
        "README's part) differs from what the result files give",
    )  # fmt: skip
    parser.add_argument(
        "--readme", type=Path, metavar="README",
        help="also render the summary table and the throughput plot with its "
        "table into README, between its two marks",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder")
    if args.readme is not None:
        readme = args.readme.read_text(encoding="utf-8")
        if README_BEGIN not in readme or README_END not in readme:
            parser.error(f"{args.readme} has no marks: {README_BEGIN} ... {README_END}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    folder: Path = args.folder
    runs = throughput_runs(folder)
    if args.check:
        plotted = {i for i in runs if (folder / f"throughput-{i}.png").is_file()}
    else:
        plotted = {i for i, (_, _, r) in runs.items()
                   if plot(i, r, folder / f"throughput-{i}.png")}  # fmt: skip
    report = markdown(render(folder, runs, plotted))
    outputs = {folder / "report.md": report}
    if args.readme is not None:
        readme = args.readme.read_text(encoding="utf-8")
        part = readme_part(folder, runs, plotted)
        outputs[args.readme] = with_readme_part(readme, part)
    if args.check:
        command = f"python benchmarks/report.py {folder}" + (
            f" --readme {args.readme}" if args.readme else ""
        )
        stale = [
            path
            for path, text in outputs.items()
            if not path.is_file() or path.read_text(encoding="utf-8") != text
        ]
        for path in stale:
            print(f"{path} is stale: run {command}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        path.write_text(text, encoding="utf-8")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
