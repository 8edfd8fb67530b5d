"""What the call runner tells observers (logs, metrics) about each delivery of a call.

The runner calls them itself, on both engines, rather than each observer hanging off Celery's
global task signals and working out again whether a task is a criogenai call. An observer that
fails is logged and skipped: it never changes a call's outcome.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._wire import ToolResult, ToolTask
from ._outcomes import Outcome

log = logging.getLogger(__name__)

_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "criogenai_call", default=None
)
"""The fields of the call this thread or greenlet is running (run id, call id, tool, delivery id)."""


def current_call() -> dict[str, Any]:
    """The running call's fields, for log records (``_logging.CallContext``); empty outside a call."""
    return _current.get() or {}


@contextmanager
def call_fields(payload: ToolTask, delivery_id: str | None) -> Iterator[None]:
    """Make ``payload``'s ids the running call's for the block (its logs carry them)."""
    fields = {"run_id": payload.run_id, "call_id": payload.call.id, "tool": payload.call.name}
    if delivery_id is not None:
        fields["task_id"] = delivery_id
    token = _current.set(fields)
    try:
        yield
    finally:
        _current.reset(token)


class CallObserver:
    """Told of each run of a call; every method does nothing unless overridden."""

    def run_started(self, payload: ToolTask, attempt: int, queued_secs: float | None) -> None:
        """A run of the call starts (``queued_secs``: since it was sent or its retry was due)."""

    def run_ended(self, payload: ToolTask, outcome: Outcome, attempt: int, retry_in: float | None) -> None:
        """A run ended; ``retry_in`` is set when the call runs again after that many seconds."""

    def call_ended(self, payload: ToolTask, result: ToolResult) -> None:
        """The call ended with ``result`` on this delivery (filed, or refused without a filing)."""

    def process_lost(self, payload: ToolTask, reason: str) -> None:
        """The process running the call died (``worker_lost``) or was killed (``hard_limit``)."""


class Observers(CallObserver):
    """Several observers as one; one that raises is logged and the others are still told. An
    interrupt of the call (Celery's soft limit, in ``passes``) is not the observer's: it goes on."""

    def __init__(self, passes: tuple[type[BaseException], ...] = ()) -> None:
        self._all: tuple[CallObserver, ...] = ()
        self._passes = passes

    def add(self, observer: CallObserver) -> None:
        self._all = (*self._all, observer)

    def _each(self, method: str, *args: Any) -> None:
        for observer in self._all:
            try:
                getattr(observer, method)(*args)
            except self._passes:
                raise
            except Exception:
                log.warning("call observer %s failed in %s", type(observer).__name__, method, exc_info=True)

    def run_started(self, payload: ToolTask, attempt: int, queued_secs: float | None) -> None:
        self._each("run_started", payload, attempt, queued_secs)

    def run_ended(self, payload: ToolTask, outcome: Outcome, attempt: int, retry_in: float | None) -> None:
        self._each("run_ended", payload, outcome, attempt, retry_in)

    def call_ended(self, payload: ToolTask, result: ToolResult) -> None:
        self._each("call_ended", payload, result)

    def process_lost(self, payload: ToolTask, reason: str) -> None:
        self._each("process_lost", payload, reason)
