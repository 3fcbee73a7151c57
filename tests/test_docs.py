"""The README, the package docstring and the Sphinx pages describe what the code has."""

from __future__ import annotations

import ast
import doctest
import inspect
import pydoc
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import wool_pooling

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(markdown: str, heading: str) -> str:
    """The text under ``heading`` (a whole line), up to the next one as high."""
    level = heading.split(" ", 1)[0]
    start = markdown.index(f"\n{heading}\n") + len(heading) + 2
    ends = [
        match.start()
        for match in re.finditer(r"^(#+) ", markdown[start:], flags=re.MULTILINE)
        if len(match.group(1)) <= len(level)
    ]
    return markdown[start : start + ends[0]] if ends else markdown[start:]


API = (ROOT / "docs" / "api.rst").read_text()


def _glance_table() -> dict[str, str]:
    """The API reference's "At a glance" table: each row's first cell -> the
    row's cells joined by `` | ``."""
    section = API[API.index("\nAt a glance\n") : API.index("\nThe package\n")]
    rows: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in section.splitlines():
        if line.startswith("   * - "):
            current = rows.setdefault(line.removeprefix("   * - "), [])
        elif line.startswith("     - ") and current is not None:
            current.append(line.removeprefix("     - "))
    table = {first: " | ".join([first, *rest]) for first, rest in rows.items()}
    table.pop("name", None)  # the header row
    assert table, "no table under 'At a glance' in docs/api.rst"
    return table


def _block_after(markdown: str, marker: str) -> list[str]:
    """The lines of the first fenced block after ``marker``."""
    rest = markdown[markdown.index(marker) + len(marker) :]
    opening = rest.index("```\n") + len("```\n")
    return rest[opening : rest.index("```", opening)].splitlines()


def _statistics_records() -> list[type]:
    public = [getattr(wool_pooling, name) for name in wool_pooling.__all__]
    return [
        value
        for value in public
        if attrs.has(value) and value.__name__.endswith("Statistics")
    ]


def test_help_opens_with_what_the_package_is_and_an_example() -> None:
    """``help(wool_pooling)`` starts with a description, then a short example."""
    text = pydoc.render_doc(wool_pooling, renderer=pydoc.plaintext)
    lines = text.splitlines()
    name = lines.index("NAME")
    assert lines[name + 1].startswith(
        "    wool_pooling - Share one live subscription among many async consumers"
    )
    assert lines[name + 3] == "DESCRIPTION"
    description = text[text.index("DESCRIPTION") : text.index("PACKAGE CONTENTS")]
    # Prose first, then the example.
    assert description.index("shared_subscription") < description.index(">>>")
    assert ">>> @shared_subscription" in description
    assert ">>> anyio.run(main)" in description


def test_package_docstring_example_runs() -> None:
    """The example in the package docstring passes as a doctest."""
    results = doctest.testmod(wool_pooling, verbose=False, report=True)
    assert results.attempted >= 5
    assert results.failed == 0


def test_api_at_a_glance_lists_every_decorator_argument_with_its_default() -> None:
    """The API reference's ``@shared_subscription(...)`` row shows the real keyword
    arguments and defaults, and says what each one does."""
    parameters = [
        parameter
        for parameter in inspect.signature(
            wool_pooling.shared_subscription
        ).parameters.values()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert {parameter.name for parameter in parameters} >= {
        "key",
        "ttl",
        "max_lag",
        "restart",
    }
    shown = ", ".join(f"{p.name}={p.default!r}" for p in parameters)
    cell = f"``@shared_subscription({shown})``"
    rows = _glance_table()
    assert cell in rows, f"no row {cell} in {list(rows)}"
    explanation = rows[cell].split(" | ", 1)[1]
    for parameter in parameters:
        assert f"``{parameter.name}" in explanation, parameter.name


def test_api_at_a_glance_lists_every_restart_policy_field_with_its_default() -> None:
    """The ``RestartPolicy(...)`` row shows every field and its default."""
    fields = attrs.fields(wool_pooling.RestartPolicy)
    shown = ", ".join(f"{field.name}={field.default!r}" for field in fields)
    assert f"``RestartPolicy({shown})``" in _glance_table()


def test_api_at_a_glance_lists_every_statistics_field() -> None:
    """Each frozen statistics record has a row naming each of its fields."""
    records = _statistics_records()
    assert {record.__name__ for record in records} >= {
        "PoolStatistics",
        "FanoutStatistics",
    }
    rows = _glance_table()
    for record in records:
        row = rows[f"``{record.__name__}``"]
        for field in attrs.fields(record):
            assert f"``{field.name}`` (" in row, f"{record.__name__}.{field.name}"


def test_api_at_a_glance_names_every_public_name() -> None:
    """Every name in ``wool_pooling.__all__`` appears in a first cell of the
    API reference's "At a glance" table."""
    cells = " ".join(_glance_table())
    for name in wool_pooling.__all__:
        assert re.search(rf"`@?{name}\b", cells), name


def test_every_statistics_field_has_a_doc_comment() -> None:
    """Each field of a statistics record is documented (a ``#:`` comment right
    above it, which Sphinx's autodoc shows), ``PoolStatistics.idle`` included."""
    for record in _statistics_records():
        source = inspect.getsource(record).splitlines()
        for field in attrs.fields(record):
            if field.inherited:  # documented in the class it comes from
                continue
            line = next(
                number
                for number, text in enumerate(source)
                if text.strip().startswith(f"{field.name}:")
            )
            assert source[line - 1].strip().startswith("#:"), (
                f"{record.__name__}.{field.name} has no doc comment"
            )


def test_api_reference_documents_every_public_name() -> None:
    """``docs/api.rst`` has an autodoc directive for each public name."""
    api = (ROOT / "docs" / "api.rst").read_text()
    documented = set(
        re.findall(
            r"^\.\. auto(?!module)\w+:: (\w+)(?:\(\))?$", api, flags=re.MULTILINE
        )
    )
    assert documented == set(wool_pooling.__all__)


def _run_demo(*arguments: str) -> list[str]:
    completed = subprocess.run(
        [sys.executable, "-m", "wool_pooling", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.splitlines()


def test_readme_first_example_prints_what_its_comment_shows() -> None:
    """The README's first program runs and prints the line its last comment
    shows: a reader who copies it sees the shared stream's event."""
    first = re.search(r"^```python\n(.*?)^```$", README, re.DOTALL | re.MULTILINE)
    assert first is not None
    program = first.group(1)
    shown = re.findall(r"print\(.*\)\s+# (.+)$", program, flags=re.MULTILINE)
    assert shown, "the first example's print has no comment showing its output"
    completed = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == shown


def test_readme_shows_what_the_demo_prints() -> None:
    """The demo's output in the README is what ``python -m wool_pooling`` prints."""
    shown = _block_after(README, "It prints:\n")
    assert shown[0] == "wool-pooling demo on asyncio"
    assert _run_demo() == shown


def test_readme_demo_output_holds_under_trio_up_to_the_order_of_proxies() -> None:
    """Under trio the demo prints the same lines; only the order of the
    proxies' lines for one event may differ."""
    shown = _block_after(README, "It prints:\n")
    shown[0] = "wool-pooling demo on trio"
    printed = _run_demo("--backend", "trio")
    assert sorted(printed) == sorted(shown)

    def not_proxies(lines: list[str]) -> list[str]:
        return [line for line in lines if not line.startswith("  proxy-")]

    assert not_proxies(printed) == not_proxies(shown)


def test_readme_demo_output_holds_under_uvloop_up_to_the_order_of_proxies() -> None:
    """``--backend uvloop`` runs the demo on asyncio with uvloop's loop and
    prints the same lines; only the order of the proxies' lines may differ."""
    shown = _block_after(README, "It prints:\n")
    shown[0] = "wool-pooling demo on uvloop"
    assert sorted(_run_demo("--backend", "uvloop")) == sorted(shown)


def test_the_demo_help_says_what_each_backend_is() -> None:
    """``python -m wool_pooling --help`` explains ``--backend`` and lists
    every loop it runs on."""
    text = " ".join(" ".join(_run_demo("--help")).split())
    assert "--backend {asyncio,trio,uvloop}" in text
    assert "the event loop to run the demo on" in text


def test_readme_explains_each_part_of_the_demo_output() -> None:
    """The text under the demo's output explains the raw lines, the pool
    statistics, the proxies' lines and the replay."""
    explanation = _section(README, "## Install and try it")
    explanation = explanation[explanation.index("raw subscribers built: 1\n```") :]
    for shown in (
        "`[raw]` lines come from the raw subscriber",
        "`pool:` is `SubscriptionPool.statistics()`",
        "reaches every proxy once, in order",
        "proxy-c, joining late",
    ):
        assert shown in explanation, shown


def test_demo_runs_on_asyncio_without_trio() -> None:
    """``pip install wool-pooling`` (no ``trio`` extra) is enough for asyncio:
    with trio unimportable, the demo prints what the README shows."""
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['trio'] = None; "
            "sys.argv = ['wool_pooling']; "
            "from wool_pooling.__main__ import _cli; _cli()",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == _block_after(README, "It prints:\n")


def test_demo_help_says_how_to_get_trio() -> None:
    """``python -m wool_pooling --help`` offers ``--backend trio`` together
    with the line that installs it."""
    completed = subprocess.run(
        [sys.executable, "-m", "wool_pooling", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    help_text = " ".join(completed.stdout.split())
    assert "--backend trio" in help_text
    assert 'pip install "wool-pooling[trio]"' in help_text


def test_redis_reference_documents_every_public_name() -> None:
    """``docs/redis.rst`` has an autodoc directive for each public name of
    ``wool_pooling.redis``."""
    import wool_pooling.redis as redis_module

    page = (ROOT / "docs" / "redis.rst").read_text()
    documented = set(
        re.findall(r"^\.\. auto(?!module)\w+:: (\w+)$", page, flags=re.MULTILINE)
    )
    assert documented == set(redis_module.__all__)


def test_shared_discovery_is_not_entered_again_after_its_last_exit_as_documented() -> (
    None
):
    """``docs/wool.rst`` says a ``SharedDiscovery`` cannot be entered again
    once its last user exited, and that is what a real ``LocalDiscovery``
    inner does: the second enter raises ``RuntimeError``."""
    import uuid

    import wool

    page = " ".join((ROOT / "docs" / "wool.rst").read_text().split())
    assert "it cannot be entered again" in page
    assert "'LocalDiscovery.__enter__' cannot be invoked more than once" in page
    discovery = wool_pooling.SharedDiscovery(
        wool.LocalDiscovery(f"docs-{uuid.uuid4().hex[:8]}")
    )
    with discovery, discovery:  # a second pool while the first is in: counted
        pass
    with pytest.raises(RuntimeError, match="cannot be invoked more than once"):
        discovery.__enter__()


RESULTS = ROOT / "benchmarks" / "results"
REPORT = RESULTS / "report.md"
#: Words of the implementation a reader of the README need not learn, and
#: phrases of the history of what was tried.
INTERNAL = re.compile(
    r"\bpull(s|ed|ing)?\b|\bpump\b|\bthe log\b|\bresync|\bsettle\b|\beager\b"
    r"|\bsoak\b|not shipped|was tried|WOOL_POOLING_PULLS|best of \d+ runs",
    re.IGNORECASE,
)


def _tables(markdown: str) -> list[list[str]]:
    """Each Markdown table (consecutive ``|`` lines) of a text."""
    tables: list[list[str]] = []
    current: list[str] = []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def test_readme_fits_on_a_few_screens() -> None:
    """The README is under 300 lines: what it is, install, the demo, the wool
    line, a custom subscriber, Redis, what pooling buys, links for the rest."""
    assert len(README.splitlines()) < 300
    headings = re.findall(r"^## (.+)$", README, flags=re.MULTILINE)
    assert headings == [
        "Install and try it",
        "For wool users: one line",
        "Custom subscribers",
        "Beyond one machine: Redis",
        "What pooling buys",
        "Documentation",
        "License",
    ]


def test_readme_speaks_of_what_a_user_does_not_of_the_internals() -> None:
    """No internal term of the fan-out and no development history in the
    README; its first example's class is not named like ``wool_pooling.redis``."""
    assert INTERNAL.findall(README) == []
    assert "RedisSubscriber" not in README


def test_readme_tables_are_the_rendered_report_tables() -> None:
    """Every table of the README appears, row for row, in the report that
    ``benchmarks/report.py`` renders from the committed result files."""
    report = REPORT.read_text()
    tables = _tables(README)
    assert len(tables) >= 2
    for table in tables:
        assert "\n".join(table) in report, table[0]


def test_readme_shows_the_newest_throughput_plot_next_to_its_table() -> None:
    """The README shows the throughput plot of the newest interpreter
    recorded, then the table of the same figures from the report."""
    report = REPORT.read_text()
    interpreters = sorted(
        (
            path.stem.removeprefix("throughput-")
            for path in RESULTS.glob("throughput-*.json")
        ),
        key=lambda name: [int(part) for part in re.findall(r"\d+", name)],
    )
    assert interpreters
    newest = interpreters[-1]
    image = f"/benchmarks/results/throughput-{newest}.png)"
    assert image in README
    assert (ROOT / image[1:-1]).is_file()
    assert README.count("![") == 1
    table = _tables(README[README.index(image) :])[0]
    section = report[report.index(f"\n### {newest}\n") :]
    assert table == _tables(section)[0]


def test_install_from_a_clone_is_said_in_readme_and_quickstart() -> None:
    """Until a release is on a package index, the README and the quick start
    say to install from a clone, extras included."""
    quickstart = (ROOT / "docs" / "quickstart.rst").read_text()
    for text in (README, quickstart):
        assert "git clone https://github.com/" in text
        assert "pip install ." in text
        assert 'pip install ".[trio]"' in text
        assert "Until the first release" in text


def test_the_docs_build_command_is_said_where_a_contributor_looks() -> None:
    """The README and docs/development.rst give the same command that builds
    the docs with warnings as errors, into a folder git ignores."""
    command = "sphinx-build -W -b html docs docs/_build/html"
    assert command in README
    assert command in (ROOT / "docs" / "development.rst").read_text()
    assert "docs/_build/" in (ROOT / ".gitignore").read_text().splitlines()
    assert "fail_on_warning: true" in (ROOT / ".readthedocs.yaml").read_text()


def _logged_messages() -> list[tuple[str, str, str]]:
    """Every message the package logs at INFO or above: (module, level,
    its fixed text up to the first ``%`` placeholder)."""
    levels = {"info", "warning", "error", "exception", "critical"}
    found: list[tuple[str, str, str]] = []
    for path in sorted((ROOT / "src" / "wool_pooling").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in levels
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id.endswith("logger")
                and node.args
            ):
                message = node.args[0]
                parts = (
                    [message]
                    if isinstance(message, ast.Constant)
                    else list(ast.walk(message))
                )
                text = "".join(
                    part.value
                    for part in parts
                    if isinstance(part, ast.Constant) and isinstance(part.value, str)
                )
                found.append((path.name, node.func.attr, text))
    return found


def test_the_logging_page_explains_every_message_the_package_logs() -> None:
    """docs/logging.rst names every logger and, for every message logged at
    INFO or above, its fixed text and what an operator does about it."""
    page = " ".join((ROOT / "docs" / "logging.rst").read_text().split())
    messages = _logged_messages()
    assert len(messages) >= 10, messages  # the scan finds the package's logging
    for name in (
        "``wool_pooling``",
        "``wool_pooling.restart``",
        "``wool_pooling.redis``",
    ):
        assert name in page, name
    for module, level, text in messages:
        runs = [
            run.strip(" ;:,()")
            for run in re.split(r"%[-#0 +]*\d*(?:\.\d+)?[a-z]", text)
            if run.strip(" ;:,()")
        ]
        assert runs, (module, text)
        for fixed in {runs[0], max(runs, key=len)}:
            assert fixed in page, (module, level, text, fixed)
