"""The process's event loop, and sync code that waits on it without holding a thread.

Async tools run on one event loop per process, on a daemon thread. A call's Celery task (or the
embedded engine's run of a call) is sync code; run in a greenlet driven by a coroutine on that
loop, it hands an awaitable to the loop and sleeps until it is done (``wait``). A thousand waiting
calls then cost a thousand greenlets (a few KiB each), not a thousand threads, and the Redis
commands they send between waits go out from one thread, on one connection.

Between two waits the code runs on the loop's thread and holds it: only short work belongs there
(a claim, a filing: a round trip each). Tools never do: sync ones run on threads of their own.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import greenlet

T = TypeVar("T")


class ProcessLoop:
    """One event loop per process, on a daemon thread, for every async tool and waiting call."""

    _lock = threading.Lock()
    _instance: ProcessLoop | None = None

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="criogenai-loop", daemon=True)
        self.thread.start()
        atexit.register(self._stop)

    def _stop(self) -> None:
        """At exit: stop the loop and let its thread end, so that no greenlet or coroutine still
        runs on it while the interpreter tears down (what is in flight then is abandoned)."""
        if self.thread.is_alive() and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(1.0)

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._instance is None or not cls._instance.thread.is_alive():
                cls._instance = cls()
            return cls._instance.loop

    @classmethod
    def forget(cls) -> None:
        """After fork: the parent's loop thread does not exist in the child."""
        cls._instance = None


class _CallGreenlet(greenlet.greenlet):  # type: ignore[misc]
    """A greenlet whose sync code may ``wait`` on the loop that drives it."""


async def run_in_greenlet(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a greenlet of its own, awaiting on its behalf whatever it ``wait``s on."""
    child = _CallGreenlet(fn, parent=greenlet.getcurrent())
    step: Any = child.switch(*args)
    while not child.dead:
        try:
            value = await step
        except BaseException as exc:  # the awaitable's failure is the sync code's to handle
            step = child.throw(type(exc), exc, exc.__traceback__)
        else:
            step = child.switch(value)
    return step  # type: ignore[no-any-return]


def can_wait() -> bool:
    """Whether the calling code runs in ``run_in_greenlet`` (else it must block its thread)."""
    return isinstance(greenlet.getcurrent(), _CallGreenlet)


def wait(awaitable: Awaitable[T]) -> T:
    """From sync code in ``run_in_greenlet``: the awaitable's result, the loop serving others meanwhile."""
    current = greenlet.getcurrent()
    if not isinstance(current, _CallGreenlet):
        raise RuntimeError("wait() needs sync code run by run_in_greenlet")
    return current.parent.switch(awaitable)  # type: ignore[no-any-return]


class GreenletRunner:
    """Runs sync functions as greenlets on an event loop (the process loop unless told another),
    at most ``limit`` at once, and lets a stopping owner wait until every one has ended."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or ProcessLoop.get()
        self._limit = limit
        self._slots: asyncio.Semaphore | None = None  # made on the loop, where it is used
        self._running = 0
        self._idle = threading.Condition()

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Start ``fn(*args)`` (from any thread); the future gives what it returns or raises."""
        with self._idle:
            self._running += 1
        try:
            return asyncio.run_coroutine_threadsafe(self._run(fn, args), self.loop)
        except BaseException:
            self._ended()
            raise

    async def _run(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        try:
            if self._slots is None:
                self._slots = asyncio.Semaphore(self._limit)
            async with self._slots:
                return await run_in_greenlet(fn, *args)
        finally:
            self._ended()

    def _ended(self) -> None:
        with self._idle:
            self._running -= 1
            if self._running == 0:
                self._idle.notify_all()

    @property
    def running(self) -> int:
        return self._running

    def join(self, timeout: float | None = None) -> bool:
        """Wait until nothing runs; False if something still does after ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout)


def pause(secs: float) -> None:
    """Sleep; in a call's greenlet, without holding the loop (the other calls go on meanwhile)."""
    if can_wait():
        wait(asyncio.sleep(secs))
    else:
        time.sleep(secs)


def refuse_on_a_running_loop(what: str) -> None:
    """Raise when called on a thread that runs an event loop: waiting there would block the very
    loop the work may need (an async tool, an ``async def`` handler). ``what`` names the caller."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"{what} was called from a running event loop, which it would block: await the "
                       "async method there instead")


def run_sync(coro: Coroutine[Any, Any, T], what: str) -> T:
    """The one bridge from sync code to a coroutine: run it on a loop of its own, or refuse (and
    close it) on a thread that runs a loop already (see ``refuse_on_a_running_loop``)."""
    try:
        refuse_on_a_running_loop(what)
    except RuntimeError:
        coro.close()
        raise
    return asyncio.run(coro)
