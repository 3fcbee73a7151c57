"""When a shared source fails (or ends), iterate the raw subscriber again."""

from __future__ import annotations

import logging
import math
import random
import uuid
import weakref
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any
from typing import final

import anyio
import attrs
from wool import DiscoveryEvent

from .._core.backend import current_loop
from .._core.iterators import aclose_iterator
from .._core.iterators import throw_into
from .._core.synced import Synced
from .._wool.tracking import BrokenSubscriber
from .._wool.tracking import KnownWorkers
from .._wool.tracking import open_iterator

__all__ = ["RestartPolicy", "RestartingSource"]

restart_logger = logging.getLogger("wool_pooling.restart")


def _in_range(value: object, low: float, high: float) -> bool:
    """A number (an int or float, not a bool) with ``low <= value <= high``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return low <= value <= high


def _is_attempts(value: object) -> bool:
    if value is None:
        return True
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _check(name: str, value: object, valid: bool, rule: str) -> None:
    """One rule per field, one wording for every way of breaking it."""
    if not valid:
        raise ValueError(f"{name} must be {rule}, got {value!r}")


@attrs.frozen
class RestartPolicy:
    """Opt-in restarts of a shared subscription's raw stream.

    Pass as ``@shared_subscription(restart=RestartPolicy(...))``. When the
    raw subscriber's stream raises, it is iterated again (``aiter(raw)``)
    after a delay, and consumers see no error: only the difference between
    the workers known before the failure and those the new stream reports
    (workers it re-reports unchanged are not repeated; those it has not
    reported within ``settle`` seconds are dropped). The delay before attempt
    *n* is drawn uniformly between ``(1 - jitter)`` and ``(1 + jitter)``
    times ``backoff * multiplier ** (n - 1)`` capped at ``max_backoff``, and
    never above ``max_backoff``: at the cap, the delays still spread over
    ``[max_backoff * (1 - jitter), max_backoff]``, so restarts that failed
    together do not retry in step. Once ``attempts``
    consecutive restarts have failed without a single event in between,
    every consumer gets the last error. Each restart is logged on the
    ``wool_pooling.restart`` logger.

    :param attempts: Consecutive restarts allowed; ``None`` for no limit.
    :param backoff: Delay before the first restart, in seconds.
    :param multiplier: Growth of the delay from one attempt to the next.
    :param max_backoff: Cap on the delay, in seconds.
    :param jitter: Relative randomisation of each delay, in ``[0, 1]``.
    :param settle: Seconds the new stream has to report the workers it
        knows; workers known before the failure and not reported by then
        are dropped.
    :param restart_on_end: Also restart when the raw stream ends normally
        (otherwise its end ends the consumers).
    :raises ValueError: naming the parameter, with one wording per rule
        whatever breaks it (wrong type or value): ``attempts`` is ``None`` or
        an int >= 1; ``backoff``, ``max_backoff`` and ``settle`` finite
        numbers >= 0; ``multiplier`` a finite number >= 1; ``jitter`` a number
        in ``[0, 1]``; ``restart_on_end`` a bool.
    """

    #: Consecutive restarts allowed (an int >= 1); ``None`` for no limit.
    #: The count starts again after the first event of a new stream.
    attempts: int | None = 5
    #: Delay before the first restart, in seconds (a finite number >= 0;
    #: 0 restarts at once, every time).
    backoff: float = 0.1
    #: Growth of the delay from one attempt to the next (a finite number
    #: >= 1; 1 keeps it constant).
    multiplier: float = 2.0
    #: Cap on the delay, in seconds (a finite number >= 0).
    max_backoff: float = 10.0
    #: Relative randomisation of each delay, in ``[0, 1]``: the delay is
    #: drawn from ``[1 - jitter, 1 + jitter]`` times its base, below the cap.
    jitter: float = 0.1
    #: Seconds the new stream has to report the workers it knows (a finite
    #: number >= 0); workers known before the failure and not reported by
    #: then are dropped.
    settle: float = 1.0
    #: Also restart when the raw stream ends normally; ``False`` lets its
    #: end end the consumers.
    restart_on_end: bool = False

    def __attrs_post_init__(self) -> None:
        finite = math.nextafter(math.inf, 0)  # the largest finite float
        _check(
            "attempts",
            self.attempts,
            _is_attempts(self.attempts),
            "None or an int >= 1",
        )
        for name in ("backoff", "max_backoff", "settle"):
            value = getattr(self, name)
            _check(name, value, _in_range(value, 0, finite), "a finite number >= 0")
        _check(
            "multiplier",
            self.multiplier,
            _in_range(self.multiplier, 1, finite),
            "a finite number >= 1",
        )
        _check(
            "jitter", self.jitter, _in_range(self.jitter, 0, 1), "a number in [0, 1]"
        )
        _check(
            "restart_on_end",
            self.restart_on_end,
            _is_bool(self.restart_on_end),
            "a bool (True or False)",
        )

    def allows(self, attempt: int) -> bool:
        """Whether restart number ``attempt`` (from 1) may happen."""
        return self.attempts is None or attempt <= self.attempts

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart number ``attempt`` (from 1)."""
        if self.backoff == 0:
            return 0.0
        try:
            grown = self.backoff * self.multiplier ** (attempt - 1)
        except OverflowError:  # attempts=None: the delay just stays at the cap
            grown = math.inf
        base = min(self.max_backoff, grown)
        if not self.jitter:
            return base
        # Spread under the cap, not cut by it (a cut would put every delay
        # that reached the cap on the same instant).
        high = min(self.max_backoff, base * (1 + self.jitter))
        return random.uniform(base * (1 - self.jitter), high)


@final
class RestartingSource:
    """The raw subscriber's iteration under a :class:`RestartPolicy`,
    recording which workers are known (as
    :class:`~wool_pooling._wool.tracking.TrackedSource` does).

    A failure of the raw stream (or its end, with ``restart_on_end``) closes
    the failed iteration, waits out the backoff and iterates the raw
    subscriber again, all within the pull that met it. The new stream's
    events are translated into the difference with the workers known before:
    a re-reported worker is repeated only if its metadata changed (as
    ``worker-updated``), and the workers it has not reported within
    ``settle`` seconds are dropped by a timer, which logs the drops through
    :meth:`deliver_to` outside any pull (the new stream may stay silent).
    """

    __slots__ = (
        "_deliver",
        "_failures",
        "_iterator",
        "_policy",
        "_raw",
        "_reported",
        "_settling",
        "errors",
        "known",
        "restarts",
    )

    def __init__(
        self,
        raw: AsyncIterable[Any],
        policy: RestartPolicy,
        history: int | None = None,
    ) -> None:
        self._raw = raw
        self._policy = policy
        self._iterator: AsyncIterator[Any] | None = None
        self.known = KnownWorkers(history)
        # Consecutive restarts without an event in between.
        self._failures = 0
        #: Errors the raw stream raised, and restarts that followed, in all.
        self.errors = 0
        self.restarts = 0
        # After a restart: the workers the new stream has reported so far,
        # and the timer that drops the others once the settle time is over.
        self._reported: set[uuid.UUID] | None = None
        self._settling: anyio.CancelScope | None = None
        # Where the settle timer's drops go; held weakly (the fan-out holds
        # this source: a strong reference back would keep both alive).
        self._deliver: weakref.WeakMethod[Callable[[Any], None]] | None = None

    def deliver_to(self, inject: Callable[[Any], None]) -> None:
        """Send events produced outside a pull to the bound method ``inject``
        (a fan-out's :meth:`~wool_pooling.Fanout.inject`), held weakly."""
        self._deliver = weakref.WeakMethod(inject)

    def __aiter__(self) -> RestartingSource:
        return self

    async def __anext__(self) -> Any:
        return await self._next(None)

    async def athrow(self, error: BaseException) -> Any:
        """Raise ``error`` in the raw iteration, where it is suspended; what
        it raises then is handled as a failure of ``__anext__`` is."""
        return await self._next(error)

    async def _next(self, thrown: BaseException | None) -> Any:
        policy = self._policy
        while True:
            iterator = self._iterator
            try:
                if thrown is not None:
                    error, thrown = thrown, None
                    if iterator is None:
                        raise error
                    event = await throw_into(iterator, error)
                else:
                    if iterator is None:
                        iterator = self._iterator = open_iterator(self._raw)
                    event = await iterator.__anext__()
            except BrokenSubscriber:
                self.errors += 1
                raise  # a programming error: another attempt cannot fix it
            except StopAsyncIteration as end:
                if not policy.restart_on_end:
                    raise
                await self._restart_after(end, policy)
                continue
            except Exception as error:
                await self._restart_after(error, policy)
                continue
            self._failures = 0
            event = self._translate(event)
            if event is not None:
                return event

    async def _restart_after(self, error: BaseException, policy: RestartPolicy) -> None:
        """Close the failed iteration and wait out the backoff, or re-raise."""
        self._failures += 1
        self.errors += not isinstance(error, StopAsyncIteration)
        attempt = self._failures
        if not policy.allows(attempt):
            restart_logger.error(
                "giving up on %r after %d restarts: %r", self._raw, attempt - 1, error
            )
            raise error
        self.restarts += 1
        delay = policy.delay(attempt)
        restart_logger.warning(
            "restarting %r in %.3fs (attempt %d of %s) after %r",
            self._raw,
            delay,
            attempt,
            policy.attempts if policy.attempts is not None else "unlimited",
            error,
        )
        iterator, self._iterator = self._iterator, None
        with anyio.CancelScope(shield=True):
            try:
                await aclose_iterator(iterator)
            except Exception:
                restart_logger.debug("closing the failed iteration", exc_info=True)
        await anyio.sleep(delay)
        self._reported = set()
        if self._settling is not None:
            self._settling.cancel()
        settling = self._settling = anyio.CancelScope()
        current_loop().spawn(self._settle, settling, policy.settle)

    async def _settle(self, scope: anyio.CancelScope, seconds: float) -> None:
        """Drop the workers the restarted stream has not reported in time."""
        with scope:
            await anyio.sleep(seconds)
        if self._settling is not scope or scope.cancel_called:
            return
        self._settling = None
        reported = self._reported or set()
        self._reported = None
        stale = [uid for uid in self.known.workers if uid not in reported]
        deliver = self._deliver() if self._deliver is not None else None
        for uid in stale:
            # Recorded and logged together: the record counts the log's items.
            event = self.known.drop(uid)
            if deliver is not None and event is not None:
                deliver(event)

    def _translate(self, event: Any) -> Any:
        """Record ``event``; after a restart, turn the new stream's report
        into a diff (``None``: re-reported unchanged, nothing to log)."""
        if type(event) is Synced:
            self._listed()
            return None
        reported = self._reported
        if reported is None or not isinstance(event, DiscoveryEvent):
            self.known.record(event)
            return event
        uid = event.metadata.uid
        if event.type == "worker-dropped":
            reported.discard(uid)
        else:
            reported.add(uid)
        return self.known.apply(event)

    def _listed(self) -> None:
        """The stream yielded :class:`~wool_pooling.Synced`: its listing is
        complete. The first one marks the end of the first listing; after a
        restart it also ends the settle time, dropping at once the workers
        the new stream has not reported."""
        self.known.mark_listed()
        settling = self._settling
        if self._reported is None or settling is None:
            return
        settling.cancel()
        self._settling = None
        reported = self._reported
        self._reported = None
        deliver = self._deliver() if self._deliver is not None else None
        for uid in [uid for uid in self.known.workers if uid not in reported]:
            # Recorded and logged together, ahead of the next item.
            event = self.known.drop(uid)
            if deliver is not None and event is not None:
                deliver(event)

    async def aclose(self) -> None:
        """Stop the settle timer; close the raw iterator, if started and closable."""
        if self._settling is not None:
            self._settling.cancel()
            self._settling = None
        iterator, self._iterator = self._iterator, None
        await aclose_iterator(iterator)
