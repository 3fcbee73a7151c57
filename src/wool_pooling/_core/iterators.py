"""Closing, and throwing into, an iterator that may or may not support it."""

from __future__ import annotations

from typing import Any

__all__ = ["aclose_iterator", "throw_into"]


async def aclose_iterator(iterator: object) -> None:
    """Await ``iterator.aclose()`` if it has one (async generators do; a
    plain async iterator may not). Whatever ``aclose()`` raises propagates."""
    closer = getattr(iterator, "aclose", None)
    if closer is not None:
        await closer()


async def throw_into(iterator: object, error: BaseException) -> Any:
    """Raise ``error`` inside ``iterator`` where it is suspended
    (``athrow()``, as an async generator has), and return what it yields
    then; an iterator without ``athrow`` cannot take it, so it is raised
    here."""
    athrow = getattr(iterator, "athrow", None)
    if athrow is None:
        raise error
    return await athrow(error)
