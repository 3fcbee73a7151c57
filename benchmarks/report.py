"""Render the benchmarks' result files into tables and the throughput plots.

Every figure the README and the docs quote comes from here::

    python benchmarks/report.py benchmarks/results --readme README.md
    python benchmarks/report.py DIR                  # a quick run's folder
    python benchmarks/report.py --check benchmarks/results --readme README.md

Reads, from DIR, whichever of these it finds (other files are left alone):
``pooling-*.json`` (``pooling.py``), ``pooling_redis-*.json``
(``pooling_redis.py``), pyperf's ``throughput-*.json`` and ``memory-*.json``
(``throughput.py``), ``soak-*.json`` (``soak.py --out``) and
``wrapper_ceiling-*.json`` (``wrapper_ceiling.py --out``). Writes:

- ``DIR/report.md``: every table, in Markdown (also printed);
- ``DIR/report.rst``: the same tables, which ``docs/benchmarks.rst``
  includes (its images point into ``benchmarks/results/``);
- ``DIR/throughput-<interpreter>.png``: per interpreter, each
  implementation's delivered items/s as a multiple of wool's ``Fanout``
  in the same run (with matplotlib; skipped without it);
- with ``--readme README.md``: the README's summary table and throughput
  plots with their tables, between its two marks.

The output depends on the result files only (no clock, no machine), so
re-rendering the committed files reproduces the committed report: ``--check``
renders in memory and exits 1, naming the file, if a committed one (the
README's part included, with ``--readme``) differs.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
#: Where the docs find the images: ``docs/benchmarks.rst`` includes
#: ``benchmarks/results/report.rst``, and Sphinx reads ``/...`` from ``docs/``.
RST_IMAGES = "/../benchmarks/results/"
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


# -- a small document model, rendered as Markdown and as reStructuredText ------


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Table:
    header: list[str]
    #: ``"l"`` or ``"r"`` per column.
    align: str
    rows: list[list[str]]


@dataclass(frozen=True)
class Image:
    file: str
    alt: str


Block = Heading | Para | Table | Image


def markdown_table(table: Table) -> list[str]:
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in table.align) + "|"
    lines = ["| " + " | ".join(table.header) + " |", rule]
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    return lines


def markdown(blocks: Iterable[Block]) -> str:
    lines: list[str] = []
    for block in blocks:
        match block:
            case Heading(level, text):
                lines += [f"{'#' * level} {text}", ""]
            case Para(text):
                lines += [text, ""]
            case Table():
                lines += [*markdown_table(block), ""]
            case Image(file, alt):
                lines += [f"![{alt}]({file})", ""]
    return "\n".join(lines)


def rst_inline(text: str) -> str:
    """Markdown's inline code and emphasis, in reStructuredText."""
    text = re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", text)
    return text


def rst_cell(text: str) -> str:
    text = rst_inline(text)
    return f"\\{text}" if text[:1] in "-*+#" or not text else text


#: Section underlines below the page's own title (``docs/benchmarks.rst``).
UNDERLINES = {2: "-", 3: "~", 4: "^"}


def rst(blocks: Iterable[Block]) -> str:
    lines: list[str] = []
    for block in blocks:
        match block:
            case Heading(1, _):
                continue  # the including page has the title
            case Heading(level, text):
                text = rst_inline(text)
                lines += [text, UNDERLINES[level] * len(text), ""]
            case Para(text):
                lines += [rst_inline(text), ""]
            case Table(header, _, rows):
                lines += [".. list-table::", "   :header-rows: 1", ""]
                for row in [header, *rows]:
                    cells = [rst_cell(cell) for cell in row]
                    lines.append(f"   * - {cells[0]}")
                    lines += [f"     - {cell}" for cell in cells[1:]]
                lines.append("")
            case Image(file, alt):
                lines += [f".. image:: {RST_IMAGES}{file}", f"   :alt: {alt}", ""]
    return "\n".join(lines)


# -- formatting ----------------------------------------------------------------


def number(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def ratio(pooled: float, raw: float, unit: str, digits: int = 1) -> str:
    """``pooled / raw`` as a ratio, then both absolutes."""
    value = f"{pooled / raw:.2f}x" if raw else "-"
    return f"{value} ({number(pooled, digits)} / {number(raw, digits)}{unit})"


def pair(pooled: float, raw: float, digits: int, unit: str = "") -> str:
    """``pooled / raw``, both absolutes."""
    return f"{number(pooled, digits)} / {number(raw, digits)}{unit}"


def human(rate: float) -> str:
    if rate >= 1e6:
        return f"{rate / 1e6:.2f}M"
    return f"{rate / 1e3:.1f}k" if rate >= 1e3 else f"{rate:.0f}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def version(meta: dict[str, Any]) -> str:
    return str(meta.get("python", "?")).split()[0]


# -- pooling.py ----------------------------------------------------------------


def pooling_pairs(
    rows: list[dict[str, Any]],
) -> dict[tuple[str, int], dict[bool, list[dict[str, Any]]]]:
    """Rows by (discovery, K), pooled and raw, one row per alternating run."""
    by: dict[tuple[str, int], dict[bool, list[dict[str, Any]]]] = defaultdict(
        lambda: {True: [], False: []}
    )
    for row in rows:
        by[row["kind"], row["k"]][row["pooled"]].append(row)
    return {key: two for key, two in by.items() if two[True] and two[False]}


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
    return f"{value} ({number(p, digits)} / {number(r, digits)}{unit})"


def cannot(raw: list[dict[str, Any]]) -> str | None:
    """What a raw configuration that could not run all K consumers says."""
    row = raw[0]
    if not row["failed"]:
        return None
    reason = "inotify limit" if "inotify" in (row["error"] or "") else row["error"]
    return f"cannot: {reason}"


def upstreams(pooled: list[dict[str, Any]], raw: list[dict[str, Any]]) -> str:
    text = f"{pooled[0].get('observers', '-')} / {raw[0].get('observers', '-')}"
    for name, group in (("pooled", pooled), ("raw", raw)):
        if group[0].get("failed"):
            text += f"; {name}: {group[0]['failed']:,} failed ({group[0].get('error')})"
    return text


def pooling_blocks(path: Path) -> list[Block]:
    report = load(path)
    meta, rows = report["meta"], report["rows"]
    by = pooling_pairs(rows)
    runs = meta.get("runs", 1)
    blocks: list[Block] = [
        Heading(3, f"K consumers of one discovery, raw and pooled ({path.name})"),
        Para(
            f"`python benchmarks/pooling.py`: {version(meta)}, "
            f"{meta.get('platform', '?')}, {meta.get('cpus', '?')} CPUs, wool "
            f"{meta.get('wool', '?')}; {runs} alternating run(s), "
            f"{meta.get('seconds', 0):.0f} s in all. Each cell: the median over "
            "the runs of pooled / raw, then the medians (pooled / raw). Upstream "
            "subscriptions: watchdog observers open (pooled / raw), and consumers "
            "whose subscription failed to open."
        ),
    ]
    table = Table(
        ["discovery", "K", "upstream subscriptions", "idle CPU (% of a core)",
         "RSS MB", "RSS KB per consumer"],
        "lrllll",
        [],
    )  # fmt: skip
    for (kind, k), two in by.items():
        pooled, raw = two[True], two[False]
        table.rows.append(
            [
                kind,
                f"{k:,}",
                upstreams(pooled, raw),
                median_ratio(pooled, raw, lambda r: 100 * r["idle_cpu"], "%"),
                median_ratio(pooled, raw, lambda r: r["rss_mb"], ""),
                median_ratio(pooled, raw, lambda r: r.get("rss_kb_per_consumer"), ""),
            ]
        )
    blocks.append(table)
    blocks.append(
        Para(
            "Dispatch through `wool.WorkerPool(spawn=2)`, K client tasks, raw and "
            "pooled with the same `poll_interval`, both pools open side by side in "
            "one process and measured in alternating bursts, in two processes per "
            "run (one opens raw first, the other pooled first): `leaf` (plain) and "
            "`nested` (a "
            "routine dispatching `leaf` from the worker); per dispatch, the pickled "
            "proxy wool ships with every task, the parent's time to pickle it and a "
            "worker's to unpickle it."
        )
    )
    dispatch = Table(
        ["discovery", "K", "leaf dispatches/s", "leaf p50 ms", "nested dispatches/s",
         "nested p50 ms", "nested p99 ms", "proxy bytes", "parent pickle µs",
         "worker unpickle µs"],
        "lrllllllll",
        [],
    )  # fmt: skip
    for (kind, k), two in by.items():
        pooled, raw = two[True], two[False]
        if pooled[0].get("dispatch") is None:
            continue
        leaf = "dispatch_leaf" if pooled[0].get("dispatch_leaf") else "dispatch"
        cells = [
            kind,
            f"{k:,}",
            median_ratio(pooled, raw, lambda r, d=leaf: r[d]["per_second"], "", 0),
            median_ratio(pooled, raw, lambda r, d=leaf: 1e3 * r[d]["p50"], ""),
            median_ratio(pooled, raw, lambda r: r["dispatch"]["per_second"], "", 0),
            median_ratio(pooled, raw, lambda r: 1e3 * r["dispatch"]["p50"], ""),
            median_ratio(pooled, raw, lambda r: 1e3 * r["dispatch"]["p99"], ""),
        ]
        for field in ("proxy_bytes", "parent_dumps_us", "worker_loads_us"):
            cells.append(
                median_ratio(pooled, raw, lambda r, f=field: r["serialise"][f], "", 0)
                if "serialise" in pooled[0]
                else "-"
            )
        cells[-1] += "".join(
            f"; {name}: {group[0]['dispatch']['failed']:,} failed "
            f"({group[0]['dispatch']['error']})"
            for name, group in (("pooled", pooled), ("raw", raw))
            if group[0]["dispatch"]["failed"]
        )
        dispatch.rows.append(cells)
    if dispatch.rows:
        blocks.append(dispatch)
    workers = sorted({w for row in rows for w in row.get("converge", {})}, key=int)
    if not workers:
        return blocks
    blocks.append(
        Para(
            "Convergence: seconds from publishing the first of W workers (or "
            "drops) until every consumer holds the full view (below K = 10,000, "
            "the median of three rounds per process); pooled / raw."
        )
    )
    converge = Table(
        ["discovery", "K"]
        + [f"W={int(w):,} {what}" for w in workers for what in ("added", "dropped")],
        "lr" + "l" * 2 * len(workers),
        [],
    )
    for (kind, k), two in by.items():
        pooled, raw = two[True], two[False]
        blocked = cannot(raw)
        cells = [kind, f"{k:,}"]
        for w in workers:
            for what in ("added", "dropped"):
                if w not in pooled[0].get("converge", {}):
                    cells.append("-")
                elif blocked:
                    p = median_of(pooled, lambda r, w=w, x=what: r["converge"][w][x])
                    cells.append(f"{number(p, 2)} s; raw: {blocked}")
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
        converge.rows.append(cells)
    blocks.append(converge)
    big = [w for w in workers if int(w) >= 1000]
    if not big or "added_rate" not in rows[0]["converge"][workers[0]]:
        return blocks
    w = big[0]
    fanout = meta.get("fanout", {})
    blocks.append(
        Para(
            f"Pooled delivery rate at W={int(w):,}: K x W deliveries over the "
            "convergence time less the publisher's own time, against the "
            f"fan-out's own rate at N={fanout.get('n', 1000):,} (the same "
            "per-event consumer work), measured in the same process."
        )
    )
    rates = Table(
        ["discovery", "K", "publisher s (add / drop)", "adds/s", "drops/s",
         "fan-out/s", "adds / fan-out", "drops / fan-out"],
        "lrllllll",
        [],
    )  # fmt: skip
    for (kind, k), two in by.items():
        pooled = [r for r in two[True] if w in r["converge"] and r.get("fanout_rate")]
        if not pooled:
            continue

        conv = [r["converge"][w] for r in pooled]
        fan = [r["fanout_rate"] for r in pooled]
        add = [c["added_rate"] / f for c, f in zip(conv, fan, strict=True)]
        drop = [c["dropped_rate"] / f for c, f in zip(conv, fan, strict=True)]
        rates.rows.append(
            [
                kind,
                f"{k:,}",
                f"{statistics.median(c['added_publisher'] for c in conv):.2f} / "
                f"{statistics.median(c['dropped_publisher'] for c in conv):.2f}",
                human(statistics.median(c["added_rate"] for c in conv)),
                human(statistics.median(c["dropped_rate"] for c in conv)),
                human(statistics.median(fan)),
                f"{statistics.median(add):.2f}x",
                f"{statistics.median(drop):.2f}x",
            ]
        )
    if rates.rows:
        blocks.append(rates)
    return blocks


# -- pooling_redis.py ----------------------------------------------------------


def redis_pairs(rows: list[dict[str, Any]]) -> dict[int, dict[bool, Any]]:
    by: dict[int, dict[bool, Any]] = defaultdict(dict)
    for row in rows:
        by[row["consumers"]][row["pooled"]] = row
    return {k: two for k, two in sorted(by.items()) if set(two) == {True, False}}


def redis_setup(meta: dict[str, Any]) -> str:
    return (
        f"CPython {version(meta)}, redis-server {meta.get('redis_server', '?')} on "
        f"loopback, redis-py {meta.get('redis_py', '?')}; {meta.get('rounds', '?')} "
        f"publishes per row (median), idle over {meta.get('idle', '?')} s"
    )


def pooling_redis_blocks(path: Path) -> list[Block]:
    report = load(path)
    meta = report["meta"]
    blocks: list[Block] = [
        Heading(3, f"Redis discovery, pooled and unpooled ({path.name})"),
        Para(
            "`python benchmarks/pooling_redis.py`: K consumers of one namespace in "
            "one process, pooled (`RedisDiscovery(...)`) and unpooled "
            f"(`RedisDiscovery(..., shared=False)`); {redis_setup(meta)}. Each "
            "cell: pooled / unpooled. Connections are the namespace's subscriber "
            "connections on the server (`CLIENT LIST`, by name)."
        ),
    ]
    table = Table(
        ["K consumers", "connections", "ready (s)", "publish -> all K have it (ms)",
         "idle CPU, this process (% of a core)", "idle CPU, redis-server (%)"],
        "rrrrrr",
        [],
    )  # fmt: skip
    for k, two in redis_pairs(report["rows"]).items():
        p, u = two[True], two[False]
        table.rows.append(
            [
                f"{k:,}",
                f"{p['connections']} / {u['connections']}",
                pair(p["ready_s"], u["ready_s"], 3),
                pair(p["convergence_ms"], u["convergence_ms"], 2),
                pair(p["idle_cpu_pct"], u["idle_cpu_pct"], 2),
                pair(p["server_idle_cpu_pct"], u["server_idle_cpu_pct"], 2),
            ]
        )
    blocks.append(table)
    return blocks


# -- the summary: what pooling buys --------------------------------------------


def summary_blocks(pooling: Path | None, redis: Path | None) -> list[Block]:
    """One table: upstream connections, idle CPU and the time a change takes
    to reach every consumer, pooled against one subscription per consumer."""
    table = Table(
        ["discovery", "K consumers", "upstream subscriptions", "idle CPU (% of a core)",
         "a change reaches all K"],
        "lrlll",
        [],
    )  # fmt: skip
    sources: list[str] = []
    if pooling is not None:
        sources.append(f"`{pooling.name}`")
        for (kind, k), two in pooling_pairs(load(pooling)["rows"]).items():
            pooled, raw = two[True], two[False]
            change = "-"
            converge = pooled[0].get("converge", {})
            if converge:
                w = max(converge, key=int)
                p = median_of(pooled, lambda r, w=w: r["converge"][w]["added"])
                blocked = cannot(raw)
                if blocked:
                    change = f"{number(p, 2)} s; raw: {blocked}"
                else:
                    r = median_of(raw, lambda r, w=w: r["converge"][w]["added"])
                    change = pair(p, r, 2, " s")
                change += f" ({int(w):,} workers added)"
            table.rows.append(
                [
                    kind,
                    f"{k:,}",
                    upstreams(pooled, raw),
                    pair(
                        median_of(pooled, lambda r: 100 * r["idle_cpu"]),
                        median_of(raw, lambda r: 100 * r["idle_cpu"]),
                        1,
                    ),
                    change,
                ]
            )
    if redis is not None:
        sources.append(f"`{redis.name}`")
        for k, two in redis_pairs(load(redis)["rows"]).items():
            p, u = two[True], two[False]
            table.rows.append(
                [
                    "redis",
                    f"{k:,}",
                    f"{p['connections']} / {u['connections']} connections",
                    pair(p["idle_cpu_pct"], u["idle_cpu_pct"], 2),
                    f"{pair(p['convergence_ms'], u['convergence_ms'], 2, ' ms')} "
                    "(one publish)",
                ]
            )
    if not table.rows:
        return []
    return [
        Heading(2, "Summary: what pooling buys"),
        Para(
            "K consumers of one discovery in one process; each cell: pooled / one "
            "subscription per consumer, measured in the same run (from "
            f"{' and '.join(sources)}). `local` is `wool.LocalDiscovery` (raw: a "
            "subscriber per consumer; pooled: `SharedDiscovery`), its upstreams "
            "being watchdog observers; `redis` is `wool_pooling.redis.RedisDiscovery` "
            "(unpooled: `shared=False`)."
        ),
        table,
    ]


# -- throughput.py -------------------------------------------------------------


def load_throughput(path: Path) -> tuple[dict[str, Any], dict[str, float]]:
    import pyperf

    suite = pyperf.BenchmarkSuite.load(str(path))
    # The fastest value: the others carry what the shared machine's other
    # processes took (see docs/benchmarks.rst), the same way for every case.
    rates = {
        bench.get_name(): 1 / min(bench.get_values())
        for bench in suite.get_benchmarks()
    }
    return suite.get_metadata(), rates


def interpreter_of(path: Path, meta: dict[str, Any]) -> str:
    name = meta.get("wool_pooling_interpreter")
    return str(name) if name else path.stem.split("-", 1)[-1]


def wool_rate(
    rates: dict[str, float], backend: str, source: str, n: int
) -> float | None:
    """wool's ``Fanout`` for the same case (on asyncio for trio: it has no trio)."""
    base = "asyncio" if backend == "trio" else backend
    return rates.get(f"{base}/{source}/{WOOL}/N={n}")


def cases(
    rates: dict[str, float],
) -> dict[tuple[str, str], dict[tuple[str, int], float]]:
    """``(backend, source) -> (implementation, N) -> items/s``, join cases aside."""
    groups: dict[tuple[str, str], dict[tuple[str, int], float]] = defaultdict(dict)
    for name, rate in rates.items():
        parts = name.split("/")
        if len(parts) != 4 or parts[0] == "join" or not parts[3].startswith("N="):
            continue
        backend, source, implementation, n = parts
        groups[backend, source][implementation, int(n[2:])] = rate
    return groups


def ns_of(group: dict[tuple[str, int], float]) -> list[int]:
    return sorted({n for _, n in group})


def versus_blocks(interp: str, rates: dict[str, float], plotted: bool) -> list[Block]:
    """The plot and its table: Fanout against wool's Fanout and the limit."""
    groups = cases(rates)
    ns = sorted({n for group in groups.values() for n in ns_of(group)})
    table = Table(
        ["backend", "source"] + [f"N={n:,}" for n in ns], "ll" + "r" * len(ns), []
    )
    for backend in BACKENDS:
        for source, label in SOURCES.items():
            group = groups.get((backend, source))
            if not group or not any(i == "Fanout" for i, _ in group):
                continue
            cells = [backend, label]
            for n in ns:
                rate = group.get(("Fanout", n))
                wool, wake = wool_rate(rates, backend, source, n), group.get((WAKE, n))
                if rate is None:
                    cells.append("-")
                    continue
                cells.append(
                    f"{times(rate / wool if wool else None)} "
                    f"({times(rate / wake if wake else None)})"
                )
            table.rows.append(cells)
    if not table.rows:
        return []
    blocks: list[Block] = [Heading(3, f"{interp}")]
    if plotted:
        blocks.append(
            Image(
                f"throughput-{interp}.png",
                f"{interp}: delivered items/s as a multiple of wool's Fanout, "
                "per backend and source",
            )
        )
    blocks += [
        Para(
            f"`throughput-{interp}.json`: `Fanout`'s delivered items/s as a "
            "multiple of wool's `Fanout` in the same run, then (in brackets) of the "
            "wake-up limit, per backend, source and N consumers; trio compares "
            "with wool on asyncio."
        ),
        table,
    ]
    return blocks


def throughput_blocks(
    path: Path, rates: dict[str, float], meta: dict[str, Any]
) -> list[Block]:
    blocks: list[Block] = [
        Heading(3, f"Throughput, {meta.get('python_version', '?')} ({path.name})"),
        Para(
            "Delivered items/s (the fastest of pyperf's values), N consumers each "
            "taking every item; then as a multiple of wool's `Fanout` (trio rows: of "
            "its asyncio figure), of the wake-up limit and of the raw source at N = 1."
        ),
    ]
    for (backend, source), group in cases(rates).items():
        table = Table(
            ["N", "implementation", "items/s", "vs wool Fanout", "vs wake-up only",
             "vs raw source"],
            "rlrrrr",
            [],
        )  # fmt: skip
        floor = group.get(("raw source", 1))
        for (implementation, n), rate in group.items():
            wool, wake = wool_rate(rates, backend, source, n), group.get((WAKE, n))
            table.rows.append(
                [f"{n:,}", implementation, human(rate)]
                + [times(rate / x) if x else "-" for x in (wool, wake, floor)]
            )
        label = SOURCES.get(source, source)
        blocks += [Heading(4, f"{backend}, source {label} ({path.name})"), table]
    join: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for name, rate in rates.items():
        parts = name.split("/")
        if len(parts) == 4 and parts[0] == "join":
            _, backend, w, what = parts
            join[backend, int(w[2:])][what] = 1e3 / rate  # ms
    complete = {key: t for key, t in join.items() if {"arrival", "replay"} <= set(t)}
    if complete:
        table = Table(
            ["backend", "W", "arrival of W events (ms)", "late joiner's replay (ms)",
             "replay / arrival"],
            "lrrrr",
            [],
        )  # fmt: skip
        for (backend, w), t in complete.items():
            table.rows.append(
                [backend, f"{w:,}", f"{t['arrival']:.3f}", f"{t['replay']:.3f}",
                 f"{t['replay'] / t['arrival']:.2f}x"]
            )  # fmt: skip
        blocks += [
            Heading(
                4, f"Late join: a second consumer's replay of W workers ({path.name})"
            ),
            table,
        ]
    return blocks


def side_by_side_blocks(runs: dict[str, dict[str, float]]) -> list[Block]:
    """``Fanout`` on every interpreter: items/s, vs wool's Fanout / vs wake-up."""
    blocks: list[Block] = [
        Heading(3, f"Fanout on {', '.join(runs)}"),
        Para(
            "Each cell: delivered items/s, then vs wool's `Fanout` / vs `wake-up "
            "only` (same run, same source and N; trio compares with wool on asyncio)."
        ),
    ]
    for source, label in SOURCES.items():
        table = Table(["backend", "N", *runs], "lr" + "r" * len(runs), [])
        for backend in BACKENDS:
            ns = sorted(
                {
                    n
                    for rates in runs.values()
                    for n in ns_of(cases(rates).get((backend, source), {}))
                }
            )
            for n in ns:
                cells: list[str] = []
                for rates in runs.values():
                    group = cases(rates).get((backend, source), {})
                    rate = group.get(("Fanout", n))
                    if rate is None:
                        cells.append("-")
                        continue
                    wool, wake = (
                        wool_rate(rates, backend, source, n),
                        group.get((WAKE, n)),
                    )
                    cells.append(
                        f"{human(rate)} ({times(rate / wool if wool else None)} / "
                        f"{times(rate / wake if wake else None)})"
                    )
                if any(cell != "-" for cell in cells):
                    table.rows.append([backend, f"{n:,}", *cells])
        if table.rows:
            blocks += [Heading(4, f"Source {label}"), table]
    return blocks


def memory_blocks(path: Path) -> list[Block]:
    report = load(path)
    meta = report["meta"]
    blocks: list[Block] = [
        Heading(
            3,
            f"Memory: one consumer stalled, another takes {meta['events']:,} "
            f"discovery events over 100 workers ({path.name})",
        ),
        Para(
            f"{version(meta)}, asyncio, each case in fresh processes. Peak = growth "
            "of the peak RSS until the reader is done, the median run's (in "
            "brackets, every run's where there were several); buffered = what the "
            "fan-out still holds for the stalled consumer; held = buffered x one "
            "event's size; on resume, a bounded subscription gives the stalled "
            "consumer the difference between the workers it had and the current ones."
        ),
    ]
    table = Table(
        ["implementation", "peak MB", "bytes/event", "buffered at end", "held (est.)",
         "stalled consumer on resume", "view equal after resume"],
        "lrrrrll",
        [],
    )  # fmt: skip
    for row in report["rows"]:
        resume = "-"
        if row.get("skipped"):
            resume = f"Lagged(skipped={row['skipped']:,}), then {row['resumed']:,}"
            resume += " events"
        elif row.get("resumed") is not None:
            resync = row["buffered"] and row["resumed"] < row["buffered"]
            kind = "the difference: " if resync else ""
            resume = f"{kind}{row['resumed']:,} events"
        buffered = "-" if row.get("buffered") is None else f"{row['buffered']:,}"
        held = "-" if row.get("held_mb") is None else f"{row['held_mb']:.2f} MB"
        equal = {None: "-", True: "yes", False: "**no**"}[row.get("view_equal")]
        peak = f"{row['peak_mb']:.2f}"
        if len(row.get("peak_mb_runs", ())) > 1:
            peak += f" ({', '.join(f'{run:.2f}' for run in row['peak_mb_runs'])})"
        table.rows.append(
            [row["case"], peak,
             f"{row['peak_mb'] * 1e6 / row['events']:.1f}", buffered, held, resume,
             equal]
        )  # fmt: skip
    blocks.append(table)
    return blocks


# -- soak.py and wrapper_ceiling.py (written with --out) ----------------------


def soak_blocks(paths: list[Path]) -> list[Block]:
    table = Table(
        ["file", "backend", "consumers", "events", "delivered", "lost", "duplicated",
         "bad replays", "RSS growth after warm-up (MB)", "seconds", "result"],
        "llrrrrrrrrl",
        [],
    )  # fmt: skip
    for path in paths:
        report = load(path)
        r = report.get("result", {})
        table.rows.append(
            [path.name, str(r.get("backend", "?")), f"{r.get('consumers', 0):,}",
             f"{r.get('events', 0):,}", f"{r.get('delivered', 0):,}",
             str(r.get("lost", "?")), str(r.get("duplicated", "?")),
             str(r.get("bad_replay", "?")), f"{r.get('rss_growth_mb', 0):+.1f}",
             f"{report['meta'].get('seconds', 0):.1f}",
             "OK" if r.get("ok") else "**FAILED**"]
        )  # fmt: skip
    return [Heading(3, "Soak: consumers joining and leaving at random"), table]


def soak_redis_blocks(path: Path) -> list[Block]:
    """``soak_redis.py``: a fleet of processes on one server, through faults."""
    r = load(path)
    reconnects = r.get("reconnects_per_process") or [0]
    table = Table(
        ["processes x consumers", "duration", "publishes", "server restarts",
         "connections killed", "processes SIGKILLed", "events delivered",
         "reconnects per process", "views equal to the truth", "duplicates",
         "missed", "result"],
        "lrrrrrrrlrrl",
        [[
            f"{r['processes']} x {r['consumers_per_process']}",
            f"{r['elapsed_seconds']:.1f} s",
            f"{r['publishes']:,} ({r.get('failed_publishes', 0)} failed)",
            f"{r['restarts']:,}",
            f"{r['client_kills']:,} ({r.get('client_kill_rounds', 0)} rounds)",
            f"{r['sigkilled']}",
            f"{r['events_received']:,}",
            f"{statistics.median(reconnects):.0f}",
            f"{r['views_equal_truth']} / {r['views']} ({r['final_workers']:,} workers)",
            f"{r['duplicates']}",
            f"{r['missed']}",
            "OK" if r.get("ok") else "**FAILED**",
        ]],
    )  # fmt: skip
    return [
        Heading(3, f"Redis fleet soak ({path.name})"),
        Para(
            f"`python benchmarks/soak_redis.py`: CPython {r.get('python', '?')}; "
            "processes of consumers on one `redis-server` while publishers churn "
            "workers, the server is restarted, `CLIENT KILL` cuts connections at "
            "random and one publisher process is SIGKILLed; then every view is "
            "checked against the published truth."
        ),
        table,
    ]


def wrapper_blocks(paths: list[Path]) -> list[Block]:
    table = Table(
        ["file", "backend", "wrapper", "items/s vs the raw source"], "lllr", []
    )
    for path in paths:
        report = load(path)
        for row in report.get("rows", []):
            table.rows.append(
                [path.name, str(report.get("backend", "?")), row["wrapper"],
                 f"{row['median']:.3g}x"]
            )  # fmt: skip
    return [
        Heading(3, "Wrapper ceiling: one consumer, a source that never suspends"),
        table,
    ]


def run_time_blocks(folder: Path) -> list[Block]:
    """How long each recorded run took, from the file itself."""
    table = Table(["file", "what ran", "run (s)"], "llr", [])
    for path in sorted(folder.glob("pooling-*.json")):
        seconds = load(path)["meta"].get("seconds")
        if seconds is not None:
            table.rows.append([path.name, "pooling.py", f"{seconds:,.1f}"])
    for path in sorted(folder.glob("pooling_redis-*.json")):
        seconds = load(path)["meta"].get("seconds")
        if seconds is not None:
            table.rows.append([path.name, "pooling_redis.py", f"{seconds:,.1f}"])
    for path in sorted(folder.glob("memory-*.json")):
        seconds = load(path)["meta"].get("run_seconds")
        if seconds is not None:
            table.rows.append(
                [path.name, "throughput.py (pyperf cases and memory cases)",
                 f"{seconds:,.1f}"]
            )  # fmt: skip
    if not table.rows:
        return []
    return [Heading(2, "Run times"), Para("Recorded by each run, in its file."), table]


# -- the plot -----------------------------------------------------------------


def plot(interp: str, rates: dict[str, float], path: Path) -> bool:
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


def ratio_figure(interp: str, rates: dict[str, float]) -> Any:
    """One figure per interpreter: a row per source, a panel per backend, each
    implementation's items/s as a multiple of wool's ``Fanout`` against N,
    the wake-up limit as its own line, the legend below the panels."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    from matplotlib.ticker import LogLocator
    from matplotlib.ticker import NullFormatter

    groups = cases(rates)
    backends = [b for b in BACKENDS if any(key[0] == b for key in groups)]
    sources = [s for s in SOURCES if any(key[1] == s for key in groups)]
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
            group = groups.get((backend, source), {})
            lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
            for (implementation, n), rate in group.items():
                wool = wool_rate(rates, backend, source, n)
                if wool and implementation not in (WOOL, "raw source"):
                    lines[implementation].append((n, rate / wool))
            (reference,) = ax.plot([], [])  # the axes' first colour left unused
            reference.remove()
            handles["wool's Fanout (= 1)"] = ax.axhline(1.0, color="0.4", lw=1)
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
            ns = sorted({n for n_points in lines.values() for n, _ in n_points})
            ax.set_xticks(ns, [f"{n:,}" for n in ns])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, which="major", alpha=0.3)
            if row == 0:
                ax.set_title(
                    backend + (" (vs wool on asyncio)" if backend == "trio" else "")
                )
            if column == 0:
                ax.set_ylabel(f"source {SOURCES[source]}\nx wool's Fanout")
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


# -- the whole report -----------------------------------------------------------


def render(folder: Path, images: bool = True) -> list[Block]:
    """Every block of the report, from the files of ``folder``; with
    ``images``, (re)draws the plots next to them."""
    poolings = sorted(folder.glob("pooling-*.json"))
    redises = sorted(folder.glob("pooling_redis-*.json"))
    runs: dict[str, tuple[Path, dict[str, Any], dict[str, float]]] = {}
    for path in sorted(folder.glob("throughput-*.json")):
        meta, rates = load_throughput(path)
        runs[interpreter_of(path, meta)] = (path, meta, rates)

    blocks: list[Block] = [
        Heading(1, "Benchmark results"),
        Para(
            "Rendered by `python benchmarks/report.py benchmarks/results` from the "
            "result files next to it; every table names the file it comes from. "
            "Ratios are what to read: absolute figures drift with the machine's load."
        ),
    ]
    blocks += summary_blocks(
        poolings[0] if poolings else None, redises[0] if redises else None
    )
    if runs:
        blocks.append(Heading(2, "Fan-out throughput against wool's Fanout"))
        for interp, (_, _, rates) in runs.items():
            drawn = False
            if images:
                drawn = plot(interp, rates, folder / f"throughput-{interp}.png")
            else:
                drawn = (folder / f"throughput-{interp}.png").is_file()
            blocks += versus_blocks(interp, rates, drawn)
    if poolings or redises:
        blocks.append(Heading(2, "Pooling: every figure"))
        for path in poolings:
            blocks += pooling_blocks(path)
        for path in redises:
            blocks += pooling_redis_blocks(path)
    memories = sorted(folder.glob("memory-*.json"))
    if runs or memories:
        blocks.append(Heading(2, "Fan-out: every figure"))
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
        blocks.append(Heading(2, "Checks and limits"))
        if soaks:
            blocks += soak_blocks(soaks)
        for path in fleet:
            blocks += soak_redis_blocks(path)
        if ceilings:
            blocks += wrapper_blocks(ceilings)
    blocks += run_time_blocks(folder)
    return blocks


# -- the README's part ---------------------------------------------------------

README_BEGIN = (
    "<!-- rendered by benchmarks/report.py --readme README.md: do not edit -->"
)
README_END = "<!-- end of what benchmarks/report.py renders -->"


def repository() -> str:
    """The project's repository URL, as ``pyproject.toml`` gives it."""
    import tomllib

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    return str(tomllib.loads(pyproject.read_text())["project"]["urls"]["Source"])


def readme_part(blocks: list[Block]) -> str:
    """What the README shows of the report: the summary table, then the
    throughput plot of the newest interpreter recorded (an absolute URL, for
    a package index page) next to its table; the others are in the docs."""
    raw = repository().replace("github.com", "raw.githubusercontent.com") + "/main"
    parts: list[Block] = []
    section = ""
    newest: tuple[str, Image | None, Table | None] | None = None
    for index, block in enumerate(blocks):
        if isinstance(block, Heading):
            section = block.text if block.level == 2 else section
        if section == "Summary: what pooling buys" and isinstance(block, Table):
            parts.append(block)
        fanout = section == "Fan-out throughput against wool's Fanout"
        if fanout and isinstance(block, Heading) and block.level == 3:
            following = blocks[index + 1 : index + 4]
            image = next((b for b in following if isinstance(b, Image)), None)
            table = next((b for b in following if isinstance(b, Table)), None)
            newest = (block.text, image, table)
    if newest is not None:
        interp, image, table = newest
        parts.append(
            Para(
                f"The fan-out underneath, on {interp}: delivered items/s as a "
                "multiple of wool's\nown `Fanout` in the same run; the table gives "
                "`Fanout`'s, then (in brackets) its\nmultiple of the wake-up limit "
                "(N tasks woken once per item, nothing else)."
            )
        )
        if image is not None:
            parts.append(
                Image(
                    f"{raw}/benchmarks/results/{image.file}",
                    f"{interp}: delivered items/s as a multiple of wool's Fanout",
                )
            )
        if table is not None:
            parts.append(table)
    return "\n".join([README_BEGIN, "", markdown(parts).rstrip("\n"), "", README_END])


def with_readme_part(text: str, part: str) -> str:
    """``text`` with what lies between the README's marks replaced by ``part``."""
    start = text.index(README_BEGIN)
    end = text.index(README_END) + len(README_END)
    return text[:start] + part + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/report.py",
        description=(
            "Render the benchmarks' result files of DIR into DIR/report.md, "
            "DIR/report.rst and the throughput plots."
        ),
        epilog=(
            "A quick run of every script into one folder, then its report: "
            "pooling.py, throughput.py, pooling_redis.py, soak.py and "
            "wrapper_ceiling.py, each with --quick --out DIR, then report.py DIR."
        ),
    )
    parser.add_argument(
        "folder",
        metavar="DIR",
        nargs="?",
        type=Path,
        default=RESULTS,
        help="the results folder (default: benchmarks/results)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="render in memory, write nothing; exit 1 if DIR/report.md or "
        "DIR/report.rst differs from what the result files give",
    )
    parser.add_argument(
        "--readme",
        type=Path,
        metavar="README",
        help="also render the summary table and the throughput plots with their "
        "tables into README, between its two marks",
    )
    args = parser.parse_args(argv)
    folder: Path = args.folder
    if not folder.is_dir():
        parser.error(f"{folder} is not a folder")
    blocks = render(folder, images=not args.check)
    outputs = {
        folder / "report.md": markdown(blocks),
        folder / "report.rst": rst(blocks),
    }
    if args.readme is not None:
        readme = args.readme.read_text(encoding="utf-8")
        if README_BEGIN not in readme or README_END not in readme:
            parser.error(f"{args.readme} has no marks: {README_BEGIN} ... {README_END}")
        outputs[args.readme] = with_readme_part(readme, readme_part(blocks))
    if args.check:
        stale = [
            path
            for path, text in outputs.items()
            if not path.is_file() or path.read_text(encoding="utf-8") != text
        ]
        for path in stale:
            print(f"{path} is stale: run python benchmarks/report.py {folder}"
                  + (f" --readme {args.readme}" if args.readme else ""),
                  file=sys.stderr)  # fmt: skip
        return 1 if stale else 0
    for path, text in outputs.items():
        path.write_text(text, encoding="utf-8")
    print(outputs[folder / "report.md"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
