"""One call, start to finish, without Celery: re-validate, run, time-limit, map errors, shape text.

Sync tools run on a thread (or, in a prefork child, on the child's own thread, where Celery's soft
and hard limits reach them); async tools run on one event loop per process. Whatever happens, the
outcome is data: nothing here raises, except the interrupt types the caller passes in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .._errors import ToolError
from .._outcomes import Outcome, invalid_arguments, timed_out, unexpected
from .._wire import DEFAULT_MAX_STORED_CHARS, OnToolException
from ..tools import InvalidArguments, Tool, ToolContext, cut, to_json_text

log = logging.getLogger(__name__)


class _TimedOut(BaseException):
    """Raised into a tool's thread when its time is up (BaseException: a bare except misses it)."""


_EXPIRED = object()


class _LoopThread:
    """One event loop per process, on a daemon thread, for every async tool."""

    _lock = threading.Lock()
    _instance: _LoopThread | None = None

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="criogenai-loop", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> _LoopThread:
        with cls._lock:
            if cls._instance is None or not cls._instance.thread.is_alive():
                cls._instance = cls()
            return cls._instance

    @classmethod
    def forget(cls) -> None:
        """After fork: the parent's loop thread does not exist in the child."""
        cls._instance = None


_sync_pool: concurrent.futures.ThreadPoolExecutor | None = None
_sync_pool_lock = threading.Lock()


def _thread_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _sync_pool
    with _sync_pool_lock:
        if _sync_pool is None:
            _sync_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=256, thread_name_prefix="criogenai-tool"
            )
        return _sync_pool


def reset_after_fork() -> None:
    """Forget the threads a forked child inherited the memory of, but not the threads."""
    global _sync_pool
    _sync_pool = None
    _LoopThread.forget()


def _raise_in_thread(ident: int, exc_type: type[BaseException]) -> None:
    """Ask a thread to raise ``exc_type`` at its next bytecode: the only way to stop a sync tool
    in a thread; it cannot interrupt a blocking C call, which goes on until it returns."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))


def _run_sync_on_thread(fn: Callable[[], Any], timeout: float) -> Any:
    ident: list[int] = []

    def call() -> Any:
        ident.append(threading.get_ident())
        return fn()

    future = _thread_pool().submit(call)
    # wait, not result(timeout): a TimeoutError the tool raises itself is its exception, not a timeout
    done, _ = concurrent.futures.wait([future], timeout)
    if not done:
        if ident and not future.done():
            _raise_in_thread(ident[0], _TimedOut)
        raise _TimedOut
    return future.result()


def _run_async(make_coro: Callable[[], Any], timeout: float) -> Any:
    loop = _LoopThread.get().loop

    async def bounded() -> Any:
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                return await make_coro()
        except TimeoutError:
            if scope.expired():  # our limit, not a TimeoutError the tool raised itself
                return _EXPIRED
            raise

    future = asyncio.run_coroutine_threadsafe(bounded(), loop)
    try:
        value = future.result()
    except BaseException:
        future.cancel()  # a soft limit arrived in this (waiting) thread: stop the coroutine too
        raise
    if value is _EXPIRED:
        raise _TimedOut
    return value


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
) -> Outcome:
    """Run one call of ``tool`` and say what happened; texts within ``max_result_chars`` for the
    model and ``max_stored_chars`` for what the run keeps.

    ``inline_sync`` runs a sync tool on the calling thread (a prefork child, where Celery's limits
    interrupt it); otherwise it runs on a thread and is abandoned at its limit. ``interrupts`` are
    exceptions that mean the time is up (Celery's soft limit).
    """
    checked = tool.validate(arguments)
    if isinstance(checked, InvalidArguments):
        return invalid_arguments(tool.name, checked.problems[:50])  # an edited call may have thousands
    kwargs = checked.kwargs
    started = time.monotonic()
    try:
        if tool.is_async:
            value = _run_async(lambda: tool.invoke(kwargs, ctx), timeout_secs)
        elif inline_sync:
            value = tool.invoke(kwargs, ctx)
        else:
            value = _run_sync_on_thread(lambda: tool.invoke(kwargs, ctx), timeout_secs)
        text = to_json_text(value)
    except ToolError as exc:
        message = cut(str(exc.message), max_result_chars)
        return Outcome(
            "tool_error",
            message.text,
            truncated=message.truncated,
            retryable=exc.retryable,
            duration_secs=time.monotonic() - started,
        )
    except (_TimedOut, *interrupts):  # type: ignore[misc]
        return timed_out(tool.name, timeout_secs, time.monotonic() - started)
    except Exception as exc:
        caps = (max_result_chars, max(max_stored_chars, max_result_chars))
        return _unexpected(tool, ctx, exc, on_tool_exception, caps, time.monotonic() - started)
    body = cut(text, max_result_chars)
    artifact: dict[str, Any] | None = None
    if body.truncated:  # the model gets the cut text; the run keeps the value, up to the stored cap
        artifact = {"full_chars": body.full_chars, "full": cut(text, max_stored_chars).text}
    return Outcome("ok", body.text, artifact, body.truncated, duration_secs=time.monotonic() - started)


def _unexpected(
    tool: Tool[..., Any],
    ctx: ToolContext,
    exc: Exception,
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
        "exception", body.text, {"exception": details}, body.truncated, duration_secs=duration
    )
