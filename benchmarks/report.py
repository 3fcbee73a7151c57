"""Turn the benchmarks' result files into Markdown tables and the throughput plot.

    python benchmarks/report.py [DIR]      # default: benchmarks/results

Reads ``pooling-*.json`` (``pooling.py``), pyperf's ``throughput-*.json`` and
``memory-*.json`` (``throughput.py``) from DIR; writes ``DIR/report.md``
(every table, also printed) and ``DIR/throughput.png`` (with matplotlib).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
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


def median_of(rows: list[dict[str, Any]], get: Callable[[dict[str, Any]], Any]) -> Any:
    values = [value for value in map(get, rows) if value is not None]
    return statistics.median(values) if values else None


def median_ratio(
    pooled: list[dict[str, Any]],
    raw: list[dict[str, Any]],
    get: Callable[[dict[str, Any]], Any],
    unit: str,
    digits: int = 1,
) -> str:
    """The median over runs of each run's pooled / raw, then both medians."""
    raw_by_run = {row.get("run", 0): row for row in raw}
    ratios = []
    for row in pooled:
        other = raw_by_run.get(row.get("run", 0))
        if other is not None and get(row) is not None and get(other):
            ratios.append(get(row) / get(other))
    p, r = median_of(pooled, get), median_of(raw, get)
    if p is None or r is None:
        return "-"
    value = f"{statistics.median(ratios):.2f}x" if ratios else "-"
    return f"{value} ({p:,.{digits}f} / {r:,.{digits}f}{unit})"


def cannot(raw: list[dict[str, Any]]) -> str | None:
    """What a raw configuration that could not run all K consumers says."""
    row = raw[0]
    if not row["failed"]:
        return None
    reason = "inotify limit" if "inotify" in (row["error"] or "") else row["error"]
    return f"cannot: {reason}"


def pooling_tables(path: Path) -> list[str]:
    report = json.loads(path.read_text())
    meta, rows = report["meta"], report["rows"]
    by: dict[tuple[str, int], dict[bool, list[Any]]] = defaultdict(
        lambda: {True: [], False: []}
    )
    for row in rows:
        by[row["kind"], row["k"]][row["pooled"]].append(row)
    runs = meta.get("runs", 1)
    lines = [
        f"## Pooling: K consumers of one discovery, raw and pooled ({path.name})",
        "",
        f"`python benchmarks/pooling.py`: {meta['python'].split()[0]}, "
        f"{meta['platform']}, {meta['cpus']} CPUs; {runs} alternating run(s), "
        f"{meta['seconds']:.0f} s in all. Each cell: the median over the runs "
        "of pooled / raw, then the medians (pooled / raw).",
        "",
        "Upstream subscriptions: watchdog observers open (pooled / raw), and "
        "consumers whose subscription failed to open.",
        "",
        "| discovery | K | upstream subscriptions | idle CPU (% of a core) | "
        "RSS MB | RSS KB per consumer |",
        "|---|---:|---|---|---|---|",
    ]
    for (kind, k), pair in by.items():
        pooled, raw = pair[True], pair[False]
        upstreams = f"{pooled[0]['observers']} / {raw[0]['observers']}"
        for name, group in (("pooled", pooled), ("raw", raw)):
            if group[0]["failed"]:
                upstreams += f"; {name}: {group[0]['failed']:,} failed"
                upstreams += f" ({group[0]['error']})"
        lines.append(
            f"| {kind} | {k:,} | {upstreams} | "
            + median_ratio(pooled, raw, lambda r: 100 * r["idle_cpu"], "%")
            + " | "
            + median_ratio(pooled, raw, lambda r: r["rss_mb"], "")
            + " | "
            + median_ratio(pooled, raw, lambda r: r.get("rss_kb_per_consumer"), "")
            + " |"
        )
    lines += [
        "",
        "Dispatch through `wool.WorkerPool(spawn=2)`, K client tasks, raw and "
        "pooled with the same `poll_interval`: `leaf` (plain) and `nested` (a "
        "routine dispatching `leaf` from the worker); per dispatch, the pickled "
        "proxy wool ships with every task, the parent's time to pickle it and a "
        "worker's to unpickle it.",
        "",
        "| discovery | K | leaf dispatches/s | leaf p50 ms | nested dispatches/s "
        "| nested p50 ms | nested p99 ms | proxy bytes | parent pickle µs "
        "| worker unpickle µs |",
        "|---|---:|---|---|---|---|---|---|---|---|",
    ]
    for (kind, k), pair in by.items():
        pooled, raw = pair[True], pair[False]
        if pooled[0].get("dispatch") is None:
            continue
        leaf = "dispatch_leaf" if pooled[0].get("dispatch_leaf") else "dispatch"
        serialise = "serialise" in pooled[0]
        cells = [
            median_ratio(pooled, raw, lambda r, d=leaf: r[d]["per_second"], "", 0),
            median_ratio(pooled, raw, lambda r, d=leaf: 1e3 * r[d]["p50"], ""),
            median_ratio(pooled, raw, lambda r: r["dispatch"]["per_second"], "", 0),
            median_ratio(pooled, raw, lambda r: 1e3 * r["dispatch"]["p50"], ""),
            median_ratio(pooled, raw, lambda r: 1e3 * r["dispatch"]["p99"], ""),
        ]
        for field in ("proxy_bytes", "parent_dumps_us", "worker_loads_us"):
            cells.append(
                median_ratio(pooled, raw, lambda r, f=field: r["serialise"][f], "", 0)
                if serialise
                else "-"
            )
        failures = "".join(
            f"; {name}: {group[0]['dispatch']['failed']:,} failed "
            f"({group[0]['dispatch']['error']})"
            for name, group in (("pooled", pooled), ("raw", raw))
            if group[0]["dispatch"]["failed"]
        )
        lines.append(f"| {kind} | {k:,} | " + " | ".join(cells) + failures + " |")
    workers = sorted({w for row in rows for w in row["converge"]}, key=int)
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
        pooled, raw = pair[True], pair[False]
        blocked = cannot(raw)
        cells = []
        for w in workers:
            for what in ("added", "dropped"):
                if w not in pooled[0]["converge"]:
                    cells.append("-")
                elif blocked:
                    p = median_of(pooled, lambda r, w=w, x=what: r["converge"][w][x])
                    cells.append(f"{p:,.2f} s; raw: {blocked}")
                else:
                    cells.append(
                        median_ratio(
                            pooled,
                            raw,
                            lambda r, w=w, x=what: r["converge"][w][x],
                            " s",
                            2,
                        )
                    )
        lines.append(f"| {kind} | {k:,} | " + " | ".join(cells) + " |")
    big = [w for w in workers if int(w) >= 1000]
    if big and "added_rate" in rows[0]["converge"][workers[0]]:
        w = big[0]
        fanout = meta.get("fanout", {})
        lines += [
            "",
            f"Pooled delivery rate at W={int(w):,}: K x W deliveries over the "
            "convergence time less the publisher's own time, against the "
            f"fan-out's own rate at N={fanout.get('n', 1000):,} (the same "
            "per-event consumer work), measured in the same process.",
            "",
            "| discovery | K | publisher s (add / drop) | adds/s | drops/s "
            "| fan-out/s | adds / fan-out | drops / fan-out |",
            "|---|---:|---|---|---|---|---|---|",
        ]
        for (kind, k), pair in by.items():
            pooled = [
                r for r in pair[True] if w in r["converge"] and r.get("fanout_rate")
            ]
            if not pooled:
                continue
            add = median_of(pooled, lambda r: r["converge"][w]["added_rate"])
            drop = median_of(pooled, lambda r: r["converge"][w]["dropped_rate"])
            fan = median_of(pooled, lambda r: r["fanout_rate"])
            pub_add = median_of(pooled, lambda r: r["converge"][w]["added_publisher"])
            pub_drop = median_of(
                pooled, lambda r: r["converge"][w]["dropped_publisher"]
            )
            add_ratio = median_of(
                pooled, lambda r: r["converge"][w]["added_rate"] / r["fanout_rate"]
            )
            drop_ratio = median_of(
                pooled, lambda r: r["converge"][w]["dropped_rate"] / r["fanout_rate"]
            )
            lines.append(
                f"| {kind} | {k:,} | {pub_add:.2f} / {pub_drop:.2f} | "
                f"{human(add)} | {human(drop)} | {human(fan)} | "
                f"{add_ratio:.2f}x | {drop_ratio:.2f}x |"
            )
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
