"""Eager pulls (asyncio): run a pull's first step inline, as the fan-out's pump task.

A pull that completes without suspending (an item the source already has)
costs no task switch if the consumer asking for it runs it inline. A pull that
suspends, though, must not stay in the consumer's task: its cancellation would
be thrown into the shared source. And it cannot move to another task after the
fact if the source captured its task on the way (``asyncio.timeout``, anyio
cancel scopes): a later timeout would cancel the consumer instead.

So the first step runs *as the pump task*: for its duration the loop's current
task is the (idle) pump and the step runs in the pump's context, exactly as
asyncio's own eager tasks do. If the step completes, the consumer has its item
and the pump never woke. If it suspends, everything the source saw was already
the pump's, and :func:`continue_pull` lets the pump carry on from the point
where it suspended, as if it had been running the pull from the start.

This relies on asyncio's ``_enter_task``/``_leave_task`` (what eager tasks
use); where they are missing, or under trio, every pull runs in the pump.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Awaitable
from collections.abc import Generator
from typing import Any
from typing import final

__all__ = ["EagerStep", "continue_pull"]

try:  # pragma: no cover - depends on the interpreter
    from asyncio.tasks import _current_tasks  # type: ignore[attr-defined]
    from asyncio.tasks import _enter_task  # type: ignore[attr-defined]
    from asyncio.tasks import _leave_task  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    _current_tasks: dict[Any, Any] = {}
    _enter_task = _leave_task = None


@final
class EagerStep:
    """Runs first steps of pulls on behalf of one asyncio pump task."""

    __slots__ = ("_context", "_loop", "_task")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any],
        context: contextvars.Context,
    ) -> None:
        self._loop = loop
        self._task = task
        self._context = context

    @classmethod
    def for_current_task(cls, context: contextvars.Context) -> EagerStep | None:
        """The stepper of the calling asyncio task, or ``None`` if unsupported."""
        if _enter_task is None:
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        task = asyncio.current_task(loop)
        if task is None:
            return None
        return cls(loop, task, context)

    def start(self, awaitable: Awaitable[Any]) -> tuple[Any, bool, Any]:
        """Run the first step of ``awaitable`` as the pump task.

        Must be called from another task of the same loop while the pump is
        suspended. Exceptions raised by the step propagate.

        :returns: ``(target, completed, value)``: if ``completed``, ``value``
            is the result; otherwise ``value`` is what the step yielded to the
            event loop and ``target`` is what :func:`continue_pull` resumes.
        """
        target: Any = awaitable
        if not hasattr(target, "send"):
            target = awaitable.__await__()
        loop = self._loop
        caller = _current_tasks.get(loop)
        if caller is None:
            raise RuntimeError("an eager pull must be started from an asyncio task")
        _leave_task(loop, caller)  # type: ignore[misc]
        _enter_task(loop, self._task)  # type: ignore[misc]
        try:
            yielded = self._context.run(target.send, None)
        except StopIteration as stop:
            return target, True, stop.value
        finally:
            _leave_task(loop, self._task)  # type: ignore[misc]
            _enter_task(loop, caller)  # type: ignore[misc]
        return target, False, yielded


@types.coroutine
def continue_pull(
    target: Any, yielded: Any, error: BaseException | None = None
) -> Generator[Any, Any, Any]:
    """Resume, in the calling task, a pull whose first step :class:`EagerStep` ran.

    Behaves as ``await`` would have from the suspension point on: what the
    pull yields goes to the event loop, what the loop sends or throws goes to
    the pull. ``error`` is thrown in first if the pump was cancelled before it
    could resume the pull.
    """
    while True:
        if error is not None:
            if isinstance(yielded, asyncio.Future) and isinstance(
                error, asyncio.CancelledError
            ):
                yielded.cancel()  # what Task.cancel() does to the awaited future
            exc, error = error, None
            try:
                yielded = target.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        try:
            sent = yield yielded
        except BaseException as exc:
            error = exc
            continue
        try:
            yielded = target.send(sent)
        except StopIteration as stop:
            return stop.value
