"""The built API reference: real defaults, an entry for every field.

Sphinx is a test dependency, so this builds the HTML docs in every test run
(``.ci/run`` also builds them with ``-W`` and runs their doctests).
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from _tools import require_modules

import wool_pooling
import wool_pooling.redis

MISSING_TOOLS = require_modules("sphinx", "myst_parser", extra="docs")

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _text(page: str) -> str:
    """A page's text: tags dropped, entities decoded, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())


def _records() -> list[tuple[str, type]]:
    """Every public attrs record (a class with public fields), with the module
    it is documented under."""
    return [
        (module.__name__, value)
        for module in (wool_pooling, wool_pooling.redis)
        for value in (getattr(module, name) for name in module.__all__)
        if isinstance(value, type)
        and attrs.has(value)
        and any(not field.name.startswith("_") for field in attrs.fields(value))
    ]


def test_built_html_shows_no_attrs_internals(built: Path) -> None:
    """No page shows ``attr_dict[...]``: the source attrs generates for an
    ``__init__`` default, unreadable to a user."""
    for page in built.glob("*.html"):
        assert "attr_dict" not in page.read_text(), page.name


def test_attrs_signatures_show_real_defaults(built: Path) -> None:
    """``RestartPolicy(attempts: int | None = 5, ...)`` and every other
    public attrs class's signature show each field's default value."""
    pages = {page.stem: _text(page.read_text()) for page in built.glob("*.html")}
    reference = pages["api"] + " " + pages["redis"]
    assert (
        "RestartPolicy(attempts: int | None = 5, backoff: float = 0.1, "
        "multiplier: float = 2.0, max_backoff: float = 10.0, jitter: float = "
        "0.1, settle: float = 1.0, restart_on_end: bool = False)"
    ) in reference
    for _, record in _records():
        for field in attrs.fields(record):
            if field.default is not attrs.NOTHING:
                shown = f"{field.name}: {field.type} = {field.default!r}"
                assert shown in reference, f"{record.__name__}: {shown}"


def test_every_field_of_every_attrs_class_has_an_entry(built: Path) -> None:
    """Each field of ``RestartPolicy``, the statistics records and
    ``RedisStatistics`` has its own documented entry in the reference."""
    pages = " ".join(page.read_text() for page in built.glob("*.html"))
    for module, record in _records():
        for field in attrs.fields(record):
            anchor = f'id="{module}.{record.__name__}.{field.name}"'
            assert anchor in pages, anchor
            entry = pages[pages.index(anchor) :]
            entry = entry[entry.index("<dd>") : entry.index("</dd>")]
            assert _text(entry), f"{record.__name__}.{field.name} has no text"


def _signatures(page: str) -> list[str]:
    """The text of every object signature on a built page."""
    return [
        _text(signature)
        for signature in re.findall(
            r'<dt class="sig sig-object py"[^>]*>(.*?)</dt>', page, flags=re.DOTALL
        )
    ]


def test_signatures_show_public_names_and_literal_defaults(built: Path) -> None:
    """No signature in the reference names a private class
    (``inner: _SyncContextDiscovery``) or shows a
    ``DEFAULT_`` constant where the value is what a reader needs
    (``max_lag: int | None = 1024``); a consumer's constructor, which users
    never call, is not shown."""
    signatures = [
        signature
        for name in ("api", "redis")
        for signature in _signatures((built / f"{name}.html").read_text())
    ]
    assert len(signatures) > 40
    for signature in signatures:
        assert not re.search(r"(?<![\w.])_[A-Za-z]\w*", signature), signature
        assert not re.search(r"= DEFAULT_", signature), signature
    assert any("max_lag: int | None = 1024" in each for each in signatures)
    assert any(
        each.endswith("class wool_pooling.FanoutConsumer¶") for each in signatures
    )


def test_benchmark_page_shows_every_table_and_plot_of_the_report(built: Path) -> None:
    """The docs' benchmark results page is ``benchmarks/results/report.md``
    as rendered: each of its Markdown tables is an HTML table there, with
    the same header row, and each plot it shows is copied into the build."""
    report = (ROOT / "benchmarks" / "results" / "report.md").read_text()
    headers = re.findall(r"^(\|.*\|)\n\|[-:|]+\|$", report, flags=re.MULTILINE)
    page = (built / "benchmark-results.html").read_text()
    tables = re.findall(r"<table.*?</table>", page, flags=re.DOTALL)
    assert len(headers) > 10
    assert len(tables) == len(headers)
    for header, table in zip(headers, tables, strict=True):
        head = table[table.index("<thead") : table.index("</thead>")]
        cells = [cell.strip() for cell in header.strip("|").split(" | ")]
        shown = _text(head).replace("\u2019", "'")  # Sphinx's smart quotes
        assert shown == _text(" ".join(cells).replace("`", "")), header
    images = re.findall(r"\]\((throughput-[\w.]+\.png)\)", report)
    assert images
    for image in images:
        assert f'src="_images/{image}"' in page
        assert (built / "_images" / image).is_file()
