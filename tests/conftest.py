from __future__ import annotations

from typing import Any

import pytest
from _loops import BACKENDS


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Run every ``anyio``-marked test under asyncio (see ``_loops``) and trio."""
    return request.param
