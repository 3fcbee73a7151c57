"""src/ uses only the public API of other packages and of the interpreter.

Scans src/wool_pooling (or ``$WOOL_POOLING_SCAN_ROOT``) with :mod:`ast`.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

pytestmark = pytest.mark.docs

DEFAULT_ROOT = Path(__file__).parents[1] / "src" / "wool_pooling"
SCAN_ROOT = Path(os.environ.get("WOOL_POOLING_SCAN_ROOT") or DEFAULT_ROOT)
OWN = "wool_pooling"
#: Foreign modules even when bound by a parameter or ``sys.modules.get``.
FOREIGN = {"asyncio", "trio", "anyio", "wool", "cloudpickle", "attrs", "sys"}
BANNED = {
    *("set_asyncgen_hooks", "settrace", "setprofile", "_getframe"),
    *("GLOBAL_RUN_CONTEXT", "_current_tasks", "_enter_task", "_leave_task"),
    *("_swap_current_task", "_register_task", "_unregister_task"),
}
WRITERS = {"setattr", "delattr", "__setattr__", "__delattr__"}
REFLECTION = {"getattr", "hasattr", "__getattribute__", *WRITERS}
FUNCS = ast.FunctionDef | ast.AsyncFunctionDef
IMPORTS = ast.Import | ast.ImportFrom


class Module(NamedTuple):
    label: str
    source: str
    tree: ast.Module
    foreign: frozenset[str]  # names bound to another package's module or object


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_foreign(module: str | None, level: int = 0) -> bool:
    return level == 0 and (module or "").split(".")[0] != OWN


def reflected_name(node: ast.AST, names: set[str] = REFLECTION) -> str | None:
    """``"name"`` of ``getattr(x, "name")``..., ``""`` if not a constant, or None."""
    if not (isinstance(node, ast.Call) and len(node.args) > 1):
        return None
    if (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) in names:
        value = getattr(node.args[1], "value", None)
        return value if isinstance(value, str) else ""
    return None


def written(node: ast.AST) -> tuple[str, ast.expr] | None:
    """``(name, obj)`` for ``obj.name = v``, ``del obj.name``, ``setattr(obj, ...)``."""
    if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
        return node.attr, node.value
    name = reflected_name(node, WRITERS)
    return None if name is None else (name, getattr(node, "args", [])[0])


def root_name(node: ast.expr) -> str | None:
    """``a`` for ``a.b.c``; ``None`` when the chain starts at a call, subscript..."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def foreign_names(tree: ast.Module) -> frozenset[str]:
    names = set(FOREIGN)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound = [(a.asname or a.name.split(".")[0], a.name) for a in node.names]
            names.update(name for name, full in bound if is_foreign(full))
        elif isinstance(node, ast.ImportFrom) and is_foreign(node.module, node.level):
            names.update(alias.asname or alias.name for alias in node.names)
    return frozenset(names)


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a body, through ``if``/``try``/``with`` but not defs."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            blocks = [getattr(stmt, b, []) for b in ("body", "orelse", "finalbody")]
            blocks += [handler.body for handler in getattr(stmt, "handlers", [])]
            for block in blocks:
                yield from statements(block)


def own_private_names(modules: list[Module]) -> set[str]:
    """Private names src defines: globally, in class bodies, ``__slots__``, on self.

    Only stores on ``self``/``cls`` count: ``task._abort_func = v`` defines nothing.
    """
    own: set[str] = set()
    selves = {"self", "cls"}
    for module in modules:
        classes = [n for n in ast.walk(module.tree) if isinstance(n, ast.ClassDef)]
        for body in [module.tree.body, *(c.body for c in classes)]:
            for stmt in statements(body):
                if isinstance(stmt, FUNCS | ast.ClassDef):
                    own.add(stmt.name)
                elif isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
                    targets = [n for n in ast.walk(stmt) if isinstance(n, ast.Name)]
                    names = {n.id for n in targets if isinstance(n.ctx, ast.Store)}
                    own.update(names)
                    if "__slots__" in names:
                        slots = [n for n in ast.walk(stmt) if type(n) is ast.Constant]
                        own.update(str(n.value) for n in slots)
        methods = [m for c in classes for m in c.body if isinstance(m, FUNCS)]
        selves.update(m.args.args[0].arg for m in methods if m.args.args)
    for node in (n for module in modules for n in ast.walk(module.tree)):
        write = written(node)
        if write and isinstance(write[1], ast.Name) and write[1].id in selves:
            own.add(write[0])
    return {name for name in own if is_private(name)}


def offences(module: Module, own: set[str]) -> Iterator[tuple[str, ast.AST, str]]:
    """``(rule, node, reason)`` for each offence in one module."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_foreign(alias.name) and any(
                    map(is_private, alias.name.split("."))
                ):
                    yield "import", node, f"imports private module {alias.name}"
        if isinstance(node, ast.ImportFrom) and is_foreign(node.module, node.level):
            if any(map(is_private, (node.module or "").split("."))):
                yield "import", node, f"imports from private module {node.module}"
            for alias in (a for a in node.names if is_private(a.name)):
                yield "import", node, f"imports private {alias.name} of {node.module}"
        for alias in node.names if isinstance(node, IMPORTS) else []:
            if BANNED & {alias.name.split(".")[-1], alias.asname}:
                yield "banned", node, f"imports banned name {alias.name}"
        if (name := getattr(node, "id", None) or getattr(node, "attr", None)) in BANNED:
            yield "banned", node, f"banned name {name}"
        name = reflected_name(node)
        if name and (name in BANNED or (is_private(name) and name not in own)):
            yield "banned", node, f"reflective access to {name!r}"
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            if root_name(node.value) in module.foreign:
                yield "private", node, f"private {node.attr} of a foreign module"
            elif node.attr not in own:
                yield "private", node, f"private {node.attr} not defined in src"
        if (write := written(node)) and root_name(write[1]) in module.foreign:
            code = ast.get_source_segment(module.source, write[1])
            yield "write", node, f"writes {write[0] or '?'} on foreign {code}"


def scan(root: Path, rule: str | None = None) -> list[str]:
    """``file:line: code  # reason`` for each offence against ``rule`` (or any)."""
    modules = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        label = path.relative_to(root.parent).as_posix()
        modules.append(Module(label, source, tree, foreign_names(tree)))
    own = own_private_names(modules)
    found: set[tuple[str, int, str, str]] = set()
    for module in modules:
        for kind, node, reason in offences(module, own):
            code = (ast.get_source_segment(module.source, node) or "?").splitlines()
            if rule in (None, kind):
                found.add((module.label, getattr(node, "lineno", 0), code[0], reason))
    return [f"{f}:{line}: {code}  # {why}" for f, line, code, why in sorted(found)]


def assert_clean(rule: str) -> None:
    assert any(SCAN_ROOT.rglob("*.py")), f"no Python source under {SCAN_ROOT}"
    if found := scan(SCAN_ROOT, rule):
        listing = "\n".join(found)
        pytest.fail(f"{len(found)} offence(s):\n{listing}", pytrace=False)


def test_src_imports_no_private_module_of_another_package() -> None:
    """src/ imports no private module, nor a private name, of another package."""
    assert_clean("import")


def test_src_touches_no_private_attribute_it_does_not_define() -> None:
    """src/ uses only private attributes it defines, none of a foreign module."""
    assert_clean("private")


def test_src_uses_no_interpreter_hooks_or_task_internals() -> None:
    """src/ names no interpreter hook or asyncio/trio internal, even via getattr."""
    assert_clean("banned")


def test_src_writes_no_state_of_another_package() -> None:
    """src/ assigns no attribute on a module or object imported from elsewhere."""
    assert_clean("write")


FLAGGED = [
    ("import asyncio\nasyncio.tasks._current_tasks", "private"),
    ("from trio._core import x", "import"),
    ("from asyncio.tasks import _enter_task", "import"),
    ("from asyncio import tasks as t\nt._leave_task(1, 2)", "banned"),
    ("t._fut_waiter", "private"),
    ("def f(task):\n    task._abort_func = None", "private"),
    ("class A:\n    _x = 1\nimport trio\ntrio.lowlevel._x", "private"),
    ("import sys\nsys.set_asyncgen_hooks()", "banned"),
    ("import sys as s\ns.settrace(None)", "banned"),
    ("from sys import setprofile", "banned"),
    ("import sys\nsys._getframe(1)", "private"),
    ("getattr(t, '_coro')", "banned"),
    ("hasattr(run, 'GLOBAL_RUN_CONTEXT')", "banned"),
    ("import trio\ntrio.lowlevel._x = 1", "write"),
    ("import asyncio\nsetattr(asyncio.tasks, 'x', 1)", "write"),
]
CLEAN = [
    "self._node = 1\nprint(self._node)",
    "class C:\n    def __init__(me):\n        me._n = 1\n    def f(self):\n"
    "        return self._n\ndef g(c):\n    c._n = 2",
    "class C:\n    __slots__ = ('_node',)\ndef f(c):\n    return c._node",
    "class C:\n    def _pull(self): ...\ndef f(c):\n    getattr(c, '_pull')()",
    "_NEVER = 1\ndef f(c):\n    return c._NEVER",
    "from ._fanout import Fanout\nfrom ._fanout import _NEVER",
    "from wool_pooling._core.fanout import Fanout",
    "x.__aiter__()\ne.__traceback__\nm.__func__",
    "getattr(t, '__aiter__', None)\ngetattr(t, 'aclose', None)",
    "import trio\ntrio.lowlevel.current_task()\nsys.get_asyncgen_hooks()",
]


@pytest.mark.parametrize(("snippet", "rule"), FLAGGED)
def test_scanner_flags_private_use(tmp_path: Path, snippet: str, rule: str) -> None:
    """Each snippet using a private name, a hook or foreign state is flagged."""
    (tmp_path / "mod.py").write_text(snippet)
    assert scan(tmp_path, rule), f"rule {rule!r} missed {snippet!r}"


@pytest.mark.parametrize("snippet", CLEAN)
def test_scanner_accepts_public_use(tmp_path: Path, snippet: str) -> None:
    """Snippets using only public names and the library's own privates pass."""
    (tmp_path / "mod.py").write_text(snippet)
    assert scan(tmp_path) == []
