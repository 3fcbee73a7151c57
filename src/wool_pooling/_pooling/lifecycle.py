"""A pool entry's states, the events it meets, and the one synchronous
function that decides the next state (the entry then acts on it)."""

from __future__ import annotations

import enum

__all__ = ["EntryEvent", "EntryState", "IllegalTransition", "transition"]


class EntryState(enum.Enum):
    """Where a pool entry stands.

    Only ``ACTIVE`` and ``IDLE`` entries are reachable by key: a consumer
    that joins finds them. An entry is counted by
    :meth:`~wool_pooling.SubscriptionPool.statistics` from its creation
    until it is ``CLOSED``.
    """

    #: Consumers are attached (or, briefly, the last one was garbage
    #: collected and its leave is still to be decided on the loop).
    ACTIVE = "active"
    #: No consumer attached; kept open until its ttl timer fires. A new entry
    #: is ``IDLE`` until its first consumer, in the same synchronous step,
    #: joins it.
    IDLE = "idle"
    #: The source ended or failed while consumers were attached: no longer
    #: reachable by key (the next consumer gets a fresh entry), closed once
    #: the last of them leaves.
    ENDED = "ended"
    #: Being closed: its fan-out (and so the raw iterator), then the raw
    #: instance's ``aclose()``. Unreachable by key; nothing reopens it.
    CLOSING = "closing"
    #: Closed, exactly once; no longer counted by the pool.
    CLOSED = "closed"


class EntryEvent(enum.Enum):
    """What happens to a pool entry."""

    #: A consumer joined (the entry's consumer count already includes it).
    JOINED = "joined"
    #: A consumer left (the count already excludes it). A consumer collected
    #: as garbage is counted out at once and its leave decided later, on the
    #: loop, with the count as it stands then.
    LEFT = "left"
    #: The ttl timer of an idle entry fired.
    EXPIRED = "expired"
    #: The entry's source was found ended or failed (at a join or a leave).
    SOURCE_ENDED = "source ended"
    #: The pool is being closed.
    POOL_CLOSED = "pool closed"
    #: The close step has finished.
    CLOSED = "closed"


class IllegalTransition(RuntimeError):
    """An event met an entry in a state where it cannot happen: a bug."""


def transition(
    state: EntryState, event: EntryEvent, consumers: int, ttl: float
) -> EntryState:
    """The state an entry in ``state`` moves to on ``event``, ``consumers``
    being the number attached once the event is counted and ``ttl`` the
    entry's. Pure and synchronous: the caller applies the result. A leave
    keeps an entry whose consumers remain; the last one makes an ``ACTIVE``
    entry ``IDLE`` (``ttl > 0``) or ``CLOSING``, an ``ENDED`` one
    ``CLOSING``; a source's end makes it ``ENDED`` while consumers remain.

    :raises IllegalTransition: for an event that cannot happen in ``state``
        (a join without a consumer, a leave from an idle entry with
        consumers, ...): the caller broke the lifecycle.
    """
    state_, event_ = EntryState, EntryEvent
    if event is event_.JOINED:
        if consumers and (state is state_.ACTIVE or state is state_.IDLE):
            return state_.ACTIVE
    elif state is state_.IDLE and consumers:
        pass  # an idle entry has no consumer: only a join adds one
    elif event is event_.POOL_CLOSED and state is not state_.CLOSED:
        return state_.CLOSING
    elif event is event_.LEFT:
        if consumers or state is state_.IDLE or state is state_.CLOSING:
            return state
        if state is state_.ACTIVE:
            return state_.IDLE if ttl > 0 else state_.CLOSING
        return state_.CLOSING if state is state_.ENDED else state
    elif event is event_.SOURCE_ENDED and state is state_.ACTIVE:
        return state_.ENDED if consumers else state_.CLOSING
    elif event is event_.SOURCE_ENDED or event is event_.EXPIRED:
        if state is state_.IDLE:
            return state_.CLOSING
    elif event is event_.CLOSED and state is state_.CLOSING:
        return state_.CLOSED
    raise IllegalTransition(
        f"a pool entry {state.name} cannot take {event.name} "
        f"(consumers: {consumers}, ttl: {ttl})"
    )
