"""Inline pulls: run a pull's first step in the consumer, *as* the fan-out's pump task.

A pull that completes without suspending (the source already has the item)
costs no task switch if the consumer asking for it runs it inline. A pull that
suspends, though, must not stay in the consumer's task: the consumer's
cancellation would be thrown into the shared source. Nor can a suspended pull
simply move to another task: the source may have captured its task on the way
(``asyncio.timeout``, anyio and trio cancel scopes, trio's parking lots), and
a timeout would then cancel the consumer, or a wake-up reach the wrong task.

So the first step runs *as the idle pump task*: for its duration the loop's
current task is the pump and the step runs in the pump's context, as asyncio's
own eager tasks do. If the step completes, the consumer has its item and the
pump never woke. If it suspends, everything the source registered names the
pump, and the pump carries on from that exact point, as if it had run the
pull from the start:

- asyncio: the pump is woken and resumes the pull with what it yielded;
- trio: the pump, parked on a raw ``wait_task_rescheduled``, adopts the
  source's abort function, so the source's own wake-up (or a cancellation)
  resumes the pump, which passes the outcome on to the pull.

This relies on interpreter and trio internals (``asyncio.tasks._enter_task``,
trio's run context and task fields). Where they are missing, every pull runs
in the pump (:class:`PumpOnly`): slower, equally correct.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
from collections.abc import Awaitable
from collections.abc import Generator
from typing import Any
from typing import final

import anyio

__all__ = ["PumpOnly", "continue_pull", "inline_puller"]

try:  # pragma: no cover - depends on the interpreter
    from asyncio.tasks import _current_tasks  # type: ignore[attr-defined]
    from asyncio.tasks import _enter_task  # type: ignore[attr-defined]
    from asyncio.tasks import _leave_task  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    _current_tasks: dict[Any, Any] = {}
    _enter_task = _leave_task = None


#: Marks a trio pull whose pump adopted the source's wait: resume by sending.
_ADOPTED = object()


class PumpOnly:
    """The pump's idle state when pulls cannot start inline: an event to wake it.

    ``idle()`` parks the pump until :meth:`wake`; it returns an awaitable that
    finishes a pull a consumer started inline and handed over, or ``None``.
    """

    __slots__ = ("_handoff", "_wake")

    #: Whether a consumer may start a pull inline right now.
    ready = False

    def __init__(self) -> None:
        self._wake: anyio.Event | None = None
        self._handoff: tuple[Any, Any] | None = None

    def wake(self) -> None:
        """Rouse the idle pump (a consumer waits, or nobody is left)."""
        if self._wake is not None:
            self._wake.set()

    async def idle(self) -> Awaitable[Any] | None:
        """Park the pump until woken."""
        wake = self._wake = anyio.Event()
        self._set_ready(True)
        try:
            await wake.wait()
        except anyio.get_cancelled_exc_class() as error:
            handoff = self._take_handoff()
            if handoff is None:
                raise
            return continue_pull(*handoff, error)  # meant for the pull
        finally:
            self._set_ready(False)
            self._wake = None
        handoff = self._take_handoff()
        return None if handoff is None else continue_pull(*handoff)

    def start(self, awaitable: Awaitable[Any]) -> tuple[bool, Any]:
        """Start a pull inline; only valid while :attr:`ready`."""
        raise RuntimeError("pulls cannot start inline here")

    def _set_ready(self, ready: bool) -> None:
        pass

    def _take_handoff(self) -> tuple[Any, Any] | None:
        handoff, self._handoff = self._handoff, None
        return handoff


@final
class _AsyncioInlinePuller(PumpOnly):
    __slots__ = ("_context", "_loop", "_task", "ready")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any],
        context: contextvars.Context,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._task = task
        self._context = context
        self.ready = False

    def _set_ready(self, ready: bool) -> None:
        self.ready = ready

    def start(self, awaitable: Awaitable[Any]) -> tuple[bool, Any]:
        target = _step_target(awaitable)
        loop = self._loop
        caller = _current_tasks.get(loop)
        if caller is None:
            raise RuntimeError("an inline pull must start in an asyncio task")
        _leave_task(loop, caller)  # type: ignore[misc]
        _enter_task(loop, self._task)  # type: ignore[misc]
        try:
            yielded = self._context.run(target.send, None)
        except StopIteration as stop:
            return True, stop.value
        finally:
            _leave_task(loop, self._task)  # type: ignore[misc]
            _enter_task(loop, caller)  # type: ignore[misc]
        self.ready = False
        self._handoff = (target, yielded)
        self.wake()
        return False, None


@final
class _TrioInlinePuller(PumpOnly):
    __slots__ = ("_context", "_run", "_task", "_trap", "_trio", "ready")

    def __init__(self, trio: Any, run: Any, trap: type, task: Any) -> None:
        super().__init__()
        self._trio = trio
        self._run = run
        self._trap = trap
        self._task = task
        self._context: contextvars.Context = task.context
        self.ready = False

    def wake(self) -> None:
        if self.ready:
            self.ready = False
            self._trio.lowlevel.reschedule(self._task)

    async def idle(self) -> Awaitable[Any] | None:
        # A raw wait: the pump may be resumed with an outcome meant for a
        # pull it adopted, which must reach the pull unopened.
        self.ready = True
        try:
            outcome = await _wait_task_rescheduled(self._trap)
        finally:
            self.ready = False
        handoff = self._take_handoff()
        if handoff is None:
            return outcome.unwrap()  # woken (None), or cancelled (raises)
        target, yielded = handoff
        if yielded is _ADOPTED:
            return continue_pull(target, None, send=outcome)
        error: BaseException | None = getattr(outcome, "error", None)
        return continue_pull(target, yielded, error)

    def start(self, awaitable: Awaitable[Any]) -> tuple[bool, Any]:
        target = _step_target(awaitable)
        run_context = self._run.GLOBAL_RUN_CONTEXT
        task = self._task
        caller = run_context.task
        idle_abort = task._abort_func
        task._abort_func = None  # no cancellation delivery while it runs here
        run_context.task = task
        try:
            message = self._context.run(target.send, None)
        except BaseException as exc:
            run_context.task = caller
            task._abort_func = idle_abort
            task._attempt_delivery_of_any_pending_cancel()
            if isinstance(exc, StopIteration):
                return True, exc.value
            raise
        run_context.task = caller
        if type(message) is self._trap:
            # The source parked "the current task", i.e. the pump: the pump
            # now waits for the source's wake-up, with the source's abort.
            self.ready = False
            self._handoff = (target, _ADOPTED)
            task._abort_func = message.abort_func
            task._attempt_delivery_of_any_pending_cancel()
        else:
            # Any other trap is not bound to a task: the pump yields it itself.
            task._abort_func = idle_abort
            self._handoff = (target, message)
            self.wake()
        return False, None


def inline_puller(context: contextvars.Context) -> PumpOnly:
    """The idle state for the calling pump task, with inline pulls if possible."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        task = _current_tasks.get(loop)
        if _enter_task is None or task is None:
            return PumpOnly()
        return _AsyncioInlinePuller(loop, task, context)
    trio = sys.modules.get("trio")
    try:
        from trio._core import _run  # type: ignore[attr-defined]

        if trio is None or not hasattr(_run, "GLOBAL_RUN_CONTEXT"):
            return PumpOnly()
        task = trio.lowlevel.current_task()
        for name in ("_abort_func", "_attempt_delivery_of_any_pending_cancel"):
            if not hasattr(task, name):
                return PumpOnly()
        from trio._core._traps import WaitTaskRescheduled  # type: ignore[attr-defined]
    except Exception:  # pragma: no cover - a trio without these internals
        return PumpOnly()
    return _TrioInlinePuller(trio, _run, WaitTaskRescheduled, task)


def _step_target(awaitable: Awaitable[Any]) -> Any:
    return awaitable if hasattr(awaitable, "send") else awaitable.__await__()


@types.coroutine
def _wait_task_rescheduled(trap: Any) -> Generator[Any, Any, Any]:
    """trio's ``wait_task_rescheduled`` without unwrapping the outcome."""
    return (yield trap(_abort_succeeded))


def _abort_succeeded(raise_cancel: Any) -> Any:
    import trio

    return trio.lowlevel.Abort.SUCCEEDED


_NOTHING = object()


@types.coroutine
def continue_pull(
    target: Any,
    yielded: Any,
    error: BaseException | None = None,
    *,
    send: Any = _NOTHING,
) -> Generator[Any, Any, Any]:
    """Finish, in the calling task, a pull whose first step ran inline.

    Behaves as ``await`` would have from the suspension point on: what the
    pull yields goes to the event loop, what the loop sends or throws goes to
    the pull. ``send`` is passed in first if the pump already received it on
    the pull's behalf; ``error`` is thrown in first if the pump was cancelled
    before it could resume the pull.
    """
    if send is not _NOTHING:
        try:
            yielded = target.send(send)
        except StopIteration as stop:
            return stop.value
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
