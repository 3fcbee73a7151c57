"""The tables of ``throughput.py``: pyperf's cases (delivered items/s per
backend, source, implementation and N consumers; a late joiner's replay)
and the memory cases (one consumer stalled)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from typing import NamedTuple

from _report_markdown import human
from _report_markdown import load
from _report_markdown import share
from _report_markdown import table
from _report_markdown import version

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
#: The batched limit: N tasks woken once per batch of the read-ahead's items.
BATCH = "wake-up per batch"
Row = dict[str, Any]
Rates = dict[str, float]
#: ``(backend, source) -> (implementation, N) -> items/s``.
Cases = dict[tuple[str, str], dict[tuple[str, int], float]]


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


class FanoutAt(NamedTuple):
    """``Fanout``'s items/s in one case, then as multiples (``-`` without)."""

    items: str
    wool: str
    wake: str
    batch: str | None  # None: no batched limit in the results

    def limits(self) -> str:
        """The multiples of the limits: ``wake`` or ``wake / batch``."""
        return self.wake if self.batch is None else f"{self.wake} / {self.batch}"


def fanout_at(rates: Rates, backend: str, source: str, n: int) -> FanoutAt | None:
    """``Fanout`` at N against wool's ``Fanout`` and the wake-up limit."""
    group = cases(rates).get((backend, source), {})
    rate = group.get(("Fanout", n))
    if rate is None:
        return None
    wool, wake = wool_rate(rates, backend, source, n), group.get((WAKE, n))
    batch = share(rate, group.get((BATCH, n))) if batched(rates) else None
    return FanoutAt(human(rate), share(rate, wool), share(rate, wake), batch)


def batched(rates: Rates) -> bool:
    """Whether the results hold the batched limit (recorded since it was added)."""
    return any(implementation == BATCH for group in cases(rates).values()
               for implementation, _ in group)  # fmt: skip


def versus_table(rates: Rates) -> str | None:
    """Fanout against wool's Fanout and the limit, per backend, source and N."""
    groups = cases(rates)
    ns, rows = ns_of(groups.values()), []
    backends, sources = backends_sources(groups)
    for backend in backends:
        for source in sources:
            if any(i == "Fanout" for i, _ in groups.get((backend, source), {})):
                at = [fanout_at(rates, backend, source, n) for n in ns]
                cells = [f"{a.wool} ({a.limits()})" if a else "-" for a in at]
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
    limits = "of the wake-up limit"
    if batched(rates):
        limits += " / of the wake-up limit per batch"
    alt = f"{interp}: delivered items/s as a multiple of wool's Fanout"
    image = [f"![{alt}, per backend and source](throughput-{interp}.png)"]
    return [
        f"### {interp}",
        *(image if plotted else []),
        f"`throughput-{interp}.json`: `Fanout`'s delivered items/s as a multiple of "
        f"wool's `Fanout` in the same run, then (in brackets) {limits}, "
        "per backend, source and N consumers; trio compares with wool on asyncio.",
        versus,
    ]


def throughput_blocks(path: Path, rates: Rates, meta: dict[str, Any]) -> list[str]:
    blocks = [
        f"### Throughput, {meta.get('python_version', '?')} ({path.name})",
        "Delivered items/s (the fastest of pyperf's values), N consumers each taking "
        "every item; then as a multiple of wool's `Fanout` (trio rows: of its "
        "asyncio figure), of the wake-up limit"
        + (", of the wake-up limit per batch" if batched(rates) else "")
        + " and of the raw source at N = 1.",
    ]
    limits = [WAKE, BATCH] if batched(rates) else [WAKE]
    for (backend, source), group in cases(rates).items():
        floor = group.get(("raw source", 1))
        rows = [
            [f"{n:,}", implementation, human(rate)]
            + [share(rate, of) for of in (wool_rate(rates, backend, source, n),
                                          *(group.get((limit, n)) for limit in limits),
                                          floor)]
            for (implementation, n), rate in group.items()
        ]  # fmt: skip
        columns = " | ".join(f"vs {limit}" for limit in limits)
        blocks += [
            f"#### {backend}, source {SOURCES.get(source, source)} ({path.name})",
            table(
                f"N | implementation | items/s | vs wool Fanout | {columns} | "
                "vs raw source",
                "rlrr" + "r" * len(limits) + "r",
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
        + ("/ vs `wake-up per batch` "
           if any(batched(rates) for rates in runs.values()) else "")
        + "(same run, same source and N; trio compares with wool on asyncio).",
    ]  # fmt: skip
    rates = list(runs.values())
    every = [cases(r) for r in rates]
    backends, sources = backends_sources({k: v for g in every for k, v in g.items()})
    for source in sources:
        rows = []
        for backend in backends:
            for n in ns_of(groups.get((backend, source), {}) for groups in every):
                at = [fanout_at(r, backend, source, n) for r in rates]
                cells = [f"{a.items} ({a.wool} / {a.limits()})" if a else "-"
                         for a in at]  # fmt: skip
                if any(cell != "-" for cell in cells):
                    rows.append([backend, f"{n:,}", *cells])
        if rows:
            header = " | ".join(["backend", "N", *runs])
            blocks += [
                f"#### Source {SOURCES.get(source, source)}",
                table(header, "lr" + "r" * len(runs), rows),
            ]
    return blocks


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
