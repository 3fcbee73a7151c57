"""Closing an iterator that may or may not be closable."""

from __future__ import annotations

__all__ = ["aclose_iterator"]


async def aclose_iterator(iterator: object) -> None:
    """Await ``iterator.aclose()`` if it has one (async generators do; a
    plain async iterator may not). Whatever ``aclose()`` raises propagates."""
    closer = getattr(iterator, "aclose", None)
    if closer is not None:
        await closer()
