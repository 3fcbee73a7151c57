"""Sphinx configuration: the API reference is built from the docstrings."""

from __future__ import annotations

import importlib.metadata
import re
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


def setup(app: Any) -> None:
    app.connect("autodoc-process-signature", _attrs_defaults)

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
]

# The inventories are committed (docs/_inventories/README.md says how they
# were built): the build needs no network.
_inventories = Path(__file__).parent / "_inventories"
intersphinx_mapping = {
    "python": ("https://docs.python.org/3.15/", str(_inventories / "python.inv")),
    "anyio": ("https://anyio.readthedocs.io/en/stable/", str(_inventories / "anyio.inv")),
    "trio": ("https://trio.readthedocs.io/en/stable/", str(_inventories / "trio.inv")),
}
