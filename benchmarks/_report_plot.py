"""The throughput plot: per interpreter, each implementation's delivered
items/s as a multiple of wool's ``Fanout`` in the same run (matplotlib)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from _report_fanout import SOURCES
from _report_fanout import WAKE
from _report_fanout import WOOL
from _report_fanout import Rates
from _report_fanout import backends_sources
from _report_fanout import cases
from _report_fanout import ns_of
from _report_fanout import wool_rate

#: One colour per implementation, on every panel of every plot.
COLORS = {
    "Fanout": "C0",
    "SharedSubscription": "C1",
    "asyncstdlib.tee": "C3",
    "pump + streams": "C4",
}


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
