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


def require_modules(*names: str, extra: str) -> str | None:
    """At a test module's import: ``None`` if every module in ``names`` is
    importable. Otherwise the module is skipped, saying which extra brings
    them; under ``WOOL_POOLING_REQUIRE_TOOLS=1`` the message is returned
    instead, for the module to keep as ``MISSING_TOOLS``: each of its tests
    that is selected then fails with it (see ``conftest.py``), while a run
    that deselects them by marker still collects the module."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return _missing(f'{", ".join(missing)} missing: pip install -e ".[{extra}]"')


def require_program(path: Path, *, extra: str) -> str | None:
    """As :func:`require_modules`, for the program at ``path``."""
    if path.exists():
        return None
    return _missing(f'{path.name} missing: pip install -e ".[{extra}]"')


def _missing(message: str) -> str:
    if not REQUIRED:
        pytest.skip(message, allow_module_level=True)
    return f"WOOL_POOLING_REQUIRE_TOOLS=1 but {message}"
