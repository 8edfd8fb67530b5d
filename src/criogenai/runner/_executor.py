"""One call, start to finish, without Celery: re-validate, run, time-limit, map errors, shape text.

Sync tools run on a thread (or, in a prefork child, on the child's own thread, where Celery's soft
and hard limits reach them); async tools run on one event loop per process. Whatever happens, the
outcome is data: nothing here raises, except the interrupt types the caller passes in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import ctypes
import functools
import json
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import greenlet

from .. import _loop
from .._errors import ToolError
from .._message import hard_limit_secs
from .._wire import DEFAULT_MAX_STORED_CHARS, OnToolException
from ..tools import InvalidArguments, Tool, ToolContext, cut, to_json_text
from ..tools._content import ToolOutput, plain
from ._outcomes import Outcome, invalid_arguments, stopped_by_cancel, timed_out, unexpected

log = logging.getLogger(__name__)


class _TimedOut(BaseException):
    """Raised into a tool's thread when its time is up (BaseException: a bare except misses it)."""


class _Cancelled(BaseException):
    """Raised into a tool's thread when its turn is cancelled."""


class CallStop:
    """Stops one running call from another thread (the lease keeper's) when its turn is cancelled.

    The executor arms it with the way to interrupt what it runs: cancel an async tool's task, wake
    the thread waiting for a sync tool (which is then abandoned, as at a timeout), or, in a prefork
    child where the tool runs on the main thread, raise there with the soft limit's own signal
    (which interrupts ``time.sleep`` and other blocking waits, unlike an async exception).
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._interrupt: Callable[[], object] | None = None

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    def cancel(self) -> None:
        """Ask the call to stop: cooperative tools see ``ctx.cancelled``, others are interrupted."""
        with self._lock:
            if self.event.is_set():
                return
            self.event.set()
            if self._interrupt is not None:
                self._interrupt()

    def arm(self, interrupt: Callable[[], object]) -> None:
        with self._lock:
            self._interrupt = interrupt
            if self.event.is_set():
                interrupt()

    def disarm(self) -> None:
        with self._lock:
            self._interrupt = None


def _interrupt_this_thread() -> Callable[[], None]:
    """How to interrupt the calling thread from another one (for a tool run inline)."""
    ident = threading.get_ident()
    usr1 = getattr(signal, "SIGUSR1", None)
    if (
        ident == threading.main_thread().ident
        and usr1 is not None
        and callable(signal.getsignal(usr1))  # billiard's soft-limit handler in a prefork child
    ):
        return lambda: signal.pthread_kill(ident, usr1)
    return lambda: _raise_in_thread(ident, _Cancelled)


_EXPIRED = object()


@dataclass(frozen=True, slots=True)
class _Raised:
    """What an async tool raised that must not leave its task on the loop (``SystemExit``)."""

    exc: BaseException

CANCEL_GRACE_SECS = 1.0
"""How long a thread that stopped an async tool waits for the tool's own cancellation handling."""

_RUNTIME_EXITS = (GeneratorExit, greenlet.GreenletExit)
"""The runtime's own ways to unwind a call (a closed coroutine, a greenlet killed at exit); every
other exception a tool raises, ``SystemExit`` and ``BaseException`` subclasses included, is the
tool's failure, an ``exception`` outcome like any other."""


class _Job:
    """One run of a sync tool, handed to a tool thread. ``done`` is set when the run ends, or
    early by a stop that wakes its waiter; ``lock`` orders "finished" against "abandoned".
    ``counted``: abandoned while its tool ran, so its thread is counted until the tool returns."""

    __slots__ = ("abandoned", "counted", "done", "error", "finished", "fn", "ident", "lock", "ran_secs",
                 "value")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = _Done()
        self.lock = threading.Lock()
        self.finished = self.abandoned = self.counted = False
        self.ident: int | None = None
        self.value: Any = None
        self.error: BaseException | None = None
        self.ran_secs = 0.0
        """How long the tool itself ran, timed on its thread (its waiter may wake late)."""


class _Done:
    """A job's end, set from any thread; waited on by a thread, or by a call's greenlet on the
    process loop (``_loop.wait``), which then holds no thread while the tool runs."""

    __slots__ = ("_event", "_future", "_loop")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._future: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if _loop.can_wait():
            self._loop = asyncio.get_running_loop()
            self._future = self._loop.create_future()

    def set(self) -> None:
        self._event.set()
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def wait(self, timeout: float) -> None:
        if self._future is None:
            self._event.wait(timeout)
        elif not self._event.is_set():
            _loop.wait(asyncio.wait([self._future], timeout=timeout))


AbandonedPolicy = Callable[[int], None]
"""Told the count of abandoned tool threads still running each time one more is abandoned."""

WARN_ABANDONED_AT = 16
"""The default policy (the embedded engine's: it never ends the user's process) warns when this
many abandoned tool threads are still running, and again each time the count doubles."""


class _WarnOnDoubling:
    """The default policy: a WARNING at ``WARN_ABANDONED_AT`` abandoned threads, then at each
    doubling (a growing leak stays visible in a few lines, not one per call)."""

    def __init__(self) -> None:
        self.next_at = WARN_ABANDONED_AT

    def __call__(self, count: int) -> None:
        if count < self.next_at:
            return
        while self.next_at <= count:
            self.next_at *= 2
        log.warning(
            "%d sync tool threads abandoned past their time limit (or cancel) are still running: a "
            "tool blocks in C (a socket read without a timeout, time.sleep, a lock) and ignores its "
            "limit; each holds a thread and its memory until it returns", count,
        )


_policy: AbandonedPolicy = _WarnOnDoubling()


def on_abandoned(policy: AbandonedPolicy | None) -> None:
    """Set what this process does as abandoned tool threads pile up (None: the default warning);
    a worker's pool stops the worker past its cap. Called on the thread that gave up on the tool
    (a call's greenlet on the event loop): it must be quick."""
    global _policy
    _policy = policy if policy is not None else _WarnOnDoubling()


class _ToolThreads:
    """Daemon threads that run sync tools, reused while idle.

    Not ``concurrent.futures.ThreadPoolExecutor``: Python joins its threads at exit, so a tool
    abandoned past its time limit (or cancelled) would keep the worker from shutting down until
    the tool returned, if ever. ``abandoned`` counts the threads whose tool was given up on and
    has not returned yet (blocked in C, where the exception raised into it cannot reach).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()
        self.abandoned = 0

    def abandon(self, job: _Job) -> int:
        """Count ``job``'s thread as abandoned (its lock held, its tool running); the new count."""
        job.counted = True
        with self._lock:
            self.abandoned += 1
            return self.abandoned

    def _release(self, job: _Job) -> None:
        """The thread is done with ``job``: it no longer counts as abandoned."""
        with job.lock:
            counted, job.counted = job.counted, False
        if counted:
            with self._lock:
                self.abandoned -= 1

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                threading.Thread(target=self._serve, name="criogenai-tool", daemon=True).start()
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            # Not contextlib.suppress: an async exception could land in its Python __exit__.
            try:  # noqa: SIM105
                self._run(job)
            except (_TimedOut, _Cancelled):
                pass  # a stop aimed at this job that landed after its run, before it was cleared
            # No stop can be pending now (one per job, sent only while it is unfinished, and it
            # landed or was cleared): the count is safe from interruption here.
            self._release(job)
            del job
            with self._lock:
                self._idle += 1

    @staticmethod
    def _run(job: _Job) -> None:
        with job.lock:
            job.ident = threading.get_ident()
            if job.abandoned:  # its waiter gave up before a thread was free
                return
        began = time.monotonic()
        try:
            job.value = job.fn()
        except BaseException as exc:  # the caller's to judge, _TimedOut included
            job.error = exc
        with job.lock:
            job.ran_secs = time.monotonic() - began
            job.finished = True
        # A stop is only sent while the job is unfinished, so after this none can be pending:
        # none can hit this thread's next job.
        _clear_raise_in_thread()
        job.done.set()


_sync_pool: _ToolThreads | None = None
_sync_pool_lock = threading.Lock()


def _thread_pool() -> _ToolThreads:
    global _sync_pool
    with _sync_pool_lock:
        if _sync_pool is None:
            _sync_pool = _ToolThreads()
        return _sync_pool


def abandoned_threads() -> int:
    """This process's sync tool threads abandoned past their time limit (or at a cancel) whose
    tool has not returned yet: each holds a thread and its memory until it does, if ever."""
    pool = _sync_pool
    return pool.abandoned if pool is not None else 0


def reset_after_fork() -> None:
    """Forget the threads a forked child inherited the memory of, but not the threads."""
    global _sync_pool
    _sync_pool = None
    _loop.ProcessLoop.forget()


def _raise_in_thread(ident: int, exc_type: type[BaseException]) -> None:
    """Ask a thread to raise ``exc_type`` at its next bytecode: the only way to stop a sync tool
    in a thread; it cannot interrupt a blocking C call, which goes on until it returns."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))


def _clear_raise_in_thread() -> None:
    """Drop a ``_raise_in_thread`` still pending for the calling thread (its job has ended)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)


def _run_sync_on_thread(fn: Callable[[], Any], timeout: float, stop: CallStop | None = None) -> Any:
    # In the call's context: its log fields and trace span reach the tool's own records and spans.
    job = _Job(functools.partial(contextvars.copy_context().run, fn))
    pool = _thread_pool()
    pool.submit(job)
    if stop is not None:
        stop.arm(job.done.set)
    try:
        job.done.wait(timeout)
    finally:
        if stop is not None:
            stop.disarm()
    why: type[BaseException] | None = None
    count = 0
    with job.lock:
        if not job.finished:
            job.abandoned = True
            why = _Cancelled if stop is not None and stop.requested else _TimedOut
            if job.ident is not None:  # its tool runs: the thread is left to it, and counted
                _raise_in_thread(job.ident, why)
                count = pool.abandon(job)
    if count:
        try:
            _policy(count)
        except Exception:
            log.exception("the policy for abandoned tool threads failed")
    if why is not None:
        raise why
    if job.ran_secs > timeout:
        # It returned past its limit, and its waiter (a greenlet on a loaded loop) woke only
        # after that: a tool that runs past its limit is a timeout, however late that is seen.
        raise _TimedOut
    if job.error is not None:
        raise job.error
    return job.value


def _run_async(make_coro: Callable[[], Any], timeout: float, stop: CallStop | None = None) -> Any:
    scopes: list[asyncio.Timeout] = []

    def expire_now() -> bool:
        """On the loop: end the run through its own time limit, now; False if it cannot be (not
        started yet). A limit that has fired already is left to finish its one cancellation."""
        if not scopes:
            return False
        with contextlib.suppress(RuntimeError):  # expiring or expired already
            if not scopes[0].expired():
                scopes[0].reschedule(asyncio.get_running_loop().time())
        return True

    async def bounded() -> Any:
        scope = asyncio.timeout(timeout)
        scopes.append(scope)
        try:
            async with scope:
                value = await make_coro()
        except BaseException as exc:
            # Cut at our limit: whatever the tool raised while being cancelled (an MCP client's
            # own error, say) is its stopping, not a failure of its own. A TimeoutError the tool
            # raised itself before the limit is its own exception.
            if scope.expired():
                return _EXPIRED
            if isinstance(exc, SystemExit | KeyboardInterrupt):
                # An asyncio task re-raises these out of the event loop itself, which would end
                # the loop's thread and every call on it: carried out as the tool's own failure.
                return _Raised(exc)
            raise
        # A coroutine that swallowed its cancellation and returned anyway still ran past its limit.
        return _EXPIRED if scope.expired() else value

    if _loop.can_wait():
        value = _await_on_this_loop(bounded(), timeout, stop)
    else:
        value = _await_from_thread(bounded(), timeout, stop, expire_now)
    if value is _EXPIRED:
        raise _TimedOut
    if isinstance(value, _Raised):
        raise value.exc
    return value


def _await_on_this_loop(coro: Any, timeout: float, stop: CallStop | None) -> Any:
    """In a call's greenlet on the process loop: await the tool's task there, holding no thread."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(coro)
    if stop is not None:
        stop.arm(lambda: loop.call_soon_threadsafe(task.cancel))
    try:
        try:
            # Bounded too: a coroutine that ignores cancellation is abandoned at the hard limit.
            _loop.wait(asyncio.wait([task], timeout=hard_limit_secs(timeout)))
        except asyncio.CancelledError:  # the call itself was cancelled: its caller's loop is closing
            raise _Cancelled from None
        if not task.done():
            task.cancel()
            raise _TimedOut
        if task.cancelled() and stop is not None and stop.requested:
            raise _Cancelled
        return task.result()  # a CancelledError of the tool's own is the tool's failure
    except BaseException:
        task.cancel()
        raise
    finally:
        if stop is not None:
            stop.disarm()


def _await_from_thread(
    coro: Any, timeout: float, stop: CallStop | None, expire_now: Callable[[], bool]
) -> Any:
    """From a thread: run the tool's coroutine on the process loop and block until it ends.

    A soft limit arriving in this thread ends the run through ``expire_now`` (its own time limit,
    fired early), not by cancelling its task as well: both limits fall due at once on prefork, and
    a second cancellation would cut short the tool's handling of the first (an MCP client's
    ``notifications/cancelled``)."""
    ended = threading.Event()
    loop = _loop.ProcessLoop.get()

    def expire_or_cancel() -> None:
        if not expire_now():
            future.cancel()

    async def run() -> Any:
        try:
            return await coro
        finally:
            ended.set()

    future = asyncio.run_coroutine_threadsafe(run(), loop)
    if stop is not None:
        stop.arm(future.cancel)  # its callback cancels the coroutine's task on the loop
    try:
        # Bounded too: a coroutine that ignores cancellation, or blocks the loop, is abandoned.
        # (wait, not result(timeout): a TimeoutError the tool raises itself is its own exception)
        done, _ = concurrent.futures.wait([future], hard_limit_secs(timeout))
        if not done:
            future.cancel()
            raise _TimedOut
        return future.result()
    except concurrent.futures.CancelledError:
        if stop is not None and stop.requested:
            raise _Cancelled from None
        raise
    except BaseException as exc:
        if isinstance(exc, _TimedOut):
            raise  # past the hard limit: abandoned at once (it ignores cancellation or blocks the loop)
        # A soft limit arrived in this (waiting) thread: end the run, and give the coroutine's
        # own cancellation handling a moment to end before the call's outcome is filed.
        loop.call_soon_threadsafe(expire_or_cancel)
        ended.wait(CANCEL_GRACE_SECS)
        future.cancel()  # still running after the grace: abandoned
        raise
    finally:
        if stop is not None:
            stop.disarm()


def _invoke(
    tool: Tool[..., Any],
    kwargs: dict[str, Any],
    ctx: ToolContext,
    timeout_secs: float,
    inline_sync: bool,
    stop: CallStop | None,
) -> Any:
    """The tool's return value: awaited on the process loop, run inline, or run on a tool thread."""
    if stop is not None and stop.requested:
        raise _Cancelled
    if tool.is_async:
        return _run_async(lambda: tool.invoke(kwargs, ctx), timeout_secs, stop)
    if not inline_sync:
        return _run_sync_on_thread(lambda: tool.invoke(kwargs, ctx), timeout_secs, stop)
    if stop is not None:
        stop.arm(_interrupt_this_thread())
    try:
        return tool.invoke(kwargs, ctx)
    finally:
        if stop is not None:
            stop.disarm()


def execute(
    tool: Tool[..., Any],
    arguments: object,
    ctx: ToolContext,
    *,
    timeout_secs: float,
    on_tool_exception: OnToolException,
    max_result_chars: int,
    max_stored_chars: int = DEFAULT_MAX_STORED_CHARS,
    inline_sync: bool = False,
    interrupts: tuple[type[BaseException], ...] = (),
    stop: CallStop | None = None,
    exiting: Callable[[], bool] = lambda: False,
) -> Outcome:
    """Run one call of ``tool`` and say what happened; texts within ``max_result_chars`` for the
    model and ``max_stored_chars`` for what the run keeps.

    ``inline_sync`` runs a sync tool on the calling thread (a prefork child, where Celery's limits
    interrupt it); otherwise it runs on a thread and is abandoned at its limit. ``interrupts`` are
    exceptions that mean the time is up (Celery's soft limit). ``stop`` lets another thread stop
    the call when its turn is cancelled; the outcome is then ``cancelled``. ``exiting`` says the
    process is being ended (a prefork child told to stop): what the tool raises then is not its
    own failure, and leaves unhandled.
    """
    checked = tool.validate(arguments)
    if isinstance(checked, InvalidArguments):
        return invalid_arguments(tool.name, checked.problems[:50])  # an edited call may have thousands
    kwargs = checked.kwargs
    started = time.monotonic()
    kept: dict[str, Any] | None = None
    try:
        value = _invoke(tool, kwargs, ctx, timeout_secs, inline_sync, stop)
        if isinstance(value, ToolOutput):
            value, kept = value.value, value.artifact
            if kept:  # plain JSON like the value: a NaN or an object here would break the result
                kept = json.loads(to_json_text(kept))
        text = to_json_text(value)
    except ToolError as exc:
        message = cut(plain(str(exc.message)), max_result_chars)
        return Outcome(
            "tool_error",
            message.text,
            truncated=message.truncated,
            retryable=exc.retryable,
            duration_secs=time.monotonic() - started,
        )
    except _Cancelled:
        return stopped_by_cancel(tool.name, time.monotonic() - started)
    except (_TimedOut, *interrupts):  # type: ignore[misc]
        if stop is not None and stop.requested:
            return stopped_by_cancel(tool.name, time.monotonic() - started)
        return timed_out(tool.name, timeout_secs, time.monotonic() - started)
    except _RUNTIME_EXITS:
        raise
    except BaseException as exc:  # sys.exit() and other BaseExceptions included: a tool's failure
        if exiting():  # unless the process itself is being ended under it (its pool's SIGTERM)
            raise
        caps = (max_result_chars, max(max_stored_chars, max_result_chars))
        return _unexpected(tool, ctx, exc, on_tool_exception, caps, time.monotonic() - started)
    body = cut(text, max_result_chars)
    artifact: dict[str, Any] | None = dict(kept) if kept else None
    if body.truncated:  # the model gets the cut text; the run keeps the value, up to the stored cap
        full = cut(text, max_stored_chars).text
        artifact = {**(artifact or {}), "full_chars": body.full_chars, "full": full}
    return Outcome("ok", body.text, artifact, body.truncated, duration_secs=time.monotonic() - started)


def _unexpected(
    tool: Tool[..., Any],
    ctx: ToolContext,
    exc: BaseException,
    policy: OnToolException,
    caps: tuple[int, int],
    duration: float,
) -> Outcome:
    """An exception the tool did not mean for the model, within the size caps.

    Under ``return_generic`` its text (message and traceback) is not sent: as the Tools page
    says, it is kept in the result's artifact, stored with the run (never in content, in
    Celery's result record or in a log line).
    """
    model_cap, stored_cap = caps
    if policy == "return_generic":
        log.error(
            "call %s/%s: tool %s raised %s; its text is hidden from the model by return_generic "
            "and kept with the run's result", ctx.run_id, ctx.call_id, tool.name, type(exc).__name__,
        )
    try:
        out = unexpected(tool.name, exc, policy, duration)
    except Exception:  # an exception whose str() raises
        out = unexpected(tool.name, RuntimeError(f"unprintable {type(exc).__name__}"), policy, duration)
    details = dict((out.artifact or {}).get("exception") or {})
    for field in ("message", "traceback"):
        if isinstance(details.get(field), str):
            details[field] = cut(details[field], stored_cap).text
    body = cut(out.content, model_cap)
    return Outcome(
        "exception", body.text, {"exception": details}, body.truncated, duration_secs=duration, error=exc
    )
