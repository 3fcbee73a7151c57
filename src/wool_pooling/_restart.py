"""When a shared source fails (or ends), iterate the raw subscriber again."""

from __future__ import annotations

import math
import random

import attrs

__all__ = ["RestartPolicy"]


def _non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@attrs.frozen
class RestartPolicy:
    """Opt-in restarts of a shared subscription's raw stream.

    Pass as ``@shared_subscription(restart=RestartPolicy(...))``. When the
    raw subscriber's stream raises, it is iterated again (``aiter(raw)``)
    after a delay, and consumers see no error: only the difference between
    the workers known before the failure and those the new stream reports
    (workers it re-reports unchanged are not repeated; those it has not
    reported within ``settle`` seconds are dropped). The delay before attempt
    *n* is ``backoff * multiplier ** (n - 1)``, capped at ``max_backoff``,
    times a random factor in ``[1 - jitter, 1 + jitter]``. Once ``attempts``
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
    :raises ValueError: naming the parameter, for a negative or non-finite
        delay, a multiplier below 1, a jitter outside ``[0, 1]``, or
        ``attempts`` below 1.
    """

    attempts: int | None = 5
    backoff: float = 0.1
    multiplier: float = 2.0
    max_backoff: float = 10.0
    jitter: float = 0.1
    settle: float = 1.0
    restart_on_end: bool = False

    def __attrs_post_init__(self) -> None:
        if self.attempts is not None and (
            isinstance(self.attempts, bool)
            or not isinstance(self.attempts, int)  # pyright: ignore[reportUnnecessaryIsInstance]
            or self.attempts < 1
        ):
            raise ValueError(
                f"attempts must be None or an int >= 1, got {self.attempts!r}"
            )
        for name in ("backoff", "max_backoff", "settle"):
            _non_negative(name, getattr(self, name))
        _non_negative("multiplier", self.multiplier)
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier!r}")
        _non_negative("jitter", self.jitter)
        if self.jitter > 1:
            raise ValueError(f"jitter must be within [0, 1], got {self.jitter!r}")

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
        if self.jitter:
            base *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return min(self.max_backoff, base)
