"""The report's Markdown: its blocks, its tables and the numbers in their cells.

A block is one string: a heading (``## ...``), a paragraph, a table or an
image; :func:`markdown` puts a blank line after each. Also how the report
reads a result file (JSON) and the Python version it records.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


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
