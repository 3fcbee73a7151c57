"""The package's layers import in one direction only.

``_core`` (the fan-out, its backend, iterator helpers) < ``_pooling`` (sharing by
key) < ``_wool`` (discovery semantics) < ``redis`` (the public
``wool_pooling.redis``). These tests read every module's imports (with
:mod:`ast`, nothing is imported) and pin the rules that keep the layers
apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "wool_pooling"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved to absolute."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            # ``from . import x`` and ``from pkg import submodule``
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


MODULES = {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def _within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in packages)


def _importers(target: str) -> set[str]:
    return {
        name
        for name, imported in MODULES.items()
        if any(_within(module, target) for module in imported)
    }


def test_the_scan_sees_every_layer_and_its_imports() -> None:
    """The scan finds the modules of every layer and the imports they make
    (so the rules below are checked against something)."""
    for layer in ("_core", "_pooling", "_wool", "redis"):
        assert any(_within(name, f"wool_pooling.{layer}") for name in MODULES), layer
    assert "wool_pooling._core.backend" in MODULES["wool_pooling._core.fanout"]
    assert "wool_pooling._pooling.decorator" in _importers("wool_pooling._pooling")
    assert "redis.asyncio" in MODULES["wool_pooling.redis"]


@pytest.mark.parametrize(
    "module", sorted(name for name in MODULES if _within(name, "wool_pooling._core"))
)
def test_core_imports_nothing_above_it(module: str) -> None:
    """``_core`` imports no other layer of the package, nor wool nor redis-py."""
    for imported in MODULES[module]:
        if _within(imported, "wool_pooling"):
            assert _within(imported, "wool_pooling._core"), imported
        assert not _within(imported, "wool", "redis"), imported


def test_only_the_redis_package_imports_redis_py() -> None:
    """redis-py is imported by ``wool_pooling.redis`` and nothing else, so the
    rest of the package works without the ``redis`` extra."""
    importers = _importers("redis")
    assert importers
    assert all(_within(name, "wool_pooling.redis") for name in importers), importers


def test_nothing_outside_the_redis_package_imports_it() -> None:
    """``wool_pooling.redis`` sits on top: no other layer, and not the package
    root, imports it."""
    outside = {
        name
        for name in _importers("wool_pooling.redis")
        if not _within(name, "wool_pooling.redis")
    }
    assert outside == set()


def test_the_package_root_only_re_exports() -> None:
    """``wool_pooling/__init__.py`` defines nothing but ``__version__`` and
    ``__all__``: every public name is imported from the layer that owns it."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    defined = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    assert defined == []


#: The layers, lowest first: each imports only those before it.
LAYERS = ("_core", "_pooling", "_wool", "redis")


def _layer(module: str) -> int | None:
    for rank, layer in enumerate(LAYERS):
        if _within(module, f"wool_pooling.{layer}"):
            return rank
    return None


@pytest.mark.parametrize(
    "module", sorted(name for name in MODULES if _layer(name) is not None)
)
def test_every_layer_imports_only_the_layers_below_it(module: str) -> None:
    """For every pair of layers, the higher may import the lower and never the
    reverse (``TYPE_CHECKING`` imports included)."""
    rank = _layer(module)
    assert rank is not None
    for imported in MODULES[module]:
        below = _layer(imported)
        assert below is None or below <= rank, imported


@pytest.mark.parametrize("layer", ["_core", "_pooling"])
def test_the_lower_layers_import_no_wool(layer: str) -> None:
    """Only ``_wool`` and ``redis`` know wool: the pool and the fan-out do not."""
    for module in MODULES:
        if _within(module, f"wool_pooling.{layer}"):
            assert not any(_within(i, "wool") for i in MODULES[module]), module


def test_no_module_of_the_pool_imports_another_that_imports_it_back() -> None:
    """The pool's modules import one another without a circle, not even one
    made of ``TYPE_CHECKING`` imports: each can be read after those it uses."""
    package = "wool_pooling._pooling"
    graph = {
        name: {i for i in imported if i in MODULES and _within(i, package)}
        for name, imported in MODULES.items()
        if _within(name, package)
    }
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join([*path, name])
        if name in done:
            return
        for imported in graph[name]:
            visit(imported, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())
