"""The pool behind ``criogenai worker --pool threads``: every call's task waits on one event loop.

Celery's thread pool gives each task in flight a thread of its own, which then sits waiting on
the tool; at ``-c 1000`` that is a thousand threads, each sending its claim and filing on its own
Redis connection. Here each task runs Celery's own trace (signals, retries, acks, events: all
unchanged) in a greenlet on the process's event loop (``_loop``): an async tool is awaited there,
a sync tool runs on a tool thread that the greenlet waits for without holding one. Celery's
prefetch window still bounds the calls in flight to the concurrency, as with its thread pool.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.concurrency.base import BasePool, apply_target

from .._loop import GreenletRunner

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

    def on_terminate(self) -> None:
        """Cold shutdown: nothing more is waited for; leases bring the calls back elsewhere."""

    def _get_info(self) -> dict[str, Any]:
        info: dict[str, Any] = super()._get_info()
        info.update({"max-concurrency": self.limit, "running": self._runner.running})
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
