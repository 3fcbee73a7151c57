"""Optional tools a few tests need, from the extras that hold them.

The ``test`` extra holds what the suite itself needs; the tests that build
the docs (``docs``), run pyright (``dev``), build the distributions
(``release``) or run the benchmark scripts (``bench``) skip without their
tools, saying which extra brings them. ``WOOL_POOLING_REQUIRE_TOOLS=1``
(CI sets it) turns such a skip into a failure, so nothing is skipped there.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REQUIRED = os.environ.get("WOOL_POOLING_REQUIRE_TOOLS") == "1"


def _missing(message: str) -> None:
    if REQUIRED:
        pytest.fail(f"WOOL_POOLING_REQUIRE_TOOLS=1 but {message}", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_modules(*names: str, extra: str) -> None:
    """Skip (or fail, see above) unless every module in ``names`` is importable."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        _missing(f'{", ".join(missing)} missing: pip install -e ".[{extra}]"')


def require_program(path: Path, *, extra: str) -> None:
    """Skip (or fail) unless the program at ``path`` exists."""
    if not path.exists():
        _missing(f'{path.name} missing: pip install -e ".[{extra}]"')
