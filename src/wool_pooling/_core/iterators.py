"""Closing, and throwing into, an iterator that may or may not support it."""

from __future__ import annotations

from typing import Any

__all__ = ["aclose_iterator", "throw_into"]


async def aclose_iterator(iterator: object) -> None:
    """Await ``iterator.aclose()`` if it has one."""
    closer = getattr(iterator, "aclose", None)
    if closer is not None:
        await closer()


async def throw_into(iterator: object, error: BaseException) -> Any:
    """Return ``await iterator.athrow(error)``; raise ``error`` without ``athrow``."""
    athrow = getattr(iterator, "athrow", None)
    if athrow is None:
        raise error
    return await athrow(error)
