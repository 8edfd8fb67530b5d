"""The pool behind ``criogenai worker --pool threads``: every call's task waits on one event loop.

Celery's thread pool gives each task in flight a thread of its own, which then sits waiting on
the tool; at ``-c 1000`` that is a thousand threads, each sending its claim and filing on its own
Redis connection. Here each task runs Celery's own trace (signals, retries, acks, events: all
unchanged) in a greenlet on the process's event loop (``_loop``): an async tool is awaited there,
a sync tool runs on a tool thread that the greenlet waits for without holding one. Celery's
prefetch window still bounds the calls in flight to the concurrency, as with its thread pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

from celery.concurrency.base import BasePool, apply_target
from celery.worker import state

from .._config import Settings, WorkerSettings
from .._loop import GreenletRunner
from ..runner import abandoned_threads, on_abandoned

log = logging.getLogger(__name__)

POOL = f"{__name__}:TaskPool"
"""How Celery's ``worker_pool`` setting names this pool."""


class _Applied:
    """What Celery keeps of a task handed to the pool."""

    def __init__(self, future: Any) -> None:
        self.f = future
        self.get = future.result

    def wait(self, timeout: float | None = None) -> None:
        self.f.exception(timeout)


class TaskPool(BasePool):  # type: ignore[misc]
    """Runs each task's trace in a greenlet on the process loop; see the module's docstring."""

    signal_safe = False
    body_can_be_buffer = True

    def on_start(self) -> None:
        self._runner = GreenletRunner(self.limit or 1)
        settings = getattr(self.app, "criogenai_settings", None)
        stall = settings.loop_stall_secs if settings is not None else Settings().loop_stall_secs
        self._watchdog = threading.Thread(target=_watch, args=(self._runner.loop, stall),
                                          name="criogenai-watchdog", daemon=True)
        self._watchdog.start()
        on_abandoned(StopPastCap(abandoned_cap(self.app, int(self.limit or 1))))

    def on_apply(
        self,
        target: Any,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Any = None,
        accept_callback: Any = None,
        **_: Any,
    ) -> _Applied:
        return _Applied(self._runner.submit(_trace, target, args, kwargs, callback, accept_callback))

    def on_stop(self) -> None:
        """Warm shutdown: the calls in flight finish (their time limits bound the wait)."""
        self._runner.join()
        left = abandoned_threads()
        if left:
            log.warning("stopped with %d sync tool threads abandoned past their time limit still "
                        "running: they end with the process", left)

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        """Celery's way to stop running tasks (on a lost broker connection, ``revoke --terminate``):
        calls here share one process, so none is killed; each keeps its claim, and its filing is
        tried again until Redis answers. (Celery's own thread pool cannot kill a job either; without
        this method it logs a traceback for each one.)"""

    def on_terminate(self) -> None:
        """Cold shutdown: nothing more is waited for; leases bring the calls back elsewhere."""

    def _get_info(self) -> dict[str, Any]:
        info: dict[str, Any] = super()._get_info()
        info.update({"max-concurrency": self.limit, "running": self._runner.running,
                     "abandoned-threads": abandoned_threads()})
        return info

    @property
    def num_processes(self) -> int:
        return int(self.limit or 1)


def _trace(target: Any, args: Any, kwargs: Any, callback: Any, accept_callback: Any) -> None:
    """Celery's ``apply_target``, which never raises for the task's own failures; anything else
    is logged here, since nobody waits on the future."""
    try:
        apply_target(target, args, kwargs, callback, accept_callback)
    except BaseException:
        log.exception("a task's trace failed outside the task")


EXIT_LOOP_BLOCKED = 3
"""``criogenai worker``'s status when a tool blocked the event loop past ``loop_stall_secs``."""


def _watch(loop: asyncio.AbstractEventLoop, stall_secs: float) -> None:
    """End the worker when something blocks its event loop for ``stall_secs``: every call of the
    process waits on that loop, so none would end, yet the heartbeat and the lease renewals (their
    own threads) would tell the fleet all is well. Exiting lets leases send the calls elsewhere."""
    while True:
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop was closed: the worker is stopping
            return
        if not answered.wait(stall_secs):
            log.critical(
                "the event loop was blocked for more than %g s (an async tool that blocks, such as "
                "time.sleep in an async def, holds every call of this worker): exiting so that its "
                "calls run elsewhere", stall_secs,
            )
            logging.shutdown()
            os._exit(EXIT_LOOP_BLOCKED)
        time.sleep(min(1.0, stall_secs / 4))


EXIT_TOO_MANY_ABANDONED = 4
"""``criogenai worker``'s status when ``max_abandoned_threads`` sync tools abandoned past their time
limit were still running (each holds a thread and its memory until it returns, if ever)."""

MIN_ABANDONED_CAP = 16


def abandoned_cap(app: Any, concurrency: int) -> int:
    """The worker's ``max_abandoned_threads`` (the option as Celery built the worker, else its
    variable); 0 means ``max(16, 2 * concurrency)``: room for a whole window of calls abandoned at
    once (a downstream hang that times out every call in flight) and more, before a restart."""
    given = getattr(app, "criogenai_max_abandoned_threads", None)
    cap = int(given if given is not None else WorkerSettings.from_env().max_abandoned_threads)
    return cap or max(MIN_ABANDONED_CAP, 2 * concurrency)


class StopPastCap:
    """The worker's policy for abandoned tool threads: once ``cap`` are still running, one CRITICAL
    line, and a warm shutdown with ``EXIT_TOO_MANY_ABANDONED``: no new calls are taken, those in
    flight finish within their limits, calls not started go back to the queue, and the supervisor
    starts a fresh process, as Celery's ``max_tasks_per_child`` replaces a leaking child. The
    calls in flight may abandon one more thread each meanwhile: at most cap + concurrency."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self.stopping = False

    def __call__(self, count: int) -> None:
        if count < self.cap:
            return
        with self._lock:
            if self.stopping:
                return
            self.stopping = True
        log.critical(
            "%d sync tool threads abandoned past their time limit are still running "
            "(max_abandoned_threads %d; a tool blocks in C and ignores its limit): this worker takes "
            "no more calls, lets those in flight finish and exits with status %d for its supervisor "
            "to restart it", count, self.cap, EXIT_TOO_MANY_ABANDONED,
        )
        state.should_stop = EXIT_TOO_MANY_ABANDONED
