"""Render the benchmarks' result files into one Markdown report and the plots.

Every figure the README and the docs quote comes from here::

    python benchmarks/report.py benchmarks/results --readme README.md
    python benchmarks/report.py DIR                  # a quick run's folder
    python benchmarks/report.py --check benchmarks/results --readme README.md

Reads, from DIR, whichever of these it finds (other files are left alone):
``pooling-*.json`` (``pooling.py``), ``pooling_redis-*.json``
(``pooling_redis.py``), pyperf's ``throughput-*.json`` and ``memory-*.json``
(``throughput.py``), ``soak-*.json`` (``soak.py --out``), ``soak_redis*.json``
(``soak_redis.py``) and ``wrapper_ceiling-*.json`` (``wrapper_ceiling.py
--out``). Writes:

- ``DIR/report.md``: every table, in Markdown (also printed); the docs show
  ``benchmarks/results/report.md`` as a page of their own, through MyST;
- ``DIR/throughput-<interpreter>.png``: per interpreter, each
  implementation's delivered items/s as a multiple of wool's ``Fanout``
  in the same run (with matplotlib; skipped without it);
- with ``--readme README.md``: the README's summary table and the newest
  interpreter's throughput plot with its table, between its two marks.

The output depends on the result files only (no clock, no machine), so
re-rendering the committed files reproduces the committed report: ``--check``
renders in memory and exits 1, naming the file, if a committed one (the
README's part included, with ``--readme``) differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SOURCES = {
    "never": "never suspends",
    "checkpoint": "one checkpoint per item",
    "waiting": "waits for another task per item",
}
BACKENDS = ("asyncio", "uvloop", "trio")
#: The comparison every throughput ratio is taken against.
WOOL = "wool Fanout"
#: The scheduler's limit: N tasks woken once per item, no log at all.
WAKE = "wake-up only"
#: One colour per implementation, on every panel of every plot.
COLORS = {
    "Fanout": "C0",
    "SharedSubscription": "C1",
    "asyncstdlib.tee": "C3",
    "pump + streams": "C4",
}
README_BEGIN = (
    "<!-- rendered by benchmarks/report.py --readme README.md: do not edit -->"
)
README_END = "<!-- end of what benchmarks/report.py renders -->"

Row = dict[str, Any]
#: Rows by (discovery, K): the pooled runs and the raw runs.
Pairs = dict[tuple[str, int], tuple[list[Row], list[Row]]]
Rates = dict[str, float]
#: ``(backend, source) -> (implementation, N) -> items/s``.
Cases = dict[tuple[str, str], dict[tuple[str, int], float]]


# -- Markdown and numbers ------------------------------------------------------


def table(header: str, align: str, rows: list[list[str]]) -> str:
    """A Markdown table: ``header`` is its cells joined by `` | ``, ``align``
    holds ``l`` or ``r`` per column."""
    rule = "|".join("---:" if a == "r" else "---" for a in align)
    lines = [f"| {header} |", f"|{rule}|"]
    return "\n".join(lines + [f"| {' | '.join(row)} |" for row in rows])


def markdown(blocks: Iterable[str]) -> str:
    """Headings, paragraphs, tables and images, a blank line after each."""
    return "".join(f"{block}\n\n" for block in blocks)[:-1]


def number(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def pair(pooled: float, raw: float, digits: int, unit: str = "") -> str:
    """``pooled / raw``, both absolutes."""
    return f"{number(pooled, digits)} / {number(raw, digits)}{unit}"


def human(rate: float) -> str:
    if rate >= 1e6:
        return f"{rate / 1e6:.2f}M"
    return f"{rate / 1e3:.1f}k" if rate >= 1e3 else f"{rate:.0f}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def share(rate: float, of: float | None) -> str:
    """``rate`` as a multiple of ``of``; ``-`` without ``of``."""
    return times(rate / of if of else None)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def version(meta: dict[str, Any]) -> str:
    return str(meta.get("python", "?")).split()[0]


# -- pooling.py ----------------------------------------------------------------


def pooling_pairs(rows: list[Row]) -> Pairs:
    """Rows by (discovery, K): the pooled runs and the raw runs, where both ran."""
    by: Pairs = defaultdict(lambda: ([], []))
    for row in rows:
        by[row["kind"], row["k"]][0 if row["pooled"] else 1].append(row)
    return {key: (pooled, raw) for key, (pooled, raw) in by.items() if pooled and raw}


def median_of(rows: list[Row], get: Callable[[Row], Any]) -> Any:
    values = [value for value in map(get, rows) if value is not None]
    return statistics.median(values) if values else None


def median_ratio(
    pooled: list[Row], raw: list[Row], get: Callable[[Row], Any], unit: str, digits=1
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
    return f"{value} ({pair(p, r, digits, unit)})"


def converged(w: str, what: str) -> Callable[[Row], float]:
    """A row's seconds until every consumer saw the W workers ``added``/``dropped``."""
    return lambda row: row["converge"][w][what]


def cannot(raw: list[Row]) -> str | None:
    """What a raw configuration that could not run all K consumers says."""
    row = raw[0]
    if not row["failed"]:
        return None
    reason = "inotify limit" if "inotify" in (row["error"] or "") else row["error"]
    return f"cannot: {reason}"


def upstreams(pooled: list[Row], raw: list[Row]) -> str:
    text = f"{pooled[0].get('observers', '-')} / {raw[0].get('observers', '-')}"
    for name, group in (("pooled", pooled), ("raw", raw)):
        if group[0].get("failed"):
            text += f"; {name}: {group[0]['failed']:,} failed ({group[0].get('error')})"
    return text


def pooling_blocks(path: Path) -> list[str]:
    report = load(path)
    meta, rows = report["meta"], report["rows"]
    by = pooling_pairs(rows)
    idle = [
        [kind, f"{k:,}", upstreams(pooled, raw),
         median_ratio(pooled, raw, lambda r: 100 * r["idle_cpu"], "%"),
         median_ratio(pooled, raw, lambda r: r["rss_mb"], ""),
         median_ratio(pooled, raw, lambda r: r.get("rss_kb_per_consumer"), "")]
        for (kind, k), (pooled, raw) in by.items()
    ]  # fmt: skip
    blocks = [
        f"### K consumers of one discovery, raw and pooled ({path.name})",
        f"`python benchmarks/pooling.py`: {version(meta)}, "
        f"{meta.get('platform', '?')}, {meta.get('cpus', '?')} CPUs, wool "
        f"{meta.get('wool', '?')}; {meta.get('runs', 1)} alternating run(s), "
        f"{meta.get('seconds', 0):.0f} s in all. Each cell: the median over the "
        "runs of pooled / raw, then the medians (pooled / raw). Upstream "
        "subscriptions: watchdog observers open (pooled / raw), and consumers "
        "whose subscription failed to open.",
        table(
            "discovery | K | upstream subscriptions | idle CPU (% of a core) | "
            "RSS MB | RSS KB per consumer",
            "lrllll",
            idle,
        ),
    ]
    return blocks + dispatch_blocks(by) + convergence_blocks(by, rows, meta)


def dispatch_row(kind: str, k: int, pooled: list[Row], raw: list[Row]) -> list[str]:
    leaf = "dispatch_leaf" if pooled[0].get("dispatch_leaf") else "dispatch"

    def rate(key: str) -> str:
        return median_ratio(pooled, raw, lambda r: r[key]["per_second"], "", 0)

    def ms(key: str, quantile: str) -> str:
        return median_ratio(pooled, raw, lambda r: 1e3 * r[key][quantile], "")

    def serialise(field: str) -> str:
        if "serialise" not in pooled[0]:
            return "-"
        return median_ratio(pooled, raw, lambda r: r["serialise"][field], "", 0)

    failed = "".join(
        f"; {name}: {group[0]['dispatch']['failed']:,} failed "
        f"({group[0]['dispatch']['error']})"
        for name, group in (("pooled", pooled), ("raw", raw))
        if group[0]["dispatch"]["failed"]
    )
    return [
        *(kind, f"{k:,}", rate(leaf), ms(leaf, "p50"), rate("dispatch")),
        *(ms("dispatch", "p50"), ms("dispatch", "p99"), serialise("proxy_bytes")),
        *(serialise("parent_dumps_us"), serialise("worker_loads_us") + failed),
    ]


def dispatch_blocks(by: Pairs) -> list[str]:
    rows = [
        dispatch_row(kind, k, pooled, raw)
        for (kind, k), (pooled, raw) in by.items()
        if pooled[0].get("dispatch") is not None
    ]
    if not rows:
        return []
    return [
        "Dispatch through `wool.WorkerPool(spawn=2)`, K client tasks, raw and "
        "pooled with the same `poll_interval`, both pools open side by side in one "
        "process and measured in alternating bursts, in two processes per run (one "
        "opens raw first, the other pooled first): `leaf` (plain) and `nested` (a "
        "routine dispatching `leaf` from the worker); per dispatch, the pickled "
        "proxy wool ships with every task, the parent's time to pickle it and a "
        "worker's to unpickle it.",
        table(
            "discovery | K | leaf dispatches/s | leaf p50 ms | nested dispatches/s | "
            "nested p50 ms | nested p99 ms | proxy bytes | parent pickle µs | "
            "worker unpickle µs",
            "lrllllllll",
            rows,
        ),
    ]


def convergence(pooled: list[Row], raw: list[Row], w: str, what: str) -> str:
    """Seconds until all K saw W workers ``what``: pooled / raw, or pooled alone."""
    if w not in pooled[0].get("converge", {}):
        return "-"
    blocked = cannot(raw)
    if blocked:
        return f"{number(median_of(pooled, converged(w, what)), 2)} s; raw: {blocked}"
    return median_ratio(pooled, raw, converged(w, what), " s", 2)


def convergence_blocks(by: Pairs, rows: list[Row], meta: dict[str, Any]) -> list[str]:
    workers = sorted({w for row in rows for w in row.get("converge", {})}, key=int)
    if not workers:
        return []
    changes = [(w, what) for w in workers for what in ("added", "dropped")]
    header = " | ".join(["discovery", "K"] + [f"W={int(w):,} {x}" for w, x in changes])
    blocks = [
        "Convergence: seconds from publishing the first of W workers (or drops) "
        "until every consumer holds the full view (below K = 10,000, the median "
        "of three rounds per process); pooled / raw.",
        table(
            header,
            "lr" + "l" * len(changes),
            [
                [kind, f"{k:,}", *(convergence(pooled, raw, w, x) for w, x in changes)]
                for (kind, k), (pooled, raw) in by.items()
            ],
        ),
    ]
    big = [w for w in workers if int(w) >= 1000]
    if big and "added_rate" in rows[0].get("converge", {}).get(workers[0], {}):
        blocks += delivery_rate_blocks(by, big[0], meta.get("fanout", {}))
    return blocks


def delivery_rate_row(kind: str, k: int, runs: list[Row], w: str) -> list[str]:
    conv = [r["converge"][w] for r in runs]
    fan = [r["fanout_rate"] for r in runs]

    def median(key: str) -> float:
        return statistics.median(c[key] for c in conv)

    def against_fanout(key: str) -> str:
        shares = [c[key] / f for c, f in zip(conv, fan, strict=True)]
        return f"{statistics.median(shares):.2f}x"

    return [kind, f"{k:,}",
            f"{median('added_publisher'):.2f} / {median('dropped_publisher'):.2f}",
            human(median("added_rate")), human(median("dropped_rate")),
            human(statistics.median(fan)), against_fanout("added_rate"),
            against_fanout("dropped_rate")]  # fmt: skip


def delivery_rate_blocks(by: Pairs, w: str, fanout: Row) -> list[str]:
    """Pooled deliveries per second at W workers against the fan-out's own rate."""
    rows = []
    for (kind, k), (pooled, _) in by.items():
        runs = [r for r in pooled if w in r["converge"] and r.get("fanout_rate")]
        if runs:
            rows.append(delivery_rate_row(kind, k, runs, w))
    if not rows:
        return []
    return [
        f"Pooled delivery rate at W={int(w):,}: K x W deliveries over the "
        "convergence time less the publisher's own time, against the fan-out's "
        f"own rate at N={fanout.get('n', 1000):,} (the same per-event consumer "
        "work), measured in the same process.",
        table(
            "discovery | K | publisher s (add / drop) | adds/s | drops/s | "
            "fan-out/s | adds / fan-out | drops / fan-out",
            "lrllllll",
            rows,
        ),
    ]


# -- pooling_redis.py ----------------------------------------------------------


def redis_pairs(rows: list[Row]) -> dict[int, tuple[Row, Row]]:
    """Rows by K consumers, in order: the pooled one and the unpooled one."""
    by: dict[int, dict[bool, Row]] = defaultdict(dict)
    for row in rows:
        by[row["consumers"]][row["pooled"]] = row
    both = {k: two for k, two in sorted(by.items()) if len(two) == 2}
    return {k: (two[True], two[False]) for k, two in both.items()}


def pooling_redis_blocks(path: Path) -> list[str]:
    report = load(path)
    meta = report["meta"]
    rows = [
        [f"{k:,}", f"{p['connections']} / {u['connections']}",
         pair(p["ready_s"], u["ready_s"], 3),
         pair(p["convergence_ms"], u["convergence_ms"], 2),
         pair(p["idle_cpu_pct"], u["idle_cpu_pct"], 2),
         pair(p["server_idle_cpu_pct"], u["server_idle_cpu_pct"], 2)]
        for k, (p, u) in redis_pairs(report["rows"]).items()
    ]  # fmt: skip
    return [
        f"### Redis discovery, pooled and unpooled ({path.name})",
        "`python benchmarks/pooling_redis.py`: K consumers of one namespace in one "
        "process, pooled (`RedisDiscovery(...)`) and unpooled "
        f"(`RedisDiscovery(..., shared=False)`); CPython {version(meta)}, "
        f"redis-server {meta.get('redis_server', '?')} on loopback, redis-py "
        f"{meta.get('redis_py', '?')}; {meta.get('rounds', '?')} publishes per row "
        f"(median), idle over {meta.get('idle', '?')} s. Each cell: pooled / "
        "unpooled. Connections are the namespace's subscriber connections on the "
        "server (`CLIENT LIST`, by name).",
        table(
            "K consumers | connections | ready (s) | publish -> all K have it (ms) | "
            "idle CPU, this process (% of a core) | idle CPU, redis-server (%)",
            "rrrrrr",
            rows,
        ),
    ]


# -- the summary: what pooling buys --------------------------------------------


def local_summary_row(
    kind: str, k: int, pooled: list[Row], raw: list[Row]
) -> list[str]:
    change = "-"
    if converge := pooled[0].get("converge", {}):
        w = max(converge, key=int)
        p = median_of(pooled, converged(w, "added"))
        if blocked := cannot(raw):
            change = f"{number(p, 2)} s; raw: {blocked}"
        else:
            change = pair(p, median_of(raw, converged(w, "added")), 2, " s")
        change += f" ({int(w):,} workers added)"
    idle = [median_of(group, lambda r: 100 * r["idle_cpu"]) for group in (pooled, raw)]
    return [kind, f"{k:,}", upstreams(pooled, raw), pair(*idle, 1), change]


def summary_table(pooling: Path | None, redis: Path | None) -> str | None:
    """Upstream connections, idle CPU and the time a change takes to reach
    every consumer, pooled against one subscription per consumer."""
    rows = []
    if pooling is not None:
        for (kind, k), (pooled, raw) in pooling_pairs(load(pooling)["rows"]).items():
            rows.append(local_summary_row(kind, k, pooled, raw))
    if redis is not None:
        for k, (p, u) in redis_pairs(load(redis)["rows"]).items():
            rows.append(
                ["redis", f"{k:,}", f"{p['connections']} / {u['connections']} "
                 "connections", pair(p["idle_cpu_pct"], u["idle_cpu_pct"], 2),
                 f"{pair(p['convergence_ms'], u['convergence_ms'], 2, ' ms')} "
                 "(one publish)"]
            )  # fmt: skip
    if not rows:
        return None
    return table(
        "discovery | K consumers | upstream subscriptions | idle CPU (% of a core) "
        "| a change reaches all K",
        "lrlll",
        rows,
    )


def summary_blocks(pooling: Path | None, redis: Path | None) -> list[str]:
    summary = summary_table(pooling, redis)
    if summary is None:
        return []
    sources = " and ".join(f"`{path.name}`" for path in (pooling, redis) if path)
    return [
        "## Summary: what pooling buys",
        "K consumers of one discovery in one process; each cell: pooled / one "
        f"subscription per consumer, measured in the same run (from {sources}). "
        "`local` is `wool.LocalDiscovery` (raw: a subscriber per consumer; pooled: "
        "`SharedDiscovery`), its upstreams being watchdog observers; `redis` is "
        "`wool_pooling.redis.RedisDiscovery` (unpooled: `shared=False`).",
        summary,
    ]


# -- throughput.py -------------------------------------------------------------


def load_throughput(path: Path) -> tuple[dict[str, Any], Rates]:
    """pyperf's metadata, and items/s per case from its fastest value: the
    others carry what the shared machine's other processes took (see
    docs/benchmarks.rst), the same way for every case."""
    import pyperf

    suite = pyperf.BenchmarkSuite.load(str(path))
    rates = {bench.get_name(): 1 / min(bench.get_values()) for bench in suite}
    return suite.get_metadata(), rates


def interpreter_of(path: Path, meta: dict[str, Any]) -> str:
    return str(meta.get("wool_pooling_interpreter") or path.stem.split("-", 1)[-1])


def wool_rate(rates: Rates, backend: str, source: str, n: int) -> float | None:
    """wool's ``Fanout`` for the same case (on asyncio for trio: it has no trio)."""
    base = "asyncio" if backend == "trio" else backend
    return rates.get(f"{base}/{source}/{WOOL}/N={n}")


def cases(rates: Rates) -> Cases:
    """Each ``{backend}/{source}/{implementation}/N={n}`` case, by backend, source."""
    groups: Cases = defaultdict(dict)
    for name, rate in rates.items():
        parts = name.split("/")
        if len(parts) == 4 and parts[0] != "join" and parts[3].startswith("N="):
            backend, source, implementation, n = parts
            groups[backend, source][implementation, int(n[2:])] = rate
    return groups


def ordered(found: Iterable[str], known: Iterable[str]) -> list[str]:
    """The names found, once each: the known ones in their order, then the rest."""
    names = list(dict.fromkeys(found))
    return [*(n for n in known if n in names), *(n for n in names if n not in known)]


def backends_sources(groups: Cases) -> tuple[list[str], list[str]]:
    """The backends and the sources of ``groups``, the known ones first."""
    backends = ordered((backend for backend, _ in groups), BACKENDS)
    return backends, ordered((source for _, source in groups), SOURCES)


def ns_of(groups: Iterable[dict[tuple[str, int], float]]) -> list[int]:
    return sorted({n for group in groups for _, n in group})


def versus_cell(rates: Rates, backend: str, source: str, n: int) -> str | None:
    """``Fanout`` at N: vs wool's ``Fanout`` (vs the wake-up limit)."""
    group = cases(rates).get((backend, source), {})
    rate = group.get(("Fanout", n))
    if rate is None:
        return None
    wool = wool_rate(rates, backend, source, n)
    return f"{share(rate, wool)} ({share(rate, group.get((WAKE, n)))})"


def versus_table(rates: Rates) -> str | None:
    """Fanout against wool's Fanout and the limit, per backend, source and N."""
    groups = cases(rates)
    ns, rows = ns_of(groups.values()), []
    backends, sources = backends_sources(groups)
    for backend in backends:
        for source in sources:
            if any(i == "Fanout" for i, _ in groups.get((backend, source), {})):
                cells = [versus_cell(rates, backend, source, n) or "-" for n in ns]
                rows.append([backend, SOURCES.get(source, source), *cells])
    if not rows:
        return None
    header = " | ".join(["backend", "source"] + [f"N={n:,}" for n in ns])
    return table(header, "ll" + "r" * len(ns), rows)


def versus_blocks(interp: str, rates: Rates, plotted: bool) -> list[str]:
    """The plot and its table."""
    versus = versus_table(rates)
    if versus is None:
        return []
    alt = f"{interp}: delivered items/s as a multiple of wool's Fanout"
    image = [f"![{alt}, per backend and source](throughput-{interp}.png)"]
    return [
        f"### {interp}",
        *(image if plotted else []),
        f"`throughput-{interp}.json`: `Fanout`'s delivered items/s as a multiple of "
        "wool's `Fanout` in the same run, then (in brackets) of the wake-up limit, "
        "per backend, source and N consumers; trio compares with wool on asyncio.",
        versus,
    ]


def throughput_blocks(path: Path, rates: Rates, meta: dict[str, Any]) -> list[str]:
    blocks = [
        f"### Throughput, {meta.get('python_version', '?')} ({path.name})",
        "Delivered items/s (the fastest of pyperf's values), N consumers each taking "
        "every item; then as a multiple of wool's `Fanout` (trio rows: of its "
        "asyncio figure), of the wake-up limit and of the raw source at N = 1.",
    ]
    for (backend, source), group in cases(rates).items():
        floor = group.get(("raw source", 1))
        rows = [
            [f"{n:,}", implementation, human(rate)]
            + [share(rate, of) for of in (wool_rate(rates, backend, source, n),
                                          group.get((WAKE, n)), floor)]
            for (implementation, n), rate in group.items()
        ]  # fmt: skip
        blocks += [
            f"#### {backend}, source {SOURCES.get(source, source)} ({path.name})",
            table(
                "N | implementation | items/s | vs wool Fanout | vs wake-up only | "
                "vs raw source",
                "rlrrrr",
                rows,
            ),
        ]
    return blocks + join_blocks(path, rates)


def join_blocks(path: Path, rates: Rates) -> list[str]:
    """``join/{backend}/W={w}/arrival|replay``: a late joiner's replay."""
    join: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for name, rate in rates.items():
        parts = name.split("/")
        if len(parts) == 4 and parts[0] == "join":
            join[parts[1], int(parts[2][2:])][parts[3]] = 1e3 / rate  # ms
    rows = [
        [backend, f"{w:,}", f"{t['arrival']:.3f}", f"{t['replay']:.3f}",
         f"{t['replay'] / t['arrival']:.2f}x"]
        for (backend, w), t in join.items()
        if {"arrival", "replay"} <= set(t)
    ]  # fmt: skip
    if not rows:
        return []
    return [
        f"#### Late join: a second consumer's replay of W workers ({path.name})",
        table(
            "backend | W | arrival of W events (ms) | late joiner's replay (ms) | "
            "replay / arrival",
            "lrrrr",
            rows,
        ),
    ]


def side_by_side_blocks(runs: dict[str, Rates]) -> list[str]:
    """``Fanout`` on every interpreter: items/s, vs wool's Fanout / vs wake-up."""
    blocks = [
        f"### Fanout on {', '.join(runs)}",
        "Each cell: delivered items/s, then vs wool's `Fanout` / vs `wake-up only` "
        "(same run, same source and N; trio compares with wool on asyncio).",
    ]
    rates = list(runs.values())
    every = [cases(r) for r in rates]
    backends, sources = backends_sources({k: v for g in every for k, v in g.items()})
    for source in sources:
        rows = []
        for backend in backends:
            for n in ns_of(groups.get((backend, source), {}) for groups in every):
                cells = [side_by_side_cell(r, backend, source, n) for r in rates]
                if any(cell != "-" for cell in cells):
                    rows.append([backend, f"{n:,}", *cells])
        if rows:
            header = " | ".join(["backend", "N", *runs])
            blocks += [
                f"#### Source {SOURCES.get(source, source)}",
                table(header, "lr" + "r" * len(runs), rows),
            ]
    return blocks


def side_by_side_cell(rates: Rates, backend: str, source: str, n: int) -> str:
    group = cases(rates).get((backend, source), {})
    rate = group.get(("Fanout", n))
    if rate is None:
        return "-"
    wool, wake = wool_rate(rates, backend, source, n), group.get((WAKE, n))
    return f"{human(rate)} ({share(rate, wool)} / {share(rate, wake)})"


def memory_row(row: Row) -> list[str]:
    resume = "-"
    if row.get("skipped"):
        resume = f"Lagged(skipped={row['skipped']:,}), then {row['resumed']:,} events"
    elif row.get("resumed") is not None:
        resync = row["buffered"] and row["resumed"] < row["buffered"]
        resume = f"{'the difference: ' if resync else ''}{row['resumed']:,} events"
    peak = f"{row['peak_mb']:.2f}"
    if len(row.get("peak_mb_runs", ())) > 1:
        peak += f" ({', '.join(f'{run:.2f}' for run in row['peak_mb_runs'])})"
    return [
        row["case"],
        peak,
        f"{row['peak_mb'] * 1e6 / row['events']:.1f}",
        "-" if row.get("buffered") is None else f"{row['buffered']:,}",
        "-" if row.get("held_mb") is None else f"{row['held_mb']:.2f} MB",
        resume,
        {None: "-", True: "yes", False: "**no**"}[row.get("view_equal")],
    ]


def memory_blocks(path: Path) -> list[str]:
    report = load(path)
    meta = report["meta"]
    return [
        f"### Memory: one consumer stalled, another takes {meta['events']:,} "
        f"discovery events over 100 workers ({path.name})",
        f"{version(meta)}, asyncio, each case in fresh processes. Peak = growth of "
        "the peak RSS until the reader is done, the median run's (in brackets, "
        "every run's where there were several); buffered = what the fan-out still "
        "holds for the stalled consumer; held = buffered x one event's size; on "
        "resume, a bounded subscription gives the stalled consumer the difference "
        "between the workers it had and the current ones.",
        table(
            "implementation | peak MB | bytes/event | buffered at end | held (est.) | "
            "stalled consumer on resume | view equal after resume",
            "lrrrrll",
            [memory_row(row) for row in report["rows"]],
        ),
    ]


# -- soak.py, soak_redis.py and wrapper_ceiling.py -----------------------------


def soak_blocks(paths: list[Path]) -> list[str]:
    rows = []
    for path in paths:
        report = load(path)
        r = report.get("result", {})
        rows.append(
            [path.name, str(r.get("backend", "?")), f"{r.get('consumers', 0):,}",
             f"{r.get('events', 0):,}", f"{r.get('delivered', 0):,}",
             str(r.get("lost", "?")), str(r.get("duplicated", "?")),
             str(r.get("bad_replay", "?")), f"{r.get('rss_growth_mb', 0):+.1f}",
             f"{report['meta'].get('seconds', 0):.1f}",
             "OK" if r.get("ok") else "**FAILED**"]
        )  # fmt: skip
    return [
        "### Soak: consumers joining and leaving at random",
        table(
            "file | backend | consumers | events | delivered | lost | duplicated | "
            "bad replays | RSS growth after warm-up (MB) | seconds | result",
            "llrrrrrrrrl",
            rows,
        ),
    ]


def soak_redis_blocks(path: Path) -> list[str]:
    """``soak_redis.py``: a fleet of processes on one server, through faults."""
    r = load(path)
    reconnects = statistics.median(r.get("reconnects_per_process") or [0])
    row = [
        f"{r['processes']} x {r['consumers_per_process']}",
        f"{r['elapsed_seconds']:.1f} s",
        f"{r['publishes']:,} ({r.get('failed_publishes', 0)} failed)",
        f"{r['restarts']:,}",
        f"{r['client_kills']:,} ({r.get('client_kill_rounds', 0)} rounds)",
        f"{r['sigkilled']}",
        f"{r['events_received']:,}",
        f"{reconnects:.0f}",
        f"{r['views_equal_truth']} / {r['views']} ({r['final_workers']:,} workers)",
        f"{r['duplicates']}",
        f"{r['missed']}",
        "OK" if r.get("ok") else "**FAILED**",
    ]
    return [
        f"### Redis fleet soak ({path.name})",
        f"`python benchmarks/soak_redis.py`: CPython {r.get('python', '?')}; "
        "processes of consumers on one `redis-server` while publishers churn "
        "workers, the server is restarted, `CLIENT KILL` cuts connections at "
        "random and one publisher process is SIGKILLed; then every view is "
        "checked against the published truth.",
        table(
            "processes x consumers | duration | publishes | server restarts | "
            "connections killed | processes SIGKILLed | events delivered | "
            "reconnects per process | views equal to the truth | duplicates | "
            "missed | result",
            "lrrrrrrrlrrl",
            [row],
        ),
    ]


def wrapper_blocks(paths: list[Path]) -> list[str]:
    rows = [
        [path.name, str(report.get("backend", "?")), row["wrapper"],
         f"{row['median']:.3g}x"]
        for path, report in ((path, load(path)) for path in paths)
        for row in report.get("rows", [])
    ]  # fmt: skip
    return [
        "### Wrapper ceiling: one consumer, a source that never suspends",
        table("file | backend | wrapper | items/s vs the raw source", "lllr", rows),
    ]


#: Each file that records its run time: its glob, what ran, its key in ``meta``.
RUN_TIMES = (
    ("pooling-*.json", "pooling.py", "seconds"),
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


# -- the plot -----------------------------------------------------------------


def plot(interp: str, rates: Rates, path: Path) -> bool:
    """Draw :func:`ratio_figure` into ``path``; ``False`` without matplotlib
    or without a case to draw."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = ratio_figure(interp, rates)
    if figure is None:
        return False
    figure.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(figure)
    return True


def ratio_figure(interp: str, rates: Rates) -> Any:
    """One figure per interpreter: a row per source, a panel per backend, each
    implementation's items/s as a multiple of wool's ``Fanout`` against N,
    the wake-up limit as its own line, the legend below the panels."""
    import matplotlib.pyplot as plt

    backends, sources = backends_sources(cases(rates))
    if not backends or not sources:
        return None
    figure, axes = plt.subplots(
        len(sources),
        len(backends),
        figsize=(4.2 * len(backends), 3.2 * len(sources) + 1.2),
        squeeze=False,
        sharex=True,
        sharey="row",
    )
    handles: dict[str, Any] = {}
    for row, source in enumerate(sources):
        for column, backend in enumerate(backends):
            ax = axes[row][column]
            handles.update(ratio_panel(ax, rates, backend, source))
            if row == 0:
                trio = " (vs wool on asyncio)" if backend == "trio" else ""
                ax.set_title(backend + trio)
            if column == 0:
                label = SOURCES.get(source, source)
                ax.set_ylabel(f"source {label}\nx wool's Fanout")
            if row == len(sources) - 1:
                ax.set_xlabel("N consumers")
    figure.suptitle(
        f"{interp}: delivered items/s as a multiple of wool's Fanout (same run)"
    )
    figure.legend(
        list(handles.values()),
        list(handles),
        loc="lower center",
        ncol=min(len(handles), 3),
        frameon=False,
    )
    figure.tight_layout(rect=(0, 0.09, 1, 0.97))
    return figure


def ratio_panel(ax: Any, rates: Rates, backend: str, source: str) -> dict[str, Any]:
    """One backend and source: a line per implementation; its legend handles."""
    from matplotlib.ticker import FuncFormatter
    from matplotlib.ticker import LogLocator
    from matplotlib.ticker import NullFormatter

    lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for (implementation, n), rate in cases(rates).get((backend, source), {}).items():
        wool = wool_rate(rates, backend, source, n)
        if wool and implementation not in (WOOL, "raw source"):
            lines[implementation].append((n, rate / wool))
    (reference,) = ax.plot([], [])  # the axes' first colour left unused
    reference.remove()
    handles = {"wool's Fanout (= 1)": ax.axhline(1.0, color="0.4", lw=1)}
    for label, points in sorted(lines.items(), key=lambda kv: kv[0] == WAKE):
        ns, ys = zip(*sorted(points), strict=True)
        if label == WAKE:
            style = dict(color="black", linestyle="--", marker="")
            label = "wake-up limit"
        else:
            style = dict(color=COLORS.get(label, "C5"), marker="o")
        (line,) = ax.plot(ns, ys, label=label, **style)
        handles.setdefault(label, line)
    ax.set(xscale="log", yscale="log")
    ns = ns_of([dict.fromkeys(((i, n) for i, p in lines.items() for n, _ in p), 0.0)])
    ax.set_xticks(ns, [f"{n:,}" for n in ns])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", alpha=0.3)
    return handles


# -- the whole report, and the README's part -----------------------------------


def throughput_runs(folder: Path) -> dict[str, tuple[Path, dict[str, Any], Rates]]:
    """Each throughput file, by interpreter: its path, metadata and rates."""
    runs = {}
    for path in sorted(folder.glob("throughput-*.json")):
        meta, rates = load_throughput(path)
        runs[interpreter_of(path, meta)] = (path, meta, rates)
    return runs


def summary(folder: Path) -> tuple[Path | None, Path | None]:
    """The pooling file and the Redis pooling file the summary comes from."""
    poolings = sorted(folder.glob("pooling-*.json"))
    redises = sorted(folder.glob("pooling_redis-*.json"))
    return next(iter(poolings), None), next(iter(redises), None)


def render(folder: Path, runs: dict[str, tuple[Path, dict[str, Any], Rates]],
           plotted: set[str]) -> list[str]:  # fmt: skip
    """Every block of the report, from the files of ``folder``; ``plotted``
    names the interpreters whose plot is next to them."""
    blocks = [
        "# Benchmark results",
        "Rendered by `python benchmarks/report.py benchmarks/results` from the "
        "result files next to it; every table names the file it comes from. Ratios "
        "are what to read: absolute figures drift with the machine's load.",
    ]
    blocks += summary_blocks(*summary(folder))
    if runs:
        blocks.append("## Fan-out throughput against wool's Fanout")
        for interp, (_, _, rates) in runs.items():
            blocks += versus_blocks(interp, rates, interp in plotted)
    poolings = sorted(folder.glob("pooling-*.json"))
    redises = sorted(folder.glob("pooling_redis-*.json"))
    if poolings or redises:
        blocks.append("## Pooling: every figure")
        for path in poolings:
            blocks += pooling_blocks(path)
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
    ceilings = sorted(folder.glob("wrapper_ceiling-*.json"))
    if soaks or fleet or ceilings:
        blocks.append("## Checks and limits")
        if soaks:
            blocks += soak_blocks(soaks)
        for path in fleet:
            blocks += soak_redis_blocks(path)
        if ceilings:
            blocks += wrapper_blocks(ceilings)
    return blocks + run_time_blocks(folder)


def repository() -> str:
    """The project's repository URL, as ``pyproject.toml`` gives it."""
    import tomllib

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    return str(tomllib.loads(pyproject.read_text())["project"]["urls"]["Source"])


def readme_part(folder: Path, runs: dict[str, tuple[Path, dict[str, Any], Rates]],
                plotted: set[str]) -> str:  # fmt: skip
    """What the README shows of the report: the summary table, then the
    throughput plot of the newest interpreter recorded (an absolute URL, for
    a package index page) next to its table; the others are in the docs."""
    local = summary_table(*summary(folder))
    blocks = [] if local is None else [local]
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
            "once per item, nothing else)."
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
