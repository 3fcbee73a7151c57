"""Turn the benchmarks' result files into Markdown tables and the throughput plot.

    python benchmarks/report.py [DIR]      # default: benchmarks/results

Reads ``pooling-*.json`` (``pooling.py``), pyperf's ``throughput-*.json`` and
``memory-*.json`` (``throughput.py``) from DIR; writes ``DIR/report.md``
(every table, also printed) and ``DIR/throughput.png`` (with matplotlib).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
#: One colour per implementation, on every panel of the plot.
COLORS = {
    name: f"C{index}"
    for index, name in enumerate(
        [
            "Fanout",
            "SharedSubscription",
            "wool Fanout",
            "asyncstdlib.tee",
            "pump + streams",
            "wake-up only",
        ]
    )
}
SOURCES = {
    "never": "never suspends",
    "checkpoint": "one checkpoint per item",
    "waiting": "waits for another task per item",
}


def ratio(pooled: float, raw: float, unit: str, digits: int = 1) -> str:
    """``pooled / raw`` as a ratio, then both absolutes."""
    value = f"{pooled / raw:.2f}x" if raw else "-"
    return f"{value} ({pooled:,.{digits}f} / {raw:,.{digits}f}{unit})"


def pooling_tables(path: Path) -> list[str]:
    report = json.loads(path.read_text())
    meta, rows = report["meta"], report["rows"]
    by: dict[tuple[str, int], dict[bool, Any]] = defaultdict(dict)
    for row in rows:
        by[row["kind"], row["k"]][row["pooled"]] = row
    lines = [
        f"## Pooling: K consumers of one discovery, raw and pooled ({path.name})",
        "",
        f"`python benchmarks/pooling.py`: {meta['python'].split()[0]}, "
        f"{meta['platform']}, {meta['cpus']} CPUs; run {meta['seconds']:.0f} s. "
        "Each cell: pooled / raw as a ratio, then (pooled / raw).",
        "",
        "Upstream subscriptions: watchdog observers open (pooled / raw), and "
        "consumers whose subscription failed to open.",
        "",
        "| discovery | K | upstream subscriptions | idle CPU (% of a core) | "
        "RSS MB | dispatches/s | p50 ms | p99 ms |",
        "|---|---:|---|---|---|---|---|---|",
    ]
    for (kind, k), pair in by.items():
        pooled, raw = pair[True], pair[False]
        pd, rd = pooled["dispatch"], raw["dispatch"]
        upstreams = f"{pooled['observers']} / {raw['observers']}"
        for name, row in (("pooled", pooled), ("raw", raw)):
            if row["failed"]:
                upstreams += f"; {name}: {row['failed']:,} failed ({row['error']})"
        failures = "".join(
            f"; {name}: {d['failed']:,} failed ({d['error']})"
            for name, d in (("pooled", pd), ("raw", rd))
            if d["failed"]
        )
        lines.append(
            f"| {kind} | {k:,} | {upstreams} | "
            f"{ratio(100 * pooled['idle_cpu'], 100 * raw['idle_cpu'], '%')} | "
            f"{ratio(pooled['rss_mb'], raw['rss_mb'], '')} | "
            f"{ratio(pd['per_second'], rd['per_second'], '', 0)}{failures} | "
            f"{ratio(1e3 * pd['p50'], 1e3 * rd['p50'], '')} | "
            f"{ratio(1e3 * pd['p99'], 1e3 * rd['p99'], '')} |"
        )
    workers = list(rows[0]["converge"])
    lines += [
        "",
        "Convergence: seconds from publishing the first of W workers (or drops) "
        "until every consumer holds the full view; pooled / raw.",
        "",
        "| discovery | K | "
        + " | ".join(f"W={int(w):,} added | W={int(w):,} dropped" for w in workers)
        + " |",
        "|---|---:|" + "---|---|" * len(workers),
    ]
    for (kind, k), pair in by.items():
        cells = []
        for w in workers:
            for what in ("added", "dropped"):
                p, r = pair[True]["converge"][w][what], pair[False]["converge"][w][what]
                cells.append(ratio(p, r, " s", 2))
        lines.append(f"| {kind} | {k:,} | " + " | ".join(cells) + " |")
    return lines


def load_throughput(path: Path) -> tuple[dict[str, Any], dict[str, float]]:
    import pyperf

    suite = pyperf.BenchmarkSuite.load(str(path))
    rates = {bench.get_name(): 1 / bench.median() for bench in suite.get_benchmarks()}
    return suite.get_metadata(), rates


def human(rate: float) -> str:
    if rate >= 1e6:
        return f"{rate / 1e6:.2f}M"
    return f"{rate / 1e3:.1f}k" if rate >= 1e3 else f"{rate:.0f}"


def throughput_tables(path: Path, rates: dict[str, float], meta: dict[str, Any]):
    lines = [
        f"## Throughput: {meta['python_version']} ({path.name})",
        "",
        "Delivered items/s (median of pyperf's values), N consumers each taking "
        "every item. wool's `Fanout` runs on asyncio only: trio rows compare "
        "with its asyncio figure.",
    ]
    groups: dict[tuple[str, str], dict[tuple[str, int], float]] = defaultdict(dict)
    for name, rate in rates.items():
        if name.startswith("join/"):
            continue
        backend, source, implementation, n = name.split("/")
        groups[backend, source][implementation, int(n[2:])] = rate
    for (backend, source), group in groups.items():
        lines += [
            "",
            f"### {backend}, source {SOURCES[source]}",
            "",
            "| N | implementation | items/s | vs wool Fanout | vs wake-up only "
            "| vs raw source |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for (implementation, n), rate in group.items():
            base = "asyncio" if backend == "trio" else backend
            wool = rates.get(f"{base}/{source}/wool Fanout/N={n}")
            wake = group.get(("wake-up only", n))
            floor = group.get(("raw source", 1))
            cells = [human(rate)]
            cells += [f"{rate / x:.2f}x" if x else "-" for x in (wool, wake, floor)]
            lines.append(f"| {n} | {implementation} | " + " | ".join(cells) + " |")
    join: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for name, rate in rates.items():
        if name.startswith("join/"):
            _, backend, w, what = name.split("/")
            join[backend, int(w[2:])][what] = 1e3 / rate  # ms
    lines += [
        "",
        "### Late join: a second consumer's replay of W known workers",
        "",
        "| backend | W | arrival of W events (ms) | late joiner's replay (ms) | "
        "replay / arrival |",
        "|---|---:|---:|---:|---:|",
    ]
    for (backend, w), times in join.items():
        lines.append(
            f"| {backend} | {w:,} | {times['arrival']:.3f} | {times['replay']:.3f} | "
            f"{times['replay'] / times['arrival']:.2f}x |"
        )
    return lines


def side_by_side(runs: dict[str, dict[str, float]], implementation: str) -> list[str]:
    """One implementation on every interpreter: items/s, vs wool Fanout, vs wake-up."""
    lines = [
        f"## {implementation} on {', '.join(runs)}",
        "",
        "Each cell: delivered items/s, then vs wool's `Fanout` / vs `wake-up only` "
        "(same run, same source and N; trio compares with wool on asyncio).",
    ]
    for source, label in SOURCES.items():
        lines += ["", f"### Source {label}", ""]
        lines += ["| backend | N | " + " | ".join(runs) + " |"]
        lines += ["|---|---:|" + "---:|" * len(runs)]
        for backend in ("asyncio", "uvloop", "trio"):
            for n in (1, 10, 100, 1000):
                cells = []
                for rates in runs.values():
                    rate = rates.get(f"{backend}/{source}/{implementation}/N={n}")
                    if rate is None:
                        cells.append("-")
                        continue
                    base = "asyncio" if backend == "trio" else backend
                    wool = rates.get(f"{base}/{source}/wool Fanout/N={n}")
                    wake = rates[f"{backend}/{source}/wake-up only/N={n}"]
                    versus = f"{rate / wool:.2f}x" if wool else "-"
                    cells.append(f"{human(rate)} ({versus} / {rate / wake:.2f}x)")
                if any(cell != "-" for cell in cells):
                    lines.append(f"| {backend} | {n:,} | " + " | ".join(cells) + " |")
    return lines


def memory_table(path: Path) -> list[str]:
    report = json.loads(path.read_text())
    meta = report["meta"]
    lines = [
        f"## Memory: one consumer stalled, another takes {meta['events']:,} "
        f"discovery events over 100 workers ({path.name})",
        "",
        f"{meta['python'].split()[0]}, asyncio, each case in a fresh process; whole "
        f"throughput run (pyperf and memory): {meta['run_seconds']:.0f} s. Peak = "
        "growth of the peak RSS until the reader is done; buffered = what the "
        "fan-out still holds for the stalled consumer; held = buffered x one "
        "event's size.",
        "",
        "| implementation | peak MB | bytes/event | buffered at end | held (est.) "
        "| stalled consumer on resume | view equal after resume |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for row in report["rows"]:
        resume = "-"
        if row["skipped"]:
            resume = f"Lagged(skipped={row['skipped']:,}), then {row['resumed']:,}"
            resume += " events"
        elif row["resumed"] is not None:
            resync = row["buffered"] and row["resumed"] < row["buffered"]
            kind = "resync diff: " if resync else ""
            resume = f"{kind}{row['resumed']:,} events"
        buffered = "-" if row["buffered"] is None else f"{row['buffered']:,}"
        held = "-" if row["held_mb"] is None else f"{row['held_mb']:.2f} MB"
        equal = {None: "-", True: "yes", False: "**no**"}[row["view_equal"]]
        lines.append(
            f"| {row['case']} | {row['peak_mb']:.2f} | "
            f"{row['peak_mb'] * 1e6 / row['events']:.1f} | {buffered} | {held} | "
            f"{resume} | {equal} |"
        )
    return lines


def plot(runs: dict[str, dict[str, float]], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {name.split("/")[0] for rates in runs.values() for name in rates}
    backends = [b for b in ("asyncio", "uvloop", "trio") if b in names]
    figure, axes = plt.subplots(
        len(SOURCES), len(backends), figsize=(5 * len(backends), 11), squeeze=False
    )
    for (interp, rates), style in zip(runs.items(), ("-", "--"), strict=False):
        for row, source in enumerate(SOURCES):
            for column, backend in enumerate(backends):
                ax = axes[row][column]
                lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
                for name, rate in rates.items():
                    parts = name.split("/")
                    if parts[:2] == [backend, source] and parts[2] != "raw source":
                        lines[parts[2]].append((int(parts[3][2:]), rate))
                for label, points in lines.items():
                    ns, ys = zip(*sorted(points), strict=True)
                    ax.plot(ns, ys, style, marker="o", color=COLORS.get(label),
                            label=f"{label} ({interp})")  # fmt: skip
                ax.set(xscale="log", yscale="log", title=f"{backend}, {source}")
                ax.set(xlabel="N consumers", ylabel="delivered items/s")
    axes[0][0].legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    return True


def main() -> int:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    lines = ["# Benchmark results", ""]
    for path in sorted(folder.glob("pooling-*.json")):
        lines += [*pooling_tables(path), ""]
    runs: dict[str, dict[str, float]] = {}
    for path in sorted(folder.glob("throughput-*.json")):
        meta, rates = load_throughput(path)
        runs[meta["wool_pooling_interpreter"]] = rates
        lines += [*throughput_tables(path, rates, meta), ""]
    if len(runs) > 1:
        lines += [*side_by_side(runs, "Fanout"), ""]
    for path in sorted(folder.glob("memory-*.json")):
        lines += [*memory_table(path), ""]
    if runs and plot(runs, folder / "throughput.png"):
        lines += ["![delivered items/s against N](throughput.png)", ""]
    text = "\n".join(lines)
    (folder / "report.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
