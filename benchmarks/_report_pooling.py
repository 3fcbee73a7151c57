"""The tables of ``pooling.py`` and ``pooling_redis.py``, and the summary
of both that the README shows: pooled against one subscription per consumer."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _report_markdown import human
from _report_markdown import load
from _report_markdown import number
from _report_markdown import pair
from _report_markdown import table
from _report_markdown import version

Row = dict[str, Any]
#: Rows by (discovery, K): the pooled runs and the raw runs.
Pairs = dict[tuple[str, int], tuple[list[Row], list[Row]]]

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
    pooled: list[Row],
    raw: list[Row],
    get: Callable[[Row], Any],
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


def rounds_said(rows: list[Row]) -> str:
    """How many rounds each convergence figure is the median of, by K."""
    counts: dict[int, set[int]] = {}
    for row in rows:
        for figures in row.get("converge", {}).values():
            counts.setdefault(row["k"], set()).add(len(figures.get("rounds", [1])))
    if len({n for ns in counts.values() for n in ns}) == 1:
        n = next(iter(next(iter(counts.values()))))
        return f"the median of {n} rounds per process" if n > 1 else "one round"
    parts = [
        f"K = {k:,}: {'/'.join(map(str, sorted(ns)))}"
        for k, ns in sorted(counts.items())
    ]
    return "the median of the rounds per process, " + ", ".join(parts)


def convergence_blocks(by: Pairs, rows: list[Row], meta: dict[str, Any]) -> list[str]:
    workers = sorted({w for row in rows for w in row.get("converge", {})}, key=int)
    if not workers:
        return []
    changes = [(w, what) for w in workers for what in ("added", "dropped")]
    header = " | ".join(["discovery", "K"] + [f"W={int(w):,} {x}" for w, x in changes])
    blocks = [
        "Convergence: seconds from publishing the first of W workers (or drops) "
        f"until every consumer holds the full view ({rounds_said(rows)}); "
        "pooled / raw.",
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

    at_n = [r["fanout_rate_at_n"] for r in runs]

    def against(key: str, rates: list[float]) -> str:
        shares = [c[key] / f for c, f in zip(conv, rates, strict=True)]
        return f"{statistics.median(shares):.2f}x"

    def against_both(key: str) -> str:
        return f"{against(key, fan)} ({against(key, at_n)})"

    return [kind, f"{k:,}",
            f"{median('added_publisher'):.2f} / {median('dropped_publisher'):.2f}",
            human(median("added_rate")), human(median("dropped_rate")),
            f"{human(statistics.median(fan))} ({human(statistics.median(at_n))})",
            against_both("added_rate"), against_both("dropped_rate")]  # fmt: skip


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
        "own rate to as many consumers (N = K, the same per-event consumer "
        "work), measured in the same process; in brackets, against its rate "
        f"to N={fanout.get('n', 1000):,} consumers.",
        table(
            "discovery | K | publisher s (add / drop) | adds/s | drops/s | "
            "fan-out/s | adds / fan-out | drops / fan-out",
            "lrllllll",
            rows,
        ),
    ]


# -- pooling_k1.py -------------------------------------------------------------


def k1_pairs(path: Path) -> dict[tuple[str, str], list[Row]]:
    """Every pair of rounds, by (discovery, W), over the runs."""
    by: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in load(path)["rows"]:
        for w, pairs in row["pairs"].items():
            by[row["kind"], w] += pairs
    return dict(by)


def k1_ratio(pairs: list[Row], key: str, scale: float, unit: str, digits: int) -> str:
    """The median over the pairs of pooled / raw, then both medians."""
    ratio = statistics.median(p["pooled"][key] / p["raw"][key] for p in pairs)
    p, r = (statistics.median(x[c][key] for x in pairs) for c in ("pooled", "raw"))
    return f"{ratio:.2f}x ({pair(scale * p, scale * r, digits, unit)})"


def k1_floor(pairs: list[Row], w: str, what: str) -> float:
    """The median over the pairs of the tails' difference, in µs per change."""
    key = f"{what}_tail"
    return statistics.median(
        1e6 * (p["pooled"][key] - p["raw"][key]) / int(w) for p in pairs
    )


def pooling_k1_blocks(path: Path) -> list[str]:
    meta = load(path)["meta"]
    rows = [
        [kind, f"{int(w):,}", str(len(pairs)),
         k1_ratio(pairs, "added", 1, " s", 2),
         k1_ratio(pairs, "added_tail", 1e3, " ms", 1),
         k1_ratio(pairs, "dropped", 1, " s", 2),
         k1_ratio(pairs, "dropped_tail", 1e3, " ms", 1),
         f"{k1_floor(pairs, w, 'added'):+.1f} / {k1_floor(pairs, w, 'dropped'):+.1f}"]
        for (kind, w), pairs in k1_pairs(path).items()
    ]  # fmt: skip
    return [
        f"### One consumer, raw and pooled paired in one process ({path.name})",
        f"`python benchmarks/pooling_k1.py`: {version(meta)}, "
        f"{meta.get('platform', '?')}, wool {meta.get('wool', '?')}; "
        f"{meta.get('runs', 1)} fresh process(es), {meta.get('seconds', 0):.0f} s "
        "in all. One publisher; rounds of a raw and a pooled consumer in turn "
        "(which goes first alternates), each round W workers added then dropped. "
        "Each cell: the median over the pairs of pooled / raw, then the medians "
        "(pooled / raw). The tail is the convergence less the publisher's own "
        "time; the floor, the tails' difference per change (pooled less raw): "
        "what pooling adds to a change at one consumer, in the same run.",
        table(
            "discovery | W | pairs | added | added tail | dropped | dropped tail | "
            "floor µs per change (added / dropped)",
            "lrrlllll",
            rows,
        ),
    ]


def k1_summary(path: Path | None) -> str | None:
    """The K = 1 convergence paired in one process, in a sentence."""
    if path is None:
        return None
    by = k1_pairs(path)
    if not by:
        return None
    (kind, w), pairs = max(by.items(), key=lambda item: int(item[0][1]))
    return (
        f"At K = 1 a change is mostly the publisher's own time, which varies "
        f"more between processes than pooling costs. Paired in one process "
        f"(`{path.name}`, {len(pairs)} pairs of rounds), {int(w):,} workers "
        f"reach one `{kind}` consumer pooled / raw in "
        f"{k1_ratio(pairs, 'added', 1, ' s', 2)} added and "
        f"{k1_ratio(pairs, 'dropped', 1, ' s', 2)} dropped; what pooling adds, "
        f"the tails' difference after the last publish: "
        f"{k1_floor(pairs, w, 'added'):+.1f} / {k1_floor(pairs, w, 'dropped'):+.1f}"
        " µs per change (added / dropped)."
    )


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
