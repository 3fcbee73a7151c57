"""A pool entry's states, its events, and the function deciding the next state."""

from __future__ import annotations

import enum

__all__ = ["EntryEvent", "EntryState", "IllegalTransition", "transition"]


class EntryState(enum.Enum):
    """Where a pool entry stands; only ``ACTIVE`` and ``IDLE`` ones are found
    by key, and every one but ``CLOSED`` is counted by the pool."""

    #: Consumers are attached.
    ACTIVE = "active"
    #: No consumer attached (a new entry, until its first joins); kept until
    #: its ttl timer fires.
    IDLE = "idle"
    #: The source ended or failed with consumers attached; closed once the
    #: last of them leaves.
    ENDED = "ended"
    #: Being closed: its fan-out, then the raw instance's ``aclose()``.
    CLOSING = "closing"
    CLOSED = "closed"


class EntryEvent(enum.Enum):
    """What happens to a pool entry."""

    #: A consumer joined (counted already).
    JOINED = "joined"
    #: A consumer left (counted out already, at once if garbage collected).
    LEFT = "left"
    EXPIRED = "expired"
    SOURCE_ENDED = "source ended"
    POOL_CLOSED = "pool closed"
    CLOSED = "closed"


class IllegalTransition(RuntimeError):
    """An event met an entry in a state where it cannot happen: a bug."""


def transition(
    state: EntryState, event: EntryEvent, consumers: int, ttl: float
) -> EntryState:
    """The state an entry in ``state`` moves to on ``event``, with
    ``consumers`` attached once the event is counted; pure and synchronous.

    :raises IllegalTransition: for an event that cannot happen in ``state``.
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
