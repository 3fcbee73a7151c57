"""The end of a source's first listing: :func:`mark_synced`, or :class:`Synced`."""

from __future__ import annotations

import weakref
from contextvars import ContextVar
from typing import Any
from typing import final

import attrs

__all__ = ["Synced", "listing", "mark_synced"]


#: The source :func:`mark_synced` marks (its ``_listed()``), held weakly: set
#: by the restart engine in the task that pulls a shared subscription's source.
listing: ContextVar[weakref.ref[Any] | None] = ContextVar("listing", default=None)


def mark_synced() -> bool:
    """Mark the end of the first listing, right after the items yielded so far.

    Call it from inside a shared subscription's source (its ``__aiter__``'s
    body, or a task started there): it does what yielding :class:`Synced`
    does, with no :class:`Synced` in the item type. See :ref:`synced`.

    :return: ``True``; ``False``, doing nothing, where no shared subscription
        iterates the caller (a plain :class:`~wool_pooling.Fanout`, say).
    """
    marked = listing.get()
    source = None if marked is None else marked()
    if source is None:
        return False
    source._listed()
    return True


@final
@attrs.frozen
class Synced:
    """Yielded by a shared subscription's source: "my first listing is complete".

    The same as :func:`mark_synced`, for sources typed to yield it: a shared
    subscription takes it in (its consumers never see it); a plain
    :class:`~wool_pooling.Fanout` passes it on like any other item. Every
    instance equals every other. See :ref:`synced`.
    """
