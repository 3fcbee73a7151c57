"""Sphinx configuration: the API reference is built from the docstrings."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path
from typing import Any

import attrs

project = "wool-pooling"
author = "wool-pooling contributors"
release = version = importlib.metadata.version("wool-pooling")

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
    # benchmarks/results/report.md, the rendered benchmark report, is Markdown.
    "myst_parser",
]

root_doc = "index"
exclude_patterns = ["_build", "_inventories"]
html_theme = "alabaster"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

#: How ``autodoc_preserve_defaults`` shows a default of an attrs class: the
#: source of the ``__init__`` attrs generates, which names its own table.
_ATTRS_DEFAULT = re.compile(r"attr_dict\['(\w+)'\]\.default")


def _attrs_defaults(
    app: Any,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    """Show an attrs class's defaults as values (``attempts: int | None = 5``)."""
    if signature is None or not (isinstance(obj, type) and attrs.has(obj)):
        return None
    fields = attrs.fields_dict(obj)

    def value(match: re.Match[str]) -> str:
        default = fields[match.group(1)].default
        if isinstance(default, attrs.Factory):
            return f"<factory {getattr(default.factory, '__qualname__', '?')}>"
        return repr(default)

    return _ATTRS_DEFAULT.sub(value, signature), return_annotation


#: Private names a signature may carry, and what a reader is shown instead.
_PUBLIC_NAMES = {
    "_SyncContextDiscovery": "DiscoveryLike",
}


def _constant(name: str) -> Any:
    """The value of a module constant of the package, by name."""
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("wool_pooling") and hasattr(module, name):
            return getattr(module, name)
    raise LookupError(f"no module of wool_pooling defines {name}")


def _public_signatures(app: Any, doctree: Any) -> None:
    """Show every signature (overloads included) as a user reads it: a
    default given as a constant (``max_lag = DEFAULT_MAX_LAG``) as its value
    (``1024``), and a private class in an annotation as its public shape."""
    from docutils import nodes
    from sphinx import addnodes

    for signature in doctree.findall(addnodes.desc_signature):
        for text in list(signature.findall(nodes.Text)):
            shown = str(text)
            if shown in _PUBLIC_NAMES:
                replacement = _PUBLIC_NAMES[shown]
            elif re.fullmatch(r"DEFAULT_\w+", shown) and isinstance(
                text.parent, nodes.inline
            ):
                replacement = repr(_constant(shown))
            else:
                continue
            text.parent.replace(text, nodes.Text(replacement))


def setup(app: Any) -> None:
    app.connect("autodoc-process-signature", _attrs_defaults)
    app.connect("doctree-read", _public_signatures)


# Every cross-reference must resolve: with -W, a broken one fails the build.
nitpicky = True
nitpick_ignore_regex = [
    # wool's names stay unlinked: no inventory of wool's docs is available
    # to this build.
    (r"py:.*", r"(wool\.)?(DiscoveryEvent|DiscoveryLike|DiscoverySubscriberLike)"),
    (r"py:.*", r"(wool\.)?(DiscoveryPublisherLike|WorkerMetadata|PredicateFunction)"),
    # Type variables and private classes named in signatures.
    (r"py:class", r"wool_pooling\._.*"),
    (r"py:class", r"[A-Z](_co)?"),
    # The decorator's type aliases, spelled out in its docstring.
    (r"py:class", r"KeyFunction|ViewFactory"),
]

# The inventories are committed (docs/_inventories/README.md says how they
# were built): the build needs no network.
_inventories = Path(__file__).parent / "_inventories"
intersphinx_mapping = {
    "python": ("https://docs.python.org/3.15/", str(_inventories / "python.inv")),
    "anyio": (
        "https://anyio.readthedocs.io/en/stable/",
        str(_inventories / "anyio.inv"),
    ),
    "trio": ("https://trio.readthedocs.io/en/stable/", str(_inventories / "trio.inv")),
}
