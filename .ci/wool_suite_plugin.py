"""pytest plugin: wool's own tests, with every discovery wrapped in SharedDiscovery.

Loaded by ``.ci/wool-suite`` into the test process of its second run
(``python -m pytest -p wool_suite_plugin``, with this folder on
``PYTHONPATH``). It replaces ``wool.WorkerPool.__init__`` with one that
passes its ``discovery=`` argument (keyword-only in wool) through
:func:`share` first, so every pool wool's tests build discovers through
``wool_pooling.SharedDiscovery``. Only public names are used: ``wool.WorkerPool``,
``wool.DiscoveryLike`` and ``wool_pooling.SharedDiscovery``.

What wool accepts as ``discovery`` (a discovery, a factory, a context manager
or an awaitable that gives one) is kept in that form, so the test exercises
the same path through ``WorkerPool``; only the discovery it finally yields is
wrapped:

- a ``DiscoveryLike`` becomes ``SharedDiscovery(it)``; wool then enters the
  wrapper, which enters the discovery (``LocalDiscovery``: synchronously);
- a context manager (sync or async) is entered as before and what it yields
  is wrapped (the manager owns that discovery's lifetime, so the wrapper is
  not entered);
- a factory is called as before and its result wrapped by these same rules;
- an awaitable is awaited and its result wrapped.

Anything else (``None``, a ``SharedDiscovery`` already, or a value that is no
discovery, which wool rejects itself) is passed on unchanged. A
``SharedDiscovery`` that cannot be built (for example around a discovery it
cannot ship to worker processes) raises where the test builds its pool, and
the test fails with that error: the point of the run.

At the end of the session the plugin prints how many pools got a discovery
and how many ``SharedDiscovery`` it made; with ``WOOL_SUITE_WRAP_REPORT`` set
it also writes them to that file, as JSON, for the runner.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from contextlib import AbstractContextManager
from typing import Any

import pytest
import wool

from wool_pooling import SharedDiscovery

#: What the run wrapped: pools given a discovery, SharedDiscovery made (and
#: by which form of the argument), and the tests that built at least one pool
#: with a discovery.
counts = {"pools_with_discovery": 0, "shared_discoveries": 0}
made_via: dict[str, int] = {}
tests_with_discovery: set[str] = set()
_current_test: list[str] = [""]


def _is_discovery(value: object) -> bool:
    try:
        return isinstance(value, wool.DiscoveryLike)
    except Exception:  # a property that fails on an unentered object
        return False


def wrap_discovery(value: Any, via: str) -> Any:
    """``SharedDiscovery(value)`` if ``value`` is a discovery not wrapped yet;
    ``via`` names the form of the argument it came from, for the counts."""
    if isinstance(value, SharedDiscovery) or not _is_discovery(value):
        return value
    shared = SharedDiscovery(value)
    counts["shared_discoveries"] += 1
    made_via[via] = made_via.get(via, 0) + 1
    return shared


class _SharedSyncContext:
    """A sync context manager that yields the wrapped discovery of another."""

    def __init__(self, manager: AbstractContextManager[Any]) -> None:
        self._manager = manager

    def __enter__(self) -> Any:
        return wrap_discovery(self._manager.__enter__(), "context manager")

    def __exit__(self, *exc_info: Any) -> bool | None:
        return self._manager.__exit__(*exc_info)


class _SharedAsyncContext:
    """An async context manager that yields the wrapped discovery of another."""

    def __init__(self, manager: AbstractAsyncContextManager[Any]) -> None:
        self._manager = manager

    async def __aenter__(self) -> Any:
        return wrap_discovery(await self._manager.__aenter__(), "async context manager")

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._manager.__aexit__(*exc_info)


class _SharedFactory:
    """A factory whose result is shared by :func:`share`'s rules."""

    def __init__(self, factory: Any) -> None:
        self._factory = factory

    def __call__(self) -> Any:
        return share(self._factory(), via="factory")


async def _shared_awaitable(awaitable: Awaitable[Any]) -> Any:
    return wrap_discovery(await awaitable, "awaitable")


def share(discovery: Any, via: str = "discovery") -> Any:
    """``discovery`` in the same form, yielding a ``SharedDiscovery`` in the end.

    The order is wool's own (``WorkerPool`` resolves a discovery argument the
    same way), except that a discovery that is also a context manager
    (``LocalDiscovery``) is wrapped whole, so the wrapper enters it.
    """
    if discovery is None or isinstance(discovery, SharedDiscovery):
        return discovery
    if _is_discovery(discovery):
        return wrap_discovery(discovery, via)
    if isinstance(discovery, AbstractContextManager):
        return _SharedSyncContext(discovery)
    if isinstance(discovery, AbstractAsyncContextManager):
        return _SharedAsyncContext(discovery)
    if callable(discovery):
        return _SharedFactory(discovery)
    if isinstance(discovery, Awaitable):
        return _shared_awaitable(discovery)
    return discovery


def _install() -> None:
    original = wool.WorkerPool.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("discovery") is not None:
            counts["pools_with_discovery"] += 1
            tests_with_discovery.add(_current_test[0])
            kwargs["discovery"] = share(kwargs["discovery"])
        original(self, *args, **kwargs)

    wool.WorkerPool.__init__ = __init__  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    _install()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current_test[0] = item.nodeid


def pytest_terminal_summary(terminalreporter: Any) -> None:
    line = (
        f"wool_suite_plugin: {counts['pools_with_discovery']} "
        f"WorkerPool(discovery=...) in {len(tests_with_discovery)} tests; "
        f"{counts['shared_discoveries']} SharedDiscovery made "
        f"({_forms()})"
    )
    terminalreporter.write_line(line)
    path = os.environ.get("WOOL_SUITE_WRAP_REPORT")
    if path:
        with open(path, "w") as file:
            json.dump(
                {**counts, "tests": len(tests_with_discovery), "forms": _forms()}, file
            )


def _forms() -> str:
    """How many SharedDiscovery came from each form of ``discovery=``."""
    return ", ".join(f"{via}: {n}" for via, n in sorted(made_via.items()))
