"""Which event loops the suite runs on, chosen by ``WOOL_POOLING_TEST_LOOP``.

Every async test runs on asyncio and on trio, but for the code built on
asyncio-only libraries (redis-py's client, wool), which runs on asyncio only
(:func:`asyncio_backend`, :data:`asyncio_only`). The asyncio loop is, per the
variable: ``asyncio`` (the default, a plain loop), ``eager`` (a plain loop
with :func:`asyncio.eager_task_factory` installed, CPython 3.12+) or
``uvloop``. CI runs the suite under each; the eager and uvloop runs leave
trio to the plain runs (:data:`WITH_TRIO`).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import TypeVar

import anyio
import pytest

T = TypeVar("T")

TEST_LOOP = os.environ.get("WOOL_POOLING_TEST_LOOP", "asyncio")
if TEST_LOOP not in ("asyncio", "eager", "uvloop"):
    raise RuntimeError(
        f"WOOL_POOLING_TEST_LOOP must be asyncio, eager or uvloop, got {TEST_LOOP!r}"
    )
if TEST_LOOP == "eager" and sys.version_info < (3, 12):
    raise RuntimeError("WOOL_POOLING_TEST_LOOP=eager needs CPython 3.12+")


def eager_loop() -> asyncio.AbstractEventLoop:
    """A new asyncio loop whose tasks start eagerly."""
    loop = asyncio.new_event_loop()
    loop.set_task_factory(asyncio.eager_task_factory)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownArgumentType]
    return loop


def asyncio_options() -> dict[str, Any]:
    """anyio's backend options for the asyncio loop this run uses."""
    if TEST_LOOP == "eager":
        return {"loop_factory": eager_loop}
    if TEST_LOOP == "uvloop":
        return {"use_uvloop": True}
    return {}


#: Whether this run also runs every async test on trio: the plain asyncio runs
#: do; the eager and uvloop runs change only how asyncio drives tasks, so they
#: leave trio, which they do not touch, to the plain runs.
WITH_TRIO = TEST_LOOP == "asyncio"

#: ``anyio_backend`` values: asyncio (as configured) and trio (see above).
BACKENDS = [
    pytest.param(("asyncio", asyncio_options()), id="asyncio"),
    *([pytest.param(("trio", {}), id="trio")] if WITH_TRIO else []),
]


#: Runs the test it marks on asyncio only, the loop as configured, instead of
#: the conftest's ``anyio_backend`` (direct parametrisation overrides that
#: fixture): for code built on redis-py's asyncio client or on wool.
asyncio_only = pytest.mark.parametrize("anyio_backend", BACKENDS[:1])


@pytest.fixture(params=BACKENDS[:1])
def asyncio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """``anyio_backend`` for a whole module whose code runs on asyncio only
    (``anyio_backend = asyncio_backend`` in it): asyncio, the loop as
    configured. ``test_redis_asyncio_only`` pins that such code refuses trio
    clearly."""
    return request.param


def run(body: Callable[[], Awaitable[T]], backend: tuple[str, dict[str, Any]]) -> T:
    """``anyio.run(body)`` on ``backend``, one of :data:`BACKENDS`."""
    name, options = backend
    return anyio.run(body, backend=name, backend_options=options)
