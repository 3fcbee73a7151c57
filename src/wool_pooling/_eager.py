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

One kind of suspension needs no pump at all: a yield bound to no task
(asyncio's bare ``yield`` of ``sleep(0)``, trio's shielded checkpoint) only
asks to be resumed after other tasks ran. The consumer makes that yield
itself and runs the next step, again as the pump ("driving" the pull), so a
source that passes a checkpoint per item costs one loop pass per item, not
three. The consumer's cancellation is noticed at its own yield (asyncio) or
right after it (trio's ``checkpoint_if_cancelled``) and then the pump carries
the pull on; if the pump is woken meanwhile (closing, a timeout inside the
pull), it takes the pull over and the consumer steps back.

Pulls run inside a persistent driver generator bound to the source's
iterator (:func:`_driver`): it calls ``__anext__`` itself, delegates with
``yield from`` and reports the result through a box, so a pull that
completes costs one ``send`` and no ``StopIteration`` caught in Python.

This relies on interpreter and trio internals (``asyncio.tasks._enter_task``,
trio's run context and task fields). Where they are missing, every pull runs
in the pump (:class:`PumpOnly`): slower, equally correct.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Generator
from typing import Any
from typing import cast
from typing import final

import anyio

__all__ = [
    "DRIVEN",
    "SUSPENDED",
    "PumpOnly",
    "continue_pull",
    "forward",
    "inline_puller",
]

try:  # pragma: no cover - depends on the interpreter
    from asyncio.tasks import _current_tasks  # type: ignore[attr-defined]
    from asyncio.tasks import _enter_task  # type: ignore[attr-defined]
    from asyncio.tasks import _leave_task  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    _current_tasks: dict[Any, Any] = {}
    _enter_task = _leave_task = None


#: Marks a trio pull whose pump adopted the source's wait: resume by sending.
_ADOPTED = object()

#: What a step returns when the pull suspended and the pump owns it now.
SUSPENDED: Any = object()

#: What a step returns when the pull suspended at a yield bound to no task
#: (asyncio's ``sleep(0)``, trio's shielded checkpoint): the consumer that
#: ran it yields the same to its own task, then runs the next step.
DRIVEN: Any = object()


class PumpOnly:
    """The pump's idle state when pulls cannot start inline: an event to wake it.

    ``idle()`` parks the pump until :meth:`wake`; it returns an awaitable that
    finishes a pull a consumer started inline and handed over (or that the
    pump takes over from the consumer driving it), or ``None``.
    """

    __slots__ = ("_driven", "_handoff", "_wake", "driving")

    #: Whether a consumer may start a pull inline right now.
    ready = False
    #: What that consumer yields to its own task between two steps.
    driven_message: Any = None
    #: What that consumer awaits after its yield to notice its cancellation,
    #: if the yield itself cannot deliver it (trio's is shielded).
    cancel_check: Callable[[], Awaitable[None]] | None = None

    def __init__(self) -> None:
        self._wake: anyio.Event | None = None
        self._handoff: tuple[Any, Any] | None = None
        self._driven: Any = None
        #: Whether a consumer is driving a pull (see :data:`DRIVEN`).
        self.driving = False

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
            pull = self._take_over(error)  # the error is meant for the pull
            if pull is None:
                raise
            return pull
        finally:
            self._set_ready(False)
            self._wake = None
        return self._take_over(None)

    def start(self, iterator: AsyncIterator[Any]) -> Any:
        """Start a pull of ``iterator`` inline, as the pump; only while :attr:`ready`.

        :returns: the pulled item, :data:`SUSPENDED` (the pump owns the pull
            now) or :data:`DRIVEN` (the caller drives it: yield
            :attr:`driven_message`, then :meth:`resume` with the reply).
        """
        raise RuntimeError("pulls cannot start inline here")

    def resume(self, sent: Any) -> Any:
        """Run the next step of the pull the caller drives, as the pump.

        Returns like :meth:`start`. If the pump was woken meanwhile (it is
        being cancelled), nothing runs: the pump takes the pull over, and
        this returns :data:`SUSPENDED`.
        """
        raise RuntimeError("no pull is driven here")

    def hand_over(self) -> None:
        """Give the pull the caller drives to the pump (the caller is leaving)."""
        target, self._driven = self._driven, None
        self.driving = False
        self._handoff = (target, self.driven_message)
        self._rouse()

    def _rouse(self) -> None:
        """Wake the pump for a handoff (``ready`` stays false: a pull is in flight)."""
        if self._wake is not None:
            self._wake.set()

    def _take_over(self, error: BaseException | None) -> Awaitable[Any] | None:
        handoff, self._handoff = self._handoff, None
        if handoff is not None:
            return continue_pull(*handoff, error)
        target, self._driven = self._driven, None
        if target is None:
            return None
        # Woken while a consumer drives a pull: the pump carries it on, from
        # the yield the consumer made (already done: resume with its reply).
        self.driving = False
        if error is not None:
            return continue_pull(target, None, error)
        return continue_pull(target, None, send=None)

    def _set_ready(self, ready: bool) -> None:
        pass


class _InlinePuller(PumpOnly):
    """What the asyncio and trio pullers share: the driver that runs pulls."""

    __slots__ = ("_box", "_driver", "_iterator", "_rest", "_send", "ready")

    def __init__(self) -> None:
        super().__init__()
        self._iterator: AsyncIterator[Any] | None = None

    def _bind(self, iterator: AsyncIterator[Any]) -> None:
        """Run the pulls of ``iterator`` from now on, in a driver of its own."""
        self._iterator = iterator
        self._box: list[Any] = [None, None]
        # (types.coroutine hides that the driver is a generator.)
        self._driver = cast(
            "types.GeneratorType[Any, Any, None]", _driver(iterator, self._box)
        )
        self._send = self._driver.send
        self._rest = _Remainder(self._driver, self._box)

    def _result(self) -> Any:
        """The finished pull's item, or its error raised."""
        self.driving = False
        self._driven = None
        self.ready = True  # the pump is still idle
        return _take(self._box)


@final
class _AsyncioInlinePuller(_InlinePuller):
    __slots__ = ("_direct", "_loop", "_run", "_task")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any],
        context: contextvars.Context,
        *,
        direct: bool,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._task = task
        self._run = context.run
        # Swap the current task by writing asyncio's table directly (see
        # _direct_swap_works), or through _leave_task/_enter_task.
        self._direct = direct
        self.ready = False

    def _set_ready(self, ready: bool) -> None:
        self.ready = ready

    def start(self, iterator: AsyncIterator[Any]) -> Any:
        if iterator is not self._iterator:
            self._bind(iterator)
        # _as_pump and _outcome, inline: this is the path of every ready item.
        loop = self._loop
        tasks = _current_tasks
        caller = tasks.get(loop)
        if caller is None:
            raise RuntimeError("an inline pull must run in an asyncio task")
        if self._direct:
            tasks[loop] = self._task
            try:
                yielded = self._run(self._send, None)
            finally:
                tasks[loop] = caller
        else:
            yielded = self._as_pump(self._send, None)
        if yielded is _DONE:
            box = self._box
            item = box[0]
            box[0] = None
            return item
        return self._outcome(yielded)

    def resume(self, sent: Any) -> Any:
        if self._task.cancelling():
            return SUSPENDED  # the pump wakes cancelled and takes the pull over
        return self._outcome(self._as_pump(self._send, sent))

    def _as_pump(self, send: Callable[[Any], Any], value: Any) -> Any:
        """``send(value)`` in the pump's context, with the pump as current task."""
        loop = self._loop
        pump = self._task
        tasks = _current_tasks
        caller = tasks.get(loop)
        if caller is None:
            raise RuntimeError("an inline pull must run in an asyncio task")
        if self._direct:
            tasks[loop] = pump
        else:
            _leave_task(loop, caller)  # type: ignore[misc]
            _enter_task(loop, pump)  # type: ignore[misc]
        try:
            return self._run(send, value)
        finally:
            if self._direct:
                tasks[loop] = caller
            else:
                _leave_task(loop, pump)  # type: ignore[misc]
                _enter_task(loop, caller)  # type: ignore[misc]

    def _outcome(self, yielded: Any) -> Any:
        """What a step of the driver means: see :meth:`PumpOnly.start`."""
        if yielded is _DONE or yielded is _FAILED:
            return self._result()
        self.ready = False
        if yielded is None:  # a bare yield (sleep(0)): bound to no task
            self._driven = self._rest
            self.driving = True
            return DRIVEN
        self.driving = False
        self._driven = None
        self._handoff = (self._rest, yielded)
        self.wake()
        return SUSPENDED


#: What the driver yields once a pull completed, or failed (see the box).
_DONE: Any = object()
_FAILED: Any = object()


@types.coroutine
def _driver(iterator: AsyncIterator[Any], box: list[Any]) -> Generator[Any, Any, None]:
    """Run one pull of ``iterator`` after another, reporting without exceptions.

    Send it ``None``: it starts the next pull and runs it (``yield from``, so
    a step that completes costs no ``StopIteration`` in Python), puts the
    item in ``box[0]`` (or the exception in ``box[1]``) and yields
    :data:`_DONE` (or :data:`_FAILED`); anything else it yields is the pull
    suspending. Between pulls it waits at that yield, holding nothing.
    """
    pull = iterator.__anext__
    while True:
        target: Any = pull()
        if not hasattr(target, "send"):  # an awaitable that is not a coroutine
            target = target.__await__()
        try:
            box[0] = yield from target
        except GeneratorExit:
            raise
        except BaseException as error:
            box[1] = error
            outcome = _FAILED
        else:
            outcome = _DONE
        del target  # the finished pull: pin nothing while waiting
        yield outcome


@final
class _Remainder:
    """The rest of a suspended pull that runs in a :func:`_driver`, as a plain
    awaitable step target: it returns the item or raises the source's error."""

    __slots__ = ("_box", "_driver")

    def __init__(
        self, driver: types.GeneratorType[Any, Any, None], box: list[Any]
    ) -> None:
        self._driver = driver
        self._box = box

    def send(self, value: Any) -> Any:
        return self._unwrap(self._driver.send(value))

    def throw(self, error: BaseException) -> Any:
        return self._unwrap(self._driver.throw(error))

    def _unwrap(self, yielded: Any) -> Any:
        if yielded is not _DONE and yielded is not _FAILED:
            return yielded
        raise StopIteration(_take(self._box))


def _take(box: list[Any]) -> Any:
    """Empty a driver's box: return the pull's item, or raise its error."""
    item, error = box
    box[0] = box[1] = None
    if error is not None:
        raise error
    return item


def _direct_swap_works(loop: asyncio.AbstractEventLoop, task: Any) -> bool:
    """Whether ``_current_tasks[loop]`` is what ``asyncio.current_task()`` reads.

    True on CPython 3.11-3.13 with or without the C accelerator; checked
    rather than assumed, since the storage is private.
    """
    if _current_tasks.get(loop) is not task:
        return False
    marker = object()
    _current_tasks[loop] = marker
    try:
        return asyncio.current_task() is marker  # type: ignore[comparison-overlap]
    finally:
        _current_tasks[loop] = task


@final
class _TrioInlinePuller(_InlinePuller):
    __slots__ = (
        "_context",
        "_run_context",
        "_shielded",
        "_task",
        "_trap",
        "_trio",
        "cancel_check",
        "driven_message",
    )

    def __init__(self, trio: Any, run: Any, traps: Any, task: Any) -> None:
        super().__init__()
        self._trio = trio
        # trio's thread-local run state, one object for the process.
        self._run_context = run.GLOBAL_RUN_CONTEXT
        self._trap = traps.WaitTaskRescheduled
        self._shielded = traps.CancelShieldedCheckpoint
        self._task = task
        self._context: contextvars.Context = task.context
        self.ready = False
        self.driven_message = self._shielded
        self.cancel_check = trio.lowlevel.checkpoint_if_cancelled

    def _set_ready(self, ready: bool) -> None:
        self.ready = ready

    def wake(self) -> None:
        if self.ready:
            self.ready = False
            self._trio.lowlevel.reschedule(self._task)

    def _rouse(self) -> None:
        if self._task._abort_func is not None:  # else it is awake already
            self._trio.lowlevel.reschedule(self._task)

    async def idle(self) -> Awaitable[Any] | None:
        # A raw wait: the pump may be resumed with an outcome meant for a
        # pull it adopted, which must reach the pull unopened.
        self.ready = True
        try:
            outcome = await _wait_task_rescheduled(self._trap)
        finally:
            self.ready = False
        handoff, self._handoff = self._handoff, None
        if handoff is None:
            target, self._driven = self._driven, None
            if target is None:
                return outcome.unwrap()  # woken (None), or cancelled (raises)
            # Cancelled while a consumer drives a pull: carry it on from its
            # shielded checkpoint; the pull's own next checkpoint (run as the
            # pump) raises the cancellation, which trio delivers again.
            self.driving = False
            return continue_pull(target, self._shielded)
        target, yielded = handoff
        if yielded is _ADOPTED:
            return continue_pull(target, None, send=outcome)
        error: BaseException | None = getattr(outcome, "error", None)
        if yielded is self._shielded:
            error = None  # never delivered there; trio delivers it again later
        return continue_pull(target, yielded, error)

    def start(self, iterator: AsyncIterator[Any]) -> Any:
        if iterator is not self._iterator:
            self._bind(iterator)
        # _as_pump and _outcome, inline: this is the path of every ready item.
        run_context = self._run_context
        task = self._task
        caller = run_context.task
        idle_abort = task._abort_func
        task._abort_func = None
        run_context.task = task
        try:
            message = self._context.run(self._send, None)
        finally:
            run_context.task = caller
            task._abort_func = idle_abort
        if message is _DONE:
            if task._cancel_status.effectively_cancelled:
                task._attempt_delivery_of_any_pending_cancel()
            box = self._box
            item = box[0]
            box[0] = None
            return item
        return self._outcome(message)

    def resume(self, sent: Any) -> Any:
        if self._task._abort_func is None:
            # The pump was rescheduled while idle: it is being cancelled, and
            # takes the pull over when it runs.
            return SUSPENDED
        return self._outcome(self._as_pump(self._send, sent))

    def _as_pump(self, send: Callable[[Any], Any], value: Any) -> Any:
        """``send(value)`` in the pump's context, with the pump as current task.

        The pump's abort function is set aside meanwhile, so that no
        cancellation is delivered to it while it "runs" here.
        """
        run_context = self._run_context
        task = self._task
        caller = run_context.task
        idle_abort = task._abort_func
        task._abort_func = None
        run_context.task = task
        try:
            return self._context.run(send, value)
        finally:
            run_context.task = caller
            task._abort_func = idle_abort

    def _outcome(self, message: Any) -> Any:
        """What a step of the driver means: see :meth:`PumpOnly.start`."""
        task = self._task
        if message is _DONE or message is _FAILED:
            if task._cancel_status.effectively_cancelled:
                task._attempt_delivery_of_any_pending_cancel()
            return self._result()
        self.ready = False
        if message is self._shielded:
            # "Reschedule me": bound to no task, the consumer yields it.
            self._driven = self._rest
            self.driving = True
            task._attempt_delivery_of_any_pending_cancel()
            return DRIVEN
        self.driving = False
        self._driven = None
        if type(message) is self._trap:
            # The source parked "the current task", i.e. the pump: the pump
            # now waits for the source's wake-up, with the source's abort.
            self._handoff = (self._rest, _ADOPTED)
            task._abort_func = message.abort_func
            task._attempt_delivery_of_any_pending_cancel()
        else:
            # Any other trap: the pump yields it itself.
            self._handoff = (self._rest, message)
            self.ready = True
            self.wake()
        return SUSPENDED


def inline_puller(context: contextvars.Context) -> PumpOnly:
    """The idle state for the calling pump task, with inline pulls if possible."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        task = asyncio.current_task()
        if _enter_task is None or task is None:
            return PumpOnly()
        return _AsyncioInlinePuller(
            loop, task, context, direct=_direct_swap_works(loop, task)
        )
    trio = sys.modules.get("trio")
    try:
        from trio._core import _run  # type: ignore[attr-defined]

        if trio is None or not hasattr(_run, "GLOBAL_RUN_CONTEXT"):
            return PumpOnly()
        task = trio.lowlevel.current_task()
        for name in (
            "_abort_func",
            "_attempt_delivery_of_any_pending_cancel",
            "_cancel_status",
        ):
            if not hasattr(task, name):
                return PumpOnly()
        from trio._core import _traps  # type: ignore[attr-defined]

        for name in ("WaitTaskRescheduled", "CancelShieldedCheckpoint"):
            if not hasattr(_traps, name):
                return PumpOnly()
    except Exception:  # pragma: no cover - a trio without these internals
        return PumpOnly()
    return _TrioInlinePuller(trio, _run, _traps, task)


@types.coroutine
def _wait_task_rescheduled(trap: Any) -> Generator[Any, Any, Any]:
    """trio's ``wait_task_rescheduled`` without unwrapping the outcome."""
    return (yield trap(_abort_succeeded))


def _abort_succeeded(raise_cancel: Any) -> Any:
    import trio

    return trio.lowlevel.Abort.SUCCEEDED


_NOTHING = object()


@types.coroutine
def forward(message: Any) -> Generator[Any, Any, Any]:
    """Yield ``message`` to the event loop from the calling task; return the reply."""
    return (yield message)


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
