"""What a user's type checker says: the README, the examples and a typed program.

One ``pyright`` run (the one installed next to this interpreter, in strict
mode) over a temporary directory holding:

- every fenced ```` ```python ```` block of ``README.md``, each as a module
  of its own. **Convention:** such a block is a complete program, checked
  as written (imports included, no top-level ``await``); a fragment that is
  not meant to type-check goes in a ```` ```text ```` (or ``pycon``) block;
- every ``examples/*.py``;
- ``tests/typecheck/user_program.py``, which uses every name of
  ``wool_pooling.__all__`` (checked below) and must have zero errors;
- ``tests/typecheck/construction_errors.py``, whose lines marked
  ``# expect: <rule>`` must each get an error of that rule, and no other
  line any.

``# type: ignore`` and ``# pyright: ignore`` are refused in all of them.
The only setting besides strict is ``reportMissingTypeStubs = false``:
wool ships no ``py.typed`` (its inline annotations are still used), so a
strict user needs it too.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _tools import require_modules
from _tools import require_program

import wool_pooling

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parent.parent
TYPECHECK = Path(__file__).resolve().parent / "typecheck"
PYRIGHT = Path(sys.executable).with_name("pyright")
# examples/metrics.py imports prometheus_client, which pyright must resolve.
MISSING_TOOLS = require_program(PYRIGHT, extra="dev") or require_modules(
    "prometheus_client", extra="metrics"
)
CONFIG = {"typeCheckingMode": "strict", "reportMissingTypeStubs": False}
PYTHON_BLOCK = re.compile(
    r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE
)
EXPECT = re.compile(r"#\s*expect:\s*(\w+)")
SUPPRESSION = re.compile(r"#\s*(type|pyright):\s*ignore")


def readme_blocks(text: str) -> list[str]:
    """The ```` ```python ```` blocks of a Markdown text, in order."""
    return PYTHON_BLOCK.findall(text)


def test_readme_blocks_are_found() -> None:
    """The extractor finds fenced python blocks and nothing else."""
    text = "a\n```python\nx = 1\n```\n```sh\nls\n```\n```python\ny = 2\n\nz = 3\n```\n"
    assert readme_blocks(text) == ["x = 1\n", "y = 2\n\nz = 3\n"]
    assert len(readme_blocks((ROOT / "README.md").read_text())) >= 2


def test_user_program_uses_every_public_name() -> None:
    """tests/typecheck/user_program.py imports and uses every name in __all__."""
    tree = ast.parse((TYPECHECK / "user_program.py").read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "wool_pooling"
        for alias in node.names
    }
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert set(wool_pooling.__all__) <= imported
    assert set(wool_pooling.__all__) <= used


def _stage(directory: Path) -> dict[str, str]:
    """Write the files to check into ``directory``; map each name to its origin."""
    origins: dict[str, str] = {}
    for number, block in enumerate(readme_blocks((ROOT / "README.md").read_text())):
        name = f"readme_block_{number + 1}.py"
        (directory / name).write_text(block)
        origins[name] = f"README.md python block {number + 1}"
    for path in [*sorted((ROOT / "examples").glob("*.py")), *TYPECHECK.glob("*.py")]:
        shutil.copy(path, directory / path.name)
        origins[path.name] = str(path.relative_to(ROOT))
    for name, origin in origins.items():
        assert not SUPPRESSION.search((directory / name).read_text()), (
            f"{origin} silences the type checker"
        )
    (directory / "pyrightconfig.json").write_text(json.dumps(CONFIG))
    return origins


def _pyright(directory: Path) -> list[dict[str, Any]]:
    assert PYRIGHT.exists(), f"pyright is a test dependency: {PYRIGHT} is missing"
    completed = subprocess.run(
        [str(PYRIGHT), "--outputjson", "--pythonpath", sys.executable],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        report = json.loads(completed.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright gave no report:\n{completed.stdout}\n{completed.stderr}")
    assert report["summary"]["filesAnalyzed"] >= len(list(directory.glob("*.py")))
    return [d for d in report["generalDiagnostics"] if d["severity"] == "error"]


def test_readme_examples_and_user_program_pass_pyright_strict(tmp_path: Path) -> None:
    """Zero strict errors in the README's blocks, the examples and the user
    program; exactly the marked errors in construction_errors.py."""
    origins = _stage(tmp_path)
    errors = _pyright(tmp_path)
    expected_file = "construction_errors.py"
    unexpected: list[str] = []
    marked: dict[int, set[str]] = {}
    for number, line in enumerate((tmp_path / expected_file).read_text().splitlines()):
        match = EXPECT.search(line)
        if match:
            marked[number] = {match.group(1)}
    met: dict[int, set[str]] = {}
    for error in errors:
        name = Path(error["file"]).name
        line = error["range"]["start"]["line"]
        rule = error.get("rule", "")
        if name == expected_file and line in marked:
            met.setdefault(line, set()).add(rule)
            continue
        unexpected.append(f"{origins.get(name, name)}:{line + 1}: {error['message']}")
    assert unexpected == []
    missing = [
        f"{expected_file}:{line + 1}: no {rule} error"
        for line, rules in marked.items()
        for rule in rules - met.get(line, set())
    ]
    assert missing == []
    assert len(marked) >= 5
