"""The one restart engine: iterate a raw subscriber again when it fails."""

from __future__ import annotations

import inspect
import logging
import math
import random
import reprlib
import sys
import weakref
from collections import deque
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any
from typing import Generic
from typing import TypeVar
from typing import cast
from typing import final

import anyio
import attrs

from .._core.backend import current_loop
from .._core.iterators import aclose_iterator
from .._core.iterators import throw_into
from .._core.signatures import suggest_keywords
from .._core.synced import Synced
from .._core.synced import listing
from .view import View

__all__ = ["BrokenSubscriber", "RestartPolicy", "RestartingSource", "open_iterator"]

T = TypeVar("T")

restart_logger = logging.getLogger("wool_pooling.restart")


def _number(value: object, low: float, high: float) -> bool:
    """A number (an int or float, not a bool) with ``low <= value <= high``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return low <= value <= high


def _rule(rule: str, valid: Callable[[Any], bool]) -> Any:
    """An attrs validator raising ``ValueError`` (naming the field and
    ``rule``) for a value that is not ``valid``."""

    def check(instance: object, field: attrs.Attribute[Any], value: object) -> None:
        if not valid(value):
            raise ValueError(f"{field.name} must be {rule}, got {value!r}")

    return check


_BIG = sys.float_info.max
_ATTEMPTS = _rule(
    "None or an int >= 1",
    lambda value: (
        value is None or (_number(value, 1, _BIG) and not isinstance(value, float))
    ),
)
_FINITE = _rule("a finite number >= 0", lambda value: _number(value, 0, _BIG))
_GROWTH = _rule("a finite number >= 1", lambda value: _number(value, 1, _BIG))
_FRACTION = _rule("a number in [0, 1]", lambda value: _number(value, 0, 1))
_FLAG = _rule("a bool (True or False)", lambda value: isinstance(value, bool))


@suggest_keywords
@attrs.frozen
class RestartPolicy:
    """Opt-in restarts of a raw stream that fails (or ends), the same wherever
    one is given: ``@shared_subscription(restart=...)``, a Redis discovery.
    See :ref:`restart`.

    :param attempts: Consecutive restarts allowed (an int >= 1); ``None``
        for no limit. The count starts again at the first item of a stream.
    :param backoff: Delay before the first restart, in seconds.
    :param multiplier: Growth of the delay from one attempt to the next.
    :param max_backoff: Cap on the delay, in seconds.
    :param jitter: Relative randomisation of each delay, in ``[0, 1]``:
        drawn from ``[1 - jitter, 1 + jitter]`` times its base, under the cap.
    :param settle: Seconds the new stream has to relist what it knows
        (ended early by its :class:`~wool_pooling.Synced`).
    :param restart_on_end: Also restart when the stream ends normally.
    :raises ValueError: naming the parameter, unless ``attempts`` is ``None``
        or an int >= 1, ``multiplier`` a finite number >= 1, ``jitter`` in
        ``[0, 1]``, the other numbers finite and >= 0, ``restart_on_end`` a bool.
    """

    #: Consecutive restarts allowed; ``None`` for no limit.
    attempts: int | None = attrs.field(default=5, validator=_ATTEMPTS)
    #: Delay before the first restart, in seconds.
    backoff: float = attrs.field(default=0.1, validator=_FINITE)
    #: Growth of the delay from one attempt to the next.
    multiplier: float = attrs.field(default=2.0, validator=_GROWTH)
    #: Cap on the delay, in seconds.
    max_backoff: float = attrs.field(default=10.0, validator=_FINITE)
    #: Relative randomisation of each delay.
    jitter: float = attrs.field(default=0.1, validator=_FRACTION)
    #: Seconds the new stream has to relist what it knows.
    settle: float = attrs.field(default=1.0, validator=_FINITE)
    #: Also restart when the stream ends normally.
    restart_on_end: bool = attrs.field(default=False, validator=_FLAG)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart number ``attempt`` (from 1)."""
        if self.backoff == 0:
            return 0.0
        try:
            grown = self.backoff * self.multiplier ** (attempt - 1)
        except OverflowError:  # attempts=None: the delay stays at the cap
            grown = math.inf
        base = min(self.max_backoff, grown)
        # Spread under the cap, not cut by it (see :ref:`restart`).
        high = min(self.max_backoff, base * (1 + self.jitter))
        return random.uniform(base * (1 - self.jitter), high)


class BrokenSubscriber(TypeError):
    """A subscriber's ``__aiter__`` returned no async iterator; never restarted."""


def open_iterator(raw: object) -> AsyncIterator[Any]:
    """``aiter(raw)``; a coroutine or generator ``__aiter__`` returned is closed.

    :raises BrokenSubscriber: naming the class and what ``__aiter__`` returned.
    """
    cls = type(raw)
    method = getattr(cls, "__aiter__", None)
    if not callable(method):
        raise BrokenSubscriber(
            f"{cls.__qualname__}.__aiter__ is {method!r}, not a method returning "
            "an async iterator"
        )
    iterator: object = method(raw)
    if callable(getattr(type(iterator), "__anext__", None)):
        return cast("AsyncIterator[Any]", iterator)
    if inspect.iscoroutine(iterator) or inspect.isgenerator(iterator):
        iterator.close()  # no "never awaited" warning
    raise BrokenSubscriber(
        f"{cls.__qualname__}.__aiter__() returned {type(iterator).__qualname__} "
        f"{reprlib.repr(iterator)}, not an async iterator: make it an async "
        "generator (async def with yield), or return an async iterator"
    )


@final
@attrs.define(eq=False, repr=False)
class RestartingSource(Generic[T]):
    """Iterate ``raw`` under ``policy``, telling ``view`` every item logged,
    :class:`~wool_pooling.Synced` markers taken out. See :ref:`restart`.

    :param raw: The async iterable to iterate (``aiter(raw)`` at each start).
    :param policy: When and how often to restart; ``None`` never restarts.
    :param view: Told of every item logged; a :class:`View` by default.
    :raises BrokenSubscriber: from ``__anext__``, never restarted.
    :raises Exception: from ``__anext__``, the stream's error once the policy
        allows no more restarts (at once, without a policy).
    """

    _raw: AsyncIterable[T]
    _policy: RestartPolicy | None = None
    view: View[T] = attrs.field(factory=View[T])
    _iterator: AsyncIterator[Any] | None = attrs.field(default=None, init=False)
    #: Consecutive restarts without an item in between.
    _failures: int = attrs.field(default=0, init=False)
    errors: int = attrs.field(default=0, init=False)
    restarts: int = attrs.field(default=0, init=False)
    count: int = attrs.field(default=0, init=False)
    #: :attr:`count` at the first :class:`~wool_pooling.Synced`, if any yet.
    listed_at: int | None = attrs.field(default=None, init=False)
    #: Set with :attr:`listed_at`.
    listed: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    _settling: anyio.CancelScope | None = attrs.field(default=None, init=False)
    #: Items :meth:`View.settled` gave, to return (no :meth:`deliver_to`).
    _pending: deque[T] = attrs.field(factory=deque[T], init=False)
    _thrown: BaseException | None = attrs.field(default=None, init=False)
    #: Held weakly: the fan-out holds this source.
    _deliver: weakref.WeakMethod[Callable[[T], None]] | None = attrs.field(
        default=None, init=False
    )

    def deliver_to(self, inject: Callable[[T], None]) -> None:
        """Log the items the settle timer makes through ``inject``, a bound
        method held weakly, rather than at the next ``__anext__``."""
        self._deliver = weakref.WeakMethod(inject)

    def __aiter__(self) -> RestartingSource[T]:
        return self

    async def __anext__(self) -> T:
        while True:
            if self._pending:
                self.count += 1
                return self._pending.popleft()
            iterator = self._iterator
            # For mark_synced() in the pull: set once in a task of its own,
            # for each pull in one that pulls another source (held weakly).
            marked = listing.get()
            outer = None if marked is None else marked()
            marking = None if outer is self else listing.set(weakref.ref(self))
            try:
                if self._thrown is not None:
                    thrown, self._thrown = self._thrown, None
                    item = await throw_into(iterator, thrown)  # (raised if not started)
                else:
                    if iterator is None:
                        iterator = self._iterator = open_iterator(self._raw)
                    item = await iterator.__anext__()
            except Exception as error:
                await self._restart_after(error)
                continue
            finally:
                if marking is not None and outer is not None:
                    listing.reset(marking)
            self._failures = 0
            if type(item) is Synced:
                self._listed()
                continue
            if self._settling is None:
                self.view.record(item)
            else:
                item = self.view.relist(item)
                if item is None:
                    continue
            self.count += 1
            return item

    async def athrow(self, error: BaseException) -> T:
        """Raise ``error`` in the stream, then go on as ``__anext__`` does."""
        self._thrown = error
        return await self.__anext__()

    async def _restart_after(self, error: Exception) -> None:
        """Close the failed iteration and wait out the delay, or raise ``error``."""
        ended = isinstance(error, StopAsyncIteration)
        self.errors += not ended
        policy = self._policy
        if (
            policy is None
            or isinstance(error, BrokenSubscriber)
            or (ended and not policy.restart_on_end)
        ):
            raise error
        self._failures += 1
        attempt = self._failures
        if policy.attempts is not None and attempt > policy.attempts:
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
        if self._settling is not None:
            self._settling.cancel()
        self.view.relisting()
        settling = self._settling = anyio.CancelScope()
        current_loop().spawn(self._settle, settling, policy.settle)

    async def _settle(self, scope: anyio.CancelScope, seconds: float) -> None:
        """End the relisting after ``seconds``, unless it ended before."""
        with scope:
            await anyio.sleep(seconds)
        if self._settling is scope and not scope.cancel_called:
            self._settled()

    def _settled(self) -> None:
        """End the relisting: log what the view gives."""
        self._settling = None
        items = self.view.settled()
        deliver = self._deliver() if self._deliver is not None else None
        if deliver is None:
            self._pending.extend(items)
            return
        for item in items:
            self.count += 1
            deliver(item)

    def _listed(self) -> None:
        """Take a :class:`~wool_pooling.Synced`: the first listing's end, or
        a relisting's."""
        if self.listed_at is None:
            self.listed_at = self.count + len(self._pending)
            self.listed.set()
        if self._settling is not None:
            self._settling.cancel()
            self._settled()

    async def aclose(self) -> None:
        """Stop the settle timer; close the stream's iterator, if started."""
        if self._settling is not None:
            self._settling.cancel()
            self._settling = None
        iterator, self._iterator = self._iterator, None
        await aclose_iterator(iterator)
