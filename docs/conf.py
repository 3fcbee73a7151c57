"""Sphinx configuration: the API reference is built from the docstrings."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

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
