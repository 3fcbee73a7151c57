"""The tables of the checks: ``soak.py`` and ``soak_redis.py`` (every
consumer's view against the truth) and ``wrapper_ceiling.py``."""

from __future__ import annotations

import statistics
from pathlib import Path

from _report_markdown import load
from _report_markdown import table


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


def storm_redis_blocks(path: Path) -> list[str]:
    """``storm_redis.py``: a blip and a restart, every subscription at once."""
    from storm_redis import markdown as storm_table  # its table, one home

    r = load(path)
    meta = r.get("meta", {})
    python = str(meta.get("python", "?")).split()[0]
    parser = "hiredis" if meta.get("hiredis") else "its Python parser (no hiredis)"
    load_average = meta.get("loadavg_before", ["?"])[0]
    return [
        f"### Redis herds: a blip and a restart ({path.name})",
        f"`python benchmarks/storm_redis.py`: CPython {python}, redis-server "
        f"{meta.get('redis_server', '?')}, redis-py {meta.get('redis_py', '?')} "
        f"with {parser}, load average {load_average} at the start; "
        "P processes of unshared subscriptions watch W workers on one "
        "`redis-server`. The blip: `CLIENT KILL TYPE pubsub` on a server that "
        "keeps its keys, one worker published meanwhile. The restart: the data "
        "lost (the records published again under a new epoch, one more "
        "worker), so every subscription takes a full snapshot. Timed until "
        "every view equals the truth; the server's CPU from `INFO CPU`. The "
        "client's figures are one subscription's: fetching and parsing a "
        "snapshot, decoding it fresh, applying it again to known records. "
        "The model built on it: docs/redis.rst, *Restart herd*.",
        "\n".join(storm_table(r)),
    ]
